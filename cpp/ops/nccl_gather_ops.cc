// The NCCL backend's collectives whose layout differs between ranks:
// allgather (uneven first dimensions), alltoall (splits) and reducescatter
// (uneven row counts). Counts travel over the set's channel (MPI or Gloo),
// as in the host backends.
#include <algorithm>
#include <climits>

#include "core/checked_math.h"
#include "gpu/gpu_check.h"
#include "ops/collective_layout.h"
#include "gpu/nccl_reduce.h"
#include "ops/nccl_ops.h"

namespace hvdcompat {

namespace {

// ncclGroupStart/End around a sequence of calls; a failure inside still
// closes the group, so later calls on this thread are not swallowed by it.
class NcclGroup {
 public:
  explicit NcclGroup(ncclComm_t comm) : comm_(comm) {
    HVD_NCCL_CHECK(comm_, Nccl().GroupStart());
  }
  ~NcclGroup() {
    if (open_) Nccl().GroupEnd();
  }
  void End() {
    open_ = false;
    HVD_NCCL_CHECK(comm_, Nccl().GroupEnd());
  }

 private:
  ncclComm_t comm_;
  bool open_ = true;
};

// Uneven allgather: padding every block to the largest is used while it
// moves at most this many times the payload (see NcclBackend::Allgather).
constexpr size_t kMaxPaddingFactor = 2;

// cudaMemcpy2DAsync rejects pitches past a device limit; stay well below it.
constexpr size_t kMaxPitch = size_t{1} << 30;

}  // namespace

void NcclBackend::Allgather(const Response& r, std::vector<ExecUnit>& units, Lane& lane) {
  const size_t esize = DataTypeSize(r.dtype);
  struct T {
    TensorEntry* entry;
    const BufferDesc* in;
  };
  std::vector<T> tensors;
  std::vector<int64_t> row_bytes;
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "allgather on a joined rank");
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const BufferDesc& in = u.entry->inputs[t];
      tensors.push_back({u.entry, &in});
      row_bytes.push_back(in.RowElements() * static_cast<int64_t>(esize));
    }
  }
  const size_t n = tensors.size();
  std::vector<int64_t> mine(n), dims(n * size_);
  for (size_t i = 0; i < n; ++i) mine[i] = tensors[i].in->shape[0];
  channel_->AllgatherFixed(mine.data(), n * sizeof(int64_t), dims.data());
  const GatherLayout g = PlanAllgather(dims, row_bytes, size_);
  std::vector<char*> outs(n);
  for (size_t i = 0; i < n; ++i) {
    Shape shape = tensors[i].in->shape;
    shape[0] = g.out_rows[i];
    auto& results = tensors[i].entry->result.outputs;
    results.push_back(AllocateDeviceOutput(r.dtype, shape, device_, lane.life));
    outs[i] = static_cast<char*>(results.back().data());
  }
  if (g.total == 0) return;

  if (n == 1) {
    const char* in = static_cast<const char*>(tensors[0].in->data);
    if (g.even) {
      GatherBlocks(g, outs[0], in, lane);
    } else {
      CopyDevice(outs[0] + g.rank_displs[rank_], in, g.rank_counts[rank_], lane);
      GatherBlocks(g, outs[0], nullptr, lane);
    }
    return;
  }
  // Fused: blocks are rank-major (each rank's tensors back to back).
  char* buf = lane.fusion.Reserve(g.total, device_, lane.stream);
  size_t at = g.rank_displs[rank_];
  for (size_t i = 0; i < n; ++i) {
    CopyDevice(buf + at, tensors[i].in->data, g.Count(rank_, i), lane);
    at += g.Count(rank_, i);
  }
  GatherBlocks(g, buf, nullptr, lane);
  UnpackGathered(g, buf, outs, lane);
}

