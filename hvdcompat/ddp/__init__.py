"""hvdcompat for PyTorch DistributedDataParallel users.

    import hvdcompat.ddp                   # registers the "hvdcompat" backend; under
                                           # mpirun, fills RANK, WORLD_SIZE, MASTER_ADDR, ...
    dist.init_process_group("hvdcompat")   # or "gloo" / "nccl"
    model = DistributedDataParallel(model)

* :mod:`hvdcompat.ddp.backend` — the ``"hvdcompat"`` torch.distributed backend
  (launch with ``mpirun``/``hvdcompatrun``).
* :mod:`hvdcompat.ddp.bootstrap` — env:// variables from the MPI world, so an
  unmodified DDP script runs under ``mpirun`` (``python -m hvdcompat.ddp
  train.py`` runs a script without touching it).
* :mod:`hvdcompat.ddp.hooks` — DDP communication hooks (plain, fp16, bf16)
  for any process group.
* :mod:`hvdcompat.ddp.accelerate` — ``import hvdcompat.ddp.accelerate`` puts
  the hook on every DDP model, under mpirun, torchrun or
  torch.distributed.launch.

Importing this package under an MPI launcher is collective (the bootstrap
starts the engine and broadcasts rank 0's address): every rank imports it.
"""

from hvdcompat.ddp import backend, bootstrap, hooks
from hvdcompat.ddp.backend import BACKEND_NAME, ProcessGroupHvdcompat, backend_available
from hvdcompat.ddp.bootstrap import bootstrap_env
from hvdcompat.ddp.hooks import (
    HookState, allreduce_hook, bf16_compress_hook, fp16_compress_hook,
)

__all__ = ["BACKEND_NAME", "ProcessGroupHvdcompat", "backend_available", "bootstrap_env",
           "HookState", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "backend", "bootstrap", "hooks"]

backend.register()
bootstrap_env()
