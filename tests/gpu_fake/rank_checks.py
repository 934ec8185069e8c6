"""GPU data-plane checks run on every rank against the host-only fake CUDA/NCCL.

Launched by tests/test_gpu_fake.py under mpirun (the MPI controller) or hvdcompatrun --gloo
(the Gloo controller, where MPI must never be initialised) with HVDCOMPAT_CUDART_LIB and
HVDCOMPAT_NCCL_LIB pointing at tests/gpu_fake/libfakegpu.so. "Device" buffers
are numpy arrays (the fake's device memory is host memory), handed to the
core as CUDA buffers (device index >= 0) with a stream handle, exactly as the
torch layer hands real CUDA tensors. Expectations are computed here from rank
and size. CHECK_MODE selects the scenario; every rank prints "CHECKS PASSED".
"""

import ctypes
import os
import re
import sys
import time

import numpy as np

import hvdcompat as hvd
from hvdcompat.basics import Adasum, Average, Max, Min, Product, Sum, _core

# Beside this file (a script's own folder is on sys.path).
from fake_helpers import STAT_NAMES, dltensor, make, values_of

MODE = os.environ.get("CHECK_MODE", "full")
FAKE = ctypes.CDLL(os.environ["HVDCOMPAT_NCCL_LIB"])

if MODE == "process_sets":
    from hvdcompat.process_sets import ProcessSet

    SETS = [ProcessSet([0, 1]), ProcessSet([1, 2])]
    hvd.init(process_sets=SETS)
else:
    hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
DEV = int(os.environ.get("CHECK_DEVICE", hvd.local_rank()))


def _stream_on(device):
    """A stream of the fake's `device` (the caller's current device stays 0)."""
    handle = ctypes.c_void_p()
    assert FAKE.cudaSetDevice(device) == 0
    assert FAKE.cudaStreamCreateWithFlags(ctypes.byref(handle), 1) == 0
    assert FAKE.cudaSetDevice(0) == 0  # as a thread that never selected the tensor's device
    return handle.value


# The producer's and the consumer's streams, as torch would pass them.
PRODUCER = _stream_on(DEV)
CONSUMER = _stream_on(DEV)
ALL_DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
              "float64", "bool"]
_names = [0]


def stats():
    buf = (ctypes.c_long * len(STAT_NAMES))()
    FAKE.fake_gpu_stats(buf, len(STAT_NAMES))
    return dict(zip(STAT_NAMES, buf))


# ---------------------------------------------------------------- dtypes

def d(arr, dtype, device=None):
    return _core.Buffer(arr.ctypes.data, _core.DTYPES[dtype], tuple(arr.shape),
                        DEV if device is None else device)


# ---------------------------------------------------------------- capsules

def from_capsule(capsule, like_dtype):
    """Copies a core-allocated device output out of its DLPack capsule.

    Checks it is a CUDA tensor of this rank's device. Dropping the capsule
    afterwards runs the core's deleter (a stream-ordered free in the fake).
    """
    t = dltensor(capsule)
    assert t.device.device_type == 2, f"expected kDLCUDA, got device type {t.device.device_type}"
    assert t.device.device_id == DEV, f"expected cuda:{DEV}, got cuda:{t.device.device_id}"
    shape = tuple(t.shape[i] for i in range(t.ndim))
    out = np.empty(shape, dtype=like_dtype)
    ctypes.memmove(out.ctypes.data, t.data, out.nbytes)
    return out


# ---------------------------------------------------------------- running ops

def name(prefix):
    _names[0] += 1
    return f"{prefix}.check{_names[0]}"


def enqueue(op, prefix, inputs, outputs=(), reduce_op=Sum, root=-1, pre=1.0, post=1.0,
            splits=(), process_set=0):
    return _core.enqueue(_core.EnqueueArgs(
        op=_core.OPS[op], name=name(prefix), process_set=process_set,
        reduce_op=_core.ReduceOp(reduce_op),
        root=root, prescale=pre, postscale=post, inputs=list(inputs), outputs=list(outputs),
        splits=[list(s) for s in splits], stream=PRODUCER))


def _status(handle, stream):
    r = _core.wait(handle, stream)
    return r.status, r.message


def finish(handle, stream=CONSUMER):
    """Waits for `handle`, then for the consumer's stream (the host reads the results next,
    as a kernel queued on that stream would)."""
    r = _core.wait(handle, stream)
    code, msg, outs, rsplits = r.status, r.message, r.outputs, r.received_splits
    if code != _core.Status.ok:
        raise RuntimeError(f"status {code}: {msg}")
    if stream == 0:  # the legacy stream of this rank's device
        assert FAKE.cudaSetDevice(DEV) == 0
        assert FAKE.cudaStreamSynchronize(None) == 0
        assert FAKE.cudaSetDevice(0) == 0
    elif stream is not None:
        assert FAKE.cudaStreamSynchronize(ctypes.c_void_p(stream)) == 0
    return outs, rsplits


