#include "ops/gpu_staging_ops.h"

#include "gpu/gpu_check.h"
#include "core/logging.h"

namespace hvdcompat {

namespace {

// Keeps every staged tensor cache-line aligned for the host kernels.
size_t Aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }

std::string Describe(const Response& r) {
  std::string s = std::string(OpTypeName(r.op)) + " of '" + r.units[0].name + "'";
  if (r.units.size() > 1) s += " and " + std::to_string(r.units.size() - 1) + " more (fused)";
  return s + " (staged through host memory)";
}

}  // namespace

StagedGpuBackend::StagedGpuBackend(std::unique_ptr<CollectiveBackend> host, GpuContext* gpu)
    : host_(std::move(host)),
      name_(std::string(host_->name()) + " (staged through host memory)"),
      gpu_(gpu) {}

StagedGpuBackend::~StagedGpuBackend() {
  if (!stream_) return;
  try {
    DeviceGuard guard(device_);
    // Every Execute ends with this stream drained; this only guards errors.
    Cuda().StreamSynchronize(stream_);
    life_->End();
    Cuda().StreamDestroy(stream_);
  } catch (const std::exception& e) {
    HVD_LOG(kWarning) << "releasing the staging stream failed: " << e.what();
  }
}

void StagedGpuBackend::Setup() {
  device_ = gpu_->Device();
  events_ = gpu_->Events();
  DeviceGuard guard(device_);
  stream_ = CreateEngineStream();
  life_ = std::make_shared<StreamLife>(stream_);
}

void StagedGpuBackend::Execute(const Response& r, std::vector<ExecUnit>& units) {
  if (!stream_) Setup();
  DeviceGuard guard(device_);
  for (auto& u : units) {
    if (u.entry && u.entry->ready) u.entry->ready->MakeStreamWait(stream_);
  }
  size_t bytes = 0;
  std::vector<Staged> staged = PlanStaging(units, &bytes);
  char* host = pinned_.Reserve(bytes);
  CopyInputsToHost(host, staged);

  std::vector<ExecUnit> host_units;
  size_t k = 0;
  for (auto& u : units) host_units.push_back({u.unit, u.entry ? staged[k++].copy.get() : nullptr});
  Response hr = r;
  hr.device = kCpuDevice;
  host_->Execute(hr, host_units);

  CopyResultsToDevice(r.dtype, host, staged);
  auto done = RecordCompletion(events_, stream_, Describe(r), {});
  for (auto& s : staged) s.entry->result.device_done = done;
}

std::vector<StagedGpuBackend::Staged> StagedGpuBackend::PlanStaging(
    std::vector<ExecUnit>& units, size_t* bytes) {
  // Host layout: each input, then each caller-provided output that is not
  // also its input (in-place ops share the slot).
  std::vector<Staged> staged;
  size_t total = 0;
  auto place = [&total](size_t bytes) {
    size_t at = total;
    total += Aligned(bytes);
    return at;
  };
  for (auto& u : units) {
    if (!u.entry) continue;
    Staged s{u.entry, std::make_unique<TensorEntry>(), {}, {}};
    const auto& ins = u.entry->inputs;
    const auto& outs = u.entry->outputs;
    for (const auto& b : ins) s.in_at.push_back(place(b.Bytes()));
    for (size_t t = 0; t < outs.size(); ++t) {
      bool in_place = t < ins.size() && outs[t].data == ins[t].data;
      s.out_at.push_back(in_place ? s.in_at[t] : place(outs[t].Bytes()));
    }
    staged.push_back(std::move(s));
  }
  *bytes = total;
  return staged;
}

void StagedGpuBackend::CopyInputsToHost(char* host, std::vector<Staged>& staged) {
  const CudaApi& cuda = Cuda();
  for (auto& s : staged) {
    TensorEntry* e = s.entry;
    TensorEntry* c = s.copy.get();
    c->request = e->request;
    c->splits = e->splits;
    for (size_t t = 0; t < e->inputs.size(); ++t) {
      BufferDesc h = e->inputs[t];
      h.data = host + s.in_at[t];
      h.device = kCpuDevice;
      if (h.Bytes() > 0) {
        HVD_CUDA_CHECK(cuda.MemcpyAsync(h.data, e->inputs[t].data, h.Bytes(),
                                        cudaMemcpyDeviceToHost, stream_));
      }
      c->inputs.push_back(std::move(h));
    }
    for (size_t t = 0; t < e->outputs.size(); ++t) {
      BufferDesc h = e->outputs[t];
      h.data = host + s.out_at[t];
      h.device = kCpuDevice;
      c->outputs.push_back(std::move(h));
    }
  }
  HVD_CUDA_CHECK(cuda.StreamSynchronize(stream_));
}

void StagedGpuBackend::CopyResultsToDevice(DataType dtype, const char* host,
                                           std::vector<Staged>& staged) {
  const CudaApi& cuda = Cuda();
  for (auto& s : staged) {
    TensorEntry* e = s.entry;
    TensorEntry* c = s.copy.get();
    for (size_t t = 0; t < e->outputs.size(); ++t) {
      const size_t bytes = e->outputs[t].Bytes();
      if (bytes == 0) continue;
      HVD_CUDA_CHECK(cuda.MemcpyAsync(e->outputs[t].data, host + s.out_at[t], bytes,
                                      cudaMemcpyHostToDevice, stream_));
    }
    for (auto& ob : c->result.outputs) {
      OwnedBuffer dev = AllocateDeviceOutput(dtype, ob.desc().shape, device_, life_);
      if (ob.desc().Bytes() > 0) {
        HVD_CUDA_CHECK(cuda.MemcpyAsync(dev.data(), ob.data(), ob.desc().Bytes(),
                                        cudaMemcpyHostToDevice, stream_));
      }
      e->result.outputs.push_back(std::move(dev));
    }
    e->result.received_splits = std::move(c->result.received_splits);
  }
  // The host copies (page-locked and core-allocated) are reused or freed next.
  HVD_CUDA_CHECK(cuda.StreamSynchronize(stream_));
}

}  // namespace hvdcompat
