"""Local names bound only on some ranks and read on all of them.

``if accelerator.is_main_process: result = {...}`` followed, outside the test, by
``accelerator.log(result)``: every other rank reaches the read with ``result`` never bound and
stops with a ``NameError``. Only plain locals bound nowhere else in the function (or module)
count: a name also bound before the test, in its ``else``, by a loop or an import is bound on
every rank; a read inside another rank test (``if accelerator.is_main_process and best:``) is
made by the ranks that bound it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.syntax import all_params

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


@dataclass(frozen=True)
class RankOnlyRead:
    read: cst.Name
    bound: cst.CSTNode  # the binding statement's target, under the rank test
    guard: cst.If


def rank_only_reads(facts: Facts) -> list[RankOnlyRead]:
    model = facts.model
    tests: dict[int, bool] = {}

    def guard_of(node: cst.CSTNode, scope: cst.CSTNode) -> cst.If | None:
        for ancestor in model.ancestors(node):
            if ancestor is scope or isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.If):
                if id(ancestor) not in tests:
                    tests[id(ancestor)] = facts.ranks.is_rank_test(ancestor.test)
                if tests[id(ancestor)]:
                    return ancestor
        return None

    # only the scopes that assign a plain name under a rank test are read in full
    candidates: dict[int, tuple[cst.CSTNode, set[str]]] = {}
    for assign in model.assignments:
        names = {n.value for t in assign.targets for n in _stored_names(t.target)}
        if not names:
            continue
        scope = facts.placement.enclosing_function(assign) or model.module
        if guard_of(assign, scope) is not None:
            candidates.setdefault(id(scope), (scope, set()))[1].update(names)
    found = []
    for scope, names in candidates.values():
        bindings, reads = _names_in(scope)
        for name in sorted(names & set(bindings)):
            every = [(target, guard_of(target, scope)) for target in bindings[name]]
            guarded = [(t, g) for t, g in every if g is not None]
            unguarded = [t for t, g in every if g is None]
            if not guarded or any(_in_orelse(model, t, g) for t, g in guarded):
                continue
            if _complementary_guards(model, [g for _, g in guarded]):
                continue
            first = min(model.order(t) for t, _ in guarded)
            for read in reads.get(name, []):
                if (
                    model.order(read) > first
                    and not _bound_before(model, read, unguarded)
                    and not facts.ranks.under_rank_guard(read)
                    and not _tested_inline(facts, read)
                ):
                    found.append(RankOnlyRead(read, guarded[0][0], guarded[0][1]))
                    break
    return found


def _bound_before(model, read: cst.Name, unguarded: list[cst.Name]) -> bool:
    """An assignment every rank runs binds the name before ``read``. Not one whose own value
    makes the read (``model, eval_set = accelerator.prepare(model, eval_set)`` after ``if
    is_main: eval_set = ...``: the other ranks fail on the right-hand side); one that shares a
    loop with the read may have bound it on an earlier pass."""
    read_at = model.order(read)
    read_loops = {id(a) for a in model.ancestors(read) if isinstance(a, (cst.For, cst.While))}
    for target in unguarded:
        statement = next(
            (a for a in model.ancestors(target) if isinstance(a, (cst.Assign, cst.AnnAssign))),
            None,
        )
        if any(
            isinstance(a, (cst.For, cst.While)) and id(a) in read_loops
            for a in model.ancestors(target)
        ):
            return True
        if model.order(target) < read_at and not (
            statement is not None and any(a is statement for a in model.ancestors(read))
        ):
            return True
    return False


def _complementary_guards(model, guards: list[cst.If]) -> bool:
    """``if is_main: x = f()`` ... ``if not is_main: x = f()``: between them the two tests let
    every rank through, so every rank binds the name (the main process first, the others after
    a barrier, as a download-once idiom does)."""
    tests = {model.module.code_for_node(g.test) for g in guards}
    return any(_negation(model, g.test) in tests for g in guards)


def _negation(model, test: cst.BaseExpression) -> str | None:
    """The code of ``test``'s plain negation: ``x`` for ``not x``, ``a != b`` for ``a == b``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return model.module.code_for_node(test.expression)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        comparison = test.comparisons[0]
        opposite = {cst.Equal: " != ", cst.NotEqual: " == "}.get(type(comparison.operator))
        if opposite is not None:
            code = model.module.code_for_node
            return code(test.left) + opposite + code(comparison.comparator)
    return None


