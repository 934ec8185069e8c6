"""One-line acceleration of DDP scripts.

    import hvdcompat.ddp.accelerate      # anywhere: before or after `import torch`

Every ``DistributedDataParallel`` model built afterwards reduces its
gradients with hvdcompat's allreduce hook (:mod:`hvdcompat.ddp.hooks`). The
script and its launcher stay as they are:

* under ``mpirun`` / ``hvdcompatrun`` the env:// variables are filled by the
  bootstrap and buckets go through hvdcompat's engine (MPI, fusion,
  response cache), whatever backend the script initialised;
* under ``torchrun`` / ``python -m torch.distributed.launch --use_env``
  buckets go through hvdcompat's engine on its Gloo controller, which meets
  the ranks through torchrun's store, when this build has it
  (``hvd.gloo_built()``). A build without it fuses and (optionally)
  compresses buckets and reduces them with the script's own process group:
  MPI cannot join processes that an MPI launcher did not start (Open MPI
  singletons cannot connect to each other without a shared runtime server).

The hook is installed at the model's first forward call, unless the script
registered its own communication hook by then (the script's hook wins).
Rank 0 prints one line saying what was installed.

Environment:
    HVDCOMPAT_DDP_COMPRESSION: ``none`` (default), ``fp16`` or ``bf16``.
    HVDCOMPAT_DDP_ROUTE: ``auto`` (default), ``engine`` or ``process_group``.
    HVDCOMPAT_DDP_FUSION_THRESHOLD: bytes of consecutive buckets packed into
        one collective on the process_group route (default 0: off).
    HVDCOMPAT_DDP_ACCELERATE: ``0`` keeps DDP untouched (the import still
        registers the backend and runs the bootstrap).
"""

import functools
import sys

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hvdcompat.basics import _core
from hvdcompat.ddp import hooks

__all__ = ["enable", "disable", "is_enabled", "settings"]

# DistributedDataParallel's methods replaced while enabled. The replacements
# carry the originals (``__wrapped__``), so the patched class is the only
# record of whether acceleration is on.
_PATCHED = ("__init__", "_register_builtin_comm_hook")

# Whether rank 0 has printed its line (once per process, however many models).
_announced = [False]


def settings(environ=None):
    """(compression, route) from the environment; ValueError for bad values."""
    # Choices of the core's knob table: a bad value is its ValueError, naming the variable.
    return _core.setting("DDP_COMPRESSION", environ), _core.setting("DDP_ROUTE", environ)


def _announce(state):
    if _announced[0]:
        return
    _announced[0] = True
    if dist.get_rank() == 0:
        sys.stderr.write(f"hvdcompat.ddp.accelerate: DistributedDataParallel gradients "
                         f"{state.describe()} ({dist.get_world_size()} ranks)\n")
        sys.stderr.flush()


def _has_own_hook(model):
    return bool(getattr(model, "_comm_hooks", None)) or model.__dict__.get(
        "_hvdcompat_builtin_hook", False)


def _install_at_first_forward(model, args, kwargs):
    model.__dict__.pop("_hvdcompat_pre_hook").remove()
    if _has_own_hook(model):
        return
    compression, route = settings()
    state = hooks.register(model, compression=compression, route=route)
    model._hvdcompat_hook_state = state
    _announce(state)


def _patched_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._hvdcompat_pre_hook = self.register_forward_pre_hook(
            _install_at_first_forward, with_kwargs=True)

    return __init__


def _patched_builtin(original):
    def _register_builtin_comm_hook(self, comm_hook_type):
        self._hvdcompat_builtin_hook = True
        return original(self, comm_hook_type)

    return _register_builtin_comm_hook


def _replacement(name, make):
    original = getattr(DistributedDataParallel, name)
    fn = functools.wraps(original)(make(original))
    fn._hvdcompat_patch = True
    return fn


def _is_patched(name):
    return getattr(DistributedDataParallel.__dict__.get(name), "_hvdcompat_patch", False)


def enable():
    """Makes DDP models built from now on use hvdcompat's hook (idempotent)."""
    settings()  # fail early on a bad environment
    if is_enabled():
        return
    for name, make in zip(_PATCHED, (_patched_init, _patched_builtin)):
        setattr(DistributedDataParallel, name, _replacement(name, make))


def disable():
    """Restores DDP; models already built keep what they have."""
    for name in _PATCHED:
        if _is_patched(name):
            setattr(DistributedDataParallel, name, DistributedDataParallel.__dict__[name].__wrapped__)


def is_enabled():
    """Whether DDP models built now get hvdcompat's hook."""
    return _is_patched("__init__")


if _core.setting("DDP_ACCELERATE"):
    enable()
