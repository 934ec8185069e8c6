#include "ops/nccl_ops.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "ops/cpu_kernels.h"
#include "gpu/gpu_check.h"
#include "gpu/nccl_reduce.h"
#include "core/logging.h"
#include "transport/mpi_util.h"

namespace hvdcompat {

namespace {

std::string Describe(const Response& r) {
  std::string s = std::string(OpTypeName(r.op)) + " of '" + r.units[0].name + "'";
  if (r.units.size() > 1) s += " and " + std::to_string(r.units.size() - 1) + " more (fused)";
  return s;
}

struct PeerInfo {
  int32_t version;
  int32_t device;
  char host[64];
  char bus[32];
};

}  // namespace

NcclBackend::NcclBackend(std::unique_ptr<SetChannel> channel,
                         NodeAdasumPeersFactory adasum_peers, const Config& config,
                         GpuContext* gpu, std::unique_ptr<CollectiveBackend> fallback)
    : channel_(std::move(channel)),
      make_adasum_peers_(std::move(adasum_peers)),
      config_(config),
      gpu_(gpu),
      fallback_(std::move(fallback)),
      rank_(channel_->rank()),
      size_(channel_->size()) {}

NcclBackend::~NcclBackend() {
  watchdog_.reset();  // it holds communicators; the drain below polls them instead
  if (!lanes_.empty()) {
    // Work still on the device refers to the fusion buffers: let it finish
    // (or fail, which aborts its communicator) before freeing anything.
    try {
      DeviceGuard guard(device_);
      for (auto& lane : lanes_) {
        if (!lane->stream) continue;
        try {
          DrainStream(events_, lane->stream, lane->sources, "NCCL lane shutdown");
        } catch (const std::exception& e) {
          // After Abandon the aborted communicators fail what was queued on them.
          if (abandoned_) {
            HVD_LOG(kDebug) << "GPU work queued before the reset was dropped: " << e.what();
          } else {
            HVD_LOG(kWarning) << "GPU work still in flight at shutdown failed: " << e.what();
          }
        }
      }
      std::lock_guard<std::mutex> lock(lanes_mu_);
      for (auto& lane : lanes_) {
        lane->comm.reset();
        lane->local.reset();
        lane->cross.reset();
        lane->sources.clear();
        lane->fusion.Release();
        lane->padded.Release();
        if (lane->life) lane->life->End();
        if (lane->stream) Cuda().StreamDestroy(lane->stream);
      }
      lanes_.clear();
    } catch (const std::exception& e) {
      HVD_LOG(kWarning) << "releasing the NCCL backend failed: " << e.what();
    }
  }
}

void NcclBackend::Setup() {
  const NcclApi& nccl = Nccl();
  device_ = gpu_->Device();
  events_ = gpu_->Events();
  DeviceGuard guard(device_);

  PeerInfo me{};
  me.version = nccl.version;
  me.device = device_;
  gethostname(me.host, sizeof(me.host) - 1);
  HVD_CUDA_CHECK(Cuda().DeviceGetPCIBusId(me.bus, static_cast<int>(sizeof(me.bus)) - 1, device_));
  std::vector<PeerInfo> peers(size_);
  channel_->AllgatherFixed(&me, sizeof(PeerInfo), peers.data());
  version_ = me.version;
  std::map<std::string, int> owner;
  std::ostringstream dup;
  for (int r = 0; r < size_; ++r) {
    version_ = std::min(version_, static_cast<int>(peers[r].version));
    std::string key = std::string(peers[r].host) + "|" + peers[r].bus;
    auto it = owner.find(key);
    if (it == owner.end()) {
      owner[key] = r;
    } else if (dup.tellp() == 0) {
      dup << "ranks " << it->second << " and " << r << " of this process set both use the GPU "
          << peers[r].bus << " (cuda:" << peers[r].device << ") on host " << peers[r].host;
    }
  }
  if (dup.tellp() != 0) {
    throw InvalidArgument(
        "GPU collectives over NCCL need one GPU per rank, but " + dup.str() +
        ". Expected each rank on its own device, cuda:<hvd.local_rank()>: call "
        "torch.cuda.set_device(hvd.local_rank()) before creating tensors. To share GPUs "
        "between ranks, set HOROVOD_GPU_OPERATIONS=MPI (collectives then go through host "
        "memory and " + std::string(channel_->name()) + ").");
  }
  has_premul_ = version_ >= kNcclVersionPreMulSum && nccl.RedOpCreatePreMulSum && nccl.RedOpDestroy;

  try {
    for (int64_t i = 0; i < config_.num_nccl_streams; ++i) {
      auto made = std::make_unique<Lane>();
      made->stream = CreateEngineStream();
      made->life = std::make_shared<StreamLife>(made->stream);
      Lane& lane = *made;
      {
        std::lock_guard<std::mutex> lock(lanes_mu_);
        lanes_.push_back(std::move(made));
      }
      auto comm = MakeNcclComm(*channel_, 0, rank_, size_, device_,
                               "NCCL communicator " + std::to_string(i) + " of this process set");
      std::lock_guard<std::mutex> lock(lanes_mu_);
      lane.comm = comm;
      lane.sources.push_back(lane.comm);
      if (abandoned_) comm->Release("the job is being rebuilt (elastic reset)");
    }
    if (config_.hierarchical_allreduce) SetupHierarchy();
  } catch (...) {
    std::lock_guard<std::mutex> lock(lanes_mu_);
    for (auto& lane : lanes_) {
      lane->sources.clear();
      lane->comm.reset();
      lane->local.reset();
      lane->cross.reset();
      if (lane->life) lane->life->End();
      if (lane->stream) Cuda().StreamDestroy(lane->stream);
    }
    lanes_.clear();
    throw;
  }
  if (config_.async_completion) {
    watchdog_ = std::make_unique<CompletionWatchdog>(config_.stall_shutdown_seconds);
  }
  HVD_LOG(kDebug) << "NCCL " << NcclVersionString(version_) << " on cuda:" << device_ << ", "
                  << lanes_.size() << " lane(s)" << (hierarchical_ ? ", hierarchical" : "");
  ready_ = true;
}

void NcclBackend::Abandon(const std::string& why) {
  std::vector<std::shared_ptr<NcclComm>> comms;
  {
    std::lock_guard<std::mutex> lock(lanes_mu_);
    if (abandoned_) return;
    abandoned_ = true;
    for (auto& lane : lanes_) {
      for (auto* c : {&lane->comm, &lane->local, &lane->cross}) {
        if (*c) comms.push_back(*c);
      }
    }
  }
  // Not under lanes_mu_: an abort may wait for a launch in progress.
  for (auto& c : comms) c->Release(why);
}

void NcclBackend::LayOutNodes() {
  if (laid_out_) return;
  const std::vector<std::string> labels = channel_->NodeLabels();
  HVD_ENFORCE_EQ(static_cast<int>(labels.size()), size_, "node labels of the set");
  groups_ = GroupByNode(labels, rank_);
  nodes_even_ = groups_.min_local == groups_.max_local;
  local_rank_ = groups_.local_rank;
  local_size_ = static_cast<int>(groups_.local.size());
  laid_out_ = true;
}

std::shared_ptr<NcclComm> NcclBackend::NodeComm(bool local, const std::string& what) {
  const std::vector<int>& members = local ? groups_.local : groups_.cross;
  return MakeNcclComm(*channel_, members.front(), local ? groups_.local_rank : groups_.cross_rank,
                      static_cast<int>(members.size()), device_, what);
}

void NcclBackend::SetupHierarchy() {
  LayOutNodes();
  hierarchical_ = nodes_even_ && local_size_ > 1 && groups_.cross.size() > 1;
  if (!hierarchical_) {
    HVD_LOG(kInfo) << "HOROVOD_HIERARCHICAL_ALLREDUCE: using the flat allreduce ("
                   << (nodes_even_ ? "one node, or one rank per node"
                                   : "nodes run different numbers of ranks")
                   << ")";
    return;
  }
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = *lanes_[i];
    auto local = NodeComm(true, "node-local NCCL communicator " + std::to_string(i));
    auto cross = NodeComm(false, "cross-node NCCL communicator " + std::to_string(i));
    std::lock_guard<std::mutex> lock(lanes_mu_);
    lane.local = local;
    lane.cross = cross;
    lane.sources.push_back(lane.local);
    lane.sources.push_back(lane.cross);
    if (abandoned_) {
      local->Release("the job is being rebuilt (elastic reset)");
      cross->Release("the job is being rebuilt (elastic reset)");
    }
  }
}

