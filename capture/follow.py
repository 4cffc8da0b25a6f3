"""Teacher forcing (``DumpConfig(follow=GOLDEN_DUMP)``): feed the target the golden's tokens.

Once the target picks another token than the golden run, every later step sees other input ids
and is only "diverged". With ``follow`` a root forward hook, registered *after* the capture's own
hooks have copied this step's logits, makes the golden's next token the only finite logit of the
last position in the *returned* logits. Whatever picks the next token — Hugging Face
``generate`` (greedy or sampling) or a hand-written ``argmax`` loop — then picks the golden's,
while the dumped logits stay the target's own. The target's own choice (argmax of its logits)
is recorded as a ``follow`` index line; each step's input ids are checked against the golden's
(token 0: the prompt), so a run that cannot follow stops with one line instead of comparing
unrelated text.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from . import format as fmt
from .errors import LayerwatchError
from .flatten import first_int_tensor
from .golden import GoldenTokens

Tensor = torch.Tensor


def _shown(ids: tuple[int, ...] | list[int], limit: int = 8) -> str:
    head = ", ".join(map(str, ids[:limit]))
    return f"[{head}{', …' if len(ids) > limit else ''}] ({len(ids)} ids)"


def _logits_of(output: Any) -> Tensor | None:
    """The logits in a root's output: a float tensor, ``.logits``, or a tuple's first item."""
    if isinstance(output, Tensor):
        return output if output.is_floating_point() else None
    logits = getattr(output, "logits", None)
    if isinstance(logits, Tensor) and logits.is_floating_point():
        return logits
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0] if output[0].is_floating_point() else None
    return None


def _with_logits(output: Any, logits: Tensor) -> Any:
    if isinstance(output, Tensor):
        return logits
    if isinstance(getattr(output, "logits", None), Tensor):
        output.logits = logits  # a ModelOutput keeps its dict and attribute in step
        return output
    rest = list(output[1:])
    return (logits, *rest) if isinstance(output, tuple) else [logits, *rest]


class Follower:
    """The root hook that checks each step's input ids and forces the golden's next token."""

    def __init__(self, golden: GoldenTokens, emit: Callable[[dict[str, Any]], None]) -> None:
        self.golden = golden
        self.emit = emit
        """Queues one index line (``follow`` and ``error`` kinds) with the capture's writer."""
        self.token = 0
        self.depth = 0
        self.warned = False

    def pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.depth += 1

    def post(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        self.depth = max(0, self.depth - 1)
        if self.depth:
            return None  # a re-entrant call of the root: only the outermost is a token
        token = self.token
        self.token = token + 1
        golden = self.golden.ids
        if token >= len(golden):
            self._say_once(
                f"follow: the program ran more steps than the golden dump has tokens "
                f"({len(golden)}); from token {token} on the target picks its own tokens"
            )
            return None
        ids = first_int_tensor(args, kwargs)
        got = [] if ids is None else ids.reshape(-1).tolist()
        if tuple(got) != golden[token]:
            what = "the prompt differs from" if token == 0 else "its input ids differ from"
            self._fail(
                f"follow: token {token}: {what} the golden dump's (golden {_shown(golden[token])}, "
                f"target {_shown(got)}); --follow needs the same prompt and a loop that feeds "
                "back the chosen token"
            )
        if token + 1 >= len(golden) or token + 1 in self.golden.case_starts:
            return None  # the golden's last step (of a case): its choice was never fed back
        logits = _logits_of(output)
        if logits is None or logits.dim() == 0 or ids is None:
            self._say_once("follow: the root returned no float logits: tokens are not forced")
            return None
        batch = ids.shape[0] if ids.dim() > 1 else 1
        nxt = golden[token + 1]
        if len(nxt) % batch:
            self._fail(f"follow: token {token + 1}: golden ids do not split into batch {batch}")
        want = torch.tensor(nxt, dtype=torch.long, device=logits.device).view(batch, -1)[:, -1]
        forced, own = _force(logits, want)
        self.emit({"k": fmt.K_FOLLOW, "token": token, "own_id": own, "fed_id": want.tolist()})
        return _with_logits(output, forced)

    def _say_once(self, message: str) -> None:
        if not self.warned:
            self.warned = True
            print(f"layerwatch: {message}", file=sys.stderr, flush=True)

    def _fail(self, message: str) -> None:
        print(f"layerwatch: {message}", file=sys.stderr, flush=True)
        self.emit({"k": fmt.K_ERROR, "message": message})
        raise LayerwatchError(message)


def _force(logits: Tensor, want: Tensor) -> tuple[Tensor, list[int]]:
    """A copy of ``logits`` whose last position keeps only ``want`` finite; the own argmax."""
    last = logits[..., -1, :] if logits.dim() >= 3 else logits  # [B, V] and [V]: one step
    rows = last.reshape(-1, last.shape[-1])
    own = rows.float().argmax(-1).tolist()
    if rows.shape[0] != want.shape[0]:
        want = want.expand(rows.shape[0]) if want.shape[0] == 1 else want[: rows.shape[0]]
    kept = rows.gather(-1, want.view(-1, 1))
    kept = torch.where(torch.isfinite(kept), kept, torch.zeros_like(kept))
    new_rows = torch.full_like(rows, float("-inf")).scatter_(-1, want.view(-1, 1), kept)
    forced = logits.clone()
    if logits.dim() >= 3:
        forced[..., -1, :] = new_rows.view(last.shape)
    else:
        forced.copy_(new_rows.view(logits.shape))
    return forced, own
