from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.accelerator_objects import without_accelerator
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_at, calls


class DataParallelWrapper(Rule):
    """Wrapping a model in ``DataParallel``/``DistributedDataParallel`` by hand in an Accelerator
    script: prepare wraps it again (DDP inside DDP), or the hand-made wrapper runs on a process
    group the Accelerator does not manage.

    A wrapper where no accelerator is at hand is another mode of the same library (fastai's
    ``ParallelTrainer`` beside its ``DistributedTrainer``; the ``else`` of ``if accelerator is
    not None``): nothing prepares that model."""

    code = "ACC103"
    name = "data-parallel-wrapper"
    message = "Remove the DataParallel/DistributedDataParallel wrapper: accelerator.prepare wraps"
    why = "A model wrapped twice all-reduces twice, or hangs on a group that was never set up."
    bad = (
        Example(HEADER + "import torch\nmodel = torch.nn.DataParallel(model)\n", 4, 9),
        Example(
            HEADER
            + "from torch.nn.parallel import DistributedDataParallel as DDP\nmodel = DDP(model)\n",
            4,
            9,
        ),
    )
    good = (
        HEADER + "model = accelerator.prepare(model)\n",
        # fastai: a DataParallel callback beside the callback that holds the accelerator
        "from accelerate import Accelerator\n"
        + "from torch.nn import DataParallel\n"
        + "class ParallelTrainer:\n"
        + "    def before_fit(self):\n"
        + "        self.learn.model = DataParallel(self.learn.model)\n"
        + "class DistributedTrainer:\n"
        + "    def __init__(self):\n"
        + "        self.accelerator = Accelerator()\n"
        + "    def before_fit(self):\n"
        + "        self.learn.model = self.accelerator.prepare(self.learn.model)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            if script.call_names(call) & names.DDP_WRAPPERS and _accelerator_in_reach(script, call):
                yield self.finding(script, call)


def _accelerator_in_reach(script: ScriptModel, call: cst.Call) -> bool:
    """An accelerator the code around ``call`` has, or will have (a model wrapped before
    ``Accelerator()`` is created is prepared after it): in its scope or an enclosing one, or on
    its class's instance."""
    if without_accelerator(script, call):
        return False
    if accelerator_at(script, call) is not None:
        return True
    placement = facts_of(script).placement
    return any(
        not binding.name.startswith("self.")
        and (isinstance(binding.scope, cst.Module) or placement.inside(call, binding.scope))
        for binding in script.of_kind(Kind.ACCELERATOR)
    )
