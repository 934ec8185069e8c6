// The small host-side exchanges a GPU backend makes among the ranks of its
// process set, on either controller: NCCL's unique ids (Note [NCCL bootstrap
// without MPI], gpu/nccl_comm.h), every rank's device and NCCL version, the
// node layout, and the counts of uneven collectives. MpiSetChannel carries
// them over the set's MPI communicator, GlooSetChannel over the set's Gloo
// context.
//
// Every call is collective over the set (every rank, same order) and is made
// from the set's worker thread only, between collectives. Failures throw
// CommunicationError (a peer failed) or LibraryError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hvdcompat {

class SetChannel {
 public:
  virtual ~SetChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "MPI" or "Gloo": what carries the exchanges, for messages.
  virtual const char* name() const = 0;
  // Every rank's `bytes` bytes at `mine` land in `all` (size * bytes), by set rank.
  virtual void AllgatherFixed(const void* mine, size_t bytes, void* all) = 0;
  // `send[j]` goes to set rank j; returns what each set rank sent this one.
  virtual std::vector<int64_t> AlltoallCounts(const std::vector<int64_t>& send) = 0;
  // Every set rank's node label: ranks with the same label share a node
  // (consecutive ranks by HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE when it is set;
  // otherwise MPI_COMM_TYPE_SHARED on MPI, the host name on Gloo, as the
  // host backends' hierarchical steps group them).
  virtual std::vector<std::string> NodeLabels() = 0;
};

}  // namespace hvdcompat
