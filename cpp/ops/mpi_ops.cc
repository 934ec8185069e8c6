#include "ops/mpi_ops.h"

#include <climits>
#include <cstring>

#include "core/checked_math.h"
#include "ops/collective_layout.h"
#include "ops/gather_blocks.h"
#include "ops/cpu_kernels.h"
#include "ops/mpi_hierarchical_ops.h"
#include "ops/mpi_network_ops.h"
#include "ops/scatter_blocks.h"

namespace hvdcompat {

namespace {

int ToInt(int64_t v, const char* what) {
  if (v > INT_MAX || v < 0) {
    throw InvalidArgument(std::string(what) + " of " + std::to_string(v) +
                          " elements exceeds what one MPI call can carry (2^31-1); split the "
                          "tensor or lower HOROVOD_FUSION_THRESHOLD");
  }
  return static_cast<int>(v);
}

std::vector<int> ToInts(const std::vector<int64_t>& v, const char* what) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ToInt(v[i], what);
  return out;
}

}  // namespace

MpiBackend::MpiBackend(MPI_Comm comm, const MpiOps* ops, const Config& config,
                       EngineStats* stats)
    : comm_(comm),
      ops_(ops),
      chunk_bytes_(config.fusion_chunk_bytes),
      inplace_min_bytes_(config.inplace_min_bytes),
      max_call_bytes_(config.max_call_bytes),
      adasum_(comm),
      wait_(WaitPolicy::ForData(config)),
      stats_(stats) {
  HVD_MPI_CHECK(comm_, MPI_Comm_rank(comm_, &rank_));
  HVD_MPI_CHECK(comm_, MPI_Comm_size(comm_, &size_));
  if (config.hierarchical_allreduce || config.hierarchical_allgather) {
    hierarchy_ = std::make_unique<MpiHierarchy>(comm_, config);
  }
  PreferRingNonblockingAllreduce();
  network_ = NetworkAllreduce::Create(comm_, ops_, config, stats_);
}

void MpiBackend::SetAbortFlag(const std::atomic<bool>* abort) {
  wait_.abort = abort;
  if (network_) network_->SetAbortFlag(abort);
}

void MpiBackend::Wait(MPI_Request* request, const char* what) {
  WaitRequest(request, comm_, wait_, what);
}

MpiBackend::~MpiBackend() = default;

bool MpiBackend::CanExecute(const Response& r) const { return r.device == kCpuDevice; }

void MpiBackend::ApplyTuning(const TunedParams& p) {
  // The same floors as Config::FromEnvironment.
  chunk_bytes_ = std::max<int64_t>(4096, p.fusion_chunk_bytes);
  max_call_bytes_ = std::max<int64_t>(4096, p.max_call_bytes);
}

void MpiBackend::Execute(const Response& r, std::vector<ExecUnit>& units) {
  switch (r.op) {
    case OpType::kAllreduce: return Allreduce(r, units);
    case OpType::kAllgather: return Timed("MPI_ALLGATHER", [&] { Allgather(r, units); });
    case OpType::kBroadcast: return Timed("MPI_BCAST", [&] { Broadcast(r, units); });
    case OpType::kAlltoall: return Timed("MPI_ALLTOALL", [&] { Alltoall(r, units); });
    case OpType::kReducescatter:
      return Timed("MPI_REDUCESCATTER", [&] { Reducescatter(r, units); });
    case OpType::kBarrier:
    case OpType::kJoin:
      // Negotiation already synchronised every rank of the set.
      return;
  }
}

