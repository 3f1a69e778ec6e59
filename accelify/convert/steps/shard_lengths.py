"""LR schedulers sized by the length of a loader that is already prepared when they are made:
one mechanism, one policy, wherever the loader was prepared.

Two shapes meet it. A flat script whose training loader is used before its scheduler is made
(a warm-up pass, ``loaders["train"]`` iterated first) gets its prepare above the scheduler; a
trainer class that prepares a loader where it receives it (``__init__(self, loader)``) has
``fit()`` make ``OneCycleLR(opt, total_steps=len(self.loader) * epochs)`` later. Either way
``len()`` now reads one rank's shard, N times fewer batches, while a prepared scheduler steps
N times per ``step()``: the schedule would end after 1/N of the training (ACC415).

The policy: the scheduler stays prepared, and each such ``len(loader)`` becomes ``(len(loader)
* accelerator.num_processes)`` (diffusers' sizing): all ranks' steps, what the prepared
scheduler counts. That holds at either pace: stepped per batch, the prepared scheduler makes
N steps per call over the shard's batches; stepped per epoch (``step_scheduler_with_optimizer
=False``), it makes one, and its sizes are the whole set's, as on one process. Leaving the
scheduler out of prepare with the shard's length (an earlier policy of the class shape) keeps
only the first. On one process ``num_processes`` is 1: the script computes what it did.

The ``len()`` is found in the scheduler's arguments or through up to three local bindings
above them (``steps = len(self.loader) * self.epochs``); a binding on the way is rewritten only
where nothing but that chain reads its name (a printed step count keeps its meaning). Any other
read of the loader in the sizing (``loader.dataset``, a ``len()`` of a name bound to it), or a
binding read elsewhere, leaves the code as it is with a review line; a sizing that already
names the process count is left alone."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.accumulation import stepped_every
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.scheduler_preparation import PROCESS_COUNT
from accelify.analysis.script_model import Binding, Kind
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps.context import Context

#: how many local bindings (``steps = len(self.loader) * epochs``) a sizing is followed through
_DEPTH = 3


def size_in_all_ranks_steps(ctx: Context, binding: Binding, measured: set[str], why: str) -> bool:
    """Size the scheduler of ``binding`` in all ranks' steps where it reads ``len()`` of one of
    ``measured`` (loaders, or dicts of them, prepared before it is made; ``why`` says where,
    for the summary). True where the scheduler reads one of them at all (rewritten or given
    a review line), False where it does not."""
    if binding.value is None:
        return False
    if PROCESS_COUNT.search(ctx.code(binding.value)):
        return False
    found = _Reads(ctx, measured)
    found.follow(binding.value, binding.statement, _DEPTH)
    if not found.lengths and not found.other:
        return False
    shown = ", ".join(sorted(found.loaders))
    factor = ctx.a("num_processes")
    shared = [name for name in found.bound if _read_elsewhere(ctx, name, binding, found)]
    if found.other or shared:
        ctx.plan.review(
            binding.line,
            f"{binding.name} is sized from {shown}, {why}: if its sizes count batches, they "
            "count one rank's shard (N times fewer) while a prepared scheduler steps N times "
            f"per call, so the schedule ends N times too soon; multiply those counts by "
            f"{factor}, or compute them from the loaders before they are prepared",
        )
        return True
    for length in found.lengths:
        if id(length) in ctx.sized_lengths:
            continue
        ctx.sized_lengths.add(id(length))
        code = f"({ctx.code(length)} * {factor})"
        held = next((b for b in found.bound.values() if _within(ctx, length, b)), None)
        ctx.plan.replace(
            length,
            lambda _node, code=code: cst.parse_expression(code),
            binding.line if held is None else ctx.line(held),
            f"{ctx.code(length)} -> {code}: {binding.name} is made after {shown} is "
            f"prepared ({why}), so the length is one rank's shard, and a prepared scheduler "
            "steps num_processes times per call: sized in all ranks' steps, its schedule is "
            "the original's",
            anywhere=True,
        )
    return True


def sized_by_a_received_loader(ctx: Context, binding: Binding) -> set[str]:
    """The loaders (as the scheduler's class reads them: ``self.loader``, or the parameter in
    the method that prepares it, below the prepare) that a method of its class prepares as it
    receives them (`Context.received_preparations`) and that the scheduler of ``binding`` may
    be sized by."""
    placement = ctx.facts.placement
    measured: set[str] = set()
    for owner, method, prepared, kept in ctx.received_preparations:
        if not placement.inside(binding.statement, owner):
            continue
        measured |= {kept[name] for name in prepared if name in kept}
        if placement.inside(binding.statement, method):
            measured |= set(prepared)
    return measured


def size_received(ctx: Context, schedulers: set[str]) -> None:
    """Each scheduler of ``schedulers`` (to be prepared, or prepared) made in a class that
    prepares a loader it reads the length of as it receives it, sized in all ranks' steps."""
    for binding in ctx.model.of_kind(Kind.SCHEDULER):
        if binding.name not in schedulers or binding.received:
            continue
        measured = sized_by_a_received_loader(ctx, binding)
        if measured:
            size_in_all_ranks_steps(
                ctx, binding, measured, "which the class prepares as it receives it"
            )


