// The NCCL backend's collectives whose layout differs between ranks:
// allgather (uneven first dimensions), alltoall (splits) and reducescatter
// (uneven row counts). Counts travel over the set's MPI communicator, as in
// the host backend.
#include <algorithm>
#include <climits>

#include "gpu/gpu_check.h"
#include "transport/mpi_util.h"
#include "ops/mpi_ops.h"
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
  const NcclApi& nccl = Nccl();
  const CudaApi& cuda = Cuda();
  const size_t esize = DataTypeSize(r.dtype);
  struct T {
    TensorEntry* entry;
    const BufferDesc* in;
    size_t row_bytes;
  };
  std::vector<T> tensors;
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "allgather on a joined rank");
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const BufferDesc& in = u.entry->inputs[t];
      tensors.push_back({u.entry, &in, static_cast<size_t>(in.RowElements()) * esize});
    }
  }
  const size_t n = tensors.size();
  std::vector<int64_t> mine(n), dims(n * size_);
  for (size_t i = 0; i < n; ++i) mine[i] = tensors[i].in->shape[0];
  HVD_MPI_CHECK(comm_, MPI_Allgather(mine.data(), static_cast<int>(n), MPI_INT64_T, dims.data(),
                                     static_cast<int>(n), MPI_INT64_T, comm_));
  auto bytes = [&](int rk, size_t i) {
    return static_cast<size_t>(dims[rk * n + i]) * tensors[i].row_bytes;
  };
  std::vector<size_t> rank_bytes(size_, 0), displ(size_, 0);
  size_t total = 0;
  bool uniform = true;  // every tensor has the same first dimension on every rank
  for (int rk = 0; rk < size_; ++rk) {
    for (size_t i = 0; i < n; ++i) {
      rank_bytes[rk] += bytes(rk, i);
      if (dims[rk * n + i] != dims[i]) uniform = false;
    }
    displ[rk] = total;
    total += rank_bytes[rk];
  }
  const bool even = std::all_of(rank_bytes.begin(), rank_bytes.end(),
                                [&](size_t b) { return b == rank_bytes[0]; });
  std::vector<char*> outs(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t rows = 0;
    for (int rk = 0; rk < size_; ++rk) rows += dims[rk * n + i];
    Shape shape = tensors[i].in->shape;
    shape[0] = rows;
    auto& results = tensors[i].entry->result.outputs;
    results.push_back(AllocateDeviceOutput(r.dtype, shape, device_, lane.life));
    outs[i] = static_cast<char*>(results.back().data());
  }
  if (total == 0) return;

  // Gathers every rank's block into `base`, where this rank's block already
  // sits at its offset (or, when `send` is given, is read from there).
  auto gather = [&](char* base, const char* send) {
    NcclComm::Launch launch(*lane.comm);
    if (even) {
      HVD_NCCL_CHECK(launch.get(),
                     nccl.AllGather(send ? send : base + displ[rank_], base, rank_bytes[rank_],
                                    ncclUint8, launch.get(), lane.stream));
      return;
    }
    const size_t largest = *std::max_element(rank_bytes.begin(), rank_bytes.end());
    if (largest * static_cast<size_t>(size_) <= kMaxPaddingFactor * total) {
      // Mildly uneven (the usual last batch): one allgather of blocks padded
      // to the largest, in place in the padding buffer, then each block moved
      // to its offset by a device copy.
      char* pad = lane.padded.Reserve(largest * static_cast<size_t>(size_), device_,
                                      lane.stream);
      CopyDevice(pad + largest * static_cast<size_t>(rank_), base + displ[rank_],
                 rank_bytes[rank_], lane);
      HVD_NCCL_CHECK(launch.get(),
                     nccl.AllGather(pad + largest * static_cast<size_t>(rank_), pad, largest,
                                    ncclUint8, launch.get(), lane.stream));
      for (int rk = 0; rk < size_; ++rk) {
        if (rk != rank_) {
          CopyDevice(base + displ[rk], pad + largest * static_cast<size_t>(rk), rank_bytes[rk],
                     lane);
        }
      }
      return;
    }
    // Very uneven: padding would move too much; every rank sends its block
    // to every other rank directly, one group (one kernel) of send/receive pairs.
    NcclGroup group(launch.get());
    for (int rk = 0; rk < size_; ++rk) {
      if (rk == rank_) continue;
      if (rank_bytes[rank_] > 0) {
        HVD_NCCL_CHECK(launch.get(), nccl.Send(base + displ[rank_], rank_bytes[rank_], ncclUint8,
                                               rk, launch.get(), lane.stream));
      }
      if (rank_bytes[rk] > 0) {
        HVD_NCCL_CHECK(launch.get(), nccl.Recv(base + displ[rk], rank_bytes[rk], ncclUint8, rk,
                                               launch.get(), lane.stream));
      }
    }
    group.End();
  };

  if (n == 1) {
    const char* in = static_cast<const char*>(tensors[0].in->data);
    if (even) {
      gather(outs[0], in);
    } else {
      CopyDevice(outs[0] + displ[rank_], in, rank_bytes[rank_], lane);
      gather(outs[0], nullptr);
    }
    return;
  }
  // Fused: blocks are rank-major (each rank's tensors back to back).
  char* buf = lane.fusion.Reserve(total, device_, lane.stream);
  size_t at = displ[rank_];
  for (size_t i = 0; i < n; ++i) {
    CopyDevice(buf + at, tensors[i].in->data, bytes(rank_, i), lane);
    at += bytes(rank_, i);
  }
  gather(buf, nullptr);
  if (uniform && rank_bytes[0] < kMaxPitch) {
    // Same layout in every block: one strided copy per tensor.
    size_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t width = bytes(0, i);
      if (width > 0) {
        HVD_CUDA_CHECK(cuda.Memcpy2DAsync(outs[i], width, buf + offset, rank_bytes[0], width,
                                          static_cast<size_t>(size_), cudaMemcpyDeviceToDevice,
                                          lane.stream));
      }
      offset += width;
    }
    return;
  }
  std::vector<size_t> out_at(n, 0);
  for (int rk = 0; rk < size_; ++rk) {
    at = displ[rk];
    for (size_t i = 0; i < n; ++i) {
      CopyDevice(outs[i] + out_at[i], buf + at, bytes(rk, i), lane);
      out_at[i] += bytes(rk, i);
      at += bytes(rk, i);
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
    const size_t row_bytes = static_cast<size_t>(in.RowElements()) * esize;
    const std::vector<int64_t>& send_rows = e->splits[0];
    const std::vector<int64_t> recv_rows = ExchangeAlltoallRows(comm_, send_rows);
    int64_t total_rows = 0;
    for (int64_t v : recv_rows) total_rows += v;
    Shape shape = in.shape;
    shape[0] = total_rows;
    e->result.outputs.push_back(AllocateDeviceOutput(r.dtype, shape, device_, lane.life));
    char* out = static_cast<char*>(e->result.outputs.back().data());
    const char* src = static_cast<const char*>(in.data);
    std::vector<size_t> sd(size_), rd(size_);
    size_t s_at = 0, r_at = 0;
    for (int rk = 0; rk < size_; ++rk) {
      sd[rk] = s_at;
      rd[rk] = r_at;
      s_at += static_cast<size_t>(send_rows[rk]) * row_bytes;
      r_at += static_cast<size_t>(recv_rows[rk]) * row_bytes;
    }
    CopyDevice(out + rd[rank_], src + sd[rank_],
               static_cast<size_t>(send_rows[rank_]) * row_bytes, lane);
    {
      NcclComm::Launch launch(*lane.comm);
      NcclGroup group(launch.get());
      for (int rk = 0; rk < size_; ++rk) {
        if (rk == rank_) continue;
        const size_t sb = static_cast<size_t>(send_rows[rk]) * row_bytes;
        const size_t rb = static_cast<size_t>(recv_rows[rk]) * row_bytes;
        if (sb > 0) {
          HVD_NCCL_CHECK(launch.get(), nccl.Send(src + sd[rk], sb, ncclUint8, rk, launch.get(),
                                                 lane.stream));
        }
        if (rb > 0) {
          HVD_NCCL_CHECK(launch.get(), nccl.Recv(out + rd[rk], rb, ncclUint8, rk, launch.get(),
                                                 lane.stream));
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
    int64_t rows, row_elems;
  };
  std::vector<T> tensors;
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "reducescatter on a joined rank");
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const BufferDesc& in = u.entry->inputs[t];
      tensors.push_back({static_cast<const char*>(in.data),
                         static_cast<char*>(u.entry->outputs[t].data),
                         in.shape.empty() ? 1 : in.shape[0], in.RowElements()});
    }
  }
  // Elements each rank receives: the first rows % size ranks get one more row.
  std::vector<int64_t> counts(size_, 0);
  for (int rk = 0; rk < size_; ++rk) {
    for (const auto& t : tensors) counts[rk] += ReducescatterRows(t.rows, size_, rk) * t.row_elems;
  }
  const int64_t block = *std::max_element(counts.begin(), counts.end());
  if (block == 0) return;
  const bool even = std::all_of(counts.begin(), counts.end(),
                                [&](int64_t c) { return c == counts[0]; });
  if (tensors.size() == 1 && even) {
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
    for (const auto& t : tensors) {
      int64_t first_row = 0;
      for (int k = 0; k < rk; ++k) first_row += ReducescatterRows(t.rows, size_, k);
      const int64_t n = ReducescatterRows(t.rows, size_, rk) * t.row_elems;
      CopyDevice(buf + at * esize, t.in + first_row * t.row_elems * esize,
                 static_cast<size_t>(n) * esize, lane);
      at += n;
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
  for (const auto& t : tensors) {
    const int64_t n = ReducescatterRows(t.rows, size_, rank_) * t.row_elems;
    CopyDevice(t.out, mine + at * esize, static_cast<size_t>(n) * esize, lane);
    at += n;
  }
}

}  // namespace hvdcompat
