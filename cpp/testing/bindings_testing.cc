// _core_testing: the core's pure logic exposed for unit tests (encoding,
// fusion planning, 16-bit conversions, the GPU library loader's error paths,
// and whole negotiation cycles among ranks simulated as threads over an
// in-memory transport). Built only with HVDCOMPAT_BUILD_TESTING=ON
// (tests/core_testing.py builds it on demand); never part of a wheel.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <thread>

#include "autotune/bayesian_optimizer.h"
#include "bindings/py_convert.h"
#include "autotune/gaussian_process.h"
#include "autotune/parameter_manager.h"
#include "negotiation/controller.h"
#include "ops/collective_layout.h"
#include "ops/cpu_kernels.h"
#include "ops/node_layout.h"
#include "testing/fake_transport.h"
#include "negotiation/fusion.h"
#include "core/half.h"
#include "core/message.h"
#include "gpu/gpu_library.h"

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

TunedParams ToTuned(const py::dict& d) {
  TunedParams t;
  t.fusion_threshold_bytes = Get<int64_t>(d, "fusion_threshold_bytes", 0);
  t.cycle_time_ms = Get<double>(d, "cycle_time_ms", 0);
  t.fusion_chunk_bytes = Get<int64_t>(d, "fusion_chunk_bytes", 0);
  t.max_call_bytes = Get<int64_t>(d, "max_call_bytes", 0);
  t.hierarchical_allreduce = Get<bool>(d, "hierarchical_allreduce", false);
  t.hierarchical_allgather = Get<bool>(d, "hierarchical_allgather", false);
  t.active = Get<bool>(d, "active", false);
  return t;
}

py::object FromOptionalTuned(const std::optional<TunedParams>& t) {
  return t ? py::object(TunedParamsDict(*t)) : py::object(py::none());
}

AutotuneOptions ToAutotuneOptions(const py::dict& d) {
  AutotuneOptions o;
  o.log_path = Get<std::string>(d, "log_path", "");
  o.warmup_samples = Get<int64_t>(d, "warmup_samples", o.warmup_samples);
  o.steps_per_sample = Get<int64_t>(d, "steps_per_sample", o.steps_per_sample);
  o.bayes_opt_max_samples = Get<int64_t>(d, "bayes_opt_max_samples", o.bayes_opt_max_samples);
  o.gaussian_process_noise = Get<double>(d, "gaussian_process_noise", o.gaussian_process_noise);
  o.fixed_fusion_threshold = Get<bool>(d, "fixed_fusion_threshold", false);
  o.fixed_cycle_time = Get<bool>(d, "fixed_cycle_time", false);
  o.fixed_fusion_chunk = Get<bool>(d, "fixed_fusion_chunk", false);
  o.fixed_max_call = Get<bool>(d, "fixed_max_call", false);
  o.tune_hierarchical_allreduce = Get<bool>(d, "tune_hierarchical_allreduce", false);
  o.tune_hierarchical_allgather = Get<bool>(d, "tune_hierarchical_allgather", false);
  o.cache_enabled = Get<bool>(d, "cache_enabled", true);
  o.seed = Get<uint64_t>(d, "seed", o.seed);
  return o;
}

Clock::time_point At(double seconds) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

// rounds[k][r] = requests rank r submits before cycle k. Every rank runs one
// cycle per round; announce[k] (optional) is announced by rank 0 before
// cycle k. Returns results[k][r] = responses rank r got in cycle k,
// per-rank statistics, and params[k][r] = the tuned parameters rank r
// received in cycle k (None when none).
py::tuple Simulate(int size, size_t cache_capacity, const py::list& rounds,
                   const py::dict& announce) {
  std::map<size_t, TunedParams> announced;
  for (const auto& kv : announce) {
    announced[kv.first.cast<size_t>()] = ToTuned(kv.second.cast<py::dict>());
  }
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
  std::vector<std::vector<std::optional<TunedParams>>> params(
      script.size(), std::vector<std::optional<TunedParams>>(size));
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
            if (r == 0 && announced.count(k)) controller.AnnounceParams(announced[k]);
            Controller::Outcome o = controller.RunCycle(false, now, 0);
            results[k][r] = std::move(o.responses);
            params[k][r] = o.params;
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
  py::list got;
  for (const auto& round : params) {
    py::list per_rank;
    for (const auto& p : round) per_rank.append(FromOptionalTuned(p));
    got.append(per_rank);
  }
  return py::make_tuple(out, st, got);
}

