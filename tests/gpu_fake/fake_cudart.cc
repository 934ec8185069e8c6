// A host-only stand-in for libcudart and libnccl (this file: the CUDA runtime
// and the shared counters; fake_nccl.cc: NCCL), for testing the GPU data
// plane on machines without GPUs. One shared library exports both APIs (the
// slice in third_party/), so HVDCOMPAT_CUDART_LIB and HVDCOMPAT_NCCL_LIB can
// both point at it.
//
// "Device" memory is host memory and every stream operation runs at once, in
// call order. NCCL collectives between processes go through files in
// $FAKE_NCCL_DIR/<unique id>/: each rank writes its contribution, waits for
// the others' and computes its result, so collectives work across mpirun
// ranks on one host. Groups defer their calls to ncclGroupEnd, running sends
// first, so grouped send/recv pairs cannot deadlock.
//
// Knobs (environment): FAKE_CUDA_DEVICE_COUNT (4), FAKE_NCCL_VERSION
// (21805), FAKE_NCCL_FAIL_AFTER=N: every communicator reports an
// asynchronous ncclRemoteError after N collectives, and events recorded
// from then on stay "not ready" (a kernel stuck on a dead peer) until the
// communicator is aborted.
// fake_gpu_stats() exposes counters for the tests (the fake::Stat order).

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda/cuda_runtime_min.h"
#include "fake_common.h"

namespace fake {

std::atomic<long> g_stats[kNumStats];
std::atomic<bool> g_hung{false};

// float16 / bfloat16 conversions (independent of the core's half.h).

float HalfToFloat(unsigned short h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400) == 0);
      bits = sign | ((112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

unsigned short FloatToHalf(float f) {
  // Round to nearest even through double arithmetic on the exponent range
  // the tests use; infinities and NaN are kept.
  if (std::isnan(f)) return 0x7e00;
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = (x >> 16) & 0x8000;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) {  // subnormal: multiples of 2^-24
    int m = static_cast<int>(std::nearbyint(a * 16777216.0f));
    return sign | static_cast<uint16_t>(m);
  }
  int e;
  float mant = std::frexp(a, &e);  // a = mant * 2^e, mant in [0.5, 1)
  int m = static_cast<int>(std::nearbyint((mant * 2.0f - 1.0f) * 1024.0f));
  int exp = e - 1 + 15;
  if (m == 1024) { m = 0; ++exp; }
  if (exp >= 31) return sign | 0x7c00;
  return sign | static_cast<uint16_t>(exp << 10) | static_cast<uint16_t>(m);
}

float Bf16ToFloat(unsigned short b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

unsigned short FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace fake

namespace {

using namespace fake;

std::mutex g_alloc_mu;
std::map<void*, size_t> g_device_allocs;
thread_local int t_device = 0;

struct FakeEvent {
  bool hung = false;  // recorded after an injected failure
};

}  // namespace

extern "C" {

// ------------------------------------------------------------ CUDA runtime

const char* cudaGetErrorString(cudaError_t e) {
  static thread_local char buf[64];
  std::snprintf(buf, sizeof(buf), "fake CUDA error %d", static_cast<int>(e));
  return buf;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int* v) { *v = 12040; return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* c) { *c = EnvInt("FAKE_CUDA_DEVICE_COUNT", 4); return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) { *d = t_device; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= EnvInt("FAKE_CUDA_DEVICE_COUNT", 4)) return static_cast<cudaError_t>(101);
  t_device = d;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  std::snprintf(id, static_cast<size_t>(len), "0000:%02x:00.0", device);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new char[1]);
  g_stats[kStreamsLive]++;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
  if (priority < -5 || priority > 0) return static_cast<cudaError_t>(1);
  return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete[] reinterpret_cast<char*>(s);
  g_stats[kStreamsLive]--;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { g_stats[kStreamSyncs]++; return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned int) {
  if (!e) return static_cast<cudaError_t>(400);
  g_stats[kStreamWaits]++;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new FakeEvent());
  g_stats[kEventsLive]++;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<FakeEvent*>(e);
  g_stats[kEventsLive]--;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  reinterpret_cast<FakeEvent*>(e)->hung = g_hung.load();
  g_stats[kEventRecords]++;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return reinterpret_cast<FakeEvent*>(e)->hung && g_hung.load() ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::malloc(n ? n : 1);
  g_stats[kMallocs]++;
  g_stats[kLiveDevice]++;
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  g_device_allocs[*p] = n;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g_alloc_mu);
    if (!g_device_allocs.erase(p)) {
      g_stats[kMisuse]++;
      return static_cast<cudaError_t>(1);
    }
  }
  std::free(p);
  g_stats[kFrees]++;
  g_stats[kLiveDevice]--;
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) {
  g_stats[kAsyncMallocs]++;
  return cudaMalloc(p, n);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  g_stats[kAsyncFrees]++;
  return cudaFree(p);
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int) {
  *p = std::malloc(n ? n : 1);
  g_stats[kHostAllocs]++;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  g_stats[kHostFrees]++;
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::memmove(d, s, n);
  g_stats[kMemcpys]++;
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h,
                              cudaMemcpyKind, cudaStream_t) {
  if (w > dp || w > sp) return static_cast<cudaError_t>(1);
  for (size_t r = 0; r < h; ++r) {
    std::memcpy(static_cast<char*>(d) + r * dp, static_cast<const char*>(s) + r * sp, w);
  }
  g_stats[kMemcpy2Ds]++;
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  g_stats[kMemsets]++;
  return cudaSuccess;
}

// Test hook: copies up to n counters (order of the Stat enum) into out.
int fake_gpu_stats(long* out, int n) {
  int k = n < kNumStats ? n : kNumStats;
  for (int i = 0; i < k; ++i) out[i] = g_stats[i].load();
  return kNumStats;
}

}  // extern "C"
