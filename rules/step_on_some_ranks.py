from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls

_TRAIN = (
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "for x, y in loader:\n"
    "    accelerator.backward((model(x) - y).pow(2).mean())\n"
    "    optimizer.step()\n"
)


class StepOnSomeRanks(Rule):
    """An optimizer or LR scheduler stepped under ``if accelerator.is_main_process:`` (or any
    test of the rank). Every rank holds a replica of the model and its own copy of the
    optimizer and scheduler; DDP averages the gradients, but each rank applies them with its own
    optimizer. Stepped on the main process alone, the scheduler moves only that rank's learning
    rate (the others keep the first one), or only that rank updates its weights: the replicas
    drift apart from the first step on, silently. Under DeepSpeed and FSDP the step itself is
    collective, and the run hangs there."""

    code = "ACC307"
    name = "step-on-some-ranks"
    message = (
        "Step this on every rank, outside the rank test: each rank steps its own copy, and "
        "stepped on one rank only, the replicas' learning rates and weights drift apart"
    )
    why = "Every rank must apply the same update with the same learning rate."
    bad = (
        Example(
            HEADER
            + "import torch\nscheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n"
            + _TRAIN
            + "    if accelerator.is_main_process:\n        scheduler.step()\n",
            10,
            9,
        ),
        Example(
            HEADER
            + "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for x, y in loader:\n"
            + "    accelerator.backward((model(x) - y).pow(2).mean())\n"
            + "    if accelerator.is_main_process:\n        optimizer.step()\n",
            9,
            9,
        ),
    )
    good = (
        HEADER
        + "import torch\nscheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n"
        + _TRAIN
        + "    scheduler.step()\n"
        + "    if accelerator.is_main_process:\n        print(scheduler.get_last_lr())\n",
        # stepped when gradients synchronise: the same on every rank
        HEADER
        + "import torch\nscheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n"
        + _TRAIN
        + "    if accelerator.sync_gradients:\n        scheduler.step()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        stepped = facts.flow.names_of(Kind.OPTIMIZER) | facts.flow.names_of(Kind.SCHEDULER)
        for call in calls(script):
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "step"
                and dotted(func.value) in stepped
                and facts.ranks.under_rank_guard(call)
            ):
                yield self.finding(script, call)
