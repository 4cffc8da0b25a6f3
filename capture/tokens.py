"""Token selections such as ``0-7,12`` or ``8-`` (open end), shared by the CLI and DumpConfig."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import LayerwatchError


@dataclass(frozen=True, slots=True)
class TokenSelection:
    """A union of closed ranges; ``None`` as an upper bound means "and every later token"."""

    ranges: tuple[tuple[int, int | None], ...]

    def __contains__(self, token: object) -> bool:
        if not isinstance(token, int):
            return False
        return any(lo <= token and (hi is None or token <= hi) for lo, hi in self.ranges)

    @property
    def last(self) -> int | None:
        """Largest selected token, or ``None`` when the selection is open-ended."""
        highs = [hi for _, hi in self.ranges]
        return None if any(h is None for h in highs) else max(h for h in highs if h is not None)

    @classmethod
    def everything(cls) -> TokenSelection:
        return cls(((0, None),))

    @classmethod
    def of(cls, tokens: object) -> TokenSelection:
        """Accept msit's ``token_range`` list, a ``range``, a spec string, or ``None`` (all)."""
        if tokens is None:
            return cls.everything()
        if isinstance(tokens, TokenSelection):
            return tokens
        if isinstance(tokens, str):
            return parse_tokens(tokens)
        if isinstance(tokens, int):
            return cls(((tokens, tokens),))
        if isinstance(tokens, range) and tokens.step == 1:
            return cls(((tokens.start, tokens.stop - 1),)) if len(tokens) else cls(())
        try:
            values = sorted({int(t) for t in tokens})  # type: ignore[attr-defined]
        except (TypeError, ValueError) as exc:
            raise LayerwatchError(f"token_range must be token numbers, got {tokens!r}") from exc
        return cls(tuple(_runs(values)))


def _runs(values: list[int]) -> list[tuple[int, int | None]]:
    runs: list[tuple[int, int | None]] = []
    for value in values:
        if value < 0:
            raise LayerwatchError(f"token numbers start at 0, got {value}")
        if runs and runs[-1][1] == value - 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


def parse_tokens(spec: str) -> TokenSelection:
    """Parse ``"0-7,12,20-"``. Raises :class:`LayerwatchError` with a one-line message."""
    ranges: list[tuple[int, int | None]] = []
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part:
                lo_text, hi_text = part.split("-", 1)
                lo = int(lo_text)
                hi = int(hi_text) if hi_text else None
            else:
                lo = hi = int(part)
        except ValueError:
            raise LayerwatchError(f"bad token selection {spec!r}: use e.g. 0-7,12 or 8-") from None
        if lo < 0 or (hi is not None and hi < lo):
            raise LayerwatchError(f"bad token range {part!r} in {spec!r}")
        ranges.append((lo, hi))
    if not ranges:
        raise LayerwatchError(f"empty token selection {spec!r}")
    return TokenSelection(tuple(ranges))
