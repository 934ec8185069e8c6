"""An ordinary env:// DDP training script, used by tests/test_ddp_launch.py.

Without flags it imports nothing from hvdcompat (the "unmodified script");
``--accelerate`` adds the one-line import. Every rank checks its parameters
against a single-process reference and prints one "ok" line; with
``--report-engine`` also one "engine" line (the engine's world, topology,
tensors reduced, and a digest of the final parameters).
"""

import sys

if "--accelerate" in sys.argv:
    import hvdcompat.ddp.accelerate  # noqa: F401

import argparse
import hashlib
import os

if os.environ.get("HVDCOMPAT_TEST_PIDDIR"):
    # A test that times out dumps this rank's stacks (SIGUSR1) before killing it.
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    open(os.path.join(os.environ["HVDCOMPAT_TEST_PIDDIR"], str(os.getpid())), "w").close()

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))


def batch(step, k):
    g = torch.Generator().manual_seed(1000 * step + k)
    return torch.randn(5, 6, generator=g) + k, torch.randn(5, 2, generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo")
    p.add_argument("--accelerate", action="store_true")
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--report-engine", action="store_true")
    p.add_argument("--local-rank", "--local_rank", type=int, default=None)
    args = p.parse_args()

    dist.init_process_group(args.backend)  # env:// : RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    r, n = dist.get_rank(), dist.get_world_size()
    assert int(os.environ["LOCAL_RANK"]) < int(os.environ["LOCAL_WORLD_SIZE"])
    model = DDP(make_model())
    ref = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(args.steps):
        x, y = batch(step, r)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(torch.nn.functional.mse_loss(ref(a), b) for a, b in
             (batch(step, k) for k in range(n))) / n).backward()
        ref_opt.step()
    err = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))
    state = getattr(model, "_hvdcompat_hook_state", None)
    route = state.route if state is not None else "ddp"
    if err > args.tolerance:
        raise SystemExit(f"rank {r}: parameters differ from the reference by {err}")
    print(f"ddp_train rank {r} of {n} ok backend={dist.get_backend()} route={route} err={err:.2e}",
          flush=True)
    if args.report_engine:
        import hvdcompat as hvd

        digest = hashlib.sha1(b"".join(p.detach().numpy().tobytes()
                                       for p in model.parameters())).hexdigest()[:16]
        print(f"ddp_train engine rank {hvd.rank()} size {hvd.size()} local {hvd.local_rank()} "
              f"{hvd.local_size()} cross {hvd.cross_rank()} {hvd.cross_size()} gloo "
              f"{int(hvd.gloo_enabled())} tensors {hvd.engine_stats()['tensors']} "
              f"digest {digest}", flush=True)
    # Tear down together, the model first: no rank closes its gloo connections
    # while a peer's group is still in use, and no DDP reducer outlives the group.
    del model, opt
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
