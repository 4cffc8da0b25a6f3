"""orjson is imported once it is worth its import, and then every caller gets it
(``engine/orjson_lazy.py``: the report's float text and the index decode share that rule)."""

from __future__ import annotations

import sys

import pytest
from layerwatch.engine import floattext, orjson_lazy
from layerwatch.engine.readers import layerwatch as lw


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process that has not imported orjson yet."""
    monkeypatch.setattr(orjson_lazy, "_orjson", None)
    monkeypatch.setattr(orjson_lazy, "_TRIED", False)
    monkeypatch.delitem(sys.modules, "orjson", raising=False)


@pytest.mark.usefixtures("fresh")
def test_a_small_block_does_not_import_it_a_large_one_does_for_every_caller() -> None:
    assert lw._fast_json(lw.ORJSON_LINES - 1) is None
    assert floattext._bulk(floattext._BULK - 1) is None
    assert "orjson" not in sys.modules
    assert floattext._bulk(floattext._BULK) is not None  # the report's first large block
    assert "orjson" in sys.modules
    assert lw._fast_json(1) is sys.modules["orjson"].loads  # the index: now at any size


@pytest.mark.usefixtures("fresh")
def test_imported_by_anything_else_it_is_used_at_once() -> None:
    import orjson

    assert lw._fast_json(1) is orjson.loads


def test_where_it_cannot_be_imported_every_caller_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(orjson_lazy, "_orjson", None)
    monkeypatch.setattr(orjson_lazy, "_TRIED", False)
    monkeypatch.setitem(sys.modules, "orjson", None)  # import raises ImportError
    assert orjson_lazy.module(True) is None
    assert orjson_lazy._TRIED
    assert lw._fast_json(10 * lw.ORJSON_LINES) is None
    assert floattext._bulk(10 * floattext._BULK) is None
