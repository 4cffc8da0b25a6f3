"""The compiled loop behind :mod:`.fused` (imported only when a comparison needs it).

A module of its own so that numba's on-disk cache (``cache=True``) finds the functions by their
module-level names, and so that importing :mod:`.fused` never imports numba.

The pair is walked in blocks of :data:`SUB` elements. bf16/fp16 blocks arrive as their uint16
bits and are decoded into a float32 block buffer that stays in L1 (:func:`_block`); every other
dtype is read where it lies. Each block first runs a branch-free loop that assumes every value
is finite (reassociation allowed, so LLVM vectorises it); when its sums come out non-finite the
block holds a NaN/Inf (or a square overflowed) and is measured again element by element,
counting NaN/Inf per side and comparing their positions, as :mod:`.metrics` does. Block sums
are added to the running totals block by block (rounding grows like a blocked sum's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import overload

SUB = 4096
"""Elements per block and partial sum."""

KIND_PLAIN, KIND_BF16, KIND_FP16 = 0, 1, 2
"""How a uint16 operand's bits are read (other dtypes are always plain)."""

_FAST = {"reassoc", "contract", "nsz"}
"""Reassociation (vectorised sums) but no "no NaN/Inf" assumption: the finiteness check in
:func:`_fast_block` must stay true to the values."""
_SIGN_OFF = 0x7FFFFFFFFFFFFFFF


def _block(src, kind, start, stop, buf):  # pragma: no cover - replaced by the overload
    raise NotImplementedError


