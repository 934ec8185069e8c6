"""The Gloo launch's elastic driver without processes: which workers it starts on an added host
and with what, when it tells rank 0, what it stops, and what it blacklists.

The pool, the worker starter and the store are stand-ins that record what the driver asks of
them; the workers' states are set by hand, as the processes and the ranks' store keys would.
"""

import io
import os

import pytest

from hvdcompat.runner import launch
from hvdcompat.runner.elastic.gloo_driver import GlooElasticDriver
from hvdcompat.runner.gloo_workers import Worker
from hvdcompat.runner.hosts import Host
from hvdcompat.store import StoreError


class _Proc:
    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode


class _Pool:
    def __init__(self, hosts):
        self.workers = [Worker(i, h, _Proc()) for i, h in enumerate(hosts)]
        self.stopped = []

    def running(self):
        return [w for w in self.workers if w.proc.poll() is None]

    def stop(self, workers):
        for w in workers:
            w.stopped = True
            w.proc.returncode = -15
        self.stopped += [w.number for w in workers]


class _Starter:
    def __init__(self):
        self.envs = {}

    def start(self, pool, spec, np, extra_env=None, joining=False, without=()):
        env = {"HOROVOD_RANK": "9", "HOROVOD_SIZE": "9", **(extra_env or {})}
        for name in without:
            env.pop(name, None)
        self.envs[spec.rank] = env
        worker = Worker(spec.rank, spec.host, _Proc(), joining=joining)
        pool.workers.append(worker)
        return worker


class _Store:
    def __init__(self):
        self.keys = {}

    def add(self, key, amount):
        self.keys[key] = self.keys.get(key, 0) + amount
        return self.keys[key]

    def wait(self, keys, timeout_s):
        if any(k not in self.keys for k in keys):
            raise StoreError("timeout")

    def get(self, key):
        return self.keys[key]

    def register(self, name, host):  # what a joining worker's hvd.init() writes
        index = self.add("grow/count", 1) - 1
        self.keys[f"grow/{index}"] = f"{name} {host}".encode()


def _driver(tmp_path, monkeypatch, argv, first_hosts):
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(tmp_path))
    parser = launch.build_parser()
    options, _ = launch.split_command(parser, argv + ["python", "t.py"])
    out = io.StringIO()
    driver = GlooElasticDriver(parser.parse_args(options), out=out)
    pool, starter, store = _Pool(first_hosts), _Starter(), _Store()
    driver._pool, driver._starter, driver._store = pool, starter, store
    driver._first = driver._next_number = len(first_hosts)
    counts = {}
    for h in first_hosts:
        counts[h] = counts.get(h, 0) + 1
    driver._use([Host(h, n) for h, n in counts.items()])
    return driver, pool, starter, store, out


def _notices(driver):
    try:
        with open(os.path.join(driver.dir, "notices")) as f:
            return [line.split()[1:] for line in f]
    except FileNotFoundError:
        return []


def _look(driver):
    driver._next_look = 0
    driver._tick()


def test_an_added_host_gets_workers_that_rank_0_hears_of_once_they_all_wait(tmp_path,
                                                                           monkeypatch):
    driver, pool, starter, store, out = _driver(
        tmp_path, monkeypatch, ["--host-discovery-script", "x", "--min-np", "1",
                                "--max-np", "4"], ["a", "a"])
    with driver:
        driver.poll([Host("a", 2), Host("b", 3)])
        # --max-np 4 leaves room for 2 of b's 3 slots; numbered after the first two workers.
        assert [(w.number, w.host, w.joining) for w in pool.workers[2:]] == \
            [(2, "b", True), (3, "b", True)]
        for number in (2, 3):
            env = starter.envs[number]
            assert env["HVDCOMPAT_ELASTIC_JOIN"] == str(number)
            assert env["HVDCOMPAT_ELASTIC_HOST"] == "b"
            assert "HOROVOD_RANK" not in env and "HOROVOD_SIZE" not in env  # from the job
        assert _notices(driver) == []
        driver.poll([Host("a", 2), Host("b", 3)])
        assert len(pool.workers) == 4  # started once
        store.register("2", "b")
        _look(driver)
        assert _notices(driver) == []  # worker 3 is still starting
        store.register("3", "b")
        _look(driver)
        assert _notices(driver) == [["2", "-"]]  # added, nothing removed
        # The job's next reset took them in.
        store.add("grow/taken", 2)
        _look(driver)
        assert not any(w.joining for w in pool.workers) and pool.stopped == []
    log = out.getvalue()
    assert "host b added: started 2 worker(s) there (2, 3); they join the job at its next " \
           "commit once they are ready" in log, log
    assert "host b: 2 new worker(s) ready after" in log, log


