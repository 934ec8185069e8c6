// The job-wide communication the API thread needs (hvd.init's agreement,
// process-set rounds, topology), whichever controller carries it: MPI
// (MpiContext) or Gloo (GlooJob). Every call is collective over the job's
// ranks, made in the same order on every rank, from one thread at a time.
// Failures throw (LibraryError / CommunicationError).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hvdcompat {

struct JobTopology {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int cross_rank = 0, cross_size = 1;
  bool homogeneous = true;
  bool threads_supported = true;
  std::vector<std::string> hosts;  // host name of every rank, by rank
};

// Fills local/cross ranks from the host names (ranks on one host are local;
// cross rank = index of the host among the hosts with a rank of that local
// rank, in rank order), and homogeneous.
void TopologyFromHosts(JobTopology* t);

class JobComm {
 public:
  virtual ~JobComm() = default;
  virtual const char* controller() const = 0;  // "mpi" or "gloo"
  virtual const JobTopology& topology() const = 0;
  // Every rank's `bytes` bytes at `mine` land in `all` (size * bytes), by rank.
  virtual void AllgatherFixed(const void* mine, size_t bytes, void* all) = 0;
  // Every rank's string, by rank.
  virtual std::vector<std::string> AllgatherStrings(const std::string& mine) = 0;
  // Element-wise minimum of `n` words across ranks, in place.
  virtual void AllreduceMin(uint64_t* words, int n) = 0;
};

}  // namespace hvdcompat