NcclReducePlan NcclBackend::Plan(const Response& r, bool hierarchical) const {
  return PlanNcclReduction(r, size_, version_, has_premul_, hierarchical);
}

bool NcclBackend::Supports(const Response& r) const {
  switch (r.op) {
    case OpType::kAllreduce:
      if (r.reduce_op == ReduceOp::kAdasum) {
        ncclDataType_t type;
        return NcclReduceType(r.dtype, version_, &type);
      }
      return Plan(r, false).supported;
    case OpType::kReducescatter:
      return Plan(r, false).supported;
    case OpType::kAllgather:
    case OpType::kBroadcast:
    case OpType::kAlltoall:
      return true;
    default:
      return false;
  }
}

void NcclBackend::Execute(const Response& r, std::vector<ExecUnit>& units) {
  if (!ready_) Setup();
  if (!Supports(r)) {
    fallback_->Execute(r, units);
    return;
  }
  DeviceGuard guard(device_);
  Lane& lane = *lanes_[next_lane_ % lanes_.size()];
  ++next_lane_;
  for (auto& u : units) {
    if (u.entry && u.entry->ready) u.entry->ready->MakeStreamWait(lane.stream);
  }
  switch (r.op) {
    case OpType::kAllreduce:
      if (r.reduce_op == ReduceOp::kAdasum) {
        AdasumAllreduce(r, units, lane);
      } else {
        Allreduce(r, units, lane);
      }
      break;
    case OpType::kBroadcast: Broadcast(r, units, lane); break;
    case OpType::kAllgather: Allgather(r, units, lane); break;
    case OpType::kAlltoall: Alltoall(r, units, lane); break;
    case OpType::kReducescatter: Reducescatter(r, units, lane); break;
    default: HVD_ENFORCE(false, "NCCL backend asked to run " << OpTypeName(r.op));
  }
  auto done = RecordCompletion(events_, lane.stream, Describe(r), lane.sources);
  if (watchdog_) watchdog_->Watch(done, Describe(r), lane.sources);
  for (auto& u : units) {
    if (u.entry) u.entry->result.device_done = done;
  }
}

