"""Golden conversions that also run: fixtures/convert/<case>/ with a `runnable` marker.

Each such before.py is a tiny, complete training script (synthetic data, a few steps) of a shape
code in the wild has: trainer classes, factories, models trained in turn. Its after.py:
1. lints clean with every rule selected;
2. passes `accelify verify --to-end`: on one process it prints exactly what before.py prints
   (check 1 compares every printed line), and on 2 ranks it runs in step, sharded, with its
   evaluation gathered (check 2).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import FIXTURES, assert_ok, run_accelify

RUNNABLE = sorted(path.parent for path in (FIXTURES / "convert").glob("*/runnable"))


def test_there_are_runnable_cases():
    assert len(RUNNABLE) >= 5


@pytest.mark.parametrize("case", RUNNABLE, ids=lambda case: case.name)
def test_the_conversion_lints_clean_with_every_rule(case: Path):
    result = run_accelify("lint", "--select", "ALL", case / "after.py")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.distributed
@pytest.mark.parametrize("case", RUNNABLE, ids=lambda case: case.name)
def test_verify_to_the_end_passes_on_two_ranks(case: Path, tmp_path: Path):
    result = run_accelify(
        "verify", case / "before.py", case / "after.py", "--to-end", cwd=tmp_path, timeout=400
    )
    assert_ok(result)
    assert "verdict: PASS" in result.stdout
    assert re.search(r"all [1-9]\d* printed lines identical", result.stdout), result.stdout
