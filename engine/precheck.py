"""``layerwatch precheck DUMP``: recompute every supported operator of one dump in float64.

Walks a dump (readers → records), picks for each captured call of an operator whose class (or
ATB op type) is known the reference in ``engine/numerics/precheck.py``, loads its dumped inputs
and weights, and judges the dumped output under the rounding bound described there. No golden
run is needed: the target is checked against itself, so upstream rounding is never blamed on an
op. Unknown classes are never guessed: they are counted in ``summary.unsupported``.

Rows are :class:`PairResult` objects (target-only, ``verdict`` pass/fail/error) so the report
writers, the grid and the drill-down take them as they take a comparison's rows.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from layerwatch.capture.errors import LayerwatchError
from layerwatch.engine.numerics import precheck as ref
from layerwatch.engine.outcome import check_report_path, write_object_report
from layerwatch.engine.readers import open_dump
from layerwatch.engine.readers.load import load_array
from layerwatch.engine.records import (
    Locator,
    Node,
    PairResult,
    TensorKey,
    TensorRecord,
    Topology,
    Verdict,
)
from layerwatch.engine.wording import note_lines

EXIT_OK, EXIT_FINDING, EXIT_UNUSABLE = 0, 1, 2
HOW_TO_WEIGHTS = "capture them with `layerwatch dump --weights ...` or DumpConfig(dump_weight=True)"

_LLAMA_NORMS = frozenset(
    f"transformers.models.{mod}.modeling_{mod}.{cls}RMSNorm"
    for mod, cls in (
        ("llama", "Llama"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3"), ("mistral", "Mistral"),
        ("mixtral", "Mixtral"), ("qwen2_moe", "Qwen2Moe"), ("qwen3_moe", "Qwen3Moe"),
        ("phi3", "Phi3"), ("deepseek_v3", "DeepseekV3"), ("granite", "Granite"),
        ("olmo2", "Olmo2"), ("glm", "Glm"), ("internlm2", "InternLM2"),
    )
)  # fmt: skip
"""``w · cast(x̂)``: x̂ computed in fp32 and cast to the input dtype before the weight."""
_GEMMA_NORMS = frozenset(
    f"transformers.models.{mod}.modeling_{mod}.{cls}RMSNorm"
    for mod, cls in (("gemma", "Gemma"), ("gemma2", "Gemma2"), ("gemma3", "Gemma3"))
)
"""``(1 + w) · x̂`` computed in fp32, cast once."""
_DEMO_NORMS = frozenset({"layerwatch.capture.demo.model.RMSNorm"})
"""The demo model's norm (capture/demo/model.py): Llama's ``w · cast(x̂)``, its ``eps`` as ``eps``."""
_ACTIVATIONS = {
    "torch.nn.modules.activation.SiLU": "silu",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.Tanh": "tanh",
    "transformers.activations.SiLUActivation": "silu",
    "transformers.activations.GELUActivation": "gelu",
    "transformers.activations.GELUTanh": "gelu_tanh",
    "transformers.activations.PytorchGELUTanh": "gelu_tanh",
    "transformers.activations.NewGELUActivation": "new_gelu",
    "transformers.activations.QuickGELUActivation": "quick_gelu",
}
_SCALED_EMBEDDINGS = frozenset(
    {
        "transformers.models.gemma.modeling_gemma.GemmaTextScaledWordEmbedding",
        "transformers.models.gemma3.modeling_gemma3.Gemma3TextScaledWordEmbedding",
    }
)
_ATB_ACTIVATIONS = {1: "relu", 2: "gelu", 3: "quick_gelu", 4: "silu", 8: "sigmoid"}
_ATB_ELEWISE = {8: "add", 9: "mul", 15: "sub", 2: "muls"}
_CALL = re.compile(r"#\d+$")

Loader = Callable[[str], np.ndarray]
"""``stem or weight name → float64 array``; raises ``_Missing`` when it was not dumped."""
Plan = Callable[[Loader], ref.Reference]


@dataclass(slots=True)
class PrecheckReport:
    """Rows in execution order and what could not be checked."""

    rows: list[PairResult] = field(default_factory=list)
    unsupported: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    bytes_read: int = 0
    topology: Topology | None = None
    """The dump's module tree (the grid's columns come from it)."""

    @property
    def checked(self) -> int:
        return sum(r.verdict in (Verdict.PASS, Verdict.FAIL) for r in self.rows)

    @property
    def failed(self) -> list[PairResult]:
        return [r for r in self.rows if r.verdict is Verdict.FAIL]

    @property
    def errors(self) -> list[PairResult]:
        return [r for r in self.rows if r.verdict is Verdict.ERROR]

    @property
    def first_failure(self) -> PairResult | None:
        bad = self.failed
        return min(bad, key=lambda r: (r.key.token, r.order, r.key.node)) if bad else None

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "summary": {
                "checked": self.checked,
                "failed": len(self.failed),
                "errors": len(self.errors),
                "unsupported": dict(sorted(self.unsupported.items())),
            },
            "first_failure": None
            if first is None
            else {
                "token": first.key.token,
                "node": first.key.node,
                "tensor": first.key.stem,
                "metrics": _finite(first.metrics),
                "reason": first.reason,
            },
            "rows": [
                dict(r.to_json(), type=r.node_type, metrics=_finite(r.metrics)) for r in self.rows
            ],
            "notes": list(self.notes),
        }


def _finite(metrics: dict[str, float]) -> dict[str, float | None]:
    return {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}


# --- which reference for which node ------------------------------------------------------
def plan_for(node: Node, fmt: str, op_param: dict[str, Any]) -> Plan | str:
    """The reference for ``node``, or the key it is counted under in ``unsupported``."""
    if fmt == "atb":
        return _atb_plan(node.type, {**node.attrs, **op_param})
    cls, attrs = node.cls, node.attrs
    if not cls:
        return f"{node.type or '?'} (no class recorded)"
    short = cls.rsplit(".", 1)[-1]
    name = node.name
    w, b = f"{name}.weight", f"{name}.bias"
    if cls == "torch.nn.modules.linear.Linear":
        has_bias = bool(attrs.get("has_bias"))
        return lambda get: ref.matmul(get("input_0"), get(w).T, get(b) if has_bias else None)
    if cls == "transformers.pytorch_utils.Conv1D":
        return lambda get: ref.matmul(get("input_0"), get(w), get(b))
    if cls == "torch.nn.modules.sparse.Embedding" or cls in _SCALED_EMBEDDINGS:
        if attrs.get("max_norm") is not None:
            return f"{short} (max_norm)"
        scaled = cls in _SCALED_EMBEDDINGS
        return lambda get: _embedding(get, w, attrs.get("scalar_embed_scale") if scaled else None)
    if cls == "torch.nn.modules.normalization.LayerNorm":
        eps, dims = attrs.get("eps"), attrs.get("normalized_shape")
        if not isinstance(eps, int | float) or not isinstance(dims, list):
            return f"{short} (no eps/normalized_shape)"
        affine, has_bias = bool(attrs.get("elementwise_affine")), bool(attrs.get("has_bias"))
        eps_f, n_dims = float(eps), len(dims)
        return lambda get: ref.layer_norm(
            get("input_0"),
            get(w) if affine else None,
            get(b) if affine and has_bias else None,
            eps_f,
            n_dims,
        )
    if cls in _LLAMA_NORMS or cls in _GEMMA_NORMS or cls in _DEMO_NORMS:
        gemma = cls in _GEMMA_NORMS
        eps = attrs.get("variance_epsilon" if cls in _LLAMA_NORMS else "eps")
        if not isinstance(eps, int | float):
            return f"{short} (no eps recorded)"
        return lambda get: ref.rms_norm(get("input_0"), get(w), float(eps), plus_one=gemma)
    if cls == "torch.nn.modules.activation.GELU":
        kind = "gelu_tanh" if attrs.get("approximate") == "tanh" else "gelu"
        return lambda get: ref.activation(get("input_0"), kind)
    if cls in _ACTIVATIONS:
        kind = _ACTIVATIONS[cls]
        return lambda get: ref.activation(get("input_0"), kind)
    if cls == "torch.nn.modules.activation.Softmax":
        dim = attrs.get("dim")
        if not isinstance(dim, int):
            return f"{short} (dim=None)"
        return lambda get: ref.softmax(get("input_0"), dim)
    if cls == "torch.nn.modules.dropout.Dropout":
        if attrs.get("training") and attrs.get("p", 0) not in (0, 0.0):
            return f"{short} (training)"
        return lambda get: ref.identity(get("input_0"))
    return short


def _embedding(get: Loader, w: str, scale: Any) -> ref.Reference:
    ids = get("input_0").astype(np.int64)
    table = get(w)
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise _Missing(f"input ids outside the table's {table.shape[0]} rows")
    factor = None
    if isinstance(scale, int | float):
        factor = float(ref.round_to(np.array([float(scale)]), get.dtype_of(w))[0])  # type: ignore[attr-defined]
    return ref.embedding(ids, table, factor)


def _param(params: dict[str, Any], *path: str) -> Any:
    value: Any = params
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _atb_plan(op_type: str, params: dict[str, Any]) -> Plan | str:
    kind = op_type.removesuffix("Operation")
    if kind == "Linear":
        if params.get("transposeA"):
            return "LinearOperation (transposeA)"
        tb = params.get("transposeB", True)
        has_bias = bool(params.get("hasBias", False))
        return lambda get: ref.matmul(
            get("input_0"), get("input_1").T if tb else get("input_1"),
            get("input_2") if has_bias else None,
        )  # fmt: skip
    if kind == "RmsNorm":
        eps = _param(params, "normParam", "epsilon")
        layer = params.get("layerType", 1)
        if not isinstance(eps, int | float) or layer not in (1, "RMS_NORM_NORM"):
            return "RmsNormOperation (no normParam.epsilon)"
        return lambda get: ref.rms_norm(get("input_0"), get("input_1"), float(eps), plus_one=False)
    if kind == "Activation":
        act = params.get("activationType")
        if act == 6:
            dim = int(params.get("dim", -1))
            return lambda get: ref.swiglu(get("input_0"), dim)
        if act not in _ATB_ACTIVATIONS:
            return f"ActivationOperation (activationType={act})"
        name = _ATB_ACTIVATIONS[act]
        if name == "gelu" and params.get("geluMode", 0) == 0:
            name = "gelu_tanh"
        scale = float(params.get("scale", 1.0)) if name == "silu" else 1.0
        return lambda get: ref.activation(get("input_0"), name, scale)
    if kind == "Elewise":
        ew = _ATB_ELEWISE.get(params.get("elewiseType"))  # type: ignore[arg-type]
        if ew is None:
            return f"ElewiseOperation (elewiseType={params.get('elewiseType')})"
        if ew == "muls":
            var = _param(params, "mulsParam", "varAttr")
            if not isinstance(var, int | float):
                return "ElewiseOperation (muls without varAttr)"
            return lambda get: ref.elementwise(get("input_0"), float(var), "mul")
        return lambda get: ref.elementwise(get("input_0"), get("input_1"), ew)
    return op_type


class _Missing(Exception):
    """A tensor or weight the reference needs is not in the dump (an error row, not a crash)."""


# --- walking a dump ----------------------------------------------------------------------
def precheck(path: str | os.PathLike[str], *, tokens: Any = None) -> PrecheckReport:
    """Precheck every captured call of a supported op in the dump at ``path``."""
    reader = open_dump(path, "target")
    update = reader.poll(None, final=True)
    report = PrecheckReport(notes=list(update.notes), topology=update.topology)
    topology = update.topology or Topology()
    fmt = getattr(reader, "fmt", "")
    calls: dict[tuple[int, int, str], dict[str, TensorRecord]] = {}
    for record in update.tensors:
        if tokens is not None and record.key.token not in tokens:
            continue
        calls.setdefault((record.key.rank, record.key.token, record.key.node), {})[
            record.key.stem
        ] = record
    if not calls:
        raise LayerwatchError(f"{path}: no tensors in the dump")
    if all(r.loc is None for group in calls.values() for r in group.values()):
        raise LayerwatchError(f"{path}: a statistics-only dump has no tensor data to recompute")
    plans: dict[str, Plan | str] = {}
    needs_weights = False
    for (_rank, _token, node_name), group in calls.items():
        base = _CALL.sub("", node_name)
        if base in plans:
            continue
        node = topology.nodes.get(base) or Node(base, _node_type(group))
        if fmt == "atb" and not node.type:
            node.type = _node_type(group)
        op_param = _atb_op_param(group) if fmt == "atb" else {}
        plans[base] = plan = plan_for(node, fmt, op_param)
        needs_weights = needs_weights or (not isinstance(plan, str) and bool(node.params))
    if fmt != "atb" and needs_weights and not update.weights:
        raise LayerwatchError(f"{path}: the dump holds no weights; {HOW_TO_WEIGHTS}")
    cache: dict[str, np.ndarray] = {}
    for (rank, token, node_name), group in sorted(
        calls.items(), key=lambda kv: (kv[0][1], _order(kv[1]), kv[0][0], kv[0][2])
    ):
        plan = plans[_CALL.sub("", node_name)]
        out = _output(group)
        if isinstance(plan, str):
            report.unsupported[plan] += 1
            continue
        if out is None:
            continue  # inputs only (tensor_part=0): nothing to judge
        key = TensorKey(token, node_name, out.key.stem, rank)
        get = _loader(group, update.weights, cache, report)
        report.rows.append(check_call(key, plan, get, out, report))
    return report


def check_call(
    key: TensorKey, plan: Plan, get: Loader, out: TensorRecord, report: PrecheckReport
) -> PairResult:
    """Recompute one call and judge its dumped output: a pass/fail row, or an error row."""
    row = PairResult(key, Verdict.ERROR, target=out, order=out.order, node_type=out.node_type)
    try:
        reference = plan(get)
        if out.loc is None:
            raise _Missing("output has statistics only")
        check = ref.judge(_load(out.loc, report), reference, out.dtype)
    except (_Missing, LayerwatchError) as exc:
        row.reason = str(exc)
        return row
    except (ValueError, IndexError) as exc:  # shapes that do not fit the op
        row.reason = f"cannot recompute: {exc}"
        return row
    row.metrics = check.metrics
    row.verdict = Verdict.PASS if check.ok else Verdict.FAIL
    limits = ((ref.ELEMENT_RATIO, ref.ELEMENT_LIMIT), (ref.NORM_RATIO, ref.NORM_LIMIT))
    row.failed = tuple(n for n, limit in limits if check.metrics.get(n, 0.0) > limit)
    row.reason = check.reason
    return row


def precheck_sentence(
    target: TensorRecord,
    records: dict[TensorKey, TensorRecord],
    topology: Topology | None,
    weights: dict[str, Locator],
) -> str:
    """One line for a compare's operator view: the target op's own precheck verdict, or ``""``
    when it cannot be had (no weights, an unsupported type, no inputs)."""
    key = target.key
    group = {
        stem: rec
        for stem in ref.CALL_STEMS
        if (rec := records.get(TensorKey(key.token, key.node, stem, key.rank))) is not None
    }
    fmt = "atb" if target.source.endswith(".bin") else ""
    if fmt != "atb" and not weights:
        return ""
    base = _CALL.sub("", key.node)
    node = (topology.nodes.get(base) if topology else None) or Node(base, target.node_type)
    plan = plan_for(node, fmt, _atb_op_param(group) if fmt == "atb" else {})
    out = _output(group)
    if isinstance(plan, str) or out is None:
        return ""
    report = PrecheckReport()
    row = check_call(
        TensorKey(key.token, key.node, out.key.stem, key.rank),
        plan,
        _loader(group, weights, {}, report),
        out,
        report,
    )
    ratio = row.metrics.get(ref.PRECHECK_RATIO)
    if row.verdict is Verdict.PASS:
        return (
            f"precheck: the target op recomputes within rounding (ratio {ratio:.2f} of its bound)"
        )
    if row.verdict is Verdict.FAIL:
        return f"precheck: the target op is wrong on its own inputs: {row.reason}"
    return f"precheck: could not recompute ({row.reason})"


def _node_type(group: dict[str, TensorRecord]) -> str:
    return next((r.node_type for r in group.values() if r.node_type), "")


def _order(group: dict[str, TensorRecord]) -> int:
    return min((r.order for r in group.values()), default=-1)


def _output(group: dict[str, TensorRecord]) -> TensorRecord | None:
    for stem in ("output", "output_0"):
        if stem in group:
            return group[stem]
    return None


def _atb_op_param(group: dict[str, TensorRecord]) -> dict[str, Any]:
    """``op_param.json`` beside the op's ``before/``/``after/`` directories, when present."""
    for record in group.values():
        if record.source:
            path = Path(record.source).parent.parent / "op_param.json"
            try:
                obj = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}
            return obj if isinstance(obj, dict) else {}
    return {}


