"""Checkpoints interchange with HF Accelerate: a directory one library's save_state wrote loads
in the other's load_state with the weights, optimizer state, scheduler position and RNG state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES

pytest.importorskip("accelerate")
SCRIPT = FIXTURES / "runtime" / "checkpoint_interchange.py"


def _run(library: str, action: str, directory: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), library, action, str(directory)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(("saver", "loader"), [("hf", "accelify"), ("accelify", "hf")])
def test_one_library_loads_what_the_other_saved(saver, loader, tmp_path: Path):
    saved = _run(saver, "save", tmp_path / "ckpt")
    loaded = _run(loader, "load", tmp_path / "ckpt")
    assert loaded == saved  # weights, momentum, LR position, and the next random draws


def test_accelify_writes_accelerates_layout(tmp_path: Path):
    _run("accelify", "save", tmp_path / "ckpt")
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= names
