"""Runs fixed rule examples for real, on the CPU, one process: each in a fresh namespace and a
fresh directory, given the objects the examples name (a model, a loader of (x, y) batches, a
loss that reaches the model's parameters). Reads ``[[id, code], ...]`` as JSON on stdin and
prints ``{id: null | traceback}`` as the last line."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
import types

import torch


def objects() -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    x, y = torch.randn(4, 4), torch.randn(4, 1)
    (model(x) - y).pow(2).mean().backward()  # gradients for the clipping examples
    out = model(x)
    return {
        "model": model,
        "data": data,
        "loader": torch.utils.data.DataLoader(data, batch_size=4),
        "x": x,
        "y": y,
        "out": out,
        "loss": (out - y).pow(2).mean(),
        "state": {"step": 3, "weights": model.state_dict()},
        "params": list(model.parameters()),
        "args": types.SimpleNamespace(cpu=True),
    }


def main() -> None:
    outcomes: dict[str, str | None] = {}
    for example_id, code in json.load(sys.stdin):
        with tempfile.TemporaryDirectory() as folder:
            os.chdir(folder)
            try:
                exec(compile(code, example_id, "exec"), objects())
                outcomes[example_id] = None
            except BaseException:  # reported to the test, which fails on it
                outcomes[example_id] = traceback.format_exc()
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()
