#include "ops/gloo_ops.h"

#include <cstring>

#include "core/checked_math.h"
#include "ops/adasum.h"
#include "ops/collective_layout.h"
#include "ops/gather_blocks.h"
#include "ops/cpu_kernels.h"
#include "ops/gloo_hierarchical_ops.h"
#include "ops/gloo_peers.h"
#include "ops/host_reduce.h"
#include "ops/scatter_blocks.h"
#include "transport/control_transport.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"

namespace hvdcompat {

namespace {

constexpr uint32_t kDataTag = 100;  // the control transport uses tags below it
// Gloo's own collectives use slot prefixes 0x01-0x08; the ring reduce-scatter here its own,
// Adasum and the hierarchical steps (ops/gloo_hierarchical_ops.cc: 0x42) theirs.
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr uint8_t kAdasumSlotPrefix = 0x41;

// Gloo wants a pointer even for an empty buffer.
char g_empty[8];
template <typename P>
P* NonNull(P* p) {
  return p ? p : reinterpret_cast<P*>(g_empty);
}

}  // namespace

GlooBackend::GlooBackend(std::shared_ptr<gloo::Context> context, const Config& config,
                         const std::vector<int>& global_ranks, EngineStats* stats)
    : context_(std::move(context)), rank_(context_->rank), size_(context_->size), stats_(stats) {
  adasum_peers_ = std::make_unique<GlooAdasumPeers>(context_, kAdasumSlotPrefix);
  adasum_ = std::make_unique<Adasum>(adasum_peers_.get());
  if (config.hierarchical_allreduce || config.hierarchical_allgather) {
    hierarchy_ = std::make_unique<GlooHierarchy>(context_, global_ranks, config);
  }
}

GlooBackend::~GlooBackend() = default;

bool GlooBackend::CanExecute(const Response& r) const { return r.device == kCpuDevice; }

void GlooBackend::Fail(const char* what, const std::exception& e) const {
  throw CommunicationError(std::string("Gloo ") + what + " on set rank " + std::to_string(rank_) +
                           " of " + std::to_string(size_) + " failed: " + e.what() +
                           " (a peer may have exited; its own output says why)");
}

void GlooBackend::Execute(const Response& r, std::vector<ExecUnit>& units) {
  try {
    switch (r.op) {
      case OpType::kAllreduce: return Allreduce(r, units);
      case OpType::kAllgather: return Timed("GLOO_ALLGATHER", [&] { Allgather(r, units); });
      case OpType::kBroadcast: return Timed("GLOO_BCAST", [&] { Broadcast(r, units); });
      case OpType::kAlltoall: return Timed("GLOO_ALLTOALL", [&] { Alltoall(r, units); });
      case OpType::kReducescatter:
        return Timed("GLOO_REDUCESCATTER", [&] { Reducescatter(r, units); });
      case OpType::kBarrier:
      case OpType::kJoin:
        // Negotiation already synchronised every rank of the set.
        return;
    }
  } catch (const gloo::Exception& e) {
    Fail(OpTypeName(r.op), e);
  }
}

void GlooBackend::AllreduceElements(const void* in, void* out, int64_t count, DataType dtype,
                                    ReduceOp op) {
  if (count == 0 || size_ == 1) {
    if (in != out && count > 0) std::memcpy(out, in, count * DataTypeSize(dtype));
    return;
  }
  // By size alone, as on MPI: a joined rank reduces in place while the others
  // read their inputs, and every rank must take the same steps.
  if (hierarchy_ && hierarchy_->UseAllreduce(count)) {
    if (in != out) std::memcpy(out, in, static_cast<size_t>(count) * DataTypeSize(dtype));
    hierarchy_->Allreduce(out, count, dtype, op);
    if (stats_) stats_->hierarchical_allreduces.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  gloo::AllreduceOptions o(context_);
  const size_t esize = DataTypeSize(dtype);
  // Typed by size only: the reduce function knows the element type.
  auto set = [&](auto* typed_out) {
    using T = std::remove_pointer_t<decltype(typed_out)>;
    if (in != out) o.setInput(const_cast<T*>(static_cast<const T*>(in)), count);
    o.setOutput(typed_out, count);
  };
  switch (esize) {
    case 1: set(static_cast<uint8_t*>(out)); break;
    case 2: set(static_cast<uint16_t*>(out)); break;
    case 4: set(static_cast<uint32_t*>(out)); break;
    default: set(static_cast<uint64_t*>(out)); break;
  }
  o.setReduceFunction(HostReduceFor(dtype, op));
  o.setTag(kDataTag);
  gloo::allreduce(o);
}

void GlooBackend::Allreduce(const Response& r, std::vector<ExecUnit>& units) {
  if (r.reduce_op == ReduceOp::kAdasum) {
    return Timed("GLOO_ADASUM_ALLREDUCE", [&] { adasum_->Allreduce(r, units); });
  }
  const size_t esize = DataTypeSize(r.dtype);
  const DataType wire = HostReduceType(r.dtype);
  const size_t wsize = DataTypeSize(wire);
  double pre, post;
  ReduceScales(r, size_, &pre, &post);
  struct Piece {
    const char* in;
    char* out;
    int64_t count;
    double pre;
  };
  std::vector<Piece> pieces;
  size_t joined = 0;
  int64_t total = 0;
  for (auto& u : units) {
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      int64_t count = ShapeElements(u.unit->shapes[t]);
      total += count;
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
  if (pieces.size() == 1 && wire == r.dtype) {
    const Piece& p = pieces[0];
    const char* src = p.in;
    if (p.pre != 1.0) {
      Timed("PRESCALE", [&] { ScaleCopy(p.out, p.in, p.count, r.dtype, p.pre); });
      src = p.out;
    }
    Timed("GLOO_ALLREDUCE", [&] { AllreduceElements(src, p.out, p.count, r.dtype, r.reduce_op); });
    if (post != 1.0) {
      Timed("POSTSCALE", [&] {
        ScaleCopy(p.out, p.out, p.count, r.dtype, post, PostInDouble(r.reduce_op));
      });
    }
    return;
  }
  // Fused or 16-bit: pack (widening, prescaling), reduce once, unpack.
  char* buf = scratch_a_.Reserve(static_cast<size_t>(std::max<int64_t>(total, 1)) * wsize);
  Timed("MEMCPY_IN_FUSION_BUFFER", [&] {
    int64_t at = 0;
    for (const auto& p : pieces) {
      ConvertScale(buf + at * wsize, wire, p.in, r.dtype, p.count, p.pre);
      at += p.count;
    }
  });
  Timed("GLOO_ALLREDUCE", [&] { AllreduceElements(buf, buf, total, wire, r.reduce_op); });
  Timed("MEMCPY_OUT_FUSION_BUFFER", [&] {
    int64_t at = 0;
    for (const auto& p : pieces) {
      ConvertScale(p.out, r.dtype, buf + at * wsize, wire, p.count, post,
                   PostInDouble(r.reduce_op));
      at += p.count;
    }
  });
}

void GlooBackend::AllgatherBytes(const void* send, void* recv,
                                 const std::vector<int64_t>& counts) {
  std::vector<size_t> c(counts.begin(), counts.end());
  gloo::AllgathervOptions o(context_);
  o.setInput(NonNull(const_cast<char*>(static_cast<const char*>(send))), c[rank_]);
  o.setOutput(NonNull(static_cast<char*>(recv)), c);
  o.setTag(kDataTag);
  gloo::allgatherv(o);
}

void GlooBackend::GatherBlocks(const void* send, void* recv, const std::vector<int64_t>& counts) {
  if (hierarchy_ && hierarchy_->UseAllgather()) {
    hierarchy_->Allgatherv(send, recv, counts);
    if (stats_) stats_->hierarchical_allgathers.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  AllgatherBytes(send, recv, counts);
}

void GlooBackend::Allgather(const Response& r, std::vector<ExecUnit>& units) {
  const size_t esize = DataTypeSize(r.dtype);
  const GatherTensors t = CollectAllgather(units);
  const size_t n = t.inputs.size();
  std::vector<int64_t> dims(n * size_);
  AllgatherBytes(t.rows.data(), dims.data(),
                 std::vector<int64_t>(size_, static_cast<int64_t>(n * sizeof(int64_t))));
  // Planned in bytes: one call carries every tensor, fused or not.
  std::vector<int64_t> row_bytes(n);
  for (size_t i = 0; i < n; ++i) {
    row_bytes[i] = t.inputs[i]->RowElements() * static_cast<int64_t>(esize);
  }
  const GatherLayout g = PlanAllgather(dims, row_bytes, size_);
  const std::vector<char*> outs = AllocateGatherOutputs(t, g, r.dtype);
  if (n == 1) {
    GatherBlocks(t.inputs[0]->data, outs[0], g.rank_counts);
    return;
  }
  char* send = scratch_a_.Reserve(static_cast<size_t>(std::max<int64_t>(g.rank_counts[rank_], 1)));
  PackOwnBlock(send, t, g, rank_);
  char* recv = scratch_b_.Reserve(static_cast<size_t>(std::max<int64_t>(g.total, 1)));
  GatherBlocks(send, recv, g.rank_counts);
  UnpackGathered(recv, g, outs);
}

void GlooBackend::Broadcast(const Response& r, std::vector<ExecUnit>& units) {
  const bool root = rank_ == r.root;
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "broadcast on a joined rank");
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const BufferDesc& in = u.entry->inputs[t];
      const BufferDesc& out = u.entry->outputs[t];
      if (root && in.data != out.data) std::memcpy(out.data, in.data, in.Bytes());
      if (out.Bytes() == 0 || size_ == 1) continue;
      gloo::BroadcastOptions o(context_);
      o.setOutput(static_cast<char*>(out.data), out.Bytes());
      o.setRoot(r.root);
      o.setTag(kDataTag);
      gloo::broadcast(o);
    }
  }
}

void GlooBackend::Alltoall(const Response& r, std::vector<ExecUnit>& units) {
  const size_t esize = DataTypeSize(r.dtype);
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "alltoall on a joined rank");
    TensorEntry* e = u.entry;
    const BufferDesc& in = e->inputs[0];
    const int64_t row_bytes = in.RowElements() * static_cast<int64_t>(esize);
    std::vector<int64_t> send_rows = e->splits[0];
    std::vector<int64_t> recv_rows(size_);
    {
      gloo::AlltoallvOptions o(context_);
      o.setInput(send_rows.data(), std::vector<int64_t>(size_, 1));
      o.setOutput(recv_rows.data(), std::vector<int64_t>(size_, 1));
      o.setTag(kDataTag);
      gloo::alltoallv(o);
    }
    Shape shape = in.shape;
    shape[0] = CheckedSum(recv_rows, "alltoall: rows received");
    // The layout every backend follows, in bytes here (checked sizes).
    const AlltoallCounts c = PlanAlltoall(send_rows, recv_rows, row_bytes);
    e->result.outputs.push_back(OwnedBuffer::Allocate(r.dtype, shape));
    char* out = static_cast<char*>(e->result.outputs.back().data());
    gloo::AlltoallvOptions o(context_);
    o.setInput(NonNull(static_cast<char*>(in.data)), c.send_counts);
    o.setOutput(NonNull(out), c.recv_counts);
    o.setTag(kDataTag + 1);
    gloo::alltoallv(o);
    e->result.received_splits.push_back(recv_rows);
  }
}

