"""GPU checks of the data plane, run by tests/gpu/run_device_checks.sh on a GPU machine.

Usage: python3 device_checks.py CHECK [CHECK ...], each of:
  single        every collective, dtype and reduce op through NCCL on one rank (public API)
  stream        producer on a side stream, then an allreduce, consumer reads at once
  fusion        many small tensors fused into one collective on the device buffer
  bandwidth     fused pack/unpack time against a plain device-to-device copy, as a ratio
  join          hvd.join() with device tensors in flight on the other ranks
  hierarchical  HOROVOD_HIERARCHICAL_ALLREDUCE=1: its setup, then correct allreduces
  staged        (under mpirun) HOROVOD_GPU_OPERATIONS=MPI (GLOO), ranks may share a GPU
  process_set   (under mpirun) a process set per rank next to the global set
  nccl_process_sets  (under mpirun, NCCL) one single-rank set per rank, many ops
  duplicate     (under mpirun, NCCL, ranks on one GPU) the clear one-GPU-per-rank error
  gloo          (under torchrun; last) the checks before it ran on the Gloo controller and
                MPI was never initialised

The checks marked "under mpirun" run under torchrun as well (the Gloo controller): there the
host staging (HOROVOD_GPU_OPERATIONS=MPI or GLOO) goes through Gloo and every NCCL unique id
travels over the process set's Gloo context.

Each check prints "PASS: <name>" or "FAIL: <name>: <why>" (rank 0 prints, or
every rank for failures); the exit status is non-zero when any failed.
Expectations are computed from rank and size. DEVICE_CHECKS_ON_CPU=1 runs the
same checks on CPU tensors (to check this script itself where no GPU is).
"""

import os
import sys
import time
import traceback

import torch

import hvdcompat as hvd

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64) + FLOATS + (torch.bool,)
_failures = []
ON_CPU = os.environ.get("DEVICE_CHECKS_ON_CPU") == "1"


