// Counters that prove what the engine did (fusion, caching), readable from
// any thread while workers run. Aggregated over every process set.
#pragma once

#include <atomic>
#include <initializer_list>
#include <cstdint>

#include "core/tuning_record.h"

namespace hvdcompat {

struct EngineStats {
  std::atomic<uint64_t> cycles{0};             // negotiation cycles
  std::atomic<uint64_t> slow_path_cycles{0};   // cycles that gathered requests
  std::atomic<uint64_t> cache_hits{0};         // responses served from the cache
  std::atomic<uint64_t> cache_misses{0};       // cacheable requests sent to the coordinator
  std::atomic<uint64_t> collectives{0};        // data collectives executed (after fusion)
  std::atomic<uint64_t> tensors{0};            // tensors completed through a collective
  std::atomic<uint64_t> fused_collectives{0};  // collectives that carried > 1 tensor
  std::atomic<uint64_t> fused_tensors{0};      // tensors that travelled in those
  std::atomic<uint64_t> bytes{0};              // payload bytes of executed collectives
  std::atomic<uint64_t> errors{0};             // ops completed with an error
  // The tunables in effect and the autotuner's changes; Reset() keeps them.
  TuningRecord tuning;
  // Host collective steps run node-aware (HOROVOD_HIERARCHICAL_ALLREDUCE/ALLGATHER).
  std::atomic<uint64_t> hierarchical_allreduces{0};
  std::atomic<uint64_t> hierarchical_allgathers{0};
  // Host allreduce segments run on the network plan (Note [Link plans]).
  std::atomic<uint64_t> network_allreduces{0};
  // Bytes those segments handed to MPI (elements times the wire type's size).
  std::atomic<uint64_t> network_bytes{0};
  // Negotiation's own traffic and work (Note [Negotiation cost] in controller.cc):
  // wall time inside negotiation cycles and bytes of the cycle words each rank
  // combines, and on set rank 0 the request lists gathered, the responses
  // broadcast, and the time spent deciding.
  std::atomic<uint64_t> negotiation_ns{0};
  std::atomic<uint64_t> flag_bytes{0};
  std::atomic<uint64_t> coordinator_in_bytes{0};
  std::atomic<uint64_t> coordinator_out_bytes{0};
  std::atomic<uint64_t> coordinator_ns{0};

  void Reset() {
    for (auto* c : {&cycles, &slow_path_cycles, &cache_hits, &cache_misses, &collectives,
                    &tensors, &fused_collectives, &fused_tensors, &bytes, &errors, &hierarchical_allreduces,
                    &hierarchical_allgathers, &network_allreduces, &network_bytes, &negotiation_ns, &flag_bytes,
                    &coordinator_in_bytes, &coordinator_out_bytes, &coordinator_ns}) {
      c->store(0);
    }
  }
};

}  // namespace hvdcompat
