#include "core/tuned_params.h"

#include <cstring>
#include <sstream>

#include "core/common.h"

namespace hvdcompat {

namespace {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T Take(const char** p) {
  T v;
  std::memcpy(&v, *p, sizeof(T));
  *p += sizeof(T);
  return v;
}

std::string Bytes(int64_t n) {
  std::ostringstream os;
  if (n >= (1 << 20)) {
    os << static_cast<double>(n) / (1 << 20) << " MiB";
  } else if (n >= (1 << 10)) {
    os << static_cast<double>(n) / (1 << 10) << " KiB";
  } else {
    os << n << " B";
  }
  return os.str();
}

constexpr uint8_t kHierAllreduce = 1 << 0;
constexpr uint8_t kHierAllgather = 1 << 1;
constexpr uint8_t kActive = 1 << 2;

}  // namespace

bool TunedParams::operator==(const TunedParams& o) const {
  return fusion_threshold_bytes == o.fusion_threshold_bytes && cycle_time_ms == o.cycle_time_ms &&
         fusion_chunk_bytes == o.fusion_chunk_bytes && max_call_bytes == o.max_call_bytes &&
         hierarchical_allreduce == o.hierarchical_allreduce &&
         hierarchical_allgather == o.hierarchical_allgather && active == o.active;
}

std::string TunedParams::ToString() const {
  std::ostringstream os;
  os << "fusion threshold " << Bytes(fusion_threshold_bytes) << ", cycle time " << cycle_time_ms
     << " ms, chunk " << Bytes(fusion_chunk_bytes) << ", call split " << Bytes(max_call_bytes)
     << ", hierarchical allreduce " << (hierarchical_allreduce ? "on" : "off")
     << ", hierarchical allgather " << (hierarchical_allgather ? "on" : "off");
  return os.str();
}

std::string EncodeTunedParams(const TunedParams& p) {
  std::string out;
  out.reserve(kTunedParamsBytes);
  Put<int64_t>(&out, p.fusion_threshold_bytes);
  Put<double>(&out, p.cycle_time_ms);
  Put<int64_t>(&out, p.fusion_chunk_bytes);
  Put<int64_t>(&out, p.max_call_bytes);
  uint8_t flags = (p.hierarchical_allreduce ? kHierAllreduce : 0) |
                  (p.hierarchical_allgather ? kHierAllgather : 0) | (p.active ? kActive : 0);
  Put<uint8_t>(&out, flags);
  out.append(kTunedParamsBytes - out.size(), '\0');
  return out;
}

TunedParams DecodeTunedParams(const char* data, size_t size) {
  HVD_ENFORCE_GE(size, kTunedParamsBytes, "truncated control message: tuned parameters");
  const char* p = data;
  TunedParams t;
  t.fusion_threshold_bytes = Take<int64_t>(&p);
  t.cycle_time_ms = Take<double>(&p);
  t.fusion_chunk_bytes = Take<int64_t>(&p);
  t.max_call_bytes = Take<int64_t>(&p);
  uint8_t flags = Take<uint8_t>(&p);
  t.hierarchical_allreduce = flags & kHierAllreduce;
  t.hierarchical_allgather = flags & kHierAllgather;
  t.active = flags & kActive;
  return t;
}

}  // namespace hvdcompat
