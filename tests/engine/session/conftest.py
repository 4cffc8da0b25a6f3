"""Fixtures for the session tests: the toy model of ``support.toy_model`` run golden/clean/faulty."""

from __future__ import annotations

import pytest
from support.toy_model import Fault, ToyModel, ToyRun


@pytest.fixture(scope="session")
def toy() -> ToyModel:
    return ToyModel()


@pytest.fixture(scope="session")
def toy_runs(tmp_path_factory: pytest.TempPathFactory, toy: ToyModel) -> dict[str, ToyRun]:
    """Golden fp32; a clean fp32 re-run; a faulty run (layer 1 down_proj ×1.05 plus noise, from token 1)."""
    base = tmp_path_factory.mktemp("toy")
    golden = toy.run(base / "golden")
    clean = toy.run(base / "clean")
    fault = Fault("root.model.layers.1.mlp.down_proj", start=1, scale=1.0, noise=0.3)
    faulty = toy.run(
        base / "faulty", fault=fault, feed={t: golden.token_ids[t][0] for t in range(1, 4)}
    )
    return {"golden": golden, "clean": clean, "faulty": faulty}