void GlooBackend::Reducescatter(const Response& r, std::vector<ExecUnit>& units) {
  const DataType wire = HostReduceType(r.dtype);
  const size_t wsize = DataTypeSize(wire);
  double pre, post;
  ReduceScales(r, size_, &pre, &post);
  const ScatterTensors s = CollectReducescatter(units, size_);
  const int64_t total = s.layout.total;
  char* buf = scratch_a_.Reserve(static_cast<size_t>(std::max<int64_t>(total, 1)) * wsize);
  PackRankMajor(buf, wire, s, r.dtype, pre);
  RingReduceScatter(buf, s.layout, wire, r.reduce_op);
  UnpackBlock(buf + BlockStart(s.layout, rank_) * wsize, wire, s, rank_, r.dtype, post,
              PostInDouble(r.reduce_op));
}

// Ring reduce-scatter over the rank-major buffer: in step k (of size - 1)
// rank r sends block (r - k - 1) to rank r + 1 and adds block (r - k - 2),
// received from rank r - 1, into its own copy; after the last step block r
// holds every rank's contribution. Each rank sends (size - 1) / size of the
// payload, half of what a full allreduce would move.
void GlooBackend::RingReduceScatter(char* buf, const ScatterLayout& layout, DataType wire,
                                    ReduceOp op) {
  if (size_ == 1 || layout.total == 0) return;
  const size_t wsize = DataTypeSize(wire);
  std::vector<size_t> start(size_ + 1, 0);
  for (int rk = 0; rk < size_; ++rk) {
    start[rk + 1] = start[rk] + static_cast<size_t>(layout.rank_counts[rk]) * wsize;
  }
  char* incoming = scratch_b_.Reserve(static_cast<size_t>(std::max<int64_t>(layout.largest, 1)) *
                                      wsize);
  auto out = context_->createUnboundBuffer(buf, start[size_]);
  auto in = context_->createUnboundBuffer(incoming, std::max<size_t>(layout.largest * wsize, 1));
  const HostReduceFn reduce = HostReduceFor(wire, op);
  const auto slot = gloo::Slot::build(kReduceScatterSlotPrefix, kDataTag);
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  auto block = [&](int k) { return ((rank_ - k) % size_ + size_) % size_; };
  for (int k = 0; k < size_ - 1; ++k) {
    const int send = block(k + 1), recv = block(k + 2);
    const size_t recv_bytes = start[recv + 1] - start[recv];
    out->send(next, slot, start[send], start[send + 1] - start[send]);
    in->recv(prev, slot, 0, recv_bytes);
    in->waitRecv();
    reduce(buf + start[recv], buf + start[recv], incoming, recv_bytes / wsize);
    out->waitSend();
  }
}

}  // namespace hvdcompat