def test_a_running_worker_late_to_a_reset_is_taken_back_at_the_next_commit(tmp_path,
                                                                            monkeypatch):
    driver, pool, starter, store, out = _driver(
        tmp_path, monkeypatch, ["--host-discovery-script", "x", "--min-np", "1", "--max-np", "4"],
        ["a", "a", "b"])
    with driver:
        # Worker 2's hvd.elastic.run found itself left out of the new world and waits in
        # the store under its number (step 4 of Note [Elastic reset on Gloo]).
        store.register("2", "b")
        _look(driver)
        assert [(w.number, w.joining) for w in pool.workers] == [(0, False), (1, False),
                                                                 (2, True)]
        assert _notices(driver) == [["2", "-"]]  # rank 0 hears of it: its next commit resets
        assert len(pool.workers) == 3 and pool.stopped == []  # the same process, not a new one
        store.add("grow/taken", 1)
        _look(driver)
        assert not any(w.joining for w in pool.workers) and pool.stopped == []
        # A joining worker's registration is not taken for a late one.
        driver.poll([Host("a", 2), Host("b", 1), Host("c", 1)])
        assert [(w.number, w.host, w.joining) for w in pool.workers[3:]] == [(3, "c", True)]
        store.register("3", "c")
        _look(driver)
        assert "worker 3" not in out.getvalue()
    assert "worker 2 on host b reached an elastic reset after the others had agreed on the " \
           "new world without it; the job takes it back in at its next commit" in out.getvalue()


def test_a_removed_host_leaves_at_the_commit_and_its_waiting_workers_are_stopped(tmp_path,
                                                                                monkeypatch):
    driver, pool, starter, store, out = _driver(
        tmp_path, monkeypatch, ["--host-discovery-script", "x", "--min-np", "1"], ["a", "b"])
    with driver:
        driver.poll([Host("a", 1), Host("b", 1), Host("c", 1)])  # worker 2 starts on c
        store.register("2", "c")
        _look(driver)
        driver.poll([Host("a", 1)])  # b and c go
        # b's running worker leaves at the next commit; c's, not yet in the job, is marked
        # gone in the store (so no reset takes it), then stopped.
        assert _notices(driver)[-1] == ["1", "b"]
        _look(driver)
        assert store.keys.get("grow/0/gone") == 1
        assert [w.number for w in pool.workers if w.stopped] == [2]
        # While b's old worker runs, b gets no new one; after it left, it does.
        driver.poll([Host("a", 1), Host("b", 1)])
        assert len(pool.workers) == 3
        pool.workers[1].proc.returncode = 0
        driver.poll([Host("a", 1), Host("b", 1)])
        assert [(w.number, w.host) for w in pool.workers[3:]] == [(3, "b")]
    assert "host b was removed by discovery; its ranks leave the job at the next commit" in \
        out.getvalue()


def test_failed_workers_blacklist_their_host_and_waiting_ones_end_with_the_job(tmp_path,
                                                                              monkeypatch):
    driver, pool, starter, store, out = _driver(
        tmp_path, monkeypatch, ["-H", "a:1,b:1", "--min-np", "1"], ["a", "b"])
    with driver:
        pool.workers[1].proc.returncode = -9  # b's worker killed
        driver.poll([Host("a", 1), Host("b", 1)])
        assert driver.blacklist == {"b": float("inf")} and "b" not in driver.hosts
        assert _notices(driver) == []  # nothing of the job runs on b
        # A worker waiting to join outlives the job: it is stopped, not waited for.
        pool.workers.append(Worker(2, "c", _Proc(), joining=True))
        driver._joining["2"] = pool.workers[-1]
        pool.workers[0].proc.returncode = 0
        _look(driver)
        assert [w.number for w in pool.workers if w.stopped] == [2]
    log = out.getvalue()
    assert "host b is blacklisted: its worker(s) 1 failed; for the rest of the job" in log, log
    assert "no worker of the job is left; stopping the 1 worker(s) that waited to join it" \
        in log, log


@pytest.mark.parametrize("hosts, expected", [([], False), ([Host("localhost", 2)], False),
                                             ([Host("localhost", 1), Host("node9", 1)], True)])
def test_the_store_is_offered_to_other_hosts_only_when_the_job_may_reach_them(
        tmp_path, monkeypatch, hosts, expected):
    driver, *_ = _driver(tmp_path, monkeypatch, ["-np", "2", "--min-np", "1"], ["localhost"])
    with driver:
        assert driver.may_add_hosts(hosts) == expected
    driver, *_ = _driver(tmp_path, monkeypatch, ["--host-discovery-script", "x"], ["localhost"])
    with driver:
        assert driver.may_add_hosts([])
