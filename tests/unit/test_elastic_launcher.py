"""hvdcompatrun's elastic flags and driver, without launching ranks."""

import os
import stat
import sys

import pytest

from hvdcompat.runner import elastic, launch
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
    assert elastic.elastic_requested(args) and command == ["python", "t.py"]
    assert not elastic.elastic_requested(_parse(["-np", "2", "python", "t.py"])[0])
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
    assert elastic.parse_discovery_output("a:2\n\nb\n c:1 \n", 4) == [
        Host("a", 2), Host("b", 4), Host("c", 1)]
    with pytest.raises(HostListError, match="line 1"):
        elastic.parse_discovery_output("a:x\n", 1)


def test_wait_for_hosts_polls_until_min_np_slots_or_the_timeout(tmp_path):
    counter = tmp_path / "n"
    counter.write_text("0")
    # One more host line on every call.
    script = _script(tmp_path, f'n=$(cat {counter}); n=$((n+1)); echo $n > {counter}\n'
                               'i=0; while [ $i -lt $n ]; do echo h$i:1; i=$((i+1)); done\n')
    args, _ = _parse(["--host-discovery-script", script, "--min-np", "3", "python", "t.py"])
    now = [0.0]
    hosts = elastic.wait_for_hosts(args, clock=lambda: now[0],
                                   sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert [h.name for h in hosts] == ["h0", "h1", "h2"] and now[0] == 2.0
    args, _ = _parse(["--host-discovery-script", _script(tmp_path, "echo only:1\n", "one.sh"),
                      "--min-np", "2", "--elastic-timeout", "3", "python", "t.py"])
    now[0] = 0.0
    with pytest.raises(HostListError, match="1 slot.*fewer than the 2 needed.*--elastic-timeout 3"):
        elastic.wait_for_hosts(args, clock=lambda: now[0],
                               sleep=lambda s: now.__setitem__(0, now[0] + s))


def test_a_failing_discovery_script_is_named(tmp_path):
    with pytest.raises(HostListError, match="exited with 3: boom"):
        elastic.discover(_script(tmp_path, "echo boom >&2; exit 3\n"), 1)


def test_driver_environment_notices_and_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("HVDCOMPAT_ELASTIC_DIR", str(tmp_path))
    args, _ = _parse(["-np", "3", "--min-np", "2", "--reset-limit", "4", "python", "t.py"])
    with elastic.ElasticDriver(args) as driver:
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
