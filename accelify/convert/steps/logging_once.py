"""Log records once, as prints are: a script that logs through the ``logging`` module
(``logger.info(...)``, ``logging.warning(...)``) would write every record once per rank. Right
after the Accelerator is created, the other processes stop logging below ERROR, as HF
Accelerate's examples set their libraries' verbosity to errors off the main process. On one
process nothing changes."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.objects import bound_arguments, callee
from accelify.analysis.syntax import assigned_targets, dotted
from accelify.convert.steps.context import Context

#: What logs a record: the module's own functions and the methods of a logger from
#: ``logging.getLogger``.
EMITTERS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}


def run(ctx: Context) -> None:
    loggers = _loggers(ctx)
    calls = [call for call in ctx.model.calls if _logs(ctx, call, loggers)]
    if not calls and _logger_out_of_sight(ctx):
        calls = [call for call in ctx.model.calls if _may_log(ctx, call)]
    if not calls:
        return
    module = next(
        (name for name, what in ctx.model.imports.bound.items() if what == "logging"), None
    )
    if module is None and _made_by_a_project_factory(ctx, loggers, calls):
        # the records go through ``logging`` all the same: this file imports it to say so
        module = "logging"
        ctx.extra_imports.append("import logging")
    if module is None:
        ctx.plan.review(
            ctx.line(calls[0]),
            "records logged through `logging` are written by every rank; `import logging` and, "
            "once the Accelerator exists, `logging.disable(logging.WARNING)` on the processes "
            "that are not the main one",
        )
        return
    ctx.after_creation.append(
        f"if not {ctx.acc}.is_local_main_process:\n"
        f"    {module}.disable({module}.WARNING)  # log records once, on the main process\n"
    )
    ctx.plan.change(
        ctx.line(calls[0]),
        "logging: records below ERROR are logged on the main process only (as prints are)",
    )


def _loggers(ctx: Context) -> set[str]:
    """Names bound to ``logging.getLogger(...)``: ``logger``, ``self.log``; and, through the
    file's calls, what receives one: ``self.logger = logger`` in a trainer built with
    ``Trainer(..., logger)``, so that its ``self.logger.info(...)`` logs too."""
    found = set()
    for assign in ctx.model.assignments:
        value = assign.value
        if isinstance(value, cst.Call) and (
            "logging.getLogger" in ctx.model.qualified(value.func)
            or dotted(value.func) in ctx.imported_loggers
        ):
            found |= {dotted(target) for target in assigned_targets(assign)} - {None}
    for _ in range(3):  # a logger handed from main to a trainer, then to a helper
        received = _received_loggers(ctx, found)
        more = {
            name
            for assign in ctx.model.assignments
            if isinstance(assign.value, cst.Name)
            and (ctx.model.scope_of(assign), assign.value.value) in received
            for name in (dotted(target) for target in assigned_targets(assign))
            if name is not None
        }
        more |= {parameter for _, parameter in received}
        if more <= found:
            break
        found |= more
    return found  # type: ignore[return-value]


def _received_loggers(ctx: Context, loggers: set[str]) -> set[tuple[object, str]]:
    """(function, parameter) pairs that some call of the file hands one of ``loggers``."""
    received = set()
    for call in ctx.model.calls:
        target = callee(ctx.model, call)
        if target is None:
            continue
        function, implicit = target
        for parameter, argument in bound_arguments(function, call, implicit):
            if dotted(argument.value) in loggers:
                received.add((function, parameter))
    return received


def _logs(ctx: Context, call: cst.Call, loggers: set[str]) -> bool:
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in EMITTERS):
        return False
    if dotted(func.value) in loggers:
        return True
    return any(q.rpartition(".")[0] == "logging" for q in ctx.model.qualified(func))


def _logger_out_of_sight(ctx: Context) -> bool:
    """A ``logging.getLogger(...)`` whose logger is not bound to a name: kept in a dict
    (``train_cfg = {"logger": logging.getLogger("reid"), ...}``) or handed straight to a call,
    then used where the analysis does not follow it (``self.logger = train_cfg["logger"]``)."""
    for call in ctx.model.calls:
        if "logging.getLogger" not in ctx.model.qualified(call.func):
            continue
        if not isinstance(ctx.model.parent(call), (cst.Assign, cst.AnnAssign)):
            return True
    return False


def _may_log(ctx: Context, call: cst.Call) -> bool:
    """``self.logger.info(...)``: a record-level method called on an object of the script (not
    a module it imports), which may be the logger `_logger_out_of_sight` lost track of."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in EMITTERS - {"log"}):
        return False
    receiver = dotted(func.value)
    return receiver is not None and receiver.split(".")[0] not in ctx.model.imports.bound


def _made_by_a_project_factory(ctx: Context, loggers: set[str], calls: list[cst.Call]) -> bool:
    """Every record ``calls`` log goes through a logger a function of the project's other
    modules returned (`project.imported_loggers`), and this file binds no name ``logging``:
    ``import logging`` can be added to switch them off on the other ranks."""
    if not ctx.imported_loggers or "logging" in ctx.model.imports.bound:
        return False
    made = {
        name
        for assign in ctx.model.assignments
        if isinstance(assign.value, cst.Call) and dotted(assign.value.func) in ctx.imported_loggers
        for name in (dotted(target) for target in assigned_targets(assign))
        if name is not None
    }
    return bool(made) and all(
        isinstance(call.func, cst.Attribute) and dotted(call.func.value) in loggers
        for call in calls
    )
