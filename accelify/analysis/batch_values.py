"""Whether a name inside a loop over a prepared loader still holds that loader's batch where it
is read. A loop's body may rebind its batch names from elsewhere (``j, data =
next(enumerate(test_loader))`` for a peek at the test set every tenth step, the test loader
left unprepared): a ``.to(device)`` of what it unpacks from there moves a tensor that is not on
the device yet, and dropping it would crash on a GPU. The answer follows the last binding of the
name above the read (`loss_sources.last_binding`) back, one value at a time, to the loop's own
target or a prepared object; anything else (a binding in a branch that may not run, a value made
from nothing the loop received) is not known to be on the device.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.dataflow import variables_in
from accelify.analysis.loss_sources import last_binding, runs_before
from accelify.analysis.script_model import Loop, ScriptModel
from accelify.analysis.syntax import target_names


def holds_the_batch(
    script: ScriptModel, loop: Loop, name: str, at: cst.CSTNode, prepared: set[str]
) -> bool:
    """``name`` read at ``at`` (in ``loop``'s body) holds what the loop's prepared loader
    handed over, or what a prepared object made (a prepared model's output, a batch of another
    prepared loader): it is on the device already. A name the body never rebinds above ``at``
    is the loop's target itself (``for x, y in loader``) or a prepared object; one it rebinds
    holds the batch when that binding runs whenever ``at`` does and its value reads one."""
    return _holds(script, loop, name, at, prepared, set())


def _holds(
    script: ScriptModel,
    loop: Loop,
    name: str,
    at: cst.CSTNode,
    prepared: set[str],
    seen: set[int],
) -> bool:
    looped = comprehension_source(script, name, at)
    if looped is not None:  # ``v`` of ``{k: v.to(d) for k, v in batch.items()}``
        return any(
            _holds(script, loop, read, at, prepared, seen) for read in variables_in(script, looped)
        )
    binding = last_binding(script, name, at)
    inner = _inner_loop_binding(script, loop, name, at)
    if inner is not None and (binding is None or not _inside(script, binding, inner.body)):
        # ``for x, y in val_loader:`` inside the training loop: what that loop iterates
        return any(
            _holds(script, loop, read, inner, prepared, seen)
            for read in variables_in(script, inner.iter)
        )
    if binding is None or not _inside(script, binding, loop.node.body):
        return name in loop.batch_names or name in prepared
    if id(binding) in seen or not runs_before(script, binding, at):
        return False
    seen.add(id(binding))
    if isinstance(binding, cst.AugAssign):
        return _holds(script, loop, name, binding, prepared, seen)  # ``x += 1`` stays put
    value = getattr(binding, "value", None)
    if value is None:
        return False
    return any(
        _holds(script, loop, read, binding, prepared, seen) for read in variables_in(script, value)
    )


def comprehension_source(
    script: ScriptModel, name: str, at: cst.CSTNode
) -> cst.BaseExpression | None:
    """What the comprehension around ``at`` that binds ``name`` iterates, if one does."""
    for ancestor in script.ancestors(at):
        if isinstance(ancestor, cst.BaseStatement):
            return None
        if isinstance(ancestor, cst.BaseComp):
            for_in: cst.CompFor | None = ancestor.for_in
            while for_in is not None:
                if name in target_names(for_in.target):
                    return for_in.iter
                for_in = for_in.inner_for_in
    return None


def _inner_loop_binding(
    script: ScriptModel, loop: Loop, name: str, at: cst.CSTNode
) -> cst.For | None:
    """The innermost ``for`` inside ``loop``'s body, around ``at``, whose target binds
    ``name``."""
    for ancestor in script.ancestors(at):
        if ancestor is loop.node:
            return None
        if (
            isinstance(ancestor, cst.For)
            and name in target_names(ancestor.target)
            and _inside(script, at, ancestor.body)
        ):
            return ancestor
    return None


def _inside(script: ScriptModel, node: cst.CSTNode, block: cst.CSTNode) -> bool:
    return any(ancestor is block for ancestor in script.ancestors(node))


def holds_an_argument(
    script: ScriptModel,
    function: cst.FunctionDef,
    parameters: set[str],
    name: str,
    at: cst.CSTNode,
    prepared: set[str],
) -> bool:
    """``name`` read at ``at`` in ``function`` holds what one of its ``parameters`` received
    (``x`` of ``x, y = batch`` in a trainer's ``step(self, batch)``), as `holds_the_batch`
    follows a loop's target: the parameters play the target's part, the function's body the
    loop's."""
    body = Loop(
        node=function,  # type: ignore[arg-type]  # what `_holds` reads of it: its body
        scope=function,
        iterable=None,
        batch_names=parameters,
        trains=False,
        evaluates=False,
    )
    return _holds(script, body, name, at, prepared, set())
