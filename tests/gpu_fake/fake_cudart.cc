// A host-only stand-in for libcudart and libnccl (this file: the CUDA runtime
// and the shared counters; fake_nccl.cc: NCCL), for testing the GPU data
// plane on machines without GPUs. One shared library exports both APIs (the
// slice in third_party/), so HVDCOMPAT_CUDART_LIB and HVDCOMPAT_NCCL_LIB can
// both point at it.
//
// "Device" memory is host memory, but streams behave as on a GPU: every
// stream has a queue run in order by a worker thread of its own, so work on
// different streams runs concurrently and in no fixed order. An event
// completes when its stream has run everything queued before the record; a
// stream wait blocks that stream's queue until the event completes;
// cudaStreamSynchronize waits for one queue, cudaFree/cudaFreeHost for every
// queue (as the real ones synchronise the device). FAKE_CUDA_OP_DELAY_US
// (default 0) delays every queued operation, so that work missing an order
// is still pending when the bug lets something overtake it.
//
// Checks that count in the stats instead of crashing: an event recorded on a
// stream of another device (cudaErrorInvalidResourceHandle, as CUDA), a
// cudaFreeAsync on a stream that is not ordered after the buffer's last use
// (same stream, a stream wait on an event recorded after it, or the host
// having seen it complete), an operation issued on freed memory.
//
// NCCL collectives between processes go through files in
// $FAKE_NCCL_DIR/<unique id>/ and run on the stream they were issued to (see
// fake_nccl.cc for its knobs). FAKE_CUDA_DEVICE_COUNT (4) devices.
// fake_gpu_stats() exposes the counters (the fake::Stat order).

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "fake_common.h"

namespace fake {

std::atomic<long> g_stats[kNumStats];

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


struct Stream {
  int device = -1;  // -1: a handle the fake did not create
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  uint64_t submitted = 0;  // operations queued so far
  uint64_t completed = 0;  // operations run so far (in order)
  uint64_t host_seen = 0;  // the host observed completion up to here
  bool destroyed = false;
  std::map<Stream*, uint64_t> after;  // this stream waited for `other` up to seq

  void Run() {
    const int delay = EnvInt("FAKE_CUDA_OP_DELAY_US", 0);
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [this] { return !queue.empty() || destroyed; });
      if (queue.empty()) return;  // destroyed and drained; the object is leaked
      std::function<void()> op = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
      op();
      lock.lock();
      ++completed;
      cv.notify_all();
    }
  }

  // Blocks until everything queued up to `seq` ran.
  void WaitFor(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= seq; });
    host_seen = std::max(host_seen, seq);
  }
  uint64_t Submitted() {
    std::lock_guard<std::mutex> lock(mu);
    return submitted;
  }
};

namespace {

// Every object here is leaked on purpose: worker threads and DLPack deleters
// may still run while the process exits.
std::mutex g_mu;  // guards the maps below
std::map<cudaStream_t, Stream*>& Streams() {
  static auto* m = new std::map<cudaStream_t, Stream*>();
  return *m;
}
std::map<int, Stream*>& Legacy() {
  static auto* m = new std::map<int, Stream*>();
  return *m;
}

struct Alloc {
  size_t size = 0;
  bool stream_ordered = false;
  bool freed = false;
  Stream* last = nullptr;  // stream of the last operation on it
  uint64_t last_seq = 0;
};
std::map<const char*, Alloc>& Allocs() {
  static auto* m = new std::map<const char*, Alloc>();
  return *m;
}

thread_local int t_device = 0;

Stream* NewStream(int device) {
  auto* s = new Stream();
  s->device = device;
  std::thread([s] { s->Run(); }).detach();
  return s;
}

// The allocation holding `p`; caller holds g_mu.
Alloc* Find(const void* p) {
  auto& m = Allocs();
  auto it = m.upper_bound(static_cast<const char*>(p));
  if (it == m.begin()) return nullptr;
  --it;
  const char* base = it->first;
  if (static_cast<const char*>(p) >= base + std::max<size_t>(it->second.size, 1)) return nullptr;
  return &it->second;
}

// Whether `s` runs after the last operation on `a` (caller holds g_mu).
bool OrderedAfterLastUse(Stream* s, const Alloc& a) {
  if (!a.last || a.last == s) return true;
  {
    std::lock_guard<std::mutex> lock(a.last->mu);
    if (a.last->host_seen >= a.last_seq) return true;
  }
  std::lock_guard<std::mutex> lock(s->mu);
  auto it = s->after.find(a.last);
  return it != s->after.end() && it->second >= a.last_seq;
}

void DrainAll() {
  std::vector<Stream*> all;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto& kv : Streams()) all.push_back(kv.second);
    for (auto& kv : Legacy()) all.push_back(kv.second);
  }
  for (Stream* s : all) s->WaitFor(s->Submitted());
  g_stats[kDeviceSyncs]++;
}

