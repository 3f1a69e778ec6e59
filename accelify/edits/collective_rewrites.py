"""The rewrites that make a rank's own values collective: an evaluation's predictions and labels
gathered from every rank, a stop one rank decides made every rank's. Each moves code the pass
has already rewritten (a forward, an ``if``'s body) to a new place, so each is a `Wrap` that
keeps what it took, plus the insert built from it."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from accelify.edits.code import expression, statement
from accelify.edits.kinds import Edit, InsertAfter, InsertBefore, Remove, Replace, Wrap
from accelify.edits.node_rewrites import KeptForAMove, Swap, TakenOut


def gather_for_metrics(
    evaluated: cst.CSTNode,
    gathers: list[str],
    renamed: Iterable[tuple[cst.CSTNode, str]] = (),
    extract: tuple[cst.CSTNode, str] | None = None,
) -> list[Edit]:
    """``gathers`` (``preds, y = acc.gather_for_metrics((preds, y))``, and one statement more
    for each value gathered on its own) after ``evaluated``, the statement that computes what
    they gather; each of ``renamed`` then reads the gathered name.
    With ``extract`` (``(forward, "outputs")``) the forward inside ``evaluated``
    (``se += ((model(x) - y) ** 2).sum()``) moves up into ``outputs = model(x)``, as this pass
    rewrote it, and the gather comes before ``evaluated``, which reads ``outputs``."""
    edits: list[Edit] = [Replace(use, Swap(name)) for use, name in renamed]
    if extract is None:
        return [*edits, *(InsertAfter(evaluated, statement(g)) for g in gathers)]
    forward, name = extract
    return [
        *edits,
        *computed_before(forward, evaluated, name),
        *(InsertBefore(evaluated, statement(g)) for g in gathers),
    ]


def computed_before(value: cst.CSTNode, anchor: cst.CSTNode, name: str) -> list[Edit]:
    """``value`` (as this pass rewrote it) moves into ``name = value`` before ``anchor``, and
    ``name`` is read where it was: a forward taken out of a metric's expression, a call that
    every rank must make taken out of a block that only one rank will run."""
    take = TakenOut(name)

    def bind() -> cst.BaseStatement:
        value = take.taken[-1]
        return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], value)])  # type: ignore[arg-type]

    return [Wrap(value, take), InsertBefore(anchor, bind)]


def collective_stop(
    if_node: cst.If,
    acc: str,
    check_after: cst.BaseStatement | None = None,
    told: Iterable[cst.BaseStatement] = (),
    agreed_flag: str | None = None,
) -> list[Edit]:
    """``if <this rank's test>: ...; break`` -> ``if ...: acc.set_trigger()`` and, after it
    (or after ``check_after``, a branch around it the ranks may take differently: every rank
    must reach the check), ``if acc.check_trigger(): ...; break``: every rank stops when any
    rank would, and does what the ``if`` did before breaking. ``told``: statements (the
    "early stopping" print where a flag was set) moved, as the pass rewrote them, to the head
    of the check's body: said once when any rank decided, not only when the main one did.
    ``agreed_flag``: the flag the ``if`` tests (``if stop: break``), set to True at the head of
    the check's body, so that what reads it after the loop (``if stop: print(...)``) reads
    every rank's decision, not this rank's."""
    bodies: list[cst.BaseSuite] = []
    moved = [KeptForAMove() for _ in told]

    def trigger(updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.If)
        bodies.append(updated.body)
        return updated.with_changes(body=cst.IndentedBlock([statement(f"{acc}.set_trigger()")]))

    def check() -> cst.BaseStatement:
        body = bodies[-1]
        taken = [take.taken[-1] for take in moved]
        if agreed_flag is not None:
            taken.insert(0, statement(f"{agreed_flag} = True"))
        if taken:
            assert isinstance(body, cst.IndentedBlock)
            body = body.with_changes(body=[*taken, *body.body])
        return cst.If(test=expression(f"{acc}.check_trigger()"), body=body)

    edits: list[Edit] = [Wrap(if_node, trigger), InsertAfter(check_after or if_node, check)]
    for line, take in zip(told, moved, strict=True):
        edits += [Wrap(line, take), Remove(line)]
    return edits
