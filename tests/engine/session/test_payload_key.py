"""The session's payload key (engine/session/core.py ``_payload_key``) is built from every field
a locator compares on: two locators equal exactly when their keys' parts are."""

from __future__ import annotations

import dataclasses

from layerwatch.engine.records import Locator
from layerwatch.engine.session.core import _fields


def test_the_key_holds_every_locator_field() -> None:
    loc = Locator("p", 1, 2, "float32", (3,), (1,), 4, "nz", (5,))
    assert _fields(loc) == tuple(getattr(loc, f.name) for f in dataclasses.fields(Locator))
    other = dataclasses.replace(loc, elem_offset=5)
    assert (loc == other) == (_fields(loc) == _fields(other)) is False
