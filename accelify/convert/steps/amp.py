"""7. AMP: the GradScaler and its calls go, ``autocast`` blocks become ``accelerator.autocast()``,
and the precision moves to the Accelerator with every argument's meaning (``enabled=``, the
dtype, the CUDA-only device). When that cannot be said in one ``mixed_precision`` value, the
script's AMP stays as written and a review line says why."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.syntax import dotted
from accelify.convert.steps.context import Context
from accelify.edits.node_rewrites import Swap


def run(ctx: Context) -> None:
    precision = ctx.facts.precision
    if not precision.used:
        return
    withheld = ctx.withheld.get("mixed_precision")
    if precision.carried and withheld is not None:
        # it could be said in one value, but not where the Accelerator is made
        for autocast in precision.autocasts:
            ctx.plan.review(ctx.line(autocast.call), f"autocast left as is: {withheld}")
        for scaler in precision.scalers:
            ctx.plan.review(
                scaler.binding.line, f"GradScaler {scaler.binding.name} left as is: {withheld}"
            )
        return
    if not precision.carried:
        for autocast in precision.autocasts:
            ctx.plan.review(
                ctx.line(autocast.call),
                f"autocast left as is: {precision.reason}; no single "
                "Accelerator(mixed_precision=...) means the same",
            )
        for scaler in precision.scalers:
            ctx.plan.review(
                scaler.binding.line,
                f"GradScaler {scaler.binding.name} left as is: {precision.reason}",
            )
        for call in precision.unfollowed_scalers:
            ctx.plan.review(ctx.line(call), f"GradScaler left as is: {precision.reason}")
        return
    scalers = {scaler.binding.name for scaler in precision.scalers}
    for scaler in precision.scalers:
        binding = scaler.binding
        ctx.plan.remove(
            binding.statement,
            binding.line,
            f"removed GradScaler {binding.name} (the Accelerator scales fp16 losses)",
        )
    _drop_from_dels(ctx, scalers)
    for line_statement, call in ctx.facts.placement.expression_statements():
        if isinstance(call.func, cst.Attribute) and dotted(call.func.value) in scalers:
            method = call.func.attr.value
            if method in ("update", "unscale_"):
                ctx.plan.remove(
                    line_statement,
                    ctx.line(call),
                    f"removed {dotted(call.func)}() (the Accelerator handles the scaler)",
                )
            elif method == "step" and call.args:
                optimizer = call.args[0].value
                ctx.plan.replace(
                    call,
                    lambda updated: cst.Call(
                        cst.Attribute(updated.args[0].value, cst.Name("step"))
                    ),
                    ctx.line(call),
                    f"{dotted(call.func)}({ctx.code(optimizer)}) -> {ctx.code(optimizer)}.step()",
                )
    for autocast in precision.autocasts:
        call = autocast.call
        ctx.plan.replace(
            call,
            Swap(f"{ctx.acc}.autocast()"),
            ctx.line(call),
            f"{ctx.code(call.func)}(...) -> {ctx.a('autocast')}()",
        )
        ctx.need(call)
    if not ctx.options.mixed_precision and precision.mixed_precision is not None:
        ctx.constructor["mixed_precision"] = precision.mixed_precision
        ctx.plan.change(
            0,
            f"mixed precision moved to Accelerator(mixed_precision={precision.mixed_precision})",
        )


def _drop_from_dels(ctx: Context, scalers: set[str]) -> None:
    """``del model, optimizer, scaler`` (a Kaggle kernel's cleanup): the removed scaler leaves
    the ``del``, or the ``del`` goes when it named nothing else; kept, it would raise NameError."""
    for node in ctx.model.orders:
        if not isinstance(node, cst.Del):
            continue
        targets = _del_targets(node)
        kept = [t for t in targets if dotted(t.value) not in scalers]
        if len(kept) == len(targets):
            continue
        line = ctx.line(node)
        text = "removed the GradScaler from del (it no longer exists)"
        statement = ctx.model.parent(node)
        alone = isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
        if not kept and alone:
            ctx.plan.remove(statement, line, text)
            continue
        if not kept:
            ctx.plan.replace(node, lambda _: cst.Pass(), line, text)
            continue
        names = [t.value for t in kept]
        ctx.plan.replace(node, lambda updated, n=names: _del_of(updated, n), line, text)


def _del_targets(node: cst.Del) -> list[cst.Element]:
    target = node.target
    if isinstance(target, (cst.Tuple, cst.List)) and not target.lpar:
        return list(target.elements)
    return [cst.Element(target)]


def _del_of(updated: cst.Del, kept: list[cst.BaseExpression]) -> cst.Del:
    """``updated`` deleting only ``kept`` (compared as code, the updated targets being new
    nodes)."""
    module = cst.Module([])
    wanted = {module.code_for_node(k) for k in kept}
    elements = [e for e in _del_targets(updated) if module.code_for_node(e.value) in wanted]
    if len(elements) == 1:
        return updated.with_changes(target=elements[0].value)
    last = elements[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(target=cst.Tuple([*elements[:-1], last], lpar=[], rpar=[]))