def run(ctx: Context) -> None:
    """Once every ``prepare`` is placed: the prepared schedulers a ``prepare`` took before the
    loader's receiving method was seen, sized the same way (those already sized are skipped);
    then those sized from a loader's length before the loader is prepared."""
    size_received(ctx, set(ctx.plan.prepared))
    review_sized_before_prepare(ctx)


def review_sized_before_prepare(ctx: Context) -> None:
    """``steps_total = epochs * len(train_loader)`` above the prepare that takes both the loader
    and the scheduler sized by it: the whole set's batches. Prepared, each of N ranks reads
    its shard's batches, rounded up, and the scheduler steps N times at each step(): where the
    batches do not split evenly it takes other steps than the length counts, most often more
    (trial24's lit.py: 13 batches, 7 per rank on 2 ranks, 56 steps for a cosine sized 52, whose
    LR rose again past its end). The code stays (even splits are exact, and HF's scripts size
    so); a review line says how to size it in the steps it takes. Only for a scheduler stepped
    per batch or per optimizer step: one stepped per epoch counts epochs."""
    prepared = set(ctx.plan.prepared)
    for binding in ctx.model.of_kind(Kind.SCHEDULER):
        if binding.name not in prepared or binding.received or binding.value is None:
            continue
        if PROCESS_COUNT.search(ctx.code(binding.value)):
            continue
        steps = ctx.facts.flow.scheduler_steps({binding.name})
        if not any(s.per_batch and not _per_optimizer_step(ctx, s.call) for s in steps):
            continue  # per epoch it counts epochs; per accumulated step `accumulation` says it
        found = _Reads(ctx, set(ctx.prepared_after) & prepared)
        found.follow(binding.value, binding.statement, _DEPTH)
        for length in found.lengths:
            loader = _measured_name(length.args[0].value)
            anchor = ctx.prepared_after.get(loader or "")
            if id(length) in ctx.sized_lengths or anchor is None or not _above(ctx, length, anchor):
                continue
            ctx.sized_lengths.add(id(length))
            ctx.plan.review(
                ctx.line(length),
                f"{binding.name} is sized from {ctx.code(length)}, read before {loader} is "
                f"prepared (after line {ctx.line(anchor)}): prepared, each rank reads its "
                "shard's batches, rounded up, and the prepared scheduler steps num_processes "
                "times at each step(), so where the batches do not split evenly over the ranks "
                "it does not take the steps this length counts (most often a few more: the "
                "schedule reaches its end early, and a cosine or lambda schedule goes past it); "
                f"to size it in the steps it takes, prepare {loader} above this line "
                f"(`{loader} = {ctx.a('prepare')}({loader})`, the accelerator made before it) "
                "and count each rank's steps from its length, times "
                f"{ctx.a('num_processes')} (`{ctx.code(length)} * {ctx.a('num_processes')}` "
                "where it steps once per batch)",
            )


