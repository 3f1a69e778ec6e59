"""What lint rule ACC408 tells the user, on 1 and 2 real ranks: a prepared scheduler stepped
once per epoch runs N times faster on N processes, unless the Accelerator is made with
``step_scheduler_with_optimizer=False`` or the step is handed its epoch. Hugging Face
Accelerate 1.15 prints the same rates (checked by hand with ``torch.distributed.run``)."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, assert_ok, launch

pytestmark = pytest.mark.distributed
SCRIPT = FIXTURES / "runtime" / "epoch_scheduler_pace.py"
ONE_PROCESS = {
    "step": [1.0, 0.5, 0.5, 0.25, 0.25, 0.125],
    "plateau": [1.0, 1.0, 1.0, 0.5, 0.5, 0.5],
    "epoch": [1.0, 0.5, 0.5, 0.25, 0.25, 0.125],
}


def rates(processes: int, setting: str) -> dict[str, list[float]]:
    result = launch(SCRIPT, setting, processes=processes)
    assert_ok(result)
    [line] = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(line)


def test_one_process_steps_once_per_call_either_way():
    assert rates(1, "with-optimizer") == ONE_PROCESS
    assert rates(1, "on-its-own") == ONE_PROCESS


def test_two_processes_run_a_prepared_epoch_schedule_twice_as_fast():
    two = rates(2, "with-optimizer")
    assert two["step"] == [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625]  # decays every epoch
    assert two["plateau"] == [1.0, 0.5, 0.5, 0.25, 0.125, 0.125]  # patience of 2 calls, not 3
    assert two["epoch"] == ONE_PROCESS["epoch"]  # handed its epoch, it lands on it


def test_two_processes_keep_the_pace_without_step_scheduler_with_optimizer():
    assert rates(2, "on-its-own") == ONE_PROCESS