void NcclBackend::GatherBlocks(const GatherLayout& g, char* base, const char* send, Lane& lane) {
  const NcclApi& nccl = Nccl();
  NcclComm::Launch launch(*lane.comm);
  const size_t mine = g.rank_counts[rank_];
  char* my_block = base + g.rank_displs[rank_];
  if (g.even) {
    HVD_NCCL_CHECK(launch.get(), nccl.AllGather(send ? send : my_block, base, mine, ncclUint8,
                                                launch.get(), lane.stream));
    return;
  }
  const size_t largest = g.largest;
  const size_t ranks = static_cast<size_t>(size_);
  if (largest * ranks <= kMaxPaddingFactor * static_cast<size_t>(g.total)) {
    // Mildly uneven (the usual last batch): one allgather of blocks padded
    // to the largest, in place in the padding buffer, then each block moved
    // to its offset by a device copy.
    char* pad = lane.padded.Reserve(largest * ranks, device_, lane.stream);
    char* my_pad = pad + largest * static_cast<size_t>(rank_);
    CopyDevice(my_pad, my_block, mine, lane);
    HVD_NCCL_CHECK(launch.get(), nccl.AllGather(my_pad, pad, largest, ncclUint8, launch.get(),
                                                lane.stream));
    for (int rk = 0; rk < size_; ++rk) {
      if (rk != rank_) {
        CopyDevice(base + g.rank_displs[rk], pad + largest * static_cast<size_t>(rk),
                   g.rank_counts[rk], lane);
      }
    }
    return;
  }
  // Very uneven: padding would move too much; every rank sends its block
  // to every other rank directly, one group (one kernel) of send/receive pairs.
  NcclGroup group(launch.get());
  for (int rk = 0; rk < size_; ++rk) {
    if (rk == rank_) continue;
    if (mine > 0) {
      HVD_NCCL_CHECK(launch.get(),
                     nccl.Send(my_block, mine, ncclUint8, rk, launch.get(), lane.stream));
    }
    if (g.rank_counts[rk] > 0) {
      HVD_NCCL_CHECK(launch.get(), nccl.Recv(base + g.rank_displs[rk], g.rank_counts[rk],
                                             ncclUint8, rk, launch.get(), lane.stream));
    }
  }
  group.End();
}

void NcclBackend::UnpackGathered(const GatherLayout& g, const char* buf,
                                 const std::vector<char*>& outs, Lane& lane) {
  const size_t block = g.rank_counts[0];
  if (g.uniform && block < kMaxPitch) {
    // Same layout in every block: one strided copy per tensor.
    size_t offset = 0;
    for (size_t i = 0; i < g.tensors; ++i) {
      const size_t width = g.Count(0, i);
      if (width > 0) {
        HVD_CUDA_CHECK(Cuda().Memcpy2DAsync(outs[i], width, buf + offset, block, width,
                                            static_cast<size_t>(size_), cudaMemcpyDeviceToDevice,
                                            lane.stream));
      }
      offset += width;
    }
    return;
  }
  std::vector<size_t> out_at(g.tensors, 0);
  for (int rk = 0; rk < size_; ++rk) {
    size_t at = g.rank_displs[rk];
    for (size_t i = 0; i < g.tensors; ++i) {
      CopyDevice(outs[i] + out_at[i], buf + at, g.Count(rk, i), lane);
      out_at[i] += g.Count(rk, i);
      at += g.Count(rk, i);
    }
  }
}

