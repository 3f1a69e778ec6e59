"""A set of edits before it is applied, keyed by the nodes of the untouched tree, with the notes
for the summary. Every decision is made against the code the user wrote; `apply.py` makes the
edits in one pass.

The plan, not its callers, decides how edits compose, so no step reads or undoes another's:

- an edit of a node inside an edited node chains: the outer rewrite receives the inner one's
  result (the pass rewrites bottom-up);
- a rewrite asked for twice (equal edits) is made once and noted once;
- two different replacements of one node are a conflict: the second is refused with a review
  line; the declared ways for two rewrites to meet on one node are `Wrap` (rewrites that stack)
  and edits that give way (``gives_way_to``: a default dropped where another edit decides);
- a plan confined to part of the file (the class that owns ``self.accelerator``) refuses edits
  outside it, and drops the notes of the lines those edits would have changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import libcst as cst

from accelify.edits.code import expression, statement, with_keyword
from accelify.edits.kinds import (
    Edit,
    Guard,
    Insert,
    InsertAfter,
    InsertBefore,
    Remove,
    Replace,
    Rewrite,
    Within,
    Wrap,
    target,
)
from accelify.edits.table import EditTable, Emptied, Fallback

__all__ = [
    "Insert",
    "Note",
    "NoteKind",
    "Plan",
    "Planned",
    "Rewrite",
    "expression",
    "statement",
    "with_keyword",
]


class NoteKind(Enum):
    """What a note tells the tools that act on it, which read this and never its wording."""

    PLAIN = "plain"
    #: a number the converted script computes differently on N ranks than the original on one
    #: process (one rank's shard, a pace or a count that changes with N): the runs of
    #: `accelify verify` cannot tell it wrong, so its verdict names these lines.
    DIFFERS_ON_N_RANKS = "differs on N ranks"


@dataclass(frozen=True)
class Note:
    line: int
    text: str
    #: not part of equality: one line and text is one line of the summary, however many steps
    #: say it (`Plan.review` keeps it marked when any of them marks it).
    kind: NoteKind = field(default=NoteKind.PLAIN, compare=False)


@dataclass(frozen=True)
class Planned:
    """What became of a rewrite: accepted or not, and whether it is in effect once the plan is
    complete (an edit that gives way may be dropped by one planned later)."""

    accepted: bool
    in_effect: Callable[[], bool]

    def __bool__(self) -> bool:
        return self.accepted


_REFUSED = Planned(False, lambda: False)
_MADE = Planned(True, lambda: True)


@dataclass
class Plan:
    accelerator: str = "accelerator"
    reviews: list[Note] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)
    #: import lines the edits need, added after the file's last top-level import.
    imports: list[str] = field(default_factory=list)
    _edits: EditTable = field(default_factory=EditTable, init=False, repr=False)
    #: each note with what tells whether its edit is in effect once the plan is complete
    _notes: list[tuple[Note, Callable[[], bool] | None]] = field(
        default_factory=list, init=False, repr=False
    )
    _reach: Callable[[cst.CSTNode], bool] | None = field(default=None, init=False, repr=False)
    _lines: Callable[[cst.CSTNode], range] | None = field(default=None, init=False, repr=False)
    _refused_lines: set[int] = field(default_factory=set, init=False, repr=False)

    @classmethod
    def of(cls, *edits: Edit) -> Plan:
        """A plan of ``edits`` alone: a lint fix."""
        plan = cls()
        plan.add(*edits)
        return plan

    def add(
        self,
        *edits: Edit,
        line: int | None = None,
        text: str | None = None,
        gives_way_to: Iterable[cst.CSTNode] | None = None,
        anywhere: bool = False,
        early: bool = False,
    ) -> Planned:
        """Plan ``edits``, one rewrite, noted as ``text`` at ``line``. Falsy when it was refused
        (a conflict, with a review line) or was planned already (then not noted twice).

        ``gives_way_to``: nodes whose replacement or removal by another edit drops this one
        (and its note). ``anywhere``: the edits need no accelerator, so a confined plan makes
        them outside its part of the file too. ``early``: inserts go ahead of the others
        planned at the same place (the Accelerator before what uses it)."""
        table = self._edits
        kept = [edit for edit in edits if anywhere or self._reaches_or_refuse(edit)]
        if not kept and edits:  # nothing of it is made: nothing of it is noted
            return _REFUSED
        new = [edit for edit in kept if not table.planned(edit)]
        if kept and not new:  # asked for again: in effect as the first asking is
            first = table.fallback_of(kept[0])
            return Planned(False, lambda: first is None or table.in_effect(first))
        if gives_way_to is not None:
            fallback = Fallback(tuple(new), tuple(gives_way_to))
            table.fallbacks.append(fallback)
            self._note(line, text, lambda: table.in_effect(fallback))
            return Planned(True, lambda: table.in_effect(fallback))
        if any(table.conflicts(edit) for edit in new):
            if line is not None:
                what = f"`{text}`" if text else "an edit"
                self.review(line, f"{what} not made: another edit already rewrites this code")
            return _REFUSED
        for edit in new:
            table.store(edit, early)
        self._note(line, text)
        return _MADE

    def replace(
        self, node: cst.CSTNode, rewrite: Rewrite, line: int | None = None, text: str = "", **how
    ) -> Planned:
        return self.add(Replace(node, rewrite), line=line, text=text or None, **how)

    def wrap(
        self, node: cst.CSTNode, wrapper: Rewrite, line: int | None = None, text: str = ""
    ) -> Planned:
        return self.add(Wrap(node, wrapper), line=line, text=text or None)

    def remove(
        self, statement: cst.CSTNode, line: int | None = None, text: str = "", **how
    ) -> Planned:
        return self.add(Remove(statement), line=line, text=text or None, **how)

    def remove_if_emptied(
        self, statement: cst.CSTNode, blocks: Sequence[Sequence[cst.CSTNode]], line: int, text: str
    ) -> None:
        """Remove ``statement`` (an ``if``) when the plan removes every statement of each of
        its ``blocks``: known only once every other edit is planned, so decided when applied."""
        if not blocks or not all(blocks) or not self.reaches(statement):
            return
        emptied = Emptied(tuple(blocks))
        self._edits.emptied[statement] = emptied
        self._note(line, text, lambda: self._edits.all_removed(emptied))

    def insert_before(self, statement: cst.CSTNode, *new: Insert, early: bool = False) -> None:
        """``new`` before ``statement``; a statement already planned there (a second edit's
        barrier) is not doubled."""
        self.add(*(InsertBefore(statement, item) for item in new), early=early)

    def insert_after(self, statement: cst.CSTNode, *new: Insert, early: bool = False) -> None:
        self.add(*(InsertAfter(statement, item) for item in new), early=early)

    def guard(self, statement: cst.CSTNode, test: str, line: int, text: str) -> None:
        self.add(Guard(statement, test), line=line, text=text)

    def wrap_in(self, statement: cst.CSTNode, context: str, line: int, text: str) -> None:
        """Run ``statement`` inside ``with context:``; a statement already guarded is left as
        it is, with a review line: one statement, one block around it."""
        guarded = self._edits.guards.get(statement)
        if guarded is not None:
            self.review(line, f"left as is: already run under `if {guarded}:`")
            return
        self.add(Within(statement, context), line=line, text=text)

    def add_parameter(self, function: cst.FunctionDef, name: str) -> None:
        self._edits.new_parameters[function] = name

    def change(self, line: int, text: str, when: Callable[[], bool] | None = None) -> None:
        """A note of a change at ``line``; ``when``: it is said only if this holds once the
        plan is complete (what a later step does to the same object decides it)."""
        self._note(line, text, when)

    def review(self, line: int, text: str, kind: NoteKind = NoteKind.PLAIN) -> None:
        """A review line, once however many steps say it; marked ``kind`` when any of them
        marks it (the step that knows the number differs on N ranks need not be the first)."""
        note = Note(line, text, kind)
        if note not in self.reviews:
            self.reviews.append(note)
        elif kind is not NoteKind.PLAIN:
            index = self.reviews.index(note)
            self.reviews[index] = dataclasses.replace(self.reviews[index], kind=kind)

    def confine(
        self, reaches: Callable[[cst.CSTNode], bool], lines: Callable[[cst.CSTNode], range]
    ) -> None:
        """Edits only where ``reaches`` holds (what ``self.accelerator`` reaches); ``lines``
        gives the lines of a node, whose notes a refused edit takes with it."""
        self._reach, self._lines = reaches, lines

    def reaches(self, node: cst.CSTNode) -> bool:
        return self._reach is None or self._reach(node)

    def merge(self, other: Plan) -> None:
        """``other``'s edits added where they do not conflict with this plan's (lint applies
        one fix per node per round)."""
        for edit, early in other._edits.every_edit():
            self.add(edit, early=early)

    # -- reading, for `apply` and the summary ----------------------------------------------

    @property
    def changes(self) -> list[Note]:
        """The notes of the edits in effect, each once, in the order they were planned."""
        found: list[Note] = []
        for note, in_effect in self._notes:
            if note.line in self._refused_lines or note in found:
                continue
            if in_effect is None or in_effect():
                found.append(note)
        return found

    @property
    def empty(self) -> bool:
        return self._edits.empty

    def rewrite_of(self, node: cst.CSTNode) -> Rewrite | None:
        return self._edits.rewrite_of(node)

    def edited_nodes(self) -> tuple[list[cst.CSTNode], list[cst.CSTNode]]:
        """The nodes rewritten where they stand, and the statements whose block is rebuilt
        around them (`EditTable.edited_nodes`): where in the file the plan's edits are made."""
        return self._edits.edited_nodes()

    def removes(self, statement: cst.CSTNode) -> bool:
        return self._edits.removes(statement)

    def inserted_before(self, statement: cst.CSTNode) -> list[Insert]:
        return self._edits.inserted(statement, after=False)

    def inserted_after(self, statement: cst.CSTNode) -> list[Insert]:
        return self._edits.inserted(statement, after=True)

    def block_around(self, statement: cst.CSTNode) -> tuple[str, str] | None:
        """``("if", test)`` for a guarded statement, ``("with", context)`` for one run in a
        context manager, None for the rest."""
        return self._edits.block_around(statement)

    def new_parameter(self, function: cst.CSTNode) -> str | None:
        return self._edits.new_parameters.get(function)

    def _reaches_or_refuse(self, edit: Edit) -> bool:
        node = target(edit)
        if self.reaches(node):
            return True
        if self._lines is not None and not isinstance(edit, (InsertBefore, InsertAfter)):
            self._refused_lines.update(self._lines(node))
        return False

    def _note(self, line: int | None, text: str | None, in_effect=None) -> None:
        if line is not None and text:
            self._notes.append((Note(line, text), in_effect))
