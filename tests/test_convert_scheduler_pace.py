"""A scheduler stepped both per batch and per epoch: its per-batch steps become
``for _ in range(accelerator.num_processes): scheduler.step()`` only where that keeps the
original's pace exactly; elsewhere it is left as it is with review lines that say why. Runnable
goldens: scheduler_stepped_per_batch_and_per_epoch (and _in_methods) are rewritten and verify on
2 ranks; scheduler_stepped_per_batch_in_warmup_and_per_epoch is left for review."""

from __future__ import annotations

import pytest

from accelify.convert import convert_source

HEAD = (
    "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
    "model = nn.Linear(4, 1)\n"
    "loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
)
LOOP = (
    "for epoch in range(3):\n"
    "    for i, (x, y) in enumerate(loader):\n"
    "        loss = nn.functional.mse_loss(model(x), y)\n"
    "        optimizer.zero_grad()\n"
    "        loss.backward()\n"
    "        optimizer.step()\n"
    "        if {test}:\n"
    "            scheduler.step({argument})\n"
    "    if not ({test}):\n"
    "        scheduler.step()\n"
)
STEP_LR = "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)\n"
REPEATED = "for _ in range(accelerator.num_processes):\n                scheduler.step()\n"


def convert(source: str) -> tuple[str, list[str]]:
    conversion = convert_source(source.encode(), "train.py")
    return conversion.converted.decode(), [note.text for note in conversion.reviews]


def test_a_per_batch_step_under_a_test_fixed_for_the_run_is_repeated_per_process():
    source = HEAD + "COSINE = True\n" + STEP_LR + LOOP.format(test="COSINE", argument="")
    converted, reviews = convert(source)
    assert REPEATED in converted
    assert "    if not (COSINE):\n        scheduler.step()\n" in converted  # per epoch, as it was
    assert not reviews


@pytest.mark.parametrize(
    ("scheduler", "test", "argument", "why"),
    [
        (STEP_LR, "i < 3", "", "the test at line 14 reads i, which changes per batch"),
        (STEP_LR, "epoch < 1", "epoch + i / len(loader)", "handed an argument"),
        (STEP_LR, "check(i)", "", "the test at line 14 calls check()"),
        (
            "scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, total_steps=99)\n",
            "epoch < 1",
            "",
            "scheduler raises when stepped past its total",
        ),
    ],
)
def test_a_per_batch_step_that_repeating_would_change_is_left_for_review(
    scheduler: str, test: str, argument: str, why: str
):
    source = HEAD + scheduler + LOOP.format(test=test, argument=argument)
    converted, reviews = convert(source)
    assert "num_processes):" not in converted
    assert any(why in review and "left unprepared" in review for review in reviews), reviews
    assert any("stepped here per batch but left unprepared" in review for review in reviews)


def test_a_test_on_an_attribute_another_method_sets_is_not_fixed_for_the_run():
    source = (
        HEAD
        + STEP_LR
        + "class Flag:\n    on = True\n\n    def flip(self):\n        self.on = False\n\n\n"
        + "flag = Flag()\n"
        + LOOP.format(test="flag.on", argument="")
    )
    converted, reviews = convert(source)
    assert "num_processes):" not in converted
    assert any("reads flag.on, assigned in another function" in r for r in reviews), reviews


def test_a_loop_that_reads_underscore_keeps_its_meaning():
    source = (
        HEAD
        + "_ = str\nCOSINE = True\n"
        + STEP_LR
        + LOOP.format(test="COSINE", argument="")
        + "print(_(1))\n"
    )
    converted, reviews = convert(source)
    assert "num_processes):" not in converted
    assert any("reads a name `_`" in review for review in reviews), reviews