void NcclBackend::CopyDevice(void* dst, const void* src, size_t bytes, Lane& lane) {
  if (bytes == 0 || dst == src) return;
  HVD_CUDA_CHECK(
      Cuda().MemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, lane.stream));
}

void NcclBackend::JoinedContribution(const Response& r, char* dst, int64_t count, Lane& lane) {
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(r.dtype);
  if (bytes == 0) return;
  const CudaApi& cuda = Cuda();
  if (r.reduce_op == ReduceOp::kSum || r.reduce_op == ReduceOp::kAverage) {
    HVD_CUDA_CHECK(cuda.MemsetAsync(dst, 0, bytes, lane.stream));
    return;
  }
  // Rare (a joined rank under Min/Max/Product): fill on the host and wait
  // for the copy, so the page-locked buffer is free again afterwards.
  char* host = lane.host.Reserve(bytes);
  FillIdentity(host, count, r.dtype, r.reduce_op);
  HVD_CUDA_CHECK(cuda.MemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, lane.stream));
  HVD_CUDA_CHECK(cuda.StreamSynchronize(lane.stream));
}

void NcclBackend::Allreduce(const Response& r, std::vector<ExecUnit>& units, Lane& lane) {
  const NcclApi& nccl = Nccl();
  const size_t esize = DataTypeSize(r.dtype);
  ncclDataType_t type;
  HVD_ENFORCE(NcclReduceType(r.dtype, version_, &type), "no NCCL type");
  struct Piece {
    const char* in;  // null: a joined rank's identity values
    char* out;
    int64_t count;
  };
  std::vector<Piece> pieces;
  int64_t total = 0;
  bool joined = false;
  for (auto& u : units) {
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      int64_t count = ShapeElements(u.unit->shapes[t]);
      if (u.entry) {
        pieces.push_back({static_cast<const char*>(u.entry->inputs[t].data),
                          static_cast<char*>(u.entry->outputs[t].data), count});
      } else {
        pieces.push_back({nullptr, nullptr, count});
        joined = true;
      }
      total += count;
    }
  }
  if (total == 0) return;
  const NcclReducePlan hplan = Plan(r, true);
  const bool hier = hierarchical_ && hplan.supported;
  const NcclReducePlan plan = hier ? hplan : Plan(r, false);
  if (!hier && !joined && pieces.size() == 1) {
    NcclComm::Launch launch(*lane.comm);
    ScopedRedOp op(plan, r.dtype, launch.get());
    HVD_NCCL_CHECK(launch.get(), nccl.AllReduce(pieces[0].in, pieces[0].out,
                                                static_cast<size_t>(total), type, op.get(),
                                                launch.get(), lane.stream));
    return;
  }
  // The hierarchical steps split the buffer evenly over the node's ranks; the
  // padding is reduced too, and ignored.
  const int64_t padded = hier ? (total + local_size_ - 1) / local_size_ * local_size_ : total;
  char* buf = lane.fusion.Reserve(static_cast<size_t>(padded) * esize, device_, lane.stream);
  int64_t at = 0;
  for (const auto& p : pieces) {
    if (p.in) {
      CopyDevice(buf + at * esize, p.in, static_cast<size_t>(p.count) * esize, lane);
    } else {
      JoinedContribution(r, buf + at * esize, p.count, lane);
    }
    at += p.count;
  }
  if (hier) {
    HierarchicalAllreduce(r, plan, buf, padded, lane);
  } else {
    NcclComm::Launch launch(*lane.comm);
    ScopedRedOp op(plan, r.dtype, launch.get());
    HVD_NCCL_CHECK(launch.get(), nccl.AllReduce(buf, buf, static_cast<size_t>(total), type,
                                                op.get(), launch.get(), lane.stream));
  }
  at = 0;
  for (const auto& p : pieces) {
    if (p.out) CopyDevice(p.out, buf + at * esize, static_cast<size_t>(p.count) * esize, lane);
    at += p.count;
  }
}

