// Negotiation at sizes beyond one machine: the ranks of one process set are
// threads sharing a FakeNetwork (docs/scaling.md, scripts/negotiation_scaling.py).
//
// simulate_scaling: every rank submits the same list of allreduces each
// iteration and runs cycles until all are answered. Per iteration it reports
// set rank 0's coordinator time and bytes (EngineStats), the thread CPU time
// of the engine's own work per rank (RunCycle minus the transport: the fake's
// combine reads every rank's words, which an MPI allreduce does not), and the
// cycles it took.
//
// coordinator_footprint: the coordinator's side of one first iteration alone
// (one thread): N ranks' encoded request lists decoded and added, then
// decided and encoded; the time of each part and the heap it holds between
// them (glibc's mallinfo2).
#include <malloc.h>
#include <time.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <thread>
#include <vector>

#include "core/engine_stats.h"
#include "core/message.h"
#include "negotiation/controller.h"
#include "negotiation/coordinator.h"
#include "testing/fake_transport.h"

namespace py = pybind11;

namespace hvdcompat {

namespace {

uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

uint64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch()).count();
}

// A FakeTransport that keeps the thread CPU time spent inside it.
class TimedTransport : public ControlTransport {
 public:
  TimedTransport(FakeNetwork* net, int rank) : inner_(net, rank) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void CombineFlags(std::vector<uint64_t>& words) override {
    const uint64_t t = ThreadCpuNs();
    inner_.CombineFlags(words);
    cpu_ns += ThreadCpuNs() - t;
  }
  void GatherBlobs(const std::string& mine, size_t max_bytes,
                   std::vector<std::string>* all) override {
    const uint64_t t = ThreadCpuNs();
    inner_.GatherBlobs(mine, max_bytes, all);
    cpu_ns += ThreadCpuNs() - t;
  }
  void BroadcastBlob(std::string* blob) override {
    const uint64_t t = ThreadCpuNs();
    inner_.BroadcastBlob(blob);
    cpu_ns += ThreadCpuNs() - t;
  }
  uint64_t cpu_ns = 0;

 private:
  FakeTransport inner_;
};

std::vector<Request> GradientRequests(const std::vector<Shape>& shapes) {
  std::vector<Request> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Request q;
    q.op = OpType::kAllreduce;
    q.dtype = DataType::kFloat32;
    q.reduce_op = ReduceOp::kAverage;
    q.name = "allreduce.model.layer" + std::to_string(i) + ".weight.grad";
    q.shapes = {shapes[i]};
    out.push_back(std::move(q));
  }
  return out;
}

struct IterationRecord {
  uint64_t cycles = 0, slow_cycles = 0;
  uint64_t coordinator_ns = 0, in_bytes = 0, out_bytes = 0, flag_bytes = 0;
  uint64_t root_engine_cpu_ns = 0;
  uint64_t max_other_engine_cpu_ns = 0, sum_other_engine_cpu_ns = 0;
  uint64_t wall_ns = 0;
};

