"""orjson, imported once it is worth its import: the one home of that rule for the report's
float text (``engine/floattext.py``) and the layerwatch index's decode
(``engine/readers/layerwatch.py``).

orjson is a dependency (pyproject.toml), but its import (~4 ms on this box, with the
``datetime`` and ``uuid`` modules it brings) costs what thousands of values done by the standard
library cost, so a small compare does not pay it: a caller asks for it with ``worth`` true only
for a block large enough. Once imported, here or by anything else, every caller gets it. Where it
cannot be imported (a platform without a wheel) callers fall back to the standard library, to
the same result.
"""

from __future__ import annotations

import sys
from typing import Any

_orjson: Any = None
"""orjson once :func:`module` took it; None before, or where it is not importable."""
_TRIED = False
"""Whether an import was tried and failed (or is switched off, as tests do for the fallback)."""


def module(worth: bool) -> Any:
    """orjson: already imported, or imported now if ``worth``; None otherwise, or where it
    cannot be imported."""
    global _orjson, _TRIED
    if _orjson is not None:
        return _orjson
    if _TRIED:
        return None
    lib = sys.modules.get("orjson")
    if lib is None:
        if not worth:
            return None
        _TRIED = True
        try:
            import orjson as lib
        except ImportError:
            return None
    _orjson = lib
    return lib
