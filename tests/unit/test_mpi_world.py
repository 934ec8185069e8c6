"""One list of the MPI launchers' rank variables (hvdcompat/runner/mpi_world.py).

Every reader of "which rank is this process" before or without MPI takes it
from there: the rank supervisor (HOROVOD_RANK and the exit report), hvd.run's
ranks, the elastic mark a process leaves at exit, the controller choice. The
launchers: Open MPI (OMPI_COMM_WORLD_*), PMIx (PMIX_RANK), MPICH's Hydra and
the MPICH family (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from harness import REPO
from hvdcompat import basics, rendezvous
from hvdcompat.runner import run_task
from hvdcompat.runner import mpi_world, rank_supervisor

LAUNCHERS = {
    "open mpi": {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
    "pmix": {"PMIX_RANK": "5"},
    "hydra": {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"},
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_every_reader_finds_the_rank_each_launcher_sets(launcher):
    env = LAUNCHERS[launcher]
    assert mpi_world.world_rank(env) == 5
    assert run_task.world_rank(env) == 5
    assert rendezvous.launched_by_mpi(env)
    place = rank_supervisor._place_environment(env)
    assert place["HOROVOD_RANK"] == "5"
    if "PMIX_RANK" not in env:
        assert (place["HOROVOD_SIZE"], place["HOROVOD_LOCAL_RANK"], place["HOROVOD_LOCAL_SIZE"]) == \
            ("8", "1", "4")


def test_no_rank_without_a_launcher():
    assert mpi_world.world_rank({}) is None
    assert mpi_world.world_rank({"PMI_RANK": "x", "OMPI_COMM_WORLD_RANK": ""}) is None
    assert not rendezvous.launched_by_mpi({"RANK": "0"})
    with pytest.raises(RuntimeError, match="PMI_RANK"):
        run_task.world_rank({})


class _FakeCore:
    """What _mark_final_world asks the core: the notices directory, the current place."""

    def __init__(self, directory):
        self.directory = directory

    def setting(self, suffix, environ=None):
        return self.directory if suffix == "ELASTIC_DIR" else ""

    def rank(self):
        return 1

    def size(self):
        return 2


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_the_final_world_mark_names_the_launch_rank(launcher, tmp_path, monkeypatch):
    # Under MPICH's Hydra only PMI_RANK says the launch rank; a mark missing
    # there left the elastic driver without the final world's exit codes.
    for name in mpi_world.RANK:
        monkeypatch.delenv(name, raising=False)
    for name, value in LAUNCHERS[launcher].items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(basics, "_core", _FakeCore(str(tmp_path)))
    basics._mark_final_world()
    assert (tmp_path / "final.5").read_text() == "1 2\n"


@pytest.mark.parametrize("env, key", [({"HOROVOD_RANK": "4"}, 4),
                                      ({"HVDCOMPAT_ELASTIC_JOIN": "6"}, 6)])
def test_under_hvdcompatrun_gloo_the_mark_and_the_supervisor_share_the_worker_number(
        env, key, tmp_path, monkeypatch):
    # No MPI rank there: a worker started with the job has HOROVOD_RANK, an added one its
    # join name. The driver pairs final.N with the supervisor's exit.N.
    for name in mpi_world.RANK + ("HOROVOD_RANK", "HVDCOMPAT_ELASTIC_JOIN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(basics, "_core", _FakeCore(str(tmp_path)))
    basics._mark_final_world()
    assert (tmp_path / f"final.{key}").read_text() == "1 2\n"
    assert rank_supervisor._rank() == key


def test_the_supervisor_as_a_script_reads_the_same_list(tmp_path):
    """Run as mpirun runs it (a script, the package not imported): HOROVOD_RANK and the exit report."""
    env = {k: v for k, v in os.environ.items() if k not in mpi_world.LAUNCH_VARIABLES
           and not k.startswith("HOROVOD_")}
    env.update(PMI_RANK="3", PMI_SIZE="4")
    probe = ("import os, sys; print(os.environ['HOROVOD_RANK'], os.environ['HOROVOD_SIZE']); "
             "sys.exit(7)")
    script = os.path.join(REPO, "hvdcompat", "runner", "rank_supervisor.py")
    r = subprocess.run([sys.executable, script, sys.executable, "-c", probe], env=env,
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 7, r.stderr
    assert r.stdout.split() == ["3", "4"], (r.stdout, r.stderr)
    report = [line for line in r.stderr.splitlines() if line.startswith(rank_supervisor.MARKER)]
    assert report and json.loads(report[0][len(rank_supervisor.MARKER):])["rank"] == 3, r.stderr


def test_the_rank_variables_are_named_in_one_module_only():
    names = set(mpi_world.RANK + mpi_world.SIZE + mpi_world.LOCAL_RANK + mpi_world.LOCAL_SIZE)
    package = pathlib.Path(REPO) / "hvdcompat"
    elsewhere = {str(p.relative_to(REPO)): sorted(n for n in names if f'"{n}"' in p.read_text())
                 for p in package.rglob("*.py") if p.name != "mpi_world.py"}
    elsewhere = {k: v for k, v in elsewhere.items() if v}
    assert not elsewhere, f"launcher rank variables read outside hvdcompat/runner/mpi_world.py: {elsewhere}"
