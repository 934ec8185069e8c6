"""DDP communication hooks that reduce gradient buckets through hvdcompat.

    from hvdcompat.ddp import hooks
    model = DistributedDataParallel(model)                # any process group
    model.register_comm_hook(hooks.HookState(), hooks.fp16_compress_hook)

Each hook averages one DDP gradient bucket, like DDP's own allreduce, and
returns a ``torch.futures.Future`` holding the averaged bucket. Two routes:

* **engine** — the bucket goes to hvdcompat's engine, which negotiates,
  fuses and reduces it; bucket names repeat every iteration, so steady state
  runs on the response cache. Chosen when the engine's world is DDP's group
  in rank order: processes an MPI launcher started (``mpirun`` with the
  bootstrap), or ones torchrun / ``torch.distributed.launch`` /
  ``hvdcompatrun --gloo`` started when this build has the Gloo controller
  (the engine then meets the ranks through the launcher's store); any
  backend: gloo, nccl or hvdcompat.
* **process_group** — the bucket is reduced by DDP's own process group (gloo,
  nccl, ...), after hvdcompat's compression and, when ``fusion_threshold`` is
  set, bucket fusion (consecutive buckets packed into one collective; off by
  default, as it costs DDP its overlap of backward and communication).
  Chosen otherwise, e.g. under torchrun with a build without Gloo (MPI
  cannot join processes that no MPI launcher started).

Compression (``fp16``/``bf16``) casts the bucket for the wire and casts the
result back; integer buckets are never cast. On the engine route a float
bucket is averaged by the engine (summed, 16-bit floats in float32, and
scaled once); on the process_group route it is divided by the world size
before the sum (so a half-precision sum cannot overflow).
"""

import itertools

import torch
import torch.distributed as dist

from hvdcompat.basics import _core
from hvdcompat.ddp import work

__all__ = ["HookState", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "COMPRESSIONS", "register"]

COMPRESSIONS = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}

# HVDCOMPAT_DDP_FUSION_THRESHOLD defaults to off (the knob table): packing buckets together
# costs DDP its overlap of backward and communication, and was slower in
# examples/pytorch_ddp_benchmark.py.

_state_ids = itertools.count()


def _fusion_from_env():
    # The core's knob table parses it (a non-negative number of bytes; 0 turns fusion off).
    return _core.setting("DDP_FUSION_THRESHOLD")


def _wire_dtype(compression):
    if isinstance(compression, torch.dtype) or compression is None:
        if compression not in COMPRESSIONS.values():
            raise ValueError(f"compression={compression}: use None, torch.float16 or "
                             "torch.bfloat16")
        return compression
    key = str(compression).lower()
    if key not in COMPRESSIONS:
        raise ValueError(f"compression={compression!r}: use one of {sorted(COMPRESSIONS)}")
    return COMPRESSIONS[key]