struct FakeEvent {
  int device = 0;
  Stream* stream = nullptr;  // null: never recorded (complete)
  uint64_t seq = 0;
};

bool EventDone(const FakeEvent* e) {
  if (!e->stream) return true;
  std::lock_guard<std::mutex> lock(e->stream->mu);
  if (e->stream->completed < e->seq) return false;
  e->stream->host_seen = std::max(e->stream->host_seen, e->seq);
  return true;
}

}  // namespace

int CurrentDevice() { return t_device; }

Stream* ResolveStream(cudaStream_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!handle) {
    Stream*& legacy = Legacy()[t_device];
    if (!legacy) legacy = NewStream(t_device);
    return legacy;
  }
  Stream*& s = Streams()[handle];
  if (!s) s = NewStream(-1);
  return s;
}

void Enqueue(Stream* s, std::function<void()> op, const std::vector<const void*>& touched) {
  std::unique_lock<std::mutex> lock(s->mu);
  const uint64_t seq = ++s->submitted;
  s->queue.push_back(std::move(op));
  s->cv.notify_all();
  lock.unlock();
  std::lock_guard<std::mutex> g(g_mu);
  for (const void* p : touched) {
    Alloc* a = p ? Find(p) : nullptr;
    if (!a) continue;
    if (a->freed) g_stats[kUseAfterFree]++;
    a->last = s;
    a->last_seq = seq;
  }
}

}  // namespace fake

