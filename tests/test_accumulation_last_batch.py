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