def close(got, want, dtype, what):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-12}.get(dtype, 0.0)
    if tol:
        ok = np.allclose(got, want, rtol=tol, atol=tol)
    else:
        ok = np.array_equal(got, want)
    assert ok, f"{what} [{dtype}, rank {RANK}/{SIZE}]: got {got.ravel()[:8]}, want {want.ravel()[:8]}"


# ---------------------------------------------------------------- checks

def rank_values(n, rank, op, dtype):
    i = np.arange(n)
    if dtype == "bool":
        return ((i + rank) % 2 == 0).astype(np.float64)
    if op == Product:
        return (i + rank) % 2 + 1.0
    if op == Average and dtype not in ("float16", "bfloat16", "float32", "float64"):
        return i % 5 + 2.0 * rank  # the mean over ranks is an integer
    return i % 5 + rank + 1.0


def expected(n, op, dtype, pre=1.0, post=1.0):
    per_rank = np.stack([rank_values(n, r, op, dtype) for r in range(SIZE)])
    if op in (Sum, Average):
        out = (per_rank * pre).sum(axis=0) * post
        return out / SIZE if op == Average else out
    return {Min: per_rank.min, Max: per_rank.max, Product: per_rank.prod}[op](axis=0)


def ops_for(dtype):
    if dtype == "bool":
        return [Min, Max]
    return [Sum, Average, Min, Max, Product]


def check_allreduce_every_dtype():
    n = 37
    for dtype in ALL_DTYPES:
        for op in ops_for(dtype):
            x = make(rank_values(n, RANK, op, dtype), dtype)
            out = np.zeros_like(x)
            finish(enqueue("allreduce", "allreduce", [d(x, dtype)], [d(out, dtype)], op))
            close(values_of(out, dtype), expected(n, op, dtype), dtype, f"allreduce op={op}")
            close(values_of(x, dtype), rank_values(n, RANK, op, dtype), dtype, "input untouched")
            inplace = make(rank_values(n, RANK, op, dtype), dtype)
            finish(enqueue("allreduce", "allreduce", [d(inplace, dtype)], [d(inplace, dtype)], op))
            close(values_of(inplace, dtype), expected(n, op, dtype), dtype, f"in-place op={op}")


def check_scaled_allreduce():
    n = 16
    for dtype in ["float16", "bfloat16", "float32", "float64", "int32", "int16"]:
        for op in (Sum, Average):
            x = make(rank_values(n, RANK, Sum, dtype), dtype)
            out = np.zeros_like(x)
            pre, post = (0.5, 4.0) if "float" in dtype else (2.0, 3.0)
            finish(enqueue("allreduce", "allreduce", [d(x, dtype)], [d(out, dtype)], op, pre=pre,
                           post=post))
            want = (np.stack([rank_values(n, r, Sum, dtype) for r in range(SIZE)]) * pre).sum(0)
            want = want * post / (SIZE if op == Average else 1)
            if "float" not in dtype:
                want = np.trunc(want)
            close(values_of(out, dtype), want, dtype, f"scaled allreduce op={op}")
    # Scaled Min cannot be one NCCL operator: it takes the host-staged path.
    x = make(rank_values(n, RANK, Min, "float32"), "float32")
    out = np.zeros_like(x)
    finish(enqueue("allreduce", "allreduce", [d(x, "float32")], [d(out, "float32")], Min, pre=2.0))
    close(out, np.stack([rank_values(n, r, Min, "float32") * 2 for r in range(SIZE)]).min(0),
          "float32", "prescaled min")


def check_fused_allreduce():
    before = stats()
    for dtype in ["float32", "float16", "int64"]:
        sizes = [1, 100, 7, 0, 4096]
        xs = [make(rank_values(k, RANK, Average, dtype), dtype) for k in sizes]
        outs = [np.zeros_like(x) for x in xs]
        finish(enqueue("allreduce", "grouped_allreduce", [d(x, dtype) for x in xs],
                       [d(o, dtype) for o in outs], Average))
        for k, o in zip(sizes, outs):
            close(values_of(o, dtype), expected(k, Average, dtype), dtype, f"fused size {k}")
    after = stats()
    assert after["stream_waits"] > before["stream_waits"], "engine never waited on producers"
    assert after["memcpys"] > before["memcpys"], "fused allreduce did not pack"
    assert after["premulsums"] == after["redop_destroys"], "PreMulSum operators leaked"


