// A host-only stand-in for libcudart and libnccl, for testing the GPU data
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
// fake_gpu_stats() exposes counters for the tests (see kStatNames).

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_runtime_min.h"
#include "nccl/nccl_min.h"

namespace {

enum Stat {
  kMallocs, kFrees, kAsyncMallocs, kAsyncFrees, kLiveDevice, kHostAllocs, kHostFrees,
  kStreamWaits, kEventRecords, kEventsLive, kStreamsLive, kMemcpys, kMemcpy2Ds, kMemsets,
  kAllReduces, kBroadcasts, kAllGathers, kReduceScatters, kSends, kRecvs, kGroups,
  kPreMulSums, kRedOpDestroys, kCommsLive, kAborts, kMisuse, kStreamSyncs, kAvgOps,
  kNumStats
};

std::atomic<long> g_stats[kNumStats];
std::atomic<bool> g_hung{false};
std::mutex g_alloc_mu;
std::map<void*, size_t> g_device_allocs;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

thread_local int t_device = 0;

struct FakeEvent {
  bool hung = false;  // recorded after an injected failure
};

// ---------------------------------------------------------------- float16

float HalfToFloat(uint16_t h) {
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

uint16_t FloatToHalf(float f) {
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

float Bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

size_t TypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

// ---------------------------------------------------------------- comms

struct FakeComm {
  std::string dir;
  int nranks = 1;
  int rank = 0;
  uint64_t seq = 0;
  int ops = 0;
  ncclResult_t async_error = ncclSuccess;
  bool aborted = false;
  std::map<int, uint64_t> sent, received;
  std::map<int, std::pair<double, ncclDataType_t>> premul;  // op -> scalar
  int next_op = ncclNumOps;
  std::string last_error;
};

std::string BaseDir() {
  const char* d = std::getenv("FAKE_NCCL_DIR");
  return d && *d ? d : "/tmp/fake_nccl";
}

void WriteFile(const std::string& path, const void* data, size_t bytes) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  }
  std::rename(tmp.c_str(), path.c_str());
}

bool WaitRead(const std::string& path, std::vector<char>* out) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int sleep_us = 20;
  while (true) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 2000);
  }
}

// Every rank's `bytes` from `mine`, in rank order.
bool Exchange(FakeComm* c, const void* mine, size_t bytes, std::vector<std::vector<char>>* all) {
  uint64_t seq = c->seq++;
  std::string stem = c->dir + "/" + std::to_string(seq) + ".";
  WriteFile(stem + std::to_string(c->rank), mine, bytes);
  all->assign(c->nranks, {});
  for (int r = 0; r < c->nranks; ++r) {
    if (!WaitRead(stem + std::to_string(r), &(*all)[r])) {
      c->last_error = "timed out waiting for rank " + std::to_string(r);
      return false;
    }
  }
  // Everyone wrote this round, so everyone finished reading the previous one.
  if (seq > 0) std::remove((c->dir + "/" + std::to_string(seq - 1) + "." +
                            std::to_string(c->rank)).c_str());
  return true;
}

template <typename T>
void ReduceTyped(const std::vector<std::vector<char>>& all, size_t offset, size_t count,
                 ncclRedOp_t op, double scalar, bool premul, void* out, int n) {
  std::vector<double> acc(count);
  for (int r = 0; r < n; ++r) {
    const T* in = reinterpret_cast<const T*>(all[r].data()) + offset;
    for (size_t i = 0; i < count; ++i) {
      double v = premul ? static_cast<double>(static_cast<T>(in[i] * static_cast<T>(scalar)))
                        : static_cast<double>(in[i]);
      if (r == 0) { acc[i] = v; continue; }
      switch (op) {
        case ncclProd: acc[i] *= v; break;
        case ncclMax: acc[i] = std::max(acc[i], v); break;
        case ncclMin: acc[i] = std::min(acc[i], v); break;
        default: acc[i] += v; break;
      }
    }
  }
  T* o = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    if (op == ncclAvg) {
      if (std::is_integral<T>::value) {
        o[i] = static_cast<T>(static_cast<long long>(acc[i]) / n);
      } else {
        o[i] = static_cast<T>(acc[i] / n);
      }
    } else {
      o[i] = static_cast<T>(acc[i]);
    }
  }
}

