"""Dict entries written on some ranks only and read by every rank to drive what every rank does.

``best = {"epoch": 0}`` on every rank, ``best["epoch"] = epoch`` under ``if
accelerator.is_main_process:`` (or inside a helper the guarded block hands ``best`` to:
equitrain's ``update_best_results(args, best_metrics, ...)``), then
``scheduler.step(best["epoch"])`` on every rank: the other ranks still hold the value the
entry started with, so they step the prepared scheduler (or optimizer, model) with another
number than the main process, and the ranks' learning rates and then their weights drift
apart, silently. No name is unbound (ACC209's NameError): the divergence is the bug.

Only where the dict is bound once, to a dict display, outside any rank test, and every other
use of the name in its function is a subscript with a constant key or a handing of it to a
helper of the file that only reads and writes its entries; the entry is never written
outside a rank test; and the read is an argument of a method call on a prepared object (or
a scheduler, optimizer, model), outside any rank test, after the write or in the loop that
holds it (the next pass reads it). A dict broadcast, gathered or handed elsewhere is left
alone."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts
    from accelify.analysis.script_model import ScriptModel

#: Helpers handed the dict are followed one level deep for the entry's write.
_HELPER_DEPTH = 1


@dataclass(frozen=True)
class RankOnlyEntry:
    """A read of ``name[key]`` that every rank makes, of an entry only some ranks write."""

    read: cst.Subscript  # ``best["epoch"]`` in ``scheduler.step(best["epoch"])``
    name: str  # ``best``
    key: str  # ``"epoch"`` as written
    write: cst.CSTNode  # the guarded write (or the helper's call that writes it)
    written: cst.CSTNode  # the assignment itself (in the helper where one writes it)
    guard: cst.CSTNode  # the rank test around ``write``
    call: cst.Call  # the call every rank makes with the entry


def rank_only_entries(facts: Facts) -> list[RankOnlyEntry]:
    script = facts.model
    driven = script.names_of(Kind.SCHEDULER, Kind.OPTIMIZER, Kind.MODEL) | set(
        script.prepared_names
    )
    found: list[RankOnlyEntry] = []
    dicts = [
        assign
        for assign in script.index.of_type(cst.Assign)
        if len(assign.targets) == 1
        and isinstance(assign.value, cst.Dict)
        and isinstance(assign.targets[0].target, cst.Name)
    ]
    if not dicts:
        return found
    guarded = _guarded_uses(script, {a.targets[0].target.value for a in dicts})  # type: ignore[attr-defined]
    for assign in dicts:
        target = assign.targets[0].target
        assert isinstance(target, cst.Name)
        if target.value not in guarded or script.under_rank_guard(assign):
            continue
        scope = script.index.enclosing_function(assign) or script.module
        found += _entries(script, scope, assign, target.value, driven)
    return found


def _guarded_uses(script: ScriptModel, names: set[str]) -> set[str]:
    """Those of ``names`` some rank test writes an entry of (``best["epoch"] = ...``) or hands
    to a call: the only dicts worth a walk of their function."""
    found: set[str] = set()
    for assign in script.index.of_type(cst.Assign):
        for target in assign.targets:
            owner = target.target
            if (
                isinstance(owner, cst.Subscript)
                and isinstance(owner.value, cst.Name)
                and owner.value.value in names
                and owner.value.value not in found
                and script.under_rank_guard(assign)
            ):
                found.add(owner.value.value)
    for call in script.index.of_type(cst.Call):
        handed = {
            a.value.value
            for a in call.args
            if isinstance(a.value, cst.Name) and a.value.value in names
        }
        if handed - found and script.under_rank_guard(call):
            found |= handed
    return found


def _entries(
    script: ScriptModel, scope: cst.CSTNode, binding: cst.Assign, name: str, driven: set[str]
) -> list[RankOnlyEntry]:
    writes: dict[str, list[tuple[cst.CSTNode, cst.CSTNode, cst.CSTNode]]] = {}
    unguarded: set[str] = set()
    reads: list[tuple[str, cst.Subscript]] = []
    handed: set[int] = set()
    for node in walk(scope):
        if isinstance(node, cst.FunctionDef | cst.Lambda | cst.ClassDef) and node is not scope:
            if any(isinstance(n, cst.Name) and n.value == name for n in walk(node)):
                return []  # a closure or method that may rebind or write it: left alone
            continue
        if isinstance(node, cst.Assign | cst.AugAssign | cst.AnnAssign):
            targets = (
                [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            )
            for target in targets:
                if node is binding:
                    continue
                if any(isinstance(n, cst.Name) and n.value == name for n in _bound(target)):
                    return []  # rebound: a broadcast, a reload, anything
                key = _entry(target, name)
                if key is None:
                    continue
                guard = script.rank_guard_of(node)
                if guard is None or isinstance(node, cst.AugAssign):
                    unguarded.add(key)
                else:
                    writes.setdefault(key, []).append((node, node, guard))
        if isinstance(node, cst.Call) and any(_is(a.value, name) for a in node.args):
            written = _helper_writes(script, node, name, _HELPER_DEPTH)
            if written is None:
                return []  # handed to something that may do anything with it
            guard = script.rank_guard_of(node)
            handed.update(id(a.value) for a in node.args if _is(a.value, name))
            for key, assignment in written.items():
                if guard is None:
                    unguarded.add(key)
                else:
                    writes.setdefault(key, []).append((node, assignment, guard))
        if isinstance(node, cst.Subscript) and _is(node.value, name):
            handed.add(id(node.value))  # the entry's own dict name, read or written
            key = _entry(node, name)
            if key is None:
                return []  # a computed key: which entry it is, no one knows here
            reads.append((key, node))
    if not _only_entries(scope, binding, name, handed):
        return []
    found = []
    for key, read in reads:
        if key in unguarded or key not in writes or script.under_rank_guard(read):
            continue
        call = _driving_call(script, read, driven)
        if call is None:
            continue
        for write, written, guard in writes[key]:
            if reads_after(script, read, write):
                found.append(RankOnlyEntry(read, name, key, write, written, guard, call))
                break
    return found


def _only_entries(scope: cst.CSTNode, binding: cst.Assign, name: str, allowed: set[int]) -> bool:
    """Every use of ``name`` in ``scope`` is its binding, an entry's dict (``allowed``: the
    subscripts' own names), or a handing to a helper (also ``allowed``)."""
    return all(
        id(node) in allowed or node is binding.targets[0].target
        for node in walk(scope)
        if isinstance(node, cst.Name) and node.value == name
    )


