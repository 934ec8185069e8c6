// A data-plane backend runs negotiated (possibly fused) responses. Backends
// are asked in registration order; the first that can execute a response
// runs it (MPI for host buffers; NCCL for CUDA buffers when loaded).
#pragma once

#include <vector>

#include "message.h"
#include "tensor_entry.h"

namespace hvdcompat {

// One response unit on this rank. `entry` is null on a rank that has joined
// (it contributes identity values and keeps no output).
struct ExecUnit {
  const ResponseUnit* unit;
  TensorEntry* entry;
};

class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;
  virtual const char* name() const = 0;
  virtual bool CanExecute(const Response& response) const = 0;
  // Runs the collective on every rank of the set; writes outputs and fills
  // entry->result (except status). Throws on failure.
  virtual void Execute(const Response& response, std::vector<ExecUnit>& units) = 0;
};

}  // namespace hvdcompat
