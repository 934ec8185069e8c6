// Adasum allreduce of host buffers over MPI point-to-point messages: the
// MPI controller's transport for the shared algorithm of ops/adasum.h (Note
// [Adasum peers]).
#pragma once

#include <mpi.h>

#include <vector>

#include "ops/adasum.h"

namespace hvdcompat {

// MPI_Sendrecv with one peer of `comm`; with `dots_comm`, the partial dots
// are summed over it (the ranks holding the other shards).
class MpiAdasumPeers : public AdasumPeers {
 public:
  // Neither communicator is owned; `dots_comm` may be MPI_COMM_NULL.
  MpiAdasumPeers(MPI_Comm comm, MPI_Comm dots_comm);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Exchange(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                int peer) override;
  bool shards() const override { return dots_comm_ != MPI_COMM_NULL; }
  void SumOverShards(double* values, int n) override;

 private:
  MPI_Comm comm_;
  MPI_Comm dots_comm_;
  int rank_ = 0;
  int size_ = 1;
};

// Runs Adasum on one communicator. Worker thread only; every rank of the
// communicator must call the same reductions in the same order. Throws on
// MPI failure.
class AdasumMpi {
 public:
  // `dots_comm`: see Adasum::ReduceShardInPlace; MPI_COMM_NULL when every
  // rank of `comm` holds whole vectors. Neither communicator is owned.
  explicit AdasumMpi(MPI_Comm comm, MPI_Comm dots_comm = MPI_COMM_NULL)
      : peers_(comm, dots_comm), adasum_(&peers_) {}

  void ReduceInPlace(void* buf, DataType dtype, const std::vector<int64_t>& counts) {
    adasum_.ReduceInPlace(buf, dtype, counts);
  }
  void ReduceShardInPlace(void* shard, DataType dtype, const std::vector<int64_t>& counts,
                          int64_t lo, int64_t n) {
    adasum_.ReduceShardInPlace(shard, dtype, counts, lo, n);
  }
  void Allreduce(const Response& r, std::vector<ExecUnit>& units) { adasum_.Allreduce(r, units); }

 private:
  MpiAdasumPeers peers_;
  Adasum adasum_;  // after peers_: it uses them
};

}  // namespace hvdcompat
