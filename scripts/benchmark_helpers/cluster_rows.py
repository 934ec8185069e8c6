"""examples/allreduce_benchmark.py --hosts: the cluster rows (a helper of that benchmark).

The driver (``main``) builds two test hosts (tests/cluster/testhosts.py, root),
and for every layout and link rate runs ``worker`` in alternating jobs of
hvdcompat (under hvdcompatrun) and Horovod 0.28.1 itself (under its own
environment's mpirun, benchmark_helpers/horovod_peer.py); each job prints one line
that the driver turns into the row's cells. Then the synthetic training
benchmark's models (scripts/horovod_side_by_side.py train) run on 2 hosts x
1 rank with both, alternating.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESNET50_BYTES = 25_557_032 * 4
ROW = re.compile(r"CLUSTER-ROW (.*)$", re.M)
IMPLS = ("hvdcompat", "horovod")
LABEL = {"hvdcompat": "hvdcompat", "horovod": "Horovod 0.28.1"}


def worker(args):
    """One rank of a row's job (hvdcompat or Horovod); rank 0 prints ``CLUSTER-ROW ...``."""
    import torch

    from benchmark_helpers.bench_common import resnet50_shapes, timeit

    if args.impl == "horovod":
        import horovod.torch as hvd
    else:
        import hvdcompat as hvd
    hvd.init()
    shapes = resnet50_shapes()
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

    # Every rank checks one reduced value against the mean of the ranks' inputs.
    probe = torch.full((1024,), float(hvd.rank()))
    hvd.allreduce_(probe, op=hvd.Average, name="probe")
    want = (hvd.size() - 1) / 2
    if not torch.allclose(probe, torch.full_like(probe, want)):
        raise AssertionError(f"{args.impl} rank {hvd.rank()}: Average is {probe[:4]}, want {want}")
    cells = {kind: timeit(fn, args.iters, 1, hvd.barrier) * 1e3
             for kind, fn in (("fp32", fp32_set), ("fp16", fp16_set))}
    if args.impl == "hvdcompat":
        s = hvd.engine_stats()
        if hvd.gloo_enabled():
            cells["plan"] = "ring" + ("+hierarchical" if s["hierarchical_allreduces"] else "")
        else:
            cells["plan"] = ("network" if s["network_allreduces"] else "host") + (
                "+hierarchical" if s["hierarchical_allreduces"] else "")
    else:
        cells["plan"] = "—"
    if hvd.rank() == 0:
        cells.update(ranks=hvd.size(), hosts=hvd.cross_size())
        print("CLUSTER-ROW " + " ".join(f"{k}={v}" for k, v in cells.items()), flush=True)
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