def check_allgather():
    for dtype in ["float32", "bfloat16", "int8", "bool"]:
        rows = RANK + 1
        x = make(np.arange(rows * 3) + 10 * RANK, dtype).reshape(rows, 3)
        outs, _ = finish(enqueue("allgather", "allgather", [d(x, dtype)]))
        got = values_of(from_capsule(outs[0], x.dtype), dtype)
        want = np.concatenate([values_of(make(np.arange((r + 1) * 3) + 10 * r, dtype), dtype)
                               .reshape(r + 1, 3) for r in range(SIZE)])
        close(got, want, dtype, "uneven allgather")
        # Even dims: one ncclAllGather.
        y = make(np.arange(4) + RANK, dtype)
        outs, _ = finish(enqueue("allgather", "allgather", [d(y, dtype)]))
        close(values_of(from_capsule(outs[0], y.dtype), dtype),
              np.concatenate([values_of(make(np.arange(4) + r, dtype), dtype)
                              for r in range(SIZE)]), dtype, "even allgather")
    # Fused: uniform dims (strided unpack) and rank-dependent dims.
    for uniform in (True, False):
        shapes = [(2, 5), (1,), (3, 2, 2)] if uniform else [(RANK + 1, 5), (2,), (RANK, 2, 2)]
        xs = [(np.arange(int(np.prod(s))) + 100 * RANK + 7 * i).astype(np.float32).reshape(s)
              for i, s in enumerate(shapes)]
        outs, _ = finish(enqueue("allgather", "grouped_allgather", [d(x, "float32") for x in xs]))
        for i, cap in enumerate(outs):
            got = from_capsule(cap, np.float32)
            parts = []
            for r in range(SIZE):
                s = shapes[i] if uniform else [(r + 1, 5), (2,), (r, 2, 2)][i]
                parts.append((np.arange(int(np.prod(s))) + 100 * r + 7 * i).astype(np.float32)
                             .reshape(s))
            close(got, np.concatenate(parts), "float32", f"fused allgather uniform={uniform}")


def check_uneven_allgather_launches():
    """Uneven first dimensions cost one NCCL collective, not one broadcast per rank: a padded
    allgather while padding at most doubles the bytes, else one group of send/recv pairs."""
    for shape_of in (lambda r: r + 1, lambda r: 10 * SIZE if r == 0 else 1):
        rows = [shape_of(r) for r in range(SIZE)]
        x = (np.arange(rows[RANK] * 4) + 1000 * RANK).astype(np.float32).reshape(rows[RANK], 4)
        before = stats()
        outs, _ = finish(enqueue("allgather", "allgather", [d(x, "float32")]))
        after = stats()
        want = np.concatenate([(np.arange(rows[r] * 4) + 1000 * r).astype(np.float32)
                               .reshape(rows[r], 4) for r in range(SIZE)])
        close(from_capsule(outs[0], np.float32), want, "float32", f"uneven allgather {rows}")
        delta = {k: after[k] - before[k] for k in ("allgathers", "broadcasts", "sends", "recvs",
                                                    "groups")}
        if os.environ.get("HOROVOD_GPU_OPERATIONS") in ("MPI", "GLOO"):
            assert not any(delta.values()), delta  # host staging: no NCCL at all
            continue
        assert delta["broadcasts"] == 0, delta
        if max(rows) * SIZE <= 2 * sum(rows):
            assert delta["allgathers"] == 1 and delta["sends"] == 0, (rows, delta)
        else:
            assert delta["allgathers"] == 0 and delta["groups"] == 1, (rows, delta)
            assert delta["sends"] == delta["recvs"] == SIZE - 1, (rows, delta)
        if RANK == 0:
            print(f"LAUNCHES: uneven allgather of rows {rows} on {SIZE} ranks: {delta}", flush=True)


def check_broadcast():
    root = SIZE - 1
    for dtype in ["float64", "int16", "bfloat16"]:
        x = make(np.arange(9) + RANK * 100, dtype)
        out = np.zeros_like(x)
        finish(enqueue("broadcast", "broadcast", [d(x, dtype)], [d(out, dtype)], root=root))
        close(values_of(out, dtype), values_of(make(np.arange(9) + root * 100, dtype), dtype),
              dtype, "broadcast")
    xs = [np.full(k, RANK * 10 + k, dtype=np.int32) for k in (3, 0, 1000)]
    finish(enqueue("broadcast", "broadcast", [d(x, "int32") for x in xs],
                   [d(x, "int32") for x in xs], root=0))
    for k, x in zip((3, 0, 1000), xs):
        close(x, np.full(k, k), "int32", "fused in-place broadcast")


def check_alltoall():
    # Rank r sends (r + j) % 3 rows of width 2 to rank j.
    send = [(RANK + j) % 3 for j in range(SIZE)]
    total = sum(send)
    x = (np.arange(total * 2) + 1000 * RANK).astype(np.float32).reshape(total, 2)
    outs, rsplits = finish(enqueue("alltoall", "alltoall", [d(x, "float32")], splits=[send]))
    got = from_capsule(outs[0], np.float32)
    recv = [(j + RANK) % 3 for j in range(SIZE)]
    assert list(rsplits[0]) == recv, (rsplits, recv)
    parts = []
    for j in range(SIZE):
        sj = [(j + k) % 3 for k in range(SIZE)]
        start = sum(sj[:RANK])
        xj = (np.arange(sum(sj) * 2) + 1000 * j).astype(np.float32).reshape(sum(sj), 2)
        parts.append(xj[start:start + sj[RANK]])
    close(got, np.concatenate(parts), "float32", "alltoall")


