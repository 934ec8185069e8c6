// CUDA buffers through host memory: inputs are copied to page-locked host
// memory on the engine's stream (after the producer's event), the host
// backend (MPI, or Gloo on the Gloo controller) runs on the copies, and
// results are copied back. Used for HOROVOD_GPU_OPERATIONS=MPI (or GLOO),
// where several ranks may share one GPU because no NCCL communicator is
// created, and by the NCCL backend for what NCCL cannot reduce. The worker
// waits for this stream (never the whole device): host memory must be
// complete before the host backend reads it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpu/device_memory.h"
#include "gpu/gpu_context.h"
#include "ops/backend.h"

namespace hvdcompat {

class StagedGpuBackend : public CollectiveBackend {
 public:
  // `host` runs the collective on host copies (owned here).
  StagedGpuBackend(std::unique_ptr<CollectiveBackend> host, GpuContext* gpu);
  void SetAbortFlag(const std::atomic<bool>* abort) override { host_->SetAbortFlag(abort); }
  ~StagedGpuBackend() override;

  // "MPI (staged through host memory)", or Gloo's.
  const char* name() const override { return name_.c_str(); }
  bool CanExecute(const Response& r) const override { return r.device != kCpuDevice; }
  void Execute(const Response& r, std::vector<ExecUnit>& units) override;

 private:
  // One entry's host copy and where its buffers sit in the pinned staging area.
  struct Staged {
    TensorEntry* entry;
    std::unique_ptr<TensorEntry> copy;  // the entry as the host backend sees it
    std::vector<size_t> in_at, out_at;  // offsets of each input / output
  };

  void Setup();
  // The steps of Execute, in order: lays out every entry's buffers in host
  // memory (`bytes` in all), copies the inputs there and waits for
  // them, then copies the host backend's results back to the device.
  std::vector<Staged> PlanStaging(std::vector<ExecUnit>& units, size_t* bytes);
  void CopyInputsToHost(char* host, std::vector<Staged>& staged);
  void CopyResultsToDevice(DataType dtype, const char* host, std::vector<Staged>& staged);

  std::unique_ptr<CollectiveBackend> host_;
  const std::string name_;
  GpuContext* gpu_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<StreamLife> life_;  // stream_ as the frees of outputs see it
  std::shared_ptr<EventPool> events_;
  PinnedScratch pinned_;
};

}  // namespace hvdcompat