void RegisterAutotuneTesting(py::module_& m) {
  m.def("roundtrip_tuned_params", [](const py::dict& d) {
    std::string blob = EncodeTunedParams(ToTuned(d));
    return py::make_tuple(TunedParamsDict(DecodeTunedParams(blob.data(), blob.size())), blob.size());
  });
  m.def("gp_fit_predict",
        [](const std::vector<Point>& x, const std::vector<double>& y, double length,
           double signal_var, double noise_var, const std::vector<Point>& queries) {
          GaussianProcess gp;
          gp.Fit(x, y, {length, signal_var, noise_var});
          std::vector<double> means, sds;
          for (const auto& q : queries) {
            double m, s;
            gp.Predict(q, &m, &s);
            means.push_back(m);
            sds.push_back(s);
          }
          return py::make_tuple(means, sds, gp.LogMarginalLikelihood());
        });
  m.def("gp_choose_hyper",
        [](const std::vector<Point>& x, const std::vector<double>& y, double noise_var) {
          auto h = GaussianProcess::ChooseHyper(x, y, noise_var);
          return py::make_tuple(h.length, h.signal_var);
        });
  m.def("expected_improvement", &ExpectedImprovement);

  py::class_<BayesianOptimizer>(m, "BayesianOptimizer")
      .def(py::init<size_t, double, uint64_t, double>(), py::arg("dims"), py::arg("noise"),
           py::arg("seed"), py::arg("xi") = 0.01)
      .def("add_sample", &BayesianOptimizer::AddSample)
      .def("next_sample", &BayesianOptimizer::NextSample)
      .def("fit", &BayesianOptimizer::Fit)
      .def("best_sample", &BayesianOptimizer::BestSample)
      .def("expected_improvement", &BayesianOptimizer::ExpectedImprovementAt)
      .def_property_readonly("standardized", &BayesianOptimizer::standardized)
      .def_property_readonly("incumbent", &BayesianOptimizer::incumbent)
      .def_property_readonly("xi", &BayesianOptimizer::xi)
      .def_property_readonly("hyper", [](const BayesianOptimizer& b) {
        const auto& h = b.model().hyper();
        return py::make_tuple(h.length, h.signal_var, h.noise_var);
      });

  py::class_<ParameterManager>(m, "ParameterManager")
      .def(py::init([](const py::dict& options, const py::dict& initial, double now) {
        return std::make_unique<ParameterManager>(ToAutotuneOptions(options), ToTuned(initial),
                                                  At(now));
      }))
      .def("update",
           [](ParameterManager& pm, const std::vector<std::string>& names, int64_t bytes,
              double now) { return FromOptionalTuned(pm.Update(names, bytes, At(now))); })
      .def("applied", [](ParameterManager& pm, double now) { pm.Applied(At(now)); })
      .def_property_readonly("active", &ParameterManager::active)
      .def_property_readonly("num_tuned_knobs", &ParameterManager::num_tuned_knobs)
      .def_property_readonly("current", [](const ParameterManager& pm) { return TunedParamsDict(pm.current()); })
      .def_property_readonly("best", [](const ParameterManager& pm) { return TunedParamsDict(pm.best()); })
      .def_property_readonly("best_score", &ParameterManager::best_score)
      .def("to_cube", [](const ParameterManager& pm, const py::dict& p) { return pm.ToCube(ToTuned(p)); })
      .def("from_cube", [](const ParameterManager& pm, const Point& x) { return TunedParamsDict(pm.FromCube(x)); });
  m.def("autotune_options_from_environment", [] {
    AutotuneOptions o = AutotuneOptions::FromConfig(Config::FromEnvironment());
    py::dict d;
    d["log_path"] = o.log_path;
    d["warmup_samples"] = o.warmup_samples;
    d["steps_per_sample"] = o.steps_per_sample;
    d["bayes_opt_max_samples"] = o.bayes_opt_max_samples;
    d["gaussian_process_noise"] = o.gaussian_process_noise;
    d["fixed_fusion_threshold"] = o.fixed_fusion_threshold;
    d["fixed_cycle_time"] = o.fixed_cycle_time;
    d["fixed_fusion_chunk"] = o.fixed_fusion_chunk;
    d["fixed_max_call"] = o.fixed_max_call;
    d["cache_enabled"] = o.cache_enabled;
    return d;
  });
  m.attr("AUTOTUNE_LOG_HEADER") = ParameterManager::kLogHeader;
  m.attr("AUTOTUNE_SAMPLES_PER_SCORE") = ParameterManager::kSamplesPerScore;
}

