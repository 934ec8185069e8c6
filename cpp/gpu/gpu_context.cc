#include "gpu/gpu_context.h"

#include "gpu/gpu_check.h"
#include "gpu/gpu_library.h"

namespace hvdcompat {

std::string GpuUnavailableReason(bool gpu_operations_mpi) {
  const GpuLibraries& g = Gpu();
  if (!g.cuda_ok()) return g.cuda_error;
  if (!gpu_operations_mpi && !g.nccl_ok()) {
    return g.nccl_error +
           "\nAlternatively set HOROVOD_GPU_OPERATIONS=MPI to run CUDA tensors through host "
           "memory and MPI (slower; needs only the CUDA runtime).";
  }
  int count = 0;
  cudaError_t rc = g.cuda.GetDeviceCount(&count);
  if (rc != cudaSuccess) {
    return "the CUDA runtime " + g.cuda.path + " reports " + CudaErrorText(rc) +
           " (no usable driver or device)";
  }
  if (count <= 0) return "no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES)";
  return "";
}

GpuContext::GpuContext(const Config& config, int local_rank)
    : config_(config), local_rank_(local_rank) {}

GpuContext::~GpuContext() = default;

void GpuContext::CheckAndBindLocked(const std::string& label, int device) {
  // The hot path: the libraries were checked when the device was bound.
  if (device_ >= 0 && device == device_ && events_) return;
  std::string why = GpuUnavailableReason(config_.gpu_operations_mpi);
  if (!why.empty()) {
    throw InvalidArgument(label + ": got a CUDA tensor (cuda:" + std::to_string(device) +
                          "), but hvdcompat cannot run collectives on CUDA tensors on this "
                          "machine: " + why);
  }
  int count = 0;
  HVD_CUDA_CHECK(Cuda().GetDeviceCount(&count));
  if (device < 0 || device >= count) {
    throw InvalidArgument(label + ": the tensor is on cuda:" + std::to_string(device) +
                          ", but this process sees " + std::to_string(count) +
                          " CUDA device(s) (check CUDA_VISIBLE_DEVICES).");
  }
  if (device_ < 0) {
    device_ = device;
    events_ = std::make_shared<EventPool>(device);
    return;
  }
  if (device != device_) {
    throw InvalidArgument(
        label + ": expected a tensor on cuda:" + std::to_string(device_) + ", got cuda:" +
        std::to_string(device) + ". Each rank runs its GPU collectives on one device, the one "
        "of its first GPU operation (cuda:" + std::to_string(device_) + " here). Pin each rank "
        "to its own GPU before creating tensors, with torch.cuda.set_device(hvd.local_rank()), "
        "and keep the tensors you pass to hvdcompat on it.");
  }
}

std::unique_ptr<ReadyEvent> GpuContext::PrepareEnqueue(const std::string& label, int device,
                                                       void* stream) {
  std::shared_ptr<EventPool> pool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CheckAndBindLocked(label, device);
    pool = events_;
  }
  return RecordReadyEvent(pool, static_cast<cudaStream_t>(stream));
}

void GpuContext::BindDevice(const std::string& label, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckAndBindLocked(label, device);
}

int GpuContext::Device() {
  std::lock_guard<std::mutex> lock(mu_);
  if (device_ >= 0) return device_;
  int count = 0;
  HVD_CUDA_CHECK(Cuda().GetDeviceCount(&count));
  if (count <= 0) throw LibraryError("no CUDA device is visible to this process");
  device_ = local_rank_ % count;
  events_ = std::make_shared<EventPool>(device_);
  return device_;
}

std::shared_ptr<EventPool> GpuContext::Events() {
  Device();
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

}  // namespace hvdcompat
