#include "transport/control_transport.h"

#include <algorithm>

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

}  // namespace hvdcompat