def _per_optimizer_step(ctx: Context, call: cst.Call) -> bool:
    """``scheduler.step()`` in a loop that accumulates gradients: a prepared scheduler inside
    ``accumulate()``, or under the loop's step test, counts optimizer steps, and the
    accumulation step's own review lines say how to size it."""
    placement = ctx.facts.placement
    return any(
        placement.inside(call, loop.node)
        and (
            ctx.facts.accumulation_in(loop) is not None
            or stepped_every(loop, ctx.facts) is not None
        )
        for loop in ctx.model.loops
    )


def _above(ctx: Context, node: cst.CSTNode, anchor: cst.CSTNode) -> bool:
    """``node`` runs in the scope of the statement the prepare call follows, at or above it."""
    scope = ctx.model.scope_of(anchor)
    return ctx.model.scope_of(node) is scope and ctx.line(node) <= ctx.line(anchor)


class _Reads:
    """What a scheduler's sizing reads of the measured loaders: the ``len()`` calls, the names
    bound on the way (``steps``), the loaders named, and whether any read is not a ``len()``."""

    def __init__(self, ctx: Context, measured: set[str]) -> None:
        self.ctx = ctx
        self.measured = measured
        self.lengths: list[cst.Call] = []
        self.bound: dict[str, cst.CSTNode] = {}
        self.loaders: set[str] = set()
        self.other = False
        self._seen: set[int] = set()

    def follow(self, expression: cst.CSTNode, at: cst.CSTNode, depth: int) -> None:
        if id(expression) in self._seen:
            return
        self._seen.add(id(expression))
        inside_len: set[int] = set()
        for node in walk(expression):
            if isinstance(node, cst.Call) and dotted(node.func) == "len" and len(node.args) == 1:
                loader = _measured_name(node.args[0].value)
                if loader in self.measured:
                    self.lengths.append(node)
                    self.loaders.add(loader)  # type: ignore[arg-type]
                    inside_len |= {id(n) for n in walk(node)}
                continue
            if id(node) in inside_len:
                continue
            name = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
            if name in self.measured and not self._attribute_of_a_length(node, inside_len):
                self.other = True  # ``loader.dataset``, handed on: not a length
                self.loaders.add(name)  # type: ignore[arg-type]
            if depth > 0 and isinstance(node, cst.Name):
                binding = last_binding(self.ctx.model, node.value, at)
                if isinstance(binding, cst.Assign) and node.value not in self.bound:
                    before = (len(self.lengths), self.other)
                    self.follow(binding.value, binding, depth - 1)
                    if (len(self.lengths), self.other) != before:
                        self.bound[node.value] = binding

    def _attribute_of_a_length(self, node: cst.CSTNode, inside_len: set[int]) -> bool:
        """``self.loader`` walked as part of ``len(self.loader)`` (its ``self`` too)."""
        return id(node) in inside_len


def _measured_name(argument: cst.BaseExpression) -> str | None:
    """``loader``, ``self.loader``, or ``loaders`` of ``loaders["train"]`` (a dict of them)."""
    if isinstance(argument, cst.Subscript):
        argument = argument.value
    return dotted(argument)


def _read_elsewhere(ctx: Context, name: str, binding: Binding, found: _Reads) -> bool:
    """``name`` (bound on the way to the scheduler's sizing) is read by a statement of its scope
    that is neither the scheduler's nor another binding of the chain: rewriting its ``len()``
    would change what that statement computes on N processes."""
    statement = found.bound[name]
    scope = ctx.facts.placement.enclosing_function(statement)
    chain = [binding.statement, *found.bound.values()]
    for node in walk(scope if scope is not None else ctx.model.module):
        if not (isinstance(node, cst.Name) and node.value == name):
            continue
        if any(_within(ctx, node, kept) for kept in chain):
            continue
        parent = ctx.model.parent(node)
        if isinstance(parent, cst.AssignTarget) or (
            isinstance(parent, cst.Attribute) and parent.attr is node
        ):
            continue  # a binding, or an attribute's name (``self.steps``)
        return True
    return False


def _within(ctx: Context, node: cst.CSTNode, statement: cst.CSTNode) -> bool:
    return node is statement or any(a is statement for a in ctx.model.ancestors(node))
