"""Integer Average has one rule on CPU and GPU: the sum divided by the set size exactly,
truncated toward zero (what NCCL's ncclAvg computes on integers).

The host kernel is checked directly, at set sizes up to 256 (sums a many-rank job
produces); the GPU rule is NCCL's own, and tests/test_gpu_fake.py runs integer Average
through both the NCCL path (ncclAvg) and the host-staged one (NCCL 2.9) on the fake.
"""

import core_testing
import hvdcompat.basics as b

T = core_testing.load()
DT = b._core.DTYPES


def exact(total, size):
    q = abs(total) // size
    return q if total >= 0 else -q


def test_integer_average_is_the_exact_truncated_quotient_at_every_size():
    for size in range(1, 257):
        sums = [size * k + r for k in (-3, -1, 0, 1, 2, 1000) for r in (0, 1, size - 1)]
        got = T.scale_copy(sums, DT["int64"], 1.0 / size, True)
        assert got == [exact(s, size) for s in sums], size


def test_the_double_reciprocal_case_that_used_to_round_down():
    # 49 ranks contributing 1 each: 49 * (1.0 / 49) == 0.9999999999999999 in double.
    assert 49 * (1.0 / 49) < 1
    assert T.scale_copy([49, 98, -49], DT["int32"], 1.0 / 49, True) == [1, 2, -1]


def test_every_integer_dtype_and_user_factors_keep_their_rule():
    for name, lo, hi in (("uint8", 0, 255), ("int8", -128, 127), ("int16", -32768, 32767),
                         ("int32", -2**31, 2**31 - 1)):
        vals = [lo, hi, lo // 2, hi // 3]
        assert T.scale_copy(vals, DT[name], 1.0 / 7, True) == [exact(v, 7) for v in vals], name
    # A user postscale (not Average's 1/size) keeps Horovod's truncated double product.
    assert T.scale_copy([10, -10], DT["int64"], 0.3, False) == [3, -3]
    assert T.scale_copy([10, -10], DT["int64"], 2.5, True) == [25, -25]
