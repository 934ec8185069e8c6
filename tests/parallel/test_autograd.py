"""Gradients of the differentiable collectives across ranks, against their backward rules.

Each rank r feeds x_r forward and the upstream gradient w_r backward; both
are drawn from a seed that depends on r, so every rank can rebuild every
other rank's values and compute the expected gradient by hand:

* allreduce:      grad x_r = post * pre * sum_s w_s  (/ n for Average)
* allgather:      grad x_r = (sum_s w_s / n)[rows of r]
* broadcast:      grad x_r = sum_s w_s / n on the root, 0 elsewhere
* alltoall:       grad x_r = the blocks of w_j that came from rank r, in order of j
* reducescatter:  grad x_r = cat_s(w_s) * pre * post  (* n for Sum)
"""

import pytest
import torch

import hvdcompat as hvd

DT = torch.float64


def draw(kind, rank, shape, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + 10 * rank + (1 if kind == "w" else 0))
    return torch.randn(shape, generator=g, dtype=DT)


@pytest.mark.parametrize("op,pre,post", [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0),
                                         (hvd.Sum, 0.5, 3.0), (hvd.Average, 2.0, 0.25)])
def test_allreduce_gradient(op, pre, post):
    r, n = hvd.rank(), hvd.size()
    x = draw("x", r, (3, 4)).requires_grad_()
    y = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post,
                      name=f"ag.allreduce.{op}.{pre}")
    scale = pre * post / (n if op == hvd.Average else 1)
    torch.testing.assert_close(y, scale * sum(draw("x", s, (3, 4)) for s in range(n)))
    y.backward(draw("w", r, (3, 4)))
    torch.testing.assert_close(x.grad, scale * sum(draw("w", s, (3, 4)) for s in range(n)))


def test_grouped_allreduce_gradient():
    r, n = hvd.rank(), hvd.size()
    xs = [draw("x", r, (k + 1, 2), salt=k).requires_grad_() for k in range(3)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name="ag.grouped_allreduce")
    torch.autograd.backward(ys, [draw("w", r, (k + 1, 2), salt=k) for k in range(3)])
    for k, x in enumerate(xs):
        torch.testing.assert_close(x.grad, sum(draw("w", s, (k + 1, 2), salt=k)
                                               for s in range(n)))


def test_allgather_gradient_with_uneven_rows():
    r, n = hvd.rank(), hvd.size()
    rows = [s + 2 for s in range(n)]
    x = draw("x", r, (rows[r], 3)).requires_grad_()
    y = hvd.allgather(x, name="ag.allgather")
    torch.testing.assert_close(y, torch.cat([draw("x", s, (rows[s], 3)) for s in range(n)]))
    y.backward(draw("w", r, (sum(rows), 3)))
    mean_w = sum(draw("w", s, (sum(rows), 3)) for s in range(n)) / n
    start = sum(rows[:r])
    torch.testing.assert_close(x.grad, mean_w[start:start + rows[r]])


def test_grouped_allgather_gradient():
    r, n = hvd.rank(), hvd.size()
    xs = [draw("x", r, (r + 1 + k, 2), salt=k).requires_grad_() for k in range(2)]
    ys = hvd.grouped_allgather(xs, name="ag.grouped_allgather")
    totals = [sum(s + 1 + k for s in range(n)) for k in range(2)]
    torch.autograd.backward(ys, [draw("w", r, (totals[k], 2), salt=k) for k in range(2)])
    for k, x in enumerate(xs):
        mean_w = sum(draw("w", s, (totals[k], 2), salt=k) for s in range(n)) / n
        start = sum(s + 1 + k for s in range(r))
        torch.testing.assert_close(x.grad, mean_w[start:start + r + 1 + k])


def test_broadcast_gradient_for_every_root():
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        x = draw("x", r, (5,), salt=root).requires_grad_()
        y = hvd.broadcast(x, root_rank=root, name=f"ag.broadcast.{root}")
        torch.testing.assert_close(y, draw("x", root, (5,), salt=root))
        y.backward(draw("w", r, (5,), salt=root))
        want = (sum(draw("w", s, (5,), salt=root) for s in range(n)) / n if r == root
                else torch.zeros(5, dtype=DT))
        torch.testing.assert_close(x.grad, want)


