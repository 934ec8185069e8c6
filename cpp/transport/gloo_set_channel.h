// SetChannel over a process set's Gloo context (the Gloo controller; Note
// [NCCL bootstrap without MPI], gpu/nccl_comm.h). Its calls wait on live
// peers without a time limit, as negotiation does: every rank reaches them
// in the same response, and a peer that died fails them through its closed
// sockets (Note [Lost peers on Gloo]).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/set_channel.h"

namespace gloo {
class Context;
}

namespace hvdcompat {

class GlooSetChannel : public SetChannel {
 public:
  // `context` is the set's (shared with its worker's other users, all on
  // the worker thread); `node_labels` every set rank's node, by set rank
  // (ops/node_layout.h's NodeLabels, as the Gloo backend's hierarchy has them).
  GlooSetChannel(std::shared_ptr<gloo::Context> context, std::vector<std::string> node_labels);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "Gloo"; }
  void AllgatherFixed(const void* mine, size_t bytes, void* all) override;
  std::vector<int64_t> AlltoallCounts(const std::vector<int64_t>& send) override;
  // The labels given at construction, with no communication.
  std::vector<std::string> NodeLabels() override { return node_labels_; }

 private:
  std::shared_ptr<gloo::Context> context_;
  std::vector<std::string> node_labels_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace hvdcompat
