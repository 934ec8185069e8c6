"""Randomised soak test: random collectives, dtypes, sizes, names and async interleavings.

    hvdcompatrun -np 3 python scripts/soak.py --minutes 10
    mpirun -np 2 python scripts/soak.py --ops 2000

Every rank draws the same random program (same seed); each rank's input is a
deterministic function of (seed, op index, rank), so every rank can compute
the expected result of every op locally and compare. Prints ops run,
mismatches (must be 0) and the resident memory at start and end.
"""

import argparse
import os
import random
import sys
import time

import torch

import hvdcompat as hvd

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.int16, torch.int8, torch.uint8]
OPS = ["allreduce", "allreduce_", "grouped_allreduce", "allgather", "broadcast", "alltoall",
       "reducescatter"]


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_input(seed, k, rank, shape, dtype):
    g = torch.Generator().manual_seed(seed * 1_000_003 + k * 131 + rank)
    if dtype.is_floating_point:
        # small integers are exact in every float format, so sums compare exactly
        return torch.randint(-8, 8, shape, generator=g).to(dtype)
    lo = 0 if dtype == torch.uint8 else -8
    return torch.randint(lo, 8, shape, generator=g).to(dtype)


def plan_op(rng, k, size):
    op = rng.choice(OPS)
    named = rng.random() < 0.7
    name = f"soak.{rng.randint(0, 40)}" if named else None
    # Named ops mostly keep the parameters their name implies (steady state:
    # the response cache serves them); sometimes they change (invalidation).
    src = random.Random(f"{name}.{op}") if named and rng.random() < 0.8 else rng
    dtype = src.choice(DTYPES)
    ndim = src.randint(1, 3)
    shape = [src.randint(1, 6) for _ in range(ndim)]
    if src.random() < 0.1:
        shape[0] = src.randint(64, 4096)  # occasionally a larger tensor
    if op == "alltoall":
        shape[0] = size * src.randint(1, 3)
    small_ints = dtype in (torch.int8, torch.uint8, torch.int16)
    reduce_op = src.choice([hvd.Sum, hvd.Min, hvd.Max] if small_ints else
                           [hvd.Sum, hvd.Average, hvd.Min, hvd.Max])
    if op == "reducescatter" and reduce_op not in (hvd.Sum, hvd.Average):
        reduce_op = hvd.Sum
    return dict(k=k, op=op, dtype=dtype, shape=shape, name=name, reduce_op=reduce_op,
                root=src.randrange(size), dim0=[rng.randint(0, 4) for _ in range(size)])


def expected(p, seed, size, rank):
    inputs = [make_input(seed, p["k"], r, p["shape"], p["dtype"]) for r in range(size)]
    op = p["op"]
    if op in ("allreduce", "allreduce_", "grouped_allreduce", "reducescatter"):
        stack = torch.stack([x.double() for x in inputs])
        red = {hvd.Sum: stack.sum(0), hvd.Average: stack.sum(0),
               hvd.Min: stack.min(0).values, hvd.Max: stack.max(0).values}[p["reduce_op"]]
        if p["reduce_op"] == hvd.Average:
            # The engine's arithmetic: the (exact) sum times 1/size, in float64 for
            # float32, float64 and integers (truncated toward zero), rounded once;
            # in float32 for 16-bit floats.
            if p["dtype"] in (torch.float16, torch.bfloat16):
                red = red.float() * torch.tensor(1.0 / size, dtype=torch.float32)
            else:
                red = red * (1.0 / size)
                red = red if p["dtype"].is_floating_point else torch.trunc(red)
        red = red.to(p["dtype"])
        if op == "reducescatter":
            rows = red.shape[0]
            q, m = divmod(rows, size)
            start = rank * q + min(rank, m)
            return red[start:start + q + (1 if rank < m else 0)]
        return red
    if op == "allgather":
        parts = [make_input(seed, p["k"], r, [p["dim0"][r]] + p["shape"][1:], p["dtype"])
                 for r in range(size)]
        return torch.cat(parts)
    if op == "broadcast":
        return inputs[p["root"]]
    if op == "alltoall":
        rows = p["shape"][0] // size
        return torch.cat([inputs[r][rank * rows:(rank + 1) * rows] for r in range(size)])
    raise AssertionError(op)


