// Shared state of the fake CUDA runtime and NCCL (tests/gpu_fake): counters
// the tests read, and the "hung" flag an injected NCCL failure raises so
// that events recorded afterwards stay not ready. See fake_cudart.cc.
#pragma once

#include <atomic>
#include <cstdlib>

namespace fake {

enum Stat {
  kMallocs, kFrees, kAsyncMallocs, kAsyncFrees, kLiveDevice, kHostAllocs, kHostFrees,
  kStreamWaits, kEventRecords, kEventsLive, kStreamsLive, kMemcpys, kMemcpy2Ds, kMemsets,
  kAllReduces, kBroadcasts, kAllGathers, kReduceScatters, kSends, kRecvs, kGroups,
  kPreMulSums, kRedOpDestroys, kCommsLive, kAborts, kMisuse, kStreamSyncs, kAvgOps,
  kNumStats
};

extern std::atomic<long> g_stats[kNumStats];
extern std::atomic<bool> g_hung;

inline int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

float HalfToFloat(unsigned short h);
unsigned short FloatToHalf(float f);
float Bf16ToFloat(unsigned short b);
unsigned short FloatToBf16(float f);

}  // namespace fake
