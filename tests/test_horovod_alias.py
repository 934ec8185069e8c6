"""The opt-in Horovod alias: unmodified `import horovod.torch as hvd` scripts and `horovodrun`.

Jobs run at 2 ranks, each under a hard timeout: through
`python -m hvdcompat.horovod_alias`, through the installed alias distribution
(alias/, installed into a temporary directory, never into this environment)
and its `horovodrun`, and a script that calls `horovod.run` as Horovod's MNIST
example does. A stand-in "real Horovod" (a `horovod` package with its pip
metadata) checks that the alias never takes its place.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from harness import REPO, mpi_env

TIMEOUT = int(os.environ.get("HVDCOMPAT_TEST_TIMEOUT", "300"))

USES_HOROVOD = textwrap.dedent("""\
    import horovod
    import horovod.torch as hvd
    import torch
    from horovod.common.exceptions import HorovodInternalError
    from horovod.torch.mpi_ops import allreduce as mpi_ops_allreduce
    import horovod.torch.elastic  # importable; only using it raises
    import hvdcompat

    assert horovod.__version__ == "0.28.1", horovod.__version__
    assert horovod.run is hvdcompat.run
    assert hvd.allreduce is hvdcompat.allreduce
    assert mpi_ops_allreduce is hvdcompat.mpi_ops.allreduce
    assert HorovodInternalError is hvdcompat.HorovodInternalError
    hvd.init()
    n = hvd.size()
    total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
    print(f"rank {hvd.rank()} of {n}: horovod {horovod.__version__} sum {total:g}")
""")

# As Horovod's examples/pytorch/pytorch_mnist.py does with --num-proc.
USES_HOROVOD_RUN = textwrap.dedent("""\
    import horovod
    import horovod.torch as hvd
    import torch


    def work(base):
        hvd.init()
        return base + hvd.rank(), hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()


    if __name__ == "__main__":
        print("RESULT", horovod.run(work, args=(100,), np=2, start_timeout=180))
""")


def _expected_lines(n):
    return [f"rank {r} of {n}: horovod 0.28.1 sum {n * (n + 1) // 2}" for r in range(n)]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    where = tmp_path_factory.mktemp("horovod-scripts")
    (where / "uses_horovod.py").write_text(USES_HOROVOD)
    (where / "uses_horovod_run.py").write_text(USES_HOROVOD_RUN)
    return where


@pytest.fixture(scope="module")
def installed_alias(tmp_path_factory):
    """The alias distribution installed into a directory of its own (its bin/ and packages)."""
    build = tmp_path_factory.mktemp("alias-src")
    source = build / "alias"
    shutil.copytree(os.path.join(REPO, "alias"), source)  # building writes into the tree
    target = tmp_path_factory.mktemp("alias-installed")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-build-isolation", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "bin" / "horovodrun").exists() and (target / "horovod").is_dir()
    return target


@pytest.fixture(scope="module")
def real_horovod(tmp_path_factory):
    """A stand-in for an installed Horovod: its package and pip's metadata for it."""
    where = tmp_path_factory.mktemp("real-horovod")
    (where / "horovod").mkdir()
    (where / "horovod" / "__init__.py").write_text('print("the real Horovod was imported")\n')
    info = where / "horovod-0.28.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: horovod\nVersion: 0.28.1\n")
    (info / "RECORD").write_text("")
    return where


def _run(argv, cwd, path_first=()):
    env = mpi_env()
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in path_first] + [env["PYTHONPATH"]])
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=TIMEOUT)


def _assert_ran(done, lines):
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for line in lines:
        assert line in done.stdout, out


def test_unmodified_script_under_hvdcompatrun_through_the_module(scripts):
    done = _run([sys.executable, "-m", "hvdcompat.runner.launch", "-np", "2", "python", "-m",
                 "hvdcompat.horovod_alias", "uses_horovod.py"], scripts)
    _assert_ran(done, _expected_lines(2))