void NcclBackend::HierarchicalAllreduce(const Response& r, const NcclReducePlan& plan, char* buf,
                                        int64_t padded, Lane& lane) {
  const NcclApi& nccl = Nccl();
  ncclDataType_t type;
  HVD_ENFORCE(NcclReduceType(r.dtype, version_, &type), "no NCCL type");
  const size_t esize = DataTypeSize(r.dtype);
  const size_t chunk = static_cast<size_t>(padded / local_size_);
  char* mine = buf + static_cast<size_t>(local_rank_) * chunk * esize;
  {
    // 1. Inside the node: each rank ends up with the node's sum of its chunk
    //    (the whole scale factor is applied here, once per element).
    NcclComm::Launch launch(*lane.local);
    ScopedRedOp op(plan, r.dtype, launch.get());
    HVD_NCCL_CHECK(launch.get(), nccl.ReduceScatter(buf, mine, chunk, type, op.get(),
                                                    launch.get(), lane.stream));
  }
  {
    // 2. Across nodes, among the ranks holding the same chunk.
    NcclComm::Launch launch(*lane.cross);
    const ncclRedOp_t across = plan.premul ? ncclSum : plan.op;
    HVD_NCCL_CHECK(launch.get(), nccl.AllReduce(mine, mine, chunk, type, across, launch.get(),
                                                lane.stream));
  }
  {
    // 3. Inside the node again: everyone gathers every chunk.
    NcclComm::Launch launch(*lane.local);
    HVD_NCCL_CHECK(launch.get(),
                   nccl.AllGather(mine, buf, chunk, type, launch.get(), lane.stream));
  }
}

void NcclBackend::Broadcast(const Response& r, std::vector<ExecUnit>& units, Lane& lane) {
  const NcclApi& nccl = Nccl();
  const bool root = rank_ == r.root;
  struct Buf {
    const char* in;
    char* out;
    size_t bytes;
  };
  std::vector<Buf> bufs;
  size_t total = 0;
  for (auto& u : units) {
    HVD_ENFORCE(u.entry, "broadcast on a joined rank");
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const BufferDesc& in = u.entry->inputs[t];
      const BufferDesc& out = u.entry->outputs[t];
      bufs.push_back({static_cast<const char*>(in.data), static_cast<char*>(out.data),
                      out.Bytes()});
      total += out.Bytes();
    }
  }
  if (total == 0) return;
  if (bufs.size() == 1) {
    NcclComm::Launch launch(*lane.comm);
    // The send buffer is read on the root only; the root's output gets a copy.
    HVD_NCCL_CHECK(launch.get(),
                   nccl.Broadcast(root ? bufs[0].in : bufs[0].out, bufs[0].out, bufs[0].bytes,
                                  ncclUint8, r.root, launch.get(), lane.stream));
    return;
  }
  char* buf = lane.fusion.Reserve(total, device_, lane.stream);
  size_t at = 0;
  if (root) {
    for (const auto& b : bufs) {
      CopyDevice(buf + at, b.in, b.bytes, lane);
      at += b.bytes;
    }
  }
  {
    NcclComm::Launch launch(*lane.comm);
    HVD_NCCL_CHECK(launch.get(), nccl.Broadcast(buf, buf, total, ncclUint8, r.root, launch.get(),
                                                lane.stream));
  }
  at = 0;
  for (const auto& b : bufs) {
    if (!root || b.in != b.out) CopyDevice(b.out, buf + at, b.bytes, lane);
    at += b.bytes;
  }
}

}  // namespace hvdcompat
