"""Calls hvdcompat._core with bad arguments, one rank (MPI singleton), and prints what it raised.

tests/unit/test_core_rules.py runs it once and checks each case. Only the
core is called (no torch, no Python-layer checks): a rule that is not the
core's own raises nothing here.
"""

import ctypes
import json
import sys

from hvdcompat import _core

DT, OPS, RED = _core.DTYPES, _core.OPS, _core.REDUCE_OPS
_keep = []


def buf(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    mem = (ctypes.c_uint8 * max(8 * n, 8))()
    _keep.append(mem)
    return _core.Buffer(ctypes.addressof(mem), DT[dtype], list(shape))


def enqueue(op, name, inputs, process_set=0, reduce_op="Sum", splits=()):
    outs = inputs if op == "allreduce" else []
    return _core.enqueue(_core.EnqueueArgs(OPS[op], name, process_set=process_set,
                                           reduce_op=RED[reduce_op], inputs=inputs,
                                           outputs=outs, splits=list(splits)))


def outcome(call):
    try:
        value = call()
    except Exception as e:  # noqa: BLE001 - reported to the test
        kinds = [k.__name__ for k in (ValueError, TypeError, NotImplementedError)
                 if isinstance(e, k)]
        return {"raised": type(e).__name__, "kinds": kinds, "message": str(e)}
    return {"returned": value if isinstance(value, (bool, int, list)) else repr(value)}


def done(handle):
    return _core.wait(handle).status == _core.Status.ok


def main():
    results = {}
    _core.init(_core.InitOptions())  # process sets may not change after init
    results["add without dynamic mode"] = outcome(lambda: _core.add_process_set([0]))
    results["remove without dynamic mode"] = outcome(lambda: _core.remove_process_set(0))
    _core.shutdown()
    _core.init(_core.InitOptions(dynamic_process_sets=True))
    results["remove the global set"] = outcome(lambda: _core.remove_process_set(0))
    results["sets after removing the global set"] = outcome(_core.process_set_ids)
    results["member of an unknown set"] = outcome(
        lambda: _core.process_set_member(5, "ProcessSet.rank", ""))
    results["adasum on a process set"] = outcome(
        lambda: enqueue("allreduce", "allreduce.ada", [buf("float32", [4])], process_set=3,
                        reduce_op="Adasum"))
    results["adasum before any tensor"] = outcome(
        lambda: _core.check_reduction("DistributedOptimizer(op=hvd.Adasum)", "", 3,
                                      RED["Adasum"]))
    results["adasum on integers"] = outcome(
        lambda: enqueue("allreduce", "allreduce.ada_int", [buf("int32", [4])],
                        reduce_op="Adasum"))
    results["adasum on the global set"] = outcome(
        lambda: done(enqueue("allreduce", "allreduce.ada_ok", [buf("float32", [4])],
                             reduce_op="Adasum")))
    results["allgather a scalar"] = outcome(
        lambda: enqueue("allgather", "allgather.s", [buf("float32", [])]))
    results["grouped allgather with a scalar"] = outcome(
        lambda: enqueue("allgather", "grouped_allgather.s",
                        [buf("float32", [2]), buf("float32", [])]))
    results["allgather a vector"] = outcome(
        lambda: done(enqueue("allgather", "allgather.v", [buf("float32", [2])])))
    results["alltoall a scalar"] = outcome(
        lambda: enqueue("alltoall", "alltoall.s", [buf("float32", [])]))
    results["alltoall splits per rank"] = outcome(
        lambda: enqueue("alltoall", "alltoall.n", [buf("float32", [2])], splits=[[1, 1]]))
    for op in ("Sum", "Average", "Product"):
        results[f"bool {op}"] = outcome(
            lambda op=op: enqueue("allreduce", f"allreduce.b{op}", [buf("bool", [3])],
                                  reduce_op=op))
    results["bool reducescatter Sum"] = outcome(
        lambda: enqueue("reducescatter", "reducescatter.b", [buf("bool", [3])]))
    for op in ("Min", "Max"):
        results[f"bool {op}"] = outcome(
            lambda op=op: done(enqueue("allreduce", f"allreduce.b{op}", [buf("bool", [3])],
                                       reduce_op=op)))
    _core.finalize()
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