class HookState:
    """State of hvdcompat's DDP hooks for one DDP model.

    Create one per DDP model, on every rank, in the same order (its id names
    the model's buckets in the engine).

    Args:
        process_group: DDP's process group (``None``: the default group).
        compression: ``"none"``, ``"fp16"`` or ``"bf16"`` for
            :func:`allreduce_hook` (the other hooks fix their own).
        route: ``"auto"`` (see the module docs), ``"engine"`` or
            ``"process_group"``.
        fusion_threshold: bytes up to which consecutive buckets are packed into
            one collective on the process_group route; 0 disables. Default:
            ``HVDCOMPAT_DDP_FUSION_THRESHOLD`` or 0.
    """

    def __init__(self, process_group=None, compression="none", route="auto",
                 fusion_threshold=None):
        if route not in ("auto", "engine", "process_group"):
            raise ValueError(f"HookState(route={route!r}): use 'auto', 'engine' or "
                             "'process_group'")
        self.process_group = process_group
        self.wire_dtype = _wire_dtype(compression)
        self.requested_route = route
        self.fusion_threshold = (_fusion_from_env() if fusion_threshold is None
                                 else int(fusion_threshold))
        self.id = next(_state_ids)
        self._route = None
        self.route_reason = None
        self._pending = []  # process_group route: buckets waiting to be fused

    @property
    def route(self):
        """``"engine"`` or ``"process_group"`` (decided on first use; see :meth:`resolve`)."""
        return self.resolve()

    def resolve(self):
        """Decides the route (once; a collective the first time) and returns it.

        The same for every bucket: float16/bfloat16 buckets take the engine
        too, where the CPU path reduces them in float32 with vectorised
        conversions (faster here than gloo's native half-precision sum).
        """
        if self._route is None:
            self._route, self.route_reason = self._decide()
        return self._route

    def _group(self):
        return self.process_group if self.process_group is not None else (
            dist.distributed_c10d._get_default_group())

    def _engine_spans_group(self):
        import os

        from hvdcompat import gloo_init

        ok, why = gloo_init.engine_spans_launch(_core, os.environ)
        if not ok:
            return False, why
        import hvdcompat as hvd

        hvd.init()
        group = self._group()
        ranks = dist.get_process_group_ranks(group)
        if ranks != list(range(hvd.size())) or dist.get_rank() != hvd.rank():
            return False, (f"DDP's process group (global ranks {ranks}, this rank "
                           f"{dist.get_rank()}) is not the engine's world in rank order "
                           f"(rank {hvd.rank()} of {hvd.size()})")
        return True, ""

    def _decide(self):
        if self.requested_route == "process_group":
            return "process_group", "requested"
        ok, why = self._engine_spans_group()
        if not ok and self.requested_route == "engine":
            raise RuntimeError(f"HookState(route='engine'): {why}. Use route='auto' to fall back "
                               "to DDP's own process group.")
        if not ok:
            return "process_group", why
        return "engine", "the engine's world (MPI or Gloo) matches DDP's group"

    def describe(self):
        """One line saying how buckets are reduced (for logs)."""
        wire = {None: "none", torch.float16: "fp16", torch.bfloat16: "bf16"}[self.wire_dtype]
        if self.route == "engine":
            how = "hvdcompat engine (" + ("Gloo" if _core.gloo_enabled() else "MPI") + ")" \
                if hasattr(_core, "gloo_enabled") else "hvdcompat engine (MPI)"
        else:
            how = f"process group '{dist.get_backend(self._group())}'"
            if self.fusion_threshold:
                how += f", buckets fused up to {self.fusion_threshold} bytes"
            how += f" ({self.route_reason})"
        return f"allreduce through {how}; compression: {wire}"


_default_states = {}


def _as_state(state, wire_dtype):
    """Our HookState for whatever DDP passes (None, a ProcessGroup, or a HookState)."""
    if isinstance(state, HookState):
        return state
    if state is not None and not isinstance(state, dist.ProcessGroup):
        raise TypeError(f"hvdcompat DDP hook: state must be a HookState, a ProcessGroup or None, "
                        f"got {type(state).__name__}")
    key = (state, wire_dtype)
    if key not in _default_states:
        _default_states[key] = HookState(state, wire_dtype)
    return _default_states[key]


def _compress(buf, wire_dtype, size):
    """(tensor to send, whether it is a separate copy); divided by `size`."""
    if wire_dtype is not None and buf.is_floating_point() and buf.dtype != wire_dtype:
        send = buf.to(wire_dtype)
        send.div_(size)
        return send, True
    if buf.is_floating_point() or buf.is_complex():
        return buf.div_(size), False
    return buf.div_(size, rounding_mode="floor"), False


def _engine_allreduce(state, bucket, buf, wire_dtype):
    import hvdcompat as hvd

    if buf.is_floating_point():
        # The engine averages: it sums (16-bit floats in float32, so nothing
        # overflows) and scales once, inside its pipeline, instead of a pass
        # over the bucket here before the sum.
        copied = wire_dtype is not None and buf.dtype != wire_dtype
        send = buf.to(wire_dtype) if copied else buf
        op = hvd.Average
    else:
        send, copied = _compress(buf, wire_dtype, hvd.size())
        op = hvd.Sum
    name = (f"ddp.hook{state.id}.bucket{bucket.index()}.{str(send.dtype)[6:]}.{send.numel()}")
    handle = hvd.allreduce_async_(send, name=name, op=op)

    def finish(results):
        if copied:
            buf.copy_(send)
        return buf

    return work.submit([handle], finish)


