from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel, dotted, strip_self_methods
from accelify.lint.rule import HEADER, Example, Finding, Rule


class SeparatePrepareCalls(Rule):
    """A model and its optimizer prepared in separate calls. FSDP and DeepSpeed shard the model
    in ``prepare``; an optimizer prepared on its own keeps the unsharded parameters, so under
    those backends it updates tensors the model no longer uses."""

    code = "ACC502"
    name = "separate-prepare-calls"
    message = "Prepare the model and its optimizer in one accelerator.prepare(...) call"
    why = "Sharding backends must bind the optimizer to the sharded parameters."
    bad = (
        Example(
            HEADER
            + "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "model = accelerator.prepare(model)\noptimizer = accelerator.prepare(optimizer)\n",
            6,
            13,
        ),
    )
    good = (
        HEADER
        + "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        owners = _optimizer_models(script)
        for call in script.prepare_calls:
            for optimizer, model in owners.items():
                apart = optimizer in call.inputs and model not in call.inputs
                if apart and any(model in other.inputs for other in script.prepare_calls):
                    yield self.finding(script, call.call)


def _optimizer_models(script: ScriptModel) -> dict[str, str]:
    owners: dict[str, str] = {}
    for binding in script.of_kind(Kind.OPTIMIZER):
        core = strip_self_methods(binding.value)
        if not isinstance(core, cst.Call) or not core.args:
            continue
        first = core.args[0].value
        if (
            isinstance(first, cst.Call)
            and isinstance(first.func, cst.Attribute)
            and first.func.attr.value in ("parameters", "named_parameters")
        ):
            model = dotted(first.func.value)
            if model:
                owners[binding.name] = model
    return owners
