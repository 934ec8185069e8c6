"""Allreduce benchmark: hvdcompat vs raw MPI (mpi4py) vs torch.distributed (gloo), one job.

    hvdcompatrun -np 2 python examples/allreduce_benchmark.py
    mpirun --allow-run-as-root -np 2 python examples/allreduce_benchmark.py \
        --sizes 4KiB,64MiB --iters 20
    hvdcompatrun -np 2 python examples/allreduce_benchmark.py --autotune --sizes 4KiB
    hvdcompatrun -np 4 python examples/allreduce_benchmark.py --hierarchical --pseudo-node-size 2
    mpirun --allow-run-as-root -np 2 python examples/allreduce_benchmark.py --mpi4py-first
    python examples/allreduce_benchmark.py --hosts    # root: simulated cluster, see below

Prints, for float32 buffers of each size, the median time of a synchronous
allreduce (sum) and its algorithm bandwidth (bytes / time), then the
ResNet-50 gradient set (161 tensors, 25,557,032 floats) submitted
asynchronously and synchronized, against per-tensor raw MPI and gloo.
Every peer runs in the same job on the same buffers; medians over --iters.
With --autotune, an engine restarted with HOROVOD_AUTOTUNE=1 then searches on
the ResNet-50 set, and the set is timed on the default engine and on one
started with the values found, in alternating rounds; the reduced values of
both are compared bit for bit.
--hierarchical adds the engine with HOROVOD_HIERARCHICAL_ALLREDUCE=1 (a
column and a row; the engine is restarted to switch), --pseudo-node-size K
splits one host into nodes of K ranks for it (HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE,
a testing knob: on one host the "inter-node" step is shared memory too).
Then hvdcompat in place (hvd.allreduce_) against out of place (hvd.allreduce,
a new output per call), per size and for the ResNet-50 set. --mpi4py-first
starts MPI from mpi4py before hvdcompat is imported (as scripts that import
mpi4py first do), so nothing hvdcompat could set at import reaches MPI.

--hosts (run it as a plain command, as root: it launches the jobs itself)
builds two test hosts on this machine (network namespaces joined by a bridge,
tests/cluster/testhosts.py) and, for the layouts 2 hosts x 1 rank and
2 hosts x 2 ranks with the host links unlimited and limited to 1 Gbit/s (tbf),
times the ResNet-50 set (in place, async then synchronize; then fp16-compressed)
in alternating jobs of hvdcompat and of Horovod 0.28.1 itself (each at its
defaults, launched by its own environment's mpirun; --horovod-python), next to
the link floor (each host sends and receives the set once). Then the synthetic
training benchmark's MLP trains on 2 hosts x 1 rank with both.
--pool-compare times those in-place and out-of-place rows on engines with the
output pool on (the default) and off (HVDCOMPAT_OUTPUT_POOL_BYTES=0, every
output a fresh torch.empty, as before the pool), in --pool-rounds alternating
rounds (the engine is restarted to switch), with each row's page faults.
"""

import argparse
import math
import os
import resource
import socket
import statistics
import sys
import threading
import time

import torch

if "--mpi4py-first" in sys.argv:
    from mpi4py import MPI  # noqa: F401  (initialises MPI before hvdcompat is imported)

# The benchmark helpers (scripts/benchmark_helpers/) are not examples; they sit beside the
# repository's other benchmark scripts.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))

if __name__ == "__main__" and "--hosts" in sys.argv:
    # The driver runs no rank itself: it builds the test hosts and launches the jobs.
    from benchmark_helpers import cluster_rows

    sys.exit(cluster_rows.main(sys.argv[1:]))

import hvdcompat as hvd
from benchmark_helpers.bench_common import human, parse_size, resnet50_shapes, timeit  # noqa: F401
from benchmark_helpers.engine_restart import AUTOTUNE_KNOBS, TUNED_KNOBS, restart

try:
    from mpi4py import MPI
except ImportError:  # the table then has no raw MPI column
    MPI = None


class Heartbeat:
    """Rank 0's "still measuring" line on stderr when the table has been quiet for a while.

    Launchers forward the ranks' output line by line, so a table row appears
    only when all its cells are measured, and the 64 MiB row takes seconds
    (many on a busy machine). A daemon thread then says what is being measured.
    It only reads attributes that the main thread replaces whole, so no lock.
    """

    def __init__(self, enabled, quiet_seconds=3.0):
        self.what, self.since = "the first size", time.monotonic()
        self.last_output = self.since
        if enabled:
            threading.Thread(target=self._run, args=(quiet_seconds,), daemon=True).start()

    def measuring(self, what):
        self.what, self.since = what, time.monotonic()

    def printed(self):
        self.last_output = time.monotonic()

    def _run(self, quiet_seconds):
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            if now - self.last_output >= quiet_seconds:
                print(f"  ... measuring {self.what} ({now - self.since:.0f} s so far)",
                      file=sys.stderr, flush=True)
                self.last_output = now


