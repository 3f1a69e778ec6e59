from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.accelerator_objects import without_accelerator
from accelify.analysis.precision import cpu_autocast, device_type_of_the_run
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, target_names, walk
from accelify.lint.rule import (
    HEADER,
    MULTI_BACKEND_TRAINER,
    PARITY_REFERENCE,
    Example,
    Finding,
    Rule,
    calls,
    calls_accelerator,
)


class ManualAmp(Rule):
    """A hand-made ``GradScaler``, or a ``torch.autocast``/``torch.cuda.amp.autocast`` around the
    training forward (its body computes what reaches a backward), in a file that trains with an
    Accelerator: the loss is scaled twice (or by a scaler the Accelerator never unscales before
    clipping), DeepSpeed and FSDP run their own precision under it, and a ``"cuda"`` autocast
    does nothing on a CPU rank. An autocast around validation, inference or a frozen model is
    not reported: nothing there competes with the Accelerator's mixed precision; nor is a
    bfloat16 autocast (nothing to scale, and fp32 on a CPU rank: the numbers stay right), nor,
    in a file that scales nothing by hand, an autocast whose device type is read from the device
    the script runs on (``device_type=self.device.split(":")[0]``): it casts on every rank's own
    device, and its dtype follows that device, which no one mixed_precision value says (the
    conversion keeps it, with a review line)."""

    code = "ACC504"
    name = "manual-amp"
    message = "Use Accelerator(mixed_precision=...) and accelerator.autocast() instead"
    why = "Two scalers scale the loss twice; a CUDA autocast is off on CPU ranks."
    bad = (
        Example(
            HEADER + "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
            "accelerator.backward(scaler.scale(loss))\n",
            4,
            10,
        ),
        Example(  # torch >= 2.3's top-level name (a robot-data discriminator's trainer)
            HEADER + "import torch\nscaler = torch.GradScaler()\n"
            "accelerator.backward(scaler.scale(loss))\nscaler.step(optimizer)\n",
            4,
            10,
        ),
        Example(
            HEADER
            + "import torch\nwith torch.autocast('cuda', dtype=torch.float16):\n"
            + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
            4,
            6,
        ),
        Example(
            HEADER
            + "import torch\nwith torch.cuda.amp.autocast():\n    loss = model(x).sum()\n"
            + "    loss.backward()\n",
            4,
            6,
        ),
        Example(
            HEADER
            + "import torch\n"
            + "with torch.autocast('cuda', dtype=torch.float16 if amp else torch.float32):\n"
            + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
            4,
            6,
        ),
        Example(  # a device type read from the device, beside a scaler the file uses by hand
            HEADER
            + "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
            + "with torch.autocast(device.type):\n    loss = model(x).sum()\n"
            + "accelerator.backward(scaler.scale(loss))\n",
            4,
            10,
        ),
    )
    good = (
        PARITY_REFERENCE,
        MULTI_BACKEND_TRAINER,
        HEADER + "with accelerator.autocast():\n    y = f(x)\n",
        HEADER
        + "import torch\nwith torch.autocast('cuda', dtype=torch.bfloat16):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        "import torch\n\n\ndef save_fsdp_model(accelerator, model, path):\n"
        "    if accelerator.is_main_process:\n        torch.save(model.state_dict(), path)\n\n\n"
        "def get_grad_scaler(**kwargs):\n    return torch.amp.GradScaler(**kwargs)\n",
        HEADER + "import torch\nwith torch.autocast('cuda'):\n    images = pipeline(prompt)\n",
        # one scaler per model, handed to the Accelerator in turn: it scales once (imagen)
        HEADER
        + "import torch\nscalers = [torch.cuda.amp.GradScaler(enabled=fp16) for _ in unets]\n"
        + "accelerator.scaler = scalers[index]\naccelerator.backward(loss)\n",
        HEADER
        + "import torch\nwith torch.no_grad(), torch.autocast('cuda'):\n"
        + "    logits = model(x)\naccelerator.backward(other_loss)\n",
        # bf16 on CUDA, fp32 elsewhere: nothing to scale either way
        HEADER
        + "import torch\n"
        + "with torch.autocast(device.type, dtype=torch.bfloat16 if cuda else torch.float32):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        # the device type read from the device the trainer runs on (a converted trainer's
        # ``self.device = str(self.accelerator.device)``), nothing scaled by hand
        HEADER
        + "import torch\nwith torch.autocast(device_type=device.split(':')[0], enabled=amp):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        # a CPU autocast, nothing scaled by hand: a no-op on GPU ranks, as written on CPU ones
        # (a converted script's, kept with a review line: no mixed_precision casts float16 on
        # the CPU)
        HEADER
        + "import torch\nwith torch.autocast('cpu', dtype=torch.float16):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        HEADER
        + "import torch\nwith torch.autocast(device_type='cpu', dtype=ptdtype, enabled=bf16):\n"
        + "    loss = model(x).sum()\naccelerator.backward(loss)\n",
        # a validation method's ``output`` is not the one another method's backward reads
        HEADER
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
            if not scaler and not scales and device_type_of_the_run(script, call):
                continue  # casts on this rank's own device, unscaled: nothing to replace
            if not scaler and not scales and cpu_autocast(script, call):
                continue  # a CPU cast, unscaled: runs as before, and no precision replaces it
            if scaler or (not _bfloat16(call) and _around_training(script, call)):
                yield self.finding(script, call)


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
