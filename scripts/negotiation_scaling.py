"""Negotiation cost at 64 to 1,024 ranks, simulated: the ranks are threads of one process.

    python scripts/negotiation_scaling.py                  # 64, 256, 1024 ranks
    python scripts/negotiation_scaling.py --sizes 2,8,32,64,256,1024 --iterations 6

Every rank runs the engine's own negotiation (cpp/negotiation: the
controller, its response cache, and on set rank 0 the coordinator) over the
in-memory testing transport (cpp/testing/fake_transport), submitting
ResNet-50's 161 gradients (allreduce, Average) each iteration and cycling
until all are answered; no tensor data moves. It prints, per size, for the
first iteration (every name is new: request lists gathered on set rank 0)
and for steady state (the later iterations, served from the response cache):

- cycles the iteration took, and how many gathered requests;
- coordinator time: set rank 0 decoding, checking and answering requests
  (EngineStats.coordinator_ns);
- rank 0's engine CPU, and the mean and the largest over the other ranks: thread
  CPU time inside the controller, excluding the transport (the fake's combine
  reads every rank's words in every thread, which an MPI allreduce does not);
- bytes through set rank 0: request lists in, responses out, cycle words
  combined (payload, see Note [Negotiation cost] in controller.cc);
- coordinator heap: the coordinator alone decoding and adding every rank's
  request list (one thread, glibc's mallinfo2 before and after), then
  deciding and encoding the answer; its times are thread CPU.

Needs the test build of the core (tests/core_testing.py builds it on first
use: CMake and mpicc). ``--json PATH`` also writes the rows. It runs with one malloc arena
per thread (GLIBC_TUNABLES=glibc.malloc.arena_max=4096), as separate processes would have.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import core_testing  # noqa: E402
from benchmark_helpers import bench_common  # noqa: E402


def resnet50_shapes():
    """ResNet-50's 161 gradient shapes as lists (no torch needed here)."""
    return [list(s) for s in bench_common.resnet50_shapes()]


def measure(T, size, shapes, iterations):
    t0 = time.monotonic()
    rows = T.simulate_scaling(size, shapes, iterations)
    wall = time.monotonic() - t0
    first, steady = rows[0], rows[1:]

    def med(key):
        return statistics.median(r[key] for r in steady)

    fp = T.coordinator_footprint(size, shapes)
    return {
        "ranks": size, "tensors": len(shapes), "run_seconds": wall,
        "first": {k: first[k] for k in first},
        "steady": {k: med(k) for k in first},
        "footprint": fp,
    }


def print_table(results):
    ms = lambda ns: f"{ns / 1e6:.2f}"  # noqa: E731
    us = lambda ns: f"{ns / 1e3:.0f}"  # noqa: E731
    kib = lambda b: f"{b / 1024:.1f}"  # noqa: E731
    print("\n# First iteration (161 new names; request lists gathered on set rank 0)")
    print(f"{'ranks':>6} {'cycles':>6} {'coord ms':>9} {'rank0 CPU ms':>12} "
          f"{'others CPU ms mean/max':>22} {'in KiB':>9} {'out KiB':>8} {'heap MiB':>9} "
          f"{'decode+add ms':>13} {'decide ms':>9}")
    for r in results:
        f, fp = r["first"], r["footprint"]
        print(f"{r['ranks']:>6} {f['cycles']:>6} {ms(f['coordinator_ns']):>9} "
              f"{ms(f['root_engine_cpu_ns']):>12} "
              f"{ms(f['mean_other_engine_cpu_ns']) + ' / ' + ms(f['max_other_engine_cpu_ns']):>22} "
              f"{kib(f['coordinator_in_bytes']):>9} {kib(f['coordinator_out_bytes']):>8} "
              f"{fp['held_bytes'] / 2**20:>9.2f} {ms(fp['decode_add_ns']):>13} "
              f"{ms(fp['decide_encode_ns']):>9}")
    print("\n# Steady state (median over the later iterations; every name cached)")
    print(f"{'ranks':>6} {'cycles':>6} {'slow cycles':>11} {'coord us':>8} {'rank0 CPU us':>12} "
          f"{'others CPU us mean/max':>22} {'in B':>6} {'out B':>6} {'words B/rank':>12}")
    for r in results:
        s = r["steady"]
        print(f"{r['ranks']:>6} {s['cycles']:>6.0f} {s['slow_path_cycles']:>11.0f} "
              f"{us(s['coordinator_ns']):>8} {us(s['root_engine_cpu_ns']):>12} "
              f"{us(s['mean_other_engine_cpu_ns']) + ' / ' + us(s['max_other_engine_cpu_ns']):>22} "
              f"{s['coordinator_in_bytes']:>6.0f} {s['coordinator_out_bytes']:>6.0f} "
              f"{s['flag_bytes']:>12.0f}")


def _own_malloc_arenas():
    """Re-runs this script with a malloc arena per thread (glibc keeps at most 8 per core).

    Real ranks are processes, each with its own heap; 1,024 threads sharing 16
    arenas contend for them, and their steady-state CPU then rose with the
    thread count (70 to 190 us from 2 to 1,024) though no step depends on it.
    """
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.arena_max" in tunables:
        return
    env = dict(os.environ, GLIBC_TUNABLES=":".join(
        t for t in (tunables, "glibc.malloc.arena_max=4096") if t))
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)


def main(argv=None):
    if argv is None:
        _own_malloc_arenas()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--iterations", type=int, default=6,
                        help="iterations per size: the first, then steady state (default 6)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.iterations < 2:
        parser.error("--iterations must be 2 or more (the first, then steady state)")
    T = core_testing.load()
    shapes = resnet50_shapes()
    assert len(shapes) == 161
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        results.append(measure(T, size, shapes, args.iterations))
        print(f"# {size} ranks simulated in {results[-1]['run_seconds']:.1f} s", flush=True)
    print_table(results)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