def _launch(cluster, layout, command, timeout, env=None, horovod=None, gloo=False):
    """Runs `command` on the hosts of `layout`: under hvdcompatrun, or with `horovod` (its
    Python) under the mpirun of Horovod's environment; with `gloo`, under ``hvdcompatrun
    --gloo`` or Horovod's ``horovodrun --gloo`` (both reach the other host through the
    cluster's ssh stand-in). Returns the output."""
    from cluster_harness import _run, host_list, run_hvdcompatrun

    # The launchers start remote ranks with `ssh`: the stand-in comes first on PATH.
    ssh_path = {"PATH": cluster.tmpdir + os.pathsep + os.environ.get("PATH", "")}
    if horovod is None and gloo:
        result = run_hvdcompatrun(cluster, ["--gloo", "-H", host_list(cluster, layout), *command],
                                  timeout, env={**ssh_path, **(env or {})}, check=False)
    elif horovod is None:
        result = run_hvdcompatrun(cluster, ["-H", host_list(cluster, layout), "--mpi-args",
                                            " ".join(cluster.mpi_args()), *command], timeout,
                                  env=env, check=False)
    elif gloo:
        from benchmark_helpers import horovod_peer as _horovod_peer

        piddir = tempfile.mkdtemp(prefix="hvd-pids-")
        full_env = _horovod_peer.environment(horovod)
        full_env.update(env or {})
        full_env["PATH"] = cluster.tmpdir + os.pathsep + full_env["PATH"]
        full_env["HVDCOMPAT_TEST_PIDDIR"] = piddir
        cmd = [_horovod_peer.horovodrun_of(horovod), "--gloo", "-np", str(sum(layout)), "-H",
               host_list(cluster, layout), horovod, *command[1:]]
        try:
            result = _run(cluster, cmd, timeout, full_env, piddir)
        finally:
            shutil.rmtree(piddir, ignore_errors=True)
    else:
        from benchmark_helpers import horovod_peer as _horovod_peer

        piddir = tempfile.mkdtemp(prefix="hvd-pids-")
        full_env = _horovod_peer.environment(horovod)
        full_env.update(env or {})
        full_env["HVDCOMPAT_TEST_PIDDIR"] = piddir
        cmd = [_horovod_peer.mpirun_of(horovod), "-np", str(sum(layout)), "-H",
               host_list(cluster, layout), "--bind-to", "none", "--output", "tag",
               *cluster.mpi_args(), "-x", "PATH", "-x", "PYTHONUNBUFFERED",
               *[a for k in (env or {}) for a in ("-x", k)], horovod, *command[1:]]
        try:
            result = _run(cluster, cmd, timeout, full_env, piddir)
        finally:
            shutil.rmtree(piddir, ignore_errors=True)
    if result.returncode != 0:
        print(result.output[-4000:], file=sys.stderr)
        raise SystemExit(f"allreduce_benchmark --hosts: {' '.join(command)} on layout "
                         f"{layout} ({'Horovod' if horovod else 'hvdcompat'}"
                         f"{', Gloo' if gloo else ''}) failed ({result.returncode})")
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
                                     description="hvdcompat on simulated hosts vs Horovod 0.28.1 "
                                                 "and the link floor")
    parser.add_argument("--hosts", action="store_true")
    parser.add_argument("--layouts", default="1,1;2,2",
                        help="ranks per host, hosts separated by commas, layouts by ';'")
    parser.add_argument("--rates", default="none,1gbit",
                        help="tbf rates of the host links ('none': unlimited)")
    parser.add_argument("--iters", type=int, default=3, help="timed sets per job")
    parser.add_argument("--controllers", default="mpi,gloo",
                        help="launches per implementation: mpi (hvdcompatrun / mpirun), gloo "
                             "(hvdcompatrun --gloo / horovodrun --gloo)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternating hvdcompat / Horovod jobs per row")
    parser.add_argument("--horovod-python",
                        help="Horovod's environment (default: $HOROVOD_PYTHON, else "
                             "/tmp/horovod-anchor/venv/bin/python)")
    parser.add_argument("--train-iters", type=int, default=3)
    parser.add_argument("--train-batches", type=int, default=2)
    parser.add_argument("--train-model", default="mlp")
    parser.add_argument("--train-rate", default="1gbit")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--host-prefix", default="hv",
                        help="start of the test hosts' names (2-5 lowercase letters)")
    parser.add_argument("--segments", action="store_true",
                        help="also raw MPI per call size and calls in flight (Open MPI's TCP "
                             "transport between the hosts)")
    parser.add_argument("--segments-rate", default="1gbit")
    parser.add_argument("--only-segments", action="store_true",
                        help="only the raw MPI segment table")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="hvdcompat", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--segments-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.segments_worker:
        return segments_worker(args)

    sys.path.insert(0, os.path.join(REPO, "tests"))
    sys.path.insert(0, os.path.join(REPO, "tests", "cluster"))
    from benchmark_helpers import horovod_peer as _horovod_peer
    from testhosts import ClusterUnavailable, HostCluster

    peer, about = _horovod_peer.find(args.horovod_python)
    try:
        cluster = HostCluster(2, prefix=args.host_prefix)
    except ClusterUnavailable as e:
        print(f"allreduce_benchmark --hosts: {e}", file=sys.stderr)
        return 2
    layouts = [[int(n) for n in l.split(",")] for l in args.layouts.split(";")]
    rates = args.rates.split(",")
    impls = [("hvdcompat", None)] + ([("horovod", peer)] if peer else [])
    controllers = [c for c in args.controllers.split(",") if c]
    jobs_of = [(impl, python, ctl) for impl, python in impls for ctl in controllers]
    print(f"# test hosts {', '.join(cluster.names)} on {cluster.subnet} (namespaces of this "
          f"machine: {os.cpu_count()} cores shared by every rank); {_load()}", flush=True)
    print(f"# Horovod: {('horovod ' + about + ' at ' + peer) if peer else 'rows absent: ' + about}")
    with cluster:
        if args.segments or args.only_segments:
            _segments(cluster, args)
            if args.only_segments:
                return 0
        print("# ResNet-50 gradient set (161 tensors, 97.5 MiB), Average in place, async then "
              f"synchronize, then fp16-compressed; ms, median of {args.iters} per job, median "
              f"of {args.rounds} alternating jobs per implementation and controller (MPI: "
              "hvdcompatrun / mpirun; Gloo: hvdcompatrun --gloo / horovodrun --gloo), all at "
              "their defaults")
        header = ["layout", "host link", "implementation", "controller", "ms", "/ link floor",
                  "fp16 ms", "fp16 / its floor", "plan", "load"]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header), flush=True)
        for rate in rates:
            cluster.limit(None if rate == "none" else rate)
            bits = _rate_bits(rate)
            for layout in layouts:
                jobs = {(i, c): [] for i, _, c in jobs_of}
                for _ in range(args.rounds):
                    for impl, python, ctl in jobs_of:
                        cmd = [python or sys.executable,
                               os.path.join("examples", "allreduce_benchmark.py"), "--hosts",
                               "--worker", "--impl", impl, "--iters", str(args.iters)]
                        out = _launch(cluster, layout, cmd, args.timeout, horovod=python,
                                      gloo=ctl == "gloo")
                        row = _parse_row(out)
                        if row is None:
                            print(out[-4000:], file=sys.stderr)
                            raise SystemExit("allreduce_benchmark --hosts: the worker printed "
                                             "no row")
                        jobs[(impl, ctl)].append(row)
                # Each host sends (and receives) the set once: the fewest bytes any
                # allreduce can put on one host's link (hierarchical or 2-rank ring).
                floor = RESNET50_BYTES * 8 / bits * 1e3 if bits else None
                where = (f"{len(layout)} hosts x {layout[0]} rank{'s' if layout[0] > 1 else ''}",
                         "unlimited" if rate == "none" else f"{rate} (tbf)")
                for (impl, ctl), rows in jobs.items():
                    fp32 = statistics.median(float(r["fp32"]) for r in rows)
                    fp16 = statistics.median(float(r["fp16"]) for r in rows)
                    cells = [*where, LABEL[impl], "Gloo" if ctl == "gloo" else "MPI",
                             f"{fp32:.0f}", f"{fp32 / floor:.2f}x" if floor else "—",
                             f"{fp16:.0f}", f"{fp16 / (floor / 2):.2f}x" if floor else "—",
                             rows[-1]["plan"], f"{os.getloadavg()[0]:.1f}"]
                    print("| " + " | ".join(cells) + " |", flush=True)
                if floor:
                    print(f"| {where[0]} | {where[1]} | link floor | | {floor:.0f} | 1.00x | "
                          f"{floor / 2:.0f} | 1.00x | | |", flush=True)
        if not args.skip_training:
            _training(cluster, args, impls)
    print(f"# done; {_load()}")
    return 0


