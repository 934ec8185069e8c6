// Point-to-point messages between the members of one Gloo context, for the
// algorithms the engine runs itself on the Gloo controller: Adasum (Note
// [Adasum peers], ops/adasum.h) and the hierarchical steps (Note
// [Hierarchical collectives on Gloo], ops/gloo_hierarchical_ops.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/adasum.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace hvdcompat {

// Sends and receives on one slot of `context` (the process set's): each user
// takes a slot prefix of its own, so its messages never meet another
// algorithm's; between two members, messages on a slot are matched in the
// order they were posted, which every rank keeps by running the same steps.
// A transfer of 0 bytes is skipped: both sides know every size, so the peer
// skips its side too. Worker thread only; failures throw gloo::Exception
// (GlooBackend labels them).
class GlooPeers {
 public:
  GlooPeers(std::shared_ptr<gloo::Context> context, uint8_t slot_prefix);
  ~GlooPeers();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Post a transfer with member `peer`; Wait() completes every posted one.
  void PostSend(const void* data, size_t bytes, int peer);
  void PostRecv(void* data, size_t bytes, int peer);
  void Wait();
  // Both at once, then Wait().
  void SendRecv(const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes,
                int from);

 private:
  std::shared_ptr<gloo::Context> context_;
  uint64_t slot_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends_, recvs_;
};

// Adasum's transport on the Gloo controller: GlooPeers with the peer on both sides.
class GlooAdasumPeers : public AdasumPeers {
 public:
  GlooAdasumPeers(std::shared_ptr<gloo::Context> context, uint8_t slot_prefix)
      : peers_(std::move(context), slot_prefix) {}
  int rank() const override { return peers_.rank(); }
  int size() const override { return peers_.size(); }
  void Exchange(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                int peer) override {
    peers_.SendRecv(send, static_cast<size_t>(send_bytes), peer, recv,
                    static_cast<size_t>(recv_bytes), peer);
  }

 private:
  GlooPeers peers_;
};

}  // namespace hvdcompat
