"""A scheduler sized with ``len()`` of a loader the conversion prepares before the scheduler is
made (the loader is used first: a warm-up pass): the length is one rank's shard, and a prepared
scheduler steps num_processes times per call. The conversion sizes it in all ranks' steps
(``len(loader) * accelerator.num_processes``), so our own lint (ACC415) finds nothing."""

from __future__ import annotations

import pytest

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
