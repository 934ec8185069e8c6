"""hvdcompat against Horovod 0.28.1 itself, measured in the same run on this machine.

    python scripts/horovod_side_by_side.py allreduce -np 2
    python scripts/horovod_side_by_side.py train -np 2 --model resnet --batch-size 32 --ceiling
    python scripts/horovod_side_by_side.py train -np 2 --resnet-width 64 --image-size 64 \
        --batch-size 8 --ceiling --ddp --mpi4py-first     # the communication-heavy case
    python scripts/horovod_side_by_side.py ddp -np 2
    python scripts/horovod_side_by_side.py allreduce --horovod-python /path/venv/bin/python

One worker script, two environments: the same code (``hvd`` is
``hvdcompat`` in this Python, ``horovod.torch`` in Horovod's) runs as one job
per implementation and round, the jobs alternating (hvdcompat, Horovod,
hvdcompat, Horovod, ...), each launched by its own environment's mpirun
(each was built against its own MPI; two MPIs cannot share a process).
The table gives the median over the rounds of each job's median.

allreduce: float32 Sum, synchronous, in place (``allreduce_``) and out of
place (``allreduce``), per size; then ResNet-50's 161 gradients submitted
asynchronously and synchronized; raw MPI (mpi4py Allreduce in place) in
hvdcompat's job. Every rank checks the reduced values.
train: examples/pytorch_synthetic_benchmark.py's models (scripts/benchmark_helpers/synthetic_models.py)
under DistributedOptimizer, images/sec per rank and in total; --ceiling adds
the no-communication ceiling (every rank trains its own copy with the plain
optimizer) in rounds alternating with DistributedOptimizer's in each job;
--ddp adds torch's DistributedDataParallel on gloo (same model, plain
optimizer) in hvdcompat's job, in the same alternation. --mpi4py-first
imports mpi4py (which starts MPI) before the implementation in every job.
ddp: examples/pytorch_ddp_benchmark.py's MLP, steps/s: DDP on gloo, on the
hvdcompat backend and on gloo with the accelerate hook in hvdcompat's job
(Horovod has no DDP backend), and DistributedOptimizer in both jobs.

Horovod's environment: --horovod-python, else $HOROVOD_PYTHON, else
/tmp/horovod-anchor/venv/bin/python (what ../shared/anchors/build_horovod.sh
builds). Without one that imports horovod.torch the Horovod column is left
out and the table says so.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ROW = "SIDE-BY-SIDE "


def parse_size(text):
    t = text.strip().upper()
    for u, f in (("KIB", 1 << 10), ("MIB", 1 << 20), ("GIB", 1 << 30), ("B", 1)):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * f)
    return int(t)


# ----------------------------------------------------------------------------- workers

def import_hvd(impl):
    if impl == "horovod":
        import horovod.torch as hvd
    else:
        import hvdcompat as hvd
    return hvd


def median_ms(fn, iters, warmup, barrier):
    from benchmark_helpers.bench_common import timeit
    return timeit(fn, iters, warmup, barrier) * 1e3


def allreduce_worker(args, hvd):
    import torch

    sys.path.insert(0, HERE)
    from negotiation_scaling import resnet50_shapes

    r, n = hvd.rank(), hvd.size()
    barrier = lambda: hvd.allreduce(torch.zeros(1), name="side.barrier")  # noqa: E731
    row = {"impl": args.impl, "ranks": n}
    comm = None
    if args.impl == "hvdcompat":
        try:  # raw MPI's time, in the same job (after hvd.init, which started MPI)
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        except ImportError:
            pass
    for size in args.sizes.split(","):
        count = parse_size(size) // 4
        x = torch.ones(count)

        def once(x=x, size=size):
            x.fill_(1.0)
            hvd.allreduce_(x, op=hvd.Sum, name=f"side.{size}")

        row[size] = median_ms(once, args.iters, args.warmup, barrier)
        if not torch.equal(x[:16], torch.full((min(16, count),), float(n))):
            raise AssertionError(f"{args.impl} rank {r}: {size} sum is {x[:4]}, want {n}")
        out = [None]

        def out_of_place(x=x, size=size, out=out):
            out[0] = None  # the previous output goes back before the next is made
            out[0] = hvd.allreduce(x, op=hvd.Sum, name=f"side.out.{size}")

        row["out " + size] = median_ms(out_of_place, args.iters, args.warmup, barrier)
        if not torch.equal(out[0][:16], x[:16] * n):
            raise AssertionError(f"{args.impl} rank {r}: {size} out-of-place sum is wrong")
        if comm is not None:
            a = x.numpy()
            row["mpi " + size] = median_ms(lambda a=a: comm.Allreduce(MPI.IN_PLACE, a),
                                           args.iters, args.warmup, comm.Barrier)
    grads = [torch.ones(s) for s in resnet50_shapes()]

    def resnet_set():
        for g in grads:
            g.fill_(1.0)
        handles = [hvd.allreduce_async_(g, op=hvd.Sum, name=f"side.grad.{i}")
                   for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    row["ResNet-50"] = median_ms(resnet_set, args.resnet_iters, 1, barrier)
    if not all(float(g.view(-1)[0]) == n for g in grads):
        raise AssertionError(f"{args.impl} rank {r}: ResNet-50 set sums are wrong")
    return row


def train_worker(args, hvd):
    """Images/sec under DistributedOptimizer; with --ceiling, in alternating rounds with the
    same model trained by every rank alone (plain optimizer, no gradient exchange); with
    --ddp (hvdcompat's job), also under DDP on gloo."""
    import torch
    import torch.nn.functional as F

    ddp = args.ddp and args.impl == "hvdcompat"
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        import hvdcompat.ddp  # noqa: F401  (fills RANK, MASTER_ADDR, ... under mpirun)

        dist.init_process_group("gloo")

    sys.path.insert(0, HERE)
    from benchmark_helpers.synthetic_models import build

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.size()))

    def trainer(kind):
        torch.manual_seed(1234)
        model, data, target, unit = build(args)
        if kind == "ddp":
            model = DDP(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
        if kind == "distributed":
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)

        def batch():
            opt.zero_grad()
            F.cross_entropy(model(data), target).backward()
            opt.step()

        for _ in range(args.num_warmup_batches):
            batch()
        return batch, unit

    kinds = (["ceiling"] if args.ceiling else []) + ["distributed"] + (["ddp"] if ddp else [])
    batches = {k: trainer(k) for k in kinds}
    unit = batches["distributed"][1]
    rates = {k: [] for k in kinds}
    for _ in range(args.ceiling_rounds if args.ceiling else 1):
        for kind in kinds:
            batch = batches[kind][0]
            for _ in range(args.num_iters):
                hvd.allreduce(torch.zeros(1), name="side.align")
                t0 = time.perf_counter()
                for _ in range(args.num_batches_per_iter):
                    batch()
                rates[kind].append(args.batch_size * args.num_batches_per_iter /
                                   (time.perf_counter() - t0))
    row = {"impl": args.impl, "ranks": hvd.size(), "unit": unit}
    for kind in kinds:
        mine = statistics.median(rates[kind])
        total = hvd.allreduce(torch.tensor([mine], dtype=torch.float64), op=hvd.Sum,
                              name=f"side.total.{kind}").item()
        prefix = {"distributed": "", "ceiling": "ceiling_", "ddp": "ddp_"}[kind]
        row.update({prefix + "per_rank": mine, prefix + "total": total})
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    return row


