#include "ops/gpu_backends.h"

#include "ops/gloo_ops.h"
#include "ops/gpu_adasum_peers.h"
#include "ops/gpu_staging_ops.h"
#include "ops/mpi_ops.h"
#include "ops/nccl_ops.h"
#include "ops/node_layout.h"
#include "transport/gloo_set_channel.h"
#include "transport/mpi_set_channel.h"

namespace hvdcompat {

namespace {

void Add(std::vector<std::unique_ptr<CollectiveBackend>>* backends,
         std::unique_ptr<CollectiveBackend> host, std::unique_ptr<SetChannel> channel,
         NodeAdasumPeersFactory adasum_peers, const Config& config, GpuContext* gpu) {
  // Staging runs a host backend of its own (its scratch is its own).
  auto staged = std::make_unique<StagedGpuBackend>(std::move(host), gpu);
  if (config.gpu_operations_mpi) {
    backends->push_back(std::move(staged));
  } else {
    backends->push_back(std::make_unique<NcclBackend>(
        std::move(channel), std::move(adasum_peers), config, gpu, std::move(staged)));
  }
}

}  // namespace

void AddGpuBackends(std::vector<std::unique_ptr<CollectiveBackend>>* backends, MPI_Comm comm,
                    const MpiOps* mpi_ops, const Config& config, GpuContext* gpu) {
  if (!gpu) return;
  Add(backends, std::make_unique<MpiBackend>(comm, mpi_ops, config),
      std::make_unique<MpiSetChannel>(comm, config.hierarchical_local_size),
      [comm](const NodeGroups& groups) {
        return std::make_unique<MpiNodeAdasumPeers>(comm, groups);
      },
      config, gpu);
}

void AddGpuBackendsOnGloo(std::vector<std::unique_ptr<CollectiveBackend>>* backends,
                          std::shared_ptr<gloo::Context> context,
                          const std::vector<int>& global_ranks, const Config& config,
                          GpuContext* gpu) {
  if (!gpu) return;
  Add(backends, std::make_unique<GlooBackend>(context, config, global_ranks),
      std::make_unique<GlooSetChannel>(
          context, NodeLabels(global_ranks, config.rank_hosts, config.hierarchical_local_size)),
      [context](const NodeGroups& groups) {
        return std::make_unique<GlooNodeAdasumPeers>(context, groups);
      },
      config, gpu);
}

}  // namespace hvdcompat
