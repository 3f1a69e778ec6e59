from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.accelerator_objects import (
    built_for_cpu_only,
    gradients_averaged_by_hand,
    without_accelerator,
)
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import (
    HEADER,
    MULTI_BACKEND_TRAINER,
    Example,
    Finding,
    Rule,
    accelerator_at,
    calls,
)

_IMPORT_VALUE = "from torch.nn.utils import clip_grad_value_\n"


class TorchClipGrad(Rule):
    """``torch.nn.utils.clip_grad_norm_`` on gradients the Accelerator manages: under fp16 they
    are still scaled (the clip threshold is meaningless), and under FSDP each rank sees only its
    shard, so the norm is wrong.

    A clip after the script's own ``accelerator.unscale_gradients()`` in the same function is a
    choice made with both in mind (SimpleTuner clips FSDP2's DTensor gradients, whose norm torch
    computes globally): not reported."""

    code = "ACC302"
    name = "torch-clip-grad"
    message = "Use accelerator.clip_grad_norm_ / accelerator.clip_grad_value_"
    why = "fp16 gradients must be unscaled first, and sharded gradients need a global norm."
    bad = (
        Example(
            HEADER + "import torch\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
            4,
            1,
            HEADER + "import torch\naccelerator.clip_grad_norm_(model.parameters(), 1.0)\n",
        ),
        Example(
            HEADER + _IMPORT_VALUE + "clip_grad_value_(params, 0.5)\n",
            4,
            1,
            HEADER + _IMPORT_VALUE + "accelerator.clip_grad_value_(params, 0.5)\n",
        ),
        # an argument the Accelerator's clip does not take: no fix, unscale first instead
        Example(
            HEADER + "import torch\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)\n",
            4,
            1,
        ),
    )
    good = (
        HEADER + "accelerator.clip_grad_norm_(model.parameters(), 1.0)\n",
        MULTI_BACKEND_TRAINER,
        # re-grpo: Accelerator(cpu=True) has no loss scaler and shards nothing: torch's clip is
        # the same number
        "import torch\n"
        + "from accelerate import Accelerator\n"
        + "accelerator = Accelerator(cpu=True)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "accelerator.backward(loss)\n"
        + "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n",
        # SimpleTuner under FSDP2: gradients unscaled first, then torch's clip over DTensors
        HEADER
        + "import torch\n"
        + "def clip(model, max_norm):\n"
        + "    accelerator.unscale_gradients()\n"
        + "    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n",
        # ... and that advice followed for a clip the Accelerator's cannot replace
        HEADER
        + "import torch\naccelerator.unscale_gradients()\n"
        + "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)\n",
        # seed-vc's codec trainer: descript audiotools' own Accelerator (no clip_grad_norm_),
        # whose scaler the script unscales itself
        "import argbind\n"
        + "import torch\n"
        + "from audiotools import ml\n"
        + "Accelerator = argbind.bind(ml.Accelerator, without_prefix=True)\n"
        + "def train_loop(state, batch, accel: ml.Accelerator):\n"
        + "    accel.backward(state.loss)\n"
        + "    accel.scaler.unscale_(state.optimizer)\n"
        + "    torch.nn.utils.clip_grad_norm_(state.generator.parameters(), 1e3)\n"
        + "    accel.step(state.optimizer)\n"
        + "def train(args):\n"
        + "    with Accelerator() as accel:\n"
        + "        generator = accel.prepare_model(args.generator)\n"
        + "        loader = accel.prepare_dataloader(args.data, batch_size=4)\n",
        # a GRPO update written by hand: nothing prepared, gradients averaged with all_reduce,
        # the Accelerator kept for its device and gather (torch's clip is the same number)
        HEADER
        + "import torch\nimport torch.distributed as dist\n"
        + "loss.backward()\n"
        + "for p in actor.parameters():\n"
        + "    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)\n"
        + "torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)\n"
        + "optimizer.step()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if built_for_cpu_only(script) or gradients_averaged_by_hand(script):
            return
        for call in calls(script):
            for qualified in script.call_names(call):
                method = names.CLIP_FUNCTIONS.get(qualified)
                if (
                    method
                    and not without_accelerator(script, call)
                    and not _unscaled_before(script, call)
                ):
                    acc = accelerator_at(script, call)
                    from accelify.edits import rewrites  # a fix's edits: imported for a fix only
                    from accelify.edits.plan import Plan

                    clip = rewrites.clip_grad(call, acc, method) if acc is not None else None
                    unaccepted = rewrites.unaccepted_clip_argument(call, method)
                    message = None if unaccepted is None else _unscale_first(method, unaccepted)
                    yield self.finding(
                        script, call, None if clip is None else Plan.of(clip), message
                    )
                    break


def _unscale_first(method: str, unaccepted: str) -> str:
    """The advice for a clip the Accelerator's method cannot take over (``error_if_nonfinite=``:
    the converter keeps such a clip, with a review line): unscale first, keep the clip."""
    return (
        f"Call accelerator.unscale_gradients() before this clip: accelerator.{method} takes no "
        f"{unaccepted}, so it cannot replace it, and under fp16 the gradients clipped here are "
        "still scaled (the threshold means nothing)"
    )


def _unscale_calls(script: ScriptModel) -> list[cst.Call]:
    return [
        call
        for call in script.calls
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "unscale_gradients"
    ]


def _unscaled_before(script: ScriptModel, clip: cst.Call) -> bool:
    """``accelerator.unscale_gradients()`` earlier in the function that clips."""
    function = script.index.enclosing_function(clip)
    return any(
        script.index.enclosing_function(call) is function
        and script.order(call) < script.order(clip)
        for call in _unscale_calls(script)
    )