void NcclBackend::Alltoall(const Response& r, std::vector<ExecUnit>& units, Lane& lane) {
  const NcclApi& nccl = Nccl();
  const size_t esize = DataTypeSize(r.dtype);
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "alltoall on a joined rank");
    TensorEntry* e = u.entry;
    const BufferDesc& in = e->inputs[0];
    const int64_t row_bytes =
        CheckedMul(in.RowElements(), static_cast<int64_t>(esize), "alltoall: bytes of a row");
    const std::vector<int64_t>& send_rows = e->splits[0];
    const std::vector<int64_t> recv_rows = channel_->AlltoallCounts(send_rows);
    Shape shape = in.shape;
    shape[0] = CheckedSum(recv_rows, "alltoall: rows received");
    // In bytes: the blocks travel as ncclUint8.
    const AlltoallCounts c = PlanAlltoall(send_rows, recv_rows, row_bytes);
    e->result.outputs.push_back(AllocateDeviceOutput(r.dtype, shape, device_, lane.life));
    char* out = static_cast<char*>(e->result.outputs.back().data());
    const char* src = static_cast<const char*>(in.data);
    CopyDevice(out + c.recv_displs[rank_], src + c.send_displs[rank_],
               static_cast<size_t>(c.send_counts[rank_]), lane);
    {
      NcclComm::Launch launch(*lane.comm);
      NcclGroup group(launch.get());
      for (int rk = 0; rk < size_; ++rk) {
        if (rk == rank_) continue;
        const size_t sb = static_cast<size_t>(c.send_counts[rk]);
        const size_t rb = static_cast<size_t>(c.recv_counts[rk]);
        if (sb > 0) {
          HVD_NCCL_CHECK(launch.get(), nccl.Send(src + c.send_displs[rk], sb, ncclUint8, rk,
                                                 launch.get(), lane.stream));
        }
        if (rb > 0) {
          HVD_NCCL_CHECK(launch.get(), nccl.Recv(out + c.recv_displs[rk], rb, ncclUint8, rk,
                                                 launch.get(), lane.stream));
        }
      }
      group.End();
    }
    e->result.received_splits.push_back(recv_rows);
  }
}

void NcclBackend::Reducescatter(const Response& r, std::vector<ExecUnit>& units, Lane& lane) {
  const NcclApi& nccl = Nccl();
  const size_t esize = DataTypeSize(r.dtype);
  ncclDataType_t type;
  HVD_ENFORCE(NcclReduceType(r.dtype, version_, &type), "no NCCL type");
  const NcclReducePlan plan = Plan(r, false);
  struct T {
    const char* in;
    char* out;
  };
  std::vector<T> tensors;
  std::vector<int64_t> rows, row_elems;
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "reducescatter on a joined rank");
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const BufferDesc& in = u.entry->inputs[t];
      tensors.push_back({static_cast<const char*>(in.data),
                         static_cast<char*>(u.entry->outputs[t].data)});
      rows.push_back(in.shape.empty() ? 1 : in.shape[0]);
      row_elems.push_back(in.RowElements());
    }
  }
  // Elements each rank receives: the first rows % size ranks get one more row.
  const ScatterLayout s = PlanReducescatter(rows, row_elems, size_);
  const int64_t block = s.largest;
  if (block == 0) return;
  if (tensors.size() == 1 && s.even) {
    NcclComm::Launch launch(*lane.comm);
    ScopedRedOp op(plan, r.dtype, launch.get());
    HVD_NCCL_CHECK(launch.get(), nccl.ReduceScatter(tensors[0].in, tensors[0].out,
                                                    static_cast<size_t>(block), type, op.get(),
                                                    launch.get(), lane.stream));
    return;
  }
  // Rank-major blocks padded to the largest; the padding is reduced and ignored.
  char* buf = lane.fusion.Reserve(static_cast<size_t>(block * size_) * esize, device_,
                                  lane.stream);
  for (int rk = 0; rk < size_; ++rk) {
    int64_t at = rk * block;
    for (size_t i = 0; i < tensors.size(); ++i) {
      CopyDevice(buf + at * esize, tensors[i].in + s.Offset(rk, i) * esize,
                 static_cast<size_t>(s.Count(rk, i)) * esize, lane);
      at += s.Count(rk, i);
    }
  }
  char* mine = buf + static_cast<size_t>(rank_ * block) * esize;
  {
    NcclComm::Launch launch(*lane.comm);
    ScopedRedOp op(plan, r.dtype, launch.get());
    HVD_NCCL_CHECK(launch.get(), nccl.ReduceScatter(buf, mine, static_cast<size_t>(block), type,
                                                    op.get(), launch.get(), lane.stream));
  }
  int64_t at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    CopyDevice(tensors[i].out, mine + at * esize, static_cast<size_t>(s.Count(rank_, i)) * esize,
               lane);
    at += s.Count(rank_, i);
  }
}

}  // namespace hvdcompat