void MpiBackend::AllreduceElements(const void* in, void* out, int64_t count, DataType dtype,
                                   ReduceOp op) {
  const size_t esize = DataTypeSize(dtype);
  const int64_t step = INT_MAX / 2;
  for (int64_t off = 0; off < count; off += step) {
    int n = static_cast<int>(std::min(step, count - off));
    // Whether a call goes node-aware depends on its size alone, never on
    // whether this rank reduces in place: a joined rank reduces its zeros in
    // place while the others read their inputs, and every rank must make the
    // same calls.
    if (hierarchy_ && hierarchy_->UseAllreduce(n)) {
      char* dst = static_cast<char*>(out) + off * esize;
      if (in != MPI_IN_PLACE) std::memcpy(dst, static_cast<const char*>(in) + off * esize,
                                          static_cast<size_t>(n) * esize);
      hierarchy_->Allreduce(dst, n, ops_->Type(dtype), esize, ops_->Op(op));
      if (stats_) stats_->hierarchical_allreduces.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const void* src = in == MPI_IN_PLACE ? MPI_IN_PLACE : static_cast<const char*>(in) + off * esize;
    MPI_Request req;
    HVD_MPI_CHECK(comm_, MPI_Iallreduce(src, static_cast<char*>(out) + off * esize, n,
                                        ops_->Type(dtype), ops_->Op(op), comm_, &req));
    Wait(&req, "allreduce");
  }
}

void MpiBackend::ReduceDirect(const Piece& p, DataType dtype, ReduceOp op, double post) {
  const size_t esize = DataTypeSize(dtype);
  // Equal calls of at most max_call_bytes_.
  const int64_t step = EqualCallElements(p.count, max_call_bytes_, esize);
  for (int64_t off = 0; off < p.count; off += step) {
    int64_t n = std::min(step, p.count - off);
    const char* in = p.in + off * esize;
    char* out = p.out + off * esize;
    // Without a prescale, reduce from the input into the output directly.
    const void* src = in == out ? MPI_IN_PLACE : in;
    if (p.pre != 1.0) {
      Timed("PRESCALE", [&] { ScaleCopy(out, in, n, dtype, p.pre); });
      src = MPI_IN_PLACE;
    }
    Timed("MPI_ALLREDUCE", [&] { AllreduceElements(src, out, n, dtype, op); });
    if (post != 1.0) {
      Timed("POSTSCALE", [&] { ScaleCopy(out, out, n, dtype, post, PostInDouble(op)); });
    }
  }
}

void MpiBackend::ReduceStreamed(const std::vector<Piece>& pieces, DataType dtype, ReduceOp op,
                                double post) {
  const DataType wire = HostReduceType(dtype);
  const size_t esize = DataTypeSize(dtype);
  const size_t wsize = DataTypeSize(wire);
  const int64_t chunk = std::max<int64_t>(1, chunk_bytes_ / static_cast<int64_t>(wsize));
  char* buf = scratch_a_.Reserve(static_cast<size_t>(chunk) * wsize);
  struct Seg {
    const Piece* piece;
    int64_t offset;
    int64_t count;
  };
  std::vector<Seg> segs;
  size_t pi = 0;
  int64_t poff = 0;
  while (pi < pieces.size()) {
    segs.clear();
    int64_t filled = 0;
    Timed("MEMCPY_IN_FUSION_BUFFER", [&] {
      while (pi < pieces.size() && filled < chunk) {
        const Piece& p = pieces[pi];
        int64_t n = std::min(p.count - poff, chunk - filled);
        if (n > 0) {
          ConvertScale(buf + filled * wsize, wire, p.in + poff * esize, dtype, n, p.pre);
          segs.push_back({&p, poff, n});
          filled += n;
          poff += n;
        }
        if (poff >= p.count) {
          ++pi;
          poff = 0;
        }
      }
    });
    if (filled == 0) break;
    Timed("MPI_ALLREDUCE", [&] { AllreduceElements(MPI_IN_PLACE, buf, filled, wire, op); });
    Timed("MEMCPY_OUT_FUSION_BUFFER", [&] {
      int64_t at = 0;
      for (const auto& s : segs) {
        ConvertScale(s.piece->out + s.offset * esize, dtype, buf + at * wsize, wire, s.count, post,
                     PostInDouble(op));
        at += s.count;
      }
    });
  }
}

void MpiBackend::Allreduce(const Response& r, std::vector<ExecUnit>& units) {
  if (r.reduce_op == ReduceOp::kAdasum) {
    return Timed("MPI_ADASUM_ALLREDUCE", [&] { adasum_.Allreduce(r, units); });
  }
  const size_t esize = DataTypeSize(r.dtype);
  double pre, post;
  ReduceScales(r, size_, &pre, &post);
  std::vector<Piece> pieces;
  size_t joined = 0;
  for (auto& u : units) {
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      int64_t count = ShapeElements(u.unit->shapes[t]);
      if (u.entry) {
        pieces.push_back({static_cast<const char*>(u.entry->inputs[t].data),
                          static_cast<char*>(u.entry->outputs[t].data), count, pre});
      } else {
        // A joined rank contributes the op's identity and keeps nothing.
        if (joined_buffers_.size() <= joined) {
          joined_buffers_.push_back(std::make_unique<HostScratch>());
        }
        char* z = joined_buffers_[joined++]->Reserve(static_cast<size_t>(count) * esize);
        FillIdentity(z, count, r.dtype, r.reduce_op);
        pieces.push_back({z, z, count, 1.0});
      }
    }
  }
  if (network_) {
    std::vector<NetworkPiece> net;
    net.reserve(pieces.size());
    for (const auto& p : pieces) net.push_back({p.in, p.out, p.count, p.pre});
    return Timed("MPI_ALLREDUCE", [&] {
      network_->Allreduce(net, r.dtype, r.reduce_op, post, PostInDouble(r.reduce_op),
                          inplace_min_bytes_);
    });
  }
  const bool widen = HostReduceType(r.dtype) != r.dtype;
  std::vector<Piece> streamed;
  for (const auto& p : pieces) {
    if (!widen &&
        (pieces.size() == 1 || static_cast<int64_t>(p.count * esize) >= inplace_min_bytes_)) {
      ReduceDirect(p, r.dtype, r.reduce_op, post);
    } else {
      streamed.push_back(p);
    }
  }
  if (!streamed.empty()) ReduceStreamed(streamed, r.dtype, r.reduce_op, post);
}

