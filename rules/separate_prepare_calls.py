from collections.abc import Iterator

from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule, optimizer_models


class SeparatePrepareCalls(Rule):
    """A model and its optimizer prepared in separate calls. FSDP and DeepSpeed shard the model
    in ``prepare``; an optimizer prepared on its own keeps the unsharded parameters, so under
    those backends it updates tensors the model no longer uses."""

    code = "ACC306"
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
        owners = optimizer_models(script)
        for call in script.prepare_calls:
            for optimizer, models in owners.items():
                apart = optimizer in call.inputs and not models & set(call.inputs)
                if apart and any(models & set(other.inputs) for other in script.prepare_calls):
                    yield self.finding(script, call.call)
