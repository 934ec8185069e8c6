#include "transport/gloo_transport.h"

#include <cstring>

#include "core/common.h"
#include "transport/gloo_context.h"
#include "gloo/allgatherv.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/context.h"
#include "gloo/gatherv.h"

namespace hvdcompat {

namespace {

constexpr size_t kFirstChunk = 4096;  // one broadcast carries small response lists whole
constexpr uint32_t kFlagsTag = 1, kGatherTag = 2, kBcastTag = 3;

}  // namespace

GlooTransport::GlooTransport(std::shared_ptr<gloo::Context> context)
    : context_(std::move(context)), rank_(context_->rank), size_(context_->size) {}

void GlooTransport::CombineFlags(std::vector<uint64_t>& words) {
  const size_t n = words.size();
  flags_all_.assign(n * static_cast<size_t>(size_), 0);
  try {
    gloo::AllgathervOptions o(context_);
    o.setInput(words.data(), n);
    o.setOutput(flags_all_.data(), std::vector<size_t>(size_, n));
    o.setTag(kFlagsTag);
    o.setTimeout(GlooIdleTimeout());
    gloo::allgatherv(o);
  } catch (const gloo::Exception& e) {
    ThrowGlooError("Gloo: the negotiation of ready tensors (flags allgather) on set rank " +
                       std::to_string(rank_),
                   e);
  }
  words.assign(flags_all_.begin(), flags_all_.begin() + n);
  for (int r = 1; r < size_; ++r) FlagWords::Combine(words.data(), flags_all_.data() + r * n, n);
}

void GlooTransport::GatherBlobs(const std::string& mine, size_t max_bytes,
                                std::vector<std::string>* all) {
  const size_t slot = BlobSlotBytes(max_bytes);
  FrameBlob(mine, max_bytes, &gather_send_);
  // Gloo reads the per-rank counts on every rank, so every rank names an output.
  gather_recv_.resize(slot * static_cast<size_t>(size_));
  try {
    gloo::GathervOptions o(context_);
    o.setInput(gather_send_.data(), slot);
    o.setOutput(gather_recv_.data(), std::vector<size_t>(size_, slot));
    o.setRoot(0);
    o.setTag(kGatherTag);
    o.setTimeout(GlooIdleTimeout());
    gloo::gatherv(o);
  } catch (const gloo::Exception& e) {
    ThrowGlooError("Gloo: the gather of new tensor requests to the coordinator on set rank " +
                       std::to_string(rank_),
                   e);
  }
  if (rank_ != 0) return;
  UnframeBlobs(gather_recv_, max_bytes, size_, all);
}

void GlooTransport::BroadcastBlob(std::string* blob) {
  auto bcast = [&](char* p, size_t n) {
    try {
      gloo::BroadcastOptions o(context_);
      o.setOutput(p, n);
      o.setRoot(0);
      o.setTag(kBcastTag);
      o.setTimeout(GlooIdleTimeout());
      gloo::broadcast(o);
    } catch (const gloo::Exception& e) {
      ThrowGlooError("Gloo: the broadcast of negotiated responses on set rank " +
                         std::to_string(rank_),
                     e);
    }
  };
  bcast_.assign(kFirstChunk, 0);
  uint64_t len = rank_ == 0 ? blob->size() : 0;
  const size_t head = kFirstChunk - sizeof(len);
  if (rank_ == 0) {
    std::memcpy(bcast_.data(), &len, sizeof(len));
    std::memcpy(bcast_.data() + sizeof(len), blob->data(), std::min<size_t>(len, head));
  }
  bcast(bcast_.data(), kFirstChunk);
  std::memcpy(&len, bcast_.data(), sizeof(len));
  if (rank_ != 0) blob->assign(bcast_.data() + sizeof(len), std::min<size_t>(len, head));
  if (len <= head) return;
  const size_t rest = len - head;
  bcast_.assign(rest, 0);
  if (rank_ == 0) std::memcpy(bcast_.data(), blob->data() + head, rest);
  bcast(bcast_.data(), rest);
  if (rank_ != 0) blob->append(bcast_.data(), rest);
}

}  // namespace hvdcompat