@overload(_block, jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _block_impl(src, kind, start, stop, buf):  # pragma: no cover - compiled
    """The block ``src[start:stop]`` as something indexable: uint16 bits decoded into ``buf``
    (float32: bf16 and fp16 are exact there), any other dtype a view of ``src``."""
    if isinstance(src.dtype, types.Integer) and src.dtype.bitwidth == 16 and not src.dtype.signed:

        def decode(src, kind, start, stop, buf):
            n = stop - start
            bits = buf.view(np.uint32)
            part = src[start:stop]  # index from 0: no negative-index check, so it vectorises
            if kind == 1:  # bf16: the top half of a float32
                for j in range(n):
                    bits[j] = np.uint32(part[j]) << np.uint32(16)
            else:  # fp16, in two branch-free (vectorised) passes over the block
                for j in range(n):  # normal and Inf/NaN: re-bias the exponent, keep the payload
                    h = np.uint32(part[j])
                    sign = (h & np.uint32(0x8000)) << np.uint32(16)
                    mag = (h & np.uint32(0x7FFF)) << np.uint32(13)
                    special = (h & np.uint32(0x7C00)) == np.uint32(0x7C00)
                    bits[j] = sign | (
                        mag | np.uint32(0x7F800000) if special else mag + np.uint32(0x38000000)
                    )
                for j in range(n):  # zero and subnormal: by value, ±mantissa · 2^-24 (exact)
                    h = np.uint32(part[j])
                    v = np.float32(h & np.uint32(0x3FF)) * np.float32(2.0**-24)
                    v = -v if h & np.uint32(0x8000) else v
                    buf[j] = v if (h & np.uint32(0x7C00)) == np.uint32(0) else buf[j]
            return buf[:n]

        return decode

    def plain(src, kind, start, stop, buf):
        return src[start:stop]

    return plain


@numba.njit(inline="always")
def _key(bits):  # pragma: no cover - compiled
    """Order-preserving int64 key of a float64's bits (and its own inverse): negative values
    get their magnitude bits flipped, so integer order is float order for finite values."""
    return bits ^ ((bits >> 63) & _SIGN_OFF)


@numba.njit(inline="always")
def _float(bits, one):  # pragma: no cover - compiled
    """The float64 whose bits are ``bits`` (through the one-element scratch ``one``)."""
    one.view(np.int64)[0] = bits
    return one[0]


@numba.njit(nogil=True, cache=True)
def _max_min_keys(bits, n):  # pragma: no cover - compiled
    """(max, min) of the keys of ``n`` float64 bit patterns: integer reductions vectorise
    where float max/min (NaN rules) do not."""
    hi = -(1 << 63)
    lo = (1 << 63) - 1
    for i in range(n):
        key = _key(bits[i])
        hi = key if key > hi else hi
        lo = key if key < lo else lo
    return hi, lo


@numba.njit(nogil=True, cache=True)
def _max_pair(a, b, n):  # pragma: no cover - compiled
    """Largest of ``n`` non-negative float64 values in each of two arrays, given as int64 bits
    (for non-negative doubles the bit patterns order like the values)."""
    ha = hb = 0
    for i in range(n):
        va = a[i]
        vb = b[i]
        ha = va if va > ha else ha
        hb = vb if vb > hb else hb
    return ha, hb


@numba.njit(nogil=True, cache=True, fastmath=_FAST, error_model="numpy")
def _fast_sums(gb, tb, floor, sides, rel, ab, xs, ys):  # pragma: no cover - compiled
    """Branch-free sums of one block, assuming every value is finite; |d| and the relative
    errors go to ``ab``/``rel`` (the values to ``xs``/``ys``) for the max/min reductions."""
    gg = tt = gt = dd = sabs = srel = gsum = tsum = c1 = c5 = 0.0
    for j in range(gb.size):
        x = np.float64(gb[j])
        y = np.float64(tb[j])
        d = y - x
        gg += x * x
        tt += y * y
        gt += x * y
        dd += d * d
        ad = abs(d)
        sabs += ad
        r = ad / max(abs(x), floor)
        srel += r
        c1 += 1.0 if r < 1e-3 else 0.0
        c5 += 1.0 if r < 5e-3 else 0.0
        gsum += x
        tsum += y
        rel[j] = r
        ab[j] = ad
        if sides:  # loop-invariant: LLVM unswitches it
            xs[j] = x
            ys[j] = y
    return gg, tt, gt, dd, sabs, srel, gsum, tsum, c1, c5


@numba.njit(nogil=True, cache=True)
def _fast_block(gb, tb, floor, sides, f, k, scratch, one):  # pragma: no cover - compiled
    """All values finite: add the block's sums to ``f``/``k``; False (nothing added) when a
    sum is not finite (a NaN/Inf inside, or a square overflowed)."""
    n = gb.size
    rel, ab, xs, ys = scratch[0], scratch[1], scratch[2], scratch[3]
    gg, tt, gt, dd, sabs, srel, gsum, tsum, c1, c5 = _fast_sums(
        gb, tb, floor, sides, rel, ab, xs, ys
    )
    check = gg + tt + dd + srel + gsum + tsum
    if check - check != 0.0:
        return False
    max_rel, max_abs = _max_pair(rel.view(np.int64), ab.view(np.int64), n)
    f[0] += gg
    f[1] += tt
    f[2] += gt
    f[3] += dd
    f[4] += sabs
    f[5] = max(f[5], _float(max_abs, one))
    f[6] += srel
    f[7] = max(f[7], _float(max_rel, one))
    if sides:
        ghi, glo = _max_min_keys(xs.view(np.int64), n)
        thi, tlo = _max_min_keys(ys.view(np.int64), n)
        f[8] = max(f[8], _float(_key(ghi), one))
        f[9] = min(f[9], _float(_key(glo), one))
        f[12] = max(f[12], _float(_key(thi), one))
        f[13] = min(f[13], _float(_key(tlo), one))
    f[10] += gsum
    f[11] += gg
    f[14] += tsum
    f[15] += tt
    k[0] += n
    k[1] += np.int64(c1)
    k[2] += np.int64(c5)
    k[9] += n
    k[10] += n
    return True


@numba.njit(nogil=True, cache=True)
def _careful_block(gb, tb, floor, f, k):  # pragma: no cover - compiled
    """Element by element: NaN/Inf counted per side and their positions compared."""
    for i in range(gb.size):
        x = np.float64(gb[i])
        y = np.float64(tb[i])
        fx = x - x == 0.0
        fy = y - y == 0.0
        if fx and fy:
            k[0] += 1
            d = y - x
            f[0] += x * x
            f[1] += y * y
            f[2] += x * y
            f[3] += d * d
            ad = abs(d)
            f[4] += ad
            f[5] = max(f[5], ad)
            r = ad / max(abs(x), floor)
            f[6] += r
            f[7] = max(f[7], r)
            k[1] += r < 1e-3
            k[2] += r < 5e-3
        else:
            gnan = x != x
            tnan = y != y
            if gnan:
                k[3] += 1
            elif not fx:
                k[5] += 1
            if tnan:
                k[4] += 1
            elif not fy:
                k[6] += 1
            if fx != fy or (not (gnan and tnan) and x != y):
                k[7] += 1
        if fx:
            k[9] += 1
            f[8] = max(f[8], x)
            f[9] = min(f[9], x)
            f[10] += x
            f[11] += x * x
        if fy:
            k[10] += 1
            f[12] = max(f[12], y)
            f[13] = min(f[13], y)
            f[14] += y
            f[15] += y * y


@numba.njit(nogil=True, cache=True)
def fused(g, t, gk, tk, floor, exact, sides, f, k, work):  # pragma: no cover - compiled
    """Add the sums of the pair ``g``/``t`` (1-D, equal length; uint16 read as ``gk``/``tk``)
    to the running totals ``f``/``k`` (column meanings in :mod:`.fused`). ``work``: WORK float64
    scratch (passed in: the compiled entry points allocate nothing)."""
    scratch = (
        work[0:SUB],
        work[SUB : 2 * SUB],
        work[2 * SUB : 3 * SUB],
        work[3 * SUB : 4 * SUB],
    )
    halves = work[4 * SUB : 5 * SUB].view(np.float32)
    gbuf = halves[:SUB]
    tbuf = halves[SUB:]
    one = work[5 * SUB : 5 * SUB + 1]
    n = g.size
    for start in range(0, n, SUB):
        stop = min(start + SUB, n)
        gb = _block(g, gk, start, stop, gbuf)
        tb = _block(t, tk, start, stop, tbuf)
        if not _fast_block(gb, tb, floor, sides, f, k, scratch, one):
            _careful_block(gb, tb, floor, f, k)
        if exact:
            for i in range(stop - start):
                k[8] += gb[i] == tb[i]


WORK = 5 * SUB + 1
"""float64 elements of the scratch buffer :func:`fused` needs."""

ENTRY_ARGS = ("g", "t", "n", "gk", "tk", "floor", "exact", "sides", "f", "k", "work")
"""The C entry point's parameters: pointers to golden, target; element count; the two uint16
kinds; floor; exact and sides (0/1); pointers to the float totals, int totals, work buffer."""


@dataclass(frozen=True)
class Built:
    """One compiled entry point: its symbol, object code for llvmlite's MCJIT (``obj``), the
    runtime helpers it names (``undefined``) and, when asked, the same module as
    position-independent code for a shared library (``pic``)."""

    symbol: str
    obj: bytes
    undefined: list[str]
    pic: bytes | None = None


def build(golden: str, target: str, *, pic: bool = False) -> Built:
    """Compile the C entry point for one (golden, target) numpy dtype pair."""
    from numba import carray

    gty = numba.from_dtype(np.dtype(golden))
    tty = numba.from_dtype(np.dtype(target))
    ptr = types.CPointer
    sig = types.void(
        ptr(gty),
        ptr(tty),
        types.int64,
        types.int64,
        types.int64,
        types.float64,
        types.int64,
        types.int64,
        ptr(types.float64),
        ptr(types.int64),
        ptr(types.float64),
    )

    def entry(gp, tp, n, gk, tk, floor, exact, sides, fp, kp, wp):  # pragma: no cover
        fused(
            carray(gp, (n,)),
            carray(tp, (n,)),
            gk,
            tk,
            floor,
            exact != 0,
            sides != 0,
            carray(fp, (16,)),
            carray(kp, (11,)),
            carray(wp, (WORK,)),
        )

    compiled = numba.cfunc(sig, error_model="numpy")(entry)
    library = compiled._library  # type: ignore[attr-defined]
    obj = bytes(library.serialize_using_object_code()[2][0])
    shared = _pic_object(library) if pic else None
    return Built(compiled.native_name, obj, _undefined(obj), shared)


def _machine(reloc: str) -> Any:
    """A target machine for this CPU as numba's JIT sets it up, with ``reloc`` relocations."""
    import llvmlite.binding as llvm

    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(),
        features=llvm.get_host_cpu_features().flatten(),
        opt=_opt_level(),
        reloc=reloc,
        codemodel="default",
    )


