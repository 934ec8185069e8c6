// Shared state of the fake CUDA runtime and NCCL (tests/gpu_fake): the
// counters the tests read, and the stream machinery fake_nccl.cc queues its
// collectives on. See fake_cudart.cc for the semantics.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <vector>

#include "cuda/cuda_runtime_min.h"

namespace fake {

// Appended to only: tests/gpu_fake/rank_checks.py names them in this order.
enum Stat {
  kMallocs, kFrees, kAsyncMallocs, kAsyncFrees, kLiveDevice, kHostAllocs, kHostFrees,
  kStreamWaits, kEventRecords, kEventsLive, kStreamsLive, kMemcpys, kMemcpy2Ds, kMemsets,
  kAllReduces, kBroadcasts, kAllGathers, kReduceScatters, kSends, kRecvs, kGroups,
  kPreMulSums, kRedOpDestroys, kCommsLive, kAborts, kMisuse, kStreamSyncs, kAvgOps,
  kDeviceSyncs,         // cudaFree / cudaFreeHost: each drains every stream of the device
  kConcurrentLaunches,  // NCCL calls on one device overlapping from two host threads
  kAbortInCall,         // ncclCommAbort while another thread is inside a call on that comm
  kUnorderedFrees,      // cudaFreeAsync on a stream not ordered after the buffer's last use
  kWrongDevice,         // event recorded on a stream of another device
  kUseAfterFree,        // an operation issued on memory already freed
  kCommInits,           // ncclCommInitRank (fake_nccl_comm_ids() lists their unique ids)
  kCommDestroys,        // ncclCommDestroy
  kNumStats
};

extern std::atomic<long> g_stats[kNumStats];

inline int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

struct Stream;

// The stream a handle names: 0 is the legacy stream of the calling thread's
// current device; a handle the fake did not create (a test's made-up
// number) is registered on first use as a stream of no particular device.
Stream* ResolveStream(cudaStream_t handle);
// Queues `op` on `stream` (run by the stream's worker, in order) after
// checking and recording `touched` device pointers as used by it.
void Enqueue(Stream* stream, std::function<void()> op, const std::vector<const void*>& touched);
int CurrentDevice();

float HalfToFloat(unsigned short h);
unsigned short FloatToHalf(float f);
float Bf16ToFloat(unsigned short b);
unsigned short FloatToBf16(float f);

}  // namespace fake
