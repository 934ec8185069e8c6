"""Collectives on the Gloo controller, checked against values computed from rank and size.

    hvdcompatrun --gloo -np N python collectives.py [ok|kill|kill-stopped]
    python -m torch.distributed.run --nproc_per_node=N collectives.py [ok|kill|kill-stopped]

Prints "gloo_collectives rank R of N ok" on success. With "kill", rank 1
kills itself mid-training and the others print "survivor R: <error>". With
"kill-stopped" the last rank kills itself instead, just after stopping rank 1
(SIGSTOP) for STOP_SECONDS, longer than the survivors' grace before they end
their waits (and close their connections): rank 1 finds the loss late.
"""

import os
import signal
import subprocess
import sys

import torch

import hvdcompat as hvd

STOP_SECONDS = 2.5


def env_int(*names):
    for name in names:
        if os.environ.get(name):
            return int(os.environ[name])
    raise SystemExit(f"none of {names} set")


def main(mode):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    assert (r, n) == (env_int("HOROVOD_RANK", "RANK"), env_int("HOROVOD_SIZE", "WORLD_SIZE"))
    assert hvd.local_rank() == env_int("HOROVOD_LOCAL_RANK", "LOCAL_RANK")
    assert hvd.local_size() == env_int("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE")
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)  # every rank on this machine
    assert hvd.gloo_enabled() and not hvd.mpi_enabled() and hvd.gloo_built()
    if mode in ("kill", "kill-stopped"):
        victim = 1 if mode == "kill" else n - 1
        pids = hvd.allgather(torch.tensor([os.getpid()]), name="pids").tolist()
        for step in range(1000):
            if r == victim and step == 3:
                if mode == "kill-stopped":
                    os.kill(pids[1], signal.SIGSTOP)
                    subprocess.Popen(["sh", "-c", f"sleep {STOP_SECONDS}; kill -CONT {pids[1]}"],
                                     start_new_session=True)
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                hvd.allreduce(torch.ones(4), name=f"step{step % 4}")
            except Exception as e:  # noqa: BLE001 - the lost peer must surface as an error
                print(f"survivor {r}: {type(e).__name__}: {e}", flush=True)
                sys.exit(3)
        raise SystemExit(f"rank {r}: 1000 steps ran although rank 1 was killed")
    s = hvd.allreduce(torch.full((5,), float(r + 1)), op=hvd.Sum, name="sum")
    assert torch.equal(s, torch.full((5,), n * (n + 1) / 2)), s
    a = hvd.allreduce(torch.tensor([float(r), 2.0 * r]), name="avg")
    assert torch.allclose(a, torch.tensor([(n - 1) / 2, n - 1.0])), a
    m = hvd.allreduce(torch.tensor([r], dtype=torch.int64), op=hvd.Max, name="max")
    assert m.item() == n - 1
    g = hvd.allgather(torch.full((r + 1, 2), float(r)), name="gather")
    want = torch.cat([torch.full((k + 1, 2), float(k)) for k in range(n)])
    assert torch.equal(g, want), g
    b = hvd.broadcast(torch.arange(3.0) + r, root_rank=n - 1, name="bcast")
    assert torch.equal(b, torch.arange(3.0) + n - 1), b
    parts = hvd.alltoall(torch.arange(float(n)) + 10 * r, name="a2a")
    assert torch.equal(parts, torch.tensor([10.0 * k + r for k in range(n)])), parts
    grouped = hvd.grouped_allreduce([torch.ones(3) * r, torch.ones(2)], op=hvd.Sum, name="grp")
    assert torch.equal(grouped[0], torch.ones(3) * n * (n - 1) / 2)
    assert torch.equal(grouped[1], torch.ones(2) * n)
    hvd.barrier()
    print(f"gloo_collectives rank {r} of {n} ok", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ok")
