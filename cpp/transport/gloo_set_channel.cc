#include "transport/gloo_set_channel.h"

#include <cstring>

#include "core/common.h"
#include "transport/gloo_context.h"
#include "gloo/allgatherv.h"
#include "gloo/alltoallv.h"
#include "gloo/common/error.h"
#include "gloo/context.h"

namespace hvdcompat {

namespace {

// The control transport uses tags 1-3, the data backend 100 and up.
constexpr uint32_t kSetChannelTag = 50;

}  // namespace

GlooSetChannel::GlooSetChannel(std::shared_ptr<gloo::Context> context,
                               std::vector<std::string> node_labels)
    : context_(std::move(context)),
      node_labels_(std::move(node_labels)),
      rank_(context_->rank),
      size_(context_->size) {
  HVD_ENFORCE_EQ(static_cast<int>(node_labels_.size()), size_, "node labels of the set's ranks");
}

void GlooSetChannel::AllgatherFixed(const void* mine, size_t bytes, void* all) {
  if (bytes == 0) return;
  if (size_ == 1) {
    std::memcpy(all, mine, bytes);
    return;
  }
  try {
    gloo::AllgathervOptions o(context_);
    o.setInput(const_cast<char*>(static_cast<const char*>(mine)), bytes);
    o.setOutput(static_cast<char*>(all), std::vector<size_t>(size_, bytes));
    o.setTag(kSetChannelTag);
    o.setTimeout(GlooIdleTimeout());
    gloo::allgatherv(o);
  } catch (const gloo::Exception& e) {
    ThrowGlooError("Gloo: the GPU backend's allgather on set rank " + std::to_string(rank_) +
                       " of " + std::to_string(size_),
                   e);
  }
}

std::vector<int64_t> GlooSetChannel::AlltoallCounts(const std::vector<int64_t>& send) {
  HVD_ENFORCE_EQ(static_cast<int>(send.size()), size_, "alltoall counts");
  std::vector<int64_t> recv(size_);
  if (size_ == 1) return send;
  std::vector<int64_t> in = send;
  try {
    gloo::AlltoallvOptions o(context_);
    o.setInput(in.data(), std::vector<int64_t>(size_, 1));
    o.setOutput(recv.data(), std::vector<int64_t>(size_, 1));
    o.setTag(kSetChannelTag);
    o.setTimeout(GlooIdleTimeout());
    gloo::alltoallv(o);
  } catch (const gloo::Exception& e) {
    ThrowGlooError("Gloo: the GPU backend's alltoall of counts on set rank " +
                       std::to_string(rank_) + " of " + std::to_string(size_),
                   e);
  }
  return recv;
}

}  // namespace hvdcompat
