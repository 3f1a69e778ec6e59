"""A scheduler stepped both per batch and per epoch (``if args.sched == "cosine": sched.step()``
in the loop over batches, ``if args.sched == "step": sched.step()`` after it), left out of
``prepare`` by `prepare` (no one ``step_scheduler_with_optimizer`` keeps both paces). Its
per-epoch steps keep their pace unprepared; its per-batch steps would count one rank's batches,
1/N of the original's. Each per-batch step becomes ``for _ in range(accelerator.num_processes):
sched.step()``: one rank's batch stands for N of the original's, so the schedule makes the
original's count of steps per epoch, and the sequence of ``step()`` calls (N * per-rank batches,
then the epoch's) is the original's. That holds only where the step runs once per batch of a
sharded loader, unconditionally or under a test that does not change from batch to batch, with
no argument (an epoch handed to ``step(epoch + i / n)`` already says where it is), and for a
schedule that may run past its end (a shard padded to even length runs it ahead by less than
one step per rank per epoch, as a prepared scheduler does; OneCycleLR raises past its total).
Anywhere else the scheduler is left as it is, with review lines that say why."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.flow import SchedulerStep
from accelify.analysis.script_model import Kind, Loop
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.context import Context
from accelify.edits import rewrites
from accelify.edits.plan import NoteKind

#: Calls a test may make and still say the same at every batch.
_PURE_CALLS = {"isinstance", "len", "hasattr", "getattr"}
#: Blocks between a loop and a statement in it that run it other than once per iteration (or
#: not in this function).
_RUNS_OTHER_THAN_ONCE = (
    cst.While,
    cst.FunctionDef,
    cst.ClassDef,
    cst.Try,
    cst.ExceptHandler,
    cst.Finally,
)
#: Schedulers that raise when stepped past their end.
_BOUNDED = {"OneCycleLR"}


def run(ctx: Context) -> None:
    for name, (line, steps) in sorted(ctx.mixed_pace.items()):
        per_batch = [s for s in steps if s.per_batch]
        refusals = [why for why in (_refusal(ctx, name, s) for s in per_batch) if why]
        if refusals:
            _review(ctx, name, line, steps, refusals[0])
            continue
        for step in per_batch:
            statement = ctx.statement_of(step.call)
            code = ctx.code(step.call)
            ctx.plan.add(
                rewrites.step_per_process(statement, ctx.acc),
                line=ctx.line(step.call),
                text=f"{code} -> for _ in range({ctx.a('num_processes')}): {code} (each "
                "rank's batch stands for num_processes of the original's)",
            )
            ctx.need(step.call)
        ctx.plan.change(
            line,
            f"{name} is left unprepared: it is stepped per batch at "
            f"{_lines(ctx, steps, per_batch=True)} and per epoch at "
            f"{_lines(ctx, steps, per_batch=False)}; a prepared scheduler steps once per rank "
            "at each call, so no one step_scheduler_with_optimizer setting keeps both paces; "
            "its per-epoch steps keep their pace unprepared, and its per-batch steps step it "
            f"{ctx.a('num_processes')} times, so it makes the original's steps per epoch (a "
            "shard padded to even length runs it ahead by less than one step per rank per "
            "epoch, as a prepared scheduler does)",
        )


def _review(ctx: Context, name: str, line: int, steps: list[SchedulerStep], why: str) -> None:
    ctx.plan.review(
        line,
        f"{name} is left unprepared: it is stepped per batch at "
        f"{_lines(ctx, steps, per_batch=True)} and per epoch at "
        f"{_lines(ctx, steps, per_batch=False)}; a prepared scheduler steps once per "
        "rank at each call, so no one step_scheduler_with_optimizer setting keeps both "
        "paces (the per-epoch steps would count N times on N ranks); unprepared, it keeps "
        "its per-epoch schedule, but at its per-batch steps it counts only this rank's "
        "optimizer steps, 1/N of the original's: a schedule sized by the whole loader "
        f"gets 1/N of the way per epoch; not stepped {ctx.a('num_processes')} times there "
        f"by the conversion: {why}",
        kind=NoteKind.DIFFERS_ON_N_RANKS,
    )
    for step_line in sorted({ctx.line(s.call) for s in steps if s.per_batch}):
        ctx.plan.review(
            step_line,
            f"{name} is stepped here per batch but left unprepared (it is also stepped "
            "per epoch): on N ranks this loop runs 1/N of the original's batches on each "
            "rank, so the steps made here once per batch count 1/N of the original's; where "
            "each rank's batch here stands for num_processes of the original's, step it "
            f"{ctx.a('num_processes')} times here to keep the pace",
            kind=NoteKind.DIFFERS_ON_N_RANKS,
        )


def _refusal(ctx: Context, name: str, step: SchedulerStep) -> str | None:
    """Why stepping ``num_processes`` times at ``step`` would not be exactly the original's
    pace; None where it would."""
    call, line = step.call, ctx.line(step.call)
    if call.args:
        return f"the step at line {line} is handed an argument, which says where it is"
    statement = ctx.statement_of(call)
    if not (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and statement.body[0].value is call
    ):
        return f"the step at line {line} is not a statement of its own"
    if _bounded(ctx, name):
        return f"{name} raises when stepped past its total, which a padded shard can ask for"
    loop = _batch_loop(ctx, call)
    if loop is None:
        return f"the step at line {line} is not right inside a loop over a training loader"
    if ctx.unprepared_loaders(loop) or not _reads_a_loader(ctx, loop):
        return f"the loop at line {ctx.line(loop.node)} does not read a sharded loader"
    varying = _varying_test(ctx, call, loop)
    if varying is not None:
        return varying
    if not ctx.plan.reaches(call):
        return f"{ctx.acc} is not reachable at line {line}"
    if _reads_underscore(ctx, loop):
        return f"the loop at line {ctx.line(loop.node)} reads a name `_`"
    return None


def _bounded(ctx: Context, name: str) -> bool:
    for binding in ctx.model.of_kind(Kind.SCHEDULER):
        if binding.name == name and isinstance(binding.value, cst.Call):
            made = dotted(binding.value.func) or ""
            if made.rpartition(".")[2] in _BOUNDED:
                return True
    return False


def _batch_loop(ctx: Context, call: cst.Call) -> Loop | None:
    """The loop over batches ``call`` runs in, in its own function, with only blocks that run
    once (``if``, ``with``) between them; a step in the loop's ``else:`` runs once per pass."""
    loops = {id(loop.node): loop for loop in ctx.model.loops}
    child: cst.CSTNode = call
    for ancestor in ctx.model.ancestors(call):
        if isinstance(ancestor, cst.For):
            loop = loops.get(id(ancestor))
            per_batch = loop is not None and loop.trains and child is ancestor.body
            return loop if per_batch else None
        if isinstance(ancestor, _RUNS_OTHER_THAN_ONCE):
            return None
        child = ancestor
    return None


