#include "testing/fake_transport.h"

#include "core/common.h"

namespace hvdcompat {

FakeNetwork::FakeNetwork(int size) : words(size), blobs(size), size_(size) {}

void FakeNetwork::Rendezvous() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t gen = generation_;
  if (++waiting_ == size_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen; });
}

void FakeTransport::CombineFlags(std::vector<uint64_t>& words) {
  net_->words[rank_] = words;
  net_->Rendezvous();
  std::vector<uint64_t> acc = net_->words[0];
  for (int r = 1; r < size(); ++r) {
    HVD_ENFORCE_EQ(net_->words[r].size(), acc.size(), "ranks combined different word counts");
    FlagWords::Combine(acc.data(), net_->words[r].data(), acc.size());
  }
  net_->Rendezvous();
  words = acc;
}

void FakeTransport::GatherBlobs(const std::string& mine, size_t max_bytes,
                                std::vector<std::string>* all) {
  HVD_ENFORCE_LE(mine.size(), max_bytes, "blob above the agreed maximum");
  net_->blobs[rank_] = mine;
  net_->Rendezvous();
  if (rank_ == 0) *all = net_->blobs;
  net_->Rendezvous();
}

void FakeTransport::BroadcastBlob(std::string* blob) {
  if (rank_ == 0) net_->blobs[0] = *blob;
  net_->Rendezvous();
  if (rank_ != 0) *blob = net_->blobs[0];
  net_->Rendezvous();
}

}  // namespace hvdcompat
