"""hvd.shutdown() from one thread while another changes process sets or the
timeline: no crash and no hang (Note [Runtime lease], cpp/bindings/; Note
[Control rounds], cpp/engine/runtime.h). Every call either succeeds or
raises the documented ValueError; the ranks shut down at their own moments,
so a rank's add_process_set also races its peers' shutdowns."""

import os
import random
import re
import threading

import hvdcompat as hvd

CYCLES = 25
# What a call made during or after shutdown raises.
SHUTDOWN = re.compile(r"Horovod has not been initialized; use hvd\.init\(\)\.|"
                      r"hvdcompat has been shut down \((this|another) rank called hvd\.shutdown\(\)|"
                      r"start_timeline\('.*'\): hvdcompat has been shut down on rank \d+")
JOIN_SECONDS = 60


def _race(op, cycles=CYCLES):
    """Per cycle: a fresh engine; a thread repeats op(k) until it raises; this
    thread shuts the engine down after a few of them. Returns the successes per cycle."""
    rng = random.Random(hvd.rank())
    done = []
    for cycle in range(cycles):
        hvd.shutdown()
        hvd.init(process_sets="dynamic")
        results, failure, progressed = [], [], threading.Event()
        wanted = 1 + cycle % 3

        def worker():
            k = 0
            while True:
                try:
                    results.append(op(k))
                except ValueError as e:
                    failure.append(str(e))
                    progressed.set()  # a peer's shutdown may end the run before `wanted`
                    return
                except BaseException as e:  # noqa: BLE001 - reported by the main thread
                    failure.append(e)
                    progressed.set()
                    return
                k += 1
                if k >= wanted:
                    progressed.set()

        t = threading.Thread(target=worker, daemon=True)
        t.start()
        progressed.wait(JOIN_SECONDS)
        if rng.random() < 0.5:
            threading.Event().wait(rng.random() * 0.003)
        hvd.shutdown()
        t.join(JOIN_SECONDS)
        assert not t.is_alive(), f"cycle {cycle}: the op thread did not return after shutdown"
        assert len(failure) == 1 and isinstance(failure[0], str), failure
        assert SHUTDOWN.search(failure[0]), failure[0]
        done.append(len(results))
    hvd.init()
    return done


def test_shutdown_while_adding_and_removing_process_sets():
    members = [hvd.size() - 1]  # not the whole world (that is the global set)

    def change(k):
        ps = hvd.add_process_set(members)
        assert ps.ranks == members and ps.process_set_id >= 1
        assert hvd.remove_process_set(ps) is True
        return ps.process_set_id

    done = _race(change)
    # The thread ran before every shutdown (one rank's may have lost a round to a peer's).
    assert sum(done) >= CYCLES // 2, done


def test_shutdown_while_starting_and_stopping_the_timeline(tmp_path):
    path = str(tmp_path / f"timeline.{hvd.rank()}.json")
    saved = os.environ.get("HOROVOD_TIMELINE")
    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"
    try:
        def toggle(k):
            hvd.start_timeline(path, mark_cycles=bool(k % 2))
            hvd.stop_timeline()
            return k

        done = _race(toggle)
    finally:
        if saved is None:
            os.environ.pop("HOROVOD_TIMELINE", None)
        else:
            os.environ["HOROVOD_TIMELINE"] = saved
        hvd.shutdown()
        hvd.init()
    assert all(n >= 1 + c % 3 for c, n in enumerate(done)), done
    if hvd.rank() == 0:
        assert os.path.getsize(path) > 0
