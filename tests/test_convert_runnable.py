"""Golden conversions that also run: fixtures/convert/<case>/ with a `runnable` marker.

Each such before.py is a tiny, complete training script (synthetic data, a few steps) of a shape
code in the wild has: trainer classes, factories, models trained in turn. Its after.py:
1. lints clean with every rule selected;
2. on one process prints exactly what before.py prints;
3. passes `accelify verify --to-end` on 2 ranks (in step, sharded, evaluation gathered).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import FIXTURES, assert_ok, run_accelify, run_python

RUNNABLE = sorted(path.parent for path in (FIXTURES / "convert").glob("*/runnable"))


def test_there_are_runnable_cases():
    assert len(RUNNABLE) >= 5


@pytest.mark.parametrize("case", RUNNABLE, ids=lambda case: case.name)
def test_the_conversion_lints_clean_with_every_rule(case: Path):
    result = run_accelify("lint", "--select", "ALL", case / "after.py")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", RUNNABLE, ids=lambda case: case.name)
def test_one_process_prints_exactly_what_the_original_prints(case: Path, tmp_path: Path):
    (tmp_path / "original").mkdir()
    (tmp_path / "converted").mkdir()
    original = run_python(case / "before.py", cwd=tmp_path / "original")
    converted = run_python(case / "after.py", cwd=tmp_path / "converted")
    assert_ok(original)
    assert_ok(converted)
    assert original.stdout.strip(), "the fixture prints nothing to compare"
    assert converted.stdout == original.stdout


@pytest.mark.distributed
@pytest.mark.parametrize("case", RUNNABLE, ids=lambda case: case.name)
def test_verify_to_the_end_passes_on_two_ranks(case: Path, tmp_path: Path):
    result = run_accelify(
        "verify", case / "before.py", case / "after.py", "--to-end", cwd=tmp_path, timeout=400
    )
    assert_ok(result)
    assert "verdict: PASS" in result.stdout
