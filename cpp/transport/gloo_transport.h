// ControlTransport over a Gloo context (Note [Gloo controller],
// gloo_context.h). Waits on peers without a time limit, as negotiation does
// under MPI: a peer that is alive but elsewhere is not an error; one that
// died fails the call through its closed sockets.
#pragma once

#include <memory>
#include <vector>

#include "transport/control_transport.h"

namespace gloo {
class Context;
}

namespace hvdcompat {

class GlooTransport : public ControlTransport {
 public:
  explicit GlooTransport(std::shared_ptr<gloo::Context> context);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Gathers every rank's words to every rank and combines them there: the
  // FlagWords rules read words by position, so the words are never split
  // into segments as a reduction would.
  void CombineFlags(std::vector<uint64_t>& words) override;
  void GatherBlobs(const std::string& mine, size_t max_bytes,
                   std::vector<std::string>* all) override;
  void BroadcastBlob(std::string* blob) override;

 private:
  std::shared_ptr<gloo::Context> context_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<uint64_t> flags_all_;
  std::vector<char> gather_send_;
  std::vector<char> gather_recv_;
  std::vector<char> bcast_;
};

}  // namespace hvdcompat
