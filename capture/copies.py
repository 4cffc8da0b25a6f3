"""The model thread's copy of a captured tensor: taken at once, C-contiguous, cheap.

Host tensors become numpy arrays (``bf16``/``fp8`` as same-size integer bits, viewed back by
the writer): a kept ``ndarray.copy()`` is far cheaper than a kept ``Tensor.clone()`` (measured
1.6 vs 6.1 us for a small tensor: the clone's allocator and tensor object), and the writer
then needs no torch call to write it. Device tensors are cloned on their device (asynchronous,
no host transfer in the model thread). Views keep only their own elements, never the storage.
"""

from __future__ import annotations

from typing import Any

import torch

from .handoff import Placeholder

Tensor = torch.Tensor

_HOST_BITS = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _HOST_BITS[getattr(torch, _name)] = torch.uint8
HOST_NUMPY = frozenset(  # dtypes whose ``Tensor.numpy()`` view needs no reinterpretation
    {
        torch.float32,
        torch.float16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)


def copy_tensor(t: Tensor) -> Any:
    """A private C-contiguous copy (numpy on the host, a clone on a device), or a
    :class:`Placeholder` for layouts that are indexed but not written (sparse...)."""
    if t.is_cpu:
        dtype = t.dtype
        try:
            if dtype in HOST_NUMPY:
                return t.numpy().copy()  # raises for sparse, conjugate, requires_grad...
            bits = _HOST_BITS.get(dtype)
            if bits is not None:
                return t.view(bits).numpy().copy()
        except (RuntimeError, TypeError):
            if t.requires_grad:
                return copy_tensor(t.detach())
    if t.layout is not torch.strided:  # sparse & co: indexed (dtype, shape), never written
        return Placeholder(t.shape, t.dtype)
    if t.is_contiguous():
        return t.detach().clone()
    return t.detach().clone(memory_format=torch.contiguous_format)