def rs_rows(rows, rank):
    return rows // SIZE + (1 if rank < rows % SIZE else 0)


def check_reducescatter():
    for dtype, op in [("float32", Sum), ("float16", Average), ("int32", Max), ("int16", Sum)]:
        rows = 2 * SIZE + 1
        x = make(rank_values(rows * 3, RANK, op, dtype), dtype).reshape(rows, 3)
        mine = rs_rows(rows, RANK)
        out = np.zeros((mine, 3), dtype=x.dtype)
        finish(enqueue("reducescatter", "reducescatter", [d(x, dtype)], [d(out, dtype)], op))
        full = expected(rows * 3, op, dtype).reshape(rows, 3)
        first = sum(rs_rows(rows, r) for r in range(RANK))
        close(values_of(out, dtype), full[first:first + mine], dtype, f"reducescatter op={op}")
    # Fused, and evenly divisible (direct ncclReduceScatter).
    shapes = [(SIZE * 2, 2), (SIZE + 1,), (SIZE * 3,)]
    xs = [make(rank_values(int(np.prod(s)), RANK, Sum, "float32"), "float32").reshape(s)
          for s in shapes]
    outs = [np.zeros((rs_rows(s[0], RANK),) + s[1:], dtype=np.float32) for s in shapes]
    finish(enqueue("reducescatter", "grouped_reducescatter", [d(x, "float32") for x in xs],
                   [d(o, "float32") for o in outs], Sum))
    for s, o in zip(shapes, outs):
        full = expected(int(np.prod(s)), Sum, "float32").reshape(s)
        first = sum(rs_rows(s[0], r) for r in range(RANK))
        close(o, full[first:first + rs_rows(s[0], RANK)], "float32", "fused reducescatter")


def check_many_in_flight():
    """Several ops in flight at once (lanes round-robin); results stay right."""
    handles, arrays = [], []
    for k in range(12):
        x = make(rank_values(64 + k, RANK, Sum, "float32"), "float32")
        arrays.append(x)
        handles.append(enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], Sum))
    for k, h in enumerate(handles):
        finish(h)
        close(arrays[k], expected(64 + k, Sum, "float32"), "float32", f"in flight #{k}")


def check_poll_and_no_stream():
    x = make(rank_values(8, RANK, Sum, "float32"), "float32")
    h = enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], Sum)
    deadline = time.time() + 60
    while not _core.poll(h):
        assert time.time() < deadline, "poll never reported done"
        time.sleep(0.001)
    finish(h, stream=None)  # no consumer stream: the host wait alone orders it
    close(x, expected(8, Sum, "float32"), "float32", "polled allreduce")


def check_wrong_device():
    other = (DEV + 1) % 4
    x = np.zeros(4, dtype=np.float32)
    try:
        enqueue("allreduce", "allreduce", [d(x, "float32", other)], [d(x, "float32", other)])
    except ValueError as e:
        msg = str(e)
        assert f"expected a tensor on cuda:{DEV}, got cuda:{other}" in msg, msg
        assert "torch.cuda.set_device(hvd.local_rank())" in msg, msg
    else:
        raise AssertionError("a tensor on another device was accepted")


def check_default_stream_of_the_tensors_device():
    """torch's default stream arrives as 0: the legacy stream of the *current* device. This
    thread's current device stays 0 while the tensors are on DEV, so the core must select DEV
    around its event record / stream wait (else CUDA rejects the record, or orders the wrong
    device's stream)."""
    x = make(rank_values(1000, RANK, Sum, "float32"), "float32")
    out = np.zeros_like(x)
    h = _core.enqueue(_core.EnqueueArgs(op=_core.OPS["allreduce"], name=name("legacy"),
                                        reduce_op=_core.ReduceOp.Sum, inputs=[d(x, "float32")],
                                        outputs=[d(out, "float32")], stream=0))
    finish(h, stream=0)
    close(out, expected(1000, Sum, "float32"), "float32", "allreduce on the default stream")
    assert stats()["wrong_device"] == 0, stats()


def check_no_device_sync_on_the_hot_path():
    """Growing the device fusion buffer and the page-locked staging buffer must not call
    cudaFree / cudaFreeHost, which wait for the whole device (and another thread's kernels)."""
    fused = [make(rank_values(1000, RANK, Sum, "float32"), "float32") for _ in range(2)]
    finish(enqueue("allreduce", "grouped_allreduce", [d(x, "float32") for x in fused],
                   [d(x, "float32") for x in fused], Sum))
    staged = make(rank_values(1000, RANK, Min, "float32"), "float32")
    finish(enqueue("allreduce", "allreduce", [d(staged, "float32")], [d(staged, "float32")],
                   Min, pre=2.0))
    before = stats()
    for k in (300_000, 1_500_000):  # each step grows both buffers
        xs = [make(rank_values(k, RANK, Sum, "float32"), "float32") for _ in range(2)]
        finish(enqueue("allreduce", "grouped_allreduce", [d(x, "float32") for x in xs],
                       [d(x, "float32") for x in xs], Sum))
        for x in xs:
            close(x, expected(k, Sum, "float32"), "float32", f"grown fusion buffer {k}")
        y = make(rank_values(k, RANK, Min, "float32"), "float32")
        finish(enqueue("allreduce", "allreduce", [d(y, "float32")], [d(y, "float32")], Min,
                       pre=2.0))
        close(y, np.stack([rank_values(k, r, Min, "float32") * 2 for r in range(SIZE)]).min(0),
              "float32", f"grown staging buffer {k}")
    after = stats()
    assert after["device_syncs"] == before["device_syncs"], \
        f"cudaFree/cudaFreeHost on the hot path: {before['device_syncs']} -> {after['device_syncs']}"


