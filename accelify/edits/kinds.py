"""The kinds of edit, as plain data: what a rewrite returns and a `Plan` composes.

An edit names a node of the untouched tree and says what becomes of it. Two edits are equal
when they name the same node and do the same thing, which is how a `Plan` tells a rewrite asked
for twice (one edit) from two rewrites of one node (a conflict).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

#: A function of the node as the pass has rewritten it so far (edits inside it already made).
Rewrite = Callable[[cst.CSTNode], cst.CSTNode]
#: A statement to insert, or a function that builds it while the plan is applied (from nodes
#: the pass has already rewritten).
Insert = cst.BaseStatement | Callable[[], cst.BaseStatement]


@dataclass(frozen=True)
class Replace:
    """``node`` becomes ``rewrite(node as rewritten inside)``; at most one per node."""

    node: cst.CSTNode
    rewrite: Rewrite


@dataclass(frozen=True)
class Wrap:
    """A rewrite of ``node`` *after* its replacement, if any: wraps stack in the order added
    (a loop's body put in ``with accumulate``, then the call given an argument). The declared
    way for two rewrites to touch one node."""

    node: cst.CSTNode
    wrapper: Rewrite


@dataclass(frozen=True)
class Remove:
    statement: cst.CSTNode


@dataclass(frozen=True)
class InsertBefore:
    anchor: cst.CSTNode
    statement: Insert


@dataclass(frozen=True)
class InsertAfter:
    anchor: cst.CSTNode
    statement: Insert


@dataclass(frozen=True)
class Guard:
    """``statement`` runs under ``if test:``; consecutive ones with one test share the ``if``."""

    statement: cst.CSTNode
    test: str


@dataclass(frozen=True)
class Within:
    """``statement`` runs in ``with context:``; consecutive ones share the block."""

    statement: cst.CSTNode
    context: str


Edit = Replace | Wrap | Remove | InsertBefore | InsertAfter | Guard | Within


def target(edit: Edit) -> cst.CSTNode:
    """The node of the untouched tree the edit is made at."""
    if isinstance(edit, (InsertBefore, InsertAfter)):
        return edit.anchor
    if isinstance(edit, (Replace, Wrap)):
        return edit.node
    return edit.statement
