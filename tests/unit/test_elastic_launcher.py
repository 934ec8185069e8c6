"""hvdcompatrun's elastic flags and driver, without launching ranks."""

import os
import stat
import sys

import pytest

from hvdcompat.runner import launch
from hvdcompat.runner.elastic import discovery, flags
from hvdcompat.runner.elastic.mpi_driver import MpiElasticDriver
from hvdcompat.runner.hosts import Host, HostListError
from hvdcompat.runner.mpirun_command import FAULT_TOLERANT_ARGS


def _parse(argv):
    parser = launch.build_parser()
    options, command = launch.split_command(parser, argv)
    return parser.parse_args(options), command


def _script(tmp_path, body, name="discover.sh"):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_flags_parse_with_horovods_names_and_imply_fault_tolerance():
    args, command = _parse(["-np", "4", "--min-np", "2", "--max-np", "8", "--slots-per-host",
                            "2", "--elastic-timeout", "30", "--reset-limit", "3",
                            "--blacklist-cooldown-range", "10", "100", "python", "t.py"])
    assert (args.min_np, args.max_np, args.slots_per_host, args.elastic_timeout,
            args.reset_limit, args.blacklist_cooldown_range) == (2, 8, 2, 30, 3, [10, 100])
    assert flags.elastic_requested(args) and command == ["python", "t.py"]
    assert not flags.elastic_requested(_parse(["-np", "2", "python", "t.py"])[0])
    cmd, env = launch.plan_launch(args, [sys.executable, "-c", "pass"],
                                  environ=dict(os.environ))
    line = " ".join(cmd)
    assert " ".join(FAULT_TOLERANT_ARGS) in line


@pytest.mark.parametrize("argv, message", [
    (["-np", "1", "--min-np", "2"], "-np 1 is below --min-np 2"),
    (["-np", "5", "--max-np", "4"], "-np 5 is above --max-np 4"),
    (["--min-np", "3", "--max-np", "2", "-np", "2"], "--min-np 3 is above --max-np 2"),
    (["-np", "2", "--reset-limit", "-1"], "--reset-limit must be at least 0"),
    (["-np", "2", "--blacklist-cooldown-range", "5", "1"], "0 <= MIN <= MAX"),
])
def test_inconsistent_flags_are_launch_errors(argv, message):
    args, _ = _parse(argv + ["python", "t.py"])
    with pytest.raises(launch.LaunchError, match=message.replace("(", r"\(")):
        launch.plan_launch(args, [sys.executable, "-c", "pass"], environ=dict(os.environ))


def test_discovery_output_is_host_colon_slots_with_a_default():
    assert discovery.parse_discovery_output("a:2\n\nb\n c:1 \n", 4) == [
        Host("a", 2), Host("b", 4), Host("c", 1)]
    with pytest.raises(HostListError, match="line 1"):
        discovery.parse_discovery_output("a:x\n", 1)


@pytest.mark.parametrize("line, needle", [
    ("-oProxyCommand=touch${IFS}pwned:1", "starts with '-'"),
    ("-oProxyCommand=x", "starts with '-'"),
    ("a,b:2", "no commas or spaces"),
    ("a b:2", "no commas or spaces"),
])
def test_discovered_host_names_are_checked_like_dash_h_names(tmp_path, line, needle):
    with pytest.raises(HostListError, match=needle) as info:
        discovery.parse_discovery_output(f"good:1\n{line}\n", 1)
    assert "line 2" in str(info.value) and repr(line) in str(info.value)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\necho good:1\necho '{line}'\n")
    script.chmod(0o755)
    with pytest.raises(HostListError, match=needle) as info:
        discovery.discover(str(script), 1)
    assert str(script) in str(info.value) and "line 2" in str(info.value)


def test_wait_for_hosts_polls_until_min_np_slots_or_the_timeout(tmp_path):
    counter = tmp_path / "n"
    counter.write_text("0")
    # One more host line on every call.
    script = _script(tmp_path, f'n=$(cat {counter}); n=$((n+1)); echo $n > {counter}\n'
                               'i=0; while [ $i -lt $n ]; do echo h$i:1; i=$((i+1)); done\n')
    args, _ = _parse(["--host-discovery-script", script, "--min-np", "3", "python", "t.py"])
    now = [0.0]
    hosts = discovery.wait_for_hosts(args, clock=lambda: now[0],
                                   sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert [h.name for h in hosts] == ["h0", "h1", "h2"] and now[0] == 2.0
    args, _ = _parse(["--host-discovery-script", _script(tmp_path, "echo only:1\n", "one.sh"),
                      "--min-np", "2", "--elastic-timeout", "3", "python", "t.py"])
    now[0] = 0.0
    with pytest.raises(HostListError, match="1 slot.*fewer than the 2 needed.*--elastic-timeout 3"):
        discovery.wait_for_hosts(args, clock=lambda: now[0],
                               sleep=lambda s: now.__setitem__(0, now[0] + s))


def test_a_failing_discovery_script_is_named(tmp_path):
    with pytest.raises(HostListError, match="exited with 3: boom"):
        discovery.discover(_script(tmp_path, "echo boom >&2; exit 3\n"), 1)


def test_driver_environment_notices_and_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(tmp_path))
    args, _ = _parse(["-np", "3", "--min-np", "2", "--reset-limit", "4", "python", "t.py"])
    with MpiElasticDriver(args) as driver:
        assert os.path.dirname(driver.dir) == str(tmp_path)
        env = driver.environment()
        assert env["HVDCOMPAT_ELASTIC_MIN_NP"] == "2" and env["HOROVOD_ELASTIC"] == "1"
        assert env["HVDCOMPAT_ELASTIC_RESET_LIMIT"] == "4"
        driver.notice(["hostB", "hostA"], [])
        fields = open(os.path.join(driver.dir, "notices")).read().split()
        assert fields[1:] == ["1", "hostA,hostB"]
        assert driver.verdict(137) == 137  # nobody finished
        for r in range(2):
            with open(os.path.join(driver.dir, f"finished.{r}"), "w") as f:
                f.write("2\n")
        assert driver.verdict(137) == 0  # the final world of 2 finished
        assert driver.verdict(0) == 0
    assert not os.path.exists(driver.dir)


