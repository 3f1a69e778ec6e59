"""A model held in a record (a ``@dataclass``, a ``NamedTuple``, a ``SimpleNamespace``) built with
keyword arguments is the object it was built from: ``state.model(x)`` runs the prepared model on
the device, so a batch of a loader the conversion leaves whole (here one summed in a generator
expression) is sent there, as ``model(x)``'s would be, also where a helper receives the record."""

from __future__ import annotations

import pytest

from accelify.convert import convert_source

_SCRIPT = """
{imports}
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

{record}


def accuracy(state, data):
    with torch.no_grad():
        return sum((state.model(x).argmax(1) == y).sum().item() for x, y in data)


def main():
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {made}(model=model, optimizer=opt)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    val_loader = DataLoader(data, batch_size=16)
    for x, y in loader:
        loss = nn.functional.cross_entropy(state.model(x), y)
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
    print({evaluation})


main()
"""

_DATACLASS = """@dataclass
class TrainState:
    model: nn.Module
    optimizer: torch.optim.Optimizer"""
_NAMED_TUPLE = """class TrainState(NamedTuple):
    model: nn.Module
    optimizer: torch.optim.Optimizer"""
_INLINE = "sum((state.model(x).argmax(1) == y).sum().item() for x, y in val_loader)"

#: (imports, record class, how it is made, what is printed)
_SHAPES = {
    "dataclass": ("from dataclasses import dataclass", _DATACLASS, "TrainState", _INLINE),
    "namedtuple": ("from typing import NamedTuple", _NAMED_TUPLE, "TrainState", _INLINE),
    "namespace": ("from types import SimpleNamespace", "", "SimpleNamespace", _INLINE),
    "dataclass-in-a-helper": (
        "from dataclasses import dataclass", _DATACLASS, "TrainState",
        "accuracy(state, val_loader)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("shape", list(_SHAPES))
def test_the_records_model_takes_a_whole_loaders_batch_on_the_device(shape: str):
    imports, record, made, evaluation = _SHAPES[shape]
    source = _SCRIPT.format(imports=imports, record=record, made=made, evaluation=evaluation)
    converted = convert_source(source.encode(), "train.py").converted.decode()
    assert "state.model(send_to_device(x, accelerator.device))" in converted, converted