void MpiBackend::Allgather(const Response& r, std::vector<ExecUnit>& units) {
  const size_t esize = DataTypeSize(r.dtype);
  const GatherTensors t = CollectAllgather(units);
  const size_t n = t.inputs.size();
  std::vector<int64_t> dims(n * size_);
  MPI_Request req;
  HVD_MPI_CHECK(comm_, MPI_Iallgather(t.rows.data(), static_cast<int>(n), MPI_INT64_T,
                                      dims.data(), static_cast<int>(n), MPI_INT64_T, comm_, &req));
  Wait(&req, "allgather of first dimensions");
  // One tensor is gathered as elements of its type; fused tensors as bytes.
  const bool fused = n > 1;
  std::vector<int64_t> row_sizes(n);
  for (size_t i = 0; i < n; ++i) {
    row_sizes[i] = t.inputs[i]->RowElements() * (fused ? static_cast<int64_t>(esize) : 1);
  }
  const GatherLayout g = PlanAllgather(dims, row_sizes, size_);
  // Outputs, allocated here now that every rank's first dimension is known.
  const std::vector<char*> outs = AllocateGatherOutputs(t, g, r.dtype);
  if (!fused) {
    const std::vector<int> counts = ToInts(g.rank_counts, "allgather");
    const std::vector<int> displs = ToInts(g.rank_displs, "allgather output");
    AllgathervBlocks(t.inputs[0]->data, counts[rank_], outs[0], counts, displs,
                     ops_->Type(r.dtype), esize);
    return;
  }
  // Fused: pack this rank's tensors back to back, gather every rank's block,
  // then scatter the blocks into the outputs.
  const std::vector<int> counts = ToInts(g.rank_counts, "fused allgather bytes");
  const std::vector<int> displs = ToInts(g.rank_displs, "fused allgather bytes");
  char* send = scratch_a_.Reserve(static_cast<size_t>(g.rank_counts[rank_]));
  PackOwnBlock(send, t, g, rank_);
  char* recv = scratch_b_.Reserve(static_cast<size_t>(g.total));
  AllgathervBlocks(send, counts[rank_], recv, counts, displs, MPI_BYTE, 1);
  UnpackGathered(recv, g, outs);
}

void MpiBackend::AllgathervBlocks(const void* send, int send_count, void* recv,
                                  const std::vector<int>& counts, const std::vector<int>& displs,
                                  MPI_Datatype type, size_t esize) {
  const int64_t total = static_cast<int64_t>(displs[size_ - 1]) + counts[size_ - 1];
  if (hierarchy_ && hierarchy_->UseAllgather(total)) {
    hierarchy_->Allgatherv(send, send_count, recv, counts.data(), displs.data(), type, esize);
    if (stats_) stats_->hierarchical_allgathers.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  MPI_Request req;
  HVD_MPI_CHECK(comm_, MPI_Iallgatherv(send, send_count, type, recv, counts.data(),
                                       displs.data(), type, comm_, &req));
  Wait(&req, "allgather");
}

void MpiBackend::Broadcast(const Response& r, std::vector<ExecUnit>& units) {
  const bool root = rank_ == r.root;
  std::vector<std::pair<const char*, char*>> bufs;
  std::vector<int64_t> bytes;
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "broadcast on a joined rank");
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const BufferDesc& in = u.entry->inputs[t];
      const BufferDesc& out = u.entry->outputs[t];
      if (root && in.data != out.data) std::memcpy(out.data, in.data, in.Bytes());
      bufs.emplace_back(static_cast<const char*>(in.data), static_cast<char*>(out.data));
      bytes.push_back(static_cast<int64_t>(out.Bytes()));
    }
  }
  auto bcast = [&](char* p, int64_t len) {
    const int64_t step = INT_MAX / 2;
    for (int64_t off = 0; off < len; off += step) {
      MPI_Request req;
      HVD_MPI_CHECK(comm_, MPI_Ibcast(p + off, static_cast<int>(std::min(step, len - off)),
                                      MPI_BYTE, r.root, comm_, &req));
      Wait(&req, "broadcast");
    }
  };
  if (bufs.size() == 1) {
    bcast(bufs[0].second, bytes[0]);
    return;
  }
  // Fused: stream chunks packed on the root.
  const int64_t chunk = std::max<int64_t>(4096, chunk_bytes_);
  char* buf = scratch_a_.Reserve(static_cast<size_t>(chunk));
  size_t bi = 0;
  int64_t boff = 0;
  while (bi < bufs.size()) {
    struct Seg {
      size_t index;
      int64_t offset, len;
    };
    std::vector<Seg> segs;
    int64_t filled = 0;
    while (bi < bufs.size() && filled < chunk) {
      int64_t len = std::min(bytes[bi] - boff, chunk - filled);
      if (len > 0) {
        if (root) std::memcpy(buf + filled, bufs[bi].second + boff, len);
        segs.push_back({bi, boff, len});
        filled += len;
        boff += len;
      }
      if (boff >= bytes[bi]) {
        ++bi;
        boff = 0;
      }
    }
    if (filled == 0) break;
    bcast(buf, filled);
    if (!root) {
      int64_t at = 0;
      for (const auto& s : segs) {
        std::memcpy(bufs[s.index].second + s.offset, buf + at, s.len);
        at += s.len;
      }
    }
  }
}