def launch(p, seed, rank, size):
    """Starts the op; returns (handle, finisher) so ops can interleave."""
    x = make_input(seed, p["k"], rank, p["shape"], p["dtype"])
    name = None if p["name"] is None else f"{p['name']}.{p['op']}"
    op = p["op"]
    if op == "allreduce":
        return hvd.allreduce_async(x, name=name, op=p["reduce_op"]), lambda out: out
    if op == "allreduce_":
        return hvd.allreduce_async_(x, name=name, op=p["reduce_op"]), lambda out: out
    if op == "grouped_allreduce":
        return hvd.grouped_allreduce_async([x, x.clone()], name=name, op=p["reduce_op"]), \
            lambda out: out[0] if torch.equal(out[0], out[1]) else None
    if op == "allgather":
        y = make_input(seed, p["k"], rank, [p["dim0"][rank]] + p["shape"][1:], p["dtype"])
        return hvd.allgather_async(y, name=name), lambda out: out
    if op == "broadcast":
        return hvd.broadcast_async(x, p["root"], name=name), lambda out: out
    if op == "alltoall":
        return hvd.alltoall_async(x, name=name), lambda out: out[0]
    if op == "reducescatter":
        return hvd.reducescatter_async(x, name=name, op=p["reduce_op"]), lambda out: out
    raise AssertionError(op)


def run(ops=None, seconds=None, seed=1234, max_inflight=8, report=print):
    """Runs the soak on the initialised job; returns (ops run, mismatches, rss start, rss end)."""
    rank, size = hvd.rank(), hvd.size()
    rng = random.Random(seed)
    rss_start = rss_mib()
    deadline = time.monotonic() + seconds if seconds else None
    done = mismatches = k = 0
    last_report = time.monotonic()
    batches = 0
    while True:
        if ops is not None and k >= ops:
            break
        if deadline is not None and batches % 16 == 0:
            # Every rank must stop after the same batch: each asks at the same
            # batch count (the op stream is the same on every rank), and all
            # stop once any rank's clock has passed the deadline.
            late = int(time.monotonic() >= deadline)
            if hvd.allreduce(torch.tensor([late]), op=hvd.Max, name="soak.stop").item():
                break
        batches += 1
        batch = [plan_op(rng, k + i, size) for i in range(rng.randint(1, max_inflight))]
        k += len(batch)
        names = set()
        for p in batch:  # names must be unique among in-flight ops
            key = (p["name"], p["op"])
            if key in names:
                p["name"] = None
            names.add(key)
        started = [(p, *launch(p, seed, rank, size)) for p in batch]
        order = list(range(len(started)))
        rng.shuffle(order)  # synchronize in a different order than submitted
        for i in order:
            p, handle, finish = started[i]
            got = finish(hvd.synchronize(handle))
            want = expected(p, seed, size, rank)
            if got is None or got.dtype != want.dtype or not torch.equal(got, want):
                mismatches += 1
                report(f"rank {rank}: MISMATCH op {p['k']} {p['op']} {p['dtype']} "
                       f"{p['shape']}: got {got} want {want}")
            done += 1
        if deadline is not None and time.monotonic() - last_report > 30 and rank == 0:
            last_report = time.monotonic()
            report(f"... {done} ops, {mismatches} mismatches, RSS {rss_mib():.1f} MiB")
    return done, mismatches, rss_start, rss_mib()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=None)
    parser.add_argument("--minutes", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    if args.ops is None and args.minutes is None:
        args.ops = 1000
    hvd.init()
    done, bad, rss0, rss1 = run(ops=args.ops, seconds=args.minutes * 60 if args.minutes else None,
                                seed=args.seed, report=lambda s: print(s, flush=True))
    total_bad = hvd.allreduce(torch.tensor([bad]), op=hvd.Sum, name="soak.bad").item()
    print(f"rank {hvd.rank()}: ops {done}, mismatches {bad}, RSS start {rss0:.1f} MiB, "
          f"end {rss1:.1f} MiB", flush=True)
    stats = hvd.engine_stats()
    if hvd.rank() == 0:
        print(f"total mismatches {total_bad}; engine: {stats}", flush=True)
    hvd.shutdown()
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
