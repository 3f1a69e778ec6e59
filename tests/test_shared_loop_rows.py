"""A loop over rows of loaders (``for name, loader, opt in [("train", train_loader, optimizer),
("val", val_loader, None)]:``) that hands each to one ``run_epoch(model, loader, optimizer)``
is read pass by pass, whatever the shape of its rows: train_loader is prepared, val_loader is
evaluated whole, and the shared loop sends every batch to the device (val_loader's batches
stay on the host, where the prepared model on a GPU cannot take them)."""

from __future__ import annotations

import pytest

from accelify.convert import convert_source

_SCRIPT = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def run_epoch(model, loader, optimizer=None):
    training = optimizer is not None
    model.train(training)
    correct = 0
    for x, y in loader:
        with torch.set_grad_enabled(training):
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
        if training:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        correct += (out.argmax(1) == y).sum().item()
    return correct


def main():
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    train_loader = DataLoader(data, batch_size=16, shuffle=True)
    val_loader = DataLoader(data, batch_size=16)
    rows = [("train", train_loader, optimizer), ("val", val_loader, None)]
    for epoch in range(2):
        {head}
            print(name, run_epoch(model, loader, {flag}))


main()
"""

#: (loop head, the optimizer argument it hands), by the shape of its rows
_SHAPES = {
    "triples": ('for name, loader, opt in [("train", train_loader, optimizer), '
                '("val", val_loader, None)]:', "opt"),
    "triples-named": ("for name, loader, opt in rows:", "opt"),
    "starred-tail": ("for name, loader, *_ in rows:", 'optimizer if name == "train" else None'),
    "nested": ('for name, (loader, opt) in [("train", (train_loader, optimizer)), '
               '("val", (val_loader, None))]:', "opt"),
    "enumerated": ('for i, (name, loader) in enumerate([("train", train_loader), '
                   '("val", val_loader)]):', 'optimizer if name == "train" else None'),
    "zip-of-names": ('for name, loader in zip(["train", "val"], [train_loader, val_loader]):',
                     'optimizer if name == "train" else None'),
    "starred-rest-unpacked-in-the-body": (
        "for name, *rest in rows:\n            loader, opt = rest", "opt"),
    "starred-rest-indexed-in-the-body": (
        "for name, *rest in rows:\n            loader = rest[0]\n            opt = rest[1]", "opt"),
    "row-entries-paired-in-the-body": (
        "for row in rows:\n            loader, opt = row[1], row[2]", "opt"),
    "row-unpacked-in-the-body": ("for row in rows:\n            name, loader, opt = row", "opt"),
    "zip-of-optimizers": ("for name, loader, opt in zip(('train', 'val'), "
                          "(train_loader, val_loader), (optimizer, None)):", "opt"),
}  # fmt: skip


@pytest.mark.parametrize("shape", list(_SHAPES))
def test_each_loader_of_the_rows_is_seen_with_its_own_flag_and_the_batches_moved(shape: str):
    head, flag = _SHAPES[shape]
    conversion = convert_source(_SCRIPT.format(head=head, flag=flag).encode(), "train.py")
    converted = conversion.converted.decode()
    assert conversion.prepared == ["model", "optimizer", "train_loader"], converted
    assert "        x, y = send_to_device((x, y), accelerator.device)\n" in converted
    assert any("val_loader is evaluated by run_epoch()" in n.text for n in conversion.reviews)
