"""12. No dead branches left behind: an ``if`` whose every statement the conversion removed
(``if world_size > 1: dist.init_process_group(...)``) goes, and an ``if``/``else`` that now
sets the same device on every branch becomes that one assignment. Whether the other steps
left a block empty is the plan's to tell once every edit is planned (`Plan.remove_if_emptied`);
a condition with a call that might matter is kept."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, if_chain, walk
from accelify.convert.steps.context import Context

PURE_CALL_PREFIXES = ("torch.cuda.", "torch.backends.", "torch.distributed.", "os.environ.get")
PURE_CALLS = {"builtins.len", "builtins.int", "builtins.bool", "os.getenv"}


def run(ctx: Context) -> None:
    for node in ctx.facts.placement.all_nodes():
        if not isinstance(node, cst.If) or isinstance(ctx.model.parent(node), cst.If):
            continue
        _, blocks, _ = if_chain(node)
        if not _pure(ctx, node):
            continue
        ctx.plan.remove_if_emptied(
            node,
            [block.body if isinstance(block, cst.IndentedBlock) else [] for block in blocks],
            ctx.line(node),
            "removed the `if` the conversion left empty",
        )
        if len(blocks) > 1 and _same_device(ctx, blocks):
            ctx.plan.replace(
                node,
                _first_branch,
                ctx.line(node),
                "every branch sets the same device: one assignment",
                gives_way_to=[node],
            )


def _same_device(ctx: Context, blocks: list[cst.BaseSuite]) -> bool:
    devices = {binding.assign: binding.name for binding in ctx.model.of_kind(Kind.DEVICE)}
    names = set()
    for block in blocks:
        body = block.body if isinstance(block, cst.IndentedBlock) else []
        if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine):
            return False
        line = body[0]
        if len(line.body) != 1 or line.body[0] not in devices:
            return False
        names.add(devices[line.body[0]])
    return len(names) == 1


def _first_branch(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.If) and isinstance(updated.body, cst.IndentedBlock)
    return updated.body.body[0].with_changes(leading_lines=updated.leading_lines)


def _pure(ctx: Context, node: cst.If) -> bool:
    """Every condition of the chain reads values and calls nothing that could matter."""
    tests, _, _ = if_chain(node)
    for test in tests:
        for inner in walk(test):
            if isinstance(inner, (cst.Await, cst.Yield, cst.NamedExpr)):
                return False
            if isinstance(inner, cst.Call):
                qualified = ctx.model.call_names(inner) or {dotted(inner.func) or ""}
                if not any(q in PURE_CALLS or q.startswith(PURE_CALL_PREFIXES) for q in qualified):
                    return False
    return True
