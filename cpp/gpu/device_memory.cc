#include "gpu/device_memory.h"

#include <algorithm>
#include <array>
#include <atomic>

#include "gpu/gpu_check.h"
#include "gpu/gpu_events.h"
#include "gpu/gpu_library.h"
#include "core/logging.h"
#include "core/tensor_entry.h"

namespace hvdcompat {

namespace {

// Rounds growth up, and at least doubles, so a slowly growing fused payload
// does not reallocate on every cycle and retired buffers stay small.
size_t GrowTo(size_t bytes, size_t current) {
  const size_t granule = size_t{2} << 20;
  const size_t want = std::max(std::max<size_t>(bytes, 1), current * 2);
  return ((want + granule - 1) / granule) * granule;
}

// Raises `device`'s default pool release threshold to kPoolKeepBytes (never
// lowers one set higher, e.g. by torch's own cudaMallocAsync backend).
void KeepPoolMemory(const CudaApi& cuda, int device) {
  if (!cuda.DeviceGetDefaultMemPool || !cuda.MemPoolSetAttribute) return;
  cudaMemPool_t pool = nullptr;
  HVD_CUDA_CHECK(cuda.DeviceGetDefaultMemPool(&pool, device));
  unsigned long long current = 0;
  if (cuda.MemPoolGetAttribute &&
      cuda.MemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &current) == cudaSuccess &&
      current >= kPoolKeepBytes) {
    return;
  }
  unsigned long long keep = kPoolKeepBytes;
  HVD_CUDA_CHECK(cuda.MemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

// Frees without throwing (destructors, deleters), logging what failed.
void LogFailure(cudaError_t rc, const char* what, int device) {
  // Freeing during interpreter teardown may find the runtime unloading.
  if (rc != cudaSuccess && rc != cudaErrorCudartUnloading) {
    HVD_LOG(kWarning) << what << " on cuda:" << device << " failed: " << CudaErrorText(rc);
  }
}

}  // namespace

bool UseMemoryPool(int device) {
  // 0: unknown, 1: no, 2: yes. Devices past the table are asked every time.
  static std::array<std::atomic<int>, 64> known{};
  if (device >= 0 && device < 64) {
    int k = known[device].load();
    if (k != 0) return k == 2;
  }
  const CudaApi& cuda = Cuda();
  bool yes = cuda.HasStreamOrderedAlloc() && cuda.DeviceGetAttribute != nullptr;
  if (yes) {
    int supported = 0;
    yes = cuda.DeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) ==
              cudaSuccess && supported != 0;
  }
  if (yes) KeepPoolMemory(cuda, device);
  if (device >= 0 && device < 64) known[device].store(yes ? 2 : 1);
  return yes;
}

DeviceScratch::~DeviceScratch() { Release(); }

void DeviceScratch::Release() {
  const GpuLibraries& g = Gpu();
  if ((!data_ && retired_.empty()) || !g.cuda_ok()) return;
  try {
    DeviceGuard guard(device_);
    // Shutdown: the owner drained the stream, so a device-wide free is fine.
    for (void* p : retired_) LogFailure(g.cuda.Free(p), "freeing a retired fusion buffer", device_);
    if (data_) {
      LogFailure(pooled_ ? g.cuda.FreeAsync(data_, stream_) : g.cuda.Free(data_),
                 "freeing the fusion buffer", device_);
    }
  } catch (const std::exception& e) {
    HVD_LOG(kWarning) << "releasing the fusion buffer failed: " << e.what();
  }
  retired_.clear();
  data_ = nullptr;
  capacity_ = 0;
}

char* DeviceScratch::Reserve(size_t bytes, int device, cudaStream_t stream) {
  if (data_ && bytes <= capacity_ && device == device_ && stream == stream_) return data_;
  HVD_ENFORCE(!data_ || device == device_, "fusion buffer moved from cuda:" << device_
              << " to cuda:" << device);
  const CudaApi& cuda = Cuda();
  DeviceGuard guard(device);
  const bool pooled = UseMemoryPool(device);
  if (data_ && bytes <= capacity_) {
    // Same memory, another stream (never happens: one buffer per lane).
    HVD_ENFORCE(false, "fusion buffer used from a second stream");
  }
  const size_t size = GrowTo(bytes, capacity_);
  void* p = nullptr;
  if (pooled) {
    // Stream order makes the old buffer's pending work finish before its
    // memory is reused; no host or device wait.
    if (data_) HVD_CUDA_CHECK(cuda.FreeAsync(data_, stream_));
    data_ = nullptr;
    HVD_CUDA_CHECK(cuda.MallocAsync(&p, size, stream));
  } else {
    if (data_) retired_.push_back(data_);
    data_ = nullptr;
    HVD_CUDA_CHECK(cuda.Malloc(&p, size));
  }
  data_ = static_cast<char*>(p);
  capacity_ = size;
  device_ = device;
  pooled_ = pooled;
  stream_ = stream;
  return data_;
}

PinnedScratch::~PinnedScratch() {
  const GpuLibraries& g = Gpu();
  if (!g.cuda_ok()) return;
  // The owner's streams drained; cudaFreeHost's device sync is harmless now.
  for (void* p : retired_) LogFailure(g.cuda.FreeHost(p), "freeing page-locked memory", -1);
  if (data_) LogFailure(g.cuda.FreeHost(data_), "freeing page-locked memory", -1);
}

char* PinnedScratch::Reserve(size_t bytes) {
  if (data_ && bytes <= capacity_) return data_;
  const CudaApi& cuda = Cuda();
  const size_t size = GrowTo(bytes, capacity_);
  void* p = nullptr;
  HVD_CUDA_CHECK(cuda.HostAlloc(&p, size, HVD_CUDA_HOST_ALLOC_DEFAULT));
  if (data_) retired_.push_back(data_);
  data_ = static_cast<char*>(p);
  capacity_ = size;
  return data_;
}

void DeviceFree::operator()(void* data) const {
  const GpuLibraries& g = Gpu();
  if (!data || !g.cuda_ok()) return;
  const CudaApi& cuda = g.cuda;
  try {
    // Stream 0 below is the legacy stream of the *current* device.
    DeviceGuard guard(device);
    if (!stream_ordered) {
      LogFailure(cuda.Free(data), "freeing a device output", device);
    } else if (bound) {
      LogFailure(cuda.FreeAsync(data, static_cast<cudaStream_t>(stream)),
                 "freeing a device output", device);
    } else if (engine) {
      std::lock_guard<std::mutex> lock(engine->mu);
      // A destroyed engine stream drained first, so the legacy stream is as good.
      LogFailure(cuda.FreeAsync(data, engine->alive ? engine->stream : nullptr),
                 "freeing a device output", device);
    } else {
      LogFailure(cuda.FreeAsync(data, nullptr), "freeing a device output", device);
    }
  } catch (const std::exception& e) {
    HVD_LOG(kWarning) << "freeing a device output of cuda:" << device << " failed: " << e.what();
  }
}

OwnedBuffer AllocateDeviceOutput(DataType dtype, const Shape& shape, int device,
                                 const std::shared_ptr<StreamLife>& engine) {
  const CudaApi& cuda = Cuda();
  BufferDesc desc;
  desc.dtype = dtype;
  desc.shape = shape;
  desc.device = device;
  // Never a zero-size allocation: DLPack consumers want a valid pointer.
  const size_t bytes = std::max<size_t>(desc.Bytes(), 1);
  DeviceGuard guard(device);
  DeviceFree free_fn;
  free_fn.device = device;
  free_fn.engine = engine;
  void* p = nullptr;
  if (UseMemoryPool(device)) {
    HVD_CUDA_CHECK(cuda.MallocAsync(&p, bytes, engine->stream));
    free_fn.stream_ordered = true;
  } else {
    HVD_CUDA_CHECK(cuda.Malloc(&p, bytes));
  }
  return OwnedBuffer::Adopt(p, std::move(desc), free_fn);
}

void BindFreeStream(OwnedBuffer* buffer, void* stream) {
  if (DeviceFree* f = buffer->deleter_target<DeviceFree>()) {
    f->bound = true;
    f->stream = stream;
  }
}

}  // namespace hvdcompat
