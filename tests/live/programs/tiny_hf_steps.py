"""A plain inference script for the live scan tests: a tiny fp16 Llama, one forward per step.

``python tiny_hf_steps.py benign|nan STEPS``: ``nan`` swaps layer 1's activation for ``log``
(NaN for every negative input). Each step sleeps a little, like a slow decode loop, so a
supervisor that stops the run at the first anomaly can be seen to stop it early.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import tiny_hf

model = tiny_hf.build("llama", torch.float16)
if sys.argv[1] == "nan":
    tiny_hf.set_module(model, tiny_hf.ACT["llama"], tiny_hf.Lambda(torch.log))
ids = tiny_hf.prompt()
with torch.no_grad():
    for step in range(int(sys.argv[2])):
        model(ids)
        time.sleep(0.2)
        print("step", step, flush=True)
