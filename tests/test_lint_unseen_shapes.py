"""Shapes found by reading real Accelerate trainers nobody here had seen (issue 19): where a
finding says the other ranks wait, and what it leaves alone."""

from __future__ import annotations

from test_lint_rules import lint

from accelify.rules.exit_on_some_ranks import EXIT_BEFORE_THE_BARRIER, EXIT_IN_THE_BATCH_LOOP


def test_an_exit_names_the_barrier_the_others_reach_next_not_the_next_epochs_backward():
    [finding] = [f for f in lint(EXIT_BEFORE_THE_BARRIER, "ACC210").findings]
    assert (finding.line, finding.code) == (9, "ACC210")
    assert "collective at line 11" in finding.message, finding.message


def test_an_exit_in_the_batch_loop_names_the_next_batchs_backward_not_the_evaluation():
    """trial17: rank 1 exits in the batch loop; the others wait in the next batch's backward
    (the loop's back-edge), not at the gather after the batch loop."""
    [finding] = [f for f in lint(EXIT_IN_THE_BATCH_LOOP, "ACC210").findings]
    assert (finding.line, finding.code) == (8, "ACC210")
    assert "collective at line 6 " in finding.message, finding.message
