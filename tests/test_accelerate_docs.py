"""A converted script that grows by following the Accelerate docs (trackers, logging, project
configuration, checkpoint hooks, kwargs handlers) runs unchanged on `accelify launch`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FIXTURES, assert_ok, launch

pytestmark = pytest.mark.distributed
SCRIPT = FIXTURES / "runtime" / "accelerate_docs.py"


def _report(result) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, result.stdout  # the main process alone reports
    return json.loads(lines[0])


def _scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_trackers_logging_project_configuration_and_hooks_on_two_ranks(tmp_path: Path):
    pytest.importorskip("tensorboard")
    result = launch(SCRIPT, tmp_path)
    assert_ok(result)
    lines = result.stdout.splitlines()
    assert lines.count("INFO training on 2 processes") == 1  # logger: the main process only
    assert {"INFO rank 0 ready", "INFO rank 1 ready"} <= set(lines)  # main_process_only=False
    report = _report(result)
    assert report["distributed_type"] == "MULTI_CPU" and report["multi"]
    assert report["find_unused_parameters"] is True  # DistributedDataParallelKwargs reached DDP
    # automatic_checkpoint_naming counts 0, 1, 2; total_limit=2 keeps the newest two
    assert report["checkpoints"] == ["checkpoint_1", "checkpoint_2"]
    assert report["iteration"] == 3  # load_state() read checkpoint_2 and counts on after it
    # the save hook wrote the model itself and popped its weights: no model.safetensors
    assert "model.pt" in report["files"] and "model.safetensors" not in report["files"]
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= set(report["files"])
    assert report["restored"] and report["hooks"] == ["save", "save", "save", "load"]
    run = Path(report["tracker_dir"])
    assert run == tmp_path / "docs_run"
    assert [step for step, _ in _scalars(run, "loss")] == [0, 1, 2]  # logged once per epoch
    assert len(list(run.glob("events.out.tfevents.*"))) == 1  # one writer: the main process
    assert "lr: 0.1" in (run / "hparams.yml").read_text()


def test_the_same_script_runs_on_one_process(tmp_path: Path):
    pytest.importorskip("tensorboard")
    result = launch(SCRIPT, tmp_path, processes=1)
    assert_ok(result)
    report = _report(result)
    assert report["distributed_type"] == "NO"
    assert report["checkpoints"] == ["checkpoint_1", "checkpoint_2"] and report["restored"]


def test_a_wandb_run_offline_is_started_once_with_the_config_and_the_values(tmp_path: Path):
    pytest.importorskip("wandb")
    environment = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    result = launch(FIXTURES / "runtime" / "wandb_offline.py", env=environment, cwd=tmp_path)
    assert_ok(result)
    report = _report(result)
    assert report["lr"] == 0.5
    # wandb commits a step's values when a later step begins (the last at finish), so the live
    # summary holds one of the losses logged so far, not necessarily the last
    assert report["loss"] in (1.0, 0.5, pytest.approx(1 / 3))
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1  # the main process only
