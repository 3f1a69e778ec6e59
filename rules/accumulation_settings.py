from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import Example, Finding, Rule, calls, steps_argument

_IMPORT = "from accelify import Accelerator\n"


class AccumulationSettings(Rule):
    """``accelerator.accumulate()`` without ``gradient_accumulation_steps`` accumulates nothing
    (every step syncs and steps). The reverse, steps set but no ``accumulate()``, divides every
    loss by the steps while the optimizer still steps every batch: the learning rate is
    silently divided."""

    code = "ACC304"
    name = "accumulation-settings"
    message = "Use gradient_accumulation_steps and accelerator.accumulate() together"
    why = "One without the other either accumulates nothing or shrinks every update."
    bad = (
        Example(
            _IMPORT
            + "accelerator = Accelerator()\nwith accelerator.accumulate(model):\n    pass\n",
            3,
            6,
        ),
        Example(
            _IMPORT + "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
            "accelerator.backward(loss)\n",
            2,
            15,
        ),
    )
    good = (
        _IMPORT
        + "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
        + "with accelerator.accumulate(model):\n    accelerator.backward(loss)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        accelerators = script.of_kind(Kind.ACCELERATOR)
        if not accelerators:
            return
        names = {binding.name for binding in accelerators}
        steps_set = any(steps_argument(binding.value) is not None for binding in accelerators)
        accumulate_calls = [
            call
            for call in calls(script)
            if isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "accumulate"
            and dotted(call.func.value) in names
        ]
        if accumulate_calls and not steps_set and not _steps_assigned(script, names):
            yield self.finding(script, accumulate_calls[0])
        elif steps_set and not accumulate_calls:
            for binding in accelerators:
                if steps_argument(binding.value) is not None:
                    yield self.finding(script, binding.value)


def _steps_assigned(script: ScriptModel, names: set[str]) -> bool:
    """``accelerator.gradient_accumulation_steps = k`` set after construction."""
    return any(f"{name}.gradient_accumulation_steps" in script.module.code for name in names)