def splits_of(rank, n):
    return [(rank + j) % 3 + 1 for j in range(n)]


def test_alltoall_gradient_with_splits():
    r, n = hvd.rank(), hvd.size()
    x = draw("x", r, (sum(splits_of(r, n)), 2)).requires_grad_()
    y, received = hvd.alltoall(x, splits=splits_of(r, n), name="ag.alltoall")
    assert received.tolist() == [splits_of(s, n)[r] for s in range(n)]
    w = [draw("w", j, (sum(splits_of(s, n)[j] for s in range(n)), 2)) for j in range(n)]
    y.backward(w[r])
    blocks = []
    for j in range(n):
        offset = sum(splits_of(s, n)[j] for s in range(r))
        blocks.append(w[j][offset:offset + splits_of(r, n)[j]])
    torch.testing.assert_close(x.grad, torch.cat(blocks))


def test_alltoall_gradient_equal_split():
    r, n = hvd.rank(), hvd.size()
    x = draw("x", r, (2 * n, 3)).requires_grad_()
    y = hvd.alltoall(x, name="ag.alltoall_equal")
    w = [draw("w", j, (2 * n, 3)) for j in range(n)]
    y.backward(w[r])
    torch.testing.assert_close(x.grad, torch.cat([w[j][2 * r:2 * r + 2] for j in range(n)]))


def own_rows(rank, n, rows):
    q, m = divmod(rows, n)
    start = rank * q + min(rank, m)
    return slice(start, start + q + (1 if rank < m else 0))


@pytest.mark.parametrize("op,pre,post", [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0),
                                         (hvd.Sum, 2.0, 0.5), (hvd.Average, 0.5, 4.0)])
def test_reducescatter_gradient_with_uneven_rows(op, pre, post):
    r, n = hvd.rank(), hvd.size()
    rows = 2 * n + 1
    x = draw("x", r, (rows, 3)).requires_grad_()
    y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post,
                          name=f"ag.reducescatter.{op}.{pre}")
    scale = pre * post / (n if op == hvd.Average else 1)
    total = sum(draw("x", s, (rows, 3)) for s in range(n))
    torch.testing.assert_close(y, scale * total[own_rows(r, n, rows)])
    y.backward(draw("w", r, y.shape))
    gathered = torch.cat([draw("w", s, (own_rows(s, n, rows).stop - own_rows(s, n, rows).start,
                                        3)) for s in range(n)])
    factor = pre * post * (n if op == hvd.Sum else 1)
    torch.testing.assert_close(x.grad, factor * gathered)


def test_grouped_reducescatter_gradient():
    r, n = hvd.rank(), hvd.size()
    xs = [draw("x", r, (n * (k + 1), 2), salt=k).requires_grad_() for k in range(2)]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Average, name="ag.grouped_reducescatter")
    torch.autograd.backward(ys, [draw("w", r, (k + 1, 2), salt=k) for k in range(2)])
    for k, x in enumerate(xs):
        torch.testing.assert_close(
            x.grad, torch.cat([draw("w", s, (k + 1, 2), salt=k) for s in range(n)]))


def test_jacobian_through_allreduce():
    """Row i of the jacobian of sin(a * allreduce_sum(x)) is taken on every rank at once.

    The backward allreduce sums every rank's upstream gradient a_i cos(a_i S_i),
    which is the same on every rank, so the jacobian is diag(n a cos(a S)).
    """
    r, n = hvd.rank(), hvd.size()
    a = torch.arange(4.0, dtype=DT)
    x = draw("x", r, (4,))
    jac = torch.autograd.functional.jacobian(
        lambda t: (hvd.allreduce(t, op=hvd.Sum, name="ag.jacobian") * a).sin(), x)
    s = sum(draw("x", k, (4,)) for k in range(n))
    torch.testing.assert_close(jac, torch.diag(n * a * torch.cos(a * s)))
