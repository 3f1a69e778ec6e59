"""An object built with a loader before the loader's prepare keeps the loader as made
(convert/steps/context.py `_handed_before_its_prepare`): ``evaluator = Evaluator(val_loader)``
above the statement the prepare follows. Its loop over ``self.loader`` reads the whole set on
every rank, so gathering it would count each sample once per rank (2 ranks printed (28, 64)
for (14, 32)): the evaluation is left whole, with its review line. Built below the prepare,
the evaluator holds the prepared loader and its evaluation is gathered."""

from __future__ import annotations

from accelify.convert import convert_source

SCRIPT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Evaluator:
    def __init__(self, loader):
        self.loader = loader

    def run(self, model):
        model.eval()
        correct = 0
        with torch.no_grad():
            for xb, yb in self.loader:
                correct += (model(xb).argmax(1) == yb).sum().item()
        model.train()
        return correct


def main():
    x = torch.randn(96, 8)
    y = (x[:, 0] > 0).long()
    train_loader = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8)
    val_loader = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=8)
    {early}
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    {late}
    for xb, yb in train_loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    print("eval", evaluator.run(model))


main()
"""
BUILT = "evaluator = Evaluator(val_loader)"


def _convert(early: str, late: str):
    source = SCRIPT.replace("{early}", early).replace("{late}", late)
    return convert_source(source.encode(), "train.py")


def test_an_evaluator_built_before_the_prepare_evaluates_the_whole_set_on_every_rank():
    conversion = _convert(BUILT, "")
    assert "gather_for_metrics" not in conversion.converted.decode()
    (review,) = [n for n in conversion.reviews if "self.loader" in n.text]
    assert review.line == 15 and "not prepared" in review.text


def test_an_evaluator_built_after_the_prepare_is_gathered():
    conversion = _convert("", BUILT)
    assert "gather_for_metrics" in conversion.converted.decode()
    assert not [n for n in conversion.reviews if "self.loader" in n.text]