def report(name, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure becomes a FAIL line
        _failures.append(name)
        print(f"FAIL: {name} (rank {hvd.rank()}): {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()
        return
    if hvd.rank() == 0:
        print(f"PASS: {name}", flush=True)


def device():
    if ON_CPU:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def synchronize_device():
    if not ON_CPU:
        torch.cuda.synchronize()


def rank_values(n, rank, op, dtype):
    i = torch.arange(n, dtype=torch.float64)
    if dtype == torch.bool:
        return ((i + rank) % 2 == 0).double()
    if op == hvd.Product:
        return (i + rank) % 2 + 1
    if op == hvd.Average and dtype not in FLOATS:
        return i % 5 + 2 * rank  # the mean over ranks is an integer
    return i % 5 + rank + 1


def expected(n, op, dtype, size):
    vals = torch.stack([rank_values(n, r, op, dtype) for r in range(size)])
    if op == hvd.Sum:
        return vals.sum(0)
    if op == hvd.Average:
        return vals.sum(0) / size
    return {hvd.Min: vals.min(0).values, hvd.Max: vals.max(0).values,
            hvd.Product: vals.prod(0)}[op]


def assert_close(got, want, dtype, what):
    got = got.detach().double().cpu()
    want = want.double().cpu()
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-6,
           torch.float64: 1e-12}.get(dtype, 0.0)
    if tol:
        ok = torch.allclose(got, want, rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    if not ok:
        raise AssertionError(f"{what} [{dtype}]: got {got.flatten()[:6].tolist()}, "
                             f"want {want.flatten()[:6].tolist()}")


def ops_for(dtype):
    return (hvd.Min, hvd.Max) if dtype == torch.bool else (
        hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product)


def check_collectives_every_dtype():
    rank, size, dev = hvd.rank(), hvd.size(), device()
    for dtype in DTYPES:
        for op in ops_for(dtype):
            x = rank_values(37, rank, op, dtype).to(dtype).to(dev)
            out = hvd.allreduce(x, op=op, name=f"ar.{dtype}.{op}")
            assert out.device == dev and out.dtype == dtype
            assert_close(out, expected(37, op, dtype, size), dtype, f"allreduce op={op}")
            hvd.allreduce_(x, op=op, name=f"ari.{dtype}.{op}")
            assert_close(x, expected(37, op, dtype, size), dtype, f"in-place allreduce op={op}")
        if dtype in FLOATS:
            x = rank_values(16, rank, hvd.Sum, dtype).to(dtype).to(dev)
            out = hvd.allreduce(x, op=hvd.Average, prescale_factor=0.5, postscale_factor=4.0,
                                name=f"scaled.{dtype}")
            assert_close(out, expected(16, hvd.Sum, dtype, size) * 2.0 / size, dtype,
                         "scaled average")
        rows = rank + 1
        x = (torch.arange(rows * 3) + 10 * rank).to(dtype).reshape(rows, 3).to(dev)
        g = hvd.allgather(x, name=f"ag.{dtype}")
        want = torch.cat([(torch.arange((r + 1) * 3) + 10 * r).to(dtype).reshape(r + 1, 3)
                          for r in range(size)])
        assert g.device == dev
        assert_close(g, want.double(), dtype, "allgather")
        b = hvd.broadcast((torch.arange(9) + 100 * rank).to(dtype).to(dev), root_rank=size - 1,
                          name=f"bc.{dtype}")
        assert_close(b, (torch.arange(9) + 100 * (size - 1)).to(dtype).double(), dtype, "broadcast")
        # Every rank sends at least one row to every rank (1 to 3 rows).
        splits = torch.tensor([(rank + j) % 3 + 1 for j in range(size)], dtype=torch.int32)
        total = int(splits.sum())
        x = (torch.arange(total * 2) + 50 * rank).to(dtype).reshape(total, 2).to(dev)
        out, received = hvd.alltoall(x, splits=splits, name=f"a2a.{dtype}")
        parts = []
        for j in range(size):
            sj = [(j + k) % 3 + 1 for k in range(size)]
            xj = (torch.arange(sum(sj) * 2) + 50 * j).to(dtype).reshape(sum(sj), 2)
            parts.append(xj[sum(sj[:rank]):sum(sj[:rank]) + sj[rank]])
        assert received.tolist() == [(j + rank) % 3 + 1 for j in range(size)], received
        assert_close(out, torch.cat(parts).double(), dtype, "alltoall")
        if dtype != torch.bool:
            n = 2 * size + 1
            x = rank_values(n * 3, rank, hvd.Sum, dtype).to(dtype).reshape(n, 3).to(dev)
            rs = hvd.reducescatter(x, op=hvd.Sum, name=f"rs.{dtype}")
            full = expected(n * 3, hvd.Sum, dtype, size).reshape(n, 3)
            mine = n // size + (1 if rank < n % size else 0)
            first = sum(n // size + (1 if r < n % size else 0) for r in range(rank))
            assert_close(rs, full[first:first + mine], dtype, "reducescatter")
    # Integer Average: the sum divided exactly, truncated toward zero (NCCL's rule, the
    # host path's too): rank r contributes r + 1 and -(r + 1).
    for dtype in (torch.int32, torch.int64):
        x = torch.tensor([rank + 1, -(rank + 1)], dtype=dtype, device=dev)
        got = hvd.allreduce(x, op=hvd.Average, name=f"intavg.{dtype}")
        total = size * (size + 1) // 2
        want = torch.tensor([total // size, -(total // size)], dtype=torch.float64)
        assert_close(got, want, dtype, "integer average truncates toward zero")
    xs = [rank_values(k, rank, hvd.Sum, torch.float32).float().to(dev) for k in (3, 1000, 1)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grouped")
    for k, o in zip((3, 1000, 1), outs):
        assert_close(o, expected(k, hvd.Sum, torch.float32, size), torch.float32, "grouped")
    gs = hvd.grouped_allgather([torch.full((rank + 1, 2), float(rank), device=dev),
                                torch.ones(2, device=dev)], name="grouped_ag")
    assert gs[0].shape[0] == size * (size + 1) // 2 and gs[1].shape[0] == 2 * size
    rss = hvd.grouped_reducescatter([torch.ones(size * 2, device=dev),
                                     torch.ones(size + 1, 4, device=dev)], op=hvd.Sum,
                                    name="grouped_rs")
    assert float(rss[0].sum()) == 2 * size and rss[1].shape[1] == 4


def check_stream_order():
    """Inputs written on a side stream after a long sleep; a missed producer wait reads zeros."""
    rank, size, dev = hvd.rank(), hvd.size(), device()
    if ON_CPU:
        import contextlib
        side, on_side, sleep = None, lambda s: contextlib.nullcontext(), lambda c: None
    else:
        side, on_side, sleep = torch.cuda.Stream(), torch.cuda.stream, torch.cuda._sleep
    for k in range(3):
        x = torch.zeros(1 << 20, device=dev)
        synchronize_device()
        with on_side(side):
            sleep(200_000_000)  # ~0.1-0.2 s of device time before the write
            x.fill_(rank + 1.0)
            out = hvd.allreduce(x, op=hvd.Sum, name=f"stream.{k}")
            y = out * 2  # the consumer, on the same (current) stream, right away
        synchronize_device()
        want = 2.0 * size * (size + 1) / 2
        if not torch.all(y == want):
            raise AssertionError(f"consumer saw {y[:4].tolist()} instead of {want}: the engine "
                                 "did not wait for the producer, or the consumer for the engine")


def check_fusion():
    rank, size, dev = hvd.rank(), hvd.size(), device()
    hvd.reset_engine_stats()
    xs = [torch.full((100 + k,), float(rank + k), device=dev) for k in range(64)]
    handles = [hvd.allreduce_async_(x, op=hvd.Sum, name=f"fuse.{k}") for k, x in enumerate(xs)]
    for h in handles:
        hvd.synchronize(h)
    for k, x in enumerate(xs):
        want = sum(float(r + k) for r in range(size))
        if not torch.all(x == want):
            raise AssertionError(f"tensor {k}: {x[:3].tolist()} != {want}")
    stats = hvd.engine_stats()
    if stats["fused_collectives"] == 0:
        raise AssertionError(f"nothing was fused: {stats}")


def check_bandwidth():
    dev = device()
    count, each = 64, 1 << 20  # 64 tensors of 4 MiB (float32)
    xs = [torch.randn(each, device=dev) for _ in range(count)]
    total = count * each * 4
    src = torch.empty(count * each, device=dev)
    dst = torch.empty_like(src)

    def timed(fn, reps=10):
        fn()
        synchronize_device()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        synchronize_device()
        return (time.perf_counter() - start) / reps

    copy_s = timed(lambda: dst.copy_(src))
    fused_s = timed(lambda: hvd.grouped_allreduce_(xs, op=hvd.Sum, name="bw"))
    single_s = timed(lambda: hvd.allreduce_(src, op=hvd.Sum, name="bw.one"))
    if hvd.rank() == 0:
        # One fused allreduce = pack (one copy of the bytes) + NCCL + unpack (another copy);
        # one allreduce of a single tensor of the same bytes has no pack/unpack.
        print(f"RATIO: fused allreduce / device-to-device copy of the same {total >> 20} MiB = "
              f"{fused_s / copy_s:.2f} (pack + NCCL + unpack); single-tensor allreduce / copy = "
              f"{single_s / copy_s:.2f}; so pack+unpack cost {(fused_s - single_s) / copy_s:.2f} "
              f"copies (ideal about 2) on {hvd.size()} rank(s)", flush=True)
        print(f"BANDWIDTH: fused allreduce of {count} x {each * 4 >> 20} MiB on {hvd.size()} "
              f"rank(s) (pack + NCCL + unpack): {total / fused_s / 1e9:.1f} GB/s of payload, "
              f"{fused_s * 1e3:.2f} ms; plain device-to-device copy of the same bytes: "
              f"{total / copy_s / 1e9:.1f} GB/s, {copy_s * 1e3:.2f} ms; pack+unpack moves 2x "
              "the bytes of one copy", flush=True)


def check_join():
    """The last rank joins at once; the others' allreduces see it contribute nothing."""
    rank, size, dev = hvd.rank(), hvd.size(), device()
    if size == 1:
        assert hvd.join(device=dev.index if dev.type == "cuda" else -1) == 0
        return
    if rank == size - 1:
        assert hvd.join() < size - 1
        return
    x = torch.full((5,), float(rank + 1), device=dev)
    out = hvd.allreduce(x, op=hvd.Sum, name="join.ar")
    assert_close(out, torch.full((5,), float(sum(r + 1 for r in range(size - 1)))),
                 torch.float32, "allreduce with a joined rank")
    assert hvd.join() < size - 1


def check_hierarchical():
    rank, size, dev = hvd.rank(), hvd.size(), device()
    for dtype in (torch.float32, torch.float16, torch.int32):
        for op in (hvd.Sum, hvd.Average):
            x = rank_values(1000, rank, op, dtype).to(dtype).to(dev)
            out = hvd.allreduce(x, op=op, name=f"hier.{dtype}.{op}")
            assert_close(out, expected(1000, op, dtype, size), dtype, f"hierarchical op={op}")
    xs = [torch.full((k,), float(rank), device=dev) for k in (7, 300)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="hier.grouped")
    for k, o in zip((7, 300), outs):
        assert_close(o, torch.full((k,), float(sum(range(size)))), torch.float32,
                     "hierarchical grouped")


def _own_set():
    return [ps for ps in _SETS if hvd.rank() in ps.ranks][0]


def check_process_set():
    """A set per rank next to the global set: ops on both, interleaved."""
    rank, size, dev = hvd.rank(), hvd.size(), device()
    mine = _own_set()
    for k in range(10):
        a = hvd.allreduce_async(torch.full((64,), float(rank + k), device=dev), op=hvd.Sum,
                                name=f"ps.own.{k}", process_set=mine)
        g = hvd.allreduce_async(torch.full((64,), float(rank + k), device=dev), op=hvd.Sum,
                                name=f"ps.global.{k}")
        assert_close(hvd.synchronize(a), torch.full((64,), float(rank + k)), torch.float32,
                     "own set")
        assert_close(hvd.synchronize(g), torch.full((64,), float(sum(r + k for r in range(size)))),
                     torch.float32, "global set")


def check_nccl_process_sets():
    """NCCL: each rank's own single-rank set, many device ops from its worker thread, with
    host ops on the global set in between (the launch lock, two workers)."""
    rank, size, dev = hvd.rank(), hvd.size(), device()
    mine = _own_set()
    handles = []
    for k in range(50):
        handles.append((k, hvd.allreduce_async(torch.full((1000 + k,), float(rank * k), device=dev),
                                               op=hvd.Sum, name=f"nps.{k}", process_set=mine)))
        if k % 10 == 0:
            got = hvd.allreduce(torch.full((3,), 1.0), op=hvd.Sum, name=f"nps.cpu.{k}")
            assert_close(got, torch.full((3,), float(size)), torch.float32, "host op, global set")
    for k, h in handles:
        assert_close(hvd.synchronize(h), torch.full((1000 + k,), float(rank * k)), torch.float32,
                     "allreduce on the rank's own set")
    g = hvd.allgather(torch.arange(rank + 2, device=dev), name="nps.ag", process_set=mine)
    assert_close(g, torch.arange(rank + 2).double(), torch.int64, "allgather on the own set")


_SETS = []


def check_gloo_without_mpi():
    """Run last: the checks before it ran on the Gloo controller and never initialised MPI."""
    import ctypes

    from hvdcompat._ext import _core

    if not hvd.gloo_enabled() or hvd.mpi_enabled():
        raise AssertionError(f"not on the Gloo controller: gloo_enabled {hvd.gloo_enabled()}, "
                             f"mpi_enabled {hvd.mpi_enabled()}")
    flag = ctypes.c_int(0)
    ctypes.CDLL(_core.__file__).MPI_Initialized(ctypes.byref(flag))
    if flag.value:
        raise AssertionError("MPI was initialised on the Gloo controller")


def check_duplicate_gpu_error():
    x = torch.ones(4, device=device())
    try:
        hvd.allreduce(x, name="dup")
    except ValueError as e:
        if "one GPU per rank" not in str(e) or "HOROVOD_GPU_OPERATIONS=MPI" not in str(e):
            raise AssertionError(f"unclear message: {e}") from None
        return
    raise AssertionError("two ranks on one GPU were accepted by NCCL")


CHECKS = {
    "single": ("NCCL collectives, every dtype", check_collectives_every_dtype),
    "stream": ("stream ordering (producer side stream, consumer at once)", check_stream_order),
    "fusion": ("fusion of 64 small tensors in the device buffer", check_fusion),
    "bandwidth": ("fusion pack/unpack bandwidth line", check_bandwidth),
    "staged": ("staging through host memory (MPI or Gloo)", check_collectives_every_dtype),
    "duplicate": ("two ranks on one GPU give a clear error", check_duplicate_gpu_error),
    "join": ("join with device tensors", check_join),
    "hierarchical": ("hierarchical allreduce setup and results", check_hierarchical),
    "process_set": ("a process set per rank next to the global set", check_process_set),
    "nccl_process_sets": ("NCCL on one single-rank process set per rank",
                          check_nccl_process_sets),
    "gloo": ("the Gloo controller, MPI never initialised", check_gloo_without_mpi),
}


def main(argv):
    if not ON_CPU and not torch.cuda.is_available():
        print("FAIL: environment: torch.cuda.is_available() is False", flush=True)
        return 1
    if "process_set" in argv or "nccl_process_sets" in argv:
        from hvdcompat.process_sets import ProcessSet

        world = os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("WORLD_SIZE", "1")
        _SETS.extend(ProcessSet([r]) for r in range(int(world)))
        hvd.init(process_sets=_SETS)
    else:
        hvd.init()
    if ON_CPU:
        pass
    elif "duplicate" in argv or "nccl_process_sets" in argv:
        torch.cuda.set_device(0)
    else:
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    mode = os.environ.get("HOROVOD_GPU_OPERATIONS", "NCCL")
    if hvd.rank() == 0:
        print(f"INFO: {hvd.size()} rank(s) on the {'Gloo' if hvd.gloo_enabled() else 'MPI'} "
              f"controller, GPU ops {mode}, NCCL {hvd.nccl_built()}, "
              f"cuda_built {hvd.cuda_built()}, async completion "
              f"{os.environ.get('HOROVOD_ENABLE_ASYNC_COMPLETION', '0')}, torch {torch.__version__}",
              flush=True)
    for check in argv:
        label, fn = CHECKS[check]
        controller = "gloo" if hvd.gloo_enabled() else "mpi"
        report(f"{check}: {label} [{mode}, np={hvd.size()}, {controller}]", fn)
    hvd.shutdown()
    return 1 if _failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
