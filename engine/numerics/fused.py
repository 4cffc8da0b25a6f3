"""Every pair metric in one compiled pass over the two arrays, when it pays.

The numpy path of :class:`~.metrics.MetricAccumulator` makes ~16 passes over cache-sized
float64 copies of each block. Here one loop (``fused_kernel``, written for numba) reads each
golden/target element once, widens it to float64 in a register and updates every sum at once:
‖g‖², ‖t‖², g·t, ‖t−g‖², Σ|d|, max|d|, Σ rel, max rel, the thousandth counters, NaN/Inf counts and
position mismatches, exact matches and both sides' statistics. The definitions stay in
:mod:`.metrics`: this module only fills the accumulator's sums.

Start-up cost. Importing numba and loading its cached machine code costs ~0.3 s per process
(numba's type registries, even for a cache hit) — as much as the kernel saves on a 500 MB
compare. So numba is used only to *build* the kernel: one C entry point per (golden, target)
dtype pair, compiled once (~3 s) and written as object code to :func:`cache_dir` — and, where
:func:`can_link`, linked into a shared library beside it. Every later process loads the library
with ctypes (~3 ms, no llvmlite import), else the object code with llvmlite alone (~35 ms, no
numba import), and calls it through ctypes (which also releases the GIL). A process takes the
kernel only for a compare of
at least :data:`MIN_ELEMS` elements (:func:`kernel_for`); then every later pair uses it, but
for the smallest (``segments.KERNEL_FROM``). ``LAYERWATCH_NO_NUMBA=1``, a missing numba/llvmlite or a failed build keeps
the numpy path, which gives the same metrics (``tests/engine/numerics/test_fused.py``).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

MIN_ELEMS = 1 << 24
"""Element pairs a process must be about to measure before it loads the kernel. Measured: the
load costs ~35 ms through llvmlite (its import and the object code), the kernel saves ~2 ns per
element pair over the numpy path (fp32/bf16: 1.4 vs 3.5 ns end to end), so it pays from
~1.7·10⁷ elements (a 100 MB fp32/bf16 compare). The linked library's ~3 ms would pay from
fewer; the threshold stays, so no compare changes path (and last digits) with the linker."""

# Columns of the float totals.
F_GG, F_TT, F_GT, F_DD, F_SUM_ABS, F_MAX_ABS, F_SUM_REL, F_MAX_REL = range(8)
F_G_HIGH, F_G_LOW, F_G_SUM, F_G_SQ, F_T_HIGH, F_T_LOW, F_T_SUM, F_T_SQ = range(8, 16)
N_FLOAT = 16
# Columns of the integer totals.
I_FINITE, I_C1, I_C5, I_NAN_G, I_NAN_T, I_INF_G, I_INF_T, I_MISMATCH, I_EQUAL = range(9)
I_G_COUNT, I_T_COUNT = 9, 10
N_INT = 11
GOLDEN_SIDE = (F_G_HIGH, F_G_LOW, F_G_SUM, F_G_SQ)
TARGET_SIDE = (F_T_HIGH, F_T_LOW, F_T_SUM, F_T_SQ)

KIND_PLAIN, KIND_BF16, KIND_FP16 = 0, 1, 2
"""How a uint16 operand is read (mirrors ``fused_kernel``, which must not be imported here)."""
SUB = 4096
WORK = 5 * SUB + 1
"""Block size and scratch size of ``fused_kernel`` (mirrored: importing it imports numba)."""

DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "float64",
        "float32",
        "uint16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "uint32",
    )
)
"""Operand dtypes the kernel is built for (bf16/fp16 travel as uint16 bits, bool as uint8);
anything else stays on the numpy path. (dtype objects: ``dtype.name`` costs ~10 µs a call.)"""

_ENTRY = ctypes.CFUNCTYPE(
    None,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_double,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
)


def _log() -> Any:
    """This module's logger; ``logging`` is imported only when something is logged (it and its
    imports cost ~3 ms of every compare's start-up)."""
    import logging

    return logging.getLogger(__name__)


