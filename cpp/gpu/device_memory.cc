#include "gpu/device_memory.h"

#include <algorithm>

#include "gpu/gpu_check.h"
#include "gpu/gpu_events.h"
#include "gpu/gpu_library.h"
#include "logging.h"
#include "tensor_entry.h"

namespace hvdcompat {

namespace {

// Rounds growth up so a slowly growing fused payload does not reallocate on
// every cycle.
size_t GrowTo(size_t bytes) {
  const size_t granule = size_t{2} << 20;
  return ((std::max<size_t>(bytes, 1) + granule - 1) / granule) * granule;
}

}  // namespace

DeviceScratch::~DeviceScratch() { Free(); }

void DeviceScratch::Free() {
  if (!data_) return;
  const GpuLibraries& g = Gpu();
  // The owner drained its stream before destroying us; errors at exit are moot.
  if (g.cuda_ok()) g.cuda.Free(data_);
  data_ = nullptr;
  capacity_ = 0;
}

char* DeviceScratch::Reserve(size_t bytes, int device, cudaStream_t stream) {
  if (data_ && bytes <= capacity_ && device == device_) return data_;
  const CudaApi& cuda = Cuda();
  DeviceGuard guard(device);
  if (data_) {
    HVD_CUDA_CHECK(cuda.StreamSynchronize(stream));
    Free();
  }
  size_t size = GrowTo(bytes);
  void* p = nullptr;
  HVD_CUDA_CHECK(cuda.Malloc(&p, size));
  data_ = static_cast<char*>(p);
  capacity_ = size;
  device_ = device;
  return data_;
}

PinnedScratch::~PinnedScratch() {
  const GpuLibraries& g = Gpu();
  if (data_ && g.cuda_ok()) g.cuda.FreeHost(data_);
}

char* PinnedScratch::Reserve(size_t bytes) {
  if (data_ && bytes <= capacity_) return data_;
  const CudaApi& cuda = Cuda();
  if (data_) {
    HVD_CUDA_CHECK(cuda.FreeHost(data_));
    data_ = nullptr;
    capacity_ = 0;
  }
  size_t size = GrowTo(bytes);
  void* p = nullptr;
  HVD_CUDA_CHECK(cuda.HostAlloc(&p, size, HVD_CUDA_HOST_ALLOC_DEFAULT));
  data_ = static_cast<char*>(p);
  capacity_ = size;
  return data_;
}

void DeviceFree::operator()(void* data) const {
  const GpuLibraries& g = Gpu();
  if (!data || !g.cuda_ok()) return;
  const CudaApi& cuda = g.cuda;
  cudaError_t rc;
  if (stream_ordered) {
    // Unbound: the engine's work on it is over (see the struct comment), so
    // the legacy stream's order is as good as any.
    rc = cuda.FreeAsync(data, bound ? static_cast<cudaStream_t>(stream) : nullptr);
  } else {
    rc = cuda.Free(data);
  }
  // Freeing during interpreter teardown may find the runtime unloading.
  if (rc != cudaSuccess && rc != cudaErrorCudartUnloading) {
    HVD_LOG(kWarning) << "freeing a device output of cuda:" << device
                      << " failed: " << CudaErrorText(rc);
  }
}

OwnedBuffer AllocateDeviceOutput(DataType dtype, const Shape& shape, int device,
                                 cudaStream_t stream) {
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
  void* p = nullptr;
  if (cuda.HasStreamOrderedAlloc()) {
    HVD_CUDA_CHECK(cuda.MallocAsync(&p, bytes, stream));
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
