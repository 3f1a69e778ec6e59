"""5b. A CPU-only script that pickles its model whole (``torch.save(model, path)``) and loads
it back (``reloaded = torch.load(path)``) for a test pass: the original's model, and every
tensor the file holds, lived on the CPU, and the reloaded model met CPU tensors there.
Converted, ``prepare`` places the model on ``accelerator.device``, the file holds device
tensors, and ``torch.load`` restores the model on that device: on a GPU, the CPU tensors it
then meets (batches of a loader left unprepared, tensors made by the script) are on another
device and the call fails (on the CPU nothing shows it). ``map_location="cpu"`` is no fix in
general: the reloaded model may as well meet the batches of a prepared loader, which are on
the device. So the load stays as it is, with a review line that says which to choose. A load
that already says where (``map_location``, a second positional argument), and a model moved
before it is saved (``torch.save(model.to("cpu"), path)``), are where the script says; a load
back into the model's own name (``model = torch.load(path)``) is that model to the analysis,
whose loaders and inputs are placed for it as for the model it replaces."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.device_moves import strip_moves
from accelify.analysis.saved_values import saved_whole_objects
from accelify.analysis.syntax import dotted
from accelify.convert.steps.context import Context
from accelify.convert.steps.host_inputs import cpu_only


def run(ctx: Context) -> None:
    if not cpu_only(ctx):
        return
    for shared in ctx.facts.shared_files.read_back:
        write, read = shared.write, shared.read
        if (
            shared.unsure  # may be another file: no claim about what it holds
            or "torch.save" not in ctx.model.call_names(write)
            or "torch.load" not in ctx.model.call_names(read)
            or _says_where(read)
            or (write.args and strip_moves(write.args[0].value) is not write.args[0].value)
            or _loaded_into_a_model_name(ctx, read)
        ):
            continue
        models = [
            dotted(saved)
            for saved in saved_whole_objects(ctx.model, write)
            if ctx.facts.flow.is_model_name(dotted(saved), write)
        ]
        if not models:
            continue
        acc = ctx.accelerator_at(read)
        ctx.plan.review(
            ctx.line(read),
            f"{ctx.code(shared.path)} holds {models[0]} pickled whole at line {ctx.line(write)}, "
            f"now from {acc}.device (prepare puts it there; the original's was on the CPU): "
            f"{ctx.code(read.func)}(...) restores it on that device, so on a GPU the CPU tensors "
            f"it meets (batches of a loader left unprepared, tensors the script makes) are on "
            f'another device; left as is: load it with map_location="cpu" where it meets only '
            f"those, or send them to {acc}.device",
        )


def _says_where(call: cst.Call) -> bool:
    """``torch.load(f, map_location=...)`` or ``torch.load(f, "cpu")``."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return len(positional) > 1 or any(
        a.keyword is not None and a.keyword.value == "map_location" for a in call.args
    )


def _loaded_into_a_model_name(ctx: Context, call: cst.Call) -> bool:
    """``model = torch.load(path)``: the name of a model the conversion places for."""
    parent = ctx.model.parent(call)
    if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1):
        return False
    return ctx.facts.flow.is_model_name(dotted(parent.targets[0].target), call)
