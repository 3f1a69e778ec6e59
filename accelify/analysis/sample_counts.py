"""Counts of the samples a training loop reads (``seen += len(x)``, ``n += x.size(0)``,
``self.num_samples += bs``, ``stats["n"] += batch_size``) and what the script shows over them
once the loop is done: the count itself, printed, or a total the loop sums divided by it
(``total / n``: a loss weighted by each batch's size, ``correct / n``).

Over a prepared loader each rank reads its own shard, so the count is this rank's share (about
1/N of the set) and the quotient a mean over this rank's samples only; the main process shows
its own. Both are read where the loop's function reads them, in a caller the function returns
them to (``loss, n = train_epoch(...)``), or, kept on the instance, in another method of the
class. A count the script already combines across ranks (``accelerator.reduce``,
``dist.all_reduce``) is left out. Evaluation loops are `accelify.analysis.evaluation`'s: their
values are gathered per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import libcst as cst

from accelify.analysis import names
from accelify.analysis.call_graph import CallGraph
from accelify.analysis.collectives import agrees_across_ranks
from accelify.analysis.objects import bound_arguments, callee
from accelify.analysis.placement import Placement
from accelify.analysis.script_model import Loop, ScriptModel
from accelify.analysis.syntax import dotted, target_names, walk

#: Names that hold how many samples a batch has (``num_samples += batch_size``,
#: ``n += args.batch_size``), by their last part.
_BATCH_SIZE_NAMES = frozenset({"batch_size", "bs", "bsz", "batch_len", "n_batch", "nbatch"})

#: How many helpers deep a count handed on is followed (``report()`` calling ``show()``).
_HELPER_DEPTH = 3

#: Methods that show what they are handed: loggers, progress bars, writers.
_SHOWING_METHODS = frozenset(
    {"info", "warning", "debug", "log", "set_postfix", "set_description", "add_scalar"}
)


@dataclass
class SampleCount:
    """One place that shows a count of this rank's samples, or a total over it."""

    loop: Loop
    #: the count as the loop spells it: ``seen``, ``self.num_samples``, ``stats["n"]``
    counter: str
    #: ``counter += ...`` in the loop
    bump: cst.AugAssign
    #: the division (``total / n``, ``total /= n``), or the count shown on its own
    read: cst.CSTNode
    #: the total divided by the count, as spelled where it is read; None for the count alone
    total: str | None
    #: the count as spelled where it is read (a caller's name for a returned one)
    shown: str
    #: how the read got the values when not in the loop's own function:
    #: ``returned by train_epoch()``, ``kept on the instance``
    through: str | None = None


def samples_counted(
    model: ScriptModel,
    placement: Placement,
    graph: CallGraph,
    reads_loader: Callable[[Loop], bool],
) -> list[SampleCount]:
    """Every place that shows a sample count of a training loop over a loader, or a total
    divided by one, in the loop's own function after the loop, in the callers it returns them
    to, or in the methods of its class for a count kept on the instance."""
    found: list[SampleCount] = []
    for loop in model.loops:
        if not loop.trains or loop.iterable is None or not reads_loader(loop):
            continue
        counters = _counters_in(model, loop)
        if not counters:
            continue
        totals = _totals_in(model, loop) - set(counters)
        reader = _Reads(model, placement, loop, counters)
        found += reader.after_loop(totals)
        found += reader.on_the_instance(totals)
        found += reader.in_callers(graph, totals)
    return _combined_away(model, found)


def spelled(model: ScriptModel, node: cst.CSTNode) -> str | None:
    """``n``, ``self.n``, ``stats['n']``: a name, an attribute path, or a subscript of one by
    a constant (its key as Python shows it, whichever quotes the file uses); None for
    anything else."""
    if isinstance(node, cst.Name | cst.Attribute):
        return dotted(node)
    if (
        isinstance(node, cst.Subscript)
        and dotted(node.value) is not None
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
    ):
        key = node.slice[0].slice.value
        if isinstance(key, cst.SimpleString) and isinstance(key.evaluated_value, str):
            return f"{dotted(node.value)}[{key.evaluated_value!r}]"
        if isinstance(key, cst.Integer):
            return f"{dotted(node.value)}[{key.value}]"
    return None


