// NcclBackend's Adasum allreduce: Note [GPU Adasum] (ops/nccl_ops.h).
#include <cstring>

#include "ops/cpu_kernels.h"
#include "gpu/gpu_check.h"
#include "gpu/gpu_library.h"
#include "ops/nccl_ops.h"

namespace hvdcompat {

void NcclBackend::SetupAdasum(const Response& r, Lane& lane) {
  if (!adasum_) {
    // Collective over the set: every rank reaches its first Adasum response together.
    LayOutNodes();
    adasum_peers_ = make_adasum_peers_(groups_);
    adasum_ = std::make_unique<Adasum>(adasum_peers_.get());
  }
  if (!nodes_even_) {
    throw InvalidArgument(
        "allreduce '" + r.units[0].name + "' (op=hvd.Adasum, CUDA tensors): Adasum on GPUs "
        "needs the same number of ranks on every node, but this job's nodes run different "
        "numbers (this rank's node: " + std::to_string(local_size_) + "). Launch the same "
        "number of ranks per node, or set HOROVOD_GPU_OPERATIONS=MPI to run Adasum over every "
        "rank through host memory.");
  }
  if (local_size_ > 1 && !lane.local) {
    // Collective over the set (its ranks use the lanes in the same order).
    auto local = NodeComm(true, "node-local NCCL communicator (Adasum)");
    std::lock_guard<std::mutex> lock(lanes_mu_);
    lane.local = local;
    lane.sources.push_back(lane.local);
    if (abandoned_) local->Release("the job is being rebuilt (elastic reset)");
  }
}

void NcclBackend::AdasumAllreduce(const Response& r, std::vector<ExecUnit>& units, Lane& lane) {
  const NcclApi& nccl = Nccl();
  const CudaApi& cuda = Cuda();
  SetupAdasum(r, lane);
  ncclDataType_t type;
  HVD_ENFORCE(NcclReduceType(r.dtype, version_, &type), "no NCCL type");
  const size_t esize = DataTypeSize(r.dtype);
  const AdasumLayout layout = AdasumLayoutOf(units);
  const std::vector<AdasumPiece>& pieces = layout.pieces;
  const int64_t total = layout.total;
  if (total == 0) return;
  // Every node rank gets an equal shard; the padding belongs to no tensor.
  const int64_t padded = (total + local_size_ - 1) / local_size_ * local_size_;
  const int64_t chunk = padded / local_size_;
  char* buf = lane.fusion.Reserve(static_cast<size_t>(padded) * esize, device_, lane.stream);
  int64_t at = 0;
  for (const auto& p : pieces) {
    const size_t bytes = static_cast<size_t>(p.count) * esize;
    if (p.in) {
      CopyDevice(buf + at * esize, p.in, bytes, lane);
    } else if (bytes) {
      HVD_CUDA_CHECK(cuda.MemsetAsync(buf + at * esize, 0, bytes, lane.stream));
    }
    at += p.count;
  }
  if (padded > total) {
    HVD_CUDA_CHECK(cuda.MemsetAsync(buf + total * esize, 0,
                                    static_cast<size_t>(padded - total) * esize, lane.stream));
  }
  char* mine = buf + static_cast<size_t>(local_rank_ * chunk) * esize;
  if (local_size_ > 1) {
    NcclComm::Launch launch(*lane.local);
    HVD_NCCL_CHECK(launch.get(), nccl.ReduceScatter(buf, mine, static_cast<size_t>(chunk), type,
                                                    ncclSum, launch.get(), lane.stream));
  }
  AdasumAcrossNodes(r, mine, chunk, layout.counts, lane);
  if (local_size_ > 1) {
    NcclComm::Launch launch(*lane.local);
    HVD_NCCL_CHECK(launch.get(), nccl.AllGather(mine, buf, static_cast<size_t>(chunk), type,
                                                launch.get(), lane.stream));
  }
  at = 0;
  for (const auto& p : pieces) {
    if (p.out) CopyDevice(p.out, buf + at * esize, static_cast<size_t>(p.count) * esize, lane);
    at += p.count;
  }
}

void NcclBackend::AdasumAcrossNodes(const Response& r, char* mine, int64_t chunk,
                                    const std::vector<int64_t>& counts, Lane& lane) {
  const CudaApi& cuda = Cuda();
  const size_t esize = DataTypeSize(r.dtype);
  const size_t shard_bytes = static_cast<size_t>(chunk) * esize;
  char* host = adasum_pinned_.Reserve(std::max<size_t>(shard_bytes, 1));
  HVD_CUDA_CHECK(cuda.MemcpyAsync(host, mine, shard_bytes, cudaMemcpyDeviceToHost, lane.stream));
  HVD_CUDA_CHECK(cuda.StreamSynchronize(lane.stream));
  const DataType wire = HostReduceType(r.dtype);
  const double factor = r.prescale * r.postscale / local_size_;
  char* work = host;
  if (wire != r.dtype) {
    work = adasum_wide_.Reserve(std::max<size_t>(static_cast<size_t>(chunk) * DataTypeSize(wire), 1));
    ConvertScale(work, wire, host, r.dtype, chunk, factor);
  } else {
    ScaleCopy(host, host, chunk, r.dtype, factor);
  }
  adasum_->ReduceShardInPlace(work, wire, counts, local_rank_ * chunk, chunk);
  if (wire != r.dtype) ConvertScale(host, r.dtype, work, wire, chunk, 1.0);
  HVD_CUDA_CHECK(cuda.MemcpyAsync(mine, host, shard_bytes, cudaMemcpyHostToDevice, lane.stream));
  // The page-locked buffer is reused by the next Adasum, perhaps on another lane.
  HVD_CUDA_CHECK(cuda.StreamSynchronize(lane.stream));
}

}  // namespace hvdcompat
