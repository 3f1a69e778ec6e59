"""The arguments a function of the file receives through ``functools.partial``.

``check = functools.partial(evaluate, model)`` then ``check(val_loader)`` calls ``evaluate(model,
val_loader)``; the call graph sees no call of ``evaluate`` there, so nothing is known of its
parameters: whether ``model`` is the prepared model, whether ``loader`` is a loader left whole.
This module binds them: the partial's own arguments first, then each call of the variable it is
kept in. Only the plain shape is followed: the partial assigned once to a plain local name that
is read only to be called, or called where it is made (``partial(evaluate, model)(loader)``);
a partial handed on (to ``map()``, into a dict) fills only the parameters the partial itself
binds (``model``), as any call of it does.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted

_PARTIAL = {"functools.partial", "partial"}


def partial_arguments(
    model: ScriptModel, function: cst.FunctionDef, parameter: str
) -> list[cst.Arg] | None:
    """What each ``partial(function, ...)`` of the file, and each call of a variable one is kept
    in, passes for ``parameter`` (see the module's docstring). None when some partial may fill
    it with what is not known here: one whose calls are not followed (kept in a dict, handed
    to ``map()``) and that does not bind ``parameter`` itself, or one that unpacks (``*args``)."""
    found: list[cst.Arg] = []
    for read in model.index.names_spelled(function.name.value):
        argument = model.parent(read)
        made = model.parent(argument) if isinstance(argument, cst.Arg) else None
        if not _a_partial_of(model, made, argument):
            continue
        assert isinstance(made, cst.Call)
        own = list(made.args[1:])
        calls = _calls_of_partial(model, made)
        if any(a.star for a in own) or any(a.star for c in calls for a in c.args):
            return None
        if not calls:
            bound = _bound(function, made, own, parameter)
            if not bound:
                return None  # its calls are not followed, and they may fill it
            found += bound
        for call in calls:
            found += _bound(function, made, [*own, *call.args], parameter)
    return found


def _bound(
    function: cst.FunctionDef, made: cst.Call, arguments: list[cst.Arg], parameter: str
) -> list[cst.Arg]:
    """The one of ``arguments`` (the partial's, then its call's; none unpacks) bound to
    ``parameter``: the nodes themselves (a Call holds the Args it is given), whose places are
    the file's. Positional ones first: ``partial(f, m, device=d)(x)`` passes ``x`` second."""
    positional = [a for a in arguments if a.keyword is None]
    named = [a for a in arguments if a.keyword is not None]
    joined = cst.Call(func=made.func, args=[*positional, *named])
    return [arg for name, arg in bound_arguments(function, joined) if name == parameter]


def _a_partial_of(model: ScriptModel, made: cst.CSTNode | None, argument: cst.CSTNode) -> bool:
    """``made`` is ``functools.partial(f, ...)`` with ``argument`` its first argument."""
    if not isinstance(made, cst.Call) or not made.args or made.args[0] is not argument:
        return False
    return bool(_PARTIAL & (model.qualified(made.func) | {dotted(made.func) or ""}))


def _calls_of_partial(model: ScriptModel, made: cst.Call) -> list[cst.Call]:
    """The calls that run ``made``: itself called (``partial(f, a)(b)``), or each call of the
    plain local it is assigned to (``check = partial(f, a)`` then ``check(b)``) when that name is
    bound once in its function and read there only to be called."""
    parent = model.parent(made)
    if isinstance(parent, cst.Call) and parent.func is made:
        return [parent]
    if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1):
        return []
    target = parent.targets[0].target
    if not isinstance(target, cst.Name):
        return []
    around = model.index.enclosing_function(parent)
    calls = []
    for read in model.index.names_spelled(target.value):
        if read is target or model.index.enclosing_function(read) is not around:
            continue
        holder = model.parent(read)
        if not (isinstance(holder, cst.Call) and holder.func is read):
            return []  # bound again or handed on: which calls run the partial is not known
        calls.append(holder)
    return calls
