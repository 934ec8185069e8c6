// CUDA-buffer collectives over NCCL. See Note [NCCL lanes] and, for the
// stream rules, Note [GPU stream order] (cpp/gpu/gpu_events.h).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/env.h"
#include "gpu/device_memory.h"
#include "gpu/gpu_context.h"
#include "gpu/gpu_watchdog.h"
#include "gpu/nccl_comm.h"
#include "gpu/nccl_reduce.h"
#include "ops/adasum.h"
#include "ops/gpu_adasum_peers.h"
#include "ops/node_layout.h"
#include "ops/collective_layout.h"
#include "ops/backend.h"
#include "transport/set_channel.h"

namespace hvdcompat {

// Note [NCCL lanes]
// A lane is one CUDA stream with its own NCCL communicator (plus, for the
// hierarchical allreduce, a node-local and a cross-node one) and its own
// device fusion buffer. HOROVOD_NUM_NCCL_STREAMS lanes are used round-robin,
// one fused response each, so consecutive collectives can overlap on the
// device; every rank picks the same lane for the same response because all
// ranks execute responses in the same order. A communicator is never used
// from two streams, which NCCL forbids. Launches hold the device's launch
// lock (Note [NCCL calls from several threads]), which lanes share: one
// worker drives them all, so the lock only orders them against other sets.
//
// Everything is set up by the first CUDA response (collective over the
// set): the device, every rank's NCCL version (features are used only when
// the oldest copy in the set has them), a check that no two ranks of a node
// share a GPU, the lanes and their communicators, whose unique ids travel
// over the set's channel, MPI or Gloo (Note [NCCL bootstrap without MPI],
// gpu/nccl_comm.h). The hierarchical allreduce's node-local and cross-node
// communicators group the set's ranks by SetChannel::NodeLabels.
//
// What NCCL cannot reduce goes to the host-staged backend instead (int16;
// Min/Max/Product or integer dtypes with scale factors; bfloat16 before NCCL
// 2.10.3; scale factors before 2.11). Sum/Average scaling is folded into one
// NCCL operator: result = prescale * postscale * (1/size for Average) *
// sum(x), computed by ncclAvg or a PreMulSum operator, so no kernel of our
// own is needed. With PreMulSum the scalar is rounded to the tensor's dtype,
// as ncclAvg does, so float16/bfloat16 averages carry one extra rounding.
//
// Note [GPU Adasum]
// op=Adasum on CUDA buffers keeps Horovod's shape: inside each node the
// ranks' tensors are summed by an NCCL reduce-scatter (each rank gets 1/L of
// the padded fused buffer, L ranks per node), every rank copies its shard to
// host memory, scales it by prescale * postscale / L (the node's average;
// Adasum's coefficients do not change when both operands are scaled), and
// the ranks holding the same shard on different nodes combine it by Adasum
// (ops/adasum.h over ops/gpu_adasum_peers.h: MPI messages on the MPI
// controller, Gloo's on the Gloo controller, with partial dot products also
// summed over the node's ranks, so each tensor's coefficients are those of
// the whole tensor); an NCCL allgather inside the node reassembles the
// result. On one node that is the node's average; with one rank per node it
// is the host Adasum over every rank. Nodes must run the same number of
// ranks; any number of nodes works (Note [Adasum with any number of ranks]).
// Where NCCL cannot carry the dtype (bfloat16 before 2.10.3) the response
// goes to the host-staged backend, which runs Adasum over every rank.
//
// Uneven allgather (first dimensions differ between ranks) costs one NCCL
// collective, not one broadcast per rank: an allgather of blocks padded to
// the largest while that moves at most twice the payload, else one group of
// send/receive pairs (one kernel), so launches do not grow with the set.
class NcclBackend : public CollectiveBackend {
 public:
  // `channel` carries the set's host-side exchanges (owned here);
  // `adasum_peers` makes GPU Adasum's cross-node transport on the same
  // controller; `fallback` runs the responses NCCL cannot (owned here).
  NcclBackend(std::unique_ptr<SetChannel> channel, NodeAdasumPeersFactory adasum_peers,
              const Config& config, GpuContext* gpu,
              std::unique_ptr<CollectiveBackend> fallback);
  // The fallback's host waits end with it; NCCL's own waits have the watchdog.
  void SetAbortFlag(const std::atomic<bool>* abort) override { fallback_->SetAbortFlag(abort); }
  ~NcclBackend() override;