def check_join():
    """The last rank joins at once; the others' allreduces see it contribute identities."""
    if SIZE < 2:
        return
    last = SIZE - 1
    if RANK == last:
        assert hvd.join() < last  # another rank joined after this one
        return
    for op in (Sum, Max):
        x = make(rank_values(5, RANK, op, "float32"), "float32")
        finish(enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], op))
        vals = np.stack([rank_values(5, r, op, "float32") for r in range(SIZE - 1)])
        want = vals.sum(0) if op == Sum else vals.max(0)
        close(x, want, "float32", f"allreduce with a joined rank op={op}")
    assert hvd.join() < last


def _adasum_pair(a, b, wa=1, wb=1):
    """a and b standing for wa and wb leaves (docs/adasum.md, the rule with weights)."""
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / aa * wa / (wa + wb) if aa >= np.sqrt(np.finfo(np.float64).tiny) else 1.0
    cb = 1.0 - dot / bb * wb / (wa + wb) if bb >= np.sqrt(np.finfo(np.float64).tiny) else 1.0
    return ca * a + cb * b


def _adasum_tree(vs):
    """The rank-order tree with the fold of the first 2E leaves (docs/adasum.md), each operand
    weighed by the number of leaves under it."""
    p = 1 << (len(vs).bit_length() - 1)
    e = len(vs) - p
    level = [(_adasum_pair(vs[2 * i], vs[2 * i + 1]), 2) for i in range(e)] + [
        (v, 1) for v in vs[2 * e:]]
    while len(level) > 1:
        level = [(_adasum_pair(a, b, wa, wb), wa + wb)
                 for (a, wa), (b, wb) in zip(level[0::2], level[1::2])]
    return level[0][0]


