"""Manual accumulation becomes ``accelerator.accumulate()`` only when its step test also fires
at the last batch of the loop's own loader (where ``accumulate()`` steps too): an equality of
the loop's counter and that loader's length, however written; anything else keeps it."""

from __future__ import annotations

import pytest

from accelify.convert import Options
from accelify.convert.conversion import convert_source

SCRIPT = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

accum = 4
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(56, 4), torch.randn(56, 1)), batch_size=4)
other = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
{bound}for {counter}, (x, y) in {iterated}:
    loss = nn.functional.mse_loss(model(x), y) / accum
    loss.backward()
    if {test}:
        optimizer.step()
        optimizer.zero_grad()
"""


def _converted(test: str, iterated: str = "enumerate(loader)", bound: str = "") -> str:
    source = SCRIPT.format(test=test, iterated=iterated, counter="i", bound=bound)
    return convert_source(source.encode(), "t.py", Options()).converted.decode()


@pytest.mark.parametrize(
    ("test", "iterated", "bound"),
    [
        ("(i + 1) % accum == 0 or i + 1 == len(loader)", "enumerate(loader)", ""),
        ("(i + 1) % accum == 0 or len(loader) == 1 + i", "enumerate(loader)", ""),
        ("(i + 1) % accum == 0 or i == len(loader) - 1", "enumerate(loader)", ""),
        ("i % accum == 0 or i == len(loader)", "enumerate(loader, 1)", ""),
        ("(i + 1) % accum == 0 or i + 1 == n", "enumerate(loader)", "n = len(loader)\n"),
    ],
)
def test_a_test_that_fires_at_the_loaders_last_batch_becomes_accumulate(
    test: str, iterated: str, bound: str
):
    assert "accelerator.accumulate(model)" in _converted(test, iterated, bound)


@pytest.mark.parametrize(
    ("test", "iterated"),
    [
        ("(i + 1) % accum == 0 or len(loader) < accum", "enumerate(loader)"),
        ("(i + 1) % accum == 0 or i + 1 == len(other)", "enumerate(loader)"),
        ("(i + 1) % accum == 0 or i + 1 >= len(loader)", "enumerate(loader)"),
        ("i % accum == 0 or i + 1 == len(loader)", "enumerate(loader, 1)"),
        ("(i + 1) % accum == 0 or i + 2 == len(loader)", "enumerate(loader)"),
    ],
)
def test_any_other_side_keeps_the_manual_pattern(test: str, iterated: str):
    assert "accumulate(" not in _converted(test, iterated)


COUNTED = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

accum = 4
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(56, 4), torch.randn(56, 1)), batch_size=4)
{reset_outside}for epoch in range(2):
{reset_inside}    for x, y in loader:
{top}        loss = nn.functional.mse_loss(model(x), y) / accum
        loss.backward()
        if {test}:
            optimizer.step()
            optimizer.zero_grad()
{bottom}"""


def _counted(test: str, *, top: bool = True, reset: str = "inside", extra: str = "") -> str:
    increment = "        step += 1\n" + extra
    source = COUNTED.format(
        test=test,
        top=increment if top else "",
        bottom="" if top else increment,
        reset_outside="step = 0\n" if reset == "outside" else "",
        reset_inside="    step = 0\n" if reset == "inside" else "",
    )
    return convert_source(source.encode(), "t.py", Options()).converted.decode()


@pytest.mark.parametrize(
    ("test", "top"),
    [
        ("step % accum == 0 or step == len(loader)", True),
        ("(step + 1) % accum == 0 or step + 1 == len(loader)", False),
    ],
)
def test_a_counter_the_loop_keeps_and_resets_each_pass_is_proven(test: str, top: bool):
    assert "accelerator.accumulate(model)" in _counted(test, top=top)


@pytest.mark.parametrize(
    ("test", "top", "reset", "extra"),
    [
        # counted once for the whole run: equal to len(loader) in the first pass only
        ("step % accum == 0 or step == len(loader)", True, "outside", ""),
        # one batch off: the increment runs before the test
        ("step % accum == 0 or step + 1 == len(loader)", True, "inside", ""),
        # a second increment
        ("step % accum == 0 or step == len(loader)", True, "inside", "        step += 1\n"),
        # counted from 0 where accumulate() counts from 1 (another phase of steps)
        ("(step + 1) % accum == 0 or step == len(loader)", True, "inside", ""),
    ],
)
def test_a_counter_not_proven_keeps_the_manual_pattern(
    test: str, top: bool, reset: str, extra: str
):
    assert "accumulate(" not in _counted(test, top=top, reset=reset, extra=extra)


def test_a_test_counted_from_zero_says_which_test_matches():
    source = SCRIPT.format(
        test="i % accum == 0 or i + 1 == len(loader)",
        iterated="enumerate(loader)",
        counter="i",
        bound="",
    )
    conversion = convert_source(source.encode(), "t.py", Options())
    assert "accumulate(" not in conversion.converted.decode()
    (review,) = [n.text for n in conversion.reviews if "accumulation kept" in n.text]
    assert "test `(i + 1) % accum == 0`" in review