def start_gloo():
    """Initialises torch.distributed/gloo for this job (address and port from rank 0)."""
    import torch.distributed as dist

    if MPI is None:
        return None
    comm = MPI.COMM_WORLD
    addr, port = None, None
    if comm.rank == 0:
        # Across hosts, rank 0's own address (its name must resolve to it).
        one_host = hvd.local_size() == hvd.size()
        addr = "127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname())
        s = socket.socket()
        s.bind(("127.0.0.1" if one_host else "", 0))
        port = s.getsockname()[1]
        s.close()
    addr, port = comm.bcast((addr, port), root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=comm.rank,
                            world_size=comm.size)
    return dist


def hierarchical_engine(on, pseudo_node_size):
    """Restarts the engine with HOROVOD_HIERARCHICAL_ALLREDUCE on or off (knobs are read at init)."""
    hvd.shutdown()
    os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1" if on else "0"
    if pseudo_node_size:
        os.environ["HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE"] = str(pseudo_node_size)
    hvd.init()


def out_of_place_sizes(sizes, args, barrier, log, heartbeat):
    """hvdcompat in place (hvd.allreduce_) vs out of place (hvd.allreduce, new output)."""
    log(f"\n# hvdcompat in place vs out of place (a new output per call), float32 sum")
    header = f"{'size':>9} | {'in place ms':>11} | {'out of place ms':>15} | {'out/in':>6}"
    log(header)
    log("-" * len(header))
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        name = f"bench.{nbytes}"
        heartbeat.measuring(f"{human(nbytes)} in place")
        ti = timeit(lambda: hvd.allreduce_(t, op=hvd.Sum, name=name), args.iters, args.warmup,
                    barrier)
        heartbeat.measuring(f"{human(nbytes)} out of place")
        to = timeit(lambda: hvd.allreduce(t, op=hvd.Sum, name=name + ".out"), args.iters,
                    args.warmup, barrier)
        log(f"{human(nbytes):>9} | {ti * 1e3:11.3f} | {to * 1e3:15.3f} | {to / ti:6.2f}")


def page_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def pool_engine(on, launch_value):
    """Restarts the engine with the output pool as launched (on) or off (read at init)."""
    hvd.shutdown()
    if on:
        if launch_value is None:
            os.environ.pop("HVDCOMPAT_OUTPUT_POOL_BYTES", None)
        else:
            os.environ["HVDCOMPAT_OUTPUT_POOL_BYTES"] = launch_value
    else:
        os.environ["HVDCOMPAT_OUTPUT_POOL_BYTES"] = "0"
    hvd.init()


