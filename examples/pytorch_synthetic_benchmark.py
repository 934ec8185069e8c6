"""Synthetic training benchmark: images (or samples) per second, per rank and in total.

    hvdcompatrun -np 2 python examples/pytorch_synthetic_benchmark.py
    hvdcompatrun -np 2 python examples/pytorch_synthetic_benchmark.py --measure-baseline
    hvdcompatrun -np 2 python examples/pytorch_synthetic_benchmark.py --measure-ceiling
    mpirun --allow-run-as-root -np 2 python examples/pytorch_synthetic_benchmark.py  # plain MPI
    python examples/pytorch_synthetic_benchmark.py --no-hvd              # one process alone
    hvdcompatrun -np 2 python examples/pytorch_synthetic_benchmark.py --baseline-img-sec 41.5
    hvdcompatrun -np 2 python examples/pytorch_synthetic_benchmark.py --autotune  # tuned vs default
    mpirun --allow-run-as-root -np 2 python examples/pytorch_synthetic_benchmark.py --mpi4py-first

Every rank trains the chosen model on one fixed random batch (no data loading,
so the numbers measure compute plus gradient exchange). Spreads are
mean ± 1.96·std over the timed iterations. The scaling efficiency is
total / (ranks × baseline), where the baseline is one process training
without hvdcompat on the cores (threads) one rank gets: --measure-baseline
measures it in the same job first (rank 0 trains alone while the other ranks
wait), or give an earlier --no-hvd result as --baseline-img-sec.
The models are built in (no torchvision): a ResNet-style CNN, an MLP with
large layers (communication-heavy) and a small transformer encoder.
With --autotune, after the timed iterations an engine restarted with
HOROVOD_AUTOTUNE=1 searches on the same training loop; then the default engine
and one started with the values found are timed in alternating rounds, and a
table compares the two.
With --measure-ceiling, rounds of training without communication (every rank
at once trains its own copy with the plain optimizer, the ranks aligned
between iterations) alternate with rounds of the DistributedOptimizer, and
the table gives the distributed rate as a fraction of that ceiling: the part
of the step the gradient exchange costs. A second table says where rank 0's
time goes, per batch: the tail (the wait after backward for the last
reductions) and each thread's CPU time and time waiting for a core.
--mpi4py-first starts MPI from mpi4py before hvdcompat is imported, so the
two import orders can be compared.
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

if "--mpi4py-first" in sys.argv:
    from mpi4py import MPI  # noqa: F401  (initialises MPI before hvdcompat is imported)

# The benchmark helpers (scripts/benchmark_helpers/) are not examples; they sit beside the
# repository's other benchmark scripts.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))

import hvdcompat as hvd  # noqa: E402
from benchmark_helpers.engine_restart import AUTOTUNE_KNOBS, TUNED_KNOBS, restart  # noqa: E402
# The models live there (Horovod's environment builds them too).
from benchmark_helpers.synthetic_models import build  # noqa: E402


# ----------------------------------------------------------------------------- helpers

def mean_conf(values):
    """(mean, 1.96 * population std): the spread Horovod's benchmark reports."""
    m = sum(values) / len(values)
    return m, 1.96 * math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("resnet", "mlp", "transformer"), default="resnet")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--image-size", type=int, default=32, help="resnet/mlp input is 3xSxS")
    p.add_argument("--resnet-width", type=int, default=16,
                   help="resnet's first-stage channels (64: ResNet-18's full width, 11.7M "
                        "parameters; 16: a quarter of it)")
    p.add_argument("--seq-len", type=int, default=64, help="transformer tokens per sample")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to fp16 for the allreduce")
    p.add_argument("--no-cuda", action="store_true", help="stay on CPU even with a GPU")
    p.add_argument("--no-hvd", action="store_true",
                   help="one process, no hvdcompat: the baseline for scaling efficiency")
    baseline = p.add_mutually_exclusive_group()
    baseline.add_argument("--measure-baseline", action="store_true",
                          help="first measure the baseline in this job: rank 0 trains alone, "
                               "without hvdcompat and with one rank's threads, while the "
                               "other ranks wait; then print the scaling efficiency")
    baseline.add_argument("--baseline-img-sec", type=float, default=None,
                          help="an earlier --no-hvd result, to print the scaling efficiency")
    p.add_argument("--measure-ceiling", action="store_true",
                   help="alternate rounds of training without communication (every rank at "
                        "once, plain optimizer) with the distributed rounds, and print the "
                        "distributed rate as a fraction of that ceiling")
    p.add_argument("--ceiling-rounds", type=int, default=2,
                   help="alternating ceiling/distributed rounds with --measure-ceiling")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads per rank (default: cores / ranks on this node)")
    p.add_argument("--autotune", action="store_true",
                   help="time the default engine, then the settings HOROVOD_AUTOTUNE=1 finds")
    p.add_argument("--autotune-warmup-samples", type=int, default=1)
    p.add_argument("--autotune-steps-per-sample", type=int, default=2)
    p.add_argument("--autotune-bayes-opt-max-samples", type=int, default=10)
    p.add_argument("--autotune-log-file", default="")
    p.add_argument("--autotune-rounds", type=int, default=2,
                   help="alternating default/tuned timing rounds")
    p.add_argument("--mpi4py-first", action="store_true",
                   help="start MPI from mpi4py before importing hvdcompat")
    args = p.parse_args()
    if args.no_hvd and (args.measure_baseline or args.measure_ceiling):
        p.error("--measure-baseline and --measure-ceiling are for a distributed run; --no-hvd "
                "is one process alone")
    if args.measure_ceiling and args.autotune:
        p.error("--measure-ceiling and --autotune each time their own rounds: choose one")
    if args.ceiling_rounds < 1:
        p.error("--ceiling-rounds must be at least 1")
    return args


