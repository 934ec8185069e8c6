"""The autotuner's logic without MPI: the Gaussian process and expected improvement
against references computed here, the optimiser on known functions, the search
driven by a simulated throughput, user-set knobs, and the announcement protocol.
"""

import math
import random

import pytest
import torch

import core_testing
from hvdcompat.basics import _core

T = core_testing.load()
OP = _core.OPS
DT = _core.DTYPES
RO = _core.REDUCE_OPS

MIB = 1 << 20
HOROVOD_COLUMNS = ("hierarchical_allreduce,hierarchical_allgather,torus_allreduce,"
                   "cache_enabled,cycle_time_ms,tensor_fusion_threshold,score")
DEFAULTS = dict(fusion_threshold_bytes=128 * MIB, cycle_time_ms=0.0, fusion_chunk_bytes=MIB,
                max_call_bytes=16 * MIB, hierarchical_allreduce=False,
                hierarchical_allgather=False, active=False)


# ----------------------------------------------------------------------------- references

def _kernel(a, b, length, s2):
    d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    return s2 * torch.exp(-d2 / (2 * length ** 2))


def _posterior(x, y, length, s2, n2, q):
    """Mean, sd and log marginal likelihood of the GP, computed with dense torch algebra."""
    x, y, q = (torch.tensor(v, dtype=torch.float64) for v in (x, y, q))
    k = _kernel(x, x, length, s2) + n2 * torch.eye(len(x), dtype=torch.float64)
    ks = _kernel(x, q, length, s2)
    kinv = torch.linalg.inv(k)
    mean = ks.T @ kinv @ y
    var = s2 - torch.einsum("iq,ij,jq->q", ks, kinv, ks)
    lml = (-0.5 * y @ kinv @ y - 0.5 * torch.logdet(k) - 0.5 * len(x) * math.log(2 * math.pi))
    return mean.tolist(), var.clamp_min(0).sqrt().tolist(), float(lml)


def _ei(mean, sd, best, xi):
    if sd <= 0:
        return 0.0
    d = mean - best - xi
    z = d / sd
    return d * 0.5 * (1 + math.erf(z / math.sqrt(2))) + sd * math.exp(-z * z / 2) / math.sqrt(
        2 * math.pi)


def _points(n, dims, seed):
    rng = random.Random(seed)
    return [[rng.random() for _ in range(dims)] for _ in range(n)]


# ----------------------------------------------------------------------------- GP and EI math

@pytest.mark.parametrize("dims", [1, 2, 4])
def test_gp_posterior_matches_dense_reference(dims):
    x = _points(9, dims, dims)
    y = [math.sin(3 * sum(p)) + 0.1 * i for i, p in enumerate(x)]
    q = _points(6, dims, 100 + dims) + [x[0]]
    for length, s2, n2 in [(0.3, 1.0, 0.64), (0.1, 2.0, 0.01), (1.5, 0.5, 0.2)]:
        means, sds, lml = T.gp_fit_predict(x, y, length, s2, n2, q)
        ref_m, ref_s, ref_lml = _posterior(x, y, length, s2, n2, q)
        assert means == pytest.approx(ref_m, rel=1e-9, abs=1e-9)
        assert sds == pytest.approx(ref_s, rel=1e-7, abs=1e-9)
        assert lml == pytest.approx(ref_lml, rel=1e-9)


def test_gp_hyperparameters_maximise_the_likelihood_on_their_grid():
    x = _points(12, 2, 7)
    y = [math.cos(4 * p[0]) * p[1] for p in x]
    length, s2 = T.gp_choose_hyper(x, y, 0.04)
    chosen = T.gp_fit_predict(x, y, length, s2, 0.04, [x[0]])[2]
    # No other point of the grid (lengths 1/30..2 log-spaced, five variances) does better.
    for i in range(24):
        l = math.exp(math.log(1 / 30) + i * math.log(60) / 23)
        for v in (0.25, 0.5, 1.0, 2.0, 4.0):
            assert T.gp_fit_predict(x, y, l, v, 0.04, [x[0]])[2] <= chosen + 1e-12


