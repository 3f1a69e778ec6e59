"""3. One ``prepare`` call for every model, optimizer, DataLoader and LR scheduler of the scope
that owns training, after the last of them is created, unpacked back into the same names."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.script_model import Binding, Kind, Scope
from accelify.analysis.syntax import dotted, if_chain, walk
from accelify.convert.steps.context import Context
from accelify.edits.plan import statement


def run(ctx: Context, scope: Scope) -> None:
    kinds = (Kind.MODEL, Kind.OPTIMIZER, Kind.DATALOADER, Kind.SCHEDULER)
    placement = ctx.facts.placement
    chosen: dict[str, Kind] = {}
    last_statement = None
    for binding in ctx.model.of_kind(*kinds):
        if binding.scope is not scope or binding.name in chosen:
            continue
        top = placement.top_statement(binding.statement, scope)
        if top is None:
            continue
        if _conditional(ctx, binding):
            _prepare_where_created(ctx, binding)
            continue
        chosen[binding.name] = binding.kind
        if last_statement is None or placement.index(top, scope) > placement.index(
            last_statement, scope
        ):
            last_statement = top
    if isinstance(scope, cst.FunctionDef) and last_statement is not None:
        # A model handed in as a parameter and trained here (``def main(model):``).
        for name, kind in ctx.facts.flow.params.get(scope, {}).items():
            if kind is Kind.MODEL and name in _trained_here(ctx, scope):
                chosen.setdefault(name, kind)
    per_epoch = ctx.facts.flow.per_epoch_schedulers(set(chosen))
    per_step = {n for n, kind in chosen.items() if kind is Kind.SCHEDULER} - per_epoch
    if per_epoch and not per_step:
        ctx.constructor["step_scheduler_with_optimizer"] = "False"
    elif per_epoch:
        for name in per_epoch:
            chosen.pop(name)
            ctx.plan.review(
                ctx.line(last_statement),
                f"{name} is stepped once per epoch and another scheduler once per step: "
                f"{name} is left unprepared so its schedule keeps its pace",
            )
    if not chosen or last_statement is None:
        return
    order = sorted(chosen, key=lambda n: list(Kind).index(chosen[n]))  # type: ignore[arg-type]
    targets = ", ".join(order)
    prepare = statement(_prepare_code(ctx, order, last_statement))
    ctx.plan.insert_after(last_statement, prepare)
    ctx.need(last_statement)
    ctx.plan.prepared = [*order, *ctx.plan.prepared]
    ctx.prepare_anchor = last_statement
    ctx.plan.change(
        ctx.line(last_statement), f"prepare {targets} after line {ctx.line(last_statement)}"
    )


def _trained_here(ctx: Context, scope: Scope) -> set[str]:
    return {
        name
        for optimizer in ctx.model.of_kind(Kind.OPTIMIZER)
        if optimizer.scope is scope
        for name in parameter_owners(optimizer)
    }


def _conditional(ctx: Context, binding: Binding) -> bool:
    """Created under an ``if`` (or in a loop or ``try``) that may not run: a prepare call after
    the block would raise NameError on the runs that skip it. An ``if``/``else`` that binds the
    name on every branch is not conditional."""
    for ancestor in ctx.model.ancestors(binding.statement):
        if ancestor is binding.scope:
            return False
        if isinstance(ancestor, (cst.For, cst.While, cst.Try)):
            return True
        if isinstance(ancestor, cst.If) and not _bound_on_every_branch(ancestor, binding.name):
            return True
    return False


def _bound_on_every_branch(branch: cst.If, name: str) -> bool:
    _, blocks, has_else = if_chain(branch)
    return has_else and all(_binds(block, name) for block in blocks)


def _binds(block: cst.CSTNode, name: str) -> bool:
    return any(
        isinstance(node, cst.AssignTarget) and dotted(node.target) == name for node in walk(block)
    )


def _prepare_where_created(ctx: Context, binding: Binding) -> None:
    """Prepared on its own, right where it exists. A scheduler is not: prepared before its
    optimizer it would not see the prepared one, and one stepped per epoch must stay as it is
    (a prepared scheduler steps once per rank)."""
    name = binding.name
    if binding.kind is Kind.SCHEDULER:
        if name not in ctx.facts.flow.per_epoch_schedulers({name}):
            ctx.plan.review(
                binding.line,
                f"{name} is created under a condition and left unprepared: it steps once per "
                "optimizer step on each rank; prepare it with its optimizer if it should "
                "follow the global step count",
            )
        return
    ctx.plan.insert_after(binding.statement, statement(f"{name} = {ctx.a('prepare')}({name})"))
    ctx.need(binding.statement)
    ctx.plan.prepared.append(name)
    ctx.plan.change(
        binding.line, f"{name} is created under a condition: prepared where it is created"
    )
    if binding.kind in (Kind.MODEL, Kind.OPTIMIZER):
        ctx.plan.review(
            binding.line,
            f"{name} is prepared on its own: with --backend fsdp or deepspeed, models and "
            "optimizers must be prepared in one call",
        )


def _prepare_code(ctx: Context, order: list[str], anchor: cst.CSTNode) -> str:
    """``a, b = accelerator.prepare(a, b)``, wrapped as black wraps it when too long."""
    indent = 4 * sum(isinstance(a, cst.IndentedBlock) for a in ctx.model.ancestors(anchor))
    targets = ", ".join(order)
    call = ctx.a("prepare")
    code = f"{targets} = {call}({targets})"
    if indent + len(code) <= 88:
        return code
    if indent + len(f"{targets} = {call}(") <= 88 and indent + 4 + len(targets) <= 88:
        return f"{targets} = {call}(\n    {targets}\n)"
    one_per_line = "".join(f"    {name},\n" for name in order)
    if indent + 4 + len(targets) <= 88:
        return f"(\n{one_per_line}) = {call}(\n    {targets}\n)"
    return f"(\n{one_per_line}) = {call}(\n{one_per_line})"
