from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.accelerator_objects import without_accelerator
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls


class DataParallelWrapper(Rule):
    """A model wrapped in ``DataParallel``/``DistributedDataParallel`` by hand and also prepared:
    the wrapper goes into ``prepare`` (DDP inside DDP: every gradient all-reduced twice, or a
    DataParallel's replicas inside each rank's DDP), or a prepared model is wrapped again.

    Only the model that meets ``prepare`` in the same function counts. A wrapper elsewhere in an
    Accelerator file is another mode of the same library, where nothing prepares that model:
    fastai's ``ParallelTrainer`` beside its ``DistributedTrainer``, HF Trainer's DataParallel
    for a one-process multi-GPU run and its SageMaker DDP, LLaMA-Factory's DDP fallback, a
    reference DDP model in a test."""

    code = "ACC103"
    name = "data-parallel-wrapper"
    message = "Remove the DataParallel/DistributedDataParallel wrapper: accelerator.prepare wraps"
    why = "A model wrapped twice all-reduces twice, or hangs on a group that was never set up."
    bad = (
        Example(
            HEADER
            + "import torch\nmodel = torch.nn.DataParallel(model)\n"
            + "model, optimizer = accelerator.prepare(model, optimizer)\n",
            4,
            9,
        ),
        Example(
            HEADER
            + "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            + "model = accelerator.prepare(model)\nmodel = DDP(model)\n",
            5,
            9,
        ),
    )
    good = (
        # HF Trainer: DataParallel for a one-process run on several GPUs, prepared elsewhere
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "class Trainer:\n"
        + "    def __init__(self, model, optimizer):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n"
        + "    def _wrap_model(self, model):\n"
        + "        if self.args.n_gpu > 1:\n"
        + "            model = torch.nn.DataParallel(model)\n"
        + "        return model\n",
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
            if script.call_names(call) & names.DDP_WRAPPERS and _wrapped_and_prepared(script, call):
                yield self.finding(script, call)


def _wrapped_and_prepared(script: ScriptModel, wrapper: cst.Call) -> bool:
    """``model = DDP(model)`` then ``accelerator.prepare(model)``, or ``model =
    accelerator.prepare(model)`` then ``DDP(model)``: in one function (or at module level)."""
    if without_accelerator(script, wrapper) or not wrapper.args:
        return False
    wrapped = dotted(wrapper.args[0].value)
    assign = script.parent(wrapper)
    target = (
        dotted(assign.targets[0].target)
        if isinstance(assign, cst.Assign) and len(assign.targets) == 1
        else None
    )
    scope = script.scope_of(wrapper)
    here = script.order(wrapper)
    for prepare in script.prepare_calls:
        if script.scope_of(prepare.call) is not scope:
            continue
        after = script.order(prepare.call) > here
        if after and target is not None and target in prepare.inputs:
            return True
        if not after and wrapped is not None and wrapped in prepare.outputs:
            return True
    return False
