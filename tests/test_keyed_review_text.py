"""An evaluation over ``loaders[name]`` whose loaders the conversion cannot name is left as it is
with a review line; the review must not call the container a loader every rank reads whole.
``T({"val": vl, "test": sl})`` keeps the dict on ``self.loaders`` and hands it to
``evaluate(model, self.loaders)``: ``vl`` and ``sl`` are prepared, and 2 ranks of the converted
script print ``val acc ... n 8`` (one shard of 16), so "its metrics are right as they are" was
untrue there."""

from __future__ import annotations

from accelify.convert import convert_source

KEPT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, loaders):
    model.eval()
    with torch.no_grad():
        for name in ("val", "test"):
            correct = n = 0
            for xb, yb in loaders[name]:
                correct += (model(xb).argmax(1) == yb).sum().item()
                n += len(yb)
            print(f"{name} acc {correct / n:.4f} n {n}")


class T:
    def __init__(self, loaders):
        self.loaders = loaders

    def run(self, model):
        evaluate(model, self.loaders)


def main():
    x = torch.randn(96, 4)
    y = (x[:, 0] > 0).long()
    tl = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8, shuffle=True)
    vl = DataLoader(TensorDataset(x[64:80], y[64:80]), batch_size=8)
    sl = DataLoader(TensorDataset(x[80:], y[80:]), batch_size=8)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x_, y_ in tl:
        loss = nn.functional.cross_entropy(model(x_), y_)
        opt.zero_grad()
        loss.backward()
        opt.step()
    T({"val": vl, "test": sl}).run(model)
"""


def test_a_kept_dict_of_prepared_loaders_is_not_reviewed_as_read_whole() -> None:
    conversion = convert_source(KEPT.encode(), "train.py")
    reviews = [f"{note.line}: {note.text}" for note in conversion.reviews]
    left = [r for r in reviews if r.startswith("12: evaluation left as is")]
    assert left, reviews
    assert "with a key the conversion cannot read" in left[0]
    assert "which is not prepared" not in left[0], left[0]
    assert "right as they are" not in left[0], left[0]
