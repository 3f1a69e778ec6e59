"""An evaluation whose loop calls no model but predicts through a method of one
(`evaluation.predicting_method`): the method is its forward where it runs the model's layers."""

from __future__ import annotations

from accelify.convert import convert_source

SOURCE = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x, h):
        return self.fc(x) + h

    def init_hidden(self, n):
        return torch.zeros(n, 2)

    def decode(self, x):
        return self.fc(x).argmax(1)


def step(model, x, h):
    return model(x, h)


X = torch.randn(50, 4)
y = (X[:, 0] > 0).long()
train_loader = DataLoader(TensorDataset(X, y), batch_size=8)
test_loader = DataLoader(TensorDataset(X, y), batch_size=8)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, t in train_loader:
    loss = nn.functional.cross_entropy(model(x, model.init_hidden(x.size(0))), t)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
correct = 0
with torch.no_grad():
    for x, t in test_loader:
EVALUATION
print(correct)
"""


def _converted(evaluation: str) -> str:
    source = SOURCE.replace("EVALUATION\n", evaluation)
    return convert_source(source.encode(), "train.py").converted.decode()


def test_a_method_that_runs_the_layers_is_the_forward_and_is_gathered():
    converted = _converted(
        "        pred = model.decode(x)\n        correct += (pred == t).sum().item()\n"
    )
    assert "pred = accelerator.unwrap_model(model).decode(x)" in converted
    assert "pred, t = accelerator.gather_for_metrics((pred, t))" in converted
    assert "model, optimizer, train_loader, test_loader = accelerator.prepare(" in converted


def test_a_method_that_makes_a_state_is_not_taken_for_the_forward():
    converted = _converted(
        "        h = model.init_hidden(x.size(0))\n"
        "        out = step(model, x, h)\n"
        "        correct += (out.argmax(1) == t).sum().item()\n"
    )
    assert "gather_for_metrics((h" not in converted
