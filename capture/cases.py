"""Per-case capture: one dump over many prompts, each prompt a *case* the engine compares alone.

A case is a span of tokens marked in the index: ``{"k":"case","key","token"}`` where it
starts and ``{"k":"case_end","key","token"}`` (exclusive) where it ends. Token numbers stay
global in the dump (nothing else in the format changes, so readers that ignore these lines see
one long run); the engine renumbers each case from 0 (``engine/cases.py``).

Cases come from ``with layerwatch.capture.cases.case(key):`` around any code, or by themselves
from each top-level ``generate`` call of a captured model that has one (Hugging Face): the
``n``-th call is case ``"n"``. A case opened inside another one is part of the outer case.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import format as fmt

_MARKERS: list[CaseMarker] = []
"""One per open capture (``register_hook``); ``case()`` marks all of them."""


class CaseMarker:
    """Writes one capture's case lines; knows the capture's next token number.

    ``selected`` (``DumpConfig.cases``): only these keys are captured; ``pause(True)`` stops
    the capture of tokens outside them (they are still counted, so token numbers stay those
    of the whole run).
    """

    def __init__(
        self,
        emit: Callable[[dict[str, Any]], None],
        next_token: Callable[[], int],
        selected: frozenset[str] | None = None,
        pause: Callable[[bool], None] | None = None,
    ) -> None:
        self.emit = emit
        self.next_token = next_token
        self.selected = selected
        self.pause = pause
        self.depth = 0
        self.count = 0
        """Cases opened so far: the key of an automatic (``generate``) case."""
        self.open_key: str | None = None
        if selected is not None and pause is not None:
            pause(True)  # outside the listed cases nothing is captured

    def begin(self, key: object | None = None) -> None:
        self.depth += 1
        if self.depth > 1:
            return
        name = str(self.count if key is None else key)
        self.count += 1
        if self.selected is not None and name not in self.selected:
            return
        self.open_key = name
        if self.pause is not None:
            self.pause(False)
        self.emit({"k": fmt.K_CASE, "key": name, "token": self.next_token()})

    def end(self) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.open_key is not None:
            self.emit({"k": fmt.K_CASE_END, "key": self.open_key, "token": self.next_token()})
            self.open_key = None
            if self.selected is not None and self.pause is not None:
                self.pause(True)

    def started_in_call(self) -> None:
        """Attached from inside the first ``generate`` (zero-code capture): it is case 0, and
        it ends where the next case begins (its own end is never seen)."""
        self.begin()
        self.depth = 0  # already counted as ended: the next top-level call opens case 1


def register(marker: CaseMarker) -> None:
    _MARKERS.append(marker)


def unregister(marker: CaseMarker) -> None:
    if marker in _MARKERS:
        _MARKERS.remove(marker)


@contextmanager
def case(key: object) -> Iterator[None]:
    """Everything every open capture records inside this block belongs to case ``key``."""
    markers = list(_MARKERS)
    for m in markers:
        m.begin(key)
    try:
        yield
    finally:
        for m in markers:
            m.end()


def wrap_generate(model: Any, marker: CaseMarker) -> Callable[[], None] | None:
    """Make each top-level ``model.generate(...)`` a case; returns the undo, or ``None``."""
    generate = getattr(model, "generate", None)
    if not callable(generate) or "generate" in vars(model):
        return None

    @functools.wraps(generate)
    def cased(*args: Any, **kwargs: Any) -> Any:
        if marker.depth:  # inside a user's case(): part of it
            return generate(*args, **kwargs)
        marker.begin()
        try:
            return generate(*args, **kwargs)
        finally:
            marker.end()

    model.generate = cased

    def undo() -> None:
        if vars(model).get("generate") is cased:
            del model.generate

    return undo


class Registration:
    """What ``register_hook`` keeps to undo per-case capture (it looks like a hook handle)."""

    def __init__(self, marker: CaseMarker, undo: Callable[[], None] | None) -> None:
        self.marker = marker
        self.undo = undo

    def remove(self) -> None:
        unregister(self.marker)
        if self.undo is not None:
            self.undo()
            self.undo = None


def attach(model: Any, marker: CaseMarker, already_in_call: bool) -> Registration:
    """Start per-case capture for one model (``register_hook`` calls this)."""
    register(marker)
    undo = wrap_generate(model, marker)
    if undo is not None and already_in_call and _inside_generate(model):
        marker.started_in_call()
    return Registration(marker, undo)


def _inside_generate(model: Any) -> bool:
    """Whether the model's own ``generate`` is running on this thread's stack right now."""
    func = getattr(type(model), "generate", None)
    codes = set()
    for _ in range(8):
        code = getattr(func, "__code__", None)
        if code is not None:
            codes.add(code)
        func = getattr(func, "__wrapped__", None)
        if func is None:
            break
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def read_case_keys(source: object) -> frozenset[str]:
    """The keys to capture: a list of keys, or a JSON file — ``layerwatch badcase --json``'s
    object (its ``bad_cases``), a ``cases`` report, or a plain list. One line if unusable."""
    import json
    import os

    from .errors import LayerwatchError

    if isinstance(source, list | tuple | set | frozenset):
        return frozenset(str(k) for k in source)
    path = os.fsdecode(source)  # type: ignore[call-overload]
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except OSError as exc:
        raise LayerwatchError(f"cases: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise LayerwatchError(f"cases: {path} is not JSON ({exc})") from None
    rows = obj.get("bad_cases", obj.get("cases")) if isinstance(obj, dict) else obj
    if not isinstance(rows, list):
        raise LayerwatchError(
            f"cases: {path} has no case list (expected layerwatch badcase --json output, "
            "with bad_cases, or a JSON list of keys)"
        )
    keys = [r.get("key") if isinstance(r, dict) else r for r in rows]
    if any(k is None or isinstance(k, dict | list) for k in keys):
        raise LayerwatchError(f"cases: {path}: every case needs a key")
    return frozenset(str(k) for k in keys)
