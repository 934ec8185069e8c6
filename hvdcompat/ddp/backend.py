"""The ``"hvdcompat"`` torch.distributed backend: a ProcessGroup on hvdcompat's engine.

    import hvdcompat.ddp                      # registers the backend
    dist.init_process_group("hvdcompat")      # env:// (filled by the bootstrap under mpirun)
    model = DistributedDataParallel(model)    # gradients are reduced by the engine

Every collective becomes one or more engine ops on the global process set,
so they are negotiated, fused and executed like Horovod ops. The processes
must be launched by an MPI launcher (``mpirun``, ``hvdcompatrun``), or by
torchrun / ``torch.distributed.launch`` / ``hvdcompatrun --gloo`` when this
build has the Gloo controller: the group is the engine's world. Otherwise
use ``gloo``/``nccl`` and ``import hvdcompat.ddp.accelerate``.

Note [Deterministic names]: engine ops are matched across ranks by name.
torch.distributed issues a group's collectives in the same order on every
rank, so a name built from the group, the call, the dtype, the shape (only
for calls whose shapes must agree on every rank: gathers, scatters and
all-to-all may send different sizes) and a per-signature counter is the same
on every rank. The counter wraps (see ``_NAME_CYCLE``) so that steady-state
training reuses a bounded set of names and hits the engine's response cache;
before reusing a name, this rank waits for its own earlier op of that name,
which every rank has already submitted.
"""

import functools

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions, AllreduceCoalescedOptions, AllreduceOptions, AllToAllOptions,
    BarrierOptions, BroadcastOptions, GatherOptions, ReduceOptions, ReduceScatterOptions,
    ScatterOptions,
)

from hvdcompat import _session
from hvdcompat.ddp import work
from hvdcompat.ops import _tensor

__all__ = ["BACKEND_NAME", "ProcessGroupHvdcompat", "backend_available", "register"]

BACKEND_NAME = "hvdcompat"

# Names repeat after this many ops of one signature (Note [Deterministic names]).
_NAME_CYCLE = 16

# Calls whose tensors may differ in size between ranks: their names leave the shape out.
_SIZE_MAY_DIFFER = frozenset({
    "all_gather", "all_gather_coalesced", "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced", "gather", "scatter", "all_to_all_single", "all_to_all"})

_RedOp = dist.ReduceOp.RedOpType


def _hvd():
    import hvdcompat as hvd

    return hvd


def _reduce_op(reduce_op, call):
    """(hvd op, prescale factor) for a torch ReduceOp; TypeError when we have none."""
    hvd = _hvd()
    kind = getattr(reduce_op, "op", reduce_op)
    table = {_RedOp.SUM: hvd.Sum, _RedOp.AVG: hvd.Average, _RedOp.MIN: hvd.Min,
             _RedOp.MAX: hvd.Max, _RedOp.PRODUCT: hvd.Product}
    if kind in table:
        return table[kind], 1.0
    if kind == _RedOp.PREMUL_SUM:
        factor = getattr(reduce_op, "factor", None)
        if isinstance(factor, (int, float)):
            return hvd.Sum, float(factor)
        raise TypeError(f"torch.distributed.{call} on the hvdcompat backend: PREMUL_SUM with a "
                        "tensor factor is not supported; multiply the tensor first and use "
                        "ReduceOp.SUM.")
    raise TypeError(f"torch.distributed.{call} on the hvdcompat backend: ReduceOp.{kind.name} is "
                    "not supported. Supported ops: SUM, AVG, MIN, MAX, PRODUCT, PREMUL_SUM (bool "
                    "tensors: MIN = logical and, MAX = logical or).")


class _Namer:
    """Per-group deterministic engine names (Note [Deterministic names]). Not thread-safe."""

    def __init__(self, tag):
        self._tag = tag
        self._counts = {}
        self._inflight = {}

    def take(self, call, tensor=None):
        sig = call
        if tensor is not None:
            sig += f".{str(tensor.dtype)[6:]}"
            if call not in _SIZE_MAY_DIFFER:
                sig += f".{'x'.join(map(str, tensor.shape)) or 'scalar'}"
        k = self._counts.get(sig, 0)
        self._counts[sig] = k + 1
        name = f"{self._tag}.{sig}.{k % _NAME_CYCLE}"
        earlier = self._inflight.get(name)
        if earlier is not None and not earlier.done():
            try:
                earlier.wait()
            except Exception:  # noqa: BLE001 - its own caller receives that error
                pass
        return name

    def track(self, names, future):
        for n in names:
            self._inflight[n] = future


def _contiguous(t):
    return t if t.is_contiguous() else t.contiguous()