def check_adasum():
    """Note [GPU Adasum]: node averages (NCCL) combined across nodes by Adasum (host)."""
    per_node = int(os.environ.get("HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE", "0")) or SIZE
    nodes = [list(range(k, k + per_node)) for k in range(0, SIZE, per_node)]

    def inputs(n, r, k):
        g = np.random.default_rng(1000 * k + r)
        return g.uniform(-1.0, 1.0, n) * (k + 1)

    before = stats()
    for dtype in ["float32", "float64", "float16", "bfloat16"]:
        sizes = [1, 33, 5, 0, 300]  # one fused response: coefficients stay per tensor
        xs = [make(inputs(n, RANK, k), dtype) for k, n in enumerate(sizes)]
        outs = [np.zeros_like(x) for x in xs]
        pre, post = 0.5, 3.0
        finish(enqueue("allreduce", "adasum", [d(x, dtype) for x in xs],
                       [d(o, dtype) for o in outs], Adasum, pre=pre, post=post))
        for k, (n, out) in enumerate(zip(sizes, outs)):
            if n == 0:
                continue
            per_rank = [values_of(make(inputs(n, r, k), dtype), dtype) for r in range(SIZE)]
            averages = [np.mean([per_rank[r] for r in node], axis=0) for node in nodes]
            want = _adasum_tree(averages) * pre * post
            # 16-bit node sums are rounded by NCCL before Adasum: relative to the tensor's scale.
            tol = {"float32": 1e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
            err = np.abs(values_of(out, dtype) - want).max()
            assert err <= tol * np.abs(want).max(), (
                f"Adasum tensor {k} ({len(nodes)} nodes of {per_node}) [{dtype}, rank {RANK}]: "
                f"max error {err} > {tol} x {np.abs(want).max()}\n got {values_of(out, dtype)}\n"
                f" want {want}")
    # Parallel inputs (multiples of one vector, either sign): the node averages are parallel
    # too, and the tree weighs every node alike (each runs the same number of ranks), so the
    # result is the mean over all ranks at any number of nodes (Note [Adasum weights]).
    v = np.linspace(-1.0, 2.0, 41)

    def mult(r):  # different node averages: 3 nodes of 2 give 1.5, -7.5, 21.5
        return (1.0 + r * r) * (-1) ** (r // 2)
    for dtype in ["float32", "float64"]:
        x = make(v * mult(RANK), dtype)
        out = np.zeros_like(x)
        finish(enqueue("allreduce", "adasum_parallel", [d(x, dtype)], [d(out, dtype)], Adasum))
        want = np.mean([values_of(make(v * mult(r), dtype), dtype)
                        for r in range(SIZE)], axis=0)
        close(values_of(out, dtype), want, dtype,
              f"Adasum of parallel inputs ({len(nodes)} nodes of {per_node})")
    after = stats()
    if per_node > 1:
        assert after["reducescatters"] > before["reducescatters"], "no node-local reduce-scatter"
        assert after["allgathers"] > before["allgathers"], "no node-local allgather"


# The Gloo controller's NCCL runs also check GPU Adasum (MPI's has a launch of its own).
GLOO_ADASUM = (MODE == "full" and os.environ.get("CHECK_CONTROLLER") == "gloo"
               and os.environ.get("HOROVOD_GPU_OPERATIONS", "NCCL") == "NCCL")


def run_full():
    check_allreduce_every_dtype()
    check_default_stream_of_the_tensors_device()
    check_no_device_sync_on_the_hot_path()
    check_wrong_device()  # after the first op bound this rank's device
    check_scaled_allreduce()
    check_fused_allreduce()
    check_allgather()
    check_uneven_allgather_launches()
    check_broadcast()
    check_alltoall()
    check_reducescatter()
    check_many_in_flight()
    check_poll_and_no_stream()
    if GLOO_ADASUM:
        check_adasum()  # Note [GPU Adasum] with its cross-node step over Gloo
    check_join()
    check_memory_pool()


def check_memory_pool():
    """Outputs come from the stream-ordered pool when the device has one (its release
    threshold raised, so memory is kept between steps), from cudaMalloc when it has none."""
    FAKE.fake_mempool_threshold.restype = ctypes.c_ulonglong
    s = stats()
    if os.environ.get("FAKE_CUDA_NO_MEMPOOLS") == "1":
        assert s["async_mallocs"] == 0 and s["mallocs"] > 0, s
    else:
        assert s["async_mallocs"] > 0, s
        assert FAKE.fake_mempool_threshold(DEV) >= 1 << 28, FAKE.fake_mempool_threshold(DEV)


def run_async_error():
    """NCCL reports an asynchronous error: synchronize raises instead of hanging, and the
    failed allgather's output (core-allocated, never handed to a consumer stream) is freed in
    the order of the stream that last wrote it."""
    x = make(rank_values(8, RANK, Sum, "float32"), "float32")
    start = time.time()
    h = enqueue("allgather", "allgather", [d(x, "float32")])
    try:
        finish(h)
    except RuntimeError as e:
        msg = str(e)
        assert f"status {_core.STATUS['internal']}" in msg, msg
        assert "asynchronous error" in msg and "aborted" in msg, msg
        assert "fake NCCL error 6" in msg, msg
    else:
        raise AssertionError("the injected NCCL error was not reported")
    assert time.time() - start < 30
    assert stats()["aborts"] >= 1, stats()
    # The communicator is gone: the next GPU op fails with a clear error too.
    h = enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], Sum)
    try:
        finish(h)
    except RuntimeError as e:
        assert "aborted earlier" in str(e) or "shut down" in str(e) or "failed" in str(e), str(e)
    else:
        raise AssertionError("an op on an aborted communicator succeeded")
    s = stats()
    assert s["unordered_frees"] == 0 and s["use_after_free"] == 0, s


def run_async_watchdog():
    """HOROVOD_ENABLE_ASYNC_COMPLETION=1: synchronize() only orders the consumer's stream, so
    no host thread waits. A peer dying mid-collective (FAKE_NCCL_ERROR_DELAY_MS later) must
    still abort the communicator, releasing the consumer's stream, and fail later ops."""
    import threading

    x = make(rank_values(8, RANK, Sum, "float32"), "float32")
    h = enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], Sum)
    code, msg = _status(h, CONSUMER)
    assert code == _core.Status.ok, (code, msg)  # the error is not known yet
    released = threading.Event()

    def consumer():
        FAKE.cudaStreamSynchronize(ctypes.c_void_p(CONSUMER))
        released.set()

    threading.Thread(target=consumer, daemon=True).start()
    if not released.wait(30):
        print(f"rank {RANK}: the consumer's stream was never released: no watchdog aborted "
              f"the failed communicator ({stats()})", flush=True)
        os._exit(1)
    assert stats()["aborts"] >= 1, stats()
    h = enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], Sum)
    code, msg = _status(h, CONSUMER)
    assert code == _core.STATUS["internal"] and "aborted" in msg, (code, msg)


def run_abort_during_launch():
    """The first op fails asynchronously (FAKE_NCCL_ERROR_DELAY_MS after it starts) while the
    worker is inside the next op's NCCL call (FAKE_NCCL_HANG_CALL_MS, issued in a later cycle):
    the abort must wait for that call to return."""
    x = make(rank_values(8, RANK, Sum, "float32"), "float32")
    y = make(rank_values(8, RANK, Sum, "float64"), "float64")
    h1 = enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], Sum)
    time.sleep(0.3)
    h2 = enqueue("allreduce", "allreduce", [d(y, "float64")], [d(y, "float64")], Sum)
    for h in (h1, h2):
        code, msg = _status(h, CONSUMER)
        assert code == _core.STATUS["internal"] and "asynchronous error" in msg, (code, msg)
    s = stats()
    assert s["aborts"] >= 1 and s["abort_in_call"] == 0, s


