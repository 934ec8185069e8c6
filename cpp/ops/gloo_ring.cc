#include "ops/gloo_ring.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/common.h"
#include "gloo/common/error.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"

namespace hvdcompat {

namespace {

// Gloo's own collectives use slot prefixes 0x01-0x08, GlooBackend's others
// 0x40-0x42; the ring (one slot per stage) and the exchange their own.
constexpr uint8_t kRingSlotPrefix = 0x43;
constexpr uint8_t kExchangeSlotPrefix = 0x44;

using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;
// The transfers of one segment (one per part it spans).
using Transfers = std::vector<Buffer>;

void Call(const GlooRing::RangeFn& fn, int64_t first, int64_t count) {
  if (fn && count > 0) fn(first, count);
}

void WaitRecvs(Transfers& ts, std::chrono::milliseconds timeout) {
  for (auto& b : ts) {
    if (!b->waitRecv(nullptr, timeout)) {
      throw gloo::IoException("Gloo allreduce: a receive was aborted");
    }
  }
}

void WaitSends(Transfers& ts, std::chrono::milliseconds timeout) {
  for (auto& b : ts) {
    if (!b->waitSend(nullptr, timeout)) {
      throw gloo::IoException("Gloo allreduce: a send was aborted");
    }
  }
}

// The ring's transfers on one rank: `size` chunks of the payload, each cut
// into `segs` segments. Stage t < size - 1 is reduce-scatter step t, the
// others allgather step t - (size - 1).
struct RingPlan {
  int size = 0, rank = 0;
  int64_t segs = 1;
  std::vector<int64_t> chunk;  // size + 1 chunk starts, in elements

  int Mod(int x) const { return ((x % size) + size) % size; }
  int stages() const { return 2 * (size - 1); }
  bool ReduceStage(int t) const { return t < size - 1; }
  // The chunk received (and, in the reduce-scatter, reduced) at stage t.
  int RecvChunk(int t) const {
    return ReduceStage(t) ? Mod(rank - t - 1) : Mod(rank - (t - (size - 1)));
  }
  // The chunk sent at stage t: the one received at stage t - 1 (rank's own at 0).
  int SendChunk(int t) const {
    return ReduceStage(t) ? Mod(rank - t) : Mod(rank + 1 - (t - (size - 1)));
  }
  // Segment j of chunk c: [first, first + count).
  std::pair<int64_t, int64_t> Segment(int c, int64_t j) const {
    const int64_t len = chunk[c + 1] - chunk[c];
    const int64_t a = chunk[c] + len * j / segs, b = chunk[c] + len * (j + 1) / segs;
    return {a, b - a};
  }
};

}  // namespace

// The payload: where each element lies.
struct GlooRing::Layout {
  const std::vector<Part>* parts;
  int64_t count;
  size_t esize;

