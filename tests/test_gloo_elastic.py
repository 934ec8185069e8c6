"""Elastic training on the Gloo controller, on one machine: hvdcompatrun --gloo with elastic
flags, a rank SIGKILLed mid-epoch, the survivors shrinking the job in place through the
launcher's store (Note [Elastic reset on Gloo], cpp/engine/gloo_reset.h).

The run is tests/test_elastic_scenarios.py's (examples/pytorch_elastic.py with its per-sample
tally), so the guarantees are checked the same way as on MPI: 144 samples, 4 per rank per
batch; 3 ranks commit 2 batches of epoch 0, the 2 survivors share the rest and all of epoch 1.
"""

import re

import pytest

from test_elastic_scenarios import hvdcompatrun

from hvdcompat import _core

pytestmark = pytest.mark.skipif(not getattr(_core, "gloo_built", bool)(),
                                reason="needs the Gloo controller in the build")


def test_a_killed_rank_leaves_and_the_survivors_continue_in_place(tmp_path):
    code, out, reports = hvdcompatrun(["--gloo", "-np", "3", "--min-np", "2"],
                                      ["--inject-failure", "1:0:2:sigkill"], tmp_path)
    assert code == 0, out  # the final world finished; the lost rank's code is not the job's
    assert "training finished on 2 of 3 rank(s)" in out, out
    assert sorted(reports) == [0, 2], out  # rank 1 was lost
    # The survivors' pending ops named the lost rank, not an address.
    assert "rank(s) 1 on host" in out, out
    # The oldest survivor is rank 0; relative order is kept.
    assert [(r["rank"], r["size"]) for _, r in sorted(reports.items())] == [(0, 2), (1, 2)]
    assert reports[0]["checksum"] == reports[2]["checksum"], out  # identical models
    for r in reports.values():
        assert [(e["epoch"], e["size"], e["exactly_once"]) for e in r["epochs"]] == \
            [(0, 2, True), (1, 2, True)], out
        assert r["recovery"] is not None and r["recovery"] > 0, out
        # The same processes went on (reports are keyed by the rank each had at its start).
        assert not r["restarted"], out



def test_a_survivor_stopped_past_the_timeout_is_taken_back_in(tmp_path):
    # Rank 2 stops rank 1 for 8 s, then dies. Rank 0 finds the loss, ends its waits (closing its
    # connections) 0.8 s later, and decides the new world without rank 1 once the Gloo timeout
    # (5 s) is over; it trains alone and holds at batch 4 until the job changes. Rank 1 looks
    # after 8 s, finds rank 0's connections closed too and must not blame it (Note [Who closed
    # first], cpp/transport/gloo_watch.h); it reaches the reset after the decision and is taken
    # back in at rank 0's next commit (step 4 of Note [Elastic reset on Gloo]).
    code, out, reports = hvdcompatrun(
        ["--gloo", "-np", "3", "--min-np", "1", "--gloo-timeout-seconds", "5"],
        ["--inject-failure", "2:0:2:sigkill", "--stop-ranks", "1:8", "--hold-at", "0:4"],
        tmp_path)
    assert code == 0, out
    # Each survivor's pending ops failed naming rank 2 alone (not "rank(s) 0, 2").
    blamed = dict(re.findall(r"\[hvdcompat rank (\d)\] \S+ \S+ ERROR: rank\(s\) ([\d, ]+) on host",
                             out))
    assert blamed == {"0": "2", "1": "2"}, out
    assert re.search(r"worker 1 on host \S+ reached an elastic reset after the others had "
                     r"agreed on the new world without it", out), out
    assert "training finished on 2 of 3 rank(s)" in out, out
    assert sorted(reports) == [0, 1], out  # rank 2 was lost; rank 1 is in the final world
    assert [(r["rank"], r["size"]) for _, r in sorted(reports.items())] == [(0, 2), (1, 2)]
    assert reports[0]["checksum"] == reports[1]["checksum"], out  # identical models
    for r in reports.values():
        assert [e["epoch"] for e in r["epochs"]] == [0, 1], out
        assert all(e["exactly_once"] for e in r["epochs"]), out
        assert r["epochs"][-1]["size"] == 2, out
        assert not r["restarted"], out  # the same processes went on