def run_process_sets():
    """Two process sets on rank 1 (sets [0, 1] and [1, 2]) launch NCCL work from two worker
    threads on one device: the launches must never overlap (FAKE_NCCL_CALL_US widens them)."""
    mine = [ps for ps in SETS if RANK in ps.ranks]
    arrays, handles = [], []
    for k in range(40):
        for ps in mine:
            x = make(rank_values(16 + k, RANK, Sum, "float32"), "float32")
            arrays.append((x, ps, k))
            handles.append(_core.enqueue(_core.EnqueueArgs(
                op=_core.OPS["allreduce"], name=f"ps{ps.process_set_id}.ar{k}",
                process_set=ps.process_set_id, reduce_op=_core.ReduceOp.Sum, inputs=[d(x, "float32")],
                outputs=[d(x, "float32")], stream=PRODUCER)))
    for h in handles:
        finish(h)
    for x, ps, k in arrays:
        want = np.stack([rank_values(16 + k, r, Sum, "float32") for r in ps.ranks]).sum(0)
        close(x, want, "float32", f"allreduce on process set {ps.ranks}")
    s = stats()
    assert s["concurrent_launches"] == 0, f"NCCL launches overlapped on one device: {s}"


def run_duplicate_device():
    x = np.zeros(4, dtype=np.float32)
    h = enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], Sum)
    code, msg = _status(h, CONSUMER)
    assert code == _core.STATUS["invalid_argument"], (code, msg)
    assert "one GPU per rank" in msg and "HOROVOD_GPU_OPERATIONS=MPI" in msg, msg
    assert "cuda:<hvd.local_rank()>" in msg, msg


def mpi_initialized():
    """Whether MPI_Init ran in this process (asked of the MPI library the core links)."""
    flag = ctypes.c_int(0)
    assert ctypes.CDLL(_core.__file__).MPI_Initialized(ctypes.byref(flag)) == 0
    return bool(flag.value)


def check_controller():
    """On the Gloo controller nothing of MPI runs: the engine's unique ids travelled over Gloo."""
    if os.environ.get("CHECK_CONTROLLER") == "gloo":
        assert hvd.gloo_enabled() and not hvd.mpi_enabled(), (hvd.gloo_enabled(), hvd.mpi_enabled())
        assert not mpi_initialized(), "MPI was initialised on the Gloo controller"


def check_every_member_joined(expected=None):
    """Every NCCL communicator made in the job was joined once by each of its ranks 0..n-1 with
    the same unique id: the id its leader made reached every member (Note [NCCL bootstrap without
    MPI]). `expected`: how many communicators the job made in all."""
    buf = ctypes.create_string_buffer(1 << 16)
    FAKE.fake_nccl_comm_members(buf, len(buf))
    mine = [(i, int(r), int(n)) for i, r, n in (line.split() for line in
                                                 buf.value.decode().splitlines())]
    joined = {}
    for rank, comms in enumerate(hvd.allgather_object(mine, name="nccl_comm_members")):
        for uid, r, n in comms:
            joined.setdefault(uid, []).append((r, n, rank))
    for uid, members in joined.items():
        sizes = {n for _, n, _ in members}
        assert len(sizes) == 1 and sorted(r for r, _, _ in members) == list(range(sizes.pop())), \
            f"communicator {uid} was not joined once by each of its ranks: (rank, size, by) {members}"
    assert expected is None or len(joined) == expected, (expected, joined)
    if RANK == 0:
        print(f"rank 0: {len(joined)} NCCL communicator(s), each joined by every member "
              f"({', '.join(str(len(m)) for m in joined.values())} ranks); MPI initialised: "
              f"{mpi_initialized()}", flush=True)


def comm_ids():
    """Unique ids of the NCCL communicators made on this rank so far, in creation order."""
    buf = ctypes.create_string_buffer(4096)
    FAKE.fake_nccl_comm_ids(buf, len(buf))
    return buf.value.decode().split()