  // fn(data, first, n) for each piece of [first, first + n) inside one part,
  // in order.
  template <typename F>
  void Extents(int64_t first, int64_t n, F&& fn) const {
    const auto& p = *parts;
    size_t k = static_cast<size_t>(
        std::upper_bound(p.begin(), p.end(), first,
                         [](int64_t v, const Part& part) { return v < part.first; }) -
        p.begin()) - 1;
    for (; k < p.size() && p[k].first < first + n; ++k) {
      const int64_t end = k + 1 < p.size() ? p[k + 1].first : count;
      const int64_t lo = std::max(first, p[k].first), hi = std::min(first + n, end);
      if (hi > lo) fn(p[k].data + (lo - p[k].first) * esize, lo, hi - lo);
    }
  }
};

GlooRing::GlooRing(std::shared_ptr<gloo::Context> context, const GlooRingOptions& options)
    : context_(std::move(context)),
      options_(options),
      rank_(context_->rank),
      size_(context_->size) {
  options_.segment_bytes = std::max<int64_t>(options_.segment_bytes, 1);
  options_.depth = std::max(options_.depth, 1);
}

GlooRing::~GlooRing() = default;

void GlooRing::Allreduce(const std::vector<Part>& parts, int64_t count, size_t esize,
                         ReduceFn reduce, const Hooks& hooks) {
  if (count <= 0) return;
  HVD_ENFORCE(!parts.empty() && parts[0].first == 0, "Gloo allreduce: the parts start at 0");
  if (size_ == 1) {
    Call(hooks.fill, 0, count);
    Call(hooks.settle, 0, count);
    Call(hooks.drain, 0, count);
    return;
  }
  const Layout layout{&parts, count, esize};
  // The exchange moves (size - 1) times the payload from every rank.
  if (count * static_cast<int64_t>(esize) * (size_ - 1) <= options_.exchange_max_bytes ||
      count < size_) {
    Exchange(layout, reduce, hooks);
  } else {
    Ring(layout, reduce, hooks);
  }
}

void GlooRing::Exchange(const Layout& layout, ReduceFn reduce, const Hooks& hooks) {
  const int64_t count = layout.count;
  const size_t esize = layout.esize;
  const size_t bytes = static_cast<size_t>(count) * esize;
  const auto timeout = context_->getTimeout();
  const auto slot = gloo::Slot::build(kExchangeSlotPrefix, 0);
  Call(hooks.fill, 0, count);
  // Peer p's contribution, contiguous, at its index among the others.
  char* others = scratch_.Reserve(bytes * static_cast<size_t>(size_ - 1));
  auto other = [&](int p, int64_t first) {
    return others + bytes * static_cast<size_t>(p < rank_ ? p : p - 1) + first * esize;
  };
  Transfers recvs, sends;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    layout.Extents(0, count, [&](char*, int64_t first, int64_t n) {
      recvs.push_back(context_->createUnboundBuffer(other(p, first), n * esize));
      recvs.back()->recv(p, slot, 0, n * esize);
    });
  }
  layout.Extents(0, count, [&](char* data, int64_t, int64_t n) {
    sends.push_back(context_->createUnboundBuffer(data, n * esize));
    for (int i = 1; i < size_; ++i) sends.back()->send((rank_ + i) % size_, slot, 0, n * esize);
  });
  WaitRecvs(recvs, timeout);
  for (int i = 1; i < size_; ++i) WaitSends(sends, timeout);
  // In rank order on every rank, so every rank gets the same bits.
  layout.Extents(0, count, [&](char* data, int64_t first, int64_t n) {
    char* acc = rank_ == 0 ? data : other(0, first);
    for (int p = 1; p < size_; ++p) {
      reduce(acc, acc, p == rank_ ? data : other(p, first), static_cast<size_t>(n));
    }
    if (acc != data) std::memcpy(data, acc, n * esize);
  });
  Call(hooks.settle, 0, count);
  Call(hooks.drain, 0, count);
}

