"""Evaluations reached through ``functools.partial``: the call graph follows no call there, so
the partial's own arguments and the calls of the variable it is kept in are bound by
`partial_calls`; a loader handed on that way stays whole (no gather fits where the conversion
cannot follow), and the prepared model it reaches is sent its CPU batches, or the call gets a
review line when where they come from is not followed."""

from __future__ import annotations

import textwrap

import libcst as cst

from accelify.analysis.partial_calls import partial_arguments
from accelify.analysis.script_model import analyze
from accelify.analysis.syntax import dotted
from accelify.convert import convert_source

EVALUATE = """
import functools

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@torch.no_grad()
def evaluate(net, loader):
    correct = 0
    for x, y in loader:
        correct += (net(x).argmax(1) == y).sum().item()
    return correct / len(loader.dataset)


def main():
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    train_loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    val_loader = DataLoader(TensorDataset(x[:40], y[:40]), batch_size=8)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    {made}
    for xb, yb in train_loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    {used}


main()
"""


def _convert(made: str, used: str):
    source = EVALUATE.replace("{made}", made).replace("{used}", used)
    return convert_source(source.encode(), "train.py")


def _reviews(conversion) -> list[str]:
    return [f"{note.line}: {note.text}" for note in conversion.reviews]


def test_a_partial_kept_in_a_variable_leaves_its_loader_whole_and_sends_it_to_the_model():
    conversion = _convert(
        "check = functools.partial(evaluate, model)", 'print(f"acc {check(val_loader):.4f}")'
    )
    after = conversion.converted.decode()
    assert "accelerator.prepare(model, optimizer, train_loader)" in after
    assert "net(send_to_device(x, accelerator.device))" in after
    reviews = _reviews(conversion)
    assert any("val_loader is handed on through check(), a function held" in r for r in reviews)
    compile(after, "after.py", "exec")


def test_a_partial_whose_calls_are_not_followed_leaves_the_model_call_with_a_review_line():
    conversion = _convert(
        'checks = {"val": functools.partial(evaluate, model)}',
        'for name, check in checks.items():\n        print(f"{name} {check(val_loader):.4f}")',
    )
    after = conversion.converted.decode()
    assert "send_to_device" not in after
    assert "accelerator.prepare(model, optimizer, train_loader)" in after
    reviews = _reviews(conversion)
    assert any(
        "net(x): model is handed to evaluate() as net through functools.partial" in r
        for r in reviews
    ), reviews


def _bound(code: str, parameter: str) -> list[str] | None:
    module = analyze(cst.parse_module(textwrap.dedent(code)))
    found = partial_arguments(module, module.functions["evaluate"], parameter)
    return None if found is None else [dotted(a.value) or "?" for a in found]


def test_partial_arguments_bind_the_partials_own_arguments_then_its_calls():
    code = """
        from functools import partial
        def evaluate(net, loader, device="cpu"):
            pass
        def main(model, val_loader, test_loader):
            check = partial(evaluate, model, device="cuda")
            check(val_loader)
            check(test_loader)
            partial(evaluate, model)(val_loader)
    """
    assert _bound(code, "net") == ["model", "model", "model"]
    assert _bound(code, "loader") == ["val_loader", "test_loader", "val_loader"]


def test_a_partial_handed_on_leaves_what_it_does_not_bind_unknown():
    code = """
        import functools
        def evaluate(net, loader):
            pass
        def main(model, val_loader):
            results = list(map(functools.partial(evaluate, model), [val_loader]))
            check = functools.partial(evaluate, model)
            run(check)
    """
    assert _bound(code, "net") == ["model", "model"]
    assert _bound(code, "loader") is None