def run_elastic_reset():
    """Note [Elastic reset] with NCCL communicators: the reset aborts the old world's (never
    ncclCommDestroy, which may wait on a dead peer), and the first GPU collective of the new
    world makes a new one, from a new unique id, over the survivors. CHECK_LOSE_RANK (under
    fault-tolerant MPI) leaves the job after the first collective; without it the reset keeps
    every rank."""
    global RANK, SIZE
    from hvdcompat import basics

    lose = int(os.environ.get("CHECK_LOSE_RANK", "-1"))
    x = make(rank_values(8, RANK, Sum, "float32"), "float32")
    finish(enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], Sum))
    close(x, expected(8, Sum, "float32"), "float32", "allreduce of the first world")
    before, old_ids = stats(), comm_ids()
    assert before["comm_inits"] == 1 and before["comms_live"] == 1 and len(old_ids) == 1, before
    if RANK == lose:
        print(f"rank {RANK}: LEAVING THE JOB", flush=True)
        sys.stdout.flush()
        os._exit(0)
    if lose >= 0:
        # The lost rank surfaces in the next collective's negotiation. (On Gloo a survivor that
        # saw the loss closes its own connections, as MPI's revoke does, so a survivor that had
        # not seen it yet may name that one too.)
        h = enqueue("allreduce", "allreduce", [d(x, "float32")], [d(x, "float32")], Sum)
        code, msg = _status(h, CONSUMER)
        named = re.search(r"rank\(s\) ([0-9, ]+) ", msg)
        assert code == _core.STATUS["internal"] and named and \
            lose in [int(r) for r in named.group(1).split(",")], (code, msg)
    old_rank, old_size = RANK, SIZE
    survivors = basics._elastic_reset()
    RANK, SIZE = hvd.rank(), hvd.size()
    want = [r for r in range(old_size) if r != lose]
    assert survivors == want and SIZE == len(want) and RANK == want.index(old_rank), \
        (survivors, RANK, SIZE)
    s = stats()
    assert s["aborts"] == before["aborts"] + 1, f"the old communicator was not aborted: {s}"
    assert s["comm_destroys"] == before["comm_destroys"], f"ncclCommDestroy after a reset: {s}"
    assert s["comms_live"] == 0 and s["misuse"] == 0 and s["abort_in_call"] == 0, s
    assert s["comm_inits"] == 1, f"a communicator was made before any GPU collective: {s}"
    for k in range(2):
        y = make(rank_values(16, RANK, Sum, "float32"), "float32")
        finish(enqueue("allreduce", "allreduce", [d(y, "float32")], [d(y, "float32")], Sum))
        close(y, expected(16, Sum, "float32"), "float32", f"allreduce #{k} of the new world")
    s, ids = stats(), comm_ids()
    assert s["comm_inits"] == 2 and s["comms_live"] == 1 and len(ids) == 2, (s, ids)
    assert ids[1] != ids[0], f"the new world's communicator reuses the old unique id {ids}"
    # Every member of the new world joined the same new communicator.
    peers = hvd.allgather_object(ids[1])
    assert len(set(peers)) == 1, peers
    check_controller()
    print(f"rank {RANK}: old rank {old_rank} of {old_size}, communicator {ids[0]} aborted, "
          f"new one {ids[1]} over {SIZE} rank(s)", flush=True)


if MODE == "async_error":
    run_async_error()
elif MODE == "adasum":
    check_adasum()
elif MODE == "async_watchdog":
    run_async_watchdog()
elif MODE == "abort_during_launch":
    run_abort_during_launch()
elif MODE == "process_sets":
    run_process_sets()
    check_controller()
    check_every_member_joined(expected=len(SETS))
elif MODE == "duplicate":
    run_duplicate_device()
elif MODE == "elastic_reset":
    run_elastic_reset()
else:
    run_full()
    s = stats()
    assert s["misuse"] == 0, s
    if MODE == "shared":
        assert s["allreduces"] == 0 and s["comms_live"] == 0, "MPI mode must not use NCCL"
    expect_lanes = int(os.environ.get("HOROVOD_NUM_NCCL_STREAMS", "1"))
    if MODE == "full" and os.environ.get("FAKE_NCCL_VERSION") is None:
        per_lane = 3 if os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE") == "1" else 1
        # Without the hierarchy, GPU Adasum made its lane's node communicator (one node here).
        adasum_node = 1 if GLOO_ADASUM and per_lane == 1 and SIZE > 1 else 0
        assert s["comms_live"] == expect_lanes * per_lane + adasum_node, s
        # Per lane: the whole set's, and with the hierarchy each node's and each local rank's.
        per_node = int(os.environ.get("HVDCOMPAT_HIERARCHICAL_LOCAL_SIZE", "0"))
        groups = 1 + (SIZE // per_node + per_node if per_lane == 3 else 0)
        check_every_member_joined(expected=expect_lanes * groups + adasum_node)
    check_controller()

hvd.shutdown()
for handle in (PRODUCER, CONSUMER):
    assert FAKE.cudaStreamDestroy(ctypes.c_void_p(handle)) == 0
s = stats()
if MODE not in ("async_error", "async_watchdog", "abort_during_launch"):
    assert s["comms_live"] == 0, f"communicators left after shutdown: {s}"
assert s["streams_live"] == 0, f"streams left after shutdown: {s}"
assert s["live_device"] == 0, f"device memory left after shutdown: {s}"
assert s["misuse"] == 0, f"a destroyed object was used: {s}"
print(f"rank {RANK}: CHECKS PASSED ({MODE})", flush=True)
sys.exit(0)
