"""Every named fault of the demo model is located: root cause = the faulty operator at the token
the fault starts, later tokens whose inputs differ are marked diverged, not blamed."""

from __future__ import annotations

from pathlib import Path

import pytest
from layerwatch.engine.readers import open_dump
from layerwatch.engine.records import Verdict
from layerwatch.engine.session.core import CompareSession

NEW_TOKENS = 7


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from layerwatch.capture import DumpConfig, register_hook
    from layerwatch.capture.demo import build_model, generate, make_prompt

    path = tmp_path_factory.mktemp("demo-golden")
    model = build_model()
    with register_hook(model, DumpConfig(dump_path=path)):
        generate(model, make_prompt(), NEW_TOKENS)
    return path


def fault_names() -> list[str]:
    from layerwatch.capture.demo import FAULTS

    return sorted(FAULTS)


@pytest.mark.slow
@pytest.mark.parametrize("name", fault_names())
def test_root_cause_is_the_faulty_operator(tmp_path: Path, golden: Path, name: str) -> None:
    from layerwatch.capture import DumpConfig, register_hook
    from layerwatch.capture.demo import FAULTS, build_model, generate, make_prompt

    fault = FAULTS[name]
    model = build_model(fault=name)
    with register_hook(model, DumpConfig(dump_path=tmp_path)):
        generate(model, make_prompt(), NEW_TOKENS)
    session = CompareSession()
    for side, path in (("golden", golden), ("target", tmp_path)):
        session.add_update(side, open_dump(path).poll(None))
        session.finish(side)
    session.flush()
    cause, first = session.root_cause, session.first_failure
    assert cause is not None and first is not None
    assert (cause.token, cause.node) == (fault.start_token, fault.node)
    assert (first.token, first.node) == (fault.start_token, fault.node)
    assert first.block_label == f"L{fault.layer}"
    assert session.first_bad_token is not None and session.first_bad_token >= fault.start_token
    results = session.results()
    assert all(
        r.verdict in (Verdict.PASS, Verdict.UNPAIRED)
        for r in results
        if r.key.token < fault.start_token
    )
    diverged = [r for r in results if r.verdict is Verdict.DIVERGED]
    assert all(r.key.token > fault.start_token for r in diverged)
