"""The project card's launch: every check in one job of 4 hosts x 8 ranks.

Each rank checks, against references it computes itself from rank and size:
the topology of the layout; allreduce of every dtype with Sum, Average, Min,
Max and Product (integer Sum and Product wrap around as the dtype does,
float Product overflows to +-inf); allgather with uneven rows; broadcast from
several roots; alltoall with uneven splits; reducescatter; grouped
allreduce; process sets (even/odd ranks and one set per host, all static);
the two-model merge workflow (``merge_named_parameters`` under one
DistributedOptimizer) against one process training on the concatenated
batch; and, with CARD_HIERARCHICAL=1 (the launch sets
HOROVOD_HIERARCHICAL_ALLREDUCE/ALLGATHER), that the node-aware path ran.

With CARD_LOSE_RANK=R (a --fault-tolerant launch), rank R then exits; every
survivor's next allreduce must raise HorovodInternalError naming rank R, and
each writes ``SURVIVOR <rank> <ExceptionType>: <message>`` to
$CARD_OUT/<rank> (the launcher may stop forwarding output once a process is
lost). Every rank prints ``CARD <rank> ok <n> checks`` when its checks pass.
"""

import math
import os
import socket
import sys
import time

import torch

import hvdcompat as hvd

PER_HOST = int(os.environ.get("CARD_PER_HOST", "8"))
checks = 0


def fail(what, got, want):
    raise AssertionError(f"rank {hvd.rank()} on {socket.gethostname()}: {what}:\n"
                         f"got  {got}\nwant {want}")


def same(got, want, what):
    global checks
    checks += 1
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape) or \
            not torch.equal(got, want):
        fail(what, got, want)


def wrap(value, dtype):
    """Python int `value` as `dtype` stores it (two's complement wrap-around)."""
    bits = torch.iinfo(dtype).bits
    v = value % (1 << bits)
    if dtype != torch.uint8 and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def int_input(r, dtype):
    signed = dtype != torch.uint8
    base = [((r * 7 + i * 3) % 11) - (5 if signed else 0) for i in range(6)]
    # Product: 3 on every rank (wraps in every width), rank-dependent factors,
    # 2 everywhere (zero once 2**size passes the width), one odd factor.
    prod = [3, (r % 5) + 1, 2, 7 if r == 7 else 1, -1 if signed and r % 3 == 0 else 1]
    return base, prod


def float_input(r):
    base = [float(((r * 7 + i * 3) % 11) - 5) for i in range(6)]
    # Product: 4096 everywhere (2**384: inf below float64), its negative on
    # rank 0 (-inf), exact powers of two, and 2**40 (inf in every float).
    prod = [4096.0, -4096.0 if r == 0 else 4096.0,
            2.0 if r < 3 else (-1.0 if r == 5 else 1.0),
            0.5 if r < 10 else (2.0 if r < 20 else 1.0), 2.0 ** 40]
    return base, prod


def check_allreduce(n, r):
    handles = []
    for dtype in INTS + FLOATS:
        mine = int_input(r, dtype) if dtype in INTS else float_input(r)
        everyone = [int_input(k, dtype) if dtype in INTS else float_input(k) for k in range(n)]
        base_all = [e[0] for e in everyone]
        cols = list(zip(*base_all))
        prod_cols = list(zip(*[e[1] for e in everyone]))
        if dtype in INTS:
            want = {
                "Sum": [wrap(sum(c), dtype) for c in cols],
                "Min": [min(c) for c in cols], "Max": [max(c) for c in cols],
                "Product": [wrap(math.prod(c), dtype) for c in prod_cols],
            }
        else:
            # Sums of small integers are exact in every float type; the
            # product is computed in float64, then rounded once to the dtype.
            want = {
                "Sum": [float(sum(c)) for c in cols],
                "Average": [sum(c) / n for c in cols],
                "Min": [min(c) for c in cols], "Max": [max(c) for c in cols],
                "Product": [math.prod(c) for c in prod_cols],
            }
        for op_name, expected in want.items():
            values = mine[1] if op_name == "Product" else mine[0]
            x = torch.tensor(values, dtype=dtype)
            w = torch.tensor(expected, dtype=torch.float64 if dtype in FLOATS else torch.int64)
            handles.append((f"allreduce {op_name} {dtype}",
                            hvd.allreduce_async(x, op=getattr(hvd, op_name),
                                                name=f"card.ar.{op_name}.{dtype}"),
                            w.to(dtype)))
    for what, h, w in handles:
        same(hvd.synchronize(h), w, what)
    # The float32 overflow really reaches +-inf (4096 ** 32 = 2 ** 384; 2 ** 40n from 4 ranks).
    got = hvd.allreduce(torch.tensor(float_input(r)[1], dtype=torch.float32), op=hvd.Product,
                        name="card.ar.inf")
    if n >= 4:
        assert got[4].item() == math.inf, got
    if n >= 32:
        assert got[0].item() == math.inf and got[1].item() == -math.inf, got
    # A large tensor past the fusion buffer, averaged.
    big = torch.arange(300_000, dtype=torch.float32) * (r + 1)
    want = torch.arange(300_000, dtype=torch.float64) * (n * (n + 1) / 2) / n
    got = hvd.allreduce(big, op=hvd.Average, name="card.ar.big")
    global checks
    checks += 1
    if not torch.allclose(got.double(), want, rtol=1e-6):
        fail("allreduce Average of 300000 float32", got[:5], want[:5])