def _opt_level() -> int:
    """numba's optimisation level (``NUMBA_OPT``, 3 unless set), as its JIT uses it."""
    from numba.core import config

    return int(getattr(config, "OPT", 3))


def _pic_object(library: Any) -> bytes:
    """The optimised module numba finalised, emitted again as position-independent code (the
    same IR, CPU and features: the same arithmetic; ``tests/engine/numerics/test_fused.py``
    holds the two entry points to equal totals)."""
    return bytes(_machine("pic").emit_object(library._final_module))


def link(built: Built, dest: Path) -> None:
    """Link ``built.pic`` into the shared library ``dest`` with the system linker. numba's
    runtime helpers, which only error paths reach (the entry allocates and raises nothing),
    become functions returning 0; the Python C API resolves against the running interpreter."""
    import subprocess
    import tempfile

    import llvmlite.binding as llvm

    assert built.pic is not None
    stubs = [name for name in built.undefined if not name.lstrip("_").startswith("Py")]
    stub_ir = "\n".join(f"define i64 @{name}() {{\n  ret i64 0\n}}" for name in stubs)
    stub_obj = _machine("pic").emit_object(llvm.parse_assembly(stub_ir))
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".tmp-link-") as tmp:
        parts = []
        for name, data in (("kernel.o", built.pic), ("stubs.o", stub_obj)):
            (Path(tmp) / name).write_bytes(data)
            parts.append(str(Path(tmp) / name))
        out = Path(tmp) / "kernel.so"
        done = subprocess.run(
            ["ld", "-shared", "-o", str(out), *parts], capture_output=True, text=True
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"ld failed: {done.stderr.strip()[:300]}")
        os.chmod(out, 0o600)  # like the object code: the user's own, read by dlopen only
        os.replace(out, dest)


def _undefined(obj: bytes) -> list[str]:
    """Runtime helpers the object's string table names (numba's error and memory helpers, the
    Python C API): the loader points them at something harmless or at the real function."""
    import re

    found = re.findall(rb"(?<=\0)(_{0,2}(?:numba_|NRT_|Py)[A-Za-z_]+)(?=\0)", obj)
    return sorted({name.decode() for name in found})
