"""Behaviour before hvd.init(), checked in a fresh interpreter (no MPI started)."""

import subprocess
import sys
import textwrap

from harness import mpi_env


def _run(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=mpi_env(), timeout=120)


def test_topology_before_init_raises_horovods_value_error():
    r = _run("""
        import hvdcompat as hvd
        for fn in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank,
                   hvd.cross_size, hvd.mpi_threads_supported):
            try:
                fn()
            except ValueError as e:
                assert str(e) == 'Horovod has not been initialized; use hvd.init().', str(e)
            else:
                raise SystemExit(fn.__name__ + ' did not raise')
        assert not hvd.is_initialized()
        # build probes work before init
        assert hvd.mpi_built() and not hvd.gloo_built() and hvd.nccl_built() == 0
        print('ok')
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_import_order_with_torch_does_not_matter():
    for code in ("import hvdcompat, torch", "import torch, hvdcompat"):
        r = _run(code + "; print('ok')")
        assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_core_does_not_link_torch():
    import glob
    import os

    import hvdcompat

    so = glob.glob(os.path.join(os.path.dirname(hvdcompat.__file__), "_core*.so"))
    assert so, "extension not built"
    out = subprocess.run(["ldd", so[0]], capture_output=True, text=True).stdout
    libs = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert any(lib.startswith("libmpi") for lib in libs), out
    assert not [lib for lib in libs if "torch" in lib or lib.startswith("libc10")], out


def test_import_leaves_mpis_own_settings_alone():
    # The engine waits with its own policy; nothing is exported for MPI at import.
    code = """
        import os
        import hvdcompat as hvd
        print(os.environ.get('OMPI_MCA_mpi_yield_when_idle'))
    """
    env = {k: v for k, v in mpi_env().items() if k != "OMPI_MCA_mpi_yield_when_idle"}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stdout + r.stderr
