from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.accelerator_objects import local_factories, without_accelerator
from accelify.analysis.handed_accelerators import (
    COMPUTED_PRECISION,
    MadeAccelerator,
    constructed_by,
    handed_accelerators,
)
from accelify.analysis.precision import (
    accelerator_never_casts,
    accelerator_never_scales,
    cpu_autocast,
    device_type_of_the_run,
    made_precisions,
)
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, is_accelerator_call, target_names, walk
from accelify.lint.rule import (
    MULTI_BACKEND_TRAINER,
    PARITY_REFERENCE,
    Example,
    Finding,
    Rule,
    calls,
    calls_accelerator,
)

#: an Accelerator that scales fp16 losses and casts itself: what a hand-made AMP competes with
FP16 = "from accelify import Accelerator\naccelerator = Accelerator(mixed_precision='fp16')\n"


class ManualAmp(Rule):
    """A hand-made ``GradScaler``, or a ``torch.autocast``/``torch.cuda.amp.autocast`` around the
    training forward (its body computes what reaches a backward), in a file whose Accelerator
    has mixed precision of its own: ``mixed_precision="fp16"`` (or a value the file computes, or
    an accelerator made elsewhere, whose precision is not known here). There the loss is scaled
    twice (or by a scaler the Accelerator never unscales before clipping), the Accelerator's
    autocast overrides the hand-made one inside the forward, and DeepSpeed and FSDP run their
    own precision under it. Beside an Accelerator without mixed precision (``mixed_precision``
    left out, the launch default "no"; or "bf16" for a scaler, which then scales alone) the
    script's own AMP is the only one: that is how convert keeps an AMP no single
    ``mixed_precision`` value says (with a review line), and it is not reported. Nor is an
    autocast around validation, inference or a frozen model (nothing there competes with the
    Accelerator's mixed precision), a bfloat16 autocast (nothing to scale, and fp32 on a CPU
    rank: the numbers stay right), nor, in a file that scales nothing by hand, an autocast whose
    device type is read from the device the script runs on (``device_type=self.device.type``):
    it casts on every rank's own device, and its dtype follows that device."""

    code = "ACC504"
    name = "manual-amp"
    message = (
        "Scaled or cast twice: the Accelerator has mixed precision of its own; use "
        "accelerator.autocast() and accelerator.backward(loss) without a GradScaler, or keep "
        "this AMP and make the Accelerator's mixed_precision 'no'"
    )
    why = (
        "With Accelerator(mixed_precision='fp16') two scalers scale the loss twice, and the "
        "Accelerator's autocast overrides this one inside the forward."
    )
    bad = (
        Example(
            "import torch\nfrom accelify import Accelerator\n\n"
            "accelerator = Accelerator(mixed_precision='fp16')\n"
            "scaler = torch.cuda.amp.GradScaler()\n"
            "accelerator.backward(scaler.scale(loss))\n",
            5,
            10,
        ),
        Example(  # torch >= 2.3's top-level name (a robot-data discriminator's trainer)
            FP16 + "import torch\nscaler = torch.GradScaler()\n"
            "accelerator.backward(scaler.scale(loss))\nscaler.step(optimizer)\n",
            4,
            10,
        ),
        Example(
            FP16
            + "import torch\nwith torch.autocast('cuda', dtype=torch.float16):\n"
            + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
            4,
            6,
        ),
        Example(
            FP16
            + "import torch\nwith torch.cuda.amp.autocast():\n    loss = model(x).sum()\n"
            + "    loss.backward()\n",
            4,
            6,
        ),
        Example(
            FP16
            + "import torch\n"
            + "with torch.autocast('cuda', dtype=torch.float16 if amp else torch.float32):\n"
            + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
            4,
            6,
        ),
        Example(  # a device type read from the device, beside a scaler the file uses by hand
            FP16
            + "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
            + "with torch.autocast(device.type):\n    loss = model(x).sum()\n"
            + "accelerator.backward(scaler.scale(loss))\n",
            4,
            10,
        ),
        Example(  # a precision the file computes may be fp16
            "from accelify import Accelerator\n"
            "accelerator = Accelerator(mixed_precision=args.mixed_precision)\n"
            "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
            "accelerator.backward(scaler.scale(loss))\n",
            4,
            10,
        ),
        Example(  # an accelerator made elsewhere: its precision is not known here
            "import torch\n\n\ndef train(accelerator, model, x):\n"
            "    scaler = torch.cuda.amp.GradScaler()\n"
            "    accelerator.backward(scaler.scale(model(x).sum()))\n",
            5,
            14,
        ),
    )
    good = (
        # the first bad example as the message advises: the Accelerator scales and casts
        "from accelify import Accelerator\n\n"
        "accelerator = Accelerator(mixed_precision='fp16')\n"
        "with accelerator.autocast():\n    loss = model(x).sum()\n"
        "accelerator.backward(loss)\n",
        # what convert keeps where no single mixed_precision value says what the script's AMP
        # does (with a review line): the Accelerator has none, the script's AMP is the only one
        "import torch\nfrom accelify import Accelerator\n\naccelerator = Accelerator()\n"
        "scaler = torch.cuda.amp.GradScaler(enabled=amp)\n"
        "with torch.autocast(device_type=device.type, enabled=amp):\n"
        "    loss = criterion(model(x), y)\n"
        "accelerator.backward(scaler.scale(loss))\nscaler.step(optimizer)\nscaler.update()\n",
        # a bf16 Accelerator scales nothing: the hand-made scaler scales once
        "import torch\nfrom accelify import Accelerator\n\n"
        "accelerator = Accelerator(mixed_precision='bf16')\n"
        "scaler = torch.cuda.amp.GradScaler()\naccelerator.backward(scaler.scale(loss))\n",
        PARITY_REFERENCE,
        MULTI_BACKEND_TRAINER,
        FP16 + "with accelerator.autocast():\n    y = f(x)\n",
        FP16
        + "import torch\nwith torch.autocast('cuda', dtype=torch.bfloat16):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        "import torch\n\n\ndef save_fsdp_model(accelerator, model, path):\n"
        "    if accelerator.is_main_process:\n        torch.save(model.state_dict(), path)\n\n\n"
        "def get_grad_scaler(**kwargs):\n    return torch.amp.GradScaler(**kwargs)\n",
        FP16 + "import torch\nwith torch.autocast('cuda'):\n    images = pipeline(prompt)\n",
        # one scaler per model, handed to the Accelerator in turn: it scales once (imagen)
        FP16
        + "import torch\nscalers = [torch.cuda.amp.GradScaler(enabled=fp16) for _ in unets]\n"
        + "accelerator.scaler = scalers[index]\naccelerator.backward(loss)\n",
        FP16
        + "import torch\nwith torch.no_grad(), torch.autocast('cuda'):\n"
        + "    logits = model(x)\naccelerator.backward(other_loss)\n",
        # bf16 on CUDA, fp32 elsewhere: nothing to scale either way
        FP16
        + "import torch\n"
        + "with torch.autocast(device.type, dtype=torch.bfloat16 if cuda else torch.float32):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        # the device type read from the device the trainer runs on (a converted trainer's
        # ``self.device = str(self.accelerator.device)``), nothing scaled by hand
        FP16
        + "import torch\nwith torch.autocast(device_type=device.split(':')[0], enabled=amp):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        # a CPU autocast, nothing scaled by hand: a no-op on GPU ranks, as written on CPU ones
        # (a converted script's, kept with a review line: no mixed_precision casts float16 on
        # the CPU)
        FP16
        + "import torch\nwith torch.autocast('cpu', dtype=torch.float16):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        FP16
        + "import torch\nwith torch.autocast(device_type='cpu', dtype=ptdtype, enabled=bf16):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        # a validation method's ``output`` is not the one another method's backward reads
        FP16
        + "import torch\n\n\ndef train_step(x):\n    output = model(x)\n"
        + "    accelerator.backward(output.sum())\n\n\ndef valid_step(x):\n"
        + "    with torch.autocast('cuda'):\n        output = model(x)\n    return output\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        # a scaler competes with the Accelerator's only where the file trains (a helper module
        # that builds one for a caller elsewhere is not reported)
        trains = script.trains or bool(_accelerator_backwards(script))
        scales = trains and _scales_by_hand(script)
        for call in calls(script):
            qualified = script.call_names(call)
            scaler = bool(qualified & names.GRAD_SCALERS) and scales
            if not scaler and not qualified & names.AUTOCASTS:
                continue  # neither: the walk up of `without_accelerator` is not needed
            if without_accelerator(script, call):
                continue  # the plain-PyTorch path of a script that runs with or without one
            if scaler:
                if not accelerator_never_scales(script):
                    yield self.finding(script, call, message=_twice("scaler", script))
                continue
            if not scales and device_type_of_the_run(script, call):
                continue  # casts on this rank's own device, unscaled: nothing to replace
            if not scales and cpu_autocast(script, call):
                continue  # a CPU cast, unscaled: runs as before, and no precision replaces it
            if accelerator_never_casts(script):
                continue  # the only autocast: the Accelerator casts nothing
            if not _bfloat16(call) and _around_training(script, call):
                yield self.finding(script, call, message=_twice("autocast", script))


def _twice(what: str, script: ScriptModel) -> str:
    """The advice, said as convert says why it keeps a script's AMP: with mixed precision
    the Accelerator does the same work again, without it the script's own is the only one.
    An Accelerator another module of the project makes and hands in is named by its line
    there, where its mixed_precision is changed."""
    made = made_precisions(script)
    own = _made_here(script)
    places = sorted(_made_elsewhere(script)) if not own else []
    which = f"the Accelerator made at {', '.join(places)}" if places else "the Accelerator"
    if not made:
        whose = "the Accelerator (made elsewhere: its mixed_precision is not known here) may"
    elif COMPUTED_PRECISION in made:
        computed = "here" if own else f"at {', '.join(places)}"
        whose = f"the Accelerator's mixed_precision is computed {computed}, and it may"
    elif own:
        whose = "the Accelerator's mixed_precision is set, and it will"
    else:
        spelled = " or ".join(repr(precision) for precision in sorted(made))
        whose = f"{which} has mixed_precision {spelled}, and it will"
    if what == "scaler":
        return (
            f"GradScaler beside the Accelerator's own: {whose} scale the loss again; call "
            "accelerator.backward(loss) without it (drop its scale, step and update), or keep "
            f"it and make the mixed_precision of {which} 'no'"
        )
    return (
        f"autocast beside the Accelerator's own: {whose} cast the forward again; use "
        f"accelerator.autocast() instead, or keep it and make the mixed_precision of {which} "
        "'no'"
    )


def _made_here(script: ScriptModel) -> bool:
    """The file makes an Accelerator of its own: not one handed in, nor one a factory of another
    module of the project returns (`_made_elsewhere` names that one's line)."""
    return any(
        isinstance(binding.value, cst.Call)
        and not binding.received
        and _factory_construction(script, binding.value) is None
        for binding in script.of_kind(Kind.ACCELERATOR)
    )


def _made_elsewhere(script: ScriptModel) -> set[str]:
    """Where the other modules of the project make the file's Accelerators (``setup_util.py:6``):
    the construction a factory the file calls returns, else the ones handed in."""
    factories = {
        made.where
        for binding in script.of_kind(Kind.ACCELERATOR)
        if isinstance(binding.value, cst.Call)
        and not binding.received
        and (made := _factory_construction(script, binding.value)) is not None
    }
    return factories or {made.where for made in handed_accelerators(script)}


def _factory_construction(script: ScriptModel, value: cst.Call) -> MadeAccelerator | None:
    """The Accelerator a factory of another module of the project returns to ``value``."""
    if is_accelerator_call(value) or dotted(value.func) in local_factories(script):
        return None
    return constructed_by(script, value)


def _scales_by_hand(script: ScriptModel) -> bool:
    """The file scales a loss or unscales gradients itself (``scaler.scale(loss)``,
    ``scaler.unscale_(optimizer)``): a scaler it never uses so is no second scaler (one handed
    to the Accelerator as ``accelerator.scaler`` is the Accelerator's own)."""
    return any(
        isinstance(call.func, cst.Attribute) and call.func.attr.value in ("scale", "unscale_")
        for call in script.calls
    )


def _bfloat16(call: cst.Call) -> bool:
    """``autocast("cuda", dtype=torch.bfloat16)``: bf16 needs no loss scaling, and a CPU rank
    runs it in fp32; nothing trains wrong, so it is not reported."""
    dtype = next((a.value for a in call.args if a.keyword and a.keyword.value == "dtype"), None)
    positional = [a.value for a in call.args if a.keyword is None]
    if dtype is None and len(positional) > 1 and not isinstance(positional[0], cst.Name):
        dtype = positional[1]  # torch.autocast("cuda", torch.bfloat16)
    if isinstance(dtype, cst.IfExp):
        return _unscaled_choice(dtype)
    return (dotted(dtype) or "").endswith(("bfloat16", "bf16")) if dtype is not None else False


def _unscaled_choice(dtype: cst.BaseExpression) -> bool:
    """A choice whose every branch is bf16 or fp32 (``torch.bfloat16 if device.type == "cuda"
    and not fp32 else torch.float32``, an audio trainer's): no branch needs loss scaling."""
    if isinstance(dtype, cst.IfExp):
        return _unscaled_choice(dtype.body) and _unscaled_choice(dtype.orelse)
    return (dotted(dtype) or "").endswith(("bfloat16", "bf16", "float32"))


def _around_training(script: ScriptModel, call: cst.Call) -> bool:
    """The ``with`` of this autocast holds a backward, or binds a name a backward reads."""
    block = script.parent(script.parent(call))
    if not isinstance(block, cst.With):
        return False
    through_accelerator = _accelerator_backwards(script)
    backwards = [*script.backward_calls, *through_accelerator]
    if any(any(a is block for a in script.ancestors(b)) for b in backwards):
        return True
    bound = {
        name
        for node in walk(block.body)
        if isinstance(node, cst.Assign)
        for target in node.targets
        for name in target_names(target.target)
    }
    # a name bound here and read by a backward of the same function: ``output`` of a validation
    # loop is not the ``output`` another method's backward reads
    scope = script.scope_of(call)
    return any(
        _backward_reads(b, b in through_accelerator) & bound
        for b in backwards
        if script.scope_of(b) is scope
    )


def _accelerator_backwards(script: ScriptModel) -> list[cst.Call]:
    return [c for c in script.calls if calls_accelerator(script, c, ("backward",))]


def _backward_reads(call: cst.Call, through_accelerator: bool) -> set[str]:
    """``loss`` of ``loss.backward()``, ``accelerator.backward(loss)``,
    ``scaler.scale(loss).backward()``."""
    if through_accelerator:
        roots = [call.args[0].value] if call.args else []
    else:
        roots = [call.func.value] if isinstance(call.func, cst.Attribute) else []
    found = set()
    for root in roots:
        for node in walk(root):
            if isinstance(node, cst.Name):
                found.add(node.value)
    return found
