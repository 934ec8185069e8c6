// Which backends run CUDA buffers, registered ahead of the host backend.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "core/env.h"
#include "gpu/gpu_context.h"
#include "transport/mpi_util.h"
#include "ops/backend.h"

namespace gloo {
class Context;
}

namespace hvdcompat {

// Appends the GPU data-plane backends for one process set on the MPI
// controller: NCCL (which hands what it cannot reduce to host staging), or
// host staging alone under HOROVOD_GPU_OPERATIONS=MPI (or GLOO, the same
// setting). Loads nothing: a CUDA response only exists once
// GpuContext::PrepareEnqueue found the libraries it needs.
void AddGpuBackends(std::vector<std::unique_ptr<CollectiveBackend>>* backends, MPI_Comm comm,
                    const MpiOps* mpi_ops, const Config& config, GpuContext* gpu);

// The same on the Gloo controller: NCCL with its unique ids (and GPU
// Adasum's cross-node step) carried over the set's Gloo context (Note [NCCL
// bootstrap without MPI], gpu/nccl_comm.h), host staging through the Gloo
// backend. `global_ranks`: the set's members (their hosts make the nodes).
void AddGpuBackendsOnGloo(std::vector<std::unique_ptr<CollectiveBackend>>* backends,
                          std::shared_ptr<gloo::Context> context,
                          const std::vector<int>& global_ranks, const Config& config,
                          GpuContext* gpu);

}  // namespace hvdcompat