def test_a_rank_sees_its_host_removed_in_the_notices(tmp_path, monkeypatch):
    from hvdcompat.elastic import notifications

    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(tmp_path))
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_HOST", "hostB")
    assert not notifications.host_removed()
    (tmp_path / "notices").write_text("1.0 1 hostA\n")
    assert not notifications.host_removed()
    with open(tmp_path / "notices", "a") as f:
        f.write("2.0 1 hostC,hostB\n")
    assert notifications.host_removed()


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _notices(driver):
    try:
        return [l.split() for l in open(os.path.join(driver.dir, "notices")).read().splitlines()]
    except FileNotFoundError:
        return []


def test_driver_blacklists_failed_hosts_and_lets_them_back_after_the_cooldown(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(tmp_path))
    args, _ = _parse(["-H", "a:2,b:1", "--min-np", "1", "--blacklist-cooldown-range", "5", "9",
                      "python", "t.py"])
    clock, out = _Clock(), open(tmp_path / "log", "w+")
    hosts = [Host("a", 2), Host("b", 1)]
    with MpiElasticDriver(args, out=out, clock=clock, cooldown=lambda lo, hi: hi) as d:
        d._use(hosts, 3)  # ranks 0, 1 on a; 2 on b
        d.poll(hosts)
        assert _notices(d) == [] and d.blacklist == {}
        with open(os.path.join(d.dir, "lost"), "w") as f:
            f.write("1.0 2\n")  # rank 0 reports rank 2 lost
        d.poll(hosts)
        assert d.blacklist == {"b": 109.0} and "b" not in d.hosts
        assert _notices(d) == []  # no rank is left on b: nothing to announce
        clock.now = 108.0
        d.poll(hosts)
        assert _notices(d) == []
        clock.now = 109.5  # the cooldown is over: b comes back as an added host
        d.poll(hosts)
        assert [n[1:] for n in _notices(d)] == [["2", "-"]] and d.blacklist == {}
        d.poll(hosts)
        assert len(_notices(d)) == 1  # announced once
        assert d.next_hosts() == hosts  # the surviving host first, then the new one
        out.seek(0)
        log = out.read()
    assert "host b is blacklisted: its rank(s) 2 failed; it may rejoin in 9.0 s" in log
    assert "host b's blacklist cooldown is over" in log
    assert "host(s) b added; the job restarts with them at its next commit" in log


def test_a_blacklisted_host_with_live_ranks_is_announced_as_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(tmp_path))
    args, _ = _parse(["-H", "a:1,b:2", "--min-np", "1", "python", "t.py"])
    hosts = [Host("a", 1), Host("b", 2)]
    with MpiElasticDriver(args, out=open(os.devnull, "w")) as d:
        d._use(hosts, 3)  # rank 0 on a; 1, 2 on b
        with open(os.path.join(d.dir, "lost"), "w") as f:
            f.write("1.0 1\n")
        d.poll(hosts)
        assert d.blacklist["b"] == float("inf")
        assert [n[1:] for n in _notices(d)] == [["1", "b"]]  # rank 2 must leave
        assert d.error is None


def test_every_host_blacklisted_and_too_few_slots_past_the_timeout_are_errors(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(tmp_path))
    args, _ = _parse(["-H", "a:1,b:1", "--min-np", "1", "python", "t.py"])
    hosts = [Host("a", 1), Host("b", 1)]
    with MpiElasticDriver(args, out=open(os.devnull, "w")) as d:
        d._use(hosts, 2)
        with open(os.path.join(d.dir, "lost"), "w") as f:
            f.write("1.0 1\n2.0 0\n")
        d.poll(hosts)
        assert d.error.startswith("every host is blacklisted (a (for good), b (for good)); "
                                  "the job stops"), d.error
    args, _ = _parse(["--host-discovery-script", "x", "--min-np", "2", "--elastic-timeout", "30",
                      "python", "t.py"])
    clock = _Clock()
    with MpiElasticDriver(args, out=open(os.devnull, "w"), clock=clock) as d:
        d._use(hosts, 2)
        d.poll([Host("a", 1)])
        assert d.error is None and _notices(d) == []  # b's removal is held back meanwhile
        clock.now += 29
        d.poll([Host("a", 1)])
        assert d.error is None
        clock.now += 1
        d.poll([Host("a", 1)])
        assert ("only 1 usable slot(s) (discovery lists a:1; blacklisted: none), fewer than "
                "--min-np 2, for --elastic-timeout 30 s; the job stops") in d.error


def test_relaunch_hosts_are_capped_at_max_np():
    assert discovery.cap([Host("a", 2), Host("b", 4), Host("c", 1)], 5) == \
        [Host("a", 2), Host("b", 3)]
    assert discovery.cap([Host("a", 2)], None) == [Host("a", 2)]