class ProcessGroupHvdcompat(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on hvdcompat's engine.

    It spans the whole MPI world (group rank = hvdcompat rank). Every
    collective returns an :class:`~hvdcompat.ddp.work.EngineWork` at once;
    argument errors raise at the call (``ValueError``/``TypeError``/
    ``NotImplementedError`` naming the torch.distributed call), failures of
    the job surface from ``wait()`` as :class:`hvdcompat.HorovodInternalError`.
    """

    def __init__(self, rank, size, tag):
        super().__init__(rank, size)
        self._names = _Namer(tag)
        self._tag = tag

    def getBackendName(self):
        return BACKEND_NAME

    # torch keeps a group's name and description in its C++ backends, and this
    # group has none: keep them here (destroy_process_group reads group_name).
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return getattr(self, "_group_name", self._tag)

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return getattr(self, "_group_desc", "")

    def __repr__(self):
        return f"ProcessGroupHvdcompat(rank={self.rank()}, size={self.size()}, tag={self._tag})"

    # -- plumbing ---------------------------------------------------------

    def _check(self, call, tensors):
        for t in tensors:
            try:
                _tensor.check_tensor(_contiguous(t), f"torch.distributed.{call}")
            except (TypeError, ValueError) as e:
                raise type(e)(f"{e} (hvdcompat backend)") from None

    def _launch(self, call, starts, finish, outputs):
        """Runs ``starts`` (each ``name -> handle``) and returns one Work for all of them."""
        names, handles = [], []
        for tensor, start in starts:
            name = self._names.take(call, tensor)
            try:
                handles.append(start(name))
            except (TypeError, ValueError, NotImplementedError) as e:
                # Identical arguments fail identically on every rank, so the
                # ops already started here are matched and complete anyway.
                work.submit(handles, lambda r: None)
                raise type(e)(f"torch.distributed.{call} (hvdcompat backend): {e}") from None
            names.append(name)
        fut = work.submit(handles, finish)
        self._names.track(names, fut)
        return work.EngineWork(fut, call, outputs)

    def _in_place(self, call, tensors, start):
        """Runs ``start(buffer, name) -> handle`` on each tensor, in place.

        A non-contiguous tensor gets a contiguous stand-in whose result is
        copied back when the op finishes.
        """
        bufs = [_contiguous(t) for t in tensors]

        def finish(results):
            for t, b in zip(tensors, bufs):
                if b is not t:
                    t.copy_(b)
            return list(tensors)

        starts = [(b, functools.partial(start, b)) for b in bufs]
        return self._launch(call, starts, finish, list(tensors))

    def _global_root(self, root, call):
        if not 0 <= root < self.size():
            raise ValueError(f"torch.distributed.{call} (hvdcompat backend): root rank {root} is "
                             f"not in [0, {self.size()}).")
        return root  # the group spans the MPI world in rank order

    # -- reductions -------------------------------------------------------

    def allreduce(self, tensors, opts=AllreduceOptions()):
        return self._allreduce("all_reduce", tensors, opts.reduceOp)

    def allreduce_coalesced(self, tensors, opts=AllreduceCoalescedOptions()):
        return self._allreduce("all_reduce_coalesced", tensors, opts.reduceOp)

    def _allreduce(self, call, tensors, reduce_op):
        op, prescale = _reduce_op(reduce_op, call)
        self._check(call, tensors)
        hvd = _hvd()
        return self._in_place(call, tensors, lambda buf, name: hvd.allreduce_async_(
            buf, name=name, op=op, prescale_factor=prescale))

    def reduce(self, tensors, opts=ReduceOptions()):
        call = "reduce"
        op, prescale = _reduce_op(opts.reduceOp, call)
        self._check(call, tensors)
        root = self._global_root(opts.rootRank, call)
        hvd = _hvd()
        starts = [(t, lambda name, t=t: hvd.allreduce_async(_contiguous(t), name=name, op=op,
                                                             prescale_factor=prescale))
                  for t in tensors]

        def finish(results):
            if self.rank() == root:
                for t, r in zip(tensors, results):
                    t.copy_(r)
            return list(tensors)

        return self._launch(call, starts, finish, list(tensors))

    def reduce_scatter(self, output_tensors, input_tensors, opts=ReduceScatterOptions()):
        call = "reduce_scatter"
        if len(output_tensors) != len(input_tensors):
            raise ValueError(f"torch.distributed.{call} (hvdcompat backend): {len(output_tensors)} "
                             f"outputs but {len(input_tensors)} input lists.")
        stacked = []
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != self.size() or any(t.numel() != out.numel() for t in ins):
                raise ValueError(
                    f"torch.distributed.{call} (hvdcompat backend): expected {self.size()} input "
                    f"tensors of {out.numel()} elements (the output's size) on rank "
                    f"{self.rank()}, got sizes {[t.numel() for t in ins]}.")
            stacked.append(torch.stack([t.reshape(out.shape) for t in ins]))
        return self._reduce_scatter(call, output_tensors, stacked, opts.reduceOp)

    def reduce_scatter_single(self, output, input, opts=ReduceScatterOptions()):
        return self._reduce_scatter_tensors("reduce_scatter_tensor", [output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=ReduceScatterOptions()):
        return self._reduce_scatter_tensors("reduce_scatter_tensor_coalesced", outputs, inputs,
                                            opts)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def _require_world_times(self, call, big, big_role, small, small_role):
        """ValueError unless `big` holds world_size x `small`'s elements."""
        if big.numel() != small.numel() * self.size():
            raise ValueError(
                f"torch.distributed.{call} (hvdcompat backend): the {big_role} must hold "
                f"world_size ({self.size()}) x {small_role} elements ({small.numel()}); rank "
                f"{self.rank()} has {big.numel()}.")

    def _reduce_scatter_tensors(self, call, outputs, inputs, opts):
        shaped = []
        for out, inp in zip(outputs, inputs):
            self._require_world_times(call, inp, "input", out, "output")
            shaped.append(_contiguous(inp).reshape(self.size(), out.numel()))
        return self._reduce_scatter(call, outputs, shaped, opts.reduceOp)

    def _reduce_scatter(self, call, outputs, shaped, reduce_op):
        op, prescale = _reduce_op(reduce_op, call)
        self._check(call, shaped + list(outputs))
        hvd = _hvd()
        starts = [(s, lambda name, s=s: hvd.reducescatter_async(_contiguous(s), name=name, op=op,
                                                                 prescale_factor=prescale))
                  for s in shaped]

        def finish(results):
            for out, r in zip(outputs, results):
                out.copy_(r.reshape(out.shape))
            return list(outputs)

        return self._launch(call, starts, finish, list(outputs))

    # -- data movement ----------------------------------------------------

    def broadcast(self, tensors, opts=BroadcastOptions()):
        call = "broadcast"
        self._check(call, tensors)
        root = self._global_root(opts.rootRank, call)
        hvd = _hvd()
        return self._in_place(call, tensors, lambda buf, name: hvd.broadcast_async_(
            buf, root, name=name))

    def _gather_flat(self, call, inputs, scatter_out):
        """Allgathers each input (flattened); ``scatter_out(i, flat)`` places result i."""
        self._check(call, inputs)
        hvd = _hvd()
        flats = [_contiguous(t).reshape(-1) for t in inputs]
        starts = [(f, lambda name, f=f: hvd.allgather_async(f, name=name)) for f in flats]

        def finish(results):
            for i, r in enumerate(results):
                scatter_out(i, r)

        return starts, finish

    def allgather(self, output_tensors, input_tensors, opts=AllgatherOptions()):
        return self._allgather_lists("all_gather", output_tensors, input_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=AllgatherOptions()):
        return self._allgather_lists("all_gather_coalesced", output_lists, input_list)

    def _allgather_lists(self, call, output_lists, inputs):
        for outs in output_lists:
            if len(outs) != self.size():
                raise ValueError(f"torch.distributed.{call} (hvdcompat backend): the output list "
                                 f"must hold world_size ({self.size()}) tensors, got {len(outs)}.")

        def place(i, flat):
            sizes = [o.numel() for o in output_lists[i]]
            if flat.numel() != sum(sizes):
                raise ValueError(f"torch.distributed.{call} (hvdcompat backend): the ranks sent "
                                 f"{flat.numel()} elements in all, the output tensors on rank "
                                 f"{self.rank()} hold {sum(sizes)}.")
            for o, piece in zip(output_lists[i], torch.split(flat, sizes)):
                o.copy_(piece.reshape(o.shape))

        starts, finish = self._gather_flat(call, inputs, place)
        return self._launch(call, starts, lambda r: (finish(r), output_lists)[1], output_lists)

    def all_gather_single(self, output, input, opts=AllgatherOptions()):
        return self._allgather_tensors("all_gather_into_tensor", [output], [input])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=AllgatherOptions()):
        return self._allgather_tensors("all_gather_into_tensor_coalesced", outputs, inputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _allgather_tensors(self, call, outputs, inputs):
        for out, inp in zip(outputs, inputs):
            self._require_world_times(call, out, "output", inp, "input")

        def place(i, flat):
            outputs[i].copy_(flat.reshape(outputs[i].shape))

        starts, finish = self._gather_flat(call, inputs, place)
        return self._launch(call, starts, lambda r: (finish(r), list(outputs))[1], list(outputs))

    def gather(self, output_tensors, input_tensors, opts=GatherOptions()):
        call = "gather"
        root = self._global_root(opts.rootRank, call)
        mine = self.rank() == root
        if mine and (len(output_tensors) != len(input_tensors)
                     or any(len(o) != self.size() for o in output_tensors)):
            raise ValueError(f"torch.distributed.{call} (hvdcompat backend): on the root, pass a "
                             f"list of world_size ({self.size()}) output tensors.")

        def place(i, flat):
            if mine:
                sizes = [o.numel() for o in output_tensors[i]]
                for o, piece in zip(output_tensors[i], torch.split(flat, sizes)):
                    o.copy_(piece.reshape(o.shape))

        starts, finish = self._gather_flat(call, input_tensors, place)
        return self._launch(call, starts, lambda r: (finish(r), output_tensors)[1],
                            output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=ScatterOptions()):
        call = "scatter"
        root = self._global_root(opts.rootRank, call)
        mine = self.rank() == root
        self._check(call, output_tensors)
        hvd = _hvd()
        sends = []
        for i, out in enumerate(output_tensors):
            if mine:
                chunks = input_tensors[i]
                if len(chunks) != self.size() or any(c.numel() != out.numel() for c in chunks):
                    raise ValueError(f"torch.distributed.{call} (hvdcompat backend): the root "
                                     f"must pass world_size ({self.size()}) tensors shaped like "
                                     "the output.")
                flat = torch.cat([_contiguous(c).reshape(-1) for c in chunks])
                splits = [out.numel()] * self.size()
            else:
                flat = out.new_empty(0)
                splits = [0] * self.size()
            sends.append((flat, splits))
        starts = [(out, lambda name, f=f, s=s: hvd.alltoall_async(f, splits=s, name=name))
                  for out, (f, s) in zip(output_tensors, sends)]

        def finish(results):
            for out, (received, _) in zip(output_tensors, results):
                out.copy_(received.reshape(out.shape))
            return list(output_tensors)

        return self._launch(call, starts, finish, list(output_tensors))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=AllToAllOptions()):
        call = "all_to_all_single"
        self._check(call, [input, output])
        # No splits: equal ones; the core refuses a scalar or rows that do
        # not divide evenly (Runtime::ResolveSplits).
        splits = list(input_split_sizes) if input_split_sizes else None
        expected = list(output_split_sizes) if output_split_sizes else None
        hvd = _hvd()
        src = _contiguous(input)

        def finish(results):
            received, recv_splits = results[0]
            got = [int(v) for v in recv_splits.tolist()]
            if expected is not None and got != expected:
                raise ValueError(f"torch.distributed.{call} (hvdcompat backend): rank "
                                 f"{self.rank()} expected output_split_sizes {expected} but the "
                                 f"other ranks sent {got} rows.")
            if received.numel() != output.numel():
                raise ValueError(f"torch.distributed.{call} (hvdcompat backend): rank "
                                 f"{self.rank()} received {received.numel()} elements, the output "
                                 f"holds {output.numel()}.")
            output.copy_(received.reshape(output.shape))
            return [output]

        return self._launch(call, [(src, lambda name: hvd.alltoall_async(src, splits=splits,
                                                                         name=name))],
                            finish, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=AllToAllOptions()):
        call = "all_to_all"
        if len(input_tensors) != self.size() or len(output_tensors) != self.size():
            raise ValueError(f"torch.distributed.{call} (hvdcompat backend): pass world_size "
                             f"({self.size()}) input and output tensors.")
        self._check(call, list(input_tensors) + list(output_tensors))
        flat = torch.cat([_contiguous(t).reshape(-1) for t in input_tensors])
        splits = [t.numel() for t in input_tensors]
        hvd = _hvd()

        def finish(results):
            received, recv_splits = results[0]
            got = [int(v) for v in recv_splits.tolist()]
            if got != [o.numel() for o in output_tensors]:
                raise ValueError(f"torch.distributed.{call} (hvdcompat backend): rank "
                                 f"{self.rank()} received pieces of {got} elements; its output "
                                 f"tensors hold {[o.numel() for o in output_tensors]}.")
            for o, piece in zip(output_tensors, torch.split(received, got)):
                o.copy_(piece.reshape(o.shape))
            return list(output_tensors)

        return self._launch(call, [(flat, lambda name: hvd.alltoall_async(flat, splits=splits,
                                                                          name=name))],
                            finish, list(output_tensors))

    def barrier(self, opts=BarrierOptions()):
        # A one-element allreduce: asynchronous like every other op here, and
        # its future completes after every earlier op of this rank (Note
        # [Completing futures]), as torch's barrier promises.
        token = torch.zeros(1, dtype=torch.int32)
        hvd = _hvd()
        return self._launch("barrier", [(None, lambda name: hvd.allreduce_async_(
            token, name=name, op=hvd.Sum))], lambda r: [], [])

    # -- what the engine does not do ----------------------------------------

    def _unsupported(self, call, advice):
        raise NotImplementedError(f"torch.distributed.{call} is not supported by the hvdcompat "
                                  f"backend. {advice}")

    def send(self, tensors, dst, tag=0):
        self._unsupported("send", "hvdcompat runs collectives only; use a gloo/nccl group "
                                  "(dist.new_group(backend='gloo')) for point-to-point traffic.")

    def recv(self, tensors, src, tag=0):
        self._unsupported("recv", "hvdcompat runs collectives only; use a gloo/nccl group "
                                  "(dist.new_group(backend='gloo')) for point-to-point traffic.")

    def recv_anysource(self, tensors, tag=0):
        self._unsupported("recv", "hvdcompat runs collectives only; use a gloo/nccl group for "
                                  "point-to-point traffic.")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self._unsupported("monitored_barrier", "Use dist.barrier(); a rank that stops answering "
                                               "is reported by hvdcompat's stall inspector.")

    def _start_coalescing(self, device):
        self._unsupported("_coalescing_manager", "Issue the collectives directly: the engine "
                                                 "fuses concurrent ops by itself.")

    def _end_coalescing(self, device):
        self._unsupported("_coalescing_manager", "Issue the collectives directly: the engine "
                                                 "fuses concurrent ops by itself.")

    def shutdown(self):
        # The engine belongs to hvdcompat (hvd.shutdown()), not to this group.
        pass

    def abort(self):
        pass


