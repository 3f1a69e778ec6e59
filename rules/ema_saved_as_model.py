from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_name,
    calls,
    calls_accelerator,
)

#: Exponential moving averages that are no ``nn.Module``: they keep shadow copies of the
#: parameters, and their ``state_dict()`` holds the decay and the step count beside a list of
#: tensors, not a model's weights by name.
_EMA_CLASSES = {
    "diffusers.training_utils.EMAModel": "diffusers",
    "diffusers.EMAModel": "diffusers",
    "torch_ema.ExponentialMovingAverage": "torch_ema",
    "torch_ema.ema.ExponentialMovingAverage": "torch_ema",
}

_DIFFUSERS = (
    HEADER
    + "from diffusers import UNet2DModel\n"
    + "from diffusers.training_utils import EMAModel\n"
    + "unet = UNet2DModel.from_pretrained(args.model)\n"
    + "ema_model = EMAModel(unet.parameters(), model_cls=UNet2DModel, model_config=unet.config)\n"
    + "unet, optimizer, loader = accelerator.prepare(unet, optimizer, loader)\n"
    + "for batch in loader:\n"
    + "    accelerator.backward(unet(batch).sample.mean())\n"
    + "    optimizer.step()\n"
    + "    ema_model.step(unet.parameters())\n"
    + "accelerator.wait_for_everyone()\n"
)


