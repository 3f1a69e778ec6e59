"""Checkpoints interchange with HF Accelerate: a directory one library's save_state wrote loads
in the other's load_state with the weights, optimizer state, scheduler position and RNG state."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import FIXTURES, assert_ok, launch, run_in_own_group

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


@pytest.fixture(scope="module")
def saved_by(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, dict]]:
    """A library's checkpoint on one process, written once for the tests that read it (one
    xdist group: one worker runs them): its directory, and what the saving run reported."""
    made: dict[str, tuple[Path, dict]] = {}

    def save(library: str) -> tuple[Path, dict]:
        if library not in made:
            directory = tmp_path_factory.mktemp(f"saved_by_{library}") / "ckpt"
            made[library] = directory, _run(library, "save", directory)
        return made[library]

    return save


@pytest.mark.xdist_group("checkpoint_one_process")
@pytest.mark.parametrize(("saver", "loader"), [("hf", "accelify"), ("accelify", "hf")])
def test_one_library_loads_what_the_other_saved(saver, loader, saved_by):
    directory, saved = saved_by(saver)
    loaded = _run(loader, "load", directory)
    assert loaded == saved  # weights, momentum, LR position, and the next random draws


@pytest.mark.xdist_group("checkpoint_one_process")
def test_accelify_writes_accelerates_layout(saved_by):
    directory, _ = saved_by("accelify")
    names = {p.name for p in directory.iterdir()}
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= names


def _run_on_two_ranks(library: str, action: str, directory: Path) -> dict[int, dict]:
    """HF under torchrun (``ACCELERATE_USE_CPU``: HF's multi-CPU mode), accelify under its
    launcher; one JSON line per rank."""
    arguments = [str(SCRIPT), library, action, str(directory)]
    if library == "hf":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            *arguments,
        ]
        env = {**os.environ, "ACCELERATE_USE_CPU": "1"}
        result = run_in_own_group(command, cwd=None, timeout=240, env=env)
    else:
        result = launch(*map(Path, arguments[:1]), *arguments[1:])
    assert_ok(result)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    by_rank = {line.pop("rank"): line for line in lines}
    assert sorted(by_rank) == [0, 1], result.stdout
    return by_rank


@pytest.mark.distributed
@pytest.mark.parametrize(("saver", "loader"), [("hf", "accelify"), ("accelify", "hf")])
def test_one_library_loads_what_the_other_saved_on_two_ranks(saver, loader, tmp_path: Path):
    saved = _run_on_two_ranks(saver, "save", tmp_path / "ckpt")
    assert saved[0]["next_draws"] != saved[1]["next_draws"]  # the ranks' states differ
    loaded = _run_on_two_ranks(loader, "load", tmp_path / "ckpt")
    assert loaded == saved  # on each rank: its weights, momentum, LR and its own random state
