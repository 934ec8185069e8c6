"""Every collective on the Gloo controller, checked against results computed
here from rank and size. Run as: gloo_collectives.py RANK SIZE PORT (rank 0
hosts the TCPStore); started by tests/gloo/test_gloo_engine.py."""

import sys

import mpi4py

mpi4py.rc.initialize = False  # only to ask whether anything initialised MPI
from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402

import hvdcompat as hvd  # noqa: E402
from hvdcompat import _core  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gloo_store import TorchStore, start_engine  # noqa: E402

RANK, SIZE, PORT = (int(a) for a in sys.argv[1:4])
store = TorchStore("127.0.0.1", PORT, RANK, SIZE)
start_engine(store, RANK, SIZE)

assert (hvd.rank(), hvd.size()) == (RANK, SIZE), (hvd.rank(), hvd.size())
assert (hvd.local_rank(), hvd.local_size()) == (RANK, SIZE)  # one host
assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
assert _core.gloo_built() and _core.gloo_enabled() and not _core.mpi_enabled()
assert not MPI.Is_initialized(), "the Gloo controller initialised MPI"

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
       "product": hvd.Product}


def value(r, shape, dtype):
    # Small exact values, so every op and dtype has one right answer
    # (the product of 3 ranks stays inside int8).
    base = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape)
    v = (base % 4) + (r % 3) + 1
    return v.to(dtype)


def reference(op, shape, dtype):
    vals = torch.stack([value(r, shape, torch.float64) for r in range(SIZE)])
    if op == "sum":
        out = vals.sum(0)
    elif op == "average":
        out = vals.sum(0)
        out = torch.div(out, SIZE, rounding_mode="trunc") if dtype in INTS else out / SIZE
    elif op == "min":
        out = vals.amin(0)
    elif op == "max":
        out = vals.amax(0)
    else:
        out = vals.prod(0)
    return out.to(dtype)


def check(what, got, want):
    tol = {torch.float16: 1e-3, torch.bfloat16: 1e-2}.get(want.dtype, 1e-6)
    if got.dtype != want.dtype or got.shape != want.shape or not torch.allclose(
            got.double(), want.double(), rtol=tol, atol=tol):
        raise AssertionError(f"rank {RANK}/{SIZE} {what}: got {got.tolist()} want {want.tolist()}")


# allreduce: every op and dtype, one tensor; then the same fused (async, one cycle).
for dtype in INTS + FLOATS:
    for name, op in OPS.items():
        shape = (3, 5)
        got = hvd.allreduce(value(RANK, shape, dtype), op=op, name=f"ar.{name}.{dtype}")
        check(f"allreduce {name} {dtype}", got, reference(name, shape, dtype))
    handles = [hvd.allreduce_async(value(RANK, (i + 2,), dtype), op=hvd.Sum,
                                   name=f"fused.{dtype}.{i}") for i in range(4)]
    for i, h in enumerate(handles):
        check(f"fused allreduce {dtype} #{i}", hvd.synchronize(h), reference("sum", (i + 2,), dtype))
# in place, prescale/postscale, and a large tensor (several Gloo segments)
t = value(RANK, (1 << 20,), torch.float32)
hvd.allreduce_(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0, name="big")
check("allreduce big scaled", t, reference("sum", (1 << 20,), torch.float32) * 2.0)
got = hvd.grouped_allreduce([value(RANK, (4,), torch.float32), value(RANK, (2, 2), torch.float64)],
                            op=hvd.Average, name="grouped")
check("grouped allreduce 0", got[0], reference("average", (4,), torch.float32))
check("grouped allreduce 1", got[1], reference("average", (2, 2), torch.float64))

# allgather: a first dimension of rank + 1 rows, every dtype; then fused.
for dtype in INTS + FLOATS + [torch.bool]:
    mine = torch.full((RANK + 1, 2), RANK + 1).to(dtype)
    want = torch.cat([torch.full((r + 1, 2), r + 1).to(dtype) for r in range(SIZE)])
    check(f"allgather {dtype}", hvd.allgather(mine, name=f"ag.{dtype}"), want)
got = hvd.grouped_allgather([torch.full((RANK + 1,), float(RANK)), torch.full((2, 3), RANK)],
                            name="ag.grouped")