void Reduce16(const std::vector<std::vector<char>>& all, size_t offset, size_t count,
              ncclRedOp_t op, double scalar, bool premul, void* out, int n, bool bf) {
  auto to_f = bf ? Bf16ToFloat : HalfToFloat;
  auto from_f = bf ? FloatToBf16 : FloatToHalf;
  float s = to_f(from_f(static_cast<float>(scalar)));
  uint16_t* o = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < count; ++i) {
    float acc = 0;
    for (int r = 0; r < n; ++r) {
      float v = to_f(reinterpret_cast<const uint16_t*>(all[r].data())[offset + i]);
      if (premul) v = to_f(from_f(v * s));
      if (r == 0) { acc = v; continue; }
      switch (op) {
        case ncclProd: acc *= v; break;
        case ncclMax: acc = std::max(acc, v); break;
        case ncclMin: acc = std::min(acc, v); break;
        default: acc += v; break;
      }
    }
    if (op == ncclAvg) acc /= n;
    o[i] = from_f(acc);
  }
}

ncclResult_t ReduceInto(FakeComm* c, const std::vector<std::vector<char>>& all, size_t offset,
                        size_t count, ncclDataType_t type, ncclRedOp_t op, void* out) {
  bool premul = false;
  double scalar = 1.0;
  if (op >= ncclNumOps) {
    auto it = c->premul.find(op);
    if (it == c->premul.end()) return ncclInvalidArgument;
    premul = true;
    scalar = it->second.first;
  }
  if (op == ncclAvg) g_stats[kAvgOps]++;
  int n = c->nranks;
  switch (type) {
    case ncclInt8: ReduceTyped<int8_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclUint8: ReduceTyped<uint8_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclInt32: ReduceTyped<int32_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclUint32: ReduceTyped<uint32_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclInt64: ReduceTyped<int64_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclUint64: ReduceTyped<uint64_t>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclFloat32: ReduceTyped<float>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclFloat64: ReduceTyped<double>(all, offset, count, op, scalar, premul, out, n); break;
    case ncclFloat16: Reduce16(all, offset, count, op, scalar, premul, out, n, false); break;
    case ncclBfloat16: Reduce16(all, offset, count, op, scalar, premul, out, n, true); break;
    default: return ncclInvalidArgument;
  }
  return ncclSuccess;
}

// Group state of the calling thread: queued calls run at ncclGroupEnd.
struct Group {
  int depth = 0;
  std::vector<std::function<ncclResult_t()>> sends;
  std::vector<std::function<ncclResult_t()>> rest;
};
thread_local Group t_group;

ncclResult_t Run(bool is_send, std::function<ncclResult_t()> fn) {
  if (t_group.depth > 0) {
    (is_send ? t_group.sends : t_group.rest).push_back(std::move(fn));
    return ncclSuccess;
  }
  return fn();
}

// Common entry checks; true when the call should do nothing more (an
// injected failure has "hung" it).
bool Begin(FakeComm* c, ncclResult_t* rc) {
  *rc = ncclSuccess;
  if (!c || c->aborted) {
    g_stats[kMisuse]++;
    *rc = ncclInvalidUsage;
    return true;
  }
  int fail_after = EnvInt("FAKE_NCCL_FAIL_AFTER", -1);
  if (fail_after >= 0 && c->ops >= fail_after) {
    c->async_error = ncclRemoteError;
    c->last_error = "injected remote error";
    g_hung = true;
    return true;
  }
  ++c->ops;
  return false;
}

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

// -------------------------------------------------------------------- NCCL

