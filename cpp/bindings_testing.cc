// hvdcompat._core.testing: the core's pure logic exposed for unit tests
// (encoding, fusion planning, 16-bit conversions, and whole negotiation
// cycles among ranks simulated as threads over an in-memory transport).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <thread>

#include "controller.h"
#include "cpu_kernels.h"
#include "fake_transport.h"
#include "fusion.h"
#include "half.h"
#include "message.h"

namespace py = pybind11;

namespace hvdcompat {

namespace {

template <typename T>
T Get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

Request ToRequest(const py::dict& d) {
  Request q;
  q.op = static_cast<OpType>(Get<int>(d, "op", 0));
  q.dtype = static_cast<DataType>(Get<int>(d, "dtype", static_cast<int>(DataType::kFloat32)));
  q.reduce_op = static_cast<ReduceOp>(Get<int>(d, "reduce_op", static_cast<int>(ReduceOp::kSum)));
  q.root = Get<int>(d, "root", -1);
  q.device = Get<int>(d, "device", kCpuDevice);
  q.prescale = Get<double>(d, "prescale", 1.0);
  q.postscale = Get<double>(d, "postscale", 1.0);
  q.name = Get<std::string>(d, "name", "");
  q.auto_named = Get<bool>(d, "auto_named", false);
  q.rank = Get<int>(d, "rank", 0);
  q.shapes = Get<std::vector<Shape>>(d, "shapes", {});
  return q;
}

py::dict FromRequest(const Request& q) {
  py::dict d;
  d["op"] = static_cast<int>(q.op);
  d["dtype"] = static_cast<int>(q.dtype);
  d["reduce_op"] = static_cast<int>(q.reduce_op);
  d["root"] = q.root;
  d["device"] = q.device;
  d["prescale"] = q.prescale;
  d["postscale"] = q.postscale;
  d["name"] = q.name;
  d["auto_named"] = q.auto_named;
  d["rank"] = q.rank;
  d["shapes"] = q.shapes;
  return d;
}

py::dict FromResponse(const Response& p) {
  py::dict d;
  d["op"] = static_cast<int>(p.op);
  d["dtype"] = static_cast<int>(p.dtype);
  d["reduce_op"] = static_cast<int>(p.reduce_op);
  d["root"] = p.root;
  py::list names, shapes;
  for (const auto& u : p.units) {
    names.append(u.name);
    shapes.append(u.shapes);
  }
  d["names"] = names;
  d["shapes"] = shapes;
  d["error"] = p.error;
  d["error_code"] = static_cast<int>(p.error_code);
  d["last_joined"] = p.last_joined;
  return d;
}

Response ToResponse(const py::dict& d) {
  Response p;
  p.op = static_cast<OpType>(Get<int>(d, "op", 0));
  p.dtype = static_cast<DataType>(Get<int>(d, "dtype", static_cast<int>(DataType::kFloat32)));
  p.reduce_op = static_cast<ReduceOp>(Get<int>(d, "reduce_op", static_cast<int>(ReduceOp::kSum)));
  p.root = Get<int>(d, "root", -1);
  p.prescale = Get<double>(d, "prescale", 1.0);
  p.postscale = Get<double>(d, "postscale", 1.0);
  p.error = Get<std::string>(d, "error", "");
  auto names = Get<std::vector<std::string>>(d, "names", {});
  auto shapes = Get<std::vector<std::vector<Shape>>>(d, "shapes", {});
  for (size_t i = 0; i < names.size(); ++i) {
    p.units.push_back({names[i], i < shapes.size() ? shapes[i] : std::vector<Shape>{}});
  }
  return p;
}

// rounds[k][r] = requests rank r submits before cycle k. Every rank runs one
// cycle per round. Returns results[k][r] = responses rank r got in cycle k,
// and per-rank statistics.
py::tuple Simulate(int size, size_t cache_capacity, const py::list& rounds) {
  std::vector<std::vector<std::vector<Request>>> script;
  for (const auto& round : rounds) {
    std::vector<std::vector<Request>> per_rank(size);
    auto ranks = round.cast<py::list>();
    for (int r = 0; r < size && r < static_cast<int>(ranks.size()); ++r) {
      for (const auto& q : ranks[r].cast<py::list>()) per_rank[r].push_back(ToRequest(q.cast<py::dict>()));
    }
    script.push_back(std::move(per_rank));
  }
  std::vector<std::vector<std::vector<Response>>> results(script.size(),
                                                          std::vector<std::vector<Response>>(size));
  std::vector<EngineStats> stats(size);
  std::vector<std::string> errors(size);
  {
    py::gil_scoped_release release;
    FakeNetwork net(size);
    std::vector<int> global(size);
    for (int i = 0; i < size; ++i) global[i] = i;
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        try {
          FakeTransport transport(&net, r);
          Controller controller(&transport, cache_capacity, global, 0, &stats[r]);
          auto now = Clock::now();
          for (size_t k = 0; k < script.size(); ++k) {
            for (const auto& q : script[k][r]) controller.Submit(q, now);
            results[k][r] = controller.RunCycle(false, now, 0).responses;
          }
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < size; ++r) {
    if (!errors[r].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[r]);
  }
  py::list out;
  for (const auto& round : results) {
    py::list per_rank;
    for (const auto& rs : round) {
      py::list l;
      for (const auto& p : rs) l.append(FromResponse(p));
      per_rank.append(l);
    }
    out.append(per_rank);
  }
  py::list st;
  for (const auto& s : stats) {
    py::dict d;
    d["cycles"] = s.cycles.load();
    d["slow_path_cycles"] = s.slow_path_cycles.load();
    d["cache_hits"] = s.cache_hits.load();
    d["cache_misses"] = s.cache_misses.load();
    st.append(d);
  }
  return py::make_tuple(out, st);
}

}  // namespace

void RegisterTestingBindings(py::module_& m) {
  m.def(
      "scale_copy",
      [](const std::vector<int64_t>& values, int dtype, double factor, bool in_double) {
        const DataType t = static_cast<DataType>(dtype);
        HVD_ENFORCE(!IsFloatingPoint(t) && t != DataType::kBool, "scale_copy takes integer dtypes");
        std::vector<char> buf(values.size() * DataTypeSize(t));
        auto put = [&](auto* p) {
          for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<std::remove_pointer_t<decltype(p)>>(values[i]);
        };
        auto get = [&](auto* p) {
          std::vector<int64_t> out(values.size());
          for (size_t i = 0; i < values.size(); ++i) out[i] = static_cast<int64_t>(p[i]);
          return out;
        };
        switch (t) {
          case DataType::kUInt8: put(reinterpret_cast<uint8_t*>(buf.data())); break;
          case DataType::kInt8: put(reinterpret_cast<int8_t*>(buf.data())); break;
          case DataType::kInt16: put(reinterpret_cast<int16_t*>(buf.data())); break;
          case DataType::kInt32: put(reinterpret_cast<int32_t*>(buf.data())); break;
          default: put(reinterpret_cast<int64_t*>(buf.data())); break;
        }
        ScaleCopy(buf.data(), buf.data(), static_cast<int64_t>(values.size()), t, factor,
                  in_double);
        switch (t) {
          case DataType::kUInt8: return get(reinterpret_cast<uint8_t*>(buf.data()));
          case DataType::kInt8: return get(reinterpret_cast<int8_t*>(buf.data()));
          case DataType::kInt16: return get(reinterpret_cast<int16_t*>(buf.data()));
          case DataType::kInt32: return get(reinterpret_cast<int32_t*>(buf.data()));
          default: return get(reinterpret_cast<int64_t*>(buf.data()));
        }
      },
      py::arg("values"), py::arg("dtype"), py::arg("factor"), py::arg("in_double"),
      "The host scaling kernel on integers (Average's rule), for unit tests.");
  m.def("roundtrip_requests", [](const py::list& reqs) {
    std::vector<Request> v;
    for (const auto& q : reqs) v.push_back(ToRequest(q.cast<py::dict>()));
    std::string blob = EncodeRequests(v);
    py::list out;
    for (const auto& q : DecodeRequests(blob.data(), blob.size())) out.append(FromRequest(q));
    return out;
  });
  m.def("roundtrip_responses", [](const py::list& resps) {
    std::vector<Response> v;
    for (const auto& p : resps) v.push_back(ToResponse(p.cast<py::dict>()));
    std::string blob = EncodeResponses(v);
    py::list out;
    for (const auto& p : DecodeResponses(blob.data(), blob.size())) out.append(FromResponse(p));
    return out;
  });
  m.def("decode_requests", [](const py::bytes& b) {
    std::string s = b;
    return DecodeRequests(s.data(), s.size()).size();
  });
  m.def("fuse", [](const py::list& resps, int64_t threshold) {
    std::vector<Response> v;
    for (const auto& p : resps) v.push_back(ToResponse(p.cast<py::dict>()));
    py::list out;
    for (const auto& p : FuseResponses(std::move(v), threshold)) out.append(FromResponse(p));
    return out;
  });
  m.def("simulate", &Simulate, py::arg("size"), py::arg("cache_capacity"), py::arg("rounds"));
  m.def("float_to_half_bits", [](const std::vector<float>& v) {
    std::vector<uint16_t> out;
    for (float f : v) out.push_back(FloatToHalf(f));
    return out;
  });
  m.def("half_bits_to_float", [](const std::vector<uint16_t>& v) {
    std::vector<float> out;
    for (uint16_t h : v) out.push_back(HalfToFloat(h));
    return out;
  });
  m.def("float_to_bfloat16_bits", [](const std::vector<float>& v) {
    std::vector<uint16_t> out;
    for (float f : v) out.push_back(FloatToBFloat16(f));
    return out;
  });
}

}  // namespace hvdcompat
