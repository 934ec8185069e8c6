"""Behaviour before hvd.init(), checked in a fresh interpreter (no MPI started)."""

import subprocess
import sys
import textwrap

from harness import mpi_env


def _run(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=mpi_env(), timeout=120)


# The truth for this machine, found without hvdcompat: the NCCL version when a
# CUDA runtime and an NCCL load (from the nvidia wheels, torch/lib or the
# loader's path), else 0.
_PROBE = """
        import ctypes, glob, importlib.util, os
        def _dirs(name):
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                return []
            return list(spec.submodule_search_locations or []) if spec else []
        def _load(components, pattern, soname):
            cands = [f for c in components for d in _dirs(c)
                     for f in sorted(glob.glob(os.path.join(d, "lib", pattern)))]
            for c in cands + [soname]:
                try:
                    return ctypes.CDLL(c)
                except OSError:
                    pass
            return None
        def loadable_nccl_version():
            cudart = _load(["nvidia.cuda_runtime", "nvidia.cu13", "torch"], "libcudart*.so*",
                           "libcudart.so")
            nccl = _load(["nvidia.nccl", "torch"], "libnccl*.so*", "libnccl.so.2")
            if cudart is None or nccl is None:
                return 0
            v = ctypes.c_int(0)
            return v.value if nccl.ncclGetVersion(ctypes.byref(v)) == 0 else 0
"""


def test_topology_before_init_raises_horovods_value_error():
    r = _run(_PROBE + """
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
        # build probes work before init; nccl_built() is the version of the NCCL
        # this machine can load (torch's CUDA wheels bring one), else 0
        want = loadable_nccl_version()
        assert hvd.mpi_built() and hvd.nccl_built() == want, (hvd.nccl_built(), want)
        assert hvd.gloo_built() is bool(getattr(hvd.basics._core, 'gloo_built', lambda: False)())
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


def test_open_mpi_yields_while_waiting_unless_the_user_says_otherwise():
    code = """
        import os
        import hvdcompat as hvd
        print(os.environ.get('OMPI_MCA_mpi_yield_when_idle'))
    """
    r = _run(code)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stdout + r.stderr
    env = dict(mpi_env(), OMPI_MCA_mpi_yield_when_idle="0")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stdout + r.stderr
