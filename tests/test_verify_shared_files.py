"""verify's shared-files check: a file the main process writes and every rank reads back, read
from the converted code (a run shows the race only when rank 1 happens to get there first)."""

from __future__ import annotations

from accelify.verify.checks import CheckResult, numbered
from accelify.verify.shared_files_code import check_shared_files_code

CONVERTED = """\
import torch
from accelify import Accelerator, PartialState


class EarlyStopping:
    def __init__(self, path="checkpoint.pt"):
        self.path = path

    def __call__(self, model):
        if PartialState().is_main_process:
            torch.save(model.state_dict(), self.path)


class Trainer:
    def __init__(self, model):
        self.accelerator = Accelerator()
        self.model = self.accelerator.prepare(model)
        self.best_path = "checkpoints/best.pt"
        self.early_stopping = EarlyStopping(path=self.best_path)

    def fit(self):
        self.early_stopping(self.accelerator.unwrap_model(self.model))


def main(model):
    trainer = Trainer(model)
    trainer.fit()
{barrier}    best = torch.load(trainer.best_path)
"""


def test_a_read_back_with_no_barrier_fails_at_its_line():
    result = check_shared_files_code(CONVERTED.format(barrier=""), "train.py")
    assert result is not None and not result.passed
    assert result.rows == [["28", "11", "RACE: no barrier between them"]]
    assert result.verdict.startswith("FAIL: converted line 28 reads a file")


def test_a_read_back_behind_a_barrier_passes():
    barrier = "    trainer.accelerator.wait_for_everyone()\n"
    result = check_shared_files_code(CONVERTED.format(barrier=barrier), "train.py")
    assert result is not None and result.passed
    assert result.rows == [["29", "11", "ordered"]]


def test_a_conversion_that_reads_back_no_file_shows_no_such_check():
    code = "from accelify import Accelerator\naccelerator = Accelerator()\nprint(1)\n"
    assert check_shared_files_code(code, "train.py") is None


def test_a_run_to_the_end_numbers_its_checks_without_a_gap():
    """`--to-end` reads no evaluation from the code: the shared-files check that follows the two
    runs is check 3, not check 4 (the report once read 1, 2, 4)."""
    shared = check_shared_files_code(CONVERTED.format(barrier=""), "train.py")
    assert shared is not None
    runs = [CheckResult("one process", True, "", []), CheckResult("2 ranks", True, "", [])]
    titles = [check.title for check in numbered([*runs, shared])]
    assert titles == [
        "check 1: one process",
        "check 2: 2 ranks",
        "check 3: files written on the main process and read by every rank, read from the code",
    ]
