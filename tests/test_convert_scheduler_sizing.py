"""A scheduler sized with ``len()`` of a loader the conversion prepares before the scheduler is
made (the loader is used first: a warm-up pass): the length is one rank's shard, and a prepared
scheduler steps num_processes times per call. The conversion sizes it in all ranks' steps
(``len(loader) * accelerator.num_processes``), so our own lint (ACC415) finds nothing."""

from __future__ import annotations

import pytest

from accelify.convert import convert_source
from accelify.lint.engine import lint_source
from accelify.lint.selection import Selection
from conftest import FIXTURES

CASES = [
    "loader_used_before_the_scheduler_it_sizes",
    "loaders_dict_used_before_the_scheduler_it_sizes",
]


@pytest.mark.parametrize("case", CASES)
def test_the_conversion_sizes_the_scheduler_in_all_ranks_steps_and_lints_clean(case: str):
    after = FIXTURES / "convert" / case / "after.py"
    source = after.read_text()
    assert "* accelerator.num_processes)" in source
    assert "scheduler = accelerator.prepare(scheduler)" in source
    found = lint_source(source.encode(), str(after), Selection(select=["ACC415", "ACC401"]))
    assert found.findings == []
    # the golden before it (left prepared, sized per rank) is what ACC415 reports
    unsized = source.replace(" * accelerator.num_processes)", ")")
    again = lint_source(unsized.encode(), str(after), Selection(select=["ACC415"]))
    assert [f.code for f in again.findings] == ["ACC415"]


RECEIVED = FIXTURES / "convert" / "scheduler_sized_by_a_loader_a_constructor_prepares_as_received"


def test_a_class_that_prepares_its_loader_as_received_sizes_its_scheduler_the_same_way():
    """One policy for both shapes (`shard_lengths`): the scheduler of a class that prepares its
    loader in __init__ stays prepared, its ``len()`` sized in all ranks' steps, found through
    the local binding ``steps = len(self.loader) * self.epochs``."""
    source = (RECEIVED / "after.py").read_text()
    assert "steps = (len(self.loader) * self.accelerator.num_processes) * self.epochs" in source
    assert "model, optimizer, scheduler = self.accelerator.prepare(" in source
    found = lint_source(source.encode(), str(RECEIVED), Selection(select=["ACC415", "ACC401"]))
    assert found.findings == []


def test_a_step_count_read_besides_the_scheduler_is_left_with_a_review_line():
    # ``steps`` is printed too: rewriting its len() would change what 2 ranks print
    before = (RECEIVED / "before.py").read_text()
    source = before.replace(
        "        scheduler = torch.optim",
        '        print(f"{steps} steps")\n        scheduler = torch.optim',
    )
    conversion = convert_source(source.encode(), "trainer.py")
    code = conversion.converted.decode()
    assert "self.accelerator.num_processes" not in code
    (review,) = [note for note in conversion.reviews if "is sized from self.loader" in note.text]
    assert "multiply those counts by self.accelerator.num_processes" in review.text


def test_a_per_epoch_scheduler_sized_by_a_received_loader_keeps_the_whole_sets_size():
    """Stepped once per epoch, the prepared scheduler steps once per call
    (step_scheduler_with_optimizer=False), and its size in all ranks' steps is the whole
    set's, as on one process: the policy holds at either pace."""
    before = (RECEIVED / "before.py").read_text()
    source = (
        before.replace(
            "OneCycleLR(optimizer, max_lr=0.1, total_steps=steps)",
            "StepLR(optimizer, step_size=steps)",
        )
        .replace("                scheduler.step()\n", "")
        .replace(
            '            print(f"epoch', '            scheduler.step()\n            print(f"epoch'
        )
    )
    assert source != before
    code = convert_source(source.encode(), "trainer.py").converted.decode()
    assert "Accelerator(step_scheduler_with_optimizer=False)" in code
    assert "steps = (len(self.loader) * self.accelerator.num_processes) * self.epochs" in code
    assert "model, optimizer, scheduler = self.accelerator.prepare(" in code
