// GPU Adasum's cross-node transport (Note [GPU Adasum], ops/nccl_ops.h): the
// ranks that hold the same shard on every node run Adasum among themselves,
// and each tensor's partial dot products are summed over the node's ranks
// (Note [Adasum peers], ops/adasum.h). One implementation per controller.
// Worker thread only.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <vector>

#include "ops/adasum.h"
#include "ops/adasum_mpi.h"
#include "ops/gloo_peers.h"
#include "ops/node_layout.h"

namespace hvdcompat {

// Makes the transport for this rank's node groups (collective over the set).
using NodeAdasumPeersFactory = std::function<std::unique_ptr<AdasumPeers>(const NodeGroups&)>;

// Over MPI: the set's communicator split into the node's ranks and the
// cross-node ranks (both owned, freed unless MPI was finalized).
class MpiNodeAdasumPeers : public AdasumPeers {
 public:
  // Collective over `comm` (the set's; not owned).
  MpiNodeAdasumPeers(MPI_Comm comm, const NodeGroups& groups);
  ~MpiNodeAdasumPeers() override;
  MpiNodeAdasumPeers(const MpiNodeAdasumPeers&) = delete;
  MpiNodeAdasumPeers& operator=(const MpiNodeAdasumPeers&) = delete;

  int rank() const override { return peers_->rank(); }
  int size() const override { return peers_->size(); }
  void Exchange(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                int peer) override {
    peers_->Exchange(send, send_bytes, recv, recv_bytes, peer);
  }
  bool shards() const override { return peers_->shards(); }
  void SumOverShards(double* values, int n) override { peers_->SumOverShards(values, n); }

 private:
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  std::unique_ptr<MpiAdasumPeers> peers_;
};

// Over Gloo: point-to-point messages on the set's context (a slot prefix of
// its own) with the cross-node ranks, and the dot products exchanged among
// the node's ranks and summed in node order, so every rank of the node gets
// the same bits.
class GlooNodeAdasumPeers : public AdasumPeers {
 public:
  GlooNodeAdasumPeers(std::shared_ptr<gloo::Context> context, const NodeGroups& groups);

  int rank() const override { return cross_rank_; }
  int size() const override { return static_cast<int>(cross_.size()); }
  void Exchange(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                int peer) override;
  bool shards() const override { return local_.size() > 1; }
  void SumOverShards(double* values, int n) override;

 private:
  GlooPeers peers_;
  std::vector<int> local_, cross_;  // set ranks
  int local_rank_ = 0, cross_rank_ = 0;
  std::vector<double> all_;
};

}  // namespace hvdcompat
