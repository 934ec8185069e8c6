// MPI for one runtime lifetime: initialises MPI when nobody has (thread level
// MULTIPLE), duplicates the job's communicator so user MPI traffic never
// interleaves with ours, and derives the local/cross topology.
// Used by the API thread only; workers get their own communicators.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "transport/job_comm.h"
#include "transport/mpi_util.h"

namespace hvdcompat {

class MpiContext : public JobComm {
 public:
  // `base`: the communicator to duplicate (MPI_COMM_WORLD when none was
  // given); `ranks`: when non-empty, only these ranks of `base` form the job
  // (every process must pass the same list; processes outside it get an
  // error).
  MpiContext(MPI_Comm base, const std::vector<int>& ranks);
  ~MpiContext() override;
  MpiContext(const MpiContext&) = delete;
  MpiContext& operator=(const MpiContext&) = delete;

  // Initialises MPI if needed; returns true when this call initialised it
  // (then the caller finalizes it at process exit).
  static bool EnsureInitialized(int* provided_thread_level);

  MPI_Comm comm() const { return comm_; }
  // A fresh duplicate of comm() for a worker (caller owns it).
  MPI_Comm Duplicate() const;
  const MpiOps& ops() const { return MpiOps::Get(); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int cross_rank() const { return cross_rank_; }
  int cross_size() const { return cross_size_; }
  bool homogeneous() const { return homogeneous_; }
  // Host name of every rank of comm() (MPI_Get_processor_name), by rank.
  const std::vector<std::string>& hosts() const { return hosts_; }
  bool threads_supported() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }

  const char* controller() const override { return "mpi"; }
  const JobTopology& topology() const override { return topology_; }
  void AllgatherFixed(const void* mine, size_t bytes, void* all) override;
  std::vector<std::string> AllgatherStrings(const std::string& mine) override;
  void AllreduceMin(uint64_t* words, int n) override;

 private:
  void GatherHosts();

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int local_rank_ = 0, local_size_ = 1;
  int cross_rank_ = 0, cross_size_ = 1;
  bool homogeneous_ = true;
  std::vector<std::string> hosts_;
  int thread_level_ = MPI_THREAD_SINGLE;
  JobTopology topology_;
};

}  // namespace hvdcompat
