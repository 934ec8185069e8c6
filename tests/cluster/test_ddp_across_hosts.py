"""The DDP guide's two-machine launch on two test hosts: one launcher per host, the
gradient buckets on hvdcompat's engine (its Gloo controller, meeting through the
launcher's store), 2 hosts x 2 ranks.

Each rank trains DDP with ``import hvdcompat.ddp.accelerate`` first, checks its
parameters against a single-process reference computed on its own
(tests/ddp_scripts/ddp_train.py), and reports the engine's world and topology and
a digest of its final parameters; the test checks the route, the topology the
launch gave (GROUP_RANK), that the engine reduced the buckets, and that the four
models are identical.
"""

import os
import re
import sys

from cluster_harness import run_on_each_host

SCRIPT = os.path.join("tests", "ddp_scripts", "ddp_train.py")
TIMEOUT = 240
STEPS = 4  # ddp_train.py's default: one bucket per step

# Two ranks' lines may run together (a print writes the text, then the newline).
_OK = re.compile(r"ddp_train rank (\d+) of (\d+) ok backend=(\w+) route=(\w+)")
_ENGINE = re.compile(r"ddp_train engine rank (\d+) size (\d+) local (\d+) (\d+) cross (\d+) (\d+) "
                     r"gloo (\d) tensors (\d+) digest ([0-9a-f]{16})")


def _train_on_both_hosts(cluster, launcher, args=(), hostname=None):
    """Starts `launcher(k)` (``python -m`` arguments) on host k; returns {rank: report}."""
    commands = [[sys.executable, "-m", *launcher(k), SCRIPT, "--accelerate", "--report-engine",
                 *args] for k in range(2)]
    results = run_on_each_host(cluster, commands, TIMEOUT, hostname=hostname)
    output = "\n".join(f"----- host {k}: {r.command}: exit code {r.returncode}"
                       f"{' (timed out)' if r.timed_out else ''}\n{r.output}"
                       for k, r in enumerate(results))
    assert all(r.returncode == 0 and not r.timed_out for r in results), output
    print(f"MEASURED {launcher(0)[0]} on 2 test hosts x 2 ranks: {results[0].seconds:.1f} s")
    ranks = {}
    for host, r in enumerate(results):
        for m in _OK.finditer(r.output):
            ranks.setdefault(int(m.group(1)), {}).update(
                host=host, size=int(m.group(2)), backend=m.group(3), route=m.group(4))
        for m in _ENGINE.finditer(r.output):
            ranks.setdefault(int(m.group(1)), {}).update(
                engine=tuple(int(x) for x in m.group(2, 3, 4, 5, 6, 7, 8)), digest=m.group(9))
    assert sorted(ranks) == [0, 1, 2, 3], output
    return ranks, output


def _check(ranks, output, backend):
    for rank, got in ranks.items():
        # --node_rank=k starts ranks 2k and 2k + 1; GROUP_RANK is the engine's cross rank.
        assert got["host"] == rank // 2 and got["size"] == 4, (rank, got, output)
        assert (got["backend"], got["route"]) == (backend, "engine"), (rank, got, output)
        size, local, local_size, cross, cross_size, gloo, tensors = got["engine"]
        assert (size, local, local_size, cross, cross_size, gloo) == \
            (4, rank % 2, 2, rank // 2, 2, 1), (rank, got, output)
        assert tensors >= STEPS, (rank, got, output)  # the buckets went through the engine
    # Equal to the reference on every rank (the script checks that), and identical.
    assert len({got["digest"] for got in ranks.values()}) == 1, output


def test_the_guides_two_machine_launch_runs_ddp_on_the_engine(cluster):
    master = cluster.addresses[0]

    def launch(k):
        return ["torch.distributed.launch", "--nproc_per_node=2", "--nnodes=2",
                f"--node_rank={k}", f"--master_addr={master}", "--master_port=6007",
                "--use_env"]

    ranks, output = _train_on_both_hosts(cluster, launch)
    _check(ranks, output, "gloo")


def test_torchrun_on_hosts_whose_name_is_loopback_with_the_hvdcompat_backend(cluster):
    # Every host's name resolves to 127.0.0.1 (as "127.0.1.1 node1" lines in
    # /etc/hosts make it): Gloo must bind to the address each host reaches the
    # store from, not the name's. The hvdcompat backend opens no gloo group of torch's.
    master = cluster.addresses[0]

    def launch(k):
        return ["torch.distributed.run", "--nproc_per_node=2", "--nnodes=2", f"--node_rank={k}",
                f"--master_addr={master}", "--master_port=6007"]

    ranks, output = _train_on_both_hosts(cluster, launch, ["--backend", "hvdcompat"],
                                         hostname="localhost")
    _check(ranks, output, "hvdcompat")
