#include "ops/mpi_network_ops.h"

#include <algorithm>
#include <climits>
#include <deque>
#include <sstream>

#include "core/logging.h"
#include "ops/collective_layout.h"
#include "ops/cpu_kernels.h"
#include "ops/mpi_16bit_ops.h"
#include "ops/mpi_hierarchical_ops.h"

namespace hvdcompat {

namespace {

enum PlanCode : int64_t { kPlanAuto = 0, kPlanHost = 1, kPlanNetwork = 2 };

PlanCode PlanOf(const std::string& plan) {
  if (plan == "host") return kPlanHost;
  if (plan == "network") return kPlanNetwork;
  return kPlanAuto;
}

std::string Mib(int64_t bytes) {
  std::ostringstream o;
  if (bytes % (1 << 20) == 0) {
    o << bytes / (1 << 20) << " MiB";
  } else {
    o << bytes << " bytes";
  }
  return o.str();
}

}  // namespace

struct NetworkAllreduce::Segment {
  struct Part {
    const NetworkPiece* piece;
    int64_t offset;  // elements into the piece
    int64_t count;
  };
  const void* src = MPI_IN_PLACE;  // MPI_IN_PLACE or the (unscaled) input
  char* dst = nullptr;             // reduced here (a tensor's output or a slot's buffer)
  int64_t count = 0;
  bool packed = false;
  bool hier = false;
  std::vector<Part> parts;  // packed: where each run of dst goes
  MPI_Request request = MPI_REQUEST_NULL;
};

struct NetworkAllreduce::Slot {
  HostScratch pack;
  HostScratch shard;
  std::vector<int> counts, displs;  // the node's shards of the segment (hierarchical)
  Segment seg;
  // What Allreduce is reducing now (the same for every segment of a call).
  DataType dtype = DataType::kFloat32;
  DataType wire = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double post = 1.0;
  bool post_in_double = false;
};

std::unique_ptr<NetworkAllreduce> NetworkAllreduce::Create(MPI_Comm comm, const MpiOps* ops,
                                                           const Config& config,
                                                           EngineStats* stats) {
  // The plan, segment size, depth and 16-bit wire are set rank 0's on every
  // rank already (Note [Plan knobs from set rank 0], engine/plan_agreement.h):
  // the pipeline's call sequence and types are the same on every rank.
  const int64_t kind = PlanOf(config.link_plan);
  if (kind == kPlanHost) return nullptr;
  int rank = 0;
  HVD_MPI_CHECK(comm, MPI_Comm_rank(comm, &rank));
  std::unique_ptr<NetworkAllreduce> plan(new NetworkAllreduce(comm, ops, config, stats));
  if (kind == kPlanAuto && plan->hosts_ < 2) return nullptr;
  if (rank == 0) {
    HVD_LOG(kInfo) << "host allreduce: " << plan->Describe();
  }
  return plan;
}

NetworkAllreduce::NetworkAllreduce(MPI_Comm comm, const MpiOps* ops, const Config& config,
                                   EngineStats* stats)
    : comm_(comm),
      ops_(ops),
      stats_(stats),
      wait_(WaitPolicy::ForData(config)),
      segment_bytes_(std::clamp<int64_t>(config.network_segment_bytes, 4096, int64_t{1} << 30)),
      depth_(static_cast<int>(std::clamp<int64_t>(config.network_pipeline_depth, 1, 64))),
      wire_16bit_(config.network_16bit_wire) {
  HVD_MPI_CHECK(comm_, MPI_Comm_rank(comm_, &rank_));
  HVD_MPI_CHECK(comm_, MPI_Comm_size(comm_, &size_));
  split_ = SplitByNode(comm_, rank_, config);
  int sizes[2] = {split_.local_size, -split_.local_size};  // min and -max local size
  HVD_MPI_CHECK(comm_, MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MIN, comm_));
  int leader = split_.local_rank == 0 ? 1 : 0;
  HVD_MPI_CHECK(comm_, MPI_Allreduce(&leader, &hosts_, 1, MPI_INT, MPI_SUM, comm_));
  homogeneous_ = sizes[0] == -sizes[1];
  const bool layered = homogeneous_ && split_.local_size > 1 && hosts_ > 1;
  hierarchical_ = layered && (config.hierarchical_allreduce_set ? config.hierarchical_allreduce
                                                                : true);
  // What one rank puts on the link per segment is the segment size: a
  // hierarchical segment is local_size shards of that size (and half as many
  // waits on the host's other ranks as with shards of segment / local_size).
  if (hierarchical_) segment_bytes_ = std::min<int64_t>(segment_bytes_ * split_.local_size, int64_t{1} << 30);
  for (int i = 0; i < depth_; ++i) slots_.push_back(std::make_unique<Slot>());
}