def timed_run(train_batch, sync, args, unit, log, after_each=lambda: None):
    """Warm-up batches, then the timed iterations; returns the per-iteration rates.

    `after_each` runs after every warm-up batch and every iteration, outside
    the timed part.
    """
    for i in range(args.num_warmup_batches):
        t0 = time.perf_counter()
        train_batch()
        sync()
        log(f"  warm-up batch {i + 1}/{args.num_warmup_batches}: "
            f"{time.perf_counter() - t0:.2f} s")
        after_each()
    log(f"Running benchmark ({args.num_iters} iterations of {args.num_batches_per_iter} "
        "batches)...")
    rates = []
    for it in range(args.num_iters):
        t0 = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            train_batch()
        sync()
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - t0)
        rates.append(rate)
        log(f"Iter #{it}: {rate:.1f} {unit}/sec per rank")
        after_each()
    return rates


def trainer(model, optimizer, data, target):
    """One training step on the fixed batch."""
    def train_batch():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
    return train_batch


def measure_baseline(args, device, sync, rank, log):
    """Rank 0 trains a fresh copy of the model alone, without hvdcompat.

    The other ranks wait in a broadcast that rank 0 joins between iterations
    (outside its timed part), so no wait lasts longer than one iteration and
    the engine's stall check stays quiet. Returns rank 0's mean rate on every rank.
    """
    done = torch.zeros(1, dtype=torch.int32)
    if rank == 0:
        torch.manual_seed(1234)
        model, data, target, unit = build(args)
        model, data, target = model.to(device), data.to(device), target.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def between():
            hvd.broadcast_(done, root_rank=0, name="benchmark.baseline_wait")

        log(f"Measuring the baseline: rank 0 alone, no hvdcompat, same threads "
            f"({args.num_warmup_batches} warm-up batches)...")
        rates = timed_run(trainer(model, optimizer, data, target), sync, args, unit, log,
                          after_each=between)
        done.fill_(1)
        between()
        mean, conf = mean_conf(rates)
        log(f"Baseline {unit}/sec (one process, no hvdcompat): {mean:.1f} +-{conf:.1f}\n")
        del model, optimizer
    else:
        while not done.item():
            hvd.broadcast_(done, root_rank=0, name="benchmark.baseline_wait")
        mean = 0.0
    return hvd.broadcast(torch.tensor([mean], dtype=torch.float64), root_rank=0,
                         name="benchmark.baseline").item()


def engine_settings():
    s = hvd.engine_stats()
    mib = lambda n: f"{n / (1 << 20):g} MiB"  # noqa: E731
    return (f"fusion {mib(s['fusion_threshold_bytes'])}, cycle {s['cycle_time_ms']:g} ms, "
            f"chunk {mib(s['fusion_chunk_bytes'])}, call split {mib(s['max_call_bytes'])}")


def train_until_tuned(train_batch, log):
    """Trains until rank 0's search has ended; returns (batches, seconds)."""
    t0, batches = time.perf_counter(), 0
    while True:
        for _ in range(5):
            train_batch()
            batches += 1
        active = torch.tensor([int(hvd.engine_stats()["autotune_active"])])
        if hvd.allreduce(active, op=hvd.Max, name="benchmark.autotune_active").item() == 0:
            return batches, time.perf_counter() - t0
        log(f"  autotune: {batches} batches, now {engine_settings()}")