void MpiBackend::Alltoall(const Response& r, std::vector<ExecUnit>& units) {
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "alltoall on a joined rank");
    TensorEntry* e = u.entry;
    const BufferDesc& in = e->inputs[0];
    const int64_t row = in.RowElements();
    const std::vector<int64_t>& send_rows = e->splits[0];
    const std::vector<int64_t> recv_rows = ExchangeAlltoallRows(comm_, send_rows, wait_);
    Shape shape = in.shape;
    shape[0] = CheckedSum(recv_rows, "alltoall: rows received");
    const AlltoallCounts c = PlanAlltoall(send_rows, recv_rows, row);
    e->result.outputs.push_back(OwnedBuffer::Allocate(r.dtype, shape));
    void* out = e->result.outputs.back().data();
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    for (int rk = 0; rk < size_; ++rk) {
      sc[rk] = ToInt(c.send_counts[rk], "alltoall send count");
      sd[rk] = ToInt(c.send_displs[rk], "alltoall send offset");
      rc[rk] = ToInt(c.recv_counts[rk], "alltoall receive count");
      rd[rk] = ToInt(c.recv_displs[rk], "alltoall receive offset");
    }
    MPI_Datatype type = ops_->Type(r.dtype);
    MPI_Request req;
    HVD_MPI_CHECK(comm_, MPI_Ialltoallv(in.data, sc.data(), sd.data(), type, out, rc.data(),
                                        rd.data(), type, comm_, &req));
    Wait(&req, "alltoall");
    e->result.received_splits.push_back(recv_rows);
  }
}

void MpiBackend::Reducescatter(const Response& r, std::vector<ExecUnit>& units) {
  const DataType wire = HostReduceType(r.dtype);
  const size_t esize = DataTypeSize(r.dtype);
  const size_t wsize = DataTypeSize(wire);
  double pre, post;
  ReduceScales(r, size_, &pre, &post);
  const ScatterTensors s = CollectReducescatter(units, size_);
  const std::vector<int> counts = ToInts(s.layout.rank_counts, "reducescatter count");
  const int64_t total = s.layout.total;
  MPI_Datatype type = ops_->Type(wire);
  MPI_Op op = ops_->Op(r.reduce_op);
  if (s.inputs.size() == 1 && wire == r.dtype) {
    const char* src = static_cast<const char*>(s.inputs[0]->data);
    void* out = s.outputs[0]->data;
    if (pre != 1.0) {
      char* scaled = scratch_a_.Reserve(static_cast<size_t>(total) * esize);
      ScaleCopy(scaled, src, total, r.dtype, pre);
      src = scaled;
    }
    MPI_Request req;
    HVD_MPI_CHECK(comm_, MPI_Ireduce_scatter(src, out, counts.data(), type, op, comm_, &req));
    Wait(&req, "reducescatter");
    if (post != 1.0) {
      ScaleCopy(out, out, counts[rank_], r.dtype, post, PostInDouble(r.reduce_op));
    }
    return;
  }
  char* send = scratch_a_.Reserve(static_cast<size_t>(total) * wsize);
  PackRankMajor(send, wire, s, r.dtype, pre);
  char* recv = scratch_b_.Reserve(static_cast<size_t>(counts[rank_]) * wsize);
  MPI_Request req;
  HVD_MPI_CHECK(comm_, MPI_Ireduce_scatter(send, recv, counts.data(), type, op, comm_, &req));
  Wait(&req, "fused reducescatter");
  UnpackBlock(recv, wire, s, rank_, r.dtype, post, PostInDouble(r.reduce_op));
}

}  // namespace hvdcompat