def test_expected_improvement_matches_the_closed_form():
    for mean in (-2.0, -0.3, 0.0, 0.4, 1.7):
        for sd in (0.0, 1e-3, 0.2, 1.0, 3.0):
            for best in (-1.0, 0.0, 0.5):
                for xi in (0.0, 0.01, 0.5):
                    got = T.expected_improvement(mean, sd, best, xi)
                    assert got == pytest.approx(_ei(mean, sd, best, xi), rel=1e-12, abs=1e-15)
                    assert got >= 0
    assert T.expected_improvement(5.0, 0.0, 0.0, 0.01) == 0.0  # certain: nothing to gain


def test_optimizer_ei_matches_reference_on_its_standardised_scores():
    bo = T.BayesianOptimizer(2, 0.8, 1)
    x = _points(7, 2, 3)
    raw = [100 + 40 * math.exp(-((p[0] - 0.6) ** 2 + (p[1] - 0.2) ** 2) / 0.1) for p in x]
    for p, v in zip(x, raw):
        bo.add_sample(p, v)
    bo.fit()
    mu, sd = sum(raw) / len(raw), torch.tensor(raw, dtype=torch.float64).std(unbiased=False)
    ys = [(v - mu) / float(sd) for v in raw]
    assert bo.standardized == pytest.approx(ys, rel=1e-12)
    length, s2, n2 = bo.hyper
    assert n2 == pytest.approx(0.64)
    sample_means, _, _ = _posterior(x, ys, length, s2, n2, x)
    assert bo.incumbent == pytest.approx(max(sample_means), rel=1e-9)
    q = _points(20, 2, 11)
    means, sds, _ = _posterior(x, ys, length, s2, n2, q)
    for p, m, s in zip(q, means, sds):
        assert bo.expected_improvement(p) == pytest.approx(_ei(m, s, bo.incumbent, bo.xi),
                                                           rel=1e-8, abs=1e-12)


# ----------------------------------------------------------------------------- convergence

def _bump(x, centre, width=0.2):
    return math.exp(-sum((a - b) ** 2 for a, b in zip(x, centre)) / (2 * width ** 2))


def _bo_best(dims, centre, budget, seed, noise):
    bo = T.BayesianOptimizer(dims, noise, seed)
    x, best = [0.5] * dims, 0.0
    for _ in range(budget):
        y = _bump(x, centre)
        best = max(best, y)
        bo.add_sample(x, y)
        x = bo.next_sample()
    return best


def test_optimizer_finds_the_peak_of_a_known_function_within_20_samples():
    for seed in range(4):
        rng = random.Random(seed)
        centre = [rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9)]
        # 0.97 of the peak: within 0.05 of the centre in the unit square.
        assert _bo_best(2, centre, 20, seed, 0.8) > 0.97, centre


def test_optimizer_beats_random_search_with_the_same_budget():
    dims, budget = 4, 20
    bo, rnd = [], []
    for seed in range(4):
        rng = random.Random(100 + seed)
        centre = [rng.uniform(0.1, 0.9) for _ in range(dims)]
        bo.append(_bo_best(dims, centre, budget, seed, 0.1))
        r = random.Random(seed)
        rnd.append(max(_bump([r.random() for _ in range(dims)], centre) for _ in range(budget)))
    assert min(bo) > 0.9 and sum(bo) / len(bo) > sum(rnd) / len(rnd) + 0.3, (bo, rnd)


def test_best_point_is_the_models_not_a_lucky_score():
    bo = T.BayesianOptimizer(2, 0.8, 0)
    # A region that scores 10 again and again, and one lucky 11 among neighbours scoring 0.
    for p in ([0.8, 0.8], [0.82, 0.78], [0.78, 0.83], [0.8, 0.75], [0.75, 0.8]):
        bo.add_sample(p, 10.0)
    for p in ([0.1, 0.15], [0.15, 0.1], [0.05, 0.1]):
        bo.add_sample(p, 0.0)
    bo.add_sample([0.1, 0.1], 11.0)
    assert bo.best_sample() in range(5)
    x = _points(6, 2, 5)
    clean = T.BayesianOptimizer(2, 0.01, 0)
    for i, p in enumerate(x):
        clean.add_sample(p, float(i))
    assert clean.best_sample() == 5  # with little noise, the largest score wins