py::list SimulateScaling(int size, const std::vector<Shape>& shapes, int iterations,
                         size_t cache_capacity) {
  HVD_ENFORCE(size >= 2, "simulate_scaling needs 2 or more ranks, got " << size);
  const std::vector<Request> requests = GradientRequests(shapes);
  std::vector<int> global(size);
  for (int i = 0; i < size; ++i) global[i] = i;
  // [iteration][rank]
  std::vector<std::vector<uint64_t>> engine_cpu(iterations, std::vector<uint64_t>(size));
  std::vector<IterationRecord> records(iterations);
  std::vector<std::string> errors(size);
  {
    py::gil_scoped_release release;
    FakeNetwork net(size);
    std::vector<EngineStats> stats(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        try {
          TimedTransport transport(&net, r);
          Controller controller(&transport, cache_capacity, global, 0, &stats[r]);
          for (int it = 0; it < iterations; ++it) {
            const uint64_t wall0 = WallNs();
            const uint64_t cpu0 = ThreadCpuNs(), tr0 = transport.cpu_ns;
            const uint64_t c0 = stats[r].cycles, s0 = stats[r].slow_path_cycles;
            const uint64_t ns0 = stats[r].coordinator_ns, in0 = stats[r].coordinator_in_bytes;
            const uint64_t out0 = stats[r].coordinator_out_bytes, f0 = stats[r].flag_bytes;
            auto now = Clock::now();
            for (const auto& q : requests) controller.Submit(q, now);
            size_t answered = 0;
            while (answered < requests.size()) {
              answered += controller.RunCycle(false, now, 0).responses.size();
              HVD_ENFORCE(stats[r].cycles - c0 < 10000, "negotiation did not converge");
            }
            engine_cpu[it][r] = (ThreadCpuNs() - cpu0) - (transport.cpu_ns - tr0);
            if (r == 0) {
              IterationRecord& rec = records[it];
              rec.cycles = stats[r].cycles - c0;
              rec.slow_cycles = stats[r].slow_path_cycles - s0;
              rec.coordinator_ns = stats[r].coordinator_ns - ns0;
              rec.in_bytes = stats[r].coordinator_in_bytes - in0;
              rec.out_bytes = stats[r].coordinator_out_bytes - out0;
              rec.flag_bytes = stats[r].flag_bytes - f0;
              rec.wall_ns = WallNs() - wall0;
            }
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
  for (int it = 0; it < iterations; ++it) {
    IterationRecord& rec = records[it];
    for (int r = 1; r < size; ++r) {
      rec.sum_other_engine_cpu_ns += engine_cpu[it][r];
      rec.max_other_engine_cpu_ns = std::max(rec.max_other_engine_cpu_ns, engine_cpu[it][r]);
    }
    py::dict d;
    d["cycles"] = rec.cycles;
    d["slow_path_cycles"] = rec.slow_cycles;
    d["coordinator_ns"] = rec.coordinator_ns;
    d["coordinator_in_bytes"] = rec.in_bytes;
    d["coordinator_out_bytes"] = rec.out_bytes;
    d["flag_bytes"] = rec.flag_bytes;
    d["root_engine_cpu_ns"] = engine_cpu[it][0];
    d["mean_other_engine_cpu_ns"] = rec.sum_other_engine_cpu_ns / (size - 1);
    d["max_other_engine_cpu_ns"] = rec.max_other_engine_cpu_ns;
    d["wall_ns"] = rec.wall_ns;
    out.append(d);
  }
  return out;
}

py::dict CoordinatorFootprint(int size, const std::vector<Shape>& shapes) {
  std::vector<Request> requests = GradientRequests(shapes);
  std::vector<std::string> blobs;
  for (int r = 0; r < size; ++r) {
    for (auto& q : requests) q.rank = r;
    blobs.push_back(EncodeRequests(requests));
  }
  std::vector<int> global(size);
  for (int i = 0; i < size; ++i) global[i] = i;
  size_t in_bytes = 0;
  for (const auto& b : blobs) in_bytes += b.size();
  const size_t heap0 = mallinfo2().uordblks;
  const uint64_t t0 = ThreadCpuNs();
  Coordinator coordinator(size, global, 0);
  const auto now = Clock::now();
  for (const auto& b : blobs) {
    for (auto& q : DecodeRequests(b.data(), b.size())) coordinator.Add(std::move(q), now);
  }
  const uint64_t t1 = ThreadCpuNs();
  const size_t held = mallinfo2().uordblks - heap0;
  std::vector<Response> ready = coordinator.TakeReady();
  const std::string reply = EncodeResponses(ready);
  const uint64_t t2 = ThreadCpuNs();
  HVD_ENFORCE_EQ(ready.size(), requests.size(), "every request should be ready");
  for (const auto& p : ready) HVD_ENFORCE(p.error.empty(), p.error);
  py::dict d;
  d["in_bytes"] = in_bytes;
  d["out_bytes"] = reply.size();
  d["decode_add_ns"] = t1 - t0;
  d["decide_encode_ns"] = t2 - t1;
  d["held_bytes"] = held;
  return d;
}

}  // namespace

void RegisterNegotiationSim(py::module_& m) {
  m.def("simulate_scaling", &SimulateScaling, py::arg("size"), py::arg("shapes"),
        py::arg("iterations"), py::arg("cache_capacity") = 1024);
  m.def("coordinator_footprint", &CoordinatorFootprint, py::arg("size"), py::arg("shapes"));
}

}  // namespace hvdcompat
