#include "ops/adasum.h"

#include <algorithm>
#include <cstring>

#include "ops/cpu_kernels.h"

namespace hvdcompat {

Adasum::Adasum(AdasumPeers* peers) : peers_(peers), rank_(peers->rank()), size_(peers->size()) {
  while (core_size_ * 2 <= size_) core_size_ *= 2;
  extra_ = size_ - core_size_;
}

void Adasum::SumOverGroup(int core, int level) {
  const size_t n = dots_.size() * 3;
  send_dots_.resize(n);
  recv_dots_.resize(n);
  for (size_t t = 0; t < dots_.size(); ++t) {
    send_dots_[3 * t] = dots_[t].dot;
    send_dots_[3 * t + 1] = dots_[t].a_sq;
    send_dots_[3 * t + 2] = dots_[t].b_sq;
  }
  if (peers_->shards()) peers_->SumOverShards(send_dots_.data(), static_cast<int>(n));
  // Recursive doubling: after the step with c ^ l, the 2l ranks of that
  // sub-block hold the same sums (addition is commutative, so both partners
  // compute the same value bit for bit).
  for (int l = 1; l <= level; l <<= 1) {
    peers_->Exchange(send_dots_.data(), static_cast<int64_t>(n * sizeof(double)),
                     recv_dots_.data(), static_cast<int64_t>(n * sizeof(double)),
                     PeerRank(core ^ l));
    for (size_t i = 0; i < n; ++i) send_dots_[i] += recv_dots_[i];
  }
  for (size_t t = 0; t < dots_.size(); ++t) {
    dots_[t] = {send_dots_[3 * t], send_dots_[3 * t + 1], send_dots_[3 * t + 2]};
  }
}

void Adasum::CombineSegment(char* mine, const char* theirs, int64_t lo, int64_t n, bool mine_left,
                            int wa, int wb, int core, int level, DataType dtype) {
  const size_t es = DataTypeSize(dtype);
  const char* a = mine_left ? mine : theirs;
  const char* b = mine_left ? theirs : mine;
  const size_t tensors = counts_.size();
  dots_.assign(tensors, AdasumDots{});
  // Each tensor's slice of [lo, lo + n), as [first, last) per tensor.
  std::vector<std::pair<int64_t, int64_t>> slices(tensors);
  for (size_t t = 0; t < tensors; ++t) {
    const int64_t first = std::max(lo, offsets_[t]);
    const int64_t last = std::min(lo + n, offsets_[t] + counts_[t]);
    slices[t] = {first, last};
    if (last > first) {
      const size_t at = static_cast<size_t>(first - lo) * es;
      dots_[t] = AdasumPartialDots(a + at, b + at, last - first, dtype);
    }
  }
  if (level > 0 || peers_->shards()) SumOverGroup(core, level);
  for (size_t t = 0; t < tensors; ++t) {
    const int64_t first = slices[t].first, last = slices[t].second;
    if (last <= first) continue;
    double ca, cb;
    AdasumCoefficients(dots_[t], wa, wb, &ca, &cb);
    const size_t at = static_cast<size_t>(first - lo) * es;
    AdasumScaledAdd(mine + at, a + at, ca, b + at, cb, last - first, dtype);
  }
}

AdasumLayout AdasumLayoutOf(const std::vector<ExecUnit>& units) {
  AdasumLayout layout;
  for (const auto& u : units) {
    for (size_t t = 0; t < u.unit->shapes.size(); ++t) {
      const int64_t count = ShapeElements(u.unit->shapes[t]);
      if (u.entry) {
        layout.pieces.push_back({static_cast<const char*>(u.entry->inputs[t].data),
                                 static_cast<char*>(u.entry->outputs[t].data), count});
      } else {
        layout.pieces.push_back({nullptr, nullptr, count});
      }
      layout.counts.push_back(count);
      layout.total += count;
    }
  }
  return layout;
}

void Adasum::ReduceInPlace(void* buf, DataType dtype, const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  ReduceShardInPlace(buf, dtype, counts, 0, total);
}

void Adasum::ReduceShardInPlace(void* shard, DataType dtype, const std::vector<int64_t>& counts,
                                int64_t shard_lo, int64_t shard_n) {
  HVD_ENFORCE(dtype == DataType::kFloat32 || dtype == DataType::kFloat64,
              "Adasum reduces float32 or float64, got " << DataTypeName(dtype));
  counts_ = counts;
  offsets_.resize(counts.size());
  int64_t total = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    offsets_[t] = total;
    total += counts[t];
  }
  if (size_ == 1 || total == 0) return;
  const int64_t es = static_cast<int64_t>(DataTypeSize(dtype));
  // Element x of the buffer (shard_lo <= x < shard_lo + shard_n) is at at(x).
  char* const data = static_cast<char*>(shard);
  auto at = [&](int64_t x) { return data + (x - shard_lo) * es; };
  // Note [Adasum with any number of ranks]: fold the first 2E ranks in pairs.
  const bool folded = rank_ < 2 * extra_;
  // The fold receives a whole shard; a level at most the larger half.
  const int64_t recv_n = folded ? shard_n : shard_n - shard_n / 2;
  char* recv = recv_.Reserve(static_cast<size_t>(std::max<int64_t>(recv_n, 1) * es));
  int core;
  if (folded && (rank_ & 1)) {
    peers_->Exchange(data, shard_n * es, nullptr, 0, rank_ - 1);
    peers_->Exchange(nullptr, 0, data, shard_n * es, rank_ - 1);
    return;
  }
  if (folded) {
    core = rank_ / 2;
    peers_->Exchange(nullptr, 0, recv, shard_n * es, rank_ + 1);
    CombineSegment(data, recv, shard_lo, shard_n, /*mine_left=*/true, /*wa=*/1, /*wb=*/1, core,
                   /*level=*/0, dtype);
  } else {
    core = rank_ - extra_;
  }

