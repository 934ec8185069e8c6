#include "bindings/py_store.h"

#include <pybind11/stl.h>

#include "bindings/runtime_lease.h"
#include "core/common.h"
#include "engine/runtime.h"

namespace py = pybind11;

namespace hvdcompat {

namespace {

class PyKeyValueStore : public KeyValueStore {
 public:
  explicit PyKeyValueStore(py::object store) : store_(new py::object(std::move(store))) {
    describe_ = py::str(*store_).cast<std::string>();
  }
  ~PyKeyValueStore() override {
    // The last reference may go on any thread; a finalizing interpreter
    // keeps its object.
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    delete store_;
  }

  void Set(const std::string& key, const std::string& value) override {
    Call("set", [&] { store_->attr("set")(key, py::bytes(value)); });
  }
  std::string Get(const std::string& key) override {
    std::string out;
    Call("get", [&] { out = store_->attr("get")(key).cast<std::string>(); });
    return out;
  }
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    Call("wait", [&] { store_->attr("wait")(keys, timeout.count() / 1000.0); });
  }
  int64_t Add(const std::string& key, int64_t amount) override {
    int64_t out = 0;
    Call("add", [&] { out = store_->attr("add")(key, amount).cast<int64_t>(); });
    return out;
  }
  std::string Describe() const override { return describe_; }

 private:
  template <typename F>
  void Call(const char* method, F&& f) {
    py::gil_scoped_acquire gil;
    try {
      f();
    } catch (py::error_already_set& e) {
      throw LibraryError("the rendezvous store " + describe_ + " failed in " + method + "(): " +
                         e.what());
    } catch (const py::cast_error& e) {
      throw LibraryError("the rendezvous store " + describe_ + "'s " + method +
                         "() returned a value of the wrong type: " + e.what());
    }
  }

  py::object* store_;  // deleted with the GIL held
  std::string describe_;
};

// Which controller the running runtime is on; false for both when none runs.
bool RuntimeOn(bool gloo) {
  try {
    RuntimeLease rt;
    return rt->on_gloo() == gloo;
  } catch (const py::value_error&) {
    return false;
  }
}

}  // namespace

std::shared_ptr<KeyValueStore> WrapPythonStore(py::object store) {
  if (store.is_none()) return nullptr;
  for (const char* m : {"set", "get", "add", "wait"}) {
    if (!py::hasattr(store, m)) {
      throw py::type_error(std::string("InitOptions(store=...): the store has no ") + m +
                           "() method; it needs set(key, bytes), get(key) -> bytes, "
                           "add(key, int) -> int and wait(keys, timeout_s)");
    }
  }
  return std::make_shared<PyKeyValueStore>(std::move(store));
}

void RegisterGlooBindings(py::module_& m) {
  m.def("gloo_built", [] { return true; }, "Gloo is compiled into the core (third_party/gloo).");
  m.def("gloo_enabled", [] { return RuntimeOn(true); },
        "True while a runtime on the Gloo controller runs.");
  m.def("mpi_enabled", [] { return RuntimeOn(false); },
        "True while a runtime on the MPI controller runs.");
}

}  // namespace hvdcompat
