"""What the allreduce benchmarks share (examples/allreduce_benchmark.py and its cluster rows).

Imports neither hvdcompat nor Horovod, so a job of either can use it.
"""

import statistics
import time


def parse_size(text):
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "B": 1}
    t = text.strip().upper()
    for u, f in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * f)
    return int(t)


def human(n):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n} B"


def resnet50_shapes():
    """Parameter shapes of torchvision's ResNet-50 (161 tensors, 25,557,032 floats)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,),
                       (planes, planes, 3, 3), (planes,), (planes,),
                       (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    shapes += [(1000, 2048), (1000,)]
    return shapes


def timeit(fn, iters, warmup, barrier):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