def _reads_a_loader(ctx: Context, loop: Loop) -> bool:
    return ctx.facts.flow.kind_of(loop.iterable, loop.node) is Kind.DATALOADER


def _varying_test(ctx: Context, call: cst.Call, loop: Loop) -> str | None:
    """A test between ``loop`` and ``call`` that may change from batch to batch: it reads a name
    the loop assigns (its target, a counter), a name assigned in another function (a method
    that flips ``self.warmup``), or calls a function."""
    assigned = _assigned_in(loop.node)
    function = ctx.facts.placement.enclosing_function(loop.node)
    for ancestor in ctx.model.ancestors(call):
        if ancestor is loop.node:
            return None
        if not isinstance(ancestor, cst.If):
            continue
        line = ctx.line(ancestor)
        for node in walk(ancestor.test):
            if isinstance(node, cst.Call) and dotted(node.func) not in _PURE_CALLS:
                return f"the test at line {line} calls {ctx.code(node.func)}()"
        for name in _names(ancestor.test) - _PURE_CALLS:
            if any(_may_be(name, bound) for bound in assigned):
                return f"the test at line {line} reads {name}, which changes per batch"
            if _assigned_elsewhere(ctx, name, function):
                return f"the test at line {line} reads {name}, assigned in another function"
    return None


def _assigned_in(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()
    for inner in walk(node):
        if isinstance(inner, _BINDS):
            found |= _names(inner.target)
    return found


#: What binds a name: its ``target``.
_BINDS = (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)


def _names(node: cst.CSTNode) -> set[str]:
    """The names and attribute chains ``node`` reads or binds (``self.per_epoch``, not its
    ``self`` or ``per_epoch`` apart); a subscript's or a call's receiver counts as itself."""
    name = dotted(node) if isinstance(node, cst.Name | cst.Attribute) else None
    if name is not None:
        return {name}
    found: set[str] = set()
    for child in node.children:
        found |= _names(child)
    return found


def _may_be(read: str, bound: str) -> bool:
    """``bound`` may be what ``read`` names: the same name, or an attribute of the same name
    on any object (``self.on`` set in a method is ``flag.on`` read outside)."""
    if read == bound:
        return True
    return "." in read and "." in bound and read.rpartition(".")[2] == bound.rpartition(".")[2]


#: What assigns a name outside a loop's own binding: its ``target``.
_ASSIGNS = (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)


def _assigned_elsewhere(ctx: Context, name: str, function: cst.FunctionDef | None) -> bool:
    """``name`` is assigned in a function other than ``function``, a constructor and the
    module's top level (an attribute a method sets as training goes)."""
    placement = ctx.facts.placement
    for node in ctx.model.index.of_type(_ASSIGNS):
        if not any(_may_be(name, bound) for bound in _assigned_in(node)):
            continue
        where = placement.enclosing_function(node)
        if where is None or where is function or where.name.value == "__init__":
            continue  # set once: at module level, before the loop, by the constructor
        return True
    return False


def _reads_underscore(ctx: Context, loop: Loop) -> bool:
    """The function around the loop uses ``_`` as a value (gettext's ``_()``): the new loop's
    variable would rebind it."""
    scope = ctx.facts.placement.enclosing_function(loop.node) or ctx.model.module
    bound = {
        id(part)
        for node in walk(scope)
        if isinstance(node, cst.For | cst.CompFor | cst.AssignTarget)
        for part in walk(node.target)
    }
    return any(
        isinstance(node, cst.Name) and node.value == "_" and id(node) not in bound
        for node in walk(scope)
    )


def _lines(ctx: Context, steps: list[SchedulerStep], per_batch: bool) -> str:
    """The lines of the step calls of one pace."""
    lines = sorted({ctx.line(s.call) for s in steps if s.per_batch is per_batch})
    return ", ".join(f"line {n}" for n in lines)
