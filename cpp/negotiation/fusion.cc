#include "negotiation/fusion.h"

#include <new>

namespace hvdcompat {

bool Fusable(const Response& a, const Response& b) {
  if (a.is_error() || b.is_error()) return false;
  if (a.op != b.op) return false;
  if (a.op != OpType::kAllreduce && a.op != OpType::kAllgather && a.op != OpType::kBroadcast &&
      a.op != OpType::kReducescatter) {
    return false;
  }
  return a.dtype == b.dtype && a.device == b.device && a.reduce_op == b.reduce_op &&
         a.root == b.root && a.prescale == b.prescale && a.postscale == b.postscale;
}

std::vector<Response> FuseResponses(std::vector<Response> responses, int64_t threshold) {
  if (threshold <= 0 || responses.size() < 2) return responses;
  std::vector<Response> out;
  out.reserve(responses.size());
  int64_t fused_bytes = 0;
  for (auto& r : responses) {
    int64_t bytes = r.TotalBytes();
    if (!out.empty() && Fusable(out.back(), r) && fused_bytes + bytes <= threshold) {
      for (auto& u : r.units) out.back().units.push_back(std::move(u));
      fused_bytes += bytes;
      continue;
    }
    fused_bytes = bytes;
    out.push_back(std::move(r));
  }
  return out;
}

char* HostScratch::Reserve(size_t bytes) {
  if (bytes <= capacity_ && data_) return data_;
  std::free(data_);
  size_t rounded = ((std::max<size_t>(bytes, 64) + 4095) / 4096) * 4096;
  data_ = static_cast<char*>(std::aligned_alloc(64, rounded));
  if (!data_) {
    capacity_ = 0;
    throw std::bad_alloc();
  }
  capacity_ = rounded;
  return data_;
}

}  // namespace hvdcompat