ncclResult_t ncclGetVersion(int* v) { *v = EnvInt("FAKE_NCCL_VERSION", 21805); return ncclSuccess; }
const char* ncclGetErrorString(ncclResult_t r) {
  static thread_local char buf[64];
  std::snprintf(buf, sizeof(buf), "fake NCCL error %d", static_cast<int>(r));
  return buf;
}
const char* ncclGetLastError(ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  return c ? c->last_error.c_str() : "";
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof(id->internal));
  std::random_device rd;
  std::snprintf(id->internal, sizeof(id->internal), "fake-%d-%08x%08x", getpid(), rd(), rd());
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  auto* c = new FakeComm();
  c->nranks = nranks;
  c->rank = rank;
  mkdir(BaseDir().c_str(), 0777);
  c->dir = BaseDir() + "/" + std::string(id.internal);
  mkdir(c->dir.c_str(), 0777);
  *comm = reinterpret_cast<ncclComm_t>(c);
  g_stats[kCommsLive]++;
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || c->aborted) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  delete c;
  g_stats[kCommsLive]--;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || c->aborted) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  // Kept (marked) so that later use is detected as misuse.
  c->aborted = true;
  g_hung = false;  // aborting releases the stuck "kernels"
  g_stats[kAborts]++;
  g_stats[kCommsLive]--;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || c->aborted) {
    g_stats[kMisuse]++;
    return ncclInvalidUsage;
  }
  *err = c->async_error;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kAllReduces]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, count * TypeSize(type), &all)) return ncclSystemError;
    return ReduceInto(c, all, 0, count, type, op, recv);
  });
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kBroadcasts]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    if (root < 0 || root >= c->nranks) return ncclInvalidArgument;
    const size_t bytes = count * TypeSize(type);
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, c->rank == root ? bytes : 0, &all)) return ncclSystemError;
    if (all[root].size() != bytes) return ncclInvalidArgument;
    std::memcpy(recv, all[root].data(), bytes);
    return ncclSuccess;
  });
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kAllGathers]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    const size_t bytes = count * TypeSize(type);
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, bytes, &all)) return ncclSystemError;
    for (int r = 0; r < c->nranks; ++r) {
      if (all[r].size() != bytes) return ncclInvalidArgument;
      std::memcpy(static_cast<char*>(recv) + r * bytes, all[r].data(), bytes);
    }
    return ncclSuccess;
  });
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kReduceScatters]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    std::vector<std::vector<char>> all;
    if (!Exchange(c, send, count * TypeSize(type) * c->nranks, &all)) return ncclSystemError;
    return ReduceInto(c, all, count * c->rank, count, type, op, recv);
  });
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kSends]++;
  return Run(true, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    uint64_t n = c->sent[peer]++;
    WriteFile(c->dir + "/p2p." + std::to_string(c->rank) + "." + std::to_string(peer) + "." +
                  std::to_string(n),
              send, count * TypeSize(type));
    return ncclSuccess;
  });
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  g_stats[kRecvs]++;
  return Run(false, [=] {
    ncclResult_t rc;
    if (Begin(c, &rc)) return rc;
    uint64_t n = c->received[peer]++;
    std::string path = c->dir + "/p2p." + std::to_string(peer) + "." + std::to_string(c->rank) +
                       "." + std::to_string(n);
    std::vector<char> data;
    if (!WaitRead(path, &data)) return ncclSystemError;
    std::remove(path.c_str());
    if (data.size() != count * TypeSize(type)) return ncclInvalidArgument;
    std::memcpy(recv, data.data(), data.size());
    return ncclSuccess;
  });
}
ncclResult_t ncclGroupStart(void) {
  if (t_group.depth++ == 0) g_stats[kGroups]++;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  if (t_group.depth <= 0) return ncclInvalidUsage;
  if (--t_group.depth > 0) return ncclSuccess;
  auto sends = std::move(t_group.sends);
  auto rest = std::move(t_group.rest);
  t_group = Group();
  ncclResult_t result = ncclSuccess;
  for (auto& f : sends) {
    ncclResult_t rc = f();
    if (rc != ncclSuccess && result == ncclSuccess) result = rc;
  }
  for (auto& f : rest) {
    ncclResult_t rc = f();
    if (rc != ncclSuccess && result == ncclSuccess) result = rc;
  }
  return result;
}
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || residence != ncclScalarHostImmediate) return ncclInvalidArgument;
  double s;
  switch (type) {
    case ncclFloat16: s = HalfToFloat(*static_cast<uint16_t*>(scalar)); break;
    case ncclBfloat16: s = Bf16ToFloat(*static_cast<uint16_t*>(scalar)); break;
    case ncclFloat32: s = *static_cast<float*>(scalar); break;
    case ncclFloat64: s = *static_cast<double*>(scalar); break;
    default: return ncclInvalidArgument;
  }
  *op = static_cast<ncclRedOp_t>(c->next_op++);
  c->premul[*op] = {s, type};
  g_stats[kPreMulSums]++;
  return ncclSuccess;
}
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  auto* c = reinterpret_cast<FakeComm*>(comm);
  if (!c || !c->premul.erase(op)) return ncclInvalidArgument;
  g_stats[kRedOpDestroys]++;
  return ncclSuccess;
}

// Test hook: copies up to n counters (order of the Stat enum) into out.
int fake_gpu_stats(long* out, int n) {
  int k = n < kNumStats ? n : kNumStats;
  for (int i = 0; i < k; ++i) out[i] = g_stats[i].load();
  return kNumStats;
}

}  // extern "C"
