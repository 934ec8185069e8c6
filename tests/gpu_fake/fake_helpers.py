"""Helpers of tests/gpu_fake/rank_checks.py that need no running engine: the fake's counter
names, host arrays standing in for device tensors, and the DLPack struct of an output."""

import ctypes

import numpy as np

__all__ = ["STAT_NAMES", "make", "values_of", "dltensor"]

STAT_NAMES = [
    "mallocs", "frees", "async_mallocs", "async_frees", "live_device", "host_allocs",
    "host_frees", "stream_waits", "event_records", "events_live", "streams_live", "memcpys",
    "memcpy2ds", "memsets", "allreduces", "broadcasts", "allgathers", "reducescatters", "sends",
    "recvs", "groups", "premulsums", "redop_destroys", "comms_live", "aborts", "misuse",
    "stream_syncs", "avg_ops", "device_syncs", "concurrent_launches", "abort_in_call",
    "unordered_frees", "wrong_device", "use_after_free", "comm_inits", "comm_destroys",
]


def make(values, dtype):
    """A contiguous array of `dtype` holding `values` (bfloat16 as raw uint16)."""
    v = np.asarray(values, dtype=np.float64)
    if dtype == "bfloat16":
        bits = v.astype(np.float32).view(np.uint32)
        return (bits >> 16).astype(np.uint16)
    if dtype == "bool":
        return v != 0
    return v.astype(np.dtype(dtype))


def values_of(arr, dtype):
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def dltensor(capsule):
    """The DLTensor inside a DLPack capsule (the capsule keeps it alive)."""
    return _DLTensor.from_address(_get_pointer(capsule, b"dltensor"))