void GlooRing::Ring(const Layout& layout, ReduceFn reduce, const Hooks& hooks) {
  const int64_t count = layout.count;
  const size_t esize = layout.esize;
  RingPlan plan;
  plan.size = size_;
  plan.rank = rank_;
  plan.chunk.resize(size_ + 1);
  int64_t largest = 0;
  for (int c = 0; c <= size_; ++c) plan.chunk[c] = count * c / size_;
  for (int c = 0; c < size_; ++c) largest = std::max(largest, plan.chunk[c + 1] - plan.chunk[c]);
  plan.segs = std::max<int64_t>(
      1, (largest * static_cast<int64_t>(esize) + options_.segment_bytes - 1) /
             options_.segment_bytes);
  const int64_t seg_elems = (largest + plan.segs - 1) / plan.segs;  // the longest segment
  const int stages = plan.stages();
  const int64_t reduce_items = (size_ - 1) * plan.segs;
  const int64_t items = stages * plan.segs;
  const int64_t depth = std::min<int64_t>(options_.depth, reduce_items);
  const size_t seg_bytes = static_cast<size_t>(seg_elems) * esize;
  char* tmp = scratch_.Reserve(seg_bytes * static_cast<size_t>(depth));
  const auto timeout = context_->getTimeout();
  const int next = plan.Mod(rank_ + 1), prev = plan.Mod(rank_ - 1);
  auto slot = [](int64_t t) {
    return gloo::Slot::build(kRingSlotPrefix, static_cast<uint32_t>(t));
  };
  auto recv_range = [&](int64_t i) {
    return plan.Segment(plan.RecvChunk(static_cast<int>(i / plan.segs)), i % plan.segs);
  };

  std::vector<Transfers> sends(static_cast<size_t>(items));
  auto send = [&](int t, int64_t j) {
    const auto [first, n] = plan.Segment(plan.SendChunk(t), j);
    Transfers& out = sends[t * plan.segs + j];
    layout.Extents(first, n, [&](char* data, int64_t, int64_t k) {
      out.push_back(context_->createUnboundBuffer(data, k * esize));
      out.back()->send(next, slot(t), 0, k * esize);
    });
  };
  // The allgather lands in place: every receive posted now.
  std::vector<Transfers> gathered(static_cast<size_t>(items - reduce_items));
  for (int64_t i = reduce_items; i < items; ++i) {
    const auto [first, n] = recv_range(i);
    Transfers& in = gathered[i - reduce_items];
    layout.Extents(first, n, [&](char* data, int64_t, int64_t k) {
      in.push_back(context_->createUnboundBuffer(data, k * esize));
      in.back()->recv(prev, slot(i / plan.segs), 0, k * esize);
    });
  }
  // The reduce-scatter lands in `depth` temporary segments, posted ahead.
  std::vector<Transfers> reducing(static_cast<size_t>(depth));
  auto staging = [&](int64_t i) { return tmp + (i % depth) * seg_bytes; };
  auto post_reduce = [&](int64_t i) {
    if (i >= reduce_items) return;
    Transfers& in = reducing[i % depth];
    in.clear();
    const auto [first, n] = recv_range(i);
    layout.Extents(first, n, [&, first = first](char*, int64_t at, int64_t k) {
      in.push_back(context_->createUnboundBuffer(staging(i) + (at - first) * esize, k * esize));
      in.back()->recv(prev, slot(i / plan.segs), 0, k * esize);
    });
  };
  for (int64_t i = 0; i < depth; ++i) post_reduce(i);
  // This rank's own chunk goes out first, `depth` segments ahead of the reduction.
  auto start = [&](int64_t j) {
    if (j >= plan.segs) return;
    const auto [first, n] = plan.Segment(plan.SendChunk(0), j);
    Call(hooks.fill, first, n);
    send(0, j);
  };
  for (int64_t j = 0; j < depth; ++j) start(j);

  for (int64_t i = 0; i < items; ++i) {
    const int t = static_cast<int>(i / plan.segs);
    const int64_t j = i % plan.segs;
    if (t == 0) start(j + depth);
    const auto [first, n] = recv_range(i);
    if (plan.ReduceStage(t)) {
      Call(hooks.fill, first, n);  // the chunk's first use on this rank
      WaitRecvs(reducing[i % depth], timeout);
      const char* staged = staging(i);
      layout.Extents(first, n, [&, first = first](char* data, int64_t at, int64_t k) {
        reduce(data, data, staged + (at - first) * esize, static_cast<size_t>(k));
      });
      post_reduce(i + depth);
      if (t == size_ - 2) Call(hooks.settle, first, n);
    } else {
      WaitRecvs(gathered[i - reduce_items], timeout);
    }
    if (t + 1 < stages) send(t + 1, j);
    if (t >= size_ - 2) Call(hooks.drain, first, n);
  }
  for (auto& s : sends) WaitSends(s, timeout);
}

}  // namespace hvdcompat
