"""Real data for engine tests (session, and anyone who needs a realistic comparison): a tiny numpy transformer run twice, every tensor in a file.

The toy model has the shape of a Llama (embedding, decoder layers with a norm, attention with
projections and an MLP with residual adds, final norm, lm_head) and runs greedy decoding.
Each node's inputs and outputs are written as raw little-endian files and described by real
``Locator``/``TensorRecord`` objects, in completion order, with a topology — what a reader
would hand the session. A fault multiplies one node's output from a given token on, and the
damage propagates downstream as it would in a real model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from layerwatch.engine.readers.base import ReaderUpdate
from layerwatch.engine.records import Locator, ParamPrint, TensorKey, TensorRecord, Topology


def bf16_bytes(array: np.ndarray) -> bytes:
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return bits.tobytes()


def write_tensor(path: Path, array: np.ndarray, dtype: str) -> Locator:
    """Write ``array`` as raw bytes of ``dtype`` (``bfloat16`` rounded to nearest even)."""
    array = np.asarray(array)
    payload = (
        bf16_bytes(array)
        if dtype == "bfloat16"
        else np.ascontiguousarray(array, dtype=dtype).tobytes()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return Locator(str(path), 0, len(payload), dtype, tuple(array.shape))


def print_of(weight: np.ndarray, dtype: str) -> ParamPrint:
    if dtype == "bfloat16":
        bits = np.frombuffer(bf16_bytes(weight), np.uint16).astype(np.uint32) << 16
        weight = bits.view(np.float32).reshape(np.shape(weight))
    flat = np.asarray(weight, np.float64).reshape(-1)
    return ParamPrint(
        tuple(np.shape(weight)),
        dtype,
        float(flat.sum()),
        float(np.abs(flat).sum()),
        float(np.sqrt(flat @ flat)),
        tuple(float(v) for v in flat[:16]),
    )


@dataclass
class Fault:
    node: str
    start: int = 0
    scale: float = 1.0
    noise: float = 0.0


@dataclass
class ToyRun:
    """One run of the toy model: its records, topology and token ids, ready to feed a session."""

    records: list[TensorRecord] = field(default_factory=list)
    topology: Topology = field(default_factory=Topology)
    token_ids: dict[int, tuple[int, ...]] = field(default_factory=dict)
    generated: list[int] = field(default_factory=list)

    def update(self, *, topology: bool = True) -> ReaderUpdate:
        return ReaderUpdate(
            list(self.records), self.topology if topology else None, dict(self.token_ids)
        )


class ToyModel:
    """``root`` (ToyForCausalLM) > ``model`` > embed_tokens, layers.N, norm; ``lm_head``."""

    def __init__(self, layers: int = 3, hidden: int = 32, vocab: int = 61, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.layers, self.hidden, self.vocab = layers, hidden, vocab
        w = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)  # noqa: E731
        self.params: dict[str, np.ndarray] = {"root.model.embed_tokens.weight": w(vocab, hidden)}
        for i in range(layers):
            p = f"root.model.layers.{i}"
            self.params[f"{p}.input_layernorm.weight"] = (
                1 + 0.1 * rng.standard_normal(hidden)
            ).astype(np.float32)
            for name, shape in (
                ("self_attn.q_proj", (hidden, hidden)),
                ("self_attn.o_proj", (hidden, hidden)),
                ("mlp.up_proj", (hidden, 2 * hidden)),
                ("mlp.down_proj", (2 * hidden, hidden)),
            ):
                self.params[f"{p}.{name}.weight"] = w(*shape)
        self.params["root.model.norm.weight"] = (1 + 0.1 * rng.standard_normal(hidden)).astype(
            np.float32
        )
        self.params["root.lm_head.weight"] = w(hidden, vocab)

    def topology(self, dtype: str = "float32", types: dict[str, str] | None = None) -> Topology:
        topo = Topology()
        types = types or {}
        order = self._order()
        topo.add("root", types.get("root", "ToyForCausalLM"), None, order["root"])
        topo.add("root.model", "ToyModel", "root", order["root.model"])
        topo.add(
            "root.model.embed_tokens", "Embedding", "root.model", order["root.model.embed_tokens"]
        )
        topo.add("root.model.layers", "ModuleList", "root.model")
        for i in range(self.layers):
            p = f"root.model.layers.{i}"
            topo.add(p, "ToyDecoderLayer", "root.model.layers", order[p])
            for child, type_ in (
                ("input_layernorm", "RMSNorm"),
                ("self_attn", "ToyAttention"),
                ("mlp", "ToyMLP"),
            ):
                topo.add(f"{p}.{child}", type_, p, order[f"{p}.{child}"])
            for child, type_ in (("q_proj", "Linear"), ("o_proj", "Linear")):
                topo.add(
                    f"{p}.self_attn.{child}",
                    type_,
                    f"{p}.self_attn",
                    order[f"{p}.self_attn.{child}"],
                )
            for child, type_ in (
                ("up_proj", "Linear"),
                ("act_fn", "SiLU"),
                ("down_proj", "Linear"),
            ):
                topo.add(f"{p}.mlp.{child}", type_, f"{p}.mlp", order[f"{p}.mlp.{child}"])
        topo.add("root.model.norm", "RMSNorm", "root.model", order["root.model.norm"])
        topo.add("root.lm_head", "Linear", "root", order["root.lm_head"])
        for full, weight in self.params.items():
            node, local = full.rsplit(".", 1)
            topo.nodes[node].params[local] = print_of(weight, dtype)
        return topo

    def _order(self) -> dict[str, int]:
        names = ["root.model.embed_tokens"]
        for i in range(self.layers):
            p = f"root.model.layers.{i}"
            names += [
                f"{p}.input_layernorm",
                f"{p}.self_attn.q_proj",
                f"{p}.self_attn.o_proj",
                f"{p}.self_attn",
                f"{p}.mlp.up_proj",
                f"{p}.mlp.act_fn",
                f"{p}.mlp.down_proj",
                f"{p}.mlp",
                p,
            ]
        names += ["root.model.norm", "root.model", "root.lm_head", "root"]
        return {n: i for i, n in enumerate(names)}

    def run(
        self,
        out: Path,
        *,
        dtype: str = "float32",
        tokens: int = 4,
        prompt: tuple[int, ...] = (3, 1, 4, 1),
        fault: Fault | None = None,
        feed: dict[int, int] | None = None,
        inputs: bool = True,
    ) -> ToyRun:
        """Greedy decoding; ``feed`` forces the input id at a token (to make runs diverge)."""
        result = ToyRun(topology=self.topology(dtype))
        order = self._order()
        seq = 0
        ids: tuple[int, ...] = prompt

        def emit(token: int, node: str, stem: str, value: np.ndarray, node_type: str) -> None:
            nonlocal seq
            is_float = value.dtype.kind == "f"
            store = dtype if is_float else str(value.dtype)
            loc = write_tensor(out / f"{seq:05d}.bin", value, store)
            seq += 1
            result.records.append(
                TensorRecord(
                    TensorKey(token, node, stem),
                    store,
                    tuple(value.shape),
                    loc,
                    order=order[node],
                    node_type=node_type,
                    source=loc.path,
                )
            )

        def q(x: np.ndarray) -> np.ndarray:  # what the target's dtype keeps of a value
            if dtype != "bfloat16":
                return x
            bits = np.frombuffer(bf16_bytes(x), np.uint16).astype(np.uint32) << 16
            return bits.view(np.float32).reshape(x.shape)

        for token in range(tokens):
            if feed and token in feed:
                ids = (feed[token],)
            result.token_ids[token] = ids
            ids_arr = np.array([ids], dtype=np.int64)

            def op(
                node: str,
                node_type: str,
                args: list[np.ndarray],
                value: np.ndarray,
                token: int = token,
            ) -> np.ndarray:
                value = q(value.astype(np.float32))
                if fault is not None and fault.node == node and token >= fault.start:
                    rng = np.random.default_rng(token)
                    value = (
                        value * fault.scale
                        + fault.noise * value.std() * rng.standard_normal(value.shape)
                    ).astype(np.float32)
                if inputs:
                    for i, arg in enumerate(args):
                        emit(token, node, f"input_{i}", arg, node_type)
                emit(token, node, "output", value, node_type)
                return value

            P = self.params
            h = op(
                "root.model.embed_tokens",
                "Embedding",
                [ids_arr],
                P["root.model.embed_tokens.weight"][ids_arr],
            )
            for i in range(self.layers):
                p = f"root.model.layers.{i}"
                x_in = h
                n = op(
                    f"{p}.input_layernorm",
                    "RMSNorm",
                    [h],
                    _rms(h) * P[f"{p}.input_layernorm.weight"],
                )
                qv = op(
                    f"{p}.self_attn.q_proj", "Linear", [n], n @ P[f"{p}.self_attn.q_proj.weight"]
                )
                a = np.tanh(qv)
                if (
                    fault is not None
                    and fault.node == f"{p}.self_attn.tanh"
                    and token >= fault.start
                ):
                    a = a * fault.scale  # an operator no hook sees: only o_proj's input shows it
                o = op(
                    f"{p}.self_attn.o_proj", "Linear", [a], a @ P[f"{p}.self_attn.o_proj.weight"]
                )
                attn = op(f"{p}.self_attn", "ToyAttention", [n], o)
                h = h + attn
                u = op(f"{p}.mlp.up_proj", "Linear", [h], h @ P[f"{p}.mlp.up_proj.weight"])
                act = op(f"{p}.mlp.act_fn", "SiLU", [u], u / (1 + np.exp(-u)))
                d = op(f"{p}.mlp.down_proj", "Linear", [act], act @ P[f"{p}.mlp.down_proj.weight"])
                m = op(f"{p}.mlp", "ToyMLP", [h], d)
                h = op(p, "ToyDecoderLayer", [x_in], h + m)
            normed = op("root.model.norm", "RMSNorm", [h], _rms(h) * P["root.model.norm.weight"])
            op("root.model", "ToyModel", [ids_arr], normed)
            logits = op("root.lm_head", "Linear", [normed], normed @ P["root.lm_head.weight"])
            op("root", "ToyForCausalLM", [ids_arr], logits)
            nxt = int(np.argmax(logits[0, -1]))
            result.generated.append(nxt)
            ids = (nxt,)
        return result


def renamed(run: ToyRun, rename: dict[str, str], types: dict[str, str] | None = None) -> ToyRun:
    """The same tensors under other module names and classes (another implementation of the model).

    ``rename`` maps node names (exact); parents follow the new dotted names; ``types`` maps old
    class names to new ones.
    """
    types = types or {}
    topo = Topology()
    old = run.topology
    new_names = {n: rename.get(n, n) for n in old.nodes}
    for name in sorted(old.nodes, key=lambda n: new_names[n].count(".")):
        node = old.nodes[name]
        new = new_names[name]
        parent = new.rsplit(".", 1)[0] if "." in new else None
        if parent is not None and parent not in topo.nodes:
            topo.add(parent, "", parent.rsplit(".", 1)[0] if "." in parent else None)
        added = topo.add(new, types.get(node.type, node.type), parent, node.order)
        added.params = dict(node.params)
    records = [
        replace(
            r,
            key=r.key._replace(node=new_names.get(r.key.node, r.key.node)),
            node_type=types.get(r.node_type, r.node_type),
        )
        for r in run.records
    ]
    return ToyRun(records, topo, dict(run.token_ids), list(run.generated))


META_TYPES = {
    "ToyForCausalLM": "Transformer",
    "ToyDecoderLayer": "TransformerBlock",
    "ToyAttention": "Attention",
    "ToyMLP": "FeedForward",
    "RMSNorm": "MetaRMSNorm",
}
"""The toy's classes under Meta-Llama names (``renamed(run, meta_names(n), META_TYPES)``)."""


def meta_names(layers: int) -> dict[str, str]:
    """HF-style toy names → Meta-Llama-style names (no ``model`` level, other attribute names)."""
    out = {
        "root.model.embed_tokens": "root.tok_embeddings",
        "root.model.norm": "root.norm",
        "root.lm_head": "root.output",
        "root.model.layers": "root.layers",
        "root.model": "root.model_impl",
    }
    for i in range(layers):
        g, t = f"root.model.layers.{i}", f"root.layers.{i}"
        out.update(
            {
                g: t,
                f"{g}.input_layernorm": f"{t}.attention_norm",
                f"{g}.self_attn": f"{t}.attention",
                f"{g}.self_attn.q_proj": f"{t}.attention.wq",
                f"{g}.self_attn.o_proj": f"{t}.attention.wo",
                f"{g}.mlp": f"{t}.feed_forward",
                f"{g}.mlp.up_proj": f"{t}.feed_forward.w1",
                f"{g}.mlp.act_fn": f"{t}.feed_forward.act",
                f"{g}.mlp.down_proj": f"{t}.feed_forward.w2",
            }
        )
    return out


def _rms(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6).astype(
        np.float32
    )