def test_proposals_are_reproducible_for_a_seed():
    def run(seed):
        bo = T.BayesianOptimizer(3, 0.8, seed)
        for p in _points(5, 3, 1):
            bo.add_sample(p, sum(p))
        return bo.next_sample()
    assert run(7) == run(7)
    assert all(0.0 <= v <= 1.0 for v in run(7))


# ----------------------------------------------------------------------------- the search

def _step_seconds(p):
    """A simulated step: fastest at a 24 MiB threshold, 2 ms cycle, 256 KiB chunk, 4 MiB calls."""
    mb = p["fusion_threshold_bytes"] / MIB
    return (0.05 + 0.02 * ((mb - 24) / 64) ** 2 + 0.002 * abs(p["cycle_time_ms"] - 2) +
            0.004 * abs(math.log2(p["fusion_chunk_bytes"]) - 18) +
            0.004 * abs(math.log2(p["max_call_bytes"]) - 22))


def _drive(options, initial=DEFAULTS, max_steps=20000, step_seconds=None):
    """Runs steps of 3 named tensors through a ParameterManager; returns (pm, announced).

    `step_seconds(params, k)` gives a step's time on the k-th configuration announced
    (0: the start); by default a function of the settings alone.
    """
    step_seconds = step_seconds or (lambda p, k: _step_seconds(p))
    pm = T.ParameterManager(options, initial, 0.0)
    now, current, announced = 0.0, dict(initial), []
    for _ in range(max_steps):
        if not pm.active:
            break
        now += step_seconds(current, len(announced))
        new = None
        for name in ("w1", "w2", "w3"):
            got = pm.update([name], 4 * MIB, now)
            new = got or new
        if new is not None:
            announced.append(new)
            current = new
            now += 1e-4
            pm.applied(now)
    return pm, announced


def test_search_scores_the_budget_keeps_the_best_and_writes_horovods_log(tmp_path):
    log = tmp_path / "autotune.csv"
    options = dict(log_path=str(log), warmup_samples=2, steps_per_sample=3,
                   bayes_opt_max_samples=12)
    pm, announced = _drive(options)
    assert not pm.active
    # One announcement per point after the start, the start and the best point scored
    # once more, then the best with the search over.
    assert len(announced) == 11 + 2 + 1
    assert announced[11] == dict(DEFAULTS, active=True)
    assert all(a["active"] for a in announced[:-1]) and not announced[-1]["active"]
    assert announced[-1] == dict(pm.best, active=False) == dict(announced[12], active=False)
    lines = log.read_text().splitlines()
    assert lines[0].startswith(HOROVOD_COLUMNS + ",")
    assert lines[0] == T.AUTOTUNE_LOG_HEADER
    rows = [line.split(",") for line in lines[1:]]
    assert len(rows) == 12 + 2 + 1  # every scored point, then the best
    scores = [float(r[6]) for r in rows[:-1]]
    # The last row: the best point's settings and its score when scored again, which
    # beat the start's second score just before it.
    knobs = lambda r: r[:6] + r[7:]  # noqa: E731
    best_rows = [i for i, r in enumerate(rows[:-1]) if knobs(r) == knobs(rows[-1])]
    assert len(best_rows) == 2 and best_rows[1] == 13
    assert rows[-1] == rows[13] and scores[13] > scores[12]
    assert float(rows[-1][6]) == pytest.approx(pm.best_score)
    # The first row is the starting configuration: the best is never worse than the default.
    assert float(rows[0][5]) == pytest.approx(128) and float(rows[0][4]) == 0
    assert knobs(rows[12]) == knobs(rows[0])
    # Scores are bytes per microsecond: 12 MiB per simulated step.
    assert scores[0] == pytest.approx(12 * MIB / (_step_seconds(DEFAULTS) * 1e6), rel=0.02)
    # The search moved towards the simulated optimum.
    assert _step_seconds(pm.best) < 0.9 * _step_seconds(DEFAULTS)
    assert all(r[2] == "0" and r[3] == "1" for r in rows)


