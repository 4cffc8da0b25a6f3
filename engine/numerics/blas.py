"""One BLAS thread for the comparison engine.

The metric pass calls BLAS only for dot products of cache-sized blocks, and spreads work over
cores with processes (``--jobs``). numpy's OpenBLAS starts one spinning thread per core by
default: each dot product then wakes threads that compete with the other compare processes for
the same cores. Measured on 2 cores (case (a) of ``tests/bench/bench_compare.py``): ``--jobs 0``
took 2.6-17 s instead of 0.6 s, ``--jobs 1`` 1.0-1.2 s with 1.4-1.9 s of CPU instead of 0.85 s.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_SETTERS = (
    "scipy_openblas_set_num_threads64_",  # numpy >= 2 wheels (scipy-openblas, ILP64)
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",  # numpy 1.2x wheels
    "openblas_set_num_threads",
)
_GETTERS = tuple(name.replace("set_num", "get_num") for name in _SETTERS)


def env_before_numpy() -> None:
    """For a process that is about to import numpy and starts no user program (``layerwatch
    compare``): BLAS thread variables default to 1 (an explicit user setting is kept)."""
    if "numpy" not in sys.modules:
        for name in _VARS:
            os.environ.setdefault(name, "1")


def limit_blas_threads() -> bool:
    """Ask the OpenBLAS bundled with an imported numpy for one thread (process-local, nothing
    inherited by subprocesses). False when there is no such library (MKL, Accelerate, a
    system BLAS: left as they are)."""
    for lib in _openblas():
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter.restype = None
                setter(1)
                return True
    return False


def blas_threads() -> int | None:
    """The bundled OpenBLAS' thread count, or ``None`` when there is none to ask."""
    for lib in _openblas():
        for name in _GETTERS:
            getter = getattr(lib, name, None)
            if getter is not None:
                getter.restype = ctypes.c_int
                return int(getter())
    return None


def _openblas() -> list[ctypes.CDLL]:
    numpy = sys.modules.get("numpy")
    if numpy is None or numpy.__file__ is None or not sys.platform.startswith("linux"):
        return []
    base = os.path.dirname(os.path.dirname(numpy.__file__))
    out = []
    for path in sorted(glob.glob(os.path.join(base, "numpy.libs", "*openblas*.so*"))):
        try:
            out.append(ctypes.CDLL(path))  # already loaded by numpy: the same handle
        except OSError:
            continue
    return out
