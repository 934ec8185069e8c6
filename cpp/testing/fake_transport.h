// In-memory ControlTransport for unit tests: the ranks of a process set are
// threads of one process sharing a FakeNetwork. Each collective is two
// rendezvous: everyone deposits, then everyone reads.
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include "transport/control_transport.h"

namespace hvdcompat {

class FakeNetwork {
 public:
  explicit FakeNetwork(int size);
  int size() const { return size_; }
  // Blocks until all `size` ranks called it (reusable).
  void Rendezvous();

  std::vector<std::vector<uint64_t>> words;
  std::vector<std::string> blobs;

 private:
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
};

class FakeTransport : public ControlTransport {
 public:
  FakeTransport(FakeNetwork* net, int rank) : net_(net), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return net_->size(); }
  void CombineFlags(std::vector<uint64_t>& words) override;
  void GatherBlobs(const std::string& mine, size_t max_bytes,
                   std::vector<std::string>* all) override;
  void BroadcastBlob(std::string* blob) override;

 private:
  FakeNetwork* net_;
  int rank_;
};

}  // namespace hvdcompat
