"""`accelify verify --to-end` tells an evaluation's own gather from one its caller makes after it.

A conversion that leaves an evaluation loader whole (its batches are ragged) and then sums the
training loss over the ranks with ``gather_object`` once ``evaluate()`` has returned is right:
the gather is the training loss's, not the evaluation's. Counted up to the next pass's start,
it was taken for the evaluation's own and check 2 said the evaluation "joins 2 copies". The
same gather made inside ``evaluate()`` does join a copy per rank, and still fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accelify.convert import convert_source
from conftest import FIXTURES, run_accelify

SCRIPT = FIXTURES / "verify" / "evaluation" / "seq2seq_left_whole.py"
#: the conversion's last lines of evaluate(), and the same with the evaluation's counts summed
#: over the ranks: every rank evaluated all of the set, so each sum holds two copies
RETURNED = "    model.train()\n    return correct / tokens\n"
GATHERED_INSIDE = (
    "    correct = sum(gather_object([correct]))\n"
    "    tokens = sum(gather_object([tokens]))\n" + RETURNED
)


def _conversion() -> str:
    converted = convert_source(SCRIPT.read_bytes(), SCRIPT.name).converted.decode()
    # the shape this test is about: the evaluation loader left whole, the training loss
    # gathered after evaluate() has returned
    assert "accelerator.prepare(model, optimizer, train_loader)" in converted
    evaluated = converted.index("acc = evaluate(")
    assert converted.index("gather_object([total])") > evaluated
    assert converted.count(RETURNED) == 1
    return converted


@pytest.mark.distributed
def test_a_gather_made_after_the_evaluation_returned_is_not_the_evaluations(tmp_path: Path):
    converted = tmp_path / "converted.py"
    converted.write_text(_conversion())
    result = run_accelify("verify", SCRIPT, converted, "--to-end", "--json", cwd=tmp_path)
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    check_1, check_2 = report["checks"]
    assert check_1["passed"] and check_2["passed"], check_2["verdict"]
    assert "joins" not in check_2["verdict"]


@pytest.mark.distributed
def test_a_gather_made_inside_the_evaluation_over_a_whole_loader_still_fails(tmp_path: Path):
    converted = tmp_path / "converted.py"
    converted.write_text(_conversion().replace(RETURNED, GATHERED_INSIDE))
    result = run_accelify("verify", SCRIPT, converted, "--to-end", "--json", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    check_1, check_2 = json.loads(result.stdout)["checks"]
    assert check_1["passed"] is True  # on one process the gather joins one copy
    assert check_2["passed"] is False
    assert "the evaluation loop at line 48 runs over all 4 batches" in check_2["verdict"]
    assert "joins 2 copies of every sample" in check_2["verdict"]
