"""hvdcompatrun --gloo: rank placement, each rank's variables and command, its flags' errors,
and launches of plain processes (the engine is not needed for these)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from harness import REPO
from hvdcompat.runner import gloo_run, launch
from hvdcompat.runner.errors import LaunchError
from hvdcompat.runner.hosts import Host

LAUNCH = [sys.executable, "-m", "hvdcompat.runner.launch"]


def _run_cli(args, timeout=180, cwd=REPO, env=None):
    return subprocess.run(LAUNCH + list(args), capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env or dict(os.environ))


def _parse(argv):
    parser = launch.build_parser()
    options, command = launch.split_command(parser, argv)
    return parser.parse_args(options), command


def test_placement_gives_horovods_local_and_cross_topology():
    specs = gloo_run.place_ranks([Host("a", 2), Host("b", 1), Host("c", 2)], 5)
    got = [(s.rank, s.host, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
           for s in specs]
    assert got == [(0, "a", 0, 2, 0, 3), (1, "a", 1, 2, 0, 2), (2, "b", 0, 1, 1, 3),
                   (3, "c", 0, 2, 2, 3), (4, "c", 1, 2, 1, 2)]
    assert [s.local for s in specs] == [False] * 5
    # No host list: every rank here.
    assert [(s.host, s.local_rank, s.local_size, s.cross_size, s.local)
            for s in gloo_run.place_ranks([], 2)] == [("localhost", 0, 2, 1, True),
                                                      ("localhost", 1, 2, 1, True)]
    with pytest.raises(LaunchError, match=r"-np 4 asks for more ranks than the hosts have "
                                          r"slots \(3 in a:2,b:1\)"):
        gloo_run.place_ranks([Host("a", 2), Host("b", 1)], 4)


def test_each_rank_gets_horovods_gloo_variables_and_the_forwarded_environment():
    local, remote = gloo_run.place_ranks([Host("localhost", 1), Host("node2", 1)], 2)
    environ = {"PATH": "/bin", "HOME": "/root", "OMPI_COMM_WORLD_RANK": "5",
               "OMPI_MCA_btl": "tcp", "PMIX_RANK": "5", "MY_SETTING": "1",
               "HVDCOMPAT_CONTROLLER": "mpi"}
    env = gloo_run.rank_environment(local, environ, "198.18.0.1", 4000, 12, ["eth1"], 2,
                                    master=("127.0.0.1", 29500))
    assert {k: env[k] for k in env if k.startswith("HOROVOD_")} == {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "198.18.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4000",
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "12", "HOROVOD_GLOO_IFACE": "eth1",
        "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_HOSTNAME": "localhost"}
    # A rank here keeps the whole environment but an MPI launcher's own variables.
    assert env["HOME"] == "/root" and env["OMPI_MCA_btl"] == "tcp" and env["MY_SETTING"] == "1"
    assert "OMPI_COMM_WORLD_RANK" not in env and "PMIX_RANK" not in env
    assert "HVDCOMPAT_CONTROLLER" not in env and env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("0", "2", "29500")
    # A rank elsewhere gets what the MPI launch forwards (no HOME of this login).
    far = gloo_run.rank_environment(remote, environ, "198.18.0.1", 4000, 30, [], 2)
    assert "HOME" not in far and far["MY_SETTING"] == "1" and far["HOROVOD_RANK"] == "1"
    assert "RANK" not in far and "HOROVOD_GLOO_IFACE" not in far


def test_a_remote_rank_starts_through_ssh_with_its_variables():
    _, remote = gloo_run.place_ranks([Host("localhost", 1), Host("node2", 1)], 2)
    remote.env = {"HOROVOD_RANK": "1", "A": "x y"}
    argv = gloo_run.rank_command(remote, ["/usr/bin/python3", "train.py"], "/sup.py", "/work dir",
                                 ssh_port=2222, ssh_identity_file="/k", start_timeout=7)
    assert argv[:argv.index("node2")] == ["ssh", "-o", "BatchMode=yes", "-o",
                                          "StrictHostKeyChecking=no", "-o", "ConnectTimeout=7",
                                          "-p", "2222", "-i", "/k"]
    # The report secret comes on ssh's standard input, never on a command line.
    assert argv[-1] == ("IFS= read -r HVDCOMPAT_REPORT_TOKEN && export HVDCOMPAT_REPORT_TOKEN && "
                        "cd '/work dir' && exec env 'A=x y' HOROVOD_RANK=1 "
                        "/usr/bin/python3 /sup.py /usr/bin/python3 train.py")


@pytest.mark.parametrize("argv, needle", [
    (["--gloo", "--mpi-args=-x A", "-np", "2", "true"], "--mpi-args has nothing to go to"),
    (["--gloo", "--fault-tolerant", "-np", "2", "true"], "--fault-tolerant is Open MPI"),
    (["--output-filename", "d", "-np", "2", "true"], "--output-filename applies to the Gloo"),
    (["--gloo", "--gloo-timeout-seconds", "0", "-np", "2", "true"], "must be a positive"),
    (["--gloo", "--host-discovery-script", "./d.sh", "-H", "a:1", "true"],
     "--host-discovery-script replaces -H/--hostfile"),
    (["--gloo", "--min-np", "3", "-np", "2", "true"], "-np 2 is below --min-np 3"),
])
def test_flag_errors_say_what_to_change(argv, needle, capsys):
    assert launch.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_gloo_and_mpi_exclude_each_other():
    with pytest.raises(SystemExit):
        _parse(["--gloo", "--mpi", "-np", "2", "true"])
    args, command = _parse(["--gloo", "--gloo-timeout-seconds", "5", "--start-timeout", "9",
                            "-np", "2", "python", "x.py"])
    assert (args.gloo, args.gloo_timeout_seconds, args.start_timeout, command) == (
        True, 5.0, 9.0, ["python", "x.py"])


_SCRIPT = textwrap.dedent("""\
    import os, signal, sys, time
    rank = int(os.environ["HOROVOD_RANK"])
    keys = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
            "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_CONTROLLER", "MY_SETTING")
    print("env", " ".join(os.environ.get(k, "-") for k in keys), flush=True)
    print(f"to stderr {rank}", file=sys.stderr, flush=True)
    if sys.argv[1] == "kill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[1] == "kill":
        time.sleep(120)