def test_horovod_run_from_an_unmodified_script(scripts):
    done = _run([sys.executable, "-m", "hvdcompat.horovod_alias", "uses_horovod_run.py"],
                scripts)
    _assert_ran(done, ["RESULT [(100, 2.0), (101, 2.0)]"])
    assert "np= is deprecated, use num_proc=" in done.stderr  # as Horovod warns


def test_horovodrun_of_the_installed_alias(scripts, installed_alias):
    done = _run([str(installed_alias / "bin" / "horovodrun"), "-np", "2", "python",
                 "uses_horovod.py"], scripts, [installed_alias])
    _assert_ran(done, _expected_lines(2))


def test_the_alias_never_stands_in_for_a_real_horovod(scripts, installed_alias, real_horovod):
    refused = "is installed in this environment, so hvdcompat's Horovod alias stays off"
    done = _run([sys.executable, "-m", "hvdcompat.horovod_alias", "uses_horovod.py"], scripts,
                [real_horovod])
    assert done.returncode == 2 and refused in done.stderr, done.stdout + done.stderr
    assert "Horovod 0.28.1 (installed at" in done.stderr
    # The installed alias's horovodrun steps aside; nothing is launched.
    done = _run([str(installed_alias / "bin" / "horovodrun"), "-np", "2", "python",
                 "uses_horovod.py"], scripts, [installed_alias, real_horovod])
    assert done.returncode == 2 and refused in done.stderr, done.stdout + done.stderr
    assert "rank 0 of 2" not in done.stdout
    # Alias first on the path: its `horovod` refuses to import over Horovod's metadata.
    done = _run([sys.executable, "-c", "import horovod"], scripts,
                [installed_alias, real_horovod])
    assert done.returncode != 0 and "HorovodInstalledError" in done.stderr, done.stderr
    # Real Horovod first on the path: it is the one imported.
    done = _run([sys.executable, "-c", "import horovod"], scripts,
                [real_horovod, installed_alias])
    assert done.returncode == 0 and "the real Horovod was imported" in done.stdout, done.stderr


def test_usage_errors(scripts, capsys):
    from hvdcompat.horovod_alias.__main__ import main

    assert main([]) == 2
    assert main(["-m"]) == 2
    assert main([str(scripts / "missing.py")]) == 2
    err = capsys.readouterr().err
    assert "usage: python -m hvdcompat.horovod_alias" in err
    assert "-m needs a module name" in err and "missing.py' does not exist" in err


# ---------------------------------------------------------------- in this process

@pytest.fixture
def alias():
    """The alias installed in this process, and removed again afterwards."""
    from hvdcompat import horovod_alias

    before = list(sys.meta_path)
    horovod_alias.install()
    yield horovod_alias
    sys.meta_path[:] = before
    for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
        del sys.modules[name]


def test_names_served_and_what_is_not(alias):
    import hvdcompat
    import horovod
    import horovod.torch as hvd
    import horovod.torch.elastic as elastic

    assert alias.is_active() and horovod.__hvdcompat_alias__
    assert set(hvd.__all__) == set(hvdcompat.__all__)
    assert hvd.DistributedOptimizer is hvdcompat.DistributedOptimizer
    assert hvd.elastic is elastic
    namespace = {}
    exec("from horovod.torch import *", namespace)
    assert namespace["allreduce"] is hvdcompat.allreduce
    from horovod.runner import run

    assert run is hvdcompat.run
    with pytest.raises(ModuleNotFoundError, match="horovod.tensorflow.*PyTorch only"):
        import horovod.tensorflow  # noqa: F401
    with pytest.raises(AttributeError, match="hvdcompat does not provide it"):
        hvd.no_such_function


def test_elastic_is_importable_and_says_so_when_used(alias):
    import importlib.util

    import horovod.torch.elastic as elastic

    if importlib.util.find_spec("hvdcompat.elastic") is not None:  # then the alias serves it
        assert elastic is sys.modules["hvdcompat.elastic"]
        return
    with pytest.raises(NotImplementedError, match="elastic training is not available"):
        elastic.run
    with pytest.raises(NotImplementedError, match="TorchState"):
        from horovod.torch.elastic import TorchState  # noqa: F401