def check_gather_family(n, r):
    rows = lambda k: k % 3 + 1  # noqa: E731
    got = hvd.allgather(torch.full((rows(r), 2), float(r)), name="card.ag")
    same(got, torch.cat([torch.full((rows(k), 2), float(k)) for k in range(n)]), "allgather")
    got = hvd.allgather(torch.tensor([r, r * r], dtype=torch.int64), name="card.ag.int")
    same(got, torch.tensor([v for k in range(n) for v in (k, k * k)]), "allgather int64")
    for root in (0, 5 % n, n - 1):
        t = torch.full((3,), float(r))
        hvd.broadcast_(t, root, name=f"card.bc.{root}")
        same(t, torch.full((3,), float(root)), f"broadcast_ from root {root}")
    out = hvd.broadcast(torch.arange(4, dtype=torch.int32) + r, 9 % n, name="card.bc.out")
    same(out, torch.arange(4, dtype=torch.int32) + 9 % n, "broadcast from root 9 % size")
    # alltoall: rank r sends (r + j) % 3 rows of value 100 r + j to rank j.
    splits = [(r + j) % 3 for j in range(n)]
    send = torch.cat([torch.full((s,), float(100 * r + j)) for j, s in enumerate(splits)])
    got, recv_splits = hvd.alltoall(send, splits=torch.tensor(splits, dtype=torch.int32),
                                       name="card.a2a")
    same(got, torch.cat([torch.full(((k + r) % 3,), float(100 * k + r)) for k in range(n)]),
         "alltoall")
    same(recv_splits.to(torch.int64), torch.tensor([(k + r) % 3 for k in range(n)]),
         "alltoall received splits")
    # reducescatter: row i of rank k holds k + i; rank r keeps rows 2r, 2r + 1.
    x = torch.arange(2 * n, dtype=torch.float64).unsqueeze(1).repeat(1, 3) + r
    got = hvd.reducescatter(x, op=hvd.Sum, name="card.rs")
    total = n * (n - 1) / 2
    want = torch.tensor([[n * i + total] * 3 for i in (2 * r, 2 * r + 1)], dtype=torch.float64)
    same(got, want, "reducescatter Sum")
    outs = hvd.grouped_allreduce([torch.full((2,), float(r)), torch.full((3,), float(2 * r))],
                                 op=hvd.Sum, name="card.group")
    same(outs[0], torch.full((2,), total), "grouped allreduce 0")
    same(outs[1], torch.full((3,), 2 * total), "grouped allreduce 1")
    hvd.barrier()


