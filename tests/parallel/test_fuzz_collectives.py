"""Random arguments at every collective: a clear ValueError/TypeError, or the right result.

Hypothesis draws shapes, dtypes, splits, roots, reduce ops and names; every
rank draws the same examples (derandomized, no database, no shrinking, which
could take the ranks down different paths), so the ranks call each collective
alike. A value that differs per rank (allgather's first dimensions, a
mismatched trailing shape or dtype) is drawn as one list indexed by rank.
Each call must either return what the reference computed here from every
rank's input says, or raise ValueError/TypeError (HorovodInternalError when
the ranks disagree) with a message naming the op: never a crash, a hang (the
launch's timeout) or a wrong answer.
"""

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import hvdcompat as hvd
from parallel_util import DTYPES, all_inputs, assert_same, expected_reduce

ALL_DTYPES = DTYPES + [torch.bool]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck))

dtypes = st.sampled_from(ALL_DTYPES)
trailing = st.lists(st.integers(0, 3), max_size=2).map(tuple)
# Names: none (numbered by the library), or any text (quotes, NUL, non-ASCII).
names = st.one_of(st.none(), st.text(max_size=12))
# Values a caller may pass as a rank or a count, including far out of range.
wild_ints = st.one_of(st.integers(-3, 5), st.sampled_from([2**31, 2**62 + 100, 2**63 - 1,
                                                           -2**63, 2**64]))

_COUNTER = [0]


def _name(drawn):
    """A drawn name made unique per call, so no op waits on an earlier one's name."""
    _COUNTER[0] += 1
    return None if drawn is None else f"{drawn}#{_COUNTER[0]}"


def _inputs(shape, dtype):
    _COUNTER[0] += 1
    return all_inputs(shape, dtype, ("fuzz", _COUNTER[0]))


def _call(op_name, name, fn):
    """fn()'s result, or None after a clear error naming the op.

    A mistake on this rank is a ValueError/TypeError; ranks that disagree
    (found in negotiation, the same error on every rank) fail the op with
    HorovodInternalError, as the docstring of synchronize() says.
    """
    try:
        return fn()
    except (ValueError, TypeError, hvd.HorovodInternalError) as e:
        text = str(e)
        # Each message starts with its subject: "broadcast 'broadcast.x' on rank 1: ...".
        assert text.startswith(op_name), f"{op_name} {name!r}: unclear error {e!r}"
        if isinstance(e, hvd.HorovodInternalError):
            assert "disagree" in text, f"{op_name} {name!r}: {e!r}"
        return None


def _exact(dtype):
    return not dtype.is_floating_point or dtype == torch.float64


@FUZZ
@given(dtype=dtypes, first=st.integers(0, 3), rest=trailing, op=st.sampled_from(OPS),
       name=names)
def test_allreduce(dtype, first, rest, op, name):
    shape = (first,) + rest
    xs = _inputs(shape, dtype)
    name = _name(name)
    out = _call("allreduce", name,
                lambda: hvd.allreduce(xs[hvd.rank()].clone(), op=op, name=name))
    refused = dtype == torch.bool and op not in (hvd.Min, hvd.Max)
    assert (out is None) == refused, (dtype, op, out)
    if out is not None:
        assert_same(out, expected_reduce(xs, dtype, op), exact=_exact(dtype), what="allreduce")


@FUZZ
@given(dtype=dtypes, firsts=st.lists(st.integers(0, 3), min_size=3, max_size=3), rest=trailing,
       odd_rank=st.one_of(st.none(), st.integers(0, 2)), name=names)
def test_allgather(dtype, firsts, rest, odd_rank, name):
    n, me = hvd.size(), hvd.rank()
    # odd_rank (when a rank of the job) passes one more trailing dimension.
    odd = odd_rank is not None and odd_rank < n
    shapes = [(firsts[r],) + rest + ((2,) if odd and r == odd_rank else ()) for r in range(n)]
    _COUNTER[0] += 1
    xs = [all_inputs(shapes[r], dtype, ("fuzz", _COUNTER[0]))[r] for r in range(n)]
    name = _name(name)
    out = _call("allgather", name, lambda: hvd.allgather(xs[me].clone(), name=name))
    assert (out is None) == odd, (shapes, out)
    if out is not None:
        assert_same(out, torch.cat(xs), what="allgather")


@FUZZ
@given(dtype=dtypes, first=st.integers(0, 3), rest=trailing, root=wild_ints, name=names)
def test_broadcast(dtype, first, rest, root, name):
    n, me = hvd.size(), hvd.rank()
    xs = _inputs((first,) + rest, dtype)
    name = _name(name)
    out = _call("broadcast", name, lambda: hvd.broadcast(xs[me].clone(), root, name=name))
    assert (out is None) == (not 0 <= root < n), (root, out)
    if out is not None:
        assert_same(out, xs[root], what="broadcast")


@FUZZ
@given(dtype=dtypes, rows=st.integers(0, 6), rest=trailing,
       splits=st.one_of(st.none(), st.lists(wild_ints, min_size=1, max_size=4)), name=names)
def test_alltoall(dtype, rows, rest, splits, name):
    n, me = hvd.size(), hvd.rank()
    xs = _inputs((rows,) + rest, dtype)
    name = _name(name)
    out = _call("alltoall", name, lambda: hvd.alltoall(xs[me].clone(), splits=splits, name=name))
    if splits is None:
        valid = rows % n == 0
        splits = [rows // n] * n
    else:
        valid = (len(splits) == n and all(0 <= s <= rows for s in splits)
                 and sum(splits) <= rows)
    assert (out is None) == (not valid), (rows, splits, out)
    if out is None:
        return
    if isinstance(out, tuple):
        out, received = out
        assert received.tolist() == [splits[me]] * n
    start = sum(splits[:me])
    assert_same(out, torch.cat([x[start:start + splits[me]] for x in xs]), what="alltoall")


@FUZZ
@given(dtype=dtypes, first=st.integers(0, 7), rest=trailing,
       op=st.sampled_from([hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]), name=names)
def test_reducescatter(dtype, first, rest, op, name):
    n, me = hvd.size(), hvd.rank()
    xs = _inputs((first,) + rest, dtype)
    name = _name(name)
    out = _call("reducescatter", name,
                lambda: hvd.reducescatter(xs[me].clone(), op=op, name=name))
    if out is None:
        return  # each refusal is a clear error (checked by _call); rules: test_reducescatter.py
    total = expected_reduce(xs, dtype, op)
    counts = [first // n + (1 if r < first % n else 0) for r in range(n)]
    start = sum(counts[:me])
    assert_same(out, total[start:start + counts[me]], exact=_exact(dtype), what="reducescatter")
