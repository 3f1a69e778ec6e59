"""What a save call writes: the expression it is handed, or for a name the value the name was
last given above the save and what was stored into it by key since. Asked by the conversion
(a prepared model kept whole in a checkpoint dict is unwrapped there) and by ACC503 (a state
dict of the wrapper kept in one)."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.device_moves import module_chain_root
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import assigned_targets


def saved_values(
    script: ScriptModel, saved: cst.BaseExpression, call: cst.Call
) -> list[cst.CSTNode]:
    """What is saved: the expression itself, or for a name (``ckpt = {"model":
    model.state_dict()}`` then ``accelerator.save(ckpt, path)``) the value it was last given
    above the save in the same function (watchog's pre-training checkpoint), with what was
    stored into it by key since (``ckpt = {}``, then ``ckpt["llm"] = llm.state_dict()``, as an
    audio-understanding trainer builds its checkpoint)."""
    if not isinstance(saved, cst.Name):
        return [saved]
    here, scope = script.order(call), script.scope_of(call)
    last = None
    for assign in script.index.assignments_to(saved.value):
        if not isinstance(assign, cst.Assign) or script.scope_of(assign) is not scope:
            continue
        if script.order(assign) < here and (
            last is None or script.order(assign) > script.order(last)
        ):
            last = assign
    since = script.order(last) if last is not None else -1
    stored = [
        assign.value
        for assign in script.index.of_type(cst.Assign)
        if isinstance(assign, cst.Assign)
        and since < script.order(assign) < here
        and script.scope_of(assign) is scope
        and any(_stores_into(target, saved.value) for target in assigned_targets(assign))
    ]
    return [last.value if last is not None else saved, *stored]


def _stores_into(target: cst.BaseExpression, name: str) -> bool:
    """``name[key]`` (or ``name.member``) as an assignment's target: a value kept in ``name``."""
    return (
        isinstance(target, (cst.Subscript, cst.Attribute))
        and isinstance(target.value, cst.Name)
        and target.value.value == name
    )


def saved_whole_objects(script: ScriptModel, call: cst.Call) -> list[cst.Name | cst.Attribute]:
    """The names a save pickles whole: its object (``torch.save(model, p)``, also through
    ``model.to("cpu")``) or an entry of the checkpoint dict it writes (``state = {'net': net,
    'acc': acc}``, or ``state['net'] = net``). Which of them are models is the caller's
    question; a prepared one is the wrapper, whose hooks do not pickle."""
    if not call.args:
        return []
    saved = call.args[0].value
    kept: list[cst.BaseExpression] = [saved]  # a name: the model itself, or a dict of it
    for value in saved_values(script, saved, call):
        if isinstance(value, cst.Dict):
            kept += [e.value for e in value.elements if isinstance(e, cst.DictElement)]
        elif value is not saved and isinstance(value, cst.BaseExpression):
            kept.append(value)  # ``state['net'] = net``
    found = [module_chain_root(value) for value in kept]
    return [name for name in found if name is not None]


def saved_state_dicts(script: ScriptModel, call: cst.Call) -> list[cst.Call]:
    """The ``x.state_dict()`` calls whose result a save writes: its object itself, or an entry
    of the checkpoint it writes, nested dicts, lists and tuples included (``{"model":
    model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}``, ``ckpt["ema"] =
    ema.state_dict()``). Whose state each is, is the caller's question."""
    if not call.args:
        return []
    found: list[cst.Call] = []
    pending = list(saved_values(script, call.args[0].value, call))
    while pending:
        value = pending.pop()
        if isinstance(value, cst.Dict):
            pending += [e.value for e in value.elements if isinstance(e, cst.DictElement)]
        elif isinstance(value, (cst.List, cst.Tuple)):
            pending += [e.value for e in value.elements if isinstance(e, cst.Element)]
        elif (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "state_dict"
            and not value.args
        ):
            found.append(value)
    return sorted(found, key=script.order)


def saves_of_states(script: ScriptModel) -> dict[int, tuple[cst.Call, cst.Call]]:
    """Each ``x.state_dict()`` call a ``torch.save`` of the script writes, by id, with the
    first such save (in the file's order)."""
    found: dict[int, tuple[cst.Call, cst.Call]] = {}
    for call in script.calls:
        if script.call_names(call) & names.TORCH_SAVE:
            for state in saved_state_dicts(script, call):
                found.setdefault(id(state), (state, call))
    return found
