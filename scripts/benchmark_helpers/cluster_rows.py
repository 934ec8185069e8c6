"""examples/allreduce_benchmark.py --hosts: the cluster rows (a helper of that benchmark).

The driver (``main``) builds two test hosts (tests/cluster/testhosts.py, root),
and for every layout and link rate launches one job of ``worker`` under
hvdcompatrun; the worker times hvdcompat's default engine and the same engine
in Horovod's configuration in alternating rounds and prints one line that the
driver turns into a table row. Then the synthetic training benchmark runs on
2 hosts x 1 rank in both configurations, alternating.
"""

import argparse
import os
import re
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Horovod 0.28.1's defaults and transport on our engine: 1 ms cycle, 64 MiB
# fusion buffer, every fused response in one MPI call (no pipelined chunks, no
# call split, every tensor through the fusion buffer), the single-host plan.
HOROVOD_CONFIGURATION = {
    "HOROVOD_CYCLE_TIME": "1",
    "HOROVOD_FUSION_THRESHOLD": str(64 << 20),
    "HVDCOMPAT_FUSION_CHUNK_BYTES": str(1 << 30),
    "HVDCOMPAT_MAX_CALL_BYTES": str(1 << 30),
    "HVDCOMPAT_INPLACE_MIN_BYTES": str(1 << 30),
    "HVDCOMPAT_LINK_PLAN": "host",
}
RESNET50_BYTES = 25_557_032 * 4
ROW = re.compile(r"CLUSTER-ROW (.*)$", re.M)