NetworkAllreduce::~NetworkAllreduce() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&split_.cross, &split_.local}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

std::string NetworkAllreduce::Describe() const {
  std::ostringstream o;
  o << "network plan, " << hosts_ << " host(s) x ";
  if (homogeneous_) {
    o << split_.local_size;
  } else {
    o << "uneven numbers of";
  }
  o << " rank(s), " << (hierarchical_ ? "hierarchical" : "flat") << ", segments of "
    << Mib(segment_bytes_);
  if (hierarchical_) o << " (" << Mib(segment_bytes_ / split_.local_size) << " per rank across hosts)";
  o << ", " << depth_
    << " in flight";
  return o.str();
}

void NetworkAllreduce::Wait(MPI_Request* request, const char* what) {
  WaitRequest(request, comm_, wait_, what);
}

MPI_Op NetworkAllreduce::OpFor(const Slot& slot) const {
  return Has16BitOp(slot.wire) ? Reduce16BitOp(slot.wire, slot.op) : ops_->Op(slot.op);
}

void NetworkAllreduce::Start(Segment& s, Slot& slot) {
  MPI_Datatype type = ops_->Type(slot.wire);
  MPI_Op op = OpFor(slot);
  const int n = static_cast<int>(s.count);  // segments are far below INT_MAX
  if (!s.hier) {
    HVD_MPI_CHECK(comm_, MPI_Iallreduce(s.src, s.dst, n, type, op, comm_, &s.request));
    return;
  }
  // Shard i of the host: n / L elements, the first n % L shards one more.
  slot.counts.resize(split_.local_size);
  slot.displs.resize(split_.local_size);
  int at = 0;
  for (int i = 0; i < split_.local_size; ++i) {
    slot.counts[i] = n / split_.local_size + (i < n % split_.local_size ? 1 : 0);
    slot.displs[i] = at;
    at += slot.counts[i];
  }
  const int mine = slot.counts[split_.local_rank];
  const size_t wsize = DataTypeSize(slot.wire);
  char* shard = slot.shard.Reserve(static_cast<size_t>(mine) * wsize);
  const void* send = s.src == MPI_IN_PLACE ? s.dst : s.src;
  MPI_Request req;
  HVD_MPI_CHECK(comm_, MPI_Ireduce_scatter(send, shard, slot.counts.data(), type, op, split_.local,
                                           &req));
  Wait(&req, "allreduce: reduce-scatter inside the host");
  HVD_MPI_CHECK(comm_, MPI_Iallreduce(MPI_IN_PLACE, shard, mine, type, op, split_.cross, &s.request));
  if (stats_) stats_->hierarchical_allreduces.fetch_add(1, std::memory_order_relaxed);
}

void NetworkAllreduce::Finish(Segment& s, Slot& slot) {
  Wait(&s.request, s.hier ? "allreduce of the host's shard across hosts" : "allreduce across hosts");
  if (s.hier) {
    MPI_Datatype type = ops_->Type(slot.wire);
    const int mine = slot.counts[split_.local_rank];
    MPI_Request req;
    HVD_MPI_CHECK(comm_, MPI_Iallgatherv(slot.shard.Reserve(static_cast<size_t>(mine) *
                                                             DataTypeSize(slot.wire)),
                                         mine, type, s.dst, slot.counts.data(),
                                         slot.displs.data(), type, split_.local, &req));
    Wait(&req, "allreduce: allgather inside the host");
  }
  if (s.packed) {
    const size_t esize = DataTypeSize(slot.dtype);
    const size_t wsize = DataTypeSize(slot.wire);
    int64_t at = 0;
    for (const auto& p : s.parts) {
      ConvertScale(p.piece->out + p.offset * esize, slot.dtype, s.dst + at * wsize, slot.wire,
                   p.count, slot.post, slot.post_in_double);
      at += p.count;
    }
  } else if (slot.post != 1.0) {
    ScaleCopy(s.dst, s.dst, s.count, slot.dtype, slot.post, slot.post_in_double);
  }
  if (stats_) {
    stats_->network_allreduces.fetch_add(1, std::memory_order_relaxed);
    stats_->network_bytes.fetch_add(static_cast<uint64_t>(s.count) * DataTypeSize(slot.wire),
                                    std::memory_order_relaxed);
  }
}

struct NetworkAllreduce::Pipeline {
  // What the call reduces (the same for each of its segments).
  DataType dtype = DataType::kFloat32;
  DataType wire = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double post = 1.0;
  bool post_in_double = false;
  size_t esize = 4, wsize = 4;
  // Slot seq % depth_ is free once segment seq - depth_ has finished (FIFO).
  std::deque<Slot*> inflight;
  int64_t seq = 0;
};

