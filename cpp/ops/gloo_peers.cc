#include "ops/gloo_peers.h"

#include "transport/control_transport.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"

namespace hvdcompat {

namespace {

// The data plane's tag (ops/gloo_ops.cc: the control transport uses tags below it).
constexpr uint32_t kDataTag = 100;

}  // namespace

GlooPeers::GlooPeers(std::shared_ptr<gloo::Context> context, uint8_t slot_prefix)
    : context_(std::move(context)),
      slot_(gloo::Slot::build(slot_prefix, kDataTag)),
      rank_(context_->rank),
      size_(context_->size) {}

GlooPeers::~GlooPeers() = default;

void GlooPeers::PostSend(const void* data, size_t bytes, int peer) {
  if (bytes == 0) return;
  sends_.push_back(context_->createUnboundBuffer(const_cast<void*>(data), bytes));
  sends_.back()->send(peer, slot_);
}

void GlooPeers::PostRecv(void* data, size_t bytes, int peer) {
  if (bytes == 0) return;
  recvs_.push_back(context_->createUnboundBuffer(data, bytes));
  recvs_.back()->recv(peer, slot_);
}

void GlooPeers::Wait() {
  // Receives first: a peer's receive may be what lets our send complete.
  for (auto& b : recvs_) {
    if (!b->waitRecv()) throw CommunicationError("Gloo: a receive was aborted");
  }
  for (auto& b : sends_) {
    if (!b->waitSend()) throw CommunicationError("Gloo: a send was aborted");
  }
  recvs_.clear();
  sends_.clear();
}

void GlooPeers::SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                         size_t recv_bytes, int from) {
  PostSend(send, send_bytes, to);
  PostRecv(recv, recv_bytes, from);
  Wait();
}

}  // namespace hvdcompat
