// Which backends run CUDA buffers, registered ahead of the host backend.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "core/env.h"
#include "gpu/gpu_context.h"
#include "transport/mpi_util.h"
#include "ops/backend.h"

namespace hvdcompat {

// Appends the GPU data-plane backends for one process set: NCCL (which
// hands what it cannot reduce to host staging), or host staging alone under
// HOROVOD_GPU_OPERATIONS=MPI. Loads nothing: a CUDA response only exists
// once GpuContext::PrepareEnqueue found the libraries it needs.
void AddGpuBackends(std::vector<std::unique_ptr<CollectiveBackend>>* backends, MPI_Comm comm,
                    const MpiOps* mpi_ops, const Config& config, GpuContext* gpu);

}  // namespace hvdcompat