  const char* name() const override { return "NCCL"; }
  bool CanExecute(const Response& r) const override { return r.device != kCpuDevice; }
  // Aborts every lane's communicators (ncclCommAbort; Note [Elastic reset]).
  // Any thread; a launch in progress finishes first (NcclComm::Abort).
  void Abandon(const std::string& why) override;
  // Issues the collective on a lane and attaches a completion to every
  // entry's result; does not wait for the device.
  void Execute(const Response& r, std::vector<ExecUnit>& units) override;

 private:
  struct Lane {
    cudaStream_t stream = nullptr;
    std::shared_ptr<StreamLife> life;  // `stream` as the frees of outputs see it
    std::shared_ptr<NcclComm> comm;   // the whole set
    std::shared_ptr<NcclComm> local;  // hierarchical: this node's ranks
    std::shared_ptr<NcclComm> cross;  // hierarchical: same local rank on each node
    DeviceScratch fusion;
    DeviceScratch padded;  // uneven allgather: blocks padded to the largest
    PinnedScratch host;  // identity values of joined ranks
    std::vector<std::shared_ptr<AsyncErrorSource>> sources;
  };

  void Setup();
  // groups_ and nodes_even_ from the channel's node labels (once).
  void LayOutNodes();
  // A communicator over this rank's node ("local") or over the ranks of its
  // local rank on every node ("cross"); collective over the set.
  std::shared_ptr<NcclComm> NodeComm(bool local, const std::string& what);
  void SetupHierarchy();
  bool Supports(const Response& r) const;
  NcclReducePlan Plan(const Response& r, bool hierarchical) const;

  void Allreduce(const Response& r, std::vector<ExecUnit>& units, Lane& lane);
  // Note [GPU Adasum] (ops/nccl_adasum.cc).
  void AdasumAllreduce(const Response& r, std::vector<ExecUnit>& units, Lane& lane);
  // Its steps: the node layout and cross-node transport (collective, once)
  // and the lane's node communicator; then this rank's shard (`chunk`
  // elements at `mine` on the device) combined across nodes on the host.
  void SetupAdasum(const Response& r, Lane& lane);
  void AdasumAcrossNodes(const Response& r, char* mine, int64_t chunk,
                         const std::vector<int64_t>& counts, Lane& lane);
  void HierarchicalAllreduce(const Response& r, const NcclReducePlan& plan, char* buf,
                             int64_t padded, Lane& lane);
  void JoinedContribution(const Response& r, char* dst, int64_t count, Lane& lane);
  void Broadcast(const Response& r, std::vector<ExecUnit>& units, Lane& lane);
  void Allgather(const Response& r, std::vector<ExecUnit>& units, Lane& lane);
  // Gathers every rank's block of `g` (bytes) into `base`, where this rank's
  // block already sits at its offset, or, when `send` is given, is read there.
  void GatherBlocks(const GatherLayout& g, char* base, const char* send, Lane& lane);
  // Copies the rank-major blocks of a fused allgather from `buf` to the outputs.
  void UnpackGathered(const GatherLayout& g, const char* buf, const std::vector<char*>& outs,
                      Lane& lane);
  void Alltoall(const Response& r, std::vector<ExecUnit>& units, Lane& lane);
  void Reducescatter(const Response& r, std::vector<ExecUnit>& units, Lane& lane);
  void CopyDevice(void* dst, const void* src, size_t bytes, Lane& lane);

  std::unique_ptr<SetChannel> channel_;  // worker thread only
  NodeAdasumPeersFactory make_adasum_peers_;
  Config config_;
  GpuContext* gpu_;
  std::unique_ptr<CollectiveBackend> fallback_;
  int rank_ = 0;
  int size_ = 1;

  bool ready_ = false;
  int device_ = -1;
  int version_ = 0;  // the lowest NCCL version in the set
  bool has_premul_ = false;
  std::shared_ptr<EventPool> events_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  // Guards lanes_'s membership and each lane's communicator pointers against
  // Abandon from another thread; the worker reads them without it (it is
  // the only writer).
  std::mutex lanes_mu_;
  bool abandoned_ = false;  // guarded by lanes_mu_
  size_t next_lane_ = 0;
  std::unique_ptr<CompletionWatchdog> watchdog_;  // with HOROVOD_ENABLE_ASYNC_COMPLETION

  bool hierarchical_ = false;
  bool laid_out_ = false;
  NodeGroups groups_;  // this rank's node and cross-node ranks, once laid out
  bool nodes_even_ = false;  // every node runs the same number of ranks
  int local_rank_ = 0;
  int local_size_ = 1;

  // GPU Adasum: the cross-node reduction and its host memory.
  std::unique_ptr<AdasumPeers> adasum_peers_;
  std::unique_ptr<Adasum> adasum_;  // over adasum_peers_
  PinnedScratch adasum_pinned_;
  HostScratch adasum_wide_;
};

}  // namespace hvdcompat
