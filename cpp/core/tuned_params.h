// The engine settings the autotuner may change while a job runs, and their
// encoding in the coordinator's response broadcast (see Note [Tuned params
// in negotiation] in controller.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hvdcompat {

struct TunedParams {
  int64_t fusion_threshold_bytes = 0;  // HOROVOD_FUSION_THRESHOLD
  double cycle_time_ms = 0;            // HOROVOD_CYCLE_TIME
  int64_t fusion_chunk_bytes = 0;      // HVDCOMPAT_FUSION_CHUNK_BYTES
  int64_t max_call_bytes = 0;          // HVDCOMPAT_MAX_CALL_BYTES
  bool hierarchical_allreduce = false; // HOROVOD_HIERARCHICAL_ALLREDUCE
  bool hierarchical_allgather = false; // HOROVOD_HIERARCHICAL_ALLGATHER (no engine path yet)
  bool active = false;                 // the search is still running

  bool operator==(const TunedParams& o) const;
  bool operator!=(const TunedParams& o) const { return !(*this == o); }
  // "fusion 64 MiB, cycle 2.5 ms, chunk 1 MiB, call 16 MiB" for log lines.
  std::string ToString() const;
};

// Fixed-size little-endian record (the engine never mixes byte orders).
constexpr size_t kTunedParamsBytes = 8 * 4 + 4;
std::string EncodeTunedParams(const TunedParams& p);
// Reads one record from the front of `data`; throws InternalError when short.
TunedParams DecodeTunedParams(const char* data, size_t size);

}  // namespace hvdcompat
