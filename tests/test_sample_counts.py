"""`accelify.analysis.sample_counts`: what a training loop counts of its samples and shows
after it, wherever the count is read; and what it leaves alone."""

from __future__ import annotations

import textwrap

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import analyze

HEADER = (
    "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader\n"
    "import torch.distributed as dist\n"
)

MAIN = """
def main():
    loader = DataLoader(range(8))
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    {call}
"""


def shown(code: str, call: str = "train(model, loader, optimizer)") -> set[tuple]:
    """Each count found as (the count, the total over it, how it got there, the line read)."""
    source = HEADER + textwrap.dedent(code) + MAIN.replace("{call}", call)
    model = analyze(cst.parse_module(source))
    lines = source.splitlines()
    return {
        (found.shown, found.total, found.through, lines[model.line(found.read) - 1].strip())
        for found in facts_of(model).sample_counts
    }


STEP = """
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_count_and_a_total_over_it_shown_after_the_loop():
    code = (
        "def train(model, loader, optimizer):\n"
        "    seen, total = 0, 0.0\n"
        "    for x, y in loader:\n"
        + textwrap.indent(textwrap.dedent(STEP), "        ")
        + "        seen += x.size(0)\n"
        "        total += loss.item() * len(x)\n"
        "    print(total / seen, seen)\n"
    )
    shows = "print(total / seen, seen)"
    assert shown(code) == {("seen", "total", None, shows), ("seen", None, None, shows)}


def test_a_count_by_a_batch_size_name_in_a_dict_returned_to_the_caller():
    code = (
        "def train(model, loader, optimizer):\n"
        '    stats = {"n": 0}\n'
        "    for x, y in loader:\n"
        + textwrap.indent(textwrap.dedent(STEP), "        ")
        + "        bs = len(y)\n"
        '        stats["n"] += bs\n'
        '    return stats["n"]\n'
    )
    found = shown(code, 'n = train(model, loader, optimizer)\n    print(f"{n} samples")')
    assert found == {("n", None, "returned by train()", 'print(f"{n} samples")')}


def test_steps_reduced_counts_and_unshown_counts_are_left_alone():
    steps = (
        "def train(model, loader, optimizer):\n"
        "    steps = seen = 0\n"
        "    for x, y in loader:\n"
        + textwrap.indent(textwrap.dedent(STEP), "        ")
        + "        steps += 1\n"
        "        seen += len(x)\n"
        "    if seen > 100:\n"
        "        print(steps)\n"
    )
    assert shown(steps) == set()
    reduced = (
        "def train(model, loader, optimizer):\n"
        "    seen = torch.zeros(())\n"
        "    for x, y in loader:\n"
        + textwrap.indent(textwrap.dedent(STEP), "        ")
        + "        seen += len(x)\n"
        "    dist.all_reduce(seen)\n"
        "    print(seen)\n"
    )
    assert shown(reduced) == set()


def test_an_evaluation_loop_is_not_asked_about():
    code = (
        "def train(model, loader, optimizer):\n"
        "    seen = 0\n"
        "    with torch.no_grad():\n"
        "        for x, y in loader:\n"
        "            seen += len(x)\n"
        "    print(seen)\n"
    )
    assert shown(code) == set()


def test_a_count_handed_to_a_helper_that_prints_it_is_read_there():
    code = (
        "def report(epoch, loss_sum, n):\n"
        '    print(f"{epoch}: {loss_sum / n:.3f}")\n'
        "\n"
        "def log_seen(count):\n"
        "    show(count)\n"
        "\n"
        "def show(value):\n"
        "    print(value)\n"
        "\n"
        "def train(model, loader, optimizer):\n"
        "    seen, total = 0, 0.0\n"
        "    for x, y in loader:\n"
        + textwrap.indent(textwrap.dedent(STEP), "        ")
        + "        seen += x.size(0)\n"
        "        total += loss.item() * len(x)\n"
        "    report(1, total, seen)\n"
        "    log_seen(seen)\n"
    )
    assert shown(code) == {
        ("n", "loss_sum", "handed to report()", 'print(f"{epoch}: {loss_sum / n:.3f}")'),
        ("value", None, "handed to show()", "print(value)"),
    }


def test_a_helper_handed_no_count_is_not_read():
    code = (
        "def report(loss_sum, n):\n"
        "    print(loss_sum / n)\n"
        "\n"
        "def train(model, loader, optimizer):\n"
        "    seen, total = 0, 0.0\n"
        "    for x, y in loader:\n"
        + textwrap.indent(textwrap.dedent(STEP), "        ")
        + "        seen += x.size(0)\n"
        "        total += loss.item() * len(x)\n"
        "    report(total, len(loader.dataset))\n"
    )
    assert shown(code) == set()
