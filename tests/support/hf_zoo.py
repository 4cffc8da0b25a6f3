"""A zoo of tiny Hugging Face causal LMs, captured by layerwatch's own hooks, for realistic runs.

A port is judged as an fp32 eager golden against a bf16/fp16 target; this zoo produces both for
transformers' own Llama, Qwen2, Mistral, Gemma and GPT-2 classes (``hf_models.py``), with random
or trained weights (``hf_train.py``; training grows the outlier activations and cancellations
that make low-precision rounding hurt), optionally with a porting-sized fault (``hf_faults.py``),
captured through ``register_hook`` by a greedy KV-cache loop with teacher forcing
(``hf_capture.py``). This module is the one entry point: import names from here.

Everything runs on CPU; nothing is downloaded.
"""

from __future__ import annotations

from .hf_capture import (
    capture,
    compare_json,
    decode,
    first_difference,
    golden_and_target,
    run_record,
)
from .hf_faults import FAULTS, Fault, faults_for
from .hf_models import ARCHS, DTYPES, build, config_for, layer_prefix, prompt_ids
from .hf_train import cache_dir, training_info

__all__ = [
    "ARCHS",
    "DTYPES",
    "FAULTS",
    "Fault",
    "build",
    "cache_dir",
    "capture",
    "compare_json",
    "config_for",
    "decode",
    "faults_for",
    "first_difference",
    "golden_and_target",
    "layer_prefix",
    "prompt_ids",
    "run_record",
    "training_info",
]