check("grouped allgather 0", got[0], torch.cat([torch.full((r + 1,), float(r)) for r in range(SIZE)]))
check("grouped allgather 1", got[1], torch.cat([torch.full((2, 3), r) for r in range(SIZE)]))

# broadcast from the last rank, every dtype
root = SIZE - 1
for dtype in INTS + FLOATS + [torch.bool]:
    t = value(RANK, (3, 2), dtype) if dtype != torch.bool else torch.tensor([RANK == root] * 4)
    want = value(root, (3, 2), dtype) if dtype != torch.bool else torch.tensor([True] * 4)
    check(f"broadcast {dtype}", hvd.broadcast(t, root_rank=root, name=f"bc.{dtype}"), want)

# alltoall: rank r sends j + 1 rows of value 100 r + j to rank j
splits = torch.tensor([j + 1 for j in range(SIZE)], dtype=torch.int32)
send = torch.cat([torch.full((j + 1, 2), 100 * RANK + j) for j in range(SIZE)]).to(torch.int32)
got, recv_splits = hvd.alltoall(send, splits=splits, name="a2a")
want = torch.cat([torch.full((RANK + 1, 2), 100 * r + RANK) for r in range(SIZE)]).to(torch.int32)
check("alltoall", got, want)
assert recv_splits.tolist() == [RANK + 1] * SIZE, recv_splits

# reducescatter: rows split as Horovod does (the first rows % size ranks get one more)
for dtype in [torch.float32, torch.float16, torch.int64]:
    rows = 2 * SIZE + 1
    got = hvd.reducescatter(value(RANK, (rows, 3), dtype), op=hvd.Sum, name=f"rs.{dtype}")
    full = reference("sum", (rows, 3), dtype)
    counts = [rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(SIZE)]
    start = sum(counts[:RANK])
    check(f"reducescatter {dtype}", got, full[start:start + counts[RANK]])
# every reduce op, rows that leave some ranks an empty block, and a fused pair of
# different row counts (the ring's blocks then differ in size from rank to rank)
for name in ("average", "min", "max", "product"):
    rows = SIZE - 1
    got = hvd.reducescatter(value(RANK, (rows, 2), torch.float64), op=OPS[name], name=f"rs.{name}")
    want = reference(name, (rows, 2), torch.float64)
    check(f"reducescatter {name}", got, want[RANK:RANK + 1] if RANK < rows else want[:0])
shapes = [(3 * SIZE + 2, 2), (SIZE + 1,)]
got = hvd.grouped_reducescatter([value(RANK, s, torch.float32) for s in shapes], op=hvd.Sum,
                                name="rs.grouped")
for i, shape in enumerate(shapes):
    rows = shape[0]
    counts = [rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(SIZE)]
    start = sum(counts[:RANK])
    check(f"grouped reducescatter {i}", got[i],
          reference("sum", shape, torch.float32)[start:start + counts[RANK]])

hvd.barrier()

# join: rank 0 reduces once more while the others have joined (they add zeros)
if RANK == 0:
    got = hvd.allreduce(value(0, (4,), torch.float32), op=hvd.Sum, name="after.join")
    check("allreduce beside joined ranks", got, value(0, (4,), torch.float32))
last = hvd.join()
assert last == 0, f"rank {RANK}: join returned {last}, expected rank 0 (it joined last)"

# a process set (the first and last rank; the last alone at size 2): its own Gloo context
members = [0, SIZE - 1] if SIZE > 2 else [SIZE - 1]
ps = hvd.add_process_set(members)
if RANK in members:
    got = hvd.allreduce(torch.tensor([float(RANK)]), op=hvd.Sum, process_set=ps, name="ps")
    check("process set allreduce", got, torch.tensor([float(sum(members))]))
    got = hvd.allgather(torch.tensor([RANK]), process_set=ps, name="ps.ag")
    check("process set allgather", got, torch.tensor(members))
hvd.remove_process_set(ps)
got = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="after.sets")
check("global set after process sets", got, torch.tensor([float(SIZE)]))

hvd.shutdown()
print(f"rank {RANK}/{SIZE}: gloo collectives OK", flush=True)