def worker(args):
    """One rank of a row's job; rank 0 prints ``CLUSTER-ROW key=value ...``."""
    import torch

    import allreduce_benchmark as bench
    import hvdcompat as hvd
    from benchmark_helpers.engine_restart import restart

    hvd.init()
    launch_env = {k: os.environ.get(k) for k in HOROVOD_CONFIGURATION}
    shapes = bench.resnet50_shapes()
    g = torch.Generator().manual_seed(7 + hvd.rank())
    grads = [torch.randn(s, generator=g) for s in shapes]

    def fp32_set():
        handles = [hvd.allreduce_async_(x, op=hvd.Average, name=f"set.{i}")
                   for i, x in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    fp16 = hvd.Compression.fp16

    def fp16_set():
        # What DistributedOptimizer(compression=fp16) does per gradient.
        sent = [fp16.compress(x) for x in grads]
        handles = [hvd.allreduce_async_(c, op=hvd.Average, name=f"set16.{i}")
                   for i, (c, _) in enumerate(sent)]
        for (c, ctx), h, x in zip(sent, handles, grads):
            x.copy_(fp16.decompress(hvd.synchronize(h), ctx))

    engines = {"default": {}, "horovod": HOROVOD_CONFIGURATION}
    times = {(e, k): [] for e in engines for k in ("fp32", "fp16")}
    plans = {}
    for _ in range(args.rounds):
        for name, env in engines.items():
            restart(launch_env, **env)
            for kind, fn in (("fp32", fp32_set), ("fp16", fp16_set)):
                times[(name, kind)].append(bench.timeit(fn, args.iters, 1, hvd.barrier))
            s = hvd.engine_stats()
            plans[name] = ("network" if s["network_allreduces"] else "host") + (
                "+hierarchical" if s["hierarchical_allreduces"] else "")
    if hvd.rank() == 0:
        cells = [f"{e}.{k}={statistics.median(v) * 1e3:.1f}" for (e, k), v in times.items()]
        cells += [f"{e}.plan={p}" for e, p in plans.items()]
        cells.append(f"ranks={hvd.size()} hosts={hvd.cross_size()}")
        print("CLUSTER-ROW " + " ".join(cells), flush=True)
    hvd.shutdown()
    return 0


def segments_worker(args):
    """One rank of the raw-MPI segment job: the set's bytes in one buffer, per call size."""
    import numpy as np
    from mpi4py import MPI

    import hvdcompat as hvd

    hvd.init()  # selects libnbc's ring for MPI_Iallreduce, as the engine runs it
    comm = MPI.COMM_WORLD
    total = RESNET50_BYTES // 4
    buf = np.ones(total, dtype=np.float32)

    def med(fn):
        fn()
        times = []
        for _ in range(args.iters):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    def blocking(seg):
        for off in range(0, total, seg):
            comm.Allreduce(MPI.IN_PLACE, buf[off:off + seg])

    def pipelined(seg, depth):
        reqs = []
        for off in range(0, total, seg):
            if len(reqs) >= depth:
                reqs.pop(0).Wait()
            reqs.append(comm.Iallreduce(MPI.IN_PLACE, buf[off:off + seg]))
        MPI.Request.Waitall(reqs)

    mibs = [1, 4, 16, 64, 128]
    rows = [("blocking MPI_Allreduce, one after another",
             [med(lambda: blocking(m << 18)) for m in mibs])]
    for depth in (1, 2, 4):
        rows.append((f"MPI_Iallreduce (ring), {depth} in flight",
                     [med(lambda: pipelined(m << 18, depth)) for m in mibs]))
    if comm.rank == 0:
        print("| raw MPI, per call | " + " | ".join(f"{m} MiB" for m in mibs) + " |")
        print("|---|" + "---|" * len(mibs))
        for label, cells in rows:
            print(f"| {label} | " + " | ".join(f"{c:.0f} ms" for c in cells) + " |", flush=True)
    hvd.shutdown()
    return 0


def _segments(cluster, args):
    cluster.limit(None if args.segments_rate == "none" else args.segments_rate)
    print(f"\n# raw MPI (mpi4py) between 2 hosts x 1 rank, host link {args.segments_rate}: "
          f"the ResNet-50 set's {RESNET50_BYTES / 2**20:.1f} MiB in one float32 buffer, reduced "
          f"in calls of each size (128 MiB: one call); ms, median of {args.iters} ({_load()})")
    out = _launch(cluster, [1, 1], [sys.executable, os.path.join("examples",
                                                                 "allreduce_benchmark.py"),
                                    "--hosts", "--segments-worker", "--iters", str(args.iters)],
                  args.timeout)
    print("\n".join(l.split("<stdout>:", 1)[-1].strip() for l in out.splitlines()
                    if l.split("<stdout>:", 1)[-1].strip().startswith("|")), flush=True)


def _parse_row(output):
    m = ROW.search(output)
    if not m:
        return None
    return dict(kv.split("=", 1) for kv in m.group(1).split())


def _launch(cluster, layout, command, timeout, env=None):
    from cluster_harness import host_list, run_hvdcompatrun

    result = run_hvdcompatrun(cluster, ["-H", host_list(cluster, layout), "--mpi-args",
                                        " ".join(cluster.mpi_args()), *command], timeout,
                              env=env, check=False)
    if result.returncode != 0:
        print(result.output[-4000:], file=sys.stderr)
        raise SystemExit(f"allreduce_benchmark --hosts: {' '.join(command)} on layout "
                         f"{layout} failed ({result.returncode})")
    return result.output


def _rate_bits(rate):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def _load():
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv):
    """Driver of ``allreduce_benchmark.py --hosts``: prints the cluster table."""
    parser = argparse.ArgumentParser(prog="allreduce_benchmark.py --hosts",
                                     description="hvdcompat on simulated hosts vs Horovod's "
                                                 "configuration and the link floor")
    parser.add_argument("--hosts", action="store_true")
    parser.add_argument("--layouts", default="1,1;2,2",
                        help="ranks per host, hosts separated by commas, layouts by ';'")
    parser.add_argument("--rates", default="none,1gbit",
                        help="tbf rates of the host links ('none': unlimited)")
    parser.add_argument("--iters", type=int, default=3, help="timed sets per round")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternating default / Horovod-configuration rounds per row")
    parser.add_argument("--train-iters", type=int, default=3)
    parser.add_argument("--train-batches", type=int, default=2)
    parser.add_argument("--train-model", default="mlp")
    parser.add_argument("--train-rate", default="1gbit")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--segments", action="store_true",
                        help="also raw MPI per call size and calls in flight (Open MPI's TCP "
                             "transport between the hosts)")
    parser.add_argument("--segments-rate", default="1gbit")
    parser.add_argument("--only-segments", action="store_true",
                        help="only the raw MPI segment table")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--segments-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.segments_worker:
        return segments_worker(args)

    sys.path.insert(0, os.path.join(REPO, "tests"))
    sys.path.insert(0, os.path.join(REPO, "tests", "cluster"))
    from testhosts import ClusterUnavailable, HostCluster

    try:
        cluster = HostCluster(2)
    except ClusterUnavailable as e:
        print(f"allreduce_benchmark --hosts: {e}", file=sys.stderr)
        return 2
    layouts = [[int(n) for n in l.split(",")] for l in args.layouts.split(";")]
    rates = args.rates.split(",")
    worker_cmd = [sys.executable, os.path.join("examples", "allreduce_benchmark.py"), "--hosts",
                  "--worker", "--iters", str(args.iters), "--rounds", str(args.rounds)]
    print(f"# test hosts {', '.join(cluster.names)} on {cluster.subnet} (namespaces of this "
          f"machine: {os.cpu_count()} cores shared by every rank); {_load()}", flush=True)
    with cluster:
        if args.segments or args.only_segments:
            _segments(cluster, args)
            if args.only_segments:
                return 0
        print("# ResNet-50 gradient set (161 tensors, 97.5 MiB), Average in place, async then "
              f"synchronize; ms, median of {args.iters} per round, median of {args.rounds} "
              "alternating rounds")
        print("# Horovod configuration: hvdcompat's engine with " +
              " ".join(f"{k}={v}" for k, v in HOROVOD_CONFIGURATION.items()) +
              " (Horovod 0.28.1 is not installed here: it does not build against this torch)")
        header = (f"| layout | host link | hvdcompat | Horovod configuration | link floor | "
                  f"hvdcompat / floor | fp16: hvdcompat | fp16: Horovod conf. | fp16 floor | "
                  f"plan | load |")
        print(header)
        print("|" + "---|" * 11, flush=True)
        for rate in rates:
            cluster.limit(None if rate == "none" else rate)
            bits = _rate_bits(rate)
            for layout in layouts:
                out = _launch(cluster, layout, worker_cmd, args.timeout)
                row = _parse_row(out)
                if row is None:
                    print(out[-4000:], file=sys.stderr)
                    raise SystemExit("allreduce_benchmark --hosts: the worker printed no row")
                # Each host sends (and receives) the set once: the fewest bytes any
                # allreduce can put on one host's link (hierarchical or 2-rank ring).
                floor = RESNET50_BYTES * 8 / bits * 1e3 if bits else None
                d, h = float(row["default.fp32"]), float(row["horovod.fp32"])
                d16, h16 = float(row["default.fp16"]), float(row["horovod.fp16"])
                cells = [f"{len(layout)} hosts x {layout[0]} rank{'s' if layout[0] > 1 else ''}",
                         "unlimited" if rate == "none" else f"{rate} (tbf)",
                         f"**{d:.0f}**", f"{h:.0f}", f"{floor:.0f}" if floor else "—",
                         f"{d / floor:.2f}x" if floor else "—", f"{d16:.0f}", f"{h16:.0f}",
                         f"{floor / 2:.0f}" if floor else "—", row["default.plan"],
                         f"{os.getloadavg()[0]:.1f}"]
                print("| " + " | ".join(cells) + " |", flush=True)
        if not args.skip_training:
            _training(cluster, args)
    print(f"# done; {_load()}")
    return 0