def test_a_lucky_score_does_not_displace_the_defaults():
    # The defaults are fastest; the second point tried gets one very lucky round.
    def step(p, k):
        base = _step_seconds(DEFAULTS) * (1.0 if p == dict(DEFAULTS, active=True) or
                                          p == DEFAULTS else 1.3)
        return base * (0.3 if k == 2 else 1.0)

    pm, announced = _drive(dict(warmup_samples=0, steps_per_sample=2, bayes_opt_max_samples=6,
                                fixed_fusion_chunk=True, fixed_max_call=True),
                           step_seconds=step)
    assert announced[-1] == DEFAULTS  # kept after both were scored again
    assert announced[-3] == dict(DEFAULTS, active=True)  # the defaults' second scoring


def test_warmup_samples_and_steps_per_sample_set_the_schedule():
    options = dict(warmup_samples=3, steps_per_sample=4, bayes_opt_max_samples=3)
    pm = T.ParameterManager(options, DEFAULTS, 0.0)
    n = T.AUTOTUNE_SAMPLES_PER_SCORE
    steps, now = 0, 0.0
    while True:
        steps += 1
        now += 0.01
        if pm.update(["g"], 1000, now) is not None:
            break
    # Three warm-up scores and the first real one, each over 5 samples of 4 steps; a
    # score is taken at the step that would start a sixth sample, and counting restarts
    # after it. The change is announced with the fourth score.
    assert steps == (3 + 1) * (n * 4 + 1)


@pytest.mark.parametrize("fixed", ["fixed_fusion_threshold", "fixed_cycle_time",
                                   "fixed_fusion_chunk", "fixed_max_call"])
def test_user_set_knobs_stay_fixed(fixed):
    key = {"fixed_fusion_threshold": "fusion_threshold_bytes", "fixed_cycle_time": "cycle_time_ms",
           "fixed_fusion_chunk": "fusion_chunk_bytes", "fixed_max_call": "max_call_bytes"}[fixed]
    initial = dict(DEFAULTS, **{key: {"fusion_threshold_bytes": 3 * MIB + 5,
                                      "cycle_time_ms": 7.25, "fusion_chunk_bytes": 300000,
                                      "max_call_bytes": 5 * MIB + 1}[key]})
    pm, announced = _drive(dict(warmup_samples=0, steps_per_sample=2, bayes_opt_max_samples=8,
                                **{fixed: True}), initial)
    assert pm.num_tuned_knobs == 3
    assert len(announced) in (8, 8 + 2)  # two more when the best is not the start
    assert all(a[key] == initial[key] for a in announced), key
    others = [k for k in ("fusion_threshold_bytes", "cycle_time_ms", "fusion_chunk_bytes",
                          "max_call_bytes") if k != key]
    assert any(a[k] != initial[k] for a in announced for k in others)


def test_nothing_to_tune_when_every_knob_is_set():
    pm = T.ParameterManager(dict(fixed_fusion_threshold=True, fixed_cycle_time=True,
                                 fixed_fusion_chunk=True, fixed_max_call=True), DEFAULTS, 0.0)
    assert not pm.active and pm.num_tuned_knobs == 0
    assert all(pm.update(["g"], 100, 0.01 * i) is None for i in range(1, 500))


def test_hierarchical_flags_are_tried_on_top_of_the_best_point():
    pm, announced = _drive(dict(warmup_samples=0, steps_per_sample=2, bayes_opt_max_samples=4,
                                tune_hierarchical_allreduce=True,
                                tune_hierarchical_allgather=True))
    assert len(announced) in (4 - 1 + 2 + 1, 4 - 1 + 2 + 2 + 1)
    ar, ag = announced[-3], announced[-2]
    assert ar["hierarchical_allreduce"] and not ar["hierarchical_allgather"]
    assert ag["hierarchical_allgather"]
    assert not any(a["hierarchical_allreduce"] or a["hierarchical_allgather"]
                   for a in announced[:-3])


