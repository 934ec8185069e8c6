"""The GPU libraries' loader, the *_built() queries and the torch layer's CUDA checks.

Each case runs in a fresh interpreter: the core loads the GPU libraries once
per process. CUDA tensors are simulated on CPU-only torch with a Tensor
subclass reporting a CUDA device; with the fake library
(tests/gpu_fake) its host memory serves as device memory.
"""

import subprocess
import sys
import textwrap

import core_testing
from harness import mpi_env

MISSING = "/nonexistent/hvdcompat-test/libnccl.so.2"

# Simulates a CUDA tensor on CPU-only torch: the torch layer only reads
# .device, .data_ptr() and the metadata.
FAKE_CUDA = """
import torch
def on_cuda(t, index=0):
    class CudaLike(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda", index)
    return t.as_subclass(CudaLike)
"""


def _run(code, **env):
    full = mpi_env()
    for var in ("HVDCOMPAT_NCCL_LIB", "HVDCOMPAT_CUDART_LIB", "HOROVOD_GPU_OPERATIONS",
                "HVDCOMPAT_GPU_OPERATIONS"):
        full.pop(var, None)
    full.update({k: str(v) for k, v in env.items()})
    if "T.load_gpu_libraries" in code:
        code = core_testing.loader_code("T") + textwrap.dedent(code)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=full, timeout=180)
    assert r.returncode == 0 and "ok" in r.stdout.split(), r.stdout + r.stderr
    return r.stdout


def test_missing_cuda_runtime_names_the_variable_and_path():
    _run("""
        from hvdcompat.basics import _core
        info = T.load_gpu_libraries()
        err = info["cuda_error"]
        assert not info["cuda_loaded"] and not info["nccl_loaded"], info
        assert "HVDCOMPAT_CUDART_LIB=/nonexistent/libcudart.so.12" in err, err
        assert "cannot open shared object file" in err, err
        assert "unset it to search the usual places" in err, err
        assert "CUDA runtime is missing" in info["nccl_error"], info
        print("ok")
    """, HVDCOMPAT_CUDART_LIB="/nonexistent/libcudart.so.12")


def test_nccl_lib_pointing_at_a_bad_file_names_it(fake_gpu_lib, tmp_path):
    bad = tmp_path / "libnccl.so.2"
    bad.write_text("not a shared library\n")
    _run(f"""
        from hvdcompat.basics import _core
        info = T.load_gpu_libraries()
        err = info["nccl_error"]
        assert info["cuda_loaded"] and not info["nccl_loaded"], info
        assert "NCCL (libnccl) could not be loaded from HVDCOMPAT_NCCL_LIB={bad}" in err, err
        assert "{bad}" in err.splitlines()[1], err
        print("ok")
    """, HVDCOMPAT_CUDART_LIB=fake_gpu_lib, HVDCOMPAT_NCCL_LIB=str(bad))


def test_a_library_without_the_symbols_is_rejected_by_name(fake_gpu_lib):
    # The C math library loads fine but is no NCCL.
    _run("""
        import ctypes.util
        from hvdcompat.basics import _core
        info = T.load_gpu_libraries()
        err = info["nccl_error"]
        assert not info["nccl_loaded"], info
        assert "lacks the symbol ncclGetVersion" in err, err
        print("ok")
    """, HVDCOMPAT_CUDART_LIB=fake_gpu_lib, HVDCOMPAT_NCCL_LIB="libm.so.6")


def test_no_nccl_found_lists_where_it_looked(fake_gpu_lib):
    _run(f"""
        from hvdcompat.basics import _core
        info = T.load_gpu_libraries([], ["{MISSING}"])
        if info["nccl_loaded"]:
            print("ok")  # this machine has an NCCL the system loader finds
            raise SystemExit(0)
        err = info["nccl_error"]
        assert "NCCL (libnccl) was not found. Looked in:" in err, err
        assert "{MISSING}" in err and "libnccl.so.2 (already loaded in this process)" in err, err
        assert "HVDCOMPAT_NCCL_LIB=/path/to/libnccl.so.2" in err, err
        print("ok")
    """, HVDCOMPAT_CUDART_LIB=fake_gpu_lib)


def test_built_queries_without_nccl_and_cpu_ops_still_work():
    _run("""
        import torch
        import hvdcompat as hvd
        assert hvd.nccl_built() == 0
        assert hvd.cuda_built() is False
        hvd.init()
        assert hvd.nccl_built() == 0 and hvd.cuda_built() is False
        out = hvd.allreduce(torch.ones(3), op=hvd.Sum)
        assert out.tolist() == [1.0, 1.0, 1.0]
        hvd.shutdown()
        print("ok")
    """, HVDCOMPAT_NCCL_LIB=MISSING)


def test_mpi_staging_needs_a_runtime_and_a_device():
    out = _run("""
        import hvdcompat as hvd
        from hvdcompat import _gpu
        assert hvd.cuda_built() is False
        print(_gpu.unavailable_reason())
        print("ok")
    """, HOROVOD_GPU_OPERATIONS="MPI", HVDCOMPAT_CUDART_LIB="/nonexistent/libcudart.so.12")
    assert "HVDCOMPAT_CUDART_LIB" in out


