"""hvdcompat against Horovod 0.28.1 itself, measured in the same run on this machine.

    python scripts/horovod_side_by_side.py allreduce -np 2
    python scripts/horovod_side_by_side.py train -np 2 --model resnet --batch-size 32
    python scripts/horovod_side_by_side.py allreduce --horovod-python /path/venv/bin/python

One worker script, two environments: the same code (``hvd`` is
``hvdcompat`` in this Python, ``horovod.torch`` in Horovod's) runs as one job
per implementation and round, the jobs alternating (hvdcompat, Horovod,
hvdcompat, Horovod, ...), each launched by its own environment's mpirun
(each was built against its own MPI; two MPIs cannot share a process).
The table gives the median over the rounds of each job's median.

allreduce: float32 Sum, synchronous, in place (``allreduce_``), per size;
then ResNet-50's 161 gradients submitted asynchronously and synchronized.
Every rank checks the reduced values against size x its own input pattern.
train: examples/pytorch_synthetic_benchmark.py's models (scripts/benchmark_helpers/synthetic_models.py)
under DistributedOptimizer, images/sec per rank and in total.

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
DEFAULT_HOROVOD = "/tmp/horovod-anchor/venv/bin/python"


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
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def allreduce_worker(args, hvd):
    import torch

    sys.path.insert(0, HERE)
    from negotiation_scaling import resnet50_shapes

    r, n = hvd.rank(), hvd.size()
    barrier = lambda: hvd.allreduce(torch.zeros(1), name="side.barrier")  # noqa: E731
    row = {"impl": args.impl, "ranks": n}
    for size in args.sizes.split(","):
        count = parse_size(size) // 4
        x = torch.ones(count)

        def once(x=x, size=size):
            x.fill_(1.0)
            hvd.allreduce_(x, op=hvd.Sum, name=f"side.{size}")

        row[size] = median_ms(once, args.iters, args.warmup, barrier)
        if not torch.equal(x[:16], torch.full((min(16, count),), float(n))):
            raise AssertionError(f"{args.impl} rank {r}: {size} sum is {x[:4]}, want {n}")
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
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, HERE)
    from benchmark_helpers.synthetic_models import build

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.size()))
    torch.manual_seed(1234)
    model, data, target, unit = build(args)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    def batch():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    for _ in range(args.num_warmup_batches):
        batch()
    rates = []
    for _ in range(args.num_iters):
        hvd.allreduce(torch.zeros(1), name="side.align")
        t0 = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            batch()
        rates.append(args.batch_size * args.num_batches_per_iter / (time.perf_counter() - t0))
    mine = statistics.median(rates)
    total = hvd.allreduce(torch.tensor([mine], dtype=torch.float64), op=hvd.Sum,
                          name="side.total").item()
    return {"impl": args.impl, "ranks": hvd.size(), "unit": unit,
            "per_rank": mine, "total": total}


def worker(args):
    hvd = import_hvd(args.impl)
    hvd.init()
    row = allreduce_worker(args, hvd) if args.what == "allreduce" else train_worker(args, hvd)
    if hvd.rank() == 0:
        print(ROW + json.dumps(row), flush=True)
    hvd.shutdown()
    return 0


# ----------------------------------------------------------------------------- driver

def horovod_python(args):
    """(python, why-not): Horovod's interpreter if it imports horovod.torch."""
    path = args.horovod_python or os.environ.get("HOROVOD_PYTHON") or DEFAULT_HOROVOD
    if not os.access(path, os.X_OK):
        return None, f"no Horovod environment ({path} does not exist)"
    probe = subprocess.run([path, "-c", "import horovod, horovod.torch; print(horovod.__version__)"],
                           capture_output=True, text=True, cwd="/", timeout=300)
    if probe.returncode != 0:
        return None, f"{path} cannot import horovod.torch: {probe.stderr.strip()[-300:]}"
    return path, probe.stdout.strip()


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
    print(f"# {args.what}, {args.np} ranks, {args.rounds} alternating rounds per implementation "
          f"(median of the rounds' medians); same machine, same torch")
    print(f"# Horovod: {('horovod ' + about + ' at ' + peer) if peer else 'column absent: ' + about}")
    if args.what == "allreduce":
        keys = args.sizes.split(",") + ["ResNet-50"]
        head = f"{'size':>10} | {'hvdcompat ms':>12}"
        if peer:
            head += f" | {'Horovod 0.28.1 ms':>17} | {'Horovod/hvdcompat':>17}"
        print(head)
        print("-" * len(head))
        for k in keys:
            ours = statistics.median(r[k] for r in rows["hvdcompat"])
            line = f"{k:>10} | {ours:>12.3f}"
            if peer:
                theirs = statistics.median(r[k] for r in rows["horovod"])
                line += f" | {theirs:>17.3f} | {theirs / ours:>17.2f}"
            print(line)
        print("# ResNet-50: 161 tensors, 25,557,032 floats, async then synchronize")
    else:
        unit = rows["hvdcompat"][0]["unit"]
        head = f"{'':>14} | {'hvdcompat':>10}" + (f" | {'Horovod 0.28.1':>14} | {'ratio':>6}"
                                                   if peer else "")
        print(f"# {args.model} batch {args.batch_size} per rank, {unit}/sec")
        print(head)
        print("-" * len(head))
        for key, label in (("per_rank", "per rank"), ("total", "total")):
            ours = statistics.median(r[key] for r in rows["hvdcompat"])
            line = f"{label:>14} | {ours:>10.1f}"
            if peer:
                theirs = statistics.median(r[key] for r in rows["horovod"])
                line += f" | {theirs:>14.1f} | {ours / theirs:>6.2f}"
            print(line)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("allreduce", "train"))
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
