"""5. Device moves: models and batches arrive where prepare puts them, ``device`` becomes
``accelerator.device``, a kept ``.cuda()`` becomes ``.to(accelerator.device)``."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.device_moves import (
    batch_moves_in,
    is_cuda_literal,
    is_identity_assignment,
    move_receiver,
    read_as_string,
    strip_moves,
)
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.context import Context
from accelify.edits.plan import expression


def run_model_moves(ctx: Context) -> None:
    model_names = ctx.model.names_of(Kind.MODEL)
    for binding in ctx.model.of_kind(Kind.MODEL):
        stripped = strip_moves(binding.value)
        if stripped is binding.value or binding.statement in ctx.plan.removals:
            continue
        if binding.value in ctx.plan.replacements:  # a DataParallel(...) already unwrapped
            continue
        if dotted(stripped) == binding.name:
            ctx.plan.remove(
                binding.statement,
                binding.line,
                f"removed {binding.name} device move (prepare places the model)",
            )
            continue
        ctx.plan.replace(
            binding.value,
            lambda updated: strip_moves(updated),
            binding.line,
            f"removed .to(device) of {binding.name} (prepare places the model)",
        )
    for line_statement, call in ctx.facts.placement.expression_statements():
        target = move_receiver(call)
        if target is not None and dotted(target) in model_names | ctx.facts.flow.param_names(
            Kind.MODEL
        ):
            ctx.plan.remove(
                line_statement,
                ctx.line(call),
                f"removed {dotted(target)} device move (prepare places the model)",
            )


def run_batch_moves(ctx: Context) -> None:
    for loop in ctx.model.loops:
        if not ctx.facts.flow.reads_loader(loop):
            continue
        batch = set(loop.batch_names) | ctx.facts.flow.derived_batch_names(loop)
        for node in walk(loop.node.body):
            if isinstance(node, cst.SimpleStatementLine):
                _batch_move_statement(ctx, node, batch)


def run_devices(ctx: Context) -> None:
    for binding in ctx.model.of_kind(Kind.DEVICE):
        device = ctx.a("device")
        if _is_string(binding.value) and read_as_string(ctx.model, binding.name):
            device = f"str({device})"  # a string the script reads as one stays one
        ctx.plan.replace(
            binding.value,
            lambda _, device=device: expression(device),
            binding.line,
            f"{binding.name} = {device}",
        )
        ctx.need(binding.statement)
    for call in ctx.model.calls:
        if _calls_method(call, "cuda") and call not in ctx.plan.replacements:
            if not call.args:
                acc = ctx.acc
                ctx.plan.replace(
                    call,
                    lambda updated, acc=acc: updated.with_changes(
                        func=updated.func.with_changes(attr=cst.Name("to")),
                        args=[cst.Arg(expression(f"{acc}.device"))],
                    ),
                    ctx.line(call),
                    f".cuda() -> .to({ctx.a('device')})",
                )
                ctx.need(call)
        elif (
            _calls_method(call, "to")
            and call not in ctx.plan.replacements
            and call.args
            and is_cuda_literal(call.args[0].value)
        ):
            ctx.plan.replace(
                call.args[0].value,
                lambda _: expression(ctx.a("device")),
                ctx.line(call),
                f'.to("cuda") -> .to({ctx.a("device")})',
            )
            ctx.need(call)
        for argument in call.args:
            if (
                argument.keyword is not None
                and argument.keyword.value == "device"
                and is_cuda_literal(argument.value)
            ):
                ctx.plan.replace(
                    argument.value,
                    lambda _: expression(ctx.a("device")),
                    ctx.line(call),
                    f'device="cuda" -> device={ctx.a("device")}',
                )
                ctx.need(call)


def _batch_move_statement(
    ctx: Context, line_statement: cst.SimpleStatementLine, batch: set[str]
) -> None:
    for small in line_statement.body:
        if not isinstance(small, cst.Assign):
            continue
        moves = batch_moves_in(small.value, batch)
        if not moves:
            continue
        if is_identity_assignment(small, batch):
            ctx.plan.remove(
                line_statement,
                ctx.line(small),
                "removed batch device move (batches arrive on accelerator.device)",
            )
            return
        for move in moves:
            ctx.plan.replace(
                move,
                _drop_move,
                ctx.line(move),
                "removed batch device move (batches arrive on accelerator.device)",
            )


def _is_string(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.IfExp):
        return _is_string(value.body) and _is_string(value.orelse)
    return isinstance(value, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString))


def _calls_method(call: cst.Call, method: str) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == method


def _drop_move(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
    return updated.func.value
