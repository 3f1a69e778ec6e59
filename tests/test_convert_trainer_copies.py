"""A trainer's constructor that copies the model it keeps (an EMA, an AveragedModel), and a
training loader a caller reads before the loop that steps the trainer: what the conversion
moves and prepares, and what it leaves (issue 18, trial11's distillation)."""

from __future__ import annotations

from accelify.convert import convert_source
from accelify.edits.plan import Plan

_TRAINER = """
import copy

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, loader):
        {copy}
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loader = loader

    def fit(self):
        for x, y in self.loader:
            loss = nn.functional.mse_loss(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()


x = torch.randn(16, 4)
Trainer(nn.Linear(4, 1), DataLoader(TensorDataset(x, x[:, :1]), batch_size=4)).fit()
"""


def _converted(copy: str) -> str:
    source = _TRAINER.replace("{copy}", copy)
    return convert_source(source.encode(), "t.py").converted.decode()


def test_a_copy_made_of_the_parameter_before_the_attribute_is_bound_is_on_the_device():
    """``AveragedModel(model)`` above ``self.model = model``: the parameter holds the object
    prepare moves from the constructor's first line; it is moved before the copy."""
    after = _converted("self.swa = AveragedModel(model)")
    lines = [line.strip() for line in after.splitlines()]
    at = lines.index("self.swa = AveragedModel(model)")
    assert lines[at - 1] == "model.to(self.accelerator.device)"


def test_a_parameter_rebound_in_the_constructor_is_not_taken_for_the_model():
    """``model = model.double()``... then the copy: the parameter may hold another object."""
    after = _converted("model = copy.deepcopy(model)\n        self.ema = copy.deepcopy(model)")
    assert "model.to(self.accelerator.device)" not in after


_READ_BEFORE = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, batch):
        x, y = batch
        loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()


def main():
    x = torch.randn(96, 8)
    train_loader = DataLoader(TensorDataset(x, x[:, :3].argmax(1)), batch_size=16)
    {before}
    t = Trainer(nn.Linear(8, 3))
    for epoch in range(2):
        total = 0.0
        for batch in train_loader:
            total += t.step(batch)
        print(total / n)


main()
"""


def test_a_loader_iterated_before_the_stepping_loop_is_prepared_after_that_read():
    source = _READ_BEFORE.replace("{before}", "n = 0\n    for _ in train_loader:\n        n += 1")
    conversion = convert_source(source.encode(), "t.py")
    after = conversion.converted.decode()
    assert "train_loader = t.accelerator.prepare(train_loader)" in after
    assert after.index("for _ in train_loader:") < after.index("t.accelerator.prepare")
    # the loop above it reads the loader as made: said, not claimed sharded
    assert any("before it, reads it as made" in note.text for note in conversion.changes)


def test_a_length_read_before_the_stepping_loop_keeps_the_loader_whole():
    """``n = len(train_loader)`` kept for the loop below: prepared, the shard's sum would be
    divided by the whole loader's length. The loader is left whole, with its review line."""
    source = _READ_BEFORE.replace("{before}", "n = len(train_loader)")
    conversion = convert_source(source.encode(), "t.py")
    assert "accelerator.prepare(train_loader)" not in conversion.converted.decode()
    assert any("`train_loader`, which is not prepared" in n.text for n in conversion.reviews)


def test_a_change_said_when_its_condition_holds_once_the_plan_is_complete():
    plan = Plan()
    moved: set[str] = set()
    plan.change(3, "stays", when=lambda: "m" not in moved)
    plan.change(3, "moved", when=lambda: "m" in moved)
    assert [note.text for note in plan.changes] == ["stays"]
    moved.add("m")
    assert [note.text for note in plan.changes] == ["moved"]
