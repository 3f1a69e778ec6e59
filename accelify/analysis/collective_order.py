"""Collectives that the two sides of a rank test make in different orders.

Every rank must make the same collectives in the same order: the n-th collective of one rank
meets the n-th of every other. ``if rank == 0: a = gather(x); b = gather(y)`` with ``else: b =
gather(y); a = gather(x)`` pairs rank 0's ``x`` with the others' ``y`` (a silent swap where the
shapes agree, a size error or a hang where they do not); a gather meeting a reduce or a barrier,
or one side making one more gather, hangs. A kind of collective that one side never makes is
a collective on some ranks (ACC202's, reported there), not compared here. The same split
written as two ``if``s of one block (``if is_main: gather(a)``, ``gather(b)``, ``if not
is_main: gather(a)``) is read the same.

`CollectiveReach` already finds a collective some ranks skip (ACC202); where the other side of
the test makes the same call somewhere (`CollectiveReach._mirrored`) it is taken as reached on
every rank, whatever the order: this module reads that order. Only straight code is compared:
a side whose collectives sit under a branch, a loop or a ``try`` of their own, or after a
``return``/``break``/``continue``, is not (its sequence is not one).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.analysis.collective_reach import CollectiveUse, negations, spelled
from accelify.analysis.collectives import DDP
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, walk

#: Collectives that meet each other on the wire: Accelerate's gathers are one all_gather.
_SAME_OP = {
    "gather_for_metrics": "gather",
    "all_gather": "gather",
    "wait_for_everyone": "barrier",
    "all_reduce": "reduce",
}
#: What makes a side's code something other than one sequence of collectives.
_BRANCHING = (
    cst.If,
    cst.For,
    cst.While,
    cst.Try,
    cst.IfExp,
    cst.FunctionDef,
    cst.Lambda,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
    cst.BooleanOperation,
)
_LEAVING = (cst.Return, cst.Break, cst.Continue)


@dataclass(frozen=True)
class Step:
    """One collective a side makes: the call, what it is on the wire, what it is handed."""

    call: cst.Call
    op: str
    operand: str
    helper: bool  # a function of the file that reaches a collective


@dataclass(frozen=True)
class OrderMismatch:
    """A rank test whose two sides make different sequences of collectives."""

    test: cst.If  # the first ``if`` of the split
    tested: list[Step]  # the ranks the test lets in
    others: list[Step]  # the other ranks
    at: int  # the first position where they differ
    swapped: bool  # the same collectives of the same values, in another order


def order_mismatches(model: ScriptModel, uses: list[CollectiveUse]) -> list[OrderMismatch]:
    """Every rank split (an ``if`` on a rank test with its ``else``, or with an ``if`` on the
    negated test in the same block) whose two sides make collectives in different orders or
    kinds. Collectives on DDP only (the default run): a forward that gathers only under FSDP
    is not compared."""
    by_call = {
        id(use.call): use for use in uses if DDP in use.backends and use.call is use.collective
    }
    helpers = {id(use.call): use for use in uses if use.through_helper and DDP in use.backends}
    found: list[OrderMismatch] = []
    seen: set[int] = set()
    for branch in walk(model.module):
        if (
            not isinstance(branch, cst.If)
            or id(branch) in seen
            or not model.reads_rank(branch.test)
        ):
            continue
        sides = _sides(model, branch, seen)
        if sides is None:
            continue
        tested, others = (_sequence(model, nodes, by_call, helpers) for nodes in sides)
        if tested is None or others is None or not tested or not others:
            continue
        mismatch = _compare(branch, tested, others)
        if mismatch is not None:
            found.append(mismatch)
    return found


def _sides(
    model: ScriptModel, branch: cst.If, seen: set[int]
) -> tuple[list[cst.CSTNode], list[cst.CSTNode]] | None:
    """The code each side of the split runs, in order: the ``if``'s body and its ``else``;
    or, in its block, every statement from it to the last ``if`` on the same or the negated
    test (each such ``if``'s body to its side, the statements between to both). None where
    the split is neither (no ``else`` and no negated ``if``; an ``elif``; a statement between
    that tests the rank another way)."""
    if isinstance(branch.orelse, cst.Else):
        return [branch.body], [branch.orelse.body]
    if branch.orelse is not None:
        return None  # an ``elif`` chain
    block = model.parent(branch)
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None
    statements = list(block.body)
    start = statements.index(branch)
    spelling = spelled(model, branch.test)  # a walrus read as its target, as the tests below

    def same(test: cst.BaseExpression) -> bool:
        return spelled(model, test) == spelling

    partners = [
        i
        for i in range(start + 1, len(statements))
        if isinstance(statements[i], cst.If) and negations(model, branch.test, statements[i].test)
    ]
    if not partners:
        return None
    tested: list[cst.CSTNode] = []
    others: list[cst.CSTNode] = []
    for statement in statements[start : partners[-1] + 1]:
        if isinstance(statement, cst.If) and (
            same(statement.test) or negations(model, branch.test, statement.test)
        ):
            seen.add(id(statement))
            if statement.orelse is not None:
                return None
            (tested if same(statement.test) else others).append(statement.body)
        elif any(isinstance(n, cst.If) and model.reads_rank(n.test) for n in walk(statement)):
            return None
        else:
            tested.append(statement)
            others.append(statement)
    return tested, others


def _sequence(
    model: ScriptModel,
    nodes: list[cst.CSTNode],
    by_call: dict[int, CollectiveUse],
    helpers: dict[int, CollectiveUse],
) -> list[Step] | None:
    """The collectives ``nodes`` make, in order; None where they are not one straight sequence
    (a collective under a branch, loop or ``try`` of its own, or a side that may leave early)."""
    steps: list[Step] = []
    code = model.module.code_for_node
    for node in nodes:
        for inner in walk(node):
            if isinstance(inner, _LEAVING):
                return None
            if not isinstance(inner, cst.Call):
                continue
            use = by_call.get(id(inner)) or helpers.get(id(inner))
            if use is None:
                continue
            if any(isinstance(a, _BRANCHING) for a in _ancestors_below(model, inner, node)):
                return None
            helper = use.through_helper
            func = inner.func
            name = (dotted(func) or code(func)).rsplit(".", 1)[-1]
            op = name if helper else _SAME_OP.get(name, name)
            positional = [a for a in inner.args if a.keyword is None]
            operand = code(positional[0].value).strip() if positional else ""
            steps.append(Step(inner, op, operand, helper))
    steps.sort(key=lambda step: model.order(step.call))
    return steps


def _ancestors_below(model: ScriptModel, node: cst.CSTNode, top: cst.CSTNode) -> list[cst.CSTNode]:
    found = []
    for ancestor in model.ancestors(node):
        if ancestor is top:
            return found
        found.append(ancestor)
    return found


def _compare(branch: cst.If, tested: list[Step], others: list[Step]) -> OrderMismatch | None:
    """The mismatch of two sides' sequences: the same kinds on the wire in another order or
    number (one side gathers, then reduces, the other reduces first; or gathers once more),
    or the same collectives are
    handed the same values in another order (a swap). Sides that differ only in what they
    hand (``gather(x)`` against ``gather(torch.zeros_like(x))``: the others' stand-in) agree;
    a function of the file that reaches a collective is compared only with the same call."""
    ops = [step.op for step in tested], [step.op for step in others]
    at = next(
        (i for i, (a, b) in enumerate(zip(*ops, strict=False)) if a != b),
        min(len(ops[0]), len(ops[1])),
    )
    if ops[0] != ops[1]:
        if any(step.helper for step in (*tested, *others)):
            return None  # a helper's collectives against direct ones: not compared
        if set(ops[0]) != set(ops[1]):
            return None  # a kind one side never makes: ACC202's collective on some ranks
        return OrderMismatch(branch, tested, others, at, swapped=False)
    operands = [step.operand for step in tested], [step.operand for step in others]
    if operands[0] == operands[1] or sorted(operands[0]) != sorted(operands[1]):
        return None
    at = next(i for i, (a, b) in enumerate(zip(*operands, strict=True)) if a != b)
    return OrderMismatch(branch, tested, others, at, swapped=True)
