"""2. The ``Accelerator(...)`` itself: created in the scope that owns training, before the first
edit that needs it, threaded as a parameter into the helpers that need it. Runs last: it knows
every edit that needs the accelerator and every constructor argument the other steps found."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import Scope
from accelify.convert.steps.context import Context
from accelify.edits.plan import statement, with_keyword


def run(ctx: Context, prepare_scope: Scope) -> None:
    if ctx.acc.startswith("self."):
        _drop_unreachable(ctx, prepare_scope)
    create = f"{ctx.acc} = {ctx.constructor_code()}"
    home = _home(ctx, prepare_scope)
    threaded = _thread(ctx, home)
    anchor = _first_need(ctx, home, threaded)
    if anchor is None:
        return
    planned = ctx.plan.before.pop(anchor, [])  # what other steps put there comes after it
    _move_constructor_arguments_up(ctx, home, anchor)
    if anchor is ctx.prepare_anchor and not _needed_by(ctx, anchor):
        if planned:
            ctx.plan.before[anchor] = [*ctx.plan.before.get(anchor, []), *planned]
        # Nothing before the prepare call needs it: created right above that call, after the
        # last object it prepares, not between a model and its optimizer.
        ctx.plan.after[anchor] = [statement(create), *ctx.plan.after.get(anchor, [])]
        ctx.plan.change(ctx.line(anchor), f"created {create} after line {ctx.line(anchor)}")
        return
    ctx.plan.insert_before(anchor, statement(create), *planned)
    ctx.plan.change(ctx.line(anchor), f"created {create} before line {ctx.line(anchor)}")


def _needed_by(ctx: Context, statement_node: cst.CSTNode) -> bool:
    """An edit inside ``statement_node`` itself uses the accelerator."""
    placement = ctx.facts.placement
    return any(
        need is not statement_node and placement.inside(need, statement_node) for need in ctx.needs
    )


def _move_constructor_arguments_up(ctx: Context, home: Scope, anchor: cst.CSTNode) -> None:
    """``accum = 2`` set below the place the Accelerator is created moves up when it can."""
    placement = ctx.facts.placement
    body = placement.body_of(home)
    for name, line in placement.assigned_after(anchor, home, set(ctx.constructor.values())):
        hoisted = placement.hoistable(body, anchor, name)
        if hoisted is not None:
            ctx.plan.removals.add(hoisted)
            ctx.plan.insert_before(anchor, hoisted.deep_clone())
            code = ctx.code(hoisted).strip()
            ctx.plan.change(line, f"moved `{code}` up before line {ctx.line(anchor)}")
            continue
        ctx.plan.review(
            line,
            f"{name} is set after the Accelerator is created; "
            f"move it before line {ctx.line(anchor)}",
        )


def _home(ctx: Context, prepare_scope: Scope) -> Scope:
    if ctx.acc.startswith("self."):
        return prepare_scope
    if any(isinstance(ctx.model.scope_of(n), cst.Module) for n in ctx.needs):
        return ctx.model.module
    return prepare_scope


def _thread(ctx: Context, home: Scope) -> list[cst.CSTNode]:
    """Give each helper that needs the accelerator a parameter, and its callers the argument."""
    if isinstance(home, cst.Module):
        return []
    placement, plan, acc = ctx.facts.placement, ctx.plan, ctx.acc
    if acc.startswith("self."):
        owner = ctx.model.parent(ctx.model.parent(home))
        for need in ctx.needs:
            if not placement.inside(need, owner):  # type: ignore[arg-type]
                plan.review(
                    ctx.line(need), f"needs {acc} outside its class: pass the accelerator in"
                )
        return []
    call_sites: list[cst.CSTNode] = []
    pending = list(ctx.needs)
    done: set[cst.FunctionDef] = set()
    while pending:
        function = placement.top_function(pending.pop())
        if function is None or function in done or placement.inside(function, home):
            continue
        if placement.inside(home, function):
            continue
        done.add(function)
        plan.new_parameters[function] = acc
        name = function.name.value
        plan.change(ctx.line(function), f"{name}() takes the accelerator as a parameter")
        callers = placement.callers(function)
        if not callers:
            plan.review(
                ctx.line(function),
                f"{name}() now takes `accelerator`; its callers elsewhere must pass it",
            )
        for call in callers:
            plan.replacements[call] = _with_accelerator_argument(acc, plan.replacements.get(call))
            call_sites.append(call)
            pending.append(call)
    return call_sites


def _first_need(ctx: Context, home: Scope, call_sites: list[cst.CSTNode]) -> cst.CSTNode | None:
    placement = ctx.facts.placement
    body = placement.body_of(home)
    indices = []
    for node in [*ctx.needs, *call_sites]:
        if isinstance(home, cst.Module) and not isinstance(ctx.model.scope_of(node), cst.Module):
            continue
        top = placement.top_statement(node, home)
        if top is not None:
            indices.append(body.index(top))
    if not indices:
        return None
    first = max(min(indices), placement.first_free_index(home))
    return body[first] if first < len(body) else body[-1]


def _with_accelerator_argument(acc: str, previous):
    def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
        if previous is not None:
            updated = previous(updated)
        assert isinstance(updated, cst.Call)
        if any(a.keyword and a.keyword.value == acc for a in updated.args):
            return updated
        return updated.with_changes(args=with_keyword(updated.args, acc, cst.Name(acc)))

    return rewrite


def _drop_unreachable(ctx: Context, prepare_scope: Scope) -> None:
    """``self.accelerator`` exists only inside its class: nothing outside it is changed, and
    each place that would have needed it is listed for review."""
    owner = ctx.model.parent(ctx.model.parent(prepare_scope))
    plan = ctx.plan

    def outside(node: cst.CSTNode) -> bool:
        if node in ctx.reachable_outside:
            return False
        return not ctx.facts.placement.inside(node, owner)  # type: ignore[arg-type]

    dropped_lines: set[int] = set()

    def drop(node: cst.CSTNode) -> None:
        """Every line of the node: a change noted at a line inside it is not made either."""
        span = ctx.model.position(node)
        dropped_lines.update(range(span.start.line, span.end.line + 1))

    for node in [n for n in plan.replacements if outside(n)]:
        del plan.replacements[node]
        drop(node)
    for node in [n for n in plan.guards if outside(n)]:
        del plan.guards[node]
        drop(node)
    for node in [n for n in plan.contexts if outside(n)]:
        del plan.contexts[node]
        drop(node)
    for node in [n for n in plan.removals if outside(n)]:
        plan.removals.discard(node)
        drop(node)
    for inserts in (plan.before, plan.after):
        for node in [n for n in inserts if outside(n)]:
            del inserts[node]
    plan.changes = [note for note in plan.changes if note.line not in dropped_lines]
    for need in ctx.needs:
        if outside(need):
            plan.review(ctx.line(need), f"left as is: {ctx.acc} is not reachable outside its class")
    ctx.needs = [need for need in ctx.needs if not outside(need)]