def ddp_worker(args, hvd):
    """Steps/s of examples/pytorch_ddp_benchmark.py's MLP: DDP on gloo, on the hvdcompat
    backend and with the accelerate hook (hvdcompat's job only: Horovod has no DDP
    backend), and DistributedOptimizer
    (both), in alternating rounds; the slowest rank's time counts."""
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    r = hvd.rank()

    def build():
        torch.manual_seed(0)
        layers = [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
        for _ in range(args.layers - 1):
            layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(args.hidden, 10))

    gen = torch.Generator().manual_seed(1000 + r)
    x = torch.randn(args.batch_size, args.hidden, generator=gen)
    y = torch.randint(0, 10, (args.batch_size,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()

    def stepper(model, opt):
        def step():
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        return step

    configs = {}
    if args.impl == "hvdcompat":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        import hvdcompat.ddp  # noqa: F401  (fills RANK, MASTER_ADDR, ... under mpirun)

        dist.init_process_group("gloo")
        m = DDP(build())
        configs["DDP on gloo"] = stepper(m, torch.optim.SGD(m.parameters(), lr=0.01))
        group = dist.new_group(backend="hvdcompat")
        m = DDP(build(), process_group=group)
        configs["DDP on the hvdcompat backend"] = stepper(m, torch.optim.SGD(m.parameters(),
                                                                             lr=0.01))
        from hvdcompat.ddp import hooks

        m = DDP(build())
        hooks.register(m, compression="none")  # what `import hvdcompat.ddp.accelerate` installs
        configs["DDP on gloo + accelerate hook"] = stepper(m, torch.optim.SGD(m.parameters(),
                                                                              lr=0.01))
    m = build()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01),
                                   named_parameters=m.named_parameters())
    configs["DistributedOptimizer"] = stepper(m, opt)
    rates = {k: [] for k in configs}
    for _ in range(args.ddp_rounds):
        for label, step in configs.items():
            for _ in range(args.warmup):
                step()
            hvd.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                step()
            slowest = hvd.allreduce(torch.tensor([time.perf_counter() - t0],
                                                 dtype=torch.float64), op=hvd.Max,
                                    name="side.slowest").item()
            rates[label].append(args.iters / slowest)
    row = {"impl": args.impl, "ranks": hvd.size(),
           "steps": {k: statistics.median(v) for k, v in rates.items()}}
    if args.impl == "hvdcompat":
        dist.barrier()
        dist.destroy_process_group()
    return row