def _load(loc: Locator, report: PrecheckReport) -> np.ndarray:
    array = load_array(loc, as_float=False)
    report.bytes_read += loc.nbytes
    if array.dtype.kind in "iub":
        return array
    return array.astype(np.float64)


def _loader(
    group: dict[str, TensorRecord],
    weights: dict[str, Locator],
    cache: dict[str, np.ndarray],
    report: PrecheckReport,
) -> Loader:
    def get(name: str) -> np.ndarray:
        if name in group:
            record = group[name]
            if record.loc is None:
                raise _Missing(f"{name} has statistics only")
            return _load(record.loc, report)
        loc = weights.get(name)
        if loc is None:
            if name.startswith("input"):
                raise _Missing(f"{name} not dumped (capture inputs: tensor_part=2)")
            raise _Missing(f"weight {name} not in the dump")
        if name not in cache:
            cache.clear() if len(cache) > 64 else None
            cache[name] = _load(loc, report)
        return cache[name]

    def dtype_of(name: str) -> str:
        loc = weights.get(name)
        return loc.dtype if loc is not None else "float32"

    get.dtype_of = dtype_of  # type: ignore[attr-defined]
    return get


# --- reports -------------------------------------------------------------------------------
CSV_COLUMNS = (
    "token", "node", "type", "tensor", "verdict", "precheck_ratio", "precheck_element_ratio",
    "precheck_norm_ratio", "relative_euclidean_distance", "norm_relative_error",
    "cosine_similarity", "max_absolute_error", "reason",
)  # fmt: skip