using namespace fake;

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
// FAKE_CUDA_NO_MEMPOOLS=1: a device without the stream-ordered allocator.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= EnvInt("FAKE_CUDA_DEVICE_COUNT", 4)) {
    return static_cast<cudaError_t>(101);
  }
  if (attr != cudaDevAttrMemoryPoolsSupported) return static_cast<cudaError_t>(1);
  *value = EnvInt("FAKE_CUDA_NO_MEMPOOLS", 0) ? 0 : 1;
  return cudaSuccess;
}
unsigned long long g_thresholds[64];  // release threshold of each device's default pool
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  unsigned long long* thresholds = g_thresholds;
  if (device < 0 || device >= 64 || EnvInt("FAKE_CUDA_NO_MEMPOOLS", 0)) {
    return static_cast<cudaError_t>(801);  // cudaErrorNotSupported
  }
  *pool = reinterpret_cast<cudaMemPool_t>(&thresholds[device]);
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  if (attr != cudaMemPoolAttrReleaseThreshold) return static_cast<cudaError_t>(1);
  *reinterpret_cast<unsigned long long*>(pool) = *static_cast<unsigned long long*>(value);
  return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  if (attr != cudaMemPoolAttrReleaseThreshold) return static_cast<cudaError_t>(1);
  *static_cast<unsigned long long*>(value) = *reinterpret_cast<unsigned long long*>(pool);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  Stream* st = NewStream(t_device);
  *s = reinterpret_cast<cudaStream_t>(st);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Streams()[*s] = st;
  }
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
  Stream* st;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = Streams().find(s);
    if (!s || it == Streams().end() || it->second->device < 0) {
      g_stats[kMisuse]++;
      return static_cast<cudaError_t>(400);
    }
    st = it->second;
    Streams().erase(it);
  }
  // As CUDA: returns at once; queued work still runs, then the worker ends.
  std::lock_guard<std::mutex> lock(st->mu);
  st->destroyed = true;
  st->cv.notify_all();
  g_stats[kStreamsLive]--;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Stream* st = ResolveStream(s);
  st->WaitFor(st->Submitted());
  g_stats[kStreamSyncs]++;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (!e) return static_cast<cudaError_t>(400);
  g_stats[kStreamWaits]++;
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  Stream* st = ResolveStream(s);
  Stream* on = ev->stream;
  const uint64_t seq = ev->seq;
  if (!on || on == st) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    uint64_t& known = st->after[on];
    known = std::max(known, seq);
  }
  Enqueue(st, [on, seq] {
    std::unique_lock<std::mutex> lock(on->mu);
    on->cv.wait(lock, [&] { return on->completed >= seq; });
  }, {});
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  auto* ev = new FakeEvent();
  ev->device = t_device;
  *e = reinterpret_cast<cudaEvent_t>(ev);
  g_stats[kEventsLive]++;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<FakeEvent*>(e);
  g_stats[kEventsLive]--;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  Stream* st = ResolveStream(s);
  if (st->device >= 0 && st->device != ev->device) {
    g_stats[kWrongDevice]++;
    return static_cast<cudaError_t>(400);  // cudaErrorInvalidResourceHandle
  }
  ev->stream = st;
  ev->seq = st->Submitted();
  g_stats[kEventRecords]++;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return EventDone(reinterpret_cast<FakeEvent*>(e)) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  if (ev->stream) ev->stream->WaitFor(ev->seq);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::malloc(n ? n : 1);
  g_stats[kMallocs]++;
  g_stats[kLiveDevice]++;
  std::lock_guard<std::mutex> lock(g_mu);
  Allocs()[static_cast<const char*>(*p)].size = n;
  return cudaSuccess;
}
// Releases `p` (caller holds g_mu). Freed blocks stay mapped (never reused),
// so a late write is counted instead of corrupting another allocation.
static cudaError_t FreeLocked(void* p, bool stream_ordered) {
  auto it = Allocs().find(static_cast<const char*>(p));
  if (it == Allocs().end() || it->second.freed || it->second.stream_ordered != stream_ordered) {
    g_stats[kMisuse]++;
    return static_cast<cudaError_t>(1);
  }
  it->second.freed = true;
  g_stats[kFrees]++;
  g_stats[kLiveDevice]--;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  DrainAll();  // as CUDA: cudaFree synchronises the device
  std::lock_guard<std::mutex> lock(g_mu);
  return FreeLocked(p, false);
}
cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t s) {
  if (EnvInt("FAKE_CUDA_NO_MEMPOOLS", 0)) return static_cast<cudaError_t>(801);
  Stream* st = ResolveStream(s);
  g_stats[kAsyncMallocs]++;
  *p = std::malloc(n ? n : 1);
  g_stats[kMallocs]++;
  g_stats[kLiveDevice]++;
  std::lock_guard<std::mutex> lock(g_mu);
  Alloc& a = Allocs()[static_cast<const char*>(*p)];
  a.size = n;
  a.stream_ordered = true;
  a.last = st;
  a.last_seq = st->Submitted();
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (EnvInt("FAKE_CUDA_NO_MEMPOOLS", 0)) return static_cast<cudaError_t>(801);
  Stream* st = ResolveStream(s);
  g_stats[kAsyncFrees]++;
  std::lock_guard<std::mutex> lock(g_mu);
  Alloc* a = Find(p);
  if (a && !a->freed && !OrderedAfterLastUse(st, *a)) g_stats[kUnorderedFrees]++;
  return FreeLocked(p, true);
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int) {
  *p = std::malloc(n ? n : 1);
  g_stats[kHostAllocs]++;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  DrainAll();  // as CUDA: cudaFreeHost synchronises the device
  std::free(p);
  g_stats[kHostFrees]++;
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t st) {
  g_stats[kMemcpys]++;
  Enqueue(ResolveStream(st), [d, s, n] { std::memmove(d, s, n); }, {d, s});
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t h,
                              cudaMemcpyKind, cudaStream_t st) {
  if (w > dp || w > sp) return static_cast<cudaError_t>(1);
  g_stats[kMemcpy2Ds]++;
  Enqueue(ResolveStream(st), [=] {
    for (size_t r = 0; r < h; ++r) {
      std::memcpy(static_cast<char*>(d) + r * dp, static_cast<const char*>(s) + r * sp, w);
    }
  }, {d, s});
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t st) {
  g_stats[kMemsets]++;
  Enqueue(ResolveStream(st), [p, v, n] { std::memset(p, v, n); }, {p});
  return cudaSuccess;
}

// Test hook: the release threshold the core set on `device`'s default pool.
unsigned long long fake_mempool_threshold(int device) {
  return device >= 0 && device < 64 ? g_thresholds[device] : 0;
}

// Test hook: copies up to n counters (order of the Stat enum) into out.
int fake_gpu_stats(long* out, int n) {
  int k = n < kNumStats ? n : kNumStats;
  for (int i = 0; i < k; ++i) out[i] = g_stats[i].load();
  return kNumStats;
}

}  // extern "C"