_LOCK = threading.RLock()
_STATE: dict[str, Any] = {"kernel": None, "failed": False, "seen": 0}
_ALIVE: list[Kernel] = []
"""Every kernel loaded, kept for the life of the process: its machine code must outlive any
function pointer handed out (and LLVM's engines are not torn down while Python exits)."""


def disabled() -> bool:
    """``LAYERWATCH_NO_NUMBA`` set (the tests use it to hold both paths to each other)."""
    return bool(os.environ.get("LAYERWATCH_NO_NUMBA"))


def loaded() -> bool:
    """True when this process has the kernel already (then it costs nothing more to use)."""
    return _STATE["kernel"] is not None and not disabled()


def _loads_at(total: int) -> bool:
    """The one load rule: ``total`` elements counted load the kernel, unless it is disabled,
    already loaded or failed to load."""
    if disabled() or _STATE["kernel"] is not None or _STATE["failed"]:
        return False
    return total >= MIN_ELEMS


def unchanged_by(elems: int) -> bool:
    """Whether counting ``elems`` more elements (:func:`kernel_for` ``running``) leaves this
    process's kernel as it is (forked children never see a kernel loaded after their fork)."""
    return not _loads_at(_STATE["seen"] + elems)


def kernel_for(elems: int, *, running: bool = False) -> Kernel | None:
    """The kernel when it is loaded or ``elems`` make loading it worth while, else ``None``.
    ``running``: count ``elems`` towards this process's total (a live session's many small
    batches add up: the kernel is loaded once they reach :data:`MIN_ELEMS`)."""
    if disabled():
        return None
    kernel = _STATE["kernel"]
    if kernel is not None:
        return kernel
    if running:
        _STATE["seen"] += elems
        elems = _STATE["seen"]
    return load() if _loads_at(elems) else None


def load() -> Kernel | None:
    """The kernel (llvmlite's JIT engine; entry points are loaded per dtype pair on first use),
    or ``None`` when llvmlite is missing or broken."""
    with _LOCK:
        if _STATE["kernel"] is None and not _STATE["failed"]:
            try:
                kernel = Kernel()
                _ALIVE.append(kernel)
                _STATE["kernel"] = kernel
            except Exception as exc:  # llvmlite missing, or an LLVM/platform problem
                _log().info("compiled metric kernel unavailable, numpy path: %s", exc)
                _STATE["failed"] = True
        return _STATE["kernel"]