def _training(cluster, args, impls):
    cluster.limit(None if args.train_rate == "none" else args.train_rate)
    rates = {impl: [] for impl, _ in impls}
    for _ in range(args.rounds):
        for impl, python in impls:
            cmd = [python or sys.executable, os.path.join("scripts", "horovod_side_by_side.py"),
                   "train", "--worker", "--impl", impl, "--model", args.train_model,
                   "--num-warmup-batches", "1", "--num-batches-per-iter",
                   str(args.train_batches), "--num-iters", str(args.train_iters)]
            out = _launch(cluster, [1, 1], cmd, args.timeout, horovod=python)
            line = next((l for l in out.splitlines() if "SIDE-BY-SIDE " in l), None)
            rates[impl].append(json.loads(line.split("SIDE-BY-SIDE ", 1)[1])["total"]
                               if line else float("nan"))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\n# scripts/horovod_side_by_side.py train --model {args.train_model} on 2 hosts x "
          f"1 rank, host link {args.train_rate}: total img/sec, median of {args.rounds} "
          f"alternating launches per implementation ({_load()})")
    print("#   " + "  ".join(f"{LABEL[k]} {v:.1f}" for k, v in med.items()) +
          (f"  hvdcompat / Horovod {med['hvdcompat'] / med['horovod']:.2f}" if "horovod" in med
           else "") + "  (each launch: " +
          ", ".join(f"{LABEL[k]} " + " ".join(f"{x:.1f}" for x in v) for k, v in rates.items()) +
          ")", flush=True)
