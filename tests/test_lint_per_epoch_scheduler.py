"""ACC408 and the converter agree on what steps once per epoch: each conversion that made its
Accelerator with ``step_scheduler_with_optimizer=False`` because a scheduler steps per epoch
is silent as written, and reported at that scheduler's ``prepare`` argument once the setting
is taken away (what a user who drops it, or writes the script by hand, gets)."""

from __future__ import annotations

import re

import pytest

from accelify.lint.engine import lint_source
from accelify.lint.selection import Selection
from conftest import FIXTURES

PER_EPOCH = [
    "dataclass_trainer",
    "device_chosen_by_a_flag",
    "helpers_threaded",
    "plateau_on_training_loss",
    "scheduler_type_checked_after_prepare",
    "steplr_per_epoch",
    "trainer_method_accumulates",
    "trainer_receives_kwargs",
    "transfer_learning_tutorial",
]
SETTING = re.compile(r"step_scheduler_with_optimizer=False,?")


def acc408(source: str) -> list[str]:
    result = lint_source(source.encode(), "after.py", Selection(select=["ACC408"]))
    return [finding.message for finding in result.findings]


@pytest.mark.parametrize("case", PER_EPOCH)
def test_a_converted_per_epoch_scheduler_is_reported_only_without_the_setting(case: str):
    source = (FIXTURES / "convert" / case / "after.py").read_text()
    assert SETTING.search(source), "the conversion no longer sets step_scheduler_with_optimizer"
    assert acc408(source) == []
    [message] = acc408(SETTING.sub("", source))
    assert "is stepped once per epoch (line" in message