def test_cube_mapping_lands_on_the_search_grid():
    pm = T.ParameterManager({}, DEFAULTS, 0.0)
    assert pm.to_cube(DEFAULTS) == pytest.approx([1.0, 0.0, 4 / 7, 4 / 6])
    p = pm.from_cube([0.5, 0.5, 0.5, 0.5])
    assert p["fusion_threshold_bytes"] == 64 * MIB and p["cycle_time_ms"] == 10
    assert p["fusion_chunk_bytes"] in (1 << 19, 1 << 20) and p["max_call_bytes"] == 1 << 23
    assert pm.from_cube(pm.to_cube(DEFAULTS)) == dict(DEFAULTS, active=True)


def test_environment_decides_which_knobs_are_fixed(monkeypatch):
    for name in ("FUSION_THRESHOLD", "CYCLE_TIME", "FUSION_CHUNK_BYTES", "MAX_CALL_BYTES",
                 "AUTOTUNE_LOG", "AUTOTUNE_WARMUP_SAMPLES", "AUTOTUNE_STEPS_PER_SAMPLE",
                 "AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
                 "CACHE_CAPACITY"):
        for prefix in ("HOROVOD_", "HVDCOMPAT_"):
            monkeypatch.delenv(prefix + name, raising=False)
    o = T.autotune_options_from_environment()
    assert (o["warmup_samples"], o["steps_per_sample"], o["bayes_opt_max_samples"],
            o["gaussian_process_noise"], o["log_path"]) == (3, 10, 20, 0.8, "")
    assert not any(o[k] for k in ("fixed_fusion_threshold", "fixed_cycle_time",
                                  "fixed_fusion_chunk", "fixed_max_call"))
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", str(128 * MIB))  # the default, but set
    monkeypatch.setenv("HVDCOMPAT_MAX_CALL_BYTES", "4194304")
    monkeypatch.setenv("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "4")
    monkeypatch.setenv("HOROVOD_AUTOTUNE_LOG", "/tmp/x.csv")
    o = T.autotune_options_from_environment()
    assert o["fixed_fusion_threshold"] and o["fixed_max_call"]
    assert not o["fixed_cycle_time"] and not o["fixed_fusion_chunk"]
    assert o["steps_per_sample"] == 4 and o["log_path"] == "/tmp/x.csv"
    monkeypatch.setenv("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "0")
    with pytest.raises(ValueError, match="HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=0"):
        T.autotune_options_from_environment()


# ----------------------------------------------------------------------------- announcement

def _req(name, shape=(4,)):
    return dict(name=name, op=OP["allreduce"], dtype=DT["float32"], shapes=[list(shape)],
                reduce_op=RO["Sum"])


def test_tuned_params_roundtrip():
    p = dict(fusion_threshold_bytes=3 * MIB + 7, cycle_time_ms=2.5, fusion_chunk_bytes=1 << 18,
             max_call_bytes=1 << 22, hierarchical_allreduce=True, hierarchical_allgather=False,
             active=True)
    back, nbytes = T.roundtrip_tuned_params(p)
    assert back == p and nbytes == 36


@pytest.mark.parametrize("size", [2, 3])
def test_announced_params_reach_every_rank_in_the_same_cycle(size):
    # Steady state (cached) in rounds 1-4: the announcement forces one slow-path cycle.
    rounds = [[[_req("g1"), _req("g2", (8,))] for _ in range(size)] for _ in range(5)]
    p = dict(DEFAULTS, fusion_threshold_bytes=5 * MIB, active=True)
    results, stats, got = T.simulate_announce(size, 1024, rounds, {3: p})
    for k, per_rank in enumerate(got):
        assert all(g == (p if k == 3 else None) for g in per_rank), (k, per_rank)
    for k, per_rank in enumerate(results):
        assert all(sorted(n for r in rs for n in r["names"]) == ["g1", "g2"] for rs in per_rank)
    assert all(s["slow_path_cycles"] == 2 for s in stats)  # first round and the announcement