void RegisterLayoutTesting(py::module_& m) {
  m.def("equal_call_elements", &EqualCallElements, py::arg("count"), py::arg("max_bytes"),
        py::arg("esize"),
        "Elements per call of a payload split into equal calls (ops/collective_layout.h).");
  m.def(
      "plan_allgather",
      [](const std::vector<int64_t>& rows, const std::vector<int64_t>& row_sizes, int size) {
        const GatherLayout g = PlanAllgather(rows, row_sizes, size);
        py::dict d;
        d["counts"] = g.counts;
        d["rank_counts"] = g.rank_counts;
        d["rank_displs"] = g.rank_displs;
        d["out_rows"] = g.out_rows;
        d["total"] = g.total;
        d["largest"] = g.largest;
        d["even"] = g.even;
        d["uniform"] = g.uniform;
        return d;
      },
      py::arg("rows"), py::arg("row_sizes"), py::arg("size"),
      "The backends' allgather layout (ops/collective_layout.h); rows are rank-major.");
  m.def(
      "plan_reducescatter",
      [](const std::vector<int64_t>& rows, const std::vector<int64_t>& row_sizes, int size) {
        const ScatterLayout s = PlanReducescatter(rows, row_sizes, size);
        py::dict d;
        d["counts"] = s.counts;
        d["offsets"] = s.offsets;
        d["rank_counts"] = s.rank_counts;
        d["total"] = s.total;
        d["largest"] = s.largest;
        d["even"] = s.even;
        return d;
      },
      py::arg("rows"), py::arg("row_sizes"), py::arg("size"),
      "The backends' reducescatter layout (ops/collective_layout.h).");
  m.def(
      "group_by_node",
      [](const std::vector<std::string>& nodes, int rank) {
        const NodeGroups g = GroupByNode(nodes, rank);
        py::dict d;
        d["local"] = g.local;
        d["cross"] = g.cross;
        d["local_rank"] = g.local_rank;
        d["cross_rank"] = g.cross_rank;
        d["min_local"] = g.min_local;
        d["max_local"] = g.max_local;
        d["consecutive"] = g.consecutive;
        return d;
      },
      py::arg("nodes"), py::arg("rank"),
      "Rank `rank`'s node and cross groups when rank r runs on node nodes[r] "
      "(ops/node_layout.h).");
}

}  // namespace

void RegisterNegotiationSim(py::module_& m);  // negotiation_sim.cc

static void RegisterGpuLoaderTesting(py::module_& m) {
  m.def(
      "load_gpu_libraries",
      [](std::vector<std::string> cudart, std::vector<std::string> nccl) {
        GpuSearchPaths paths;
        paths.cudart = std::move(cudart);
        paths.nccl = std::move(nccl);
        GpuLibraries g;
        {
          py::gil_scoped_release release;
          g = LoadGpuLibraries(paths);
        }
        return GpuLibrariesDict(g);
      },
      py::arg("cudart") = std::vector<std::string>(), py::arg("nccl") = std::vector<std::string>(),
      "One uncached load attempt with the current environment (loader error paths).");
}

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
  m.def(
      "simulate",
      [](int size, size_t cache_capacity, const py::list& rounds) {
        py::tuple t = Simulate(size, cache_capacity, rounds, py::dict());
        return py::make_tuple(t[0], t[1]);
      },
      py::arg("size"), py::arg("cache_capacity"), py::arg("rounds"));
  // Also returns what each rank received from AnnounceParams, per round.
  m.def("simulate_announce", &Simulate, py::arg("size"), py::arg("cache_capacity"),
        py::arg("rounds"), py::arg("announce"));
  RegisterAutotuneTesting(m);
  RegisterNegotiationSim(m);
  RegisterLayoutTesting(m);
  RegisterGpuLoaderTesting(m);
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

PYBIND11_MODULE(_core_testing, m) {
  m.doc() = "hvdcompat core logic for unit tests (test builds only)";
  hvdcompat::RegisterTestingBindings(m);
}