def pool_compare(sizes, grads, args, log, heartbeat):
    """In place and out of place, output pool on and off, in alternating rounds.

    Times: the median over rounds of each round's median; out/in: the median
    of each round's ratio (both measured back to back, so load that comes and
    goes between rounds cancels); faults: rank 0's minor page faults per
    out-of-place call, median over all calls.
    """
    launch_value = os.environ.get("HVDCOMPAT_OUTPUT_POOL_BYTES")

    def resnet(out_of_place):
        def run():
            if out_of_place:
                handles = [hvd.allreduce_async(g, op=hvd.Sum, name=f"pool_rn_out.{i}")
                           for i, g in enumerate(grads)]
            else:
                handles = [hvd.allreduce_async_(g, op=hvd.Sum, name=f"pool_rn.{i}")
                           for i, g in enumerate(grads)]
            for h in handles:
                hvd.synchronize(h)
        return run

    cases = []  # (label, in-place fn, out-of-place fn, iters, warmup)
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        name = f"pool.{nbytes}"
        cases.append((human(nbytes),
                      lambda t=t, name=name: hvd.allreduce_(t, op=hvd.Sum, name=name),
                      lambda t=t, name=name: hvd.allreduce(t, op=hvd.Sum, name=name + ".out"),
                      args.iters, args.warmup))
    cases.append(("ResNet-50", resnet(False), resnet(True), args.resnet_iters, 2))
    kinds = ("pool on", "pool off")
    times = {(c[0], k, w): [] for c in cases for k in kinds for w in ("in", "out")}
    faults = {(c[0], k, w): [] for c in cases for k in kinds for w in ("in", "out")}

    def measure(fn, iters, warmup, key):
        for _ in range(warmup):
            fn()
        each = []
        for _ in range(iters):
            hvd.barrier()
            f0 = page_faults()
            t0 = time.perf_counter()
            fn()
            each.append(time.perf_counter() - t0)
            faults[key].append(page_faults() - f0)
        times[key].append(statistics.median(each))

    for r in range(args.pool_rounds):
        for kind in kinds if r % 2 == 0 else reversed(kinds):
            pool_engine(kind == "pool on", launch_value)
            for label, fin, fout, iters, warmup in cases:
                heartbeat.measuring(f"{label}, {kind}, round {r + 1} of {args.pool_rounds}")
                measure(fin, iters, warmup, (label, kind, "in"))
                measure(fout, iters, warmup, (label, kind, "out"))
    pool_engine(True, launch_value)
    log(f"\n# in place vs out of place, output pool on (default) and off "
        f"(HVDCOMPAT_OUTPUT_POOL_BYTES=0), float32 sum; median of {args.pool_rounds} alternating "
        f"rounds of {args.iters} calls ({args.resnet_iters} for the ResNet-50 set); "
        "faults: minor page faults per call")
    header = (f"{'size':>9} | {'pool on: in ms':>14} {'out ms':>8} {'out/in':>6} {'faults':>6} | "
              f"{'pool off: in ms':>15} {'out ms':>8} {'out/in':>6} {'faults':>6} | "
              f"{'out on/off':>10}")
    log(header)
    log("-" * len(header))
    med = lambda key: statistics.median(times[key])  # noqa: E731
    flt = lambda key: statistics.median(faults[key])  # noqa: E731
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))  # noqa: E731
    for label, *_ in cases:
        row = f"{label:>9} |"
        for kind in kinds:
            ti, to = med((label, kind, "in")), med((label, kind, "out"))
            width = 14 if kind == "pool on" else 15
            row += (f" {ti * 1e3:{width}.3f} {to * 1e3:8.3f} "
                    f"{ratio((label, kind, 'out'), (label, kind, 'in')):6.2f} "
                    f"{flt((label, kind, 'out')):6.0f} |")
        row += f" {ratio((label, 'pool on', 'out'), (label, 'pool off', 'out')):10.2f}"
        log(row)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4KiB,64KiB,1MiB,4MiB,16MiB,64MiB")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--resnet-iters", type=int, default=10)
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--autotune", action="store_true",
                        help="also time the ResNet-50 set with the settings autotune finds")
    parser.add_argument("--autotune-warmup-samples", type=int, default=1)
    parser.add_argument("--autotune-steps-per-sample", type=int, default=3)
    parser.add_argument("--autotune-bayes-opt-max-samples", type=int, default=12)
    parser.add_argument("--autotune-log-file", default="")
    parser.add_argument("--autotune-rounds", type=int, default=3,
                        help="alternating default/tuned timing rounds after the search")
    parser.add_argument("--hierarchical", action="store_true",
                        help="also time the engine with HOROVOD_HIERARCHICAL_ALLREDUCE=1")
    parser.add_argument("--pseudo-node-size", type=int, default=0, metavar="K",
                        help="with --hierarchical: nodes of K consecutive ranks (testing knob)")
    parser.add_argument("--mpi4py-first", action="store_true",
                        help="start MPI from mpi4py before importing hvdcompat")
    parser.add_argument("--no-out-of-place", action="store_true",
                        help="skip the in-place vs out-of-place rows")
    parser.add_argument("--hosts", action="store_true",
                        help="(root, not under a launcher) the simulated-cluster table; "
                             "--hosts --help lists its options")
    parser.add_argument("--pool-compare", action="store_true",
                        help="also time in place and out of place with the output pool off")
    parser.add_argument("--pool-rounds", type=int, default=3,
                        help="with --pool-compare: alternating pool on/off rounds")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    comm = MPI.COMM_WORLD if MPI is not None else None
    dist = None if args.no_gloo else start_gloo()
    barrier = hvd.barrier
    heartbeat = Heartbeat(enabled=rank == 0)

    def log(*parts):
        # Rank 0 only, flushed: a launcher may buffer the ranks' pipes.
        if rank == 0:
            print(*parts, flush=True)
            heartbeat.printed()


    log(f"# {size} ranks; float32 sum; median of {args.iters} (after {args.warmup} warm-up)")
    log(f"# hvdcompat {hvd.__version__}, {' '.join(hvd.build_info()['mpi_library'].splitlines()[0].split(',')[0].split())}, "
        f"torch {torch.__version__}")
    log(f"# MPI started by {'mpi4py, before hvdcompat was imported' if args.mpi4py_first else 'hvdcompat'}")
    header = f"{'size':>9} | {'hvdcompat ms':>12} {'GB/s':>6} | {'MPI ms':>8} {'GB/s':>6} |"
    header += f" {'gloo ms':>8} {'GB/s':>6} | {'hvd/MPI':>7}"
    if args.hierarchical:
        header += f" | {'hier ms':>8} {'GB/s':>6} | {'hier/flat':>9}"
        hierarchical_engine(False, args.pseudo_node_size)  # nodes the same in both engines
    log(header)
    log("-" * len(header))
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        n = nbytes // 4
        t = torch.ones(n)
        name = f"bench.{nbytes}"
        heartbeat.measuring(f"{human(nbytes)} with hvdcompat")
        th = timeit(lambda: hvd.allreduce_(t, op=hvd.Sum, name=name), args.iters, args.warmup,
                    barrier)
        tm = tg = float("nan")
        if comm is not None:
            heartbeat.measuring(f"{human(nbytes)} with raw MPI")
            a = t.numpy()
            tm = timeit(lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM), args.iters,
                        args.warmup, barrier)
        if dist is not None:
            heartbeat.measuring(f"{human(nbytes)} with gloo")
            tg = timeit(lambda: dist.all_reduce(t), args.iters, args.warmup, barrier)
        gb = lambda s: nbytes / s / 1e9  # noqa: E731
        row = (f"{human(nbytes):>9} | {th * 1e3:12.3f} {gb(th):6.2f} | {tm * 1e3:8.3f} "
               f"{gb(tm):6.2f} | {tg * 1e3:8.3f} {gb(tg):6.2f} | {th / tm:7.2f}")
        if args.hierarchical:
            hierarchical_engine(True, args.pseudo_node_size)
            tt = timeit(lambda: hvd.allreduce_(t, op=hvd.Sum, name=name), args.iters,
                        args.warmup, barrier)
            hierarchical_engine(False, args.pseudo_node_size)
            row += f" | {tt * 1e3:8.3f} {gb(tt):6.2f} | {tt / th:9.2f}"
        log(row)

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if not args.no_out_of_place:
        out_of_place_sizes(sizes, args, barrier, log, heartbeat)

    shapes = resnet50_shapes()
    grads = [torch.randn(s) for s in shapes]
    total = sum(g.numel() for g in grads)
    log(f"\n# ResNet-50 gradient set: {len(grads)} tensors, {total:,} floats "
        f"({human(total * 4)}), median of {args.resnet_iters}")

    def hvd_set():
        handles = [hvd.allreduce_async_(g, op=hvd.Sum, name=f"resnet.{i}")
                   for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    rows = [("hvdcompat (async, fused)", hvd_set)]
    if comm is not None:
        arrays = [g.numpy() for g in grads]

        def mpi_set():
            for a in arrays:
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

        rows.append(("raw MPI, one Allreduce per tensor", mpi_set))
    if dist is not None:
        def gloo_set():
            works = [dist.all_reduce(g, async_op=True) for g in grads]
            for w in works:
                w.wait()

        rows.append(("gloo, async per tensor", gloo_set))
    if not args.no_out_of_place:
        def hvd_set_out():
            handles = [hvd.allreduce_async(g, op=hvd.Sum, name=f"resnet_out.{i}")
                       for i, g in enumerate(grads)]
            for h in handles:
                hvd.synchronize(h)

        rows.append(("hvdcompat out of place (async, fused)", hvd_set_out))
    if args.hierarchical:
        # Last: the engine is restarted with the hierarchical knob for this row.
        rows.append(("hvdcompat hierarchical (async, fused)", hvd_set))
    times = {}
    for label, fn in rows:
        if fn is hvd_set and "hierarchical" in label:
            hierarchical_engine(True, args.pseudo_node_size)
        heartbeat.measuring(f"the ResNet-50 set: {label}")
        sec = times[label] = timeit(fn, args.resnet_iters, 2, barrier)
        log(f"{label:>36}: {sec * 1e3:8.2f} ms  ({total * 4 / sec / 1e9:.2f} GB/s)")
    if not args.no_out_of_place:
        ratio = times["hvdcompat out of place (async, fused)"] / times["hvdcompat (async, fused)"]
        log(f"{'out of place / in place':>36}: {ratio:8.2f}")
    stats = hvd.engine_stats()
    log(f"\n# engine: {stats['collectives']} collectives for {stats['tensors']} tensors, "
        f"{stats['fused_tensors']} tensors fused, cache hits {stats['cache_hits']}, "
        f"misses {stats['cache_misses']}")
    if args.hierarchical:
        log(f"# hierarchical MPI calls in the last engine: {stats['hierarchical_allreduces']} "
            "(0: the layout does not qualify, see HOROVOD_LOG_LEVEL=info)")
    if args.pool_compare:
        if args.hierarchical:
            hierarchical_engine(False, args.pseudo_node_size)
        pool_compare(sizes, grads, args, log, heartbeat)
    if args.autotune:
        compare_autotune(args, shapes, log)
    if dist is not None:
        dist.destroy_process_group()
    hvd.shutdown()


def settings():
    s = hvd.engine_stats()
    return (f"{human(s['fusion_threshold_bytes']):>9} {s['cycle_time_ms']:6.1f} "
            f"{human(s['fusion_chunk_bytes']):>8} {human(s['max_call_bytes']):>8}")


def compare_autotune(args, shapes, log):
    """The ResNet-50 set (Average, in place): search, then default and tuned in turns."""
    total = sum(math.prod(s) for s in shapes)
    g = torch.Generator().manual_seed(1000 + hvd.rank())
    grads = [torch.randn(s, generator=g) for s in shapes]
    fixed = [x.clone() for x in grads]
    launch_env = {k: os.environ.get(k) for k in (*TUNED_KNOBS, *AUTOTUNE_KNOBS)}

    def step():
        handles = [hvd.allreduce_async_(x, op=hvd.Average, name=f"resnet.{i}")
                   for i, x in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    def reduced():
        """Every tensor of the set reduced once (Sum, out of place) from fixed inputs."""
        handles = [hvd.allreduce_async(x, op=hvd.Sum, name=f"check.{i}")
                   for i, x in enumerate(fixed)]
        return [hvd.synchronize(h) for h in handles]

    restart(launch_env, HOROVOD_AUTOTUNE="1",
            HOROVOD_AUTOTUNE_WARMUP_SAMPLES=str(args.autotune_warmup_samples),
            HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=str(args.autotune_steps_per_sample),
            HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=str(args.autotune_bayes_opt_max_samples),
            HOROVOD_AUTOTUNE_LOG=args.autotune_log_file)
    t0, steps = time.perf_counter(), 0
    while True:
        for _ in range(5):
            step()
            steps += 1
        active = torch.tensor([int(hvd.engine_stats()["autotune_active"])])
        if hvd.allreduce(active, op=hvd.Max, name="autotune.active").item() == 0:
            break
    searched = time.perf_counter() - t0
    found = hvd.engine_stats()
    tuned_env = {k: str(found[v]) for k, v in TUNED_KNOBS.items()}
    # Default and tuned engines in turns, so load that comes and goes hits both alike.
    times = {"default": [], "autotuned": []}
    knobs, results = {}, {}
    for _ in range(args.autotune_rounds):
        for label, env in (("default", {}), ("autotuned", tuned_env)):
            restart(launch_env, **env)
            times[label].append(timeit(step, args.resnet_iters, 2, hvd.barrier))
            knobs[label] = settings()
            results[label] = reduced()
    same = all(torch.equal(a, b) for a, b in zip(results["default"], results["autotuned"]))
    same = hvd.allreduce(torch.tensor([int(same)]), op=hvd.Min, name="autotune.same").item()
    log(f"\n# ResNet-50 gradient set, Average in place: default vs the settings "
        f"HOROVOD_AUTOTUNE=1 found (warm-up {args.autotune_warmup_samples}, "
        f"{args.autotune_steps_per_sample} steps per sample, "
        f"{args.autotune_bayes_opt_max_samples} configurations); median of "
        f"{args.resnet_iters} per round, median of {args.autotune_rounds} alternating rounds")
    header = (f"{'engine':>10} | {'fusion':>9} {'cycle':>6} {'chunk':>8} {'call':>8} | "
              f"{'ms':>8} {'GB/s':>6} | {'vs default':>10} | rounds (ms)")
    log(header)
    log("-" * len(header))
    base = statistics.median(times["default"])
    for label in ("default", "autotuned"):
        sec = statistics.median(times[label])
        each = " ".join(f"{t * 1e3:.0f}" for t in times[label])
        log(f"{label:>10} | {knobs[label]} | {sec * 1e3:8.2f} {total * 4 / sec / 1e9:6.2f} | "
            f"{base / sec:9.2f}x | {each}")
    log(f"# search: {steps} steps, {searched:.1f} s; results bitwise identical to the "
        f"default engine's on every rank: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    sys.exit(main())
