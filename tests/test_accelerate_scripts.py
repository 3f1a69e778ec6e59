"""Hugging Face Accelerate's own test scripts, from the installed `accelerate` wheel, run on 2 CPU
ranks case by case: once on HF Accelerate itself and once on accelify (`accelerate` names
resolved to accelify's by `tests/accelerate_compat/resolve.py`; HF's files are not copied).

A case is one test function `main()` calls. accelify must pass at least as many as HF passes on
the same machine, and every case that fails on accelify is a decision written down here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate_compat.driver import ScriptRun, run_cases

pytestmark = pytest.mark.distributed

SCRIPTS = ("test_ops", "test_sync", "test_distributed_data_loop", "test_script")

#: Cases that fail on accelify, with the reason. None today: every case of the four scripts that
#: runs on 2 CPU ranks passes.
ACCELIFY_FAILS: dict[str, str] = {}

#: Where HF Accelerate 1.15.0 itself fails on 2 CPU ranks (for the record; measured, not
#: asserted, since it is HF's behaviour):
#: - test_distributed_data_loop test_can_join_uneven_inputs hangs: HF's join_uneven_inputs is a
#:   no-op on MULTI_CPU, so the rank with more batches waits in DDP's all-reduce forever; the
#:   three join cases after it fail for the same reason (the override never happens).
#:   accelify joins DDP on gloo too.
#: - test_stateful_dataloader and test_stateful_dataloader_save_state need torchdata's
#:   StatefulDataLoader; accelify's prepared loaders save their position themselves.
#: - Under torch 2.13 an HF rank sometimes aborts at exit, after its last case (SIGABRT in the
#:   process group's teardown, the race accelify's runtime waits out): a problem of HF's run,
#:   recorded and not asserted. accelify's runs must end with every rank leaving cleanly.
#: One difference makes a case pass on accelify for another reason than on HF: training_check's
#: fp16 part runs only where `is_fp16_available()`; HF says True on CPU and trains in fp32
#: (mixed_precision="fp16" is silently not fp16), accelify refuses fp16 on CPU and its
#: `is_fp16_available()` says False there, so the part is skipped. The bf16 part runs on both.


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ScriptRun]:
    workdir = tmp_path_factory.mktemp("hf")
    return {name: run_cases("accelerate", name, workdir) for name in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS)
def test_accelerates_test_script_passes_on_accelify(
    script: str, hf_runs: dict[str, ScriptRun], tmp_path: Path
) -> None:
    ours = run_cases("accelify", script, tmp_path)
    theirs = hf_runs[script]
    log = (tmp_path / f"accelify-{script}.log").read_text()[-4000:]
    report = "\n".join(
        f"  {r.case}: {'pass' if r.ok else 'FAIL ' + r.error[:400]}" for r in ours.cases
    )
    details = f"accelify:\n{report}\nproblems: {ours.problems}\nlog tail:\n{log}"

    # every case ran, and every rank left cleanly (HF's own exit problems are HF's: not asserted)
    assert ours.problems == [], details
    ran = [r.case for r in ours.cases]
    assert set(r.case for r in theirs.cases) <= set(ran), details
    failing = {r.case for r in ours.cases if not r.ok}
    assert failing == {case for case in ACCELIFY_FAILS if case in ran}, details
    assert sum(r.ok for r in ours.cases) >= sum(r.ok for r in theirs.cases), details