def _counters_in(model: ScriptModel, loop: Loop) -> dict[str, cst.AugAssign]:
    """``counter += <the batch's size>`` in the loop's body: the counts of its samples."""
    local = _bound_in(loop)
    sizes = _size_names(loop, local)
    found: dict[str, cst.AugAssign] = {}
    for node in walk(loop.node.body):
        if not (isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.AddAssign)):
            continue
        counter = spelled(model, node.target)
        if counter is not None and counter not in found and _a_batch_size(node.value, local, sizes):
            found[counter] = node
    return found


def _totals_in(model: ScriptModel, loop: Loop) -> set[str]:
    """What the loop's body sums with ``+=``, as spelled."""
    return {
        name
        for node in walk(loop.node.body)
        if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.AddAssign)
        for name in [spelled(model, node.target)]
        if name is not None
    }


def _bound_in(loop: Loop) -> set[str]:
    """Names the loop binds per batch: its target's, and those assigned in its body."""
    bound = set(target_names(loop.node.target))
    for node in walk(loop.node.body):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                bound |= set(target_names(target.target))
        elif isinstance(node, cst.For):
            bound |= set(target_names(node.target))
    return bound


def _size_names(loop: Loop, local: set[str]) -> set[str]:
    """``bs = x.size(0)`` in the loop's body: names that hold the batch's size."""
    found: set[str] = set()
    for node in walk(loop.node.body):
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0].target, cst.Name)
            and _a_batch_size(node.value, local, found)
        ):
            found.add(node.targets[0].target.value)
    return found


def _a_batch_size(value: cst.BaseExpression, local: set[str], sizes: set[str]) -> bool:
    """``len(x)``, ``x.size(0)``, ``x.shape[0]``, ``y.numel()`` of a value the loop binds per
    batch, a name assigned one, or a batch size by name (``batch_size``, ``args.bs``)."""
    name = dotted(value)
    if name is not None:
        return name in sizes or name.rsplit(".", 1)[-1] in _BATCH_SIZE_NAMES
    if isinstance(value, cst.Call):
        func = value.func
        if dotted(func) == "len" and len(value.args) == 1:
            return _root(value.args[0].value) in local
        if isinstance(func, cst.Attribute) and _root(func.value) in local:
            if func.attr.value == "numel" and not value.args:
                return True
            return func.attr.value == "size" and _first_dimension(value.args)
        return False
    if isinstance(value, cst.Subscript):  # ``x.shape[0]``
        shaped = first_dimension_of(value)
        return shaped is not None and _root(shaped) in local
    return False


