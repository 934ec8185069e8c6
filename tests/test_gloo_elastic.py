"""Elastic training on the Gloo controller, on one machine: hvdcompatrun --gloo with elastic
flags, a rank SIGKILLed mid-epoch, the survivors shrinking the job in place through the
launcher's store (Note [Elastic reset on Gloo], cpp/engine/gloo_reset.h).

The run is tests/test_elastic_scenarios.py's (examples/pytorch_elastic.py with its per-sample
tally), so the guarantees are checked the same way as on MPI: 144 samples, 4 per rank per
batch; 3 ranks commit 2 batches of epoch 0, the 2 survivors share the rest and all of epoch 1.
"""

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