def _bound(target: cst.BaseExpression) -> list[cst.CSTNode]:
    if isinstance(target, cst.Tuple | cst.List):
        return [n for e in target.elements for n in _bound(e.value)]
    return [target]


def _is(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _entry(node: cst.CSTNode, name: str) -> str | None:
    """``"epoch"`` of ``name["epoch"]`` (a constant key), else None."""
    if not isinstance(node, cst.Subscript) or not _is(node.value, name):
        return None
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    key = node.slice[0].slice.value
    if isinstance(key, cst.SimpleString | cst.Integer):
        return repr(ast.literal_eval(key.value))  # ``'epoch'`` and ``"epoch"`` alike
    return None


def _helper_writes(
    script: ScriptModel, call: cst.Call, name: str, depth: int
) -> dict[str, cst.CSTNode] | None:
    """The entries a function of the file handed ``name`` writes into it (by constant key), or
    None when the call runs something unknown, or does anything else with it than read and
    write entries by constant keys (nor hands it further on)."""
    callee = script.call_graph.callee(call) if depth else None
    if callee is None:
        return None
    function, implicit = callee
    written: dict[str, cst.CSTNode] = {}
    for parameter, argument in bound_arguments(function, call, implicit):
        if not _is(argument.value, name):
            continue
        entries = {
            id(node.value)
            for node in walk(function.body)
            if isinstance(node, cst.Subscript) and _entry(node, parameter) is not None
        }
        for node in walk(function.body):
            if isinstance(node, cst.Name) and node.value == parameter and id(node) not in entries:
                return None  # handed on, rebound, iterated: not only entries
        for node in walk(function.body):
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    key = _entry(target.target, parameter)
                    if key is not None:
                        written.setdefault(key, node)
            elif isinstance(node, cst.AugAssign | cst.AnnAssign):
                key = _entry(node.target, parameter)
                if key is not None:
                    written.setdefault(key, node)
    return written


def _driving_call(script: ScriptModel, read: cst.Subscript, driven: set[str]) -> cst.Call | None:
    """The call ``read`` is an argument of, when it is a method of a prepared object, a
    scheduler, an optimizer or a model: ``lr_scheduler.step(best["epoch"], epoch)``."""
    child: cst.CSTNode = read
    for ancestor in script.ancestors(read):
        if isinstance(ancestor, cst.Call):
            if child is ancestor.func:
                return None
            func = ancestor.func
            if isinstance(func, cst.Attribute) and dotted(func.value) in driven:
                return ancestor
            return None
        if isinstance(ancestor, cst.BaseStatement):
            return None
        child = ancestor
    return None


def reads_after(script: ScriptModel, read: cst.CSTNode, write: cst.CSTNode) -> bool:
    """The read runs after the write: below it, or anywhere in a loop that holds both (the next
    pass reads what this one wrote)."""
    if script.order(read) > script.order(write):
        return True
    for ancestor in script.ancestors(write):
        if isinstance(ancestor, cst.FunctionDef):
            return False
        if isinstance(ancestor, cst.For | cst.While) and script.inside(read, ancestor):
            return True
    return False