""")


def test_three_ranks_start_with_their_place_and_output_files(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "out"
    r = _run_cli(["--gloo", "-np", "3", "--output-filename", str(out), sys.executable,
                  str(script), "ok"], env={**os.environ, "MY_SETTING": "forwarded"})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(line for line in r.stdout.splitlines() if line.startswith("env "))
    assert lines == [f"env {k} 3 {k} 3 0 1 gloo forwarded" for k in range(3)], r.stdout
    for k in range(3):
        assert f"to stderr {k}" in r.stderr
        assert (out / f"rank.{k}" / "stdout").read_text().startswith(f"env {k} 3")
        assert (out / f"rank.{k}" / "stderr").read_text() == f"to stderr {k}\n"


def test_a_killed_rank_ends_the_job_with_its_line_and_code(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(_SCRIPT)
    started = time.monotonic()
    r = _run_cli(["--gloo", "-np", "3", sys.executable, str(script), "kill"])
    elapsed = time.monotonic() - started
    assert r.returncode == 128 + 9, r.stdout + r.stderr
    assert "hvdcompatrun: rank 1 on host" in r.stderr and "killed by signal 9 (SIGKILL)" in \
        r.stderr, r.stderr
    # The others were stopped after the grace, not left to their 120 s sleep.
    assert elapsed < 100, elapsed


def test_check_build_tells_whether_gloo_is_built():
    from hvdcompat.basics import gloo_built

    r = _run_cli(["--check-build"])
    assert r.returncode == 0, r.stderr
    box = "[X]" if gloo_built() else "[ ]"
    assert r.stdout.count(f"{box} Gloo") == 2, r.stdout


def test_the_relay_keeps_each_ranks_lines_whole():
    from hvdcompat.runner.exit_report import OutputRelay

    out_r, out_w = os.pipe()
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    relay = OutputRelay([(os.fdopen(a_r, "rb"), out_w), (os.fdopen(b_r, "rb"), out_w)],
                        whole_lines=True)
    os.write(a_w, b"rank 0 sa")
    time.sleep(0.05)
    os.write(b_w, b"rank 1 says hello\n")
    time.sleep(0.05)
    os.write(a_w, b"ys hello\n")
    os.write(b_w, b"prompt> ")  # no newline: goes out once the stream is quiet
    time.sleep(1.0)
    os.close(a_w)
    os.close(b_w)
    relay.join(5)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        got = f.read()
    assert got == b"rank 1 says hello\nrank 0 says hello\nprompt> ", got