def cache_dir() -> Path:
    """Where built entry points are kept: ``LAYERWATCH_CACHE_DIR``, else the user's cache
    directory (``XDG_CACHE_HOME`` or ``~/.cache``), ``layerwatch/kernels``."""
    explicit = os.environ.get("LAYERWATCH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "layerwatch" / "kernels"


def host_cpu() -> str:
    """The CPU the object code is built for, part of its cache key. Linux: the first
    processor's identity and feature flags from ``/proc/cpuinfo`` (no llvmlite import: a
    process that finds a linked library never loads LLVM); elsewhere llvmlite's host CPU name
    and features."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                head = fh.read(1 << 16).split("\n\n", 1)[0]
        except OSError:
            head = ""
        wanted = {"vendor_id", "cpu family", "model", "model name", "flags", "features"}
        wanted |= {"cpu implementer", "cpu architecture", "cpu variant", "cpu part", "isa"}
        lines = [
            line.strip()
            for line in head.splitlines()
            if line.split(":", 1)[0].strip().lower() in wanted
        ]
        if lines:
            return "\n".join(lines)
    llvm = _llvm_binding()
    return f"{llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}"


def _llvm_binding() -> Any:
    """llvmlite's binding, initialised (imported only to load or build object code)."""
    import llvmlite.binding as llvm

    if hasattr(llvm, "initialize_native_target"):
        try:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
        except Exception:  # newer llvmlite initialises itself and may refuse
            pass
    return llvm


def can_link() -> bool:
    """Whether built entry points are also linked into a shared library (Linux with the
    system linker ``ld``): a later process then loads it with ``ctypes`` in ~1 ms instead of
    importing llvmlite (~25 ms) and running its MCJIT."""
    import shutil

    return sys.platform.startswith("linux") and shutil.which("ld") is not None


class Kernel:
    """The loaded entry points, one per (golden, target) dtype pair, built on first need."""

    def __init__(self) -> None:
        import zlib  # not hashlib: its OpenSSL import alone cost 2.5–6 ms of every compare
        from importlib.util import find_spec

        if find_spec("llvmlite") is None:  # no numba either: nothing can be built or loaded
            raise ImportError("llvmlite is not installed")
        source = Path(__file__).with_name("fused_kernel.py").read_bytes()
        machine = (host_cpu() + sys.version).encode()
        self._key = f"{zlib.crc32(source):08x}{zlib.crc32(machine):08x}"
        self._entries: dict[tuple[np.dtype, np.dtype], Any] = {}
        self._engines: list[Any] = []
        """One JIT engine or loaded library per entry point (each object repeats numba's
        helper symbols)."""
        self._llvm: Any = None
        self._work = threading.local()

    def entry(self, golden: np.dtype, target: np.dtype) -> Any:
        """The ctypes function for this dtype pair (loaded, or built and cached, once), or
        ``None`` when it cannot be built (no numba): that pair takes the numpy path."""
        pair = (golden, target)
        if pair in self._entries:
            return self._entries[pair]
        with _LOCK:
            if pair not in self._entries:
                names = (golden.name, target.name)
                try:
                    self._entries[pair] = self._load(*names)
                except Exception as exc:  # numba missing, a compile or LLVM failure
                    _log().info("no compiled kernel for %s/%s, numpy path: %s", *names, exc)
                    self._entries[pair] = None
            return self._entries[pair]

    def _load(self, golden: str, target: str) -> Any:
        path = cache_dir() / f"fused-{golden}-{target}-{self._key}.o"
        meta = path.with_suffix(".json")
        shared = path.with_suffix(".so")
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            info = None
        if info is not None and shared.exists():
            try:
                library = ctypes.CDLL(str(shared))
                address = ctypes.cast(getattr(library, info["symbol"]), ctypes.c_void_p).value
                if not address:
                    raise AttributeError(f"entry point {info['symbol']} not found")
                self._engines.append(library)
                return _ENTRY(address)
            except (OSError, AttributeError) as exc:  # a foreign or damaged file: object code
                _log().info("cannot load %s (%s); loading the object code", shared, exc)
        if self._llvm is None:
            self._llvm = _llvm_binding()
        try:
            if info is None:
                raise OSError("no entry point kept")
            obj = path.read_bytes()
        except OSError:
            info, obj = self._build(golden, target, path, meta)
        for name in info["undefined"]:
            address = self._address_of(name)
            self._llvm.add_symbol(name, address)
            if name.startswith("_"):  # Mach-O prefixes C names: offer the plain one too
                self._llvm.add_symbol(name[1:], address)
        # an engine owns its target machine: one each (a shared one is freed twice)
        machine = self._llvm.Target.from_default_triple().create_target_machine()
        engine = self._llvm.create_mcjit_compiler(self._llvm.parse_assembly(""), machine)
        engine.add_object_file(self._llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        self._engines.append(engine)
        address = engine.get_function_address(info["symbol"])
        if not address:
            raise RuntimeError(f"entry point {info['symbol']} not found in {path}")
        return _ENTRY(address)

    @staticmethod
    def _build(golden: str, target: str, path: Path, meta: Path) -> tuple[dict[str, Any], bytes]:
        """Compile with numba (once per install, ~3 s) and keep the object code if we can;
        where :func:`can_link`, also a shared library of it for later processes."""
        import tempfile

        from layerwatch.engine.numerics import fused_kernel

        _log().info("building the metric kernel for %s/%s (once)", golden, target)
        built = fused_kernel.build(golden, target, pic=can_link())
        info = {"symbol": built.symbol, "undefined": built.undefined}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for dest, data in ((path, built.obj), (meta, json.dumps(info).encode())):
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, dest)
            if built.pic is not None:
                fused_kernel.link(built, path.with_suffix(".so"))
        except (OSError, RuntimeError) as exc:  # a read-only cache, no working linker
            _log().info("cannot keep the metric kernel in %s: %s", path.parent, exc)
        return info, built.obj

    def _address_of(self, name: str) -> int:
        """The Python C API's own symbols; numba's runtime helpers, which only error paths
        reach (the kernel allocates nothing and raises nothing), get a harmless stub."""
        if name.lstrip("_").startswith("Py"):
            for candidate in (name, name[1:]):
                try:
                    function = getattr(ctypes.pythonapi, candidate)
                    return int(ctypes.cast(function, ctypes.c_void_p).value or 0)
                except (AttributeError, TypeError):
                    continue
        return int(ctypes.cast(_STUB, ctypes.c_void_p).value or 0)

    def work(self) -> int:
        """The address of this thread's scratch buffer."""
        held = getattr(self._work, "held", None)
        if held is None:
            buf = np.empty(WORK)
            held = self._work.held = (buf, buf.ctypes.data)
        return int(held[1])

    def __call__(
        self,
        g: np.ndarray,
        t: np.ndarray,
        kinds: tuple[int, int],
        floor: float,
        exact: bool,
        sides: bool,
        totals: Totals,
    ) -> bool:
        """Add the sums of ``g``/``t`` to ``totals``; False when this dtype pair has no entry."""
        fn = self.entry(g.dtype, t.dtype)
        if fn is None:
            return False
        fn(
            g.ctypes.data,
            t.ctypes.data,
            g.size,
            kinds[0],
            kinds[1],
            floor,
            int(exact),
            int(sides),
            totals.f_address,
            totals.k_address,
            self.work(),
        )
        return True


_STUB = ctypes.CFUNCTYPE(ctypes.c_int64)(lambda: 0)
"""What numba's runtime helpers resolve to in a process without numba (never called)."""


class Totals:
    """The kernel's running sums of one pair: ``f`` (float64 columns ``F_*``) and ``k`` (int64
    columns ``I_*``), with their addresses taken once (``ndarray.ctypes`` costs µs a call)."""

    __slots__ = ("f", "f_address", "k", "k_address")

    def __init__(self) -> None:
        self.f = _EMPTY_F.copy()
        self.k = np.zeros(N_INT, np.int64)
        self.f_address = int(self.f.ctypes.data)
        self.k_address = int(self.k.ctypes.data)


_EMPTY_F = np.zeros(N_FLOAT)
_EMPTY_F[[F_G_HIGH, F_T_HIGH]] = -np.inf
_EMPTY_F[[F_G_LOW, F_T_LOW]] = np.inf


def new_totals() -> Totals:
    """Zeroed running totals (side maxima/minima at ∓inf)."""
    return Totals()


def operand(a: np.ndarray, kind: int) -> tuple[np.ndarray, int] | None:
    """What the kernel reads, and how: fp16 as its bits, bool as uint8, a genuine uint16 as
    int32 (uint16 means bits to the kernel); ``None`` for a dtype it is not built for."""
    if a.dtype == np.float16:
        return np.ascontiguousarray(a).view(np.uint16), KIND_FP16
    if a.dtype == np.bool_:
        return np.ascontiguousarray(a).view(np.uint8), KIND_PLAIN
    if a.dtype == np.uint16 and kind == KIND_PLAIN:
        return a.astype(np.int32), KIND_PLAIN
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype not in DTYPES:
        return None
    return np.ascontiguousarray(a), kind


def measure(
    kernel: Kernel,
    golden: np.ndarray,
    target: np.ndarray,
    totals: Totals,
    *,
    kinds: tuple[int, int],
    floor: float,
    exact: bool,
    sides: bool,
) -> bool:
    """Add the sums of one 1-D chunk pair to ``totals`` (:func:`new_totals`); False (nothing
    added) when a dtype is not one the kernel is built for."""
    g = operand(golden, kinds[0])
    t = operand(target, kinds[1])
    if g is None or t is None:
        return False
    return kernel(g[0], t[0], (g[1], t[1]), float(floor), exact, sides, totals)


def decode_bf16(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bits (exact: the top half of a float32), for the numpy path."""
    return np.left_shift(bits, 16, dtype=np.uint32).view(np.float32)