def _training(cluster, args):
    cluster.limit(None if args.train_rate == "none" else args.train_rate)
    cmd = [sys.executable, os.path.join("examples", "pytorch_synthetic_benchmark.py"),
           "--model", args.train_model, "--num-warmup-batches", "1",
           "--num-batches-per-iter", str(args.train_batches), "--num-iters",
           str(args.train_iters)]
    rates = {"default": [], "horovod": []}
    for _ in range(args.rounds):
        for name, env in (("default", {}), ("horovod", HOROVOD_CONFIGURATION)):
            out = _launch(cluster, [1, 1], cmd, args.timeout, env=env)
            m = re.search(r"Total img/sec on \d+ rank\(s\): ([\d.]+)", out)
            rates[name].append(float(m.group(1)) if m else float("nan"))
    d, h = statistics.median(rates["default"]), statistics.median(rates["horovod"])
    print(f"\n# examples/pytorch_synthetic_benchmark.py --model {args.train_model} on 2 hosts x "
          f"1 rank, host link {args.train_rate}: total img/sec, median of {args.rounds} "
          f"alternating launches ({_load()})")
    print(f"#   hvdcompat {d:.1f}  Horovod configuration {h:.1f}  ratio {d / h:.2f}  "
          f"(each launch: " + ", ".join(f"{k} " + " ".join(f"{x:.1f}" for x in v)
                                        for k, v in rates.items()) + ")", flush=True)