class EmaSavedAsModel(Rule):
    """``accelerator.save_model(ema_model, out)`` where ``ema_model`` is a diffusers
    ``EMAModel`` (or torch_ema's ``ExponentialMovingAverage``): no ``nn.Module``, it holds shadow
    copies of the parameters, and its ``state_dict()`` is its own bookkeeping (the decay, the
    step count, ``shadow_params`` as a list), not the model's weights by name. ``save_model``
    takes that dict for a model's and fails when it shards it (its values are not all tensors),
    on every backend; the run ends at its last step without the EMA weights. Followed through
    an attribute (``self.ema``) and a helper's parameter to where the object is made.

    The fix: copy the averages into the model and save that (``ema_model.store(...)``,
    ``ema_model.copy_to(...)``, ``save_model``, ``ema_model.restore(...)``), or, for diffusers,
    ``ema_model.save_pretrained(dir)`` on the main process."""

    code = "ACC432"
    name = "ema-saved-as-model"
    message = (
        "Save the EMA weights through the model: an EMAModel is no nn.Module, and save_model "
        "fails on its state_dict"
    )
    why = "An EMA helper's state_dict is its bookkeeping, not a model's weights: save_model fails."
    bad = (
        Example(_DIFFUSERS + "accelerator.save_model(ema_model, 'out/ema')\n", 13, 1),
        # the EMA kept by a trainer and saved in its own method
        Example(
            HEADER
            + "from torch_ema import ExponentialMovingAverage\n\n\n"
            + "class Trainer:\n"
            + "    def __init__(self, model):\n"
            + "        self.model = accelerator.prepare(model)\n"
            + "        self.ema = ExponentialMovingAverage(self.model.parameters(), 0.999)\n\n"
            + "    def save(self, out):\n"
            + "        accelerator.save_model(self.ema, out)\n",
            12,
            9,
        ),
        # handed to a helper that saves it
        Example(
            _DIFFUSERS
            + "\n\ndef export(accelerator, model, out):\n"
            + "    accelerator.save_model(model, out)\n\n\n"
            + "export(accelerator, ema_model, 'out/ema')\n",
            16,
            5,
        ),
    )
    good = (
        # the averages copied into the model, saved, and the training weights put back
        _DIFFUSERS
        + "ema_model.store(unet.parameters())\n"
        + "ema_model.copy_to(unet.parameters())\n"
        + "accelerator.save_model(unet, 'out/ema')\n"
        + "ema_model.restore(unet.parameters())\n",
        # diffusers' own format, on the main process
        _DIFFUSERS + "if accelerator.is_main_process:\n    ema_model.save_pretrained('out/ema')\n",
        # an EMA that is a module (ema-pytorch, timm): a model's state dict
        HEADER
        + "from ema_pytorch import EMA\n"
        + "ema = EMA(model, beta=0.999)\n"
        + "accelerator.save_model(ema.ema_model, 'out/ema')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            if not calls_accelerator(script, call, ("save_model",)) or not call.args:
                continue
            saved = call.args[0].value
            made = _ema_made(script, saved, call, depth=3)
            if made is None:
                continue
            yield self.finding(script, call, message=_message(script, call, saved, made))


def _ema_made(
    script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode, depth: int
) -> cst.Call | None:
    """The construction of an EMA helper that is no module (``EMAModel(...)``) that ``value``
    holds: bound in its scope, set on the instance in its class (``self.ema``), or handed in
    for a helper's parameter by the calls of the helper."""
    if isinstance(value, cst.Call):
        return value if _ema_class(script, value) is not None else None
    name = dotted(value)
    if name is None or depth == 0:
        return None
    if name.startswith("self.") and name.count(".") == 1:
        values = [assign.value for assign in script.index.assignments_in_class(name, at)]
    elif isinstance(value, cst.Name):
        scope = script.scope_of(at)
        values = [
            v for node, v in script.index.values_bound_to(name) if script.scope_of(node) is scope
        ]
        if not values:
            for origin, place in facts_of(script).flow.origin_sites(name, at):
                if origin is None or (origin == name and place is at):
                    continue
                found = _ema_made(script, cst.parse_expression(origin), place, depth - 1)
                if found is not None:
                    return found
            return None
    else:
        return None
    made = [v for v in values if isinstance(v, cst.Call) and _ema_class(script, v) is not None]
    return made[0] if made and len(made) == len(values) else None


def _ema_class(script: ScriptModel, call: cst.Call) -> str | None:
    for qualified in script.call_names(call):
        if qualified in _EMA_CLASSES:
            return _EMA_CLASSES[qualified]
    return None


def _message(script: ScriptModel, call: cst.Call, saved: cst.BaseExpression, made: cst.Call) -> str:
    accelerator = accelerator_name(script, call)
    ema = script.module.code_for_node(saved)
    library = _ema_class(script, made)
    model = _averaged_model(made)
    params = f"{model}.parameters()" if model is not None else "model.parameters()"
    target = model or "model"
    out = script.module.code_for_node(call.args[1].value) if len(call.args) > 1 else "out"
    if library == "diffusers":
        fix = (
            f"copy the averages into the model and save it: {ema}.store({params}); "
            f"{ema}.copy_to({params}); {accelerator}.save_model({target}, {out}); "
            f"{ema}.restore({params}) (or {ema}.save_pretrained({out}) under `if "
            f"{accelerator}.is_main_process:`)"
        )
    else:
        fix = (
            f"save the model with the averages in it: `with {ema}.average_parameters(): "
            f"{accelerator}.save_model({target}, {out})` (or "
            f"{accelerator}.save({ema}.state_dict(), path) to resume the EMA itself)"
        )
    return (
        f"Save the EMA weights through the model: {ema} is the EMA helper made at line "
        f"{script.line(made)}, no nn.Module; its state_dict() holds its decay, step count and "
        "a list of shadow tensors, not the model's weights by name, and save_model fails on it "
        f"with AttributeError on every backend (the run ends without the EMA weights); {fix}"
    )


def _averaged_model(made: cst.Call) -> str | None:
    """The model whose parameters the EMA was made over: ``unet`` of
    ``EMAModel(unet.parameters(), ...)``."""
    if not made.args:
        return None
    first = made.args[0].value
    if (
        isinstance(first, cst.Call)
        and isinstance(first.func, cst.Attribute)
        and first.func.attr.value == "parameters"
    ):
        return dotted(first.func.value)
    return None
