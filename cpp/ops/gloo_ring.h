// The Gloo controller's host allreduce: a pipelined ring over a context's
// TCP pairs, and a one-step exchange for small payloads. See Note [Gloo ring].
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "negotiation/fusion.h"
#include "ops/host_reduce.h"

namespace gloo {
class Context;
}

namespace hvdcompat {

// Note [Gloo ring]
// Gloo's own allreduce (gloo::allreduce, what torch's gloo backend runs)
// reduce-scatters the whole buffer and only then allgathers it, keeps two
// 1 MiB segments in flight, and posts each receive only when it is about to
// be needed. Gloo's TCP pairs send a segment only after the receiver said it
// posted the matching receive, so there every segment waits a round trip
// for that notice, and the allgather re-reads the whole buffer from memory
// long after it was reduced. Here:
//
// * Every receive of the allgather half is posted before anything is sent
//   (it lands straight in the buffer), and the reduce-scatter half keeps
//   `depth` receives posted ahead, into a ring of temporary segments: a
//   sender almost never waits for the notice, and the bytes stream.
// * Each stage has its own Gloo slot, so a segment moves on to its next stage
//   (its reduce-scatter step, then the allgather) as soon as it is ready,
//   instead of after the whole stage: the allgather of the first segments
//   overlaps the reduce-scatter of the last, and the link does not drain
//   between the two halves.
// * The payload is a list of parts: large tensors where they lie, small ones
//   packed into a fusion buffer. A segment that spans parts travels as one
//   transfer per part, so a large tensor is never copied into the fusion
//   buffer and back (on a CPU whose limit is memory bandwidth those two
//   passes cost as much as the reduction).
// * The caller's hooks run per segment, while the other segments travel:
//   `fill` packs this rank's contribution of a range just before its first
//   use (the fusion copy, widening and prescale), `settle` rewrites a range
//   this rank finished reducing before it goes out (the postscale, done once
//   by the owner and copied by everyone else, so every rank ends with the
//   same bits), `drain` unpacks a range once its final values are in (the
//   copy out of the fusion buffer). No pass over the whole payload is left
//   outside the pipeline, so a fused set keeps the link busy from its first
//   segment to its last, and the copies run on cache-hot segments.
//
// Payloads whose (size - 1) copies fit in `exchange_max_bytes` skip the
// ring: every rank sends its whole contribution to every other rank and
// reduces them all in rank order (one message latency instead of
// 2(size - 1); the same bits on every rank). Segments, stages and transfers
// depend only on the element count, the parts' boundaries, the element size
// and the options, so every rank plans the same transfers.
//
// What it cannot change: between ranks of one host the bytes still cross
// loopback TCP, two kernel copies per byte each way, which is most of the
// time on a CPU-bound machine; the ring saves the stalls, the cold re-reads
// and the fusion copies around them (docs/launching-without-mpi.md,
// "Performance", has the measurements).
struct GlooRingOptions {
  int64_t segment_bytes = 1 << 20;       // largest transfer of one segment
  int depth = 4;                         // reduce-scatter receives posted ahead
  int64_t exchange_max_bytes = 64 << 10;  // (size - 1) x payload at most this: the exchange
};

class GlooRing {
 public:
  using ReduceFn = HostReduceFn;
  // Part of the payload: elements [first, the next part's first) at `data`.
  struct Part {
    int64_t first;
    char* data;
  };
  // A range of elements [first, first + count) of the payload.
  using RangeFn = std::function<void(int64_t first, int64_t count)>;
  // Each may be empty. Every element is filled once before it is reduced or
  // sent; settled once (by the rank that finished its reduction, before it
  // is sent on); drained once (after it holds its final value; drain must
  // not write the buffer).
  struct Hooks {
    RangeFn fill;
    RangeFn settle;
    RangeFn drain;
  };

  GlooRing(std::shared_ptr<gloo::Context> context, const GlooRingOptions& options);
  ~GlooRing();

  // Reduces `count` elements of `esize` bytes in place over the context's
  // ranks with `reduce`; `parts` (sorted by `first`, the first at 0) say
  // where they lie. Collective over the context: every rank with the same
  // count, part boundaries and element size. Throws gloo::Exception on a
  // transport failure.
  void Allreduce(const std::vector<Part>& parts, int64_t count, size_t esize, ReduceFn reduce,
                 const Hooks& hooks);

 private:
  struct Layout;
  void Exchange(const Layout& layout, ReduceFn reduce, const Hooks& hooks);
  void Ring(const Layout& layout, ReduceFn reduce, const Hooks& hooks);

  std::shared_ptr<gloo::Context> context_;
  GlooRingOptions options_;
  int rank_ = 0;
  int size_ = 1;
  HostScratch scratch_;  // the reduce-scatter's temporary segments, or the exchange's inputs
};

}  // namespace hvdcompat