  // Vector halving, distance doubling (Note [Adasum]).
  struct Segment {
    int64_t lo, n;
  };
  std::vector<Segment> parents;
  int64_t lo = shard_lo, n = shard_n;
  for (int level = 1; level < core_size_; level <<= 1) {
    const bool left = (core & level) == 0;
    const int64_t first_half = n / 2;
    const int64_t keep_lo = left ? lo : lo + first_half;
    const int64_t keep_n = left ? first_half : n - first_half;
    const int64_t give_lo = left ? lo + first_half : lo;
    peers_->Exchange(at(give_lo), (n - keep_n) * es, recv, keep_n * es, PeerRank(core ^ level));
    parents.push_back({lo, n});
    // The left operand is the core ranks [base, base + level), the right the
    // next `level` of them (Note [Adasum weights]).
    const int base = core & ~(2 * level - 1);
    CombineSegment(at(keep_lo), recv, keep_lo, keep_n, left, RanksOf(base, base + level),
                   RanksOf(base + level, base + 2 * level), core, level, dtype);
    lo = keep_lo;
    n = keep_n;
  }
  for (int level = core_size_ / 2; level >= 1; level >>= 1) {
    const Segment parent = parents.back();
    parents.pop_back();
    const bool left = (core & level) == 0;
    const int64_t other_lo = left ? parent.lo + parent.n / 2 : parent.lo;
    peers_->Exchange(at(lo), n * es, at(other_lo), (parent.n - n) * es, PeerRank(core ^ level));
    lo = parent.lo;
    n = parent.n;
  }
  if (folded) peers_->Exchange(data, shard_n * es, nullptr, 0, rank_ + 1);
}

void Adasum::Allreduce(const Response& r, std::vector<ExecUnit>& units) {
  const DataType wire = HostReduceType(r.dtype);
  const size_t wsize = DataTypeSize(wire);
  const AdasumLayout layout = AdasumLayoutOf(units);
  const std::vector<AdasumPiece>& pieces = layout.pieces;
  const std::vector<int64_t>& counts = layout.counts;
  const int64_t total = layout.total;
  // One float32/float64 tensor is reduced in its output; anything else in
  // a work buffer in the wire type.
  const bool direct = pieces.size() == 1 && wire == r.dtype && pieces[0].in;
  char* buf;
  if (direct) {
    buf = pieces[0].out;
    ScaleCopy(buf, pieces[0].in, total, r.dtype, r.prescale);
  } else {
    buf = work_.Reserve(static_cast<size_t>(std::max<int64_t>(total, 1)) * wsize);
    int64_t at = 0;
    for (const auto& p : pieces) {
      if (p.in) {
        ConvertScale(buf + at * wsize, wire, p.in, r.dtype, p.count, r.prescale);
      } else {
        std::memset(buf + at * wsize, 0, static_cast<size_t>(p.count) * wsize);
      }
      at += p.count;
    }
  }
  ReduceInPlace(buf, wire, counts);
  if (direct) {
    if (r.postscale != 1.0) ScaleCopy(buf, buf, total, r.dtype, r.postscale);
    return;
  }
  int64_t at = 0;
  for (const auto& p : pieces) {
    if (p.out) ConvertScale(p.out, r.dtype, buf + at * wsize, wire, p.count, r.postscale);
    at += p.count;
  }
}

}  // namespace hvdcompat
