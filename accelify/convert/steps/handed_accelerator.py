"""The accelerator handed to a module-level helper from outside the class that owns it.

A trainer class creates ``self.accelerator`` and prepares its loaders; ``main`` then calls
``summarize(trainer.model, trainer.val_loader)``, a function of the module that evaluates the
prepared loader. No accelerator reaches that function, so its gather cannot be written and the
metrics cover one rank's shard. Where every call of the function in the file can name an
accelerator (``trainer.accelerator`` through the instance its scope made, ``self.accelerator``
in a method of the owning class), the function takes an ``accelerator`` parameter and each call
passes the one it reaches; an edit in the function then uses that parameter.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.syntax import all_params, walk
from accelify.convert.steps.context import HANDED_ACCELERATOR as PARAMETER
from accelify.convert.steps.context import Context
from accelify.edits.kinds import Wrap
from accelify.edits.node_rewrites import WithKeyword


def calls_to_pass(ctx: Context, node: cst.CSTNode) -> list[tuple[cst.Call, str]] | None:
    """Each call of ``node``'s function with the accelerator it would pass, where that
    function can take it as `PARAMETER`; None where it cannot: the plan already reaches
    ``node``, ``node`` is in no module-level function, or a call of that function names no
    accelerator (one the file cannot see: it is handed on, or called where no accelerator
    exists, at import or while the instance is built)."""
    placement, graph = ctx.facts.placement, ctx.facts.calls
    function = placement.top_function(node)
    if not ctx.acc.startswith("self.") or function is None or ctx.plan.reaches(node):
        return None
    if function in ctx.handed_in:
        return ctx.handed_in[function]
    if graph.owner(function) is not None or _binds(function, PARAMETER):
        return None
    callers = graph.callers(function)
    if not callers or graph.references(function) or graph.uncertain_callers(function):
        return None
    passed: list[tuple[cst.Call, str]] = []
    for call in callers:
        caller = placement.enclosing_function(call)
        if caller is None or caller.name.value == "__init__":
            return None
        acc = _reached_at(ctx, call)
        keywords = {a.keyword.value for a in call.args if a.keyword is not None}
        if acc is None or acc == PARAMETER or PARAMETER in keywords:
            return None
        passed.append((call, acc))
    return passed


def hand_in(ctx: Context, node: cst.CSTNode, passed: list[tuple[cst.Call, str]]) -> None:
    """``node``'s function takes the accelerator (`calls_to_pass` found ``passed``): an edit
    there uses it."""
    function = ctx.facts.placement.top_function(node)
    assert function is not None
    ctx.handed_in[function] = passed


def thread(ctx: Context) -> None:
    """Each registered helper gains the parameter, and each call of it passes the accelerator
    it reaches (``accelerator=trainer.accelerator``)."""
    for function, passed in ctx.handed_in.items():
        ctx.plan.add_parameter(function, PARAMETER)
        for call, acc in passed:
            ctx.plan.add(Wrap(call, WithKeyword(PARAMETER, acc)), anywhere=True)
        where = " or ".join(sorted({acc for _, acc in passed}))
        ctx.plan.change(
            ctx.line(function),
            f"{function.name.value}() takes the accelerator as a parameter: each call in the "
            f"file passes it ({where})",
        )


def _reached_at(ctx: Context, call: cst.Call) -> str | None:
    """The accelerator a call of the helper can pass: ``self.accelerator`` in the class that
    owns it, ``trainer.accelerator`` through an instance of that class the scope made (known
    before the prepare call is planned: the class is the one of the method that prepares)."""
    if ctx.plan.reaches(call):
        return ctx.acc
    scope = ctx.scope if isinstance(ctx.scope, cst.FunctionDef) else None
    owner = ctx.facts.placement.class_of(scope) if scope is not None else None
    outside = ctx.instance_outside_class(call, owner)
    return f"{outside}.accelerator" if outside is not None else None


def _binds(function: cst.FunctionDef, name: str) -> bool:
    """``function`` has a parameter ``name`` or assigns it."""
    if any(p.name.value == name for p in all_params(function.params)):
        return True
    return any(
        isinstance(n, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign))
        and isinstance(getattr(n, "target", None), cst.Name)
        and n.target.value == name  # type: ignore[attr-defined]
        for n in walk(function)
    )