def first_dimension_of(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """What ``value`` takes the first dimension of: ``x`` of ``len(x)``, ``x.size(0)``,
    ``x.shape[0]``; None for anything else (``x.numel()`` counts every element)."""
    if isinstance(value, cst.Call):
        func = value.func
        if dotted(func) == "len" and len(value.args) == 1:
            return value.args[0].value
        if isinstance(func, cst.Attribute) and func.attr.value == "size":
            return func.value if _first_dimension(value.args) else None
        return None
    if (
        isinstance(value, cst.Subscript)
        and isinstance(value.value, cst.Attribute)
        and value.value.attr.value == "shape"
        and len(value.slice) == 1
        and isinstance(value.slice[0].slice, cst.Index)
        and isinstance(value.slice[0].slice.value, cst.Integer)
        and value.slice[0].slice.value.value == "0"
    ):
        return value.value.value
    return None


def _first_dimension(args: tuple[cst.Arg, ...] | list[cst.Arg] | object) -> bool:
    arguments = list(args)  # type: ignore[call-overload]
    return (
        len(arguments) == 1
        and isinstance(arguments[0].value, cst.Integer)
        and arguments[0].value.value == "0"
    )


def _root(node: cst.BaseExpression) -> str | None:
    """The name an expression starts from: ``batch`` of ``batch["x"].to(device)``."""
    while True:
        if isinstance(node, cst.Name):
            return node.value
        if isinstance(node, cst.Attribute | cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Call):
            node = node.func
        else:
            return None


class _Reads:
    """Where the counts of one loop are read."""

    def __init__(
        self,
        model: ScriptModel,
        placement: Placement,
        loop: Loop,
        counters: dict[str, cst.AugAssign],
    ) -> None:
        self.model = model
        self.placement = placement
        self.loop = loop
        self.counters = counters

    def after_loop(self, totals: set[str]) -> list[SampleCount]:
        """In the loop's scope, after it."""
        nodes = [
            node
            for node in walk(self.loop.scope)
            if self.model.order(node) > self.model.order(self.loop.node)
            and not self.placement.inside(node, self.loop.node)
            and self.model.scope_of(node) is self.loop.scope
        ]
        return list(self._shown(nodes, {c: c for c in self.counters}, totals, None))

    def on_the_instance(self, totals: set[str]) -> list[SampleCount]:
        """``self.num_samples`` read in another method of the loop's class (not its
        constructor, which runs before any training)."""
        kept = {c: c for c in self.counters if c.startswith("self.")}
        owner = self.placement.class_of(self.loop.node)
        if not kept or owner is None or not isinstance(self.loop.scope, cst.FunctionDef):
            return []
        nodes = [
            node
            for method in self.model.index.methods_of(owner.name.value).values()
            if method is not self.loop.scope and method.name.value != "__init__"
            for node in walk(method)
        ]
        kept_totals = {t for t in totals if t.startswith("self.")}
        return list(self._shown(nodes, kept, kept_totals, "kept on the instance"))

    def in_callers(self, graph: CallGraph, totals: set[str]) -> list[SampleCount]:
        """``loss, n = train_epoch(...)`` where ``train_epoch`` returns ``total, n``: read in
        the caller's scope after the call, by the caller's names."""
        function = self.loop.scope
        if not isinstance(function, cst.FunctionDef):
            return []
        returned = self._returned(function)
        if returned is None:
            return []
        found: list[SampleCount] = []
        for call, _ in graph.calls_of(function):
            bound = bound_to(self.model, call, len(returned))
            if bound is None:
                continue
            counters = {bound[i]: kept for i, kept in enumerate(returned) if kept in self.counters}
            caller_totals = {bound[i] for i, kept in enumerate(returned) if kept in totals}
            if not counters:
                continue
            scope = self.model.scope_of(call)
            nodes = [
                node
                for node in walk(scope)
                if self.model.order(node) > self.model.order(call)
                and self.model.scope_of(node) is scope
            ]
            through = f"returned by {function.name.value}()"
            found += self._shown(nodes, counters, caller_totals, through)
        return found

    def _returned(self, function: cst.FunctionDef) -> list[str | None] | None:
        """What every return of ``function`` hands back, element by element, as spelled (the
        same at each return), when it hands back a count of the loop."""
        shapes = set()
        for statement in self.model.index.own_returns(function):
            value = statement.value
            if value is None:
                return None
            elements = (
                [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
            )
            shapes.add(tuple(spelled(self.model, e) for e in elements))
        if len(shapes) != 1:
            return None
        (shape,) = shapes
        return list(shape) if set(shape) & set(self.counters) else None

    def _shown(
        self,
        nodes: list[cst.CSTNode],
        counters: dict[str, str],
        totals: set[str],
        through: str | None,
        depth: int = 0,
    ) -> Iterator[SampleCount]:
        """Among ``nodes``: divisions of a total by a count (``counters`` maps the count as
        spelled there to the loop's), and counts shown on their own; also inside a function of
        the file they are handed to (`_in_helpers`)."""
        yield from self._in_helpers(nodes, counters, totals, depth)
        divisors: set[int] = set()
        for node in nodes:
            ratio = _ratio(self.model, node)
            if ratio is None:
                continue
            divided, divisor = ratio
            counter = spelled(self.model, divisor)
            if counter not in counters:
                continue
            divisors.add(id(divisor))
            total = next((t for t in _spellings(self.model, divided) if t in totals), None)
            if total is None:
                continue
            yield SampleCount(
                self.loop,
                counters[counter],
                self.counters[counters[counter]],
                node,
                total,
                counter,
                through,
            )
        for node in nodes:
            if id(node) in divisors:
                continue
            counter = spelled(self.model, node) if isinstance(node, cst.BaseExpression) else None
            if counter not in counters or not _part_of_a_show(self.model, node):
                continue
            yield SampleCount(
                self.loop,
                counters[counter],
                self.counters[counters[counter]],
                node,
                None,
                counter,
                through,
            )

    def _in_helpers(
        self,
        nodes: list[cst.CSTNode],
        counters: dict[str, str],
        totals: set[str],
        depth: int,
    ) -> Iterator[SampleCount]:
        """``report(epoch, total_loss, seen)``: a function of the file handed a count (and the
        totals) that divides or shows them itself; read there by its parameters' names, so
        rank 0's share printed inside a helper is found as it is in the loop's own function."""
        if depth >= _HELPER_DEPTH:
            return
        for call in nodes:
            if not isinstance(call, cst.Call):
                continue
            target = callee(self.model, call)
            if target is None:
                continue
            function, implicit = target
            handed = [
                (parameter, spelled(self.model, argument.value))
                for parameter, argument in bound_arguments(function, call, implicit)
            ]
            inner = {p: counters[h] for p, h in handed if h in counters}
            if not inner:
                continue
            inner_totals = {p for p, h in handed if h in totals}
            body = [n for n in walk(function) if self.model.scope_of(n) is function]
            through = f"handed to {function.name.value}()"
            yield from self._shown(body, inner, inner_totals, through, depth + 1)


def _ratio(
    model: ScriptModel, node: cst.CSTNode
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
        return node.left, node.right
    if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign):
        return node.target, node.value
    return None


def _spellings(model: ScriptModel, node: cst.CSTNode) -> Iterator[str]:
    for inner in walk(node):
        name = spelled(model, inner)
        if name is not None:
            yield name


def bound_to(model: ScriptModel, call: cst.Call, width: int) -> list[str | None] | None:
    """The names ``call``'s value is bound to, element by element: ``loss, n = f(...)`` ->
    ``["loss", "n"]``; ``n = f(...)`` for one value."""
    parent = model.parent(call)
    if not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
        return None
    target = parent.targets[0].target
    if width == 1:
        return [spelled(model, target)]
    if not isinstance(target, cst.Tuple | cst.List) or len(target.elements) != width:
        return None
    return [spelled(model, e.value) for e in target.elements]


def _part_of_a_show(model: ScriptModel, node: cst.CSTNode) -> bool:
    """``node`` is an argument (or inside one) of a print, a logger's or a progress bar's."""
    for ancestor in model.ancestors(node):
        if isinstance(ancestor, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            return False
        if isinstance(ancestor, cst.Call) and node is not ancestor.func and shows(model, ancestor):
            return True
    return False


def shows(model: ScriptModel, call: cst.Call) -> bool:
    """``call`` shows what it is handed: a print, a logger's, a writer's or a progress bar's."""
    func = call.func
    return bool(model.call_names(call) & names.PRINT) or (
        isinstance(func, cst.Attribute) and func.attr.value in _SHOWING_METHODS
    )


def _combined_away(model: ScriptModel, found: list[SampleCount]) -> list[SampleCount]:
    """Drop the counts the script combines across ranks itself: a collective anywhere in the
    file that reads the count (``dist.all_reduce(torch.tensor(seen))``), or the total."""
    combined: set[str] = set()
    for call in model.calls:
        if not agrees_across_ranks(model, call):
            continue
        for node in walk(call):
            name = spelled(model, node)
            if name is not None:
                combined.add(name)
    return [
        entry
        for entry in found
        if entry.counter not in combined
        and entry.shown not in combined
        and (entry.total is None or entry.total not in combined)
    ]
