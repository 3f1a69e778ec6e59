from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import GATHERING_FUNCTIONS
from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding, runs_before
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, calls_accelerator

#: What builds one tensor from a list by converting each element to a number.
_TENSOR_FROM_LIST = frozenset({"torch.tensor", "torch.as_tensor", "torch.Tensor"})
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
    and is not reported.

    The same holds for a list of gathered values made one tensor: ``losses.append(
    accelerator.gather(loss))`` in a loop, then ``torch.tensor(losses)`` converts each element to
    a number (ValueError: only one element tensors can be converted) on more than one process;
    reported at the ``torch.tensor`` when every append to that list is a gather. A name bound
    to a gather (``step_loss = accelerator.gather(step_loss)``) and read with ``.item()`` below,
    with no other binding between, is the same bug."""

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
        Example(  # a Mamba decision-transformer's evaluation: each gathered loss kept whole
            HEADER
            + "import torch\n"
            + "losses = []\n"
            + "for step in range(eval_iters):\n"
            + "    loss = evaluate_batch(model, next(iter(eval_loader)))\n"
            + "    losses.append(accelerator.gather(loss))\n"
            + "mean_loss = torch.mean(torch.tensor(losses))\n",
            8,
            24,
        ),
        Example(  # a trainer's logging (lintreal43): the gathered loss bound to a name first
            "from accelerate import Accelerator\n"
            "class Trainer:\n"
            "    def __init__(self):\n"
            "        self.accelerator = Accelerator(gradient_accumulation_steps=4)\n"
            "    def train_epoch(self, loader, logger):\n"
            "        for feature, label in loader:\n"
            "            with self.accelerator.accumulate(self.model):\n"
            "                loss = self.loss(self.model(feature), label)\n"
            "                self.accelerator.backward(loss)\n"
            "                self.optimizer.step()\n"
            "                self.optimizer.zero_grad()\n"
            "            if self.accelerator.sync_gradients:\n"
            "                step_loss = self.accelerator.gather(loss.detach())\n"
            "                logger.update(rec_loss=step_loss.item())\n",
            14,
            40,
        ),
    )
    good = (
        # the gathered name reduced before .item()
        HEADER
        + "step_loss = accelerator.gather(loss.detach())\n"
        + "step_loss = step_loss.mean()\n"
        + "print(step_loss.item())\n",
        # each gathered value reduced before it is kept, or the list concatenated
        HEADER
        + "import torch\n"
        + "losses, parts = [], []\n"
        + "for batch in loader:\n"
        + "    losses.append(accelerator.gather(model(batch)).mean())\n"
        + "    parts.append(accelerator.gather(model(batch)))\n"
        + "mean_loss = torch.mean(torch.tensor(losses))\n"
        + "total = torch.cat(parts).sum()\n",
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
            if not isinstance(func, cst.Attribute) or func.attr.value != "item" or call.args:
                continue
            if _concatenates_ranks(script, func.value):
                yield self.finding(script, call)
                continue
            gathered = _gathered_binding(script, func.value, call)
            if gathered is not None:
                name = func.value.value  # type: ignore[attr-defined]
                yield self.finding(
                    script,
                    call,
                    message=(
                        f"Reduce before .item(): {name} holds what accelerator.gather returned "
                        f"(line {script.line(gathered)}), one value per rank, and .item() of N "
                        f"values raises RuntimeError on more than one process; use "
                        f"{name}.mean().item() (a loss) or {name}.sum().item() (a count)"
                    ),
                )
        yield from self._tensor_of_gathered(script)

    def _tensor_of_gathered(self, script: ScriptModel) -> Iterator[Finding]:
        """``losses.append(accelerator.gather(loss))`` in a loop, then ``torch.tensor(losses)``:
        each element holds one value per rank, and ``torch.tensor`` of a list of tensors converts
        each to a number (ValueError: only one element tensors can be converted to Python
        scalars) on more than one process. One process gathers one value each and hides it."""
        facts = facts_of(script)
        for call in calls(script):
            if not script.call_names(call) & _TENSOR_FROM_LIST or len(call.args) != 1:
                continue
            listed = call.args[0].value
            if not isinstance(listed, cst.Name):
                continue
            scope = facts.placement.enclosing_function(call) or script.module
            appended = [
                node
                for node in calls(script)
                if isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "append"
                and dotted(node.func.value) == listed.value
                and len(node.args) == 1
                and (facts.placement.enclosing_function(node) or script.module) is scope
                and script.order(node) < script.order(call)
            ]
            if not appended or not all(
                _concatenates_ranks(script, node.args[0].value) for node in appended
            ):
                continue
            spelled = script.module.code_for_node(call.func)
            yield self.finding(
                script,
                call,
                message=(
                    f"Reduce each gathered value before {spelled}(): {listed.value} holds what "
                    f"accelerator.gather returned (line {script.line(appended[0])}), one value "
                    f"per rank, and {spelled}() of tensors with N elements raises ValueError "
                    f"(only one element tensors can be converted) on more than one process; "
                    f"append the gathered tensor's .mean() (a loss) or .sum() (a count), or "
                    f"torch.cat({listed.value})"
                ),
            )


def _gathered_binding(
    script: ScriptModel, node: cst.BaseExpression, at: cst.CSTNode
) -> cst.CSTNode | None:
    """The ``step_loss = accelerator.gather(step_loss)`` that ``node`` (a plain name) holds at
    ``at``: its last binding above ``at`` in the same function, a gather, in a block that also
    holds ``at`` (a gather in a branch that may not run is not followed)."""
    if not isinstance(node, cst.Name):
        return None
    binding = last_binding(script, node.value, at)
    if (
        not isinstance(binding, (cst.Assign, cst.AnnAssign))
        or binding.value is None
        or not isinstance(
            binding.targets[0].target if isinstance(binding, cst.Assign) else binding.target,
            cst.Name,
        )
        or (isinstance(binding, cst.Assign) and len(binding.targets) != 1)
        or not _concatenates_ranks(script, binding.value)
        or not runs_before(script, binding, at)
    ):
        return None
    return binding


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
