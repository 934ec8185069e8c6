"""Elastic MNIST-shaped training on generated data: survives losing ranks, grows with hosts.

    hvdcompatrun -np 3 --min-np 2 python examples/pytorch_elastic.py \
        --inject-failure 1:0:2:sigkill
    hvdcompatrun --min-np 1 --host-discovery-script ./discover.sh \
        python examples/pytorch_elastic.py --hold-at 0:5

The training function runs inside ``hvd.elastic.run`` with a ``TorchState``
(model, optimizer, ElasticSampler, epoch and batch counters) committed every
``--commit-every`` batches. When a rank dies (``--inject-failure``
RANK:EPOCH:BATCH:MODE kills it, by ``exception`` or ``sigkill``), the others
get HorovodInternalError, return to the last commit, rebuild the job from the
survivors in place (Open MPI's ULFM; no restart) and continue; the sampler
deals what is left of the epoch over the new world. Each epoch the ranks also
count, in a committed tally, how often every sample was trained on, and print
whether every sample of the epoch was seen exactly once. At the end every rank
prints a checksum of its model (identical on every rank); rank 0 prints the
time from a death to the first batch trained after it, and from hosts being
added (the launcher's notice) to the first batch of the restarted job.

On the Gloo controller (``hvdcompatrun --gloo``) a host that discovery adds gets
new workers that join at the next commit while the running ones keep going
(their processes, data and memory stay); rank 0 syncs the state to them.

``--hold-at EPOCH:BATCH,...`` makes the job wait before that batch,
committing every 0.2 s, until the hosts change (so a discovery script, or a
test, can change them at a known point of training); rank 0 writes
``hold-EPOCH.BATCH`` in ``--hold-dir`` when it starts waiting.

``--stop-ranks RANK:SECONDS,...`` (with ``--inject-failure``, on one machine):
just before it dies, the failing rank stops those ranks' processes (SIGSTOP)
for that long, as a machine under load or a debugger holds a process, so they
notice the loss late (or reach the reset after the others decided the new
world; they join again at a later commit).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import hvdcompat as hvd  # was: import horovod.torch as hvd

STARTED = time.time()  # when this process started (a restart on new hosts starts new ones)


class GeneratedDigits(Dataset):
    """Ten smooth random 28x28 class patterns plus per-image noise; items are (index, image, label)."""

    def __init__(self, size, seed=0, noise=0.8):
        g = torch.Generator().manual_seed(1000)
        coarse = torch.rand(10, 1, 7, 7, generator=g)
        patterns = F.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
        g.manual_seed(seed)
        self.targets = torch.randint(0, 10, (size,), generator=g)
        images = patterns[self.targets] + noise * torch.randn(size, 1, 28, 28, generator=g)
        self.images = (images - images.mean()) / images.std()

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return i, self.images[i], self.targets[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Tally(nn.Module):
    """How many times each sample was trained on this epoch, summed over the ranks."""

    def __init__(self, n):
        super().__init__()
        self.register_buffer("seen", torch.zeros(n))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=20, help="per rank")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--commit-every", type=int, default=1, help="batches between commits")
    p.add_argument("--inject-failure", default="", metavar="RANK:EPOCH:BATCH:MODE[,...]",
                   help="rank RANK (its rank at the start; or 'all') fails before batch BATCH "
                        "of epoch EPOCH; MODE is exception or sigkill; several comma-separated")
    p.add_argument("--hold-at", default="", metavar="EPOCH:BATCH,...",
                   help="before these batches wait (committing) until the hosts change, at most "
                        "--hold-seconds")
    p.add_argument("--hold-seconds", type=float, default=60)
    p.add_argument("--hold-dir", default="",
                   help="where rank 0 writes hold-EPOCH.BATCH when it starts waiting")
    p.add_argument("--simulate-hosts", default="", metavar="NAMES",
                   help="comma-separated host name of each rank (e.g. a,a,b), to try host "
                        "removal on one machine")
    p.add_argument("--remove-host", default="", metavar="EPOCH:BATCH:HOST",
                   help="rank 0 announces HOST as removed before batch BATCH of epoch EPOCH, as "
                        "hvdcompatrun's --host-discovery-script loop does when a host disappears")
    p.add_argument("--stop-ranks", default="", metavar="RANK:SECONDS,...",
                   help="the rank that fails by --inject-failure first stops these ranks' "
                        "processes (their ranks at the start) for SECONDS each (one machine)")
    p.add_argument("--report-dir", default="",
                   help="also write one JSON report per rank here (for tests)")
    return p.parse_args()


def main():
    args = parse_args()
    if args.simulate_hosts:
        names = args.simulate_hosts.split(",")
        os.environ["HVDCOMPAT_ELASTIC_HOST"] = names[int(os.environ["OMPI_COMM_WORLD_RANK"])]
    if args.report_dir:  # every process that starts, with its host (a restart starts new ones)
        with open(os.path.join(args.report_dir, "starts"), "a") as f:
            f.write(f"{os.getpid()} {socket.gethostname()} {STARTED:.3f}\n")
    hvd.init()
    first_rank = hvd.rank()  # ranks change when others are lost; this is who we were
    torch.manual_seed(0)
    data = GeneratedDigits(args.samples)
    model, tally = Net(), Tally(len(data))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr,
                                                         momentum=0.5),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    # log: one entry per finished epoch (kept in the state, so it survives a
    # restart on new hosts); held: the (epoch, batch) holds that are over.
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, tally=tally, epoch=0,
                                   batch=0, log=(), held=())
    # Where the failing rank notes the time of its death (one machine or a shared clock):
    # under hvdcompatrun's elastic flags, in its directory, which every rank sees and which
    # needs no collective here (workers that join a running job must not meet one before
    # train() does).
    if os.environ.get("HVDCOMPAT_ELASTIC_DIR"):
        shared = os.path.join(os.environ["HVDCOMPAT_ELASTIC_DIR"], "example")
        os.makedirs(shared, exist_ok=True)
    else:
        shared = hvd.broadcast_object(tempfile.mkdtemp(prefix="hvd-elastic-")
                                      if hvd.rank() == 0 else None, name="elastic.example.dir")
    failures = [f.split(":") for f in args.inject_failure.split(",") if f]
    stops = [s.split(":") for s in args.stop_ranks.split(",") if s]
    with open(os.path.join(shared, f"pid.{first_rank}"), "w") as f:
        f.write(str(os.getpid()))
    timing = {"detected": None, "resumed": None, "grown": None}
    holds = {tuple(map(int, h.split(":"))) for h in args.hold_at.split(",") if h}

    def maybe_fail():
        matching = [f for f in failures
                    if (state.epoch, state.batch) == (int(f[1]), int(f[2]))
                    and (f[0] == "all" or int(f[0]) == first_rank)]
        if not matching:
            return
        failure = matching[0]
        for rank, seconds in stops:  # held now, let go after SECONDS by a process of their own
            with open(os.path.join(shared, f"pid.{rank}")) as f:
                pid = int(f.read())
            os.kill(pid, signal.SIGSTOP)
            subprocess.Popen(["sh", "-c", f"sleep {float(seconds)}; kill -CONT {pid}"],
                             start_new_session=True)
        with open(os.path.join(shared, f"death.{first_rank}"), "w") as f:
            f.write(repr(time.time()))
        if failure[3] == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure on rank {first_rank} at epoch {state.epoch} "
                           f"batch {state.batch}")

    removal = args.remove_host.split(":") if args.remove_host else None

    def maybe_announce_removal():
        if not removal or hvd.rank() != 0 or (state.epoch, state.batch) != (int(removal[0]),
                                                                           int(removal[1])):
            return
        with open(os.path.join(os.environ["HVDCOMPAT_ELASTIC_DIR"], "notices"), "a") as f:
            f.write(f"{time.time():.6f} {int(hvd.elastic.HostUpdateResult.removed)} "
                    f"{removal[2]}\n")

    def checksum():
        flat = torch.cat([p.detach().flatten() for p in model.state_dict().values()]).double()
        return float((flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64)).sum())

    def identical_everywhere():
        mine = torch.tensor([checksum()], dtype=torch.float64)
        low = hvd.allreduce(mine, name="checksum.min", op=hvd.Min)
        high = hvd.allreduce(mine, name="checksum.max", op=hvd.Max)
        return bool(low.item() == high.item())

    def maybe_hold():
        here = (state.epoch, state.batch)
        if here not in holds or here in state.held:
            return
        state.held = state.held + (here,)  # committed below: the hold ends with any reset
        if hvd.rank() == 0 and args.hold_dir:
            with open(os.path.join(args.hold_dir, f"hold-{here[0]}.{here[1]}"), "w") as f:
                f.write(f"{time.time():.6f}\n")
        deadline = time.monotonic() + args.hold_seconds
        while time.monotonic() < deadline:
            state.commit()  # raises HostsUpdatedInterrupt once the hosts changed
            time.sleep(0.2)
        if hvd.rank() == 0:
            print(f"hold at epoch {here[0]} batch {here[1]}: no host change in "
                  f"{args.hold_seconds} s", flush=True)

    def note_resumed():
        now = time.time()
        if timing["detected"] is not None and timing["resumed"] is None:
            timing["resumed"] = now
            deaths = [float(open(os.path.join(shared, f)).read()) for f in os.listdir(shared)
                      if f.startswith("death.")]
            if deaths and hvd.rank() == 0:
                print(f"recovery from the death to training resumed {now - min(deaths):.2f} s "
                      f"(now {hvd.size()} ranks)", flush=True)
        restarted = hvd.elastic.last_restart()
        if restarted and timing["grown"] is None:
            timing["grown"] = now - restarted["hosts_updated_at"]
            if hvd.rank() == 0:
                print(f"recovery from hosts added to training resumed {timing['grown']:.2f} s "
                      f"(restart on {hvd.size()} ranks; the state was written "
                      f"{restarted['saved_at'] - restarted['hosts_updated_at']:.2f} s after "
                      "the notice)", flush=True)

    def on_reset():
        print(f"rank {first_rank}: reset done, now rank {hvd.rank()} of {hvd.size()} "
              f"(reset took {hvd.elastic.last_reset_seconds():.2f} s)", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        try:
            while state.epoch < args.epochs:
                loss = torch.tensor(float("nan"))
                for idx, x, y in loader:
                    maybe_fail()
                    maybe_hold()
                    maybe_announce_removal()
                    optimizer.zero_grad()
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    optimizer.step()
                    counts = torch.zeros(len(data))
                    counts[idx] += 1
                    tally.seen += hvd.allreduce(counts, name="tally", op=hvd.Sum)
                    note_resumed()
                    state.sampler.record_batch(state.batch, args.batch_size)
                    state.batch += 1
                    if state.batch % args.commit_every == 0:
                        state.commit()
                once = bool((tally.seen == 1).all())
                same = identical_everywhere()
                state.log = state.log + ({"epoch": state.epoch, "size": hvd.size(),
                                          "exactly_once": once, "identical": same,
                                          "loss": loss.item()},)
                if hvd.rank() == 0:
                    print(f"epoch {state.epoch}: {hvd.size()} ranks, loss {loss.item():.4f}, "
                          f"every sample seen exactly once: {once}, models identical on every "
                          f"rank: {same}", flush=True)
                tally.seen.zero_()
                state.epoch += 1
                state.batch = 0
                state.sampler.set_epoch(state.epoch)
                state.commit()
        except hvd.HorovodInternalError:
            timing["detected"] = time.time()
            raise

    train(state)
    final = checksum()
    deaths = [float(open(os.path.join(shared, f)).read()) for f in os.listdir(shared)
              if f.startswith("death.")]
    recovery = (timing["resumed"] - min(deaths)) if deaths and timing["resumed"] else None
    print(f"rank {first_rank} -> {hvd.rank()} of {hvd.size()}: done, model checksum "
          f"{final:.10e}" + (f", recovery from the death to training resumed {recovery:.2f} s"
                                if recovery is not None else ""), flush=True)
    if args.report_dir:
        with open(os.path.join(args.report_dir, f"rank{first_rank}.json"), "w") as f:
            json.dump({"first_rank": first_rank, "rank": hvd.rank(), "size": hvd.size(),
                       "pid": os.getpid(), "started": STARTED,
                       "checksum": final, "epochs": list(state.log), "recovery": recovery,
                       "grown": timing["grown"],
                       "restarted": hvd.elastic.last_restart() is not None}, f)
    hvd.barrier()
    if hvd.rank() == 0:
        for f in os.listdir(shared):
            os.remove(os.path.join(shared, f))
        os.rmdir(shared)


if __name__ == "__main__":
    main()