def test_built_queries_with_a_loadable_gpu_stack(fake_gpu_lib):
    _run("""
        import hvdcompat as hvd
        from hvdcompat import _gpu
        assert hvd.nccl_built() == 21805, hvd.nccl_built()
        assert hvd.cuda_built() is True
        info = _gpu.library_info()
        assert info["nccl_version_string"] == "2.18.5", info
        print("ok")
    """, HVDCOMPAT_CUDART_LIB=fake_gpu_lib, HVDCOMPAT_NCCL_LIB=fake_gpu_lib)
    # Under HOROVOD_GPU_OPERATIONS=MPI (GLOO is the same setting) the CUDA runtime alone is enough.
    _run("""
        import hvdcompat as hvd
        assert hvd.nccl_built() == 0 and hvd.cuda_built() is True
        print("ok")
    """, HVDCOMPAT_CUDART_LIB=fake_gpu_lib, HVDCOMPAT_NCCL_LIB=MISSING,
         HOROVOD_GPU_OPERATIONS="GLOO")


def test_cuda_tensor_without_nccl_is_a_clear_value_error():
    _run(FAKE_CUDA + """
import hvdcompat as hvd

def expect(fn):
    try:
        fn()
    except ValueError as e:
        msg = str(e)
        assert "got a CUDA tensor (cuda:0)" in msg, msg
        assert "cannot run collectives on CUDA tensors on this machine" in msg, msg
        assert "HVDCOMPAT_NCCL_LIB" in msg and "HOROVOD_GPU_OPERATIONS=MPI" in msg, msg
        return msg
    raise AssertionError("no error for a CUDA tensor")

t = on_cuda(torch.ones(4))
msg = expect(lambda: hvd.allreduce_(t, name="w"))
assert "allreduce 'w'" in msg, msg
hvd.init()
msg = expect(lambda: hvd.allgather_async(t, name="g"))
assert "allgather 'g' on rank 0" in msg, msg
expect(lambda: hvd.broadcast_(t, 0))
hvd.shutdown()
print("ok")
""", HVDCOMPAT_NCCL_LIB=MISSING)


def test_torch_layer_passes_streams_and_checks_the_device(fake_gpu_lib, tmp_path):
    _run(FAKE_CUDA + """
import ctypes, os
import hvdcompat as hvd
from hvdcompat import _gpu
from hvdcompat.basics import _core
from hvdcompat.ops import handles

streams = {0: 0x1000, 1: 0x1001}
_gpu.current_stream = lambda device: streams[device]
waited = []
real_wait = _core.wait
def wait(handle, stream=None):
    waited.append(stream)
    return real_wait(handle, stream)
_core.wait = wait
fake = ctypes.CDLL(os.environ["HVDCOMPAT_NCCL_LIB"])
def stat(i):
    buf = (ctypes.c_long * 32)()
    fake.fake_gpu_stats(buf, 32)
    return buf[i]
STREAM_WAITS = 7

hvd.init()
t = on_cuda(torch.arange(6, dtype=torch.float32))
before = stat(STREAM_WAITS)
hvd.allreduce_(t, name="x", op=hvd.Sum)
assert torch.equal(t.as_subclass(torch.Tensor), torch.arange(6, dtype=torch.float32)), t
assert waited == [0x1000], waited  # the consumer's stream reached the core
assert stat(STREAM_WAITS) >= before + 2, "producer and consumer stream waits missing"
grouped = [on_cuda(torch.full((3,), 2.0)), on_cuda(torch.full((5,), 3.0))]
hvd.grouped_allreduce_(grouped, name="g", op=hvd.Average)
assert [float(x.as_subclass(torch.Tensor).sum()) for x in grouped] == [6.0, 15.0]
try:
    hvd.allreduce_(on_cuda(torch.ones(2), 1), name="y")
except ValueError as e:
    assert "expected a tensor on cuda:0, got cuda:1" in str(e), str(e)
else:
    raise AssertionError("a tensor on another GPU was accepted")
assert hvd.join(device=0) == 0
hvd.shutdown()
print("ok")
""", HVDCOMPAT_CUDART_LIB=fake_gpu_lib, HVDCOMPAT_NCCL_LIB=fake_gpu_lib,
         FAKE_NCCL_DIR=str(tmp_path))


def test_gpu_operations_is_read_at_init():
    _run("""
        import os
        import hvdcompat as hvd
        from hvdcompat.basics import _core
        for value, expected in (("nccl", "NCCL"), ("MPI", "MPI"), ("gloo", "MPI"), ("", "NCCL")):
            os.environ["HOROVOD_GPU_OPERATIONS"] = value
            hvd.init()
            assert _core.config()["gpu_operations"] == expected, (value, _core.config())
            hvd.shutdown()
        os.environ["HOROVOD_GPU_OPERATIONS"] = "NCCCL"
        try:
            hvd.init()
        except ValueError as e:
            assert "HOROVOD_GPU_OPERATIONS=NCCCL is not valid: expected NCCL, MPI or GLOO" in str(e), e
        else:
            raise AssertionError("accepted")
        print("ok")
    """)