def worker(args):
    if args.mpi4py_first:
        from mpi4py import MPI  # noqa: F401  (starts MPI before the implementation is imported)
    hvd = import_hvd(args.impl)
    hvd.init()
    row = {"allreduce": allreduce_worker, "train": train_worker, "ddp": ddp_worker}[args.what](
        args, hvd)
    if hvd.rank() == 0:
        print(ROW + json.dumps(row), flush=True)
    hvd.shutdown()
    return 0


# ----------------------------------------------------------------------------- driver

def horovod_python(args):
    """(python, about): Horovod's interpreter and version, or (None, why not)."""
    sys.path.insert(0, HERE)
    from benchmark_helpers import horovod_peer

    return horovod_peer.find(args.horovod_python)


def job(python, impl, args, passthrough):
    bindir = os.path.dirname(python)
    mpirun = os.path.join(bindir, "mpirun")
    if not os.access(mpirun, os.X_OK):
        mpirun = "mpirun"
    cmd = [mpirun, "-np", str(args.np), "--bind-to", "none", "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [python, os.path.abspath(__file__), "--worker", "--impl", impl, *passthrough]
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
               PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=args.timeout)
    lines = [l for l in proc.stdout.splitlines() if ROW in l]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{impl} job failed ({proc.returncode}): {' '.join(cmd)}\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].split(ROW, 1)[1])


