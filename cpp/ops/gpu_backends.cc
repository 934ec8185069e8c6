#include "ops/gpu_backends.h"

#include "ops/gpu_staging_ops.h"
#include "ops/mpi_ops.h"
#include "ops/nccl_ops.h"

namespace hvdcompat {

void AddGpuBackends(std::vector<std::unique_ptr<CollectiveBackend>>* backends, MPI_Comm comm,
                    const MpiOps* mpi_ops, const Config& config, GpuContext* gpu) {
  if (!gpu) return;
  // Staging runs a host backend of its own (its scratch is its own).
  auto staged = std::make_unique<StagedGpuBackend>(
      std::make_unique<MpiBackend>(comm, mpi_ops, config), gpu);
  if (config.gpu_operations_mpi) {
    backends->push_back(std::move(staged));
  } else {
    backends->push_back(std::make_unique<NcclBackend>(comm, config, gpu, std::move(staged)));
  }
}

}  // namespace hvdcompat
