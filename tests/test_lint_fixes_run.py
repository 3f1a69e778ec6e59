"""Every rule's fixed examples run: a fix is judged by executing what it wrote (on the CPU, one
process, with accelify's runtime), not only by comparing its text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from accelify.lint.registry import all_rules

pytest.importorskip("torch")

RUNNER = Path(__file__).with_name("fixed_example_runner.py")
FIXED = {
    f"{rule.code}-{index}": example.fixed
    for rule in all_rules()
    for index, example in enumerate(rule.bad)
    if example.fixed is not None
}


def test_every_fixed_example_runs():
    assert FIXED, "no rule has a fix"
    done = subprocess.run(
        [sys.executable, str(RUNNER)],
        input=json.dumps(list(FIXED.items())),
        capture_output=True,
        text=True,
        timeout=300,
        env={"ACCELIFY_USE_CPU": "true", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(done.stdout.splitlines()[-1])  # the examples print above it
    failures = {key: error for key, error in outcomes.items() if error}
    assert failures == {}, "\n".join(f"{key}:\n{error}" for key, error in failures.items())