def main():
    args = parse_args()
    distributed = not args.no_hvd
    if distributed:
        hvd.init()
    rank = hvd.rank() if distributed else 0
    size = hvd.size() if distributed else 1
    local_rank = hvd.local_rank() if distributed else 0
    local_size = hvd.local_size() if distributed else 1

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    cuda = torch.cuda.is_available() and not args.no_cuda
    if cuda:
        torch.cuda.set_device(local_rank)
    else:
        # Ranks on one node share its cores; oversubscribed threads make every rank slower.
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_size))
    device = torch.device("cuda" if cuda else "cpu")

    torch.manual_seed(1234)
    model, data, target, unit = build(args)
    model, data, target = model.to(device), data.to(device), target.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size, momentum=0.9)
    if distributed:
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer,
                                             named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    params = sum(p.numel() for p in model.parameters())
    log(f"Model: {args.model} ({params / 1e6:.2f} M parameters)")
    log(f"Batch size: {args.batch_size} per rank")
    log(f"Ranks: {size} ({'CUDA' if cuda else 'CPU'}"
        + (f", {torch.get_num_threads()} threads each" if not cuda else "") + ")"
        + (f", fp16 allreduce" if args.fp16_allreduce else ""))
    if distributed:
        log(f"MPI started by: {'mpi4py, before hvdcompat' if args.mpi4py_first else 'hvdcompat'}")
    baseline = args.baseline_img_sec
    if args.measure_baseline:
        baseline = measure_baseline(args, device, sync, rank, log)
    log(f"Running warm-up ({args.num_warmup_batches} batches) on {size} rank(s)...")
    train_batch = trainer(model, optimizer, data, target)
    if args.measure_ceiling:
        compare_ceiling(args, optimizer, (model, data, target), sync, device, unit, log)
        hvd.shutdown()
        return
    rates = timed_run(train_batch, sync, args, unit, log)
    if distributed and args.autotune:
        # Later rounds run on a restarted engine: timed iterations only.
        again = argparse.Namespace(**{**vars(args), "num_warmup_batches": 0})
        compare_autotune(args, rates, lambda: timed_run(train_batch, sync, again, unit, log),
                         train_batch, unit, log)
        hvd.shutdown()
        return

    if not distributed:
        mean, conf = mean_conf(rates)
        print(f"{unit.capitalize()}/sec (one process, no hvdcompat): {mean:.1f} +-{conf:.1f}")
        print(f"Pass --baseline-img-sec {mean:.1f} to a distributed run to see its scaling "
              "efficiency.")
        return

    # Every rank's per-iteration rates; iterations line up across ranks because each
    # one ends with the same allreduces.
    all_rates = hvd.allgather(torch.tensor([rates], dtype=torch.float64),
                              name="benchmark.rates").tolist()
    totals = [sum(r[i] for r in all_rates) for i in range(len(rates))]
    if rank == 0:
        print(f"\n| rank | {unit}/sec (mean ± 1.96·std) |")
        print("|---:|---:|")
        for r, values in enumerate(all_rates):
            m, c = mean_conf(values)
            print(f"| {r} | {m:.1f} ± {c:.1f} |")
        per_rank, per_rank_conf = mean_conf([v for values in all_rates for v in values])
        total, total_conf = mean_conf(totals)
        print(f"\n{unit.capitalize()}/sec per rank: {per_rank:.1f} +-{per_rank_conf:.1f}")
        print(f"Total {unit}/sec on {size} rank(s): {total:.1f} +-{total_conf:.1f}")
        if baseline:
            how = "measured in this job" if args.measure_baseline else "--baseline-img-sec"
            print(f"Scaling efficiency vs one process ({baseline:.1f} {unit}/sec, {how}): "
                  f"{100 * total / (size * baseline):.0f}%")
    hvd.shutdown()


def gather_totals(rates):
    """Total rate over ranks of each timed iteration (they end with the same allreduces)."""
    all_rates = hvd.allgather(torch.tensor([rates], dtype=torch.float64),
                              name="benchmark.rates").tolist()
    return [sum(r[i] for r in all_rates) for i in range(len(rates))]


