#include "ops/gloo_ops.h"

#include <algorithm>
#include <cstring>

#include "core/checked_math.h"
#include "ops/adasum.h"
#include "ops/collective_layout.h"
#include "ops/gather_blocks.h"
#include "ops/cpu_kernels.h"
#include "ops/gloo_hierarchical_ops.h"
#include "ops/gloo_peers.h"
#include "ops/host_reduce.h"
#include "ops/node_layout.h"
#include "ops/scatter_blocks.h"
#include "transport/control_transport.h"
#include "gloo/allgatherv.h"
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
// Adasum, the hierarchical steps (ops/gloo_hierarchical_ops.cc: 0x42) and the allreduce
// (ops/gloo_ring.cc: 0x43, 0x44) theirs.
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr uint8_t kAdasumSlotPrefix = 0x41;

GlooRingOptions RingOptions(const Config& config) {
  GlooRingOptions o;
  o.segment_bytes = config.gloo_segment_bytes;
  o.depth = static_cast<int>(std::min<int64_t>(config.gloo_pipeline_depth, 1024));
  o.exchange_max_bytes = config.gloo_exchange_max_bytes;
  return o;
}

// Gloo wants a pointer even for an empty buffer.
char g_empty[8];
template <typename P>
P* NonNull(P* p) {
  return p ? p : reinterpret_cast<P*>(g_empty);
}

}  // namespace

GlooBackend::GlooBackend(std::shared_ptr<gloo::Context> context, const Config& config,
                         const std::vector<int>& global_ranks, EngineStats* stats)
    : context_(std::move(context)),
      rank_(context_->rank),
      size_(context_->size),
      inplace_min_bytes_(config.inplace_min_bytes),
      ring_(context_, RingOptions(config)),
      stats_(stats) {
  adasum_peers_ = std::make_unique<GlooAdasumPeers>(context_, kAdasumSlotPrefix);
  adasum_ = std::make_unique<Adasum>(adasum_peers_.get());
  if (config.hierarchical_allreduce || config.hierarchical_allgather) {
    hierarchy_ = std::make_unique<GlooHierarchy>(context_, global_ranks, config);
  }
  // Note [16-bit wire on Gloo] (ops/gloo_ops.h).
  const std::vector<std::string> nodes =
      NodeLabels(global_ranks, config.rank_hosts, config.hierarchical_local_size);
  const bool spans = std::any_of(nodes.begin(), nodes.end(),
                                 [&](const std::string& n) { return n != nodes.front(); });
  network_ = config.link_plan == "network" || (config.link_plan == "auto" && spans);
  wire_16bit_ = network_ && config.network_16bit_wire;
}

DataType GlooBackend::WireType(DataType dtype) const {
  const bool half = dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
  return half && wire_16bit_ ? dtype : HostReduceType(dtype);
}

void GlooBackend::CountNetwork(int64_t elements, size_t wire_size) {
  if (!network_ || !stats_) return;
  stats_->network_allreduces.fetch_add(1, std::memory_order_relaxed);
  stats_->network_bytes.fetch_add(static_cast<uint64_t>(elements) * wire_size,
                                  std::memory_order_relaxed);
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

std::vector<GlooBackend::Piece> GlooBackend::CollectPieces(const Response& r,
                                                           std::vector<ExecUnit>& units,
                                                           double pre, int64_t* total) {
  const size_t esize = DataTypeSize(r.dtype);
  std::vector<Piece> pieces;
  size_t joined = 0;
  *total = 0;
  for (auto& u : units) {
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const int64_t count = ShapeElements(u.unit->shapes[t]);
      if (u.entry) {
        pieces.push_back({static_cast<const char*>(u.entry->inputs[t].data),
                          static_cast<char*>(u.entry->outputs[t].data), count, pre, *total,
                          nullptr});
      } else {
        // A joined rank contributes the op's identity and keeps nothing.
        if (joined_buffers_.size() <= joined) {
          joined_buffers_.push_back(std::make_unique<HostScratch>());
        }
        char* z = joined_buffers_[joined++]->Reserve(static_cast<size_t>(count) * esize);
        FillIdentity(z, count, r.dtype, r.reduce_op);
        pieces.push_back({z, z, count, 1.0, *total, nullptr});
      }
      *total += count;
    }
  }
  return pieces;
}