def _tested_inline(facts: Facts, read: cst.Name) -> bool:
    """``result if accelerator.is_main_process else None``, ``is_main and result``: the read
    happens on the ranks the test lets through."""
    for ancestor in facts.model.ancestors(read):
        if isinstance(ancestor, cst.BaseSmallStatement | cst.BaseCompoundStatement):
            return False
        if isinstance(ancestor, cst.IfExp) and facts.ranks.is_rank_test(ancestor.test):
            return True
        if isinstance(ancestor, cst.BooleanOperation) and facts.ranks.is_rank_test(ancestor.left):
            return True
    return False


def _in_orelse(model, node: cst.CSTNode, guard: cst.If | None) -> bool:
    return (
        guard is not None
        and guard.orelse is not None
        and any(a is guard.orelse for a in model.ancestors(node))
    )


def _names_in(scope: cst.CSTNode) -> tuple[dict[str, list[cst.Name]], dict[str, list[cst.Name]]]:
    """The scope's own bindings and reads of plain names (nested functions, classes, lambdas
    and comprehensions are scopes of their own and left out). A name bound any other way than
    by assignment (a loop, ``with``, ``except``, an import, a parameter, ``global``) is marked
    bound everywhere with an empty list entry that disqualifies it."""
    bound: dict[str, list[cst.Name]] = {}
    everywhere: set[str] = set()
    reads: dict[str, list[cst.Name]] = {}
    stored: set[int] = set()

    def visit(node: cst.CSTNode) -> None:
        for child in node.children:
            if isinstance(child, (cst.FunctionDef, cst.ClassDef)):
                everywhere.add(child.name.value)
                continue
            if isinstance(child, (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp)):
                continue
            if isinstance(child, cst.GeneratorExp):
                continue
            if isinstance(child, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                targets = (
                    [t.target for t in child.targets]
                    if isinstance(child, cst.Assign)
                    else [child.target]
                )
                for target in targets:
                    for name in _stored_names(target):
                        stored.add(id(name))
                        if isinstance(child, cst.AugAssign):
                            everywhere.add(name.value)
                        bound.setdefault(name.value, []).append(name)
            elif isinstance(child, (cst.For, cst.CompFor)):
                for name in _stored_names(child.target):
                    stored.add(id(name))
                    everywhere.add(name.value)
            elif isinstance(child, cst.WithItem) and child.asname is not None:
                for name in _stored_names(child.asname.name):
                    stored.add(id(name))
                    everywhere.add(name.value)
            elif isinstance(child, cst.ExceptHandler) and child.name is not None:
                everywhere.add(dotted_name(child.name.name))
            elif isinstance(child, (cst.Import, cst.ImportFrom)):
                everywhere.update(_imported(child))
                continue
            elif isinstance(child, (cst.Attribute, cst.Arg)):
                visit_value(child.value)
                continue
            elif isinstance(child, (cst.Global, cst.Nonlocal)):
                everywhere.update(n.name.value for n in child.names)
            elif isinstance(child, cst.NamedExpr):
                everywhere.update(n.value for n in _stored_names(child.target))
            elif isinstance(child, cst.Name) and id(child) not in stored:
                reads.setdefault(child.value, []).append(child)
            visit(child)

    def visit_value(node: cst.CSTNode) -> None:
        if isinstance(node, cst.Name):
            if id(node) not in stored:
                reads.setdefault(node.value, []).append(node)
            return
        visit(node)

    if isinstance(scope, cst.FunctionDef):
        params = scope.params
        everywhere.update(p.name.value for p in all_params(params))
        visit(scope.body)
    else:
        visit(scope)
    for name in everywhere:
        bound.pop(name, None)
    return bound, reads


def _stored_names(target: cst.CSTNode) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _stored_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _stored_names(target.value)
    return []  # ``self.x``, ``d[k]``: not a local


def dotted_name(node: cst.CSTNode) -> str:
    return node.value if isinstance(node, cst.Name) else ""


def _imported(node: cst.Import | cst.ImportFrom) -> set[str]:
    if isinstance(node.names, cst.ImportStar):
        return set()
    names = set()
    for alias in node.names:
        if alias.asname is not None:
            names.add(dotted_name(alias.asname.name))
        else:
            first = alias.name
            while isinstance(first, cst.Attribute):
                first = first.value
            names.add(dotted_name(first))
    return names
