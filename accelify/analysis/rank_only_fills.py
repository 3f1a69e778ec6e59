"""Collections filled on some ranks only and then emptied out by a read every rank makes.

``vals = []`` on every rank, ``if accelerator.is_main_process: vals.append(loss.item())`` in
the loop, then ``sum(vals) / len(vals)`` outside the test: on the other ranks the list is still
empty and the division raises ``ZeroDivisionError`` (``statistics.mean`` a ``StatisticsError``,
``max`` a ``ValueError``, ``vals[-1]`` an ``IndexError``, ``torch.stack`` a ``RuntimeError``).
The main process goes on to its next collective and waits there for ranks that have died.
The same for a trainer's ``self.vals``: made empty in ``__init__``, filled under a rank test in
one method, averaged in another that every rank runs.

Only where every fill of the collection is under a rank test and every other binding makes it
empty (a name also bound from a gather, passed to a helper or tested for emptiness before the
read is left alone: its other ranks may hold values, or the read is guarded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.repeated_effects import run_by_every_rank
from accelify.analysis.syntax import assigned_targets, dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts

#: Methods that put values into a collection.
_FILLS = frozenset({"append", "extend", "insert", "add", "update"})
#: Calls that make an empty collection.
_EMPTY_MAKERS = frozenset({"list", "dict", "set", "collections.deque", "deque", "defaultdict"})
#: Functions that fail on an empty sequence, with the error they raise.
_FAILING_ON_EMPTY = {
    "statistics.mean": "StatisticsError",
    "statistics.fmean": "StatisticsError",
    "statistics.median": "StatisticsError",
    "statistics.mode": "StatisticsError",
    "torch.stack": "RuntimeError",
    "torch.cat": "RuntimeError",
    "numpy.concatenate": "ValueError",
    "numpy.stack": "ValueError",
    "numpy.vstack": "ValueError",
    "numpy.hstack": "ValueError",
}
#: Builtins that fail on an empty sequence when given no ``default=``.
_EMPTY_BUILTINS = {"max": "ValueError", "min": "ValueError"}
#: Calls that read a collection without filling it: handing it to them keeps it as it is.
_READERS = frozenset(
    {"len", "sum", "sorted", "list", "tuple", "print", "str", "repr", "enumerate", "zip", "iter"}
)


@dataclass(frozen=True)
class RankOnlyFill:
    """A read that fails on the ranks that never filled ``name``."""

    read: cst.CSTNode  # the failing expression: ``sum(vals) / len(vals)``, ``max(vals)``
    name: str  # ``vals``, ``self.vals``
    fill: cst.CSTNode  # the first fill, under ``guard``
    guard: cst.CSTNode  # the rank test (an ``if``, or the function a rank test leaves early)
    error: str  # what the other ranks raise
    #: the fill reads only values bound outside its rank test: moving it out of the test fills
    #: the collection on every rank (each with its own values; the main process's unchanged)
    movable: bool


def rank_only_fills(facts: Facts) -> list[RankOnlyFill]:
    model = facts.model
    fills: dict[tuple[int, str], list[cst.CSTNode]] = {}
    scopes: dict[int, cst.CSTNode] = {}
    for node in model.index.of_type((cst.Call, cst.AugAssign)):
        name = _filled(node)
        if name is None:
            continue
        scope = _scope(facts, node, name)
        if scope is None:
            continue
        scopes[id(scope)] = scope
        fills.setdefault((id(scope), name), []).append(node)
    found = []
    for (key, name), filled in fills.items():
        scope = scopes[key]
        guards = [model.rank_guard_of(fill) for fill in filled]
        if any(guard is None for guard in guards) or not _only_made_empty(facts, scope, name):
            continue
        first = min(filled, key=model.order)
        failing = _failing_read(facts, scope, name, first)
        if failing is None:
            continue
        read, error = failing
        guard = guards[filled.index(first)]
        assert guard is not None
        found.append(
            RankOnlyFill(read, name, first, guard, error, _movable(facts, first, guard, name))
        )
    return sorted(found, key=lambda f: model.order(f.read))


def _filled(node: cst.CSTNode) -> str | None:
    """The collection ``node`` puts values into: ``vals`` of ``vals.append(x)`` or ``vals +=
    [x]``, ``self.vals`` of ``self.vals.append(x)``."""
    if isinstance(node, cst.Call):
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _FILLS and node.args:
            return _collection(func.value)
        return None
    if (
        isinstance(node, cst.AugAssign)
        and isinstance(node.operator, cst.AddAssign)
        and (isinstance(node.value, (cst.List, cst.ListComp, cst.Tuple)) or _listed(node.value))
    ):
        return _collection(node.target)
    return None


def _listed(value: cst.BaseExpression) -> bool:
    """``x.tolist()``, ``list(x)``: a list added to a list."""
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value == "tolist":
        return True
    return dotted(func) == "list"


def _collection(node: cst.BaseExpression) -> str | None:
    name = dotted(node)
    if name is None:
        return None
    parts = name.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[0] == "self"):
        return name
    return None


def _scope(facts: Facts, node: cst.CSTNode, name: str) -> cst.CSTNode | None:
    """Where ``name`` lives: the function (or module) of a local, the class of ``self.x``."""
    function = facts.placement.enclosing_function(node)
    if name.startswith("self."):
        return facts.placement.class_of(node) if function is not None else None
    return function if function is not None else facts.model.module


def _uses(facts: Facts, scope: cst.CSTNode, name: str) -> list[cst.CSTNode]:
    """Every place in ``scope`` that spells ``name``: ``self.x`` in the class's methods; a
    plain name in the function's (or the module's) own code, not a nested function's, nor the
    member of another object (``stats.vals``)."""
    if "." in name:
        return [
            node for node in walk(scope) if isinstance(node, cst.Attribute) and dotted(node) == name
        ]
    own = scope if isinstance(scope, cst.FunctionDef) else None
    model = facts.model
    found = []
    for node in walk(scope):
        if not (isinstance(node, cst.Name) and node.value == name):
            continue
        parent = model.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is node:
            continue
        if facts.placement.enclosing_function(node) is own:
            found.append(node)
    return found


def _only_made_empty(facts: Facts, scope: cst.CSTNode, name: str) -> bool:
    """Every binding of ``name`` in ``scope`` makes it empty (``vals = []``, ``self.vals =
    list()``), at least one outside any rank test; and nothing else can fill it: it is handed
    to no call but readers (``len``, ``sum``...), and bound no other way (a loop, ``with``, a
    parameter, a gather's result)."""
    model = facts.model
    made = False
    for use in _uses(facts, scope, name):
        parent = model.parent(use)
        if isinstance(parent, cst.AssignTarget):
            assign = model.parent(parent)
            if not (isinstance(assign, cst.Assign) and _empty(assign.value)):
                return False
            made = made or not model.under_rank_guard(assign)
        elif isinstance(parent, cst.AnnAssign) and parent.target is use:
            if parent.value is None or not _empty(parent.value):
                return False
            made = made or not model.under_rank_guard(parent)
        elif isinstance(parent, (cst.Element, cst.StarredElement)):
            paired = _paired_value(model, parent)
            if paired is None or not _empty(paired):
                return False  # ``a, vals = f()``, ``[vals, other]`` handed on
            made = made or not model.under_rank_guard(paired)
        elif isinstance(parent, (cst.For, cst.CompFor, cst.AsName, cst.Param, cst.NamedExpr)):
            return False
        elif isinstance(parent, cst.Arg):
            call = model.parent(parent)
            if not (isinstance(call, cst.Call) and _reader(facts, call)):
                return False
        elif isinstance(parent, (cst.Global, cst.Nonlocal, cst.NameItem)):
            return False
        elif (
            isinstance(parent, cst.AugAssign)
            and parent.target is use
            and (_filled(parent) is None or not model.under_rank_guard(parent))
        ):
            return False  # ``vals += gathered`` on every rank
    return made


def _paired_value(model, element: cst.BaseElement) -> cst.BaseExpression | None:
    """The value a target element of ``a, b = x, y`` gets (``y`` for ``b``); None for any
    other element (of a list handed on, of a target assigned one value to unpack)."""
    target = model.parent(element)
    statement = model.parent(target)
    if not (isinstance(target, (cst.Tuple, cst.List)) and isinstance(statement, cst.AssignTarget)):
        return None
    assign = model.parent(statement)
    value = assign.value if isinstance(assign, cst.Assign) else None
    if not isinstance(value, (cst.Tuple, cst.List)) or len(value.elements) != len(target.elements):
        return None
    index = next(i for i, e in enumerate(target.elements) if e is element)
    paired = value.elements[index]
    return paired.value if isinstance(paired, cst.Element) else None


def _empty(value: cst.BaseExpression) -> bool:
    if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
        return not value.elements
    if isinstance(value, cst.Dict):
        return not value.elements
    return (
        isinstance(value, cst.Call)
        and dotted(value.func) in _EMPTY_MAKERS
        and all(a.keyword is None for a in value.args)
        and len(value.args) <= 1
        and (
            not value.args
            or dotted(value.func) == "defaultdict"
            or (
                isinstance(value.args[0].value, (cst.List, cst.Tuple))
                and not value.args[0].value.elements
            )
        )
    )


def _reader(facts: Facts, call: cst.Call) -> bool:
    """A call that reads a collection and leaves it as it is."""
    names = facts.model.call_names(call) | {dotted(call.func) or ""}
    return bool(
        names & _READERS
        or names & set(_FAILING_ON_EMPTY)
        or names & set(_EMPTY_BUILTINS)
        or any(n.startswith(("numpy.", "torch.", "statistics.", "math.")) for n in names)
    )


def _failing_read(
    facts: Facts, scope: cst.CSTNode, name: str, first: cst.CSTNode
) -> tuple[cst.CSTNode, str] | None:
    """The first read of ``name`` after ``first`` (a fill) that every rank making it runs and
    that fails on an empty collection, with the error; None where a test of the collection (``if
    vals:``, ``len(vals) > 0``), a ``try`` or a rank test comes before it."""
    model = facts.model
    after = model.order(first)
    tested = [
        use
        for use in _uses(facts, scope, name)
        if any(_tests(model, use, a) for a in model.ancestors(use))
    ]
    for use in sorted(_uses(facts, scope, name), key=model.order):
        if model.order(use) <= after:
            continue
        if any(model.order(t) < model.order(use) for t in tested):
            return None
        failing = _fails_on_empty(facts, use)
        if failing is None:
            continue
        if model.under_rank_guard(use) or not _run_by_every_rank(facts, use):
            continue
        if _tested_around(model, use, tested):
            return None  # ``sum(vals) / len(vals) if vals else 0.0``
        if any(isinstance(a, cst.Try) for a in model.ancestors(use)):
            continue
        return failing
    return None


def _tested_around(model, use: cst.CSTNode, tested: list[cst.CSTNode]) -> bool:
    """A conditional expression (or ``and``/``or``) around ``use`` tests the collection."""
    for ancestor in model.ancestors(use):
        if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return False
        if isinstance(ancestor, (cst.IfExp, cst.BooleanOperation)) and any(
            model.inside(t, ancestor) for t in tested
        ):
            return True
    return False


def _tests(model, use: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
    """``ancestor`` tests ``use`` (or its size) before anything reads it: the test of an
    ``if``/``while``/conditional expression, an ``assert``, an operand of ``and``/``or``."""
    if isinstance(ancestor, (cst.If, cst.While, cst.IfExp)):
        return model.inside(use, ancestor.test)
    if isinstance(ancestor, cst.Assert):
        return True
    return isinstance(ancestor, cst.BooleanOperation) and model.inside(use, ancestor.left)


def _fails_on_empty(facts: Facts, use: cst.CSTNode) -> tuple[cst.CSTNode, str] | None:
    """The expression around ``use`` that fails when the collection is empty: a division by
    ``len(vals)``, ``statistics.mean(vals)``, ``max(vals)``, ``vals[0]``, ``torch.stack(vals)``."""
    model = facts.model
    parent = model.parent(use)
    if isinstance(parent, cst.Subscript) and parent.value is use:
        index = parent.slice[0].slice if len(parent.slice) == 1 else None
        if isinstance(index, cst.Index) and _constant_index(index.value):
            return parent, "IndexError"
        return None
    if not isinstance(parent, cst.Arg) or parent.keyword is not None:
        return None
    call = model.parent(parent)
    if not isinstance(call, cst.Call) or call.args[0] is not parent:
        return None
    func = dotted(call.func)
    if func == "len" and len(call.args) == 1:
        divided = model.parent(call)
        if (
            isinstance(divided, cst.BinaryOperation)
            and divided.right is call
            and isinstance(divided.operator, (cst.Divide, cst.FloorDivide, cst.Modulo))
        ):
            return divided, "ZeroDivisionError"
        if (
            isinstance(divided, cst.AugAssign)
            and divided.value is call
            and isinstance(divided.operator, (cst.DivideAssign, cst.FloorDivideAssign))
        ):
            return divided, "ZeroDivisionError"
        return None
    if func in _EMPTY_BUILTINS and len(call.args) == 1:
        return call, _EMPTY_BUILTINS[func]
    for name in model.call_names(call):
        if name in _FAILING_ON_EMPTY:
            return call, _FAILING_ON_EMPTY[name]
    return None


def _constant_index(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        value = value.expression
    return isinstance(value, cst.Integer)


def _run_by_every_rank(facts: Facts, use: cst.CSTNode) -> bool:
    """The function around ``use`` is run by every rank (`repeated_effects.run_by_every_rank`):
    some call of it, followed up through its callers, is outside a rank test. A method nothing
    in the file calls counts only where the project's other modules call it outside a rank test
    or it synchronises the ranks: one called from a main-process branch elsewhere (``if
    accelerator.is_main_process: print(trainer.summary())``) fails nowhere."""
    function = facts.placement.enclosing_function(use)
    if function is None:
        return True
    return run_by_every_rank(
        facts.model,
        facts.placement,
        facts.ranks.backend_guards,
        facts.synchronising_call,
        function,
    )


def _movable(facts: Facts, fill: cst.CSTNode, guard: cst.CSTNode, name: str) -> bool:
    """The values ``fill`` adds read only names bound outside ``guard``: every rank has them,
    so the fill can leave the rank test."""
    if not isinstance(guard, cst.If):
        return False
    added = (
        [a.value for a in fill.args] if isinstance(fill, cst.Call) else [fill.value]  # type: ignore[attr-defined]
    )
    bound_inside = {
        target
        for node in walk(guard.body)
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign))
        for target in _bound_names(node)
    }
    read = {n.value for value in added for n in walk(value) if isinstance(n, cst.Name)}
    return not (read & bound_inside) and name not in bound_inside


def _bound_names(node: cst.Assign | cst.AnnAssign | cst.AugAssign) -> set[str]:
    targets = list(assigned_targets(node)) if isinstance(node, cst.Assign) else [node.target]
    return {n.value for t in targets for n in walk(t) if isinstance(n, cst.Name)}
