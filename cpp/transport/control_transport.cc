#include "transport/control_transport.h"

#include <algorithm>
#include <cstring>

#include "core/common.h"

namespace hvdcompat {

void FlagWords::Combine(uint64_t* inout, const uint64_t* in, size_t n) {
  if (n < kHeader) return;
  inout[kOr] |= in[kOr];
  inout[kAnd] &= in[kAnd];
  inout[kMax] = std::max(inout[kMax], in[kMax]);
  size_t w = NumCacheWords(n);
  for (size_t i = 0; i < w; ++i) inout[kHeader + i] |= in[kHeader + i];
  for (size_t i = 0; i < w; ++i) inout[kHeader + w + i] &= in[kHeader + w + i];
}

size_t BlobSlotBytes(size_t max_bytes) { return max_bytes + sizeof(uint32_t); }

void FrameBlob(const std::string& mine, size_t max_bytes, std::vector<char>* slot) {
  HVD_ENFORCE_LE(mine.size(), max_bytes, "request blob larger than the agreed maximum");
  slot->assign(BlobSlotBytes(max_bytes), 0);
  const uint32_t len = static_cast<uint32_t>(mine.size());
  std::memcpy(slot->data(), &len, sizeof(len));
  if (!mine.empty()) std::memcpy(slot->data() + sizeof(len), mine.data(), mine.size());
}

void UnframeBlobs(const std::vector<char>& gathered, size_t max_bytes, int size,
                  std::vector<std::string>* all) {
  const size_t slot = BlobSlotBytes(max_bytes);
  all->assign(size, std::string());
  for (int r = 0; r < size; ++r) {
    const char* p = gathered.data() + slot * r;
    uint32_t n;
    std::memcpy(&n, p, sizeof(n));
    HVD_ENFORCE_LE(n, max_bytes, "corrupt request blob from rank " << r);
    (*all)[r].assign(p + sizeof(n), n);
  }
}

}  // namespace hvdcompat