def driver(args, passthrough):
    peer, about = horovod_python(args)
    impls = [("hvdcompat", sys.executable)] + ([("horovod", peer)] if peer else [])
    rows = {impl: [] for impl, _ in impls}
    for rnd in range(args.rounds):
        for impl, python in impls:
            t0 = time.monotonic()
            rows[impl].append(job(python, impl, args, passthrough))
            print(f"# round {rnd + 1}/{args.rounds}: {impl} job {time.monotonic() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    load = "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"# {args.what}, {args.np} ranks, {args.rounds} alternating rounds per implementation "
          f"(median of the rounds' medians); same machine, same torch; {load} at the end")
    print(f"# Horovod: {('horovod ' + about + ' at ' + peer) if peer else 'column absent: ' + about}")
    med = lambda impl, key: statistics.median(r[key] for r in rows[impl])  # noqa: E731
    if args.what == "allreduce":
        keys = args.sizes.split(",") + ["ResNet-50"]
        mpi = "mpi " + keys[0] in rows["hvdcompat"][0]
        cols = ["size", "hvdcompat ms"] + (["raw MPI ms", "hvdcompat/MPI"] if mpi else [])
        if peer:
            cols += ["Horovod 0.28.1 ms", "Horovod/hvdcompat"]
        cols += ["out of place: hvdcompat"] + (["Horovod 0.28.1"] if peer else [])
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" + "---:|" * (len(cols) - 1))
        for k in keys:
            ours = med("hvdcompat", k)
            cells = [k, f"{ours:.3f}"]
            if mpi:
                cells += ([f"{med('hvdcompat', 'mpi ' + k):.3f}",
                           f"{ours / med('hvdcompat', 'mpi ' + k):.2f}"] if k != "ResNet-50"
                          else ["—", "—"])
            if peer:
                theirs = med("horovod", k)
                cells += [f"{theirs:.3f}", f"{theirs / ours:.2f}"]
            out = "out " + k
            cells += [f"{med('hvdcompat', out):.3f}" if out in rows["hvdcompat"][0] else "—"]
            if peer:
                cells += [f"{med('horovod', out):.3f}" if out in rows["horovod"][0] else "—"]
            print("| " + " | ".join(cells) + " |")
        print("# ResNet-50: 161 tensors, 25,557,032 floats, in place, async then synchronize; "
              "raw MPI: mpi4py Allreduce in place, in hvdcompat's job")
    elif args.what == "train":
        unit = rows["hvdcompat"][0]["unit"]
        print(f"# {args.model} (width {args.resnet_width}, {args.image_size}x{args.image_size}) "
              f"batch {args.batch_size} per rank, {unit}/sec"
              + (f"; ceiling: every rank trains alone (no gradient exchange), in "
                 f"{args.ceiling_rounds} rounds alternating with DistributedOptimizer's in "
                 "each job" if args.ceiling else "")
              + ("; MPI started by mpi4py first" if args.mpi4py_first else ""))
        # DDP on gloo ran in hvdcompat's jobs only (Horovod has no DDP backend): its ceiling
        # is the one measured in those jobs.
        ddp = args.ddp
        impls_here = ["hvdcompat"] + (["horovod"] if peer else [])
        cols = (["", "hvdcompat"] + (["DDP on gloo"] if ddp else [])
                + (["Horovod 0.28.1", "hvdcompat / Horovod"] if peer else []))
        print("| " + " | ".join(cols) + " |")
        print("|---|" + "---:|" * (len(cols) - 1))
        lines = [("per_rank", "per rank"), ("total", "total")]
        if args.ceiling:
            lines += [("ceiling_per_rank", "ceiling, per rank (no communication)")]
        for key, label in lines:
            vals = [med(i, key) for i in impls_here]
            cells = [label, f"{vals[0]:.1f}"]
            if ddp:
                ddp_key = key if key.startswith("ceiling") else "ddp_" + key
                cells.append(f"{med('hvdcompat', ddp_key):.1f}")
            if peer:
                cells += [f"{vals[1]:.1f}", f"{vals[0] / vals[1]:.2f}"]
            print("| " + " | ".join(cells) + " |")
        if args.ceiling:
            of = lambda rows_, key: statistics.median(  # noqa: E731
                r[key] / r["ceiling_per_rank"] for r in rows_)
            fr = [of(rows[i], "per_rank") for i in impls_here]
            cells = ["of its ceiling", f"{fr[0]:.2f}"]
            if ddp:
                cells.append(f"{of(rows['hvdcompat'], 'ddp_per_rank'):.2f}")
            if peer:
                cells += [f"{fr[1]:.2f}", f"{fr[0] / fr[1]:.2f}"]
            print("| " + " | ".join(cells) + " |")
        if ddp:
            print("# DDP on gloo: torch's DistributedDataParallel (same model, plain optimizer) "
                  "in hvdcompat's jobs, in the same alternation; its ceiling is theirs")
    else:
        print(f"# MLP {args.layers}x{args.hidden}, batch {args.batch_size} per rank, SGD; "
              f"steps/s of the slowest rank, {args.warmup} warm-up + {args.iters} timed steps, "
              f"{args.ddp_rounds} rounds alternating within each job")
        print("| implementation | configuration | steps/s | samples/s | vs DDP on gloo |")
        print("|---|---|---:|---:|---:|")
        base = statistics.median(r["steps"]["DDP on gloo"] for r in rows["hvdcompat"])
        for impl in ["hvdcompat"] + (["horovod"] if peer else []):
            for label in rows[impl][0]["steps"]:
                v = statistics.median(r["steps"][label] for r in rows[impl])
                print(f"| {'Horovod 0.28.1' if impl == 'horovod' else 'hvdcompat'} | {label} | "
                      f"{v:.2f} | {v * args.batch_size * args.np:.1f} | {v / base:.2f}x |")
        if not peer:
            print("# (no Horovod row: see the line above)")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("allreduce", "train", "ddp"))
    parser.add_argument("-np", "--np", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--horovod-python")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per job")
    # allreduce
    parser.add_argument("--sizes", default="4KiB,64KiB,1MiB,16MiB,64MiB")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--resnet-iters", type=int, default=10)
    # train (as examples/pytorch_synthetic_benchmark.py)
    parser.add_argument("--model", choices=("resnet", "mlp", "transformer"), default="resnet")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--resnet-width", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--num-warmup-batches", type=int, default=3)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--ceiling", action="store_true",
                        help="train: also the no-communication ceiling, in alternating rounds")
    parser.add_argument("--ceiling-rounds", type=int, default=2)
    parser.add_argument("--ddp", action="store_true",
                        help="train: also DDP on gloo in hvdcompat's job, in the same rounds")
    parser.add_argument("--mpi4py-first", action="store_true",
                        help="import mpi4py (starting MPI) before hvdcompat or Horovod")
    # ddp (as examples/pytorch_ddp_benchmark.py; --iters and --warmup are the steps)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--ddp-rounds", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="hvdcompat", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    return driver(args, _passthrough(sys.argv[1:] if argv is None else argv))


def _passthrough(argv):
    """The command line without the driver's own options (the worker gets the rest)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("-np", "--np", "--rounds", "--horovod-python", "--timeout"):
            skip = True
            continue
        if a.split("=", 1)[0] in ("--np", "--rounds", "--horovod-python", "--timeout"):
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