def write_csv(rows: Iterable[PairResult], out: TextIO) -> None:
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        m = r.metrics
        nums = [m.get(c) for c in CSV_COLUMNS[5:12]]
        writer.writerow(
            [r.key.token, r.key.node, r.node_type, r.key.stem, r.verdict.value]
            + ["" if v is None else f"{v:.6g}" for v in nums]
            + [r.reason]
        )


def summary_line(report: PrecheckReport) -> str:
    unsupported = sum(report.unsupported.values())
    line = (
        f"precheck: {report.checked} checked, {len(report.failed)} failed, "
        f"{len(report.errors)} unreadable, {unsupported} calls of unsupported types"
    )
    first = report.first_failure
    if first is not None:
        line += (
            f"\nfirst failure: token {first.key.token} · {first.key.node} ({first.node_type}) · "
            f"{first.reason}"
        )
    return line


def precheck_main(args: Any) -> int:
    """The ``layerwatch precheck DUMP`` command (``--replay`` goes to engine/replay.py)."""
    if not getattr(args, "dump", None):
        raise LayerwatchError("no dump given: layerwatch precheck DUMP, or --replay -- COMMAND")
    if getattr(args, "cmd", None):
        raise LayerwatchError(f"unexpected arguments {args.cmd}: a command needs --replay")
    output = getattr(args, "output", None)
    check_report_path(output)
    tokens = None
    if getattr(args, "tokens", None):
        from layerwatch.capture.tokens import TokenSelection

        tokens = TokenSelection.of(args.tokens)
    report = precheck(args.dump, tokens=tokens)
    if report.checked == 0:
        why = report.errors[0].reason if report.errors else "no call of a supported operator"
        kinds = ", ".join(sorted(report.unsupported)[:6])
        raise LayerwatchError(
            f"nothing could be checked: {why}" + (f" (unsupported: {kinds})" if kinds else "")
        )
    if output:
        write_object_report(output, report.to_json(), lambda out: write_csv(report.rows, out))
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(report.to_json()) + "\n")
    else:
        sys.stdout.write(summary_line(report) + "\n")
        sys.stdout.write("".join(line + "\n" for line in note_lines(report.notes)))
    return EXIT_FINDING if report.failed or report.errors else EXIT_OK
