"""The script's own mixed precision, read with every argument: what ``mixed_precision`` means
the same, or why the AMP stays as written."""

from __future__ import annotations

import pytest

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import analyze
from accelify.convert import convert_source
from accelify.source import parse

TEMPLATE = """\
import torch
from torch import nn


def main(args):
    use_amp = torch.cuda.is_available()
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    {setup}
    with {autocast}:
        loss = model(torch.randn(2, 2)).sum()
    loss.backward()
    optimizer.step()
"""

#: (id, autocast, setup line, mixed_precision, or None and the reason's start)
CASES = [
    (
        "cuda-fp16",
        'torch.autocast("cuda", dtype=torch.float16)',
        "",
        '"fp16" if torch.cuda.is_available() else "no"',
    ),
    (
        "cuda-default-dtype",
        'torch.autocast(device_type="cuda")',
        "",
        '"fp16" if torch.cuda.is_available() else "no"',
    ),
    ("cpu-default-dtype", 'torch.autocast("cpu")', "", '"bf16"'),
    (
        "cpu-bf16-flag",
        'torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16)',
        "",
        '"bf16" if args.bf16 else "no"',
    ),
    (
        "positional-dtype-and-enabled",
        'torch.autocast("cpu", torch.bfloat16, args.bf16)',
        "",
        '"bf16" if args.bf16 else "no"',
    ),
    (
        "cuda-amp-enabled-first",
        "torch.cuda.amp.autocast(args.amp)",
        "",
        '"fp16" if args.amp and torch.cuda.is_available() else "no"',
    ),
    (
        "condition-expression",
        'torch.autocast("cpu", enabled=args.bf16 and not args.debug)',
        "",
        '"bf16" if (args.bf16 and not args.debug) else "no"',
    ),
    (
        "flag-set-from-cuda",
        'torch.autocast("cuda", enabled=use_amp)',
        "",
        '"fp16" if torch.cuda.is_available() else "no"',
    ),
    (
        "scaler-agrees",
        'torch.autocast("cuda", enabled=use_amp)',
        "scaler = torch.cuda.amp.GradScaler(enabled=use_amp)",
        '"fp16" if torch.cuda.is_available() else "no"',
    ),
    (
        "scaler-differs",
        'torch.autocast("cuda", enabled=use_amp)',
        "scaler = torch.cuda.amp.GradScaler(enabled=args.amp)",
        None,
    ),
    ("dtype-in-a-variable", 'torch.autocast("cpu", dtype=args.dtype)', "", None),
    ("device-in-a-variable", "torch.autocast(args.device)", "", None),
]


@pytest.mark.parametrize(
    ("autocast", "setup", "expected"),
    [pytest.param(a, s, e, id=name) for name, a, s, e in CASES],
)
def test_mixed_precision_means_what_the_autocast_meant(autocast, setup, expected):
    source = TEMPLATE.format(autocast=autocast, setup=setup or "pass")
    precision = facts_of(analyze(parse(source.encode(), "amp.py"))).precision
    assert precision.used
    assert precision.mixed_precision == expected
    assert precision.carried == (expected is not None)
    assert (precision.reason is None) == (expected is not None)


def test_autocasts_that_disagree_keep_the_scripts_amp():
    source = TEMPLATE.format(autocast='torch.autocast("cpu")', setup="pass") + (
        '    with torch.autocast("cpu", enabled=False):\n        model(torch.randn(2, 2))\n'
    )
    precision = facts_of(analyze(parse(source.encode(), "amp.py"))).precision
    assert precision.reason == "the autocasts differ in dtype, device or enabled="


LATE_SCALER = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
use_amp = device.type == "cuda"
scaler = torch.cuda.amp.GradScaler(enabled=use_amp)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    with torch.autocast("cuda", enabled=use_amp):
        loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""


def test_a_flag_set_from_the_accelerators_device_keeps_the_scripts_amp():
    """``use_amp`` reads the device, which the conversion takes from the accelerator: no place
    for ``Accelerator(mixed_precision=...)`` comes after ``use_amp`` and before that use, so
    the scaler and autocast stay as written (the backward keeps its scaling), each with why,
    and the Accelerator reads no name it would meet unbound."""
    conversion = convert_source(LATE_SCALER.encode(), "late_scaler.py")
    converted = conversion.converted.decode()
    assert "accelerator = Accelerator()\n" in converted
    assert "scaler = torch.cuda.amp.GradScaler(enabled=use_amp)" in converted
    assert "accelerator.backward(scaler.scale(loss))" in converted
    assert "scaler.step(optimizer)" in converted
    reviews = {note.line: note.text for note in conversion.reviews}
    assert reviews[10].startswith("GradScaler scaler left as is: Accelerator(mixed_precision=")
    assert "it reads device, which line 5 sets from the accelerator" in reviews[13]
    compile(converted, "late_scaler.py", "exec")
