from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import GATHERING_FUNCTIONS
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, calls_accelerator

#: the collectives whose result holds every rank's values side by side (N values for a scalar)
_CONCATENATING = frozenset({"gather", "gather_for_metrics", "all_gather"})


class GatheredItem(Rule):
    """``accelerator.gather(loss).item()``: ``gather`` returns every rank's values side by side, so
    the gathered loss of N processes holds N numbers (a scalar becomes a vector of one per rank),
    and ``.item()`` of it raises ``RuntimeError: a Tensor with N elements cannot be converted to
    Scalar`` on the first step of any run on more than one process. One process has one value
    and hides it. Reduce the gathered values first: ``.mean().item()`` for a mean such as a loss,
    ``.sum().item()`` for a count, or ``accelerator.reduce(loss, reduction="mean").item()``; each
    keeps the collective where it is, on every rank. ``accelerator.reduce(...)`` keeps the shape
    and is not reported."""

    code = "ACC407"
    name = "gathered-item"
    message = (
        "Reduce before .item(): accelerator.gather returns one value per rank, and .item() of "
        "N values raises RuntimeError on more than one process; use .mean().item() (a loss) or "
        ".sum().item() (a count) on the gathered tensor"
    )
    why = "A gathered scalar holds one value per rank; .item() needs exactly one."
    bad = (
        Example(
            HEADER + "for x, y in loader:\n"
            "    loss = model(x, y)\n"
            "    accelerator.backward(loss)\n"
            "    total += accelerator.gather(loss).item()\n",
            6,
            14,
        ),
        Example(  # a trainer's epoch loop (a speech CTC fine-tune, a GPT pretraining)
            "from accelerate import Accelerator\n"
            "class Trainer:\n"
            "    def __init__(self):\n"
            "        self.accelerator = Accelerator()\n"
            "    def evaluate(self, loader):\n"
            "        total = 0.0\n"
            "        for batch in loader:\n"
            "            loss = self.model(**batch).loss\n"
            "            total += self.accelerator.gather_for_metrics(loss).item()\n"
            "        return total\n",
            9,
            22,
        ),
    )
    good = (
        HEADER + "loss_value = accelerator.gather(loss).mean().item()\n",
        HEADER + "loss_value = accelerator.reduce(loss, reduction='mean').item()\n",
        HEADER + "correct = accelerator.gather_for_metrics(hits).sum().item()\n",
        # torch.gather is an indexing op, not a collective
        "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "picked = torch.gather(logits, 1, index).item()\n"
        "chosen = logits.gather(1, index).item()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "item"
                and not call.args
                and _concatenates_ranks(script, func.value)
            ):
                yield self.finding(script, call)


def _concatenates_ranks(script: ScriptModel, node: cst.BaseExpression) -> bool:
    """``accelerator.gather(x)``, ``accelerator.gather_for_metrics(x)``, ``gather(x)`` of
    accelerate.utils: a collective whose result stacks every rank's values (not ``reduce``,
    which keeps the shape, nor ``torch.gather``, an indexing op)."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value in _CONCATENATING:
        return calls_accelerator(script, node, _CONCATENATING)
    return any(
        name in GATHERING_FUNCTIONS and name.rsplit(".", 1)[-1] in _CONCATENATING
        for name in script.call_names(node)
    )