void GlooBackend::Allreduce(const Response& r, std::vector<ExecUnit>& units) {
  if (r.reduce_op == ReduceOp::kAdasum) {
    return Timed("GLOO_ADASUM_ALLREDUCE", [&] { adasum_->Allreduce(r, units); });
  }
  double pre, post;
  ReduceScales(r, size_, &pre, &post);
  int64_t total = 0;
  std::vector<Piece> pieces = CollectPieces(r, units, pre, &total);
  // By size alone, as on MPI: a joined rank reduces in place while the others
  // read their inputs, and every rank must take the same steps.
  if (hierarchy_ && size_ > 1 && total > 0 && hierarchy_->UseAllreduce(total)) {
    NodeAwareAllreduce(r, pieces, total, post);
    if (stats_) stats_->hierarchical_allreduces.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  RingAllreduce(r, pieces, total, post);
}

void GlooBackend::RingAllreduce(const Response& r, std::vector<Piece>& pieces, int64_t total,
                                double post) {
  const size_t esize = DataTypeSize(r.dtype);
  const DataType wire = WireType(r.dtype);
  const size_t wsize = DataTypeSize(wire);
  const bool post_in_double = PostInDouble(r.reduce_op);
  // Large tensors (and a lone one) are reduced where their outputs lie; the
  // others, and every widened 16-bit float, are packed into the fusion
  // buffer, consecutive ones into one part.
  auto direct = [&](const Piece& p) {
    return wire == r.dtype &&
           (pieces.size() == 1 || p.count * static_cast<int64_t>(esize) >= inplace_min_bytes_);
  };
  int64_t packed_total = 0;
  for (const auto& p : pieces) packed_total += direct(p) ? 0 : p.count;
  char* fusion = scratch_a_.Reserve(static_cast<size_t>(std::max<int64_t>(packed_total, 1)) *
                                    wsize);
  std::vector<GlooRing::Part> parts;
  int64_t at = 0;
  bool packing = false;  // the last part is in the fusion buffer
  for (auto& p : pieces) {
    if (direct(p)) {
      parts.push_back({p.first, p.out});
      packing = false;
    } else {
      p.packed = fusion + at * wsize;
      at += p.count;
      if (!packing) parts.push_back({p.first, p.packed});
      packing = true;
    }
  }
  // fn(piece, its first element in the range, elements) for every piece
  // overlapping [first, first + n).
  auto overlapping = [&](int64_t first, int64_t n, auto&& fn) {
    size_t k = static_cast<size_t>(
        std::upper_bound(pieces.begin(), pieces.end(), first,
                         [](int64_t v, const Piece& p) { return v < p.first; }) -
        pieces.begin()) - 1;
    for (; k < pieces.size() && pieces[k].first < first + n; ++k) {
      const Piece& p = pieces[k];
      const int64_t lo = std::max(first, p.first), hi = std::min(first + n, p.first + p.count);
      if (hi > lo) fn(p, lo - p.first, hi - lo);
    }
  };
  GlooRing::Hooks hooks;
  // Fill: this rank's values, prescaled, in place (a copy from an
  // out-of-place input) or packed (widened).
  hooks.fill = [&](int64_t first, int64_t n) {
    overlapping(first, n, [&](const Piece& p, int64_t k, int64_t c) {
      if (p.packed) {
        ConvertScale(p.packed + k * wsize, wire, p.in + k * esize, r.dtype, c, p.pre);
      } else if (p.in != p.out || p.pre != 1.0) {
        ScaleCopy(p.out + k * esize, p.in + k * esize, c, r.dtype, p.pre);
      }
    });
  };
  // Settle: the postscale of what is reduced in place, once, by the rank that
  // finished it (the others receive the scaled values).
  if (post != 1.0) {
    hooks.settle = [&](int64_t first, int64_t n) {
      overlapping(first, n, [&](const Piece& p, int64_t k, int64_t c) {
        if (!p.packed) {
          ScaleCopy(p.out + k * esize, p.out + k * esize, c, r.dtype, post, post_in_double);
        }
      });
    };
  }
  // Drain: the packed ones out of the fusion buffer, postscaled (narrowed).
  if (packed_total > 0) {
    hooks.drain = [&](int64_t first, int64_t n) {
      overlapping(first, n, [&](const Piece& p, int64_t k, int64_t c) {
        if (p.packed) {
          ConvertScale(p.out + k * esize, r.dtype, p.packed + k * wsize, wire, c, post,
                       post_in_double);
        }
      });
    };
  }
  const HostReduceFn reduce = HostReduceFor(wire, r.reduce_op);
  Timed("GLOO_ALLREDUCE", [&] { ring_.Allreduce(parts, total, wsize, reduce, hooks); });
  CountNetwork(total, wsize);
}

void GlooBackend::NodeAwareAllreduce(const Response& r, std::vector<Piece>& pieces,
                                     int64_t total, double post) {
  const DataType wire = WireType(r.dtype);
  CountNetwork(total, DataTypeSize(wire));
  const size_t wsize = DataTypeSize(wire);
  const bool post_in_double = PostInDouble(r.reduce_op);
  if (pieces.size() == 1 && wire == r.dtype) {
    const Piece& p = pieces[0];
    if (p.in != p.out || p.pre != 1.0) {
      Timed("PRESCALE", [&] { ScaleCopy(p.out, p.in, p.count, r.dtype, p.pre); });
    }
    Timed("GLOO_ALLREDUCE", [&] { hierarchy_->Allreduce(p.out, p.count, r.dtype, r.reduce_op); });
    if (post != 1.0) {
      Timed("POSTSCALE", [&] {
        ScaleCopy(p.out, p.out, p.count, r.dtype, post, post_in_double);
      });
    }
    return;
  }
  // Fused or 16-bit: pack (widening, prescaling), reduce once, unpack.
  char* buf = scratch_a_.Reserve(static_cast<size_t>(total) * wsize);
  Timed("MEMCPY_IN_FUSION_BUFFER", [&] {
    for (const auto& p : pieces) {
      ConvertScale(buf + p.first * wsize, wire, p.in, r.dtype, p.count, p.pre);
    }
  });
  Timed("GLOO_ALLREDUCE", [&] { hierarchy_->Allreduce(buf, total, wire, r.reduce_op); });
  Timed("MEMCPY_OUT_FUSION_BUFFER", [&] {
    for (const auto& p : pieces) {
      ConvertScale(p.out, r.dtype, buf + p.first * wsize, wire, p.count, post, post_in_double);
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