def check_process_sets(n, r, sets):
    even, odd, hosts = sets
    mine = even if r % 2 == 0 else odd
    members = mine.ranks
    got = hvd.allreduce(torch.tensor([float(r), 1.0]), op=hvd.Sum, name="card.ps.sum",
                        process_set=mine)
    same(got, torch.tensor([float(sum(members)), float(len(members))]), "even/odd set allreduce")
    got = hvd.allgather(torch.tensor([r]), name="card.ps.ag", process_set=mine)
    same(got, torch.tensor(members), "even/odd set allgather")
    host = hosts[r // PER_HOST]
    assert host.included() and host.rank() == r % PER_HOST, (host.ranks, r)
    t = torch.tensor([float(r)])
    hvd.broadcast_(t, host.ranks[-1], name="card.ps.bc", process_set=host)
    same(t, torch.tensor([float(host.ranks[-1])]), "per-host set broadcast")
    got = hvd.allreduce(torch.tensor([r]), op=hvd.Max, name="card.ps.max", process_set=host)
    same(got, torch.tensor([host.ranks[-1]]), "per-host set Max")


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(5, 4)  # the same parameter names as Encoder's

    def forward(self, z):
        return self.fc(z)


def batch(step, n):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(2 * n, 8, generator=g, dtype=torch.float64), \
        torch.randn(2 * n, 4, generator=g, dtype=torch.float64)


def check_two_models(n, r):
    def models():
        torch.manual_seed(3)
        return Encoder().double(), Decoder().double()

    def train(enc, dec, opt, rows):
        for step in range(4):
            x, y = batch(step, n)
            opt.zero_grad()
            torch.nn.functional.mse_loss(dec(enc(x[rows])), y[rows]).backward()
            opt.step()
        return torch.cat([p.detach().flatten() for m in (enc, dec) for p in m.parameters()])

    enc, dec = models()
    params = list(enc.parameters()) + list(dec.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9),
                                   named_parameters=hvd.merge_named_parameters(enc, dec))
    names = sorted(opt._parameter_names.values())
    assert names == ["model0.fc.bias", "model0.fc.weight", "model1.fc.bias",
                     "model1.fc.weight"], names
    hvd.broadcast_parameters(hvd.merge_state_dicts(enc, dec), root_rank=0)
    got = train(enc, dec, opt, slice(2 * r, 2 * r + 2))
    ref_enc, ref_dec = models()
    ref_params = list(ref_enc.parameters()) + list(ref_dec.parameters())
    want = train(ref_enc, ref_dec, torch.optim.SGD(ref_params, lr=0.1, momentum=0.9),
                 slice(None))
    global checks
    checks += 1
    if not torch.allclose(got, want, rtol=1e-9, atol=1e-12):
        fail("two merged models against one process on the concatenated batch",
             (got - want).abs().max(), 0)


def lose_rank(victim, r):
    out_dir = os.environ["CARD_OUT"]
    hvd.allreduce(torch.ones(1), name="card.before.loss")
    if r == victim:
        time.sleep(1.0)
        sys.stdout.flush()
        os._exit(3)
    with open(os.path.join(out_dir, str(r)), "w", buffering=1) as out:
        start = time.monotonic()
        try:
            while time.monotonic() - start < 200:
                hvd.allreduce(torch.ones(4), name="card.after.loss")
            out.write(f"SURVIVOR {r} no error after 200 s\n")
        except Exception as e:  # noqa: BLE001 - reporting what arrived
            out.write(f"SURVIVOR {r} {type(e).__name__}: {e}\n")
    sys.stdout.flush()
    os._exit(0)


def main():
    n_hint = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "0")))
    hosts_n = max(1, n_hint // PER_HOST)
    even = hvd.ProcessSet(list(range(0, n_hint, 2)))
    odd = hvd.ProcessSet(list(range(1, n_hint, 2)))
    hosts = [hvd.ProcessSet(list(range(h * PER_HOST, (h + 1) * PER_HOST))) for h in range(hosts_n)]
    hvd.init(process_sets=[even, odd, *hosts])
    n, r = hvd.size(), hvd.rank()
    assert n == n_hint and n % PER_HOST == 0, (n, n_hint)
    topo = (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
            hvd.is_homogeneous())
    if os.environ.get("CARD_ONE_HOST") != "1":  # 1: a local smoke run on one host
        assert topo == (r % PER_HOST, PER_HOST, r // PER_HOST, n // PER_HOST, True), topo
    hvd.reset_engine_stats()
    check_allreduce(n, r)
    check_gather_family(n, r)
    check_process_sets(n, r, (even, odd, hosts))
    check_two_models(n, r)
    stats = hvd.engine_stats()
    hier = os.environ.get("CARD_HIERARCHICAL") == "1"
    counters = (stats["hierarchical_allreduces"], stats["hierarchical_allgathers"])
    if hier:
        assert counters[0] > 0 and counters[1] > 0, f"hierarchical path never ran: {counters}"
    else:
        # Allreduce may still take node-aware steps: the network plan's segments follow the
        # hosts (Note [Link plans]); allgather has no such plan.
        assert counters[1] == 0, f"hierarchical allgather ran without being asked: {counters}"
    print(f"CARD {r} ok {checks} checks on {socket.gethostname()}; hierarchical "
          f"allreduces/allgathers {counters}", flush=True)
    victim = os.environ.get("CARD_LOSE_RANK")
    if victim is not None:
        lose_rank(int(victim), r)
    hvd.shutdown()


if __name__ == "__main__":
    main()