def compare_ceiling(args, optimizer, batch_of, sync, device, unit, log):
    """Rounds without communication and distributed rounds in turns, then the table.

    The ceiling is what the ranks reach training at the same time with no
    gradient exchange: same model, batch, threads and cores, each rank on its
    own copy with the plain optimizer. An allreduce of one number between
    iterations (outside the timed part) keeps the ranks side by side, so
    neither ever has the machine to itself. Alternating the rounds lets load
    that comes and goes hit both alike. The distributed step is the one
    ``optimizer.step()`` takes, split to time its tail: the wait, after
    backward, for the last gradients' reductions.
    """
    model, data, target = batch_of
    tails = []

    def distributed_batch():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        t0 = time.perf_counter()
        optimizer.synchronize()
        tails.append(time.perf_counter() - t0)
        with optimizer.skip_synchronize():
            optimizer.step()

    torch.manual_seed(1234)
    model_c, data_c, target_c, _ = build(args)
    model_c, data_c, target_c = model_c.to(device), data_c.to(device), target_c.to(device)
    plain = torch.optim.SGD(model_c.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    alone_batch = trainer(model_c, plain, data_c, target_c)
    tick = torch.zeros(1)

    def align():
        hvd.allreduce(tick, name="benchmark.ceiling_align")

    rates = {"ceiling": [], "distributed": []}
    times = {"ceiling": {}, "distributed": {}}
    for r in range(args.ceiling_rounds):
        for label, batch in (("ceiling", alone_batch), ("distributed", distributed_batch)):
            what = ("without communication" if label == "ceiling"
                    else "with the DistributedOptimizer")
            log(f"Round {r + 1}/{args.ceiling_rounds}, {what}:")
            # Warm-up only in the first round of each kind.
            again = args if r == 0 else argparse.Namespace(**{**vars(args),
                                                              "num_warmup_batches": 0})
            align()
            t0, wall0 = thread_times(), time.perf_counter()
            rates[label] += gather_per_rank_rates(timed_run(batch, sync, again, unit, log,
                                                            after_each=align))
            batches = again.num_warmup_batches + again.num_iters * again.num_batches_per_iter
            add_thread_times(times[label], t0, thread_times(), time.perf_counter() - wall0,
                             batches)
    times["distributed"]["tail"] = sum(tails)
    if hvd.rank() == 0:
        ceiling = mean_conf(rates["ceiling"])
        dist = mean_conf(rates["distributed"])
        print(f"\n| training on {hvd.size()} ranks | {unit}/sec per rank (mean ± 1.96·std) | "
              "of ceiling |")
        print("|---|---:|---:|")
        print(f"| no communication (ceiling) | {ceiling[0]:.1f} ± {ceiling[1]:.1f} | 1.00 |")
        print(f"| DistributedOptimizer | {dist[0]:.1f} ± {dist[1]:.1f} | "
              f"{dist[0] / ceiling[0]:.2f} |")
        print(f"\nCeiling {unit}/sec per rank: {ceiling[0]:.1f}; distributed: {dist[0]:.1f} "
              f"({dist[0] / ceiling[0]:.2f} of ceiling; {args.ceiling_rounds} alternating rounds "
              f"of {args.num_iters} iterations each).")
        print_thread_times(times)


def thread_times():
    """{thread name: (CPU seconds, seconds waiting for a core)} of this process's threads.

    From /proc/self/task/*/schedstat (nanoseconds: time on a CPU, time runnable
    but waiting in the run queue); where that file is missing, the CPU time
    from .../stat (1/SC_CLK_TCK resolution) and no wait. The main thread is
    "main"; threads that share a name are summed. Linux only; elsewhere empty.
    """
    times = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return times
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    on_cpu, waiting = (int(x) / 1e9 for x in f.read().split()[:2])
            except (OSError, ValueError):
                fields = stat[stat.rindex(")") + 2:].split()  # from the 3rd field (state) on
                on_cpu, waiting = (int(fields[11]) + int(fields[12])) / tick, 0.0
        except OSError:
            continue  # the thread ended
        name = "main" if tid == str(os.getpid()) else stat[stat.index("(") + 1:stat.rindex(")")]
        cpu, wait = times.get(name, (0.0, 0.0))
        times[name] = (cpu + on_cpu, wait + waiting)
    return times


def add_thread_times(into, before, after, wall, batches):
    """Adds one round's per-thread CPU and run-queue seconds, wall seconds and batches."""
    for name, (cpu, wait) in after.items():
        cpu0, wait0 = before.get(name, (0.0, 0.0))
        into["cpu " + name] = into.get("cpu " + name, 0.0) + cpu - cpu0
        into["wait " + name] = into.get("wait " + name, 0.0) + wait - wait0
    into["wall"] = into.get("wall", 0.0) + wall
    into["batches"] = into.get("batches", 0) + batches


def print_thread_times(times):
    """Rank 0's milliseconds per batch: wall, the tail, and CPU and run-queue wait by thread."""
    ceiling, dist = times["ceiling"], times["distributed"]
    if "cpu main" not in dist:
        return
    per_batch = lambda d, k: 1000 * d.get(k, 0.0) / max(1, d["batches"])  # noqa: E731
    threads = sorted({k.split(" ", 1)[1] for k in set(ceiling) | set(dist) if " " in k},
                     key=lambda k: (k != "main", -per_batch(dist, "cpu " + k)))
    print("\n| rank 0, ms per batch | no communication | DistributedOptimizer | difference |")
    print("|---|---:|---:|---:|")
    print(f"| wall | {per_batch(ceiling, 'wall'):.1f} | {per_batch(dist, 'wall'):.1f} | "
          f"{per_batch(dist, 'wall') - per_batch(ceiling, 'wall'):+.1f} |")
    print(f"| tail: waiting after backward for the last reductions | — | "
          f"{per_batch(dist, 'tail'):.1f} | |")
    for kind, what in (("cpu", "CPU"), ("wait", "waiting for a core")):
        for name in threads:
            a, b = per_batch(ceiling, f"{kind} {name}"), per_batch(dist, f"{kind} {name}")
            if max(a, b) < 0.05:
                continue
            label = "main (training)" if name == "main" else f"thread {name}"
            print(f"| {what}: {label} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    print("(Per thread from /proc/<pid>/task/*/schedstat: time on a CPU, and time runnable but "
          "waiting for one; warm-up batches included; hvd-ps* are the engine's workers.)")


def gather_per_rank_rates(rates):
    """Every rank's per-iteration rates, as one flat list (the same on every rank)."""
    gathered = hvd.allgather(torch.tensor([rates], dtype=torch.float64),
                             name="benchmark.rates").tolist()
    return [v for values in gathered for v in values]


def compare_autotune(args, default_rates, timed, train_batch, unit, log):
    """Searches on the training loop, then times default and tuned engines in turns."""
    launch_env = {k: os.environ.get(k) for k in (*TUNED_KNOBS, *AUTOTUNE_KNOBS)}
    restart(launch_env, HOROVOD_AUTOTUNE="1",
            HOROVOD_AUTOTUNE_WARMUP_SAMPLES=str(args.autotune_warmup_samples),
            HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=str(args.autotune_steps_per_sample),
            HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=str(args.autotune_bayes_opt_max_samples),
            HOROVOD_AUTOTUNE_LOG=args.autotune_log_file)
    log(f"Autotune (warm-up {args.autotune_warmup_samples}, {args.autotune_steps_per_sample} "
        f"steps per sample, {args.autotune_bayes_opt_max_samples} configurations)...")
    batches, seconds = train_until_tuned(train_batch, log)
    log(f"  search ended after {batches} batches ({seconds:.1f} s): {engine_settings()}")
    found = hvd.engine_stats()
    tuned_env = {k: str(found[v]) for k, v in TUNED_KNOBS.items()}
    # Default and tuned engines in turns, so load that comes and goes hits both alike; the
    # first default round is the one timed before the search.
    totals = {"default": gather_totals(default_rates), "autotuned": []}
    knobs = {}
    for r in range(args.autotune_rounds):
        for label, env in (("default", {}), ("autotuned", tuned_env)):
            if label == "default" and r == 0:
                continue
            restart(launch_env, **env)
            knobs[label] = engine_settings()
            log(f"Round {r + 1}/{args.autotune_rounds}, {label} engine ({knobs[label]}):")
            totals[label] += gather_totals(timed())
    restart(launch_env)
    knobs.setdefault("default", engine_settings())
    if hvd.rank() == 0:
        print(f"\n| engine | settings | total {unit}/sec on {hvd.size()} ranks "
              "(mean ± 1.96·std) | vs default |")
        print("|---|---|---:|---:|")
        base = mean_conf(totals["default"])[0]
        for label in ("default", "autotuned"):
            mean, conf = mean_conf(totals[label])
            print(f"| {label} | {knobs[label]} | {mean:.1f} ± {conf:.1f} | {mean / base:.2f}x |")
        print(f"\nSearch: {batches} batches, {seconds:.1f} s; {args.autotune_rounds} alternating "
              f"rounds of {args.num_iters} iterations per engine.")


if __name__ == "__main__":
    main()
