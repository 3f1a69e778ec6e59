from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import Example, Finding, Rule, accelerator_argument, calls

_IMPORT = "from accelify import Accelerator\n"


class AccumulationSettings(Rule):
    """``gradient_accumulation_steps`` set on the Accelerator but no ``accelerator.accumulate()``
    and no accumulation by hand: ``backward`` divides every loss by the steps while the optimizer
    still steps every batch, so the learning rate is silently divided. (``accumulate()`` with no
    steps in the script is not reported: the steps can come from the launcher, the config or a
    DeepSpeed JSON.)"""

    code = "ACC304"
    name = "accumulation-settings"
    message = (
        "Wrap the step in accelerator.accumulate(model): gradient_accumulation_steps is set, so "
        "every loss is divided while the optimizer still steps every batch"
    )
    why = "Steps set without accumulate() shrink every update."
    bad = (
        Example(
            _IMPORT + "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
            "accelerator.backward(loss)\noptimizer.step()\n",
            2,
            15,
        ),
    )
    good = (
        _IMPORT
        + "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
        + "with accelerator.accumulate(model):\n    accelerator.backward(loss)\n",
        _IMPORT + "accelerator = Accelerator(gradient_accumulation_steps=1)\n"
        "accelerator.backward(loss)\n",
        _IMPORT + "accelerator = Accelerator()\nwith accelerator.accumulate(model):\n    pass\n",
        _IMPORT
        + "accelerator = Accelerator(gradient_accumulation_steps=args.steps)\n"
        + "for step, batch in enumerate(loader):\n"
        + "    with accelerator.no_sync(model):\n        accelerator.backward(loss)\n"
        + "    if (step + 1) % args.steps == 0:\n        optimizer.step()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        accelerators = facts.flow.names_of(Kind.ACCELERATOR)
        if any(
            _method_of(call, accelerators) in ("accumulate", "no_sync") for call in calls(script)
        ):
            return
        if _steps_by_hand(script):
            return
        for binding in script.of_kind(Kind.ACCELERATOR):
            argument = accelerator_argument(binding.value, "gradient_accumulation_steps")
            if argument is None or _is_one(argument.value):
                continue
            yield self.finding(script, binding.value)


def _method_of(call: cst.Call, receivers: set[str]) -> str | None:
    func = call.func
    if isinstance(func, cst.Attribute) and dotted(func.value) in receivers:
        return func.attr.value
    return None


def _is_one(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Integer) and value.evaluated_value == 1


def _steps_by_hand(script: ScriptModel) -> bool:
    """An optimizer step under ``if ... % k == 0``: the script accumulates by hand."""
    optimizers = script.names_of(Kind.OPTIMIZER)
    for call in calls(script):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step"):
            continue
        if optimizers and dotted(func.value) not in optimizers:
            continue
        for ancestor in script.ancestors(call):
            if isinstance(ancestor, cst.If) and "%" in script.module.code_for_node(ancestor.test):
                return True
    return False
