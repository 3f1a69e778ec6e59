"""Golden conversions that also run: fixtures/convert/<case>/ with a `runnable` marker.

Each such before.py is a tiny, complete training script (synthetic data, a few steps) of a shape
code in the wild has: trainer classes, factories, models trained in turn. Its after.py:
1. lints clean with every rule selected;
2. passes `accelify verify --to-end`: on one process it prints exactly what before.py prints
   (check 1 compares every printed line), and on 2 ranks it runs in step, sharded, with its
   evaluation gathered (check 2).

Check 2 launches five processes per case (about 12 CPU-seconds). The default run verifies a
cover of the cases (tests/feature_cover.py), with the kinds of change their summaries report at
run time as features too; `pytest --exhaustive` verifies every case. Every case's conversion
is still compared with its golden (test_convert_fixtures) and linted here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import FIXTURES, assert_ok, run_accelify
from feature_cover import covering, runtime_features

RUNNABLE = sorted(path.parent for path in (FIXTURES / "convert").glob("*/runnable"))

#: Kinds of change a summary reports whose effect shows only when the script runs
RUN_TIME_CHANGES = (
    "accumulat",
    "autocast",
    "break",
    "callback",
    "call_through_forward",
    "DataParallel",
    "early",
    "evaluation",
    "gather",
    "load",
    "logging",
    "main process",
    "metric",
    "numpy",
    "per process",
    "plateau",
    "review",
    "sampler",
    "save",
    "scheduler",
    "seed",
    "synchronize_rng",
    "tqdm",
    "unwrap",
    "wait_for_everyone",
    "whole",
)


def _features(case: Path) -> frozenset[str]:
    summary = (case / "summary.txt").read_text(encoding="utf-8")
    changes = {f"change {kind}" for kind in RUN_TIME_CHANGES if kind in summary}
    return runtime_features((case / "after.py").read_text(encoding="utf-8")) | changes


DEFAULT = covering({case: _features(case) for case in RUNNABLE})
VERIFIED = [
    pytest.param(case, id=case.name, marks=() if case in DEFAULT else pytest.mark.exhaustive)
    for case in RUNNABLE
]


def test_there_are_runnable_cases():
    assert len(RUNNABLE) >= 5


def test_the_default_run_verifies_a_cover_of_the_cases():
    assert 5 <= len(DEFAULT) < len(RUNNABLE)
    used = set().union(*map(_features, RUNNABLE))
    assert set().union(*map(_features, DEFAULT)) == used
    # no launch is redundant: each case verified by default has a feature no other one has
    for case in DEFAULT:
        others = set().union(*(_features(other) for other in DEFAULT if other != case))
        assert _features(case) - others, case.name


def test_a_greedy_pick_that_the_later_picks_cover_is_dropped():
    # greedy picks a (ties by name), then b, then c; b and c hold a's features between them
    features = {"a": frozenset("xy"), "b": frozenset("xz"), "c": frozenset("yw")}
    assert covering(features) == {"b", "c"}


@pytest.mark.distributed
@pytest.mark.parametrize("case", VERIFIED)
def test_verify_to_the_end_passes_on_two_ranks(case: Path, tmp_path: Path):
    result = run_accelify(
        "verify", case / "before.py", case / "after.py", "--to-end", cwd=tmp_path, timeout=400
    )
    assert_ok(result)
    assert "verdict: PASS" in result.stdout
    assert re.search(r"all [1-9]\d* printed lines identical", result.stdout), result.stdout
