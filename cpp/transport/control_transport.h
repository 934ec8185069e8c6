// The collective control-plane primitives negotiation needs, over the ranks
// of one process set. Implemented over MPI (mpi_transport) and in memory for
// unit tests (fake_transport). Every call is collective: all ranks of the set
// make the same calls in the same order. Called only from the set's worker
// thread. Failures throw CommunicationError.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hvdcompat {

// A failure of the communication layer. `failed_ranks` lists the ranks of
// the communicator the failure was reported on that the library declared
// dead (fault-tolerant MPI only; empty when unknown).
class CommunicationError : public std::runtime_error {
 public:
  explicit CommunicationError(const std::string& what, std::vector<int> failed_ranks = {})
      : std::runtime_error(what), failed_ranks_(std::move(failed_ranks)) {}
  const std::vector<int>& failed_ranks() const { return failed_ranks_; }

 private:
  std::vector<int> failed_ranks_;
};

// Layout of the word vector combined in every cycle (see Note [Cycle words]).
struct FlagWords {
  static constexpr size_t kOr = 0;   // bitwise OR across ranks
  static constexpr size_t kAnd = 1;  // bitwise AND across ranks
  static constexpr size_t kMax = 2;  // maximum across ranks
  static constexpr size_t kHeader = 3;
  // then W words OR-ed (cache bits to invalidate), then W words AND-ed
  // (cache bits ready on this rank).
  static size_t Size(size_t w) { return kHeader + 2 * w; }
  static size_t NumCacheWords(size_t total) { return (total - kHeader) / 2; }
  // Combines `in` into `inout` (both of `n` words) with the rules above.
  static void Combine(uint64_t* inout, const uint64_t* in, size_t n);
};

// GatherBlobs' framing, the same on every transport: each rank's blob goes
// in a slot of `max_bytes` + 4 bytes, its length (uint32) first.
size_t BlobSlotBytes(size_t max_bytes);
// Writes `mine` framed into `slot` (resized to BlobSlotBytes(max_bytes)).
void FrameBlob(const std::string& mine, size_t max_bytes, std::vector<char>* slot);
// Reads `size` framed slots from `gathered` into `all` (indexed by rank).
void UnframeBlobs(const std::vector<char>& gathered, size_t max_bytes, int size,
                  std::vector<std::string>* all);

class ControlTransport {
 public:
  virtual ~ControlTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Combines `words` across ranks in place (FlagWords rules).
  virtual void CombineFlags(std::vector<uint64_t>& words) = 0;
  // Root (rank 0) receives every rank's blob in `all` (indexed by rank);
  // no blob is longer than `max_bytes`, which is the same on every rank.
  virtual void GatherBlobs(const std::string& mine, size_t max_bytes,
                           std::vector<std::string>* all) = 0;
  // Rank 0's `blob` is copied to every rank.
  virtual void BroadcastBlob(std::string* blob) = 0;
};

}  // namespace hvdcompat
