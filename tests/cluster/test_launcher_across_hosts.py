"""hvdcompatrun on test hosts: -H, --hostfile, the ssh knobs, interfaces, the environment."""

import json
import os
import re
import sys

from cluster_harness import host_list, run_hvdcompatrun

SCRIPT = os.path.join("tests", "cluster", "scripts", "env_report.py")
TIMEOUT = 150


def _ranks(output):
    rows = [json.loads(l.split("ENV ", 1)[1]) for l in output.splitlines() if "ENV {" in l]
    return {r["rank"]: r for r in rows}


def _agent_only(cluster):
    return f"--prtemca plm_ssh_agent {cluster.agent}"


def test_hosts_ssh_knobs_and_the_launching_environment(cluster, tmp_path):
    key = tmp_path / "id_test"
    key.write_text("not a real key; the ssh stand-in only records the option\n")
    env = {"OMP_NUM_THREADS": "3", "CUDA_VISIBLE_DEVICES": "1,0", "MY_OWN_SETTING": "a b=c",
           "HOROVOD_CYCLE_TIME": "0.5",
           # Describe the launching host or session: must not reach other hosts.
           "HOSTNAME": "the-launching-host", "DISPLAY": ":9", "SSH_AUTH_SOCK": "/tmp/agent.1",
           "TERM": "xterm-256color"}
    open(cluster.agent_log, "w").close()
    result = run_hvdcompatrun(cluster, ["-H", host_list(cluster, [2, 2]), "-p", "2222", "-i",
                                        str(key), "--mpi-args", " ".join(cluster.mpi_args()),
                                        sys.executable, SCRIPT], TIMEOUT, env=env)
    ranks = _ranks(result.output)
    assert sorted(ranks) == [0, 1, 2, 3], result.output
    for r, row in ranks.items():
        assert row["host"] == cluster.names[r // 2], row
        assert (row["local_rank"], row["local_size"]) == (r % 2, 2), row
        assert (row["cross_rank"], row["cross_size"]) == (r // 2, 2), row
        assert row["homogeneous"] and row["sum"] == 6.0, row
        assert row["cwd"] == os.getcwd() or row["cwd"].endswith(os.path.basename(os.getcwd()))
        e = row["env"]
        assert (e["OMP_NUM_THREADS"], e["CUDA_VISIBLE_DEVICES"], e["MY_OWN_SETTING"],
                e["HOROVOD_CYCLE_TIME"]) == ("3", "1,0", "a b=c", "0.5"), row
        if r >= 2:  # the remote host: started from the stand-in's clean environment
            assert e["DISPLAY"] is None and e["SSH_AUTH_SOCK"] is None and e["TERM"] is None, row
            assert e["HOSTNAME"] != "the-launching-host", row
    calls = cluster.agent_calls()
    assert "OPT -p 2222" in calls and f"OPT -i {key}" in calls, calls
    assert f"HOST {cluster.names[1]}" in calls, calls


def test_hostfile_uneven_slots_and_network_interfaces(cluster, tmp_path):
    hostfile = cluster.write_hostfile([2, 1], str(tmp_path / "hosts"))
    # Only the stand-in: the interface flags come from --network-interfaces.
    result = run_hvdcompatrun(cluster, ["--verbose", "--hostfile", hostfile,
                                        "--network-interfaces", "eth0",
                                        "--mpi-args", _agent_only(cluster),
                                        sys.executable, SCRIPT], TIMEOUT)
    line = next(l for l in result.output.splitlines() if l.startswith("hvdcompatrun: /"))
    assert "oob_tcp_if_include eth0" in line and "btl_tcp_if_include eth0" in line, line
    ranks = _ranks(result.output)
    assert sorted(ranks) == [0, 1, 2], result.output
    expected = {0: (0, 0, 2, 0, 2), 1: (1, 0, 2, 0, 1), 2: (0, 1, 1, 1, 2)}
    for r, row in ranks.items():
        assert (row["local_rank"], row["host"] == cluster.names[expected[r][1]],
                row["local_size"], row["cross_rank"], row["cross_size"]) == \
            (expected[r][0], True, expected[r][2], expected[r][3], expected[r][4]), row
        assert not row["homogeneous"] and row["sum"] == 3.0
        assert row["env"]["NCCL_SOCKET_IFNAME"] == "eth0", row
    # An interface no host has: the flags are really applied, so the launch fails.
    bad = run_hvdcompatrun(cluster, ["--hostfile", hostfile, "--network-interfaces", "nosuch0",
                                     "--mpi-args", _agent_only(cluster), sys.executable, SCRIPT],
                           TIMEOUT, check=False)
    assert bad.returncode != 0 and not bad.timed_out and "ENV {" not in bad.output, bad.output


def test_gloo_launch_across_hosts_starts_remote_ranks_through_ssh(cluster):
    # hvdcompatrun --gloo starts the second host's ranks with `ssh` (the
    # stand-in, first on PATH), serves the store itself and checks the
    # supervisors' reports with the launch's secret, which reaches the remote
    # supervisors on ssh's standard input.
    env = {"PATH": cluster.tmpdir + os.pathsep + os.environ["PATH"], "MY_OWN_SETTING": "a b=c"}
    open(cluster.agent_log, "w").close()
    result = run_hvdcompatrun(cluster, ["--gloo", "-H", host_list(cluster, [2, 2]),
                                        sys.executable, SCRIPT], TIMEOUT, env=env)
    ranks = _ranks(result.output)
    assert sorted(ranks) == [0, 1, 2, 3], result.output
    for r, row in ranks.items():
        assert row["host"] == cluster.names[r // 2], row
        assert (row["size"], row["local_rank"], row["local_size"]) == (4, r % 2, 2), row
        assert (row["cross_rank"], row["cross_size"]) == (r // 2, 2), row
        assert row["homogeneous"] and row["sum"] == 6.0, row
        assert row["env"]["MY_OWN_SETTING"] == "a b=c", row
        assert row["env"]["HVDCOMPAT_REPORT_TOKEN"] is None, row  # the supervisor kept it
    assert f"HOST {cluster.names[1]}" in cluster.agent_calls()
    # Every supervisor's report carried the secret (a report without it would
    # be passed on as output); none of it shows in the output.
    assert "hvdcompatrun-rank-exit" not in result.output, result.output
    assert "HVDCOMPAT_REPORT_TOKEN=" not in cluster.agent_calls()