def _flush(state, group):
    batch, state._pending = state._pending, []
    sends = [s for _, s, _, _ in batch]
    flat = sends[0] if len(sends) == 1 else torch.cat([s.reshape(-1) for s in sends])
    fut = dist.all_reduce(flat, group=group, async_op=True).get_future()

    def scatter(done):
        try:
            done.value()
            pieces = [flat] if len(sends) == 1 else torch.split(flat, [s.numel() for s in sends])
            for (buf, send, copied, out), piece in zip(batch, pieces):
                if copied or len(sends) > 1:
                    buf.copy_(piece.view_as(buf))
                out.set_result(buf)
        except Exception as e:  # noqa: BLE001 - every waiting bucket learns of it
            for *_, out in batch:
                if not out.done():
                    out.set_exception(e)

    fut.add_done_callback(scatter)


def _group_allreduce(state, bucket, buf, wire_dtype):
    group = state._group()
    send, copied = _compress(buf, wire_dtype, dist.get_world_size(group))
    out = torch.futures.Future()
    if state._pending and state._pending[0][1].dtype != send.dtype:
        _flush(state, group)  # buckets of different dtypes cannot share one collective
    state._pending.append((buf, send, copied, out))
    pending_bytes = sum(s.numel() * s.element_size() for _, s, _, _ in state._pending)
    if bucket.is_last() or pending_bytes >= state.fusion_threshold:
        _flush(state, group)
    return out


def _run(state, bucket, wire_dtype):
    st = _as_state(state, wire_dtype)
    wire = st.wire_dtype if wire_dtype is None else wire_dtype
    buf = bucket.buffer()
    if st.resolve() == "engine":
        return _engine_allreduce(st, bucket, buf, wire)
    return _group_allreduce(st, bucket, buf, wire)


def allreduce_hook(state, bucket):
    """Averages a DDP gradient bucket through hvdcompat (compression from ``state``).

    Args:
        state: a :class:`HookState`, a ``ProcessGroup`` or ``None`` (default group).
        bucket: the ``dist.GradBucket`` DDP hands to communication hooks.

    Returns:
        A ``torch.futures.Future`` holding the averaged bucket tensor.
    """
    return _run(state, bucket, None)


def fp16_compress_hook(state, bucket):
    """:func:`allreduce_hook` with float16 on the wire (float buckets only)."""
    return _run(state, bucket, torch.float16)


def bf16_compress_hook(state, bucket):
    """:func:`allreduce_hook` with bfloat16 on the wire (float buckets only)."""
    return _run(state, bucket, torch.bfloat16)


# DDP refuses any hook whose __name__ is "bf16_compress_hook" unless NCCL is
# present (a check meant for its own CUDA-only hook), and it logs __qualname__:
# give ours names of their own.
for _hook in (allreduce_hook, fp16_compress_hook, bf16_compress_hook):
    _hook.__name__ = _hook.__qualname__ = f"hvdcompat_{_hook.__name__}"
del _hook


def register(model, compression="none", route="auto", fusion_threshold=None):
    """Registers hvdcompat's allreduce hook on a DDP `model`; returns its HookState.

    Collective when the route is decided here (every rank calls it for the
    same model, in the same order).

    Args:
        model: a ``torch.nn.parallel.DistributedDataParallel``.
        compression: ``"none"``, ``"fp16"`` or ``"bf16"``.
        route / fusion_threshold: as for :class:`HookState`.
    """
    state = HookState(model.process_group, compression, route, fusion_threshold)
    # Decide now, on the calling thread, while every rank is here.
    state.resolve()
    model.register_comm_hook(state, allreduce_hook)
    return state
