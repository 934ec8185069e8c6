// This rank's GPU as the runtime sees it: which device its collectives run
// on, that device's event pool, and the checks made when an op on CUDA
// buffers is enqueued. Owned by the Runtime; loads nothing until the first
// CUDA op (or a query from Python) asks for the libraries.
// Thread-safety: every method is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/device_sync.h"
#include "core/env.h"
#include "gpu/gpu_events.h"

namespace hvdcompat {

class GpuContext {
 public:
  GpuContext(const Config& config, int local_rank);
  ~GpuContext();
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  const Config& config() const { return config_; }

  // API thread, for an op (`label`, e.g. "allreduce 'fc1.weight'") on CUDA
  // buffers of `device`: checks that the libraries this configuration needs
  // are loaded and that `device` is this rank's GPU (the first CUDA op binds
  // it), then records the producer's event on `stream` (a cudaStream_t;
  // null is the legacy default stream). Throws InvalidArgument for the
  // caller's mistakes, LibraryError for CUDA failures.
  std::unique_ptr<ReadyEvent> PrepareEnqueue(const std::string& label, int device, void* stream);

  // Binds `device` as in PrepareEnqueue without an op (hvd.join(device=...)).
  void BindDevice(const std::string& label, int device);

  // The device engine work runs on: the bound one; before any CUDA op
  // (a rank that joined first), local_rank modulo the device count.
  int Device();
  // Events of Device().
  std::shared_ptr<EventPool> Events();

 private:
  // Caller holds mu_. Throws InvalidArgument.
  void CheckAndBindLocked(const std::string& label, int device);

  const Config config_;
  const int local_rank_;
  std::mutex mu_;
  int device_ = -1;  // bound device, -1 until the first CUDA op
  std::shared_ptr<EventPool> events_;
};

// Why CUDA buffers cannot run here (empty when they can): the CUDA runtime
// is missing, or NCCL is (unless `gpu_operations_mpi`), or no device is
// visible.
std::string GpuUnavailableReason(bool gpu_operations_mpi);

}  // namespace hvdcompat