def backend_available():
    """Whether ``init_process_group("hvdcompat")`` can work in this process.

    True when an MPI launcher started it (the engine's world is the MPI
    world), or torchrun / ``hvdcompatrun --gloo`` did and this build has the
    Gloo controller; False for a plain ``python`` run.
    """
    import os

    from hvdcompat import gloo_init
    from hvdcompat.basics import _core

    return gloo_init.engine_spans_launch(_core, os.environ)[0]


def _create(backend_opts, pg_options=None):
    size, rank = backend_opts.group_size, backend_opts.group_rank
    ranks = list(backend_opts.global_ranks_in_group) or list(range(size))
    if size > 1 and not backend_available():
        raise RuntimeError(
            f"init_process_group('{BACKEND_NAME}'): this process was not started by an MPI "
            f"launcher, nor by a launch the Gloo controller can join in this build, so "
            f"hvdcompat's engine cannot reach the other {size - 1} rank(s). Launch with mpirun / "
            "hvdcompatrun (or hvdcompatrun --gloo / torchrun on a build with Gloo: "
            "hvdcompatrun --check-build); or use backend='gloo' (or 'nccl') and "
            "`import hvdcompat.ddp.accelerate`.")
    hvd = _hvd()
    hvd.init()
    if size != hvd.size() or ranks != list(range(hvd.size())):
        if not dist.is_initialized():  # the default group, not dist.new_group
            raise RuntimeError(
                f"init_process_group('{BACKEND_NAME}'): WORLD_SIZE is {size} but the engine's job has "
                f"{hvd.size()} ranks. Unset WORLD_SIZE/RANK (the bootstrap in hvdcompat.ddp "
                "fills them from MPI) or launch as many MPI ranks as WORLD_SIZE.")
        raise NotImplementedError(
            f"dist.new_group(ranks={ranks}, backend='{BACKEND_NAME}'): groups of a subset of the "
            f"ranks are not supported by the hvdcompat backend (it spans all {hvd.size()} ranks). "
            "Create the subgroup with backend='gloo' (or 'nccl').")
    if rank != hvd.rank():
        raise RuntimeError(
            f"init_process_group('{BACKEND_NAME}'): RANK is {rank} but this process is MPI rank "
            f"{hvd.rank()}. Unset RANK (the bootstrap in hvdcompat.ddp fills it from MPI) so "
            "torch and MPI agree on ranks.")
    session = _session.current()  # groups are counted per engine, from its init on
    tag = f"tdist{session.ddp_group_count}"
    session.ddp_group_count += 1
    return ProcessGroupHvdcompat(rank, size, tag)


def register():
    """Registers the ``"hvdcompat"`` backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                  devices=["cpu", "cuda"])