NetworkAllreduce::Slot& NetworkAllreduce::Acquire(Pipeline& pipe) {
  if (static_cast<int>(pipe.inflight.size()) == depth_) {
    Slot* oldest = pipe.inflight.front();
    pipe.inflight.pop_front();
    Finish(oldest->seg, *oldest);
  }
  Slot& slot = *slots_[static_cast<size_t>(pipe.seq++ % depth_)];
  slot.dtype = pipe.dtype;
  slot.wire = pipe.wire;
  slot.op = pipe.op;
  slot.post = pipe.post;
  slot.post_in_double = pipe.post_in_double;
  slot.seg = Segment();
  return slot;
}

void NetworkAllreduce::Launch(Pipeline& pipe, Slot& slot) {
  // A segment smaller than the host's rank count would leave shards empty.
  slot.seg.hier = hierarchical_ && slot.seg.count >= split_.local_size;
  Start(slot.seg, slot);
  pipe.inflight.push_back(&slot);
}

void NetworkAllreduce::Drain(Pipeline& pipe) {
  while (!pipe.inflight.empty()) {
    Slot* oldest = pipe.inflight.front();
    pipe.inflight.pop_front();
    Finish(oldest->seg, *oldest);
  }
}

void NetworkAllreduce::ReduceDirect(Pipeline& pipe, const NetworkPiece& p) {
  // Equal segments of at most segment_bytes_ (no short tail segment).
  const int64_t step = EqualCallElements(p.count, segment_bytes_, pipe.esize);
  for (int64_t off = 0; off < p.count; off += step) {
    const int64_t n = std::min(step, p.count - off);
    Slot& slot = Acquire(pipe);
    Segment& s = slot.seg;
    const char* in = p.in + off * pipe.esize;
    s.dst = p.out + off * pipe.esize;
    s.count = n;
    if (p.pre != 1.0) {
      ScaleCopy(s.dst, in, n, pipe.dtype, p.pre);
      s.src = MPI_IN_PLACE;
    } else {
      s.src = in == s.dst ? MPI_IN_PLACE : in;
    }
    Launch(pipe, slot);
  }
}

void NetworkAllreduce::ReducePacked(Pipeline& pipe,
                                    const std::vector<const NetworkPiece*>& packed) {
  const int64_t chunk = std::max<int64_t>(1, segment_bytes_ / static_cast<int64_t>(pipe.wsize));
  size_t pi = 0;
  int64_t poff = 0;
  while (pi < packed.size()) {
    Slot& slot = Acquire(pipe);
    Segment& s = slot.seg;
    s.packed = true;
    s.dst = slot.pack.Reserve(static_cast<size_t>(chunk) * pipe.wsize);
    int64_t filled = 0;
    while (pi < packed.size() && filled < chunk) {
      const NetworkPiece& p = *packed[pi];
      const int64_t n = std::min(p.count - poff, chunk - filled);
      if (n > 0) {
        ConvertScale(s.dst + filled * pipe.wsize, pipe.wire, p.in + poff * pipe.esize, pipe.dtype,
                     n, p.pre);
        s.parts.push_back({&p, poff, n});
        filled += n;
        poff += n;
      }
      if (poff >= p.count) {
        ++pi;
        poff = 0;
      }
    }
    if (filled == 0) {
      // Only empty tensors were left: nothing to send, the slot stays free.
      --pipe.seq;
      return;
    }
    s.count = filled;
    Launch(pipe, slot);
  }
}

void NetworkAllreduce::Allreduce(const std::vector<NetworkPiece>& pieces, DataType dtype,
                                 ReduceOp op, double post, bool post_in_double,
                                 int64_t inplace_min_bytes) {
  const DataType wire = wire_16bit_ && Has16BitOp(dtype) ? dtype : HostReduceType(dtype);
  Pipeline pipe;
  pipe.dtype = dtype;
  pipe.wire = wire;
  pipe.op = op;
  pipe.post = post;
  pipe.post_in_double = post_in_double;
  pipe.esize = DataTypeSize(dtype);
  pipe.wsize = DataTypeSize(wire);
  const bool widen = wire != dtype;
  std::vector<const NetworkPiece*> packed;
  for (const auto& p : pieces) {
    const bool direct = !widen && (pieces.size() == 1 ||
                                   static_cast<int64_t>(p.count * pipe.esize) >= inplace_min_bytes);
    if (direct) {
      ReduceDirect(pipe, p);
    } else {
      packed.push_back(&p);
    }
  }
  ReducePacked(pipe, packed);
  Drain(pipe);
}

}  // namespace hvdcompat
