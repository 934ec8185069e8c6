// The knob table to Python: _core.knobs() (the declarations) and _core.setting(), the one
// reader of settings for the whole package, typed by the knob's kind (core/env.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <string>
#include "core/common.h"
#include "core/env.h"

namespace py = pybind11;

namespace hvdcompat {
namespace {

const KnobSpec& SpecBySuffix(const std::string& suffix) {
  for (const auto& k : AllKnobs()) {
    if (suffix == k.suffix) return k;
  }
  throw py::key_error("no knob HVDCOMPAT_" + suffix + " in the core's knob table "
                      "(cpp/core/env.cc); declare it there before reading it");
}

py::list Knobs() {
  py::list out;
  for (const auto& k : AllKnobs()) {
    py::dict d;
    d["name"] = std::string("HVDCOMPAT_") + k.suffix;
    d["horovod_name"] = k.horovod_alias ? py::object(py::str(std::string("HOROVOD_") + k.suffix))
                                        : py::object(py::none());
    d["default"] = k.default_value;
    d["unit"] = k.unit;
    d["kind"] = KindName(KindOf(k));
    d["help"] = k.help;
    out.append(d);
  }
  return out;
}

py::object Setting(const std::string& suffix, py::object environ) {
  const KnobSpec& spec = SpecBySuffix(suffix);
  std::string source;
  std::string raw;
  if (environ.is_none()) {
    raw = KnobRaw(spec, ProcessEnvironment(), &source);
  } else {
    EnvLookup lookup = [&environ](const std::string& name, std::string* value) {
      py::object v = environ.attr("get")(name);
      if (v.is_none()) return false;
      *value = py::str(v);
      return true;
    };
    raw = KnobRaw(spec, lookup, &source);
  }
  switch (KindOf(spec)) {
    case KnobKind::kBool:
      return py::bool_(ParseKnobBool(spec, raw, source));
    case KnobKind::kInt:
    case KnobKind::kFloat: {
      // A knob without a default is unset until given: None.
      if (raw.empty() && spec.default_value[0] == '\0') return py::none();
      double value = ParseKnobNumber(spec, raw, source);
      if (KindOf(spec) == KnobKind::kInt) return py::int_(static_cast<int64_t>(value));
      return py::float_(value);
    }
    case KnobKind::kChoice:
      return py::str(ParseKnobChoice(spec, raw, source));
    case KnobKind::kText:
      return py::str(raw);
  }
  return py::str(raw);
}

}  // namespace

void RegisterKnobBindings(py::module_& m) {
  m.def("knobs", &Knobs, "Every knob's declaration: name, horovod_name, default, unit, kind, help.");
  m.def("setting", &Setting, py::arg("suffix"), py::arg("environ") = py::none(),
        "A knob's value, typed by its kind: HVDCOMPAT_<suffix>, then HOROVOD_<suffix>, then "
        "the default, read from `environ` (a mapping; default: this process's environment). "
        "bool -> bool, int -> int, float -> float (None for an unset knob without a default), "
        "choice -> the table's spelling, text -> str. ValueError names the variable for a bad "
        "value; KeyError for a knob the table lacks.");
}

}  // namespace hvdcompat
