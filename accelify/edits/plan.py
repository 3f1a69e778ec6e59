"""A set of edits before it is applied, keyed by the nodes of the untouched tree, with the notes
for the summary. Every decision is made against the code the user wrote; `apply.py` makes the
edits in one pass.

The plan, not its callers, decides how edits compose, so no step reads or undoes another's:

- an edit of a node inside an edited node chains: the outer rewrite receives the inner one's
  result (the pass rewrites bottom-up);
- a rewrite asked for twice (equal edits) is made once and noted once;
- two different replacements of one node are a conflict: the second is refused with a review
  line; the declared ways for two rewrites to meet on one node are `Wrap` (rewrites that stack)
  and edits that give way (`gives_way_to`: a default dropped where another edit decides);
- a plan confined to part of the file (the class that owns ``self.accelerator``) refuses edits
  outside it, and drops the notes of the lines those edits would have changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst

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

__all__ = [
    "Insert",
    "Note",
    "Plan",
    "Planned",
    "Rewrite",
    "expression",
    "statement",
    "with_keyword",
]


@dataclass(frozen=True)
class Note:
    line: int
    text: str


@dataclass
class _Fallback:
    """Edits made only where no other edit replaces or removes one of ``gives_way_to``."""

    edits: tuple[Edit, ...]
    gives_way_to: tuple[cst.CSTNode, ...]


@dataclass(frozen=True)
class Planned:
    """What became of a rewrite: accepted or not, and whether it is in effect once the plan is
    complete (an edit that gives way may be dropped by one planned later)."""

    accepted: bool
    in_effect: Callable[[], bool]

    def __bool__(self) -> bool:
        return self.accepted


_NO = Planned(False, lambda: False)
_YES = Planned(True, lambda: True)


@dataclass
class _Emptied:
    """A statement removed when every statement of each of its blocks is removed."""

    blocks: tuple[Sequence[cst.CSTNode], ...]


@dataclass
class Plan:
    accelerator: str = "accelerator"
    reviews: list[Note] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)
    #: import lines the edits need, added after the file's last top-level import.
    imports: list[str] = field(default_factory=list)
    _replacements: dict[cst.CSTNode, Rewrite] = field(default_factory=dict, repr=False)
    _wraps: dict[cst.CSTNode, list[Rewrite]] = field(default_factory=dict, repr=False)
    _removals: set[cst.CSTNode] = field(default_factory=set, repr=False)
    _emptied: dict[cst.CSTNode, _Emptied] = field(default_factory=dict, repr=False)
    _fallbacks: list[_Fallback] = field(default_factory=list, repr=False)
    #: inserts at each anchor: the early ones (set up what the others use) come first.
    _before: dict[cst.CSTNode, list[tuple[bool, Insert]]] = field(default_factory=dict, repr=False)
    _after: dict[cst.CSTNode, list[tuple[bool, Insert]]] = field(default_factory=dict, repr=False)
    _guards: dict[cst.CSTNode, str] = field(default_factory=dict, repr=False)
    _contexts: dict[cst.CSTNode, str] = field(default_factory=dict, repr=False)
    _new_parameters: dict[cst.CSTNode, str] = field(default_factory=dict, repr=False)
    _notes: list[tuple[Note, Callable[[], bool] | None]] = field(default_factory=list, repr=False)
    _reach: Callable[[cst.CSTNode], bool] | None = field(default=None, repr=False)
    _lines: Callable[[cst.CSTNode], range] | None = field(default=None, repr=False)
    _refused_lines: set[int] = field(default_factory=set, repr=False)

    # -- building -------------------------------------------------------------------------

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
        """Plan ``edits``, one rewrite, noted as ``text`` at ``line``. False when it was refused
        (a conflict, with a review line) or was already planned (not noted twice).

        ``gives_way_to``: nodes whose replacement or removal by another edit drops this one
        (and its note). ``anywhere``: the edits need no accelerator, so a confined plan makes
        them outside its part of the file too. ``early``: inserts go ahead of the others
        planned at the same place."""
        kept = [edit for edit in edits if anywhere or self._reaches_or_refuse(edit)]
        if not kept and edits:
            self._note(line, text)  # dropped with the refused lines, as the edit is
            return _NO
        new = [edit for edit in kept if not self._planned(edit)]
        if kept and not new:  # asked for again: in effect as the first asking is
            fallback = self._fallback_of(kept[0])
            return Planned(False, lambda: fallback is None or self._in_effect(fallback))
        conflict = next((edit for edit in new if self._conflicts(edit)), None)
        if conflict is not None and gives_way_to is None:
            if line is not None:
                what = f"`{text}`" if text else "an edit"
                self.review(line, f"{what} not made: another edit already rewrites this code")
            return _NO
        if gives_way_to is not None:
            fallback = _Fallback(tuple(new), tuple(gives_way_to))
            self._fallbacks.append(fallback)
            self._note(line, text, lambda: self._in_effect(fallback))
            return Planned(True, lambda: self._in_effect(fallback))
        for edit in new:
            self._store(edit, early)
        self._note(line, text)
        return _YES

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
        emptied = _Emptied(tuple(blocks))
        self._emptied[statement] = emptied
        self._note(line, text, lambda: self._all_removed(emptied))

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
        if statement in self._guards:
            self.review(line, f"left as is: already run under `if {self._guards[statement]}:`")
            return
        self.add(Within(statement, context), line=line, text=text)

    def add_parameter(self, function: cst.FunctionDef, name: str) -> None:
        self._new_parameters[function] = name

    def change(self, line: int, text: str) -> None:
        self._note(line, text)

    def review(self, line: int, text: str) -> None:
        note = Note(line, text)
        if note not in self.reviews:
            self.reviews.append(note)

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
        for node, rewrite in other._replacements.items():
            self.add(Replace(node, rewrite))
        for node, wrappers in other._wraps.items():
            self.add(*(Wrap(node, wrapper) for wrapper in wrappers))
        self.add(*(Remove(node) for node in other._removals))
        for node, test in other._guards.items():
            self.add(Guard(node, test))
        for node, context in other._contexts.items():
            self.add(Within(node, context))
        for inserts, kind in ((other._before, InsertBefore), (other._after, InsertAfter)):
            for anchor, items in inserts.items():
                for early, item in items:
                    self.add(kind(anchor, item), early=early)

    # -- reading, for `apply` and the summary -------------------------------------------

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
        return not (
            self._replacements
            or self._wraps
            or self._removals
            or self._before
            or self._after
            or self._guards
            or self._contexts
            or any(self._in_effect(f) for f in self._fallbacks)
        )

    def rewrite_of(self, node: cst.CSTNode) -> Rewrite | None:
        """The replacement of ``node`` (or the default that stands in for one), then its wraps."""
        replace = self._replacements.get(node) or self._fallback_rewrite(node)
        wrappers = self._wraps.get(node, [])
        if replace is None and not wrappers:
            return None

        def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
            if replace is not None:
                updated = replace(updated)
            for wrapper in wrappers:
                updated = wrapper(updated)
            return updated

        return rewrite

    def removes(self, statement: cst.CSTNode) -> bool:
        if statement in self._removals:
            return True
        if any(
            isinstance(e, Remove) and e.statement is statement
            for f in self._fallbacks
            if self._in_effect(f)
            for e in f.edits
        ):
            return True
        emptied = self._emptied.get(statement)
        return emptied is not None and self._all_removed(emptied)

    def inserted_before(self, statement: cst.CSTNode) -> list[Insert]:
        return _in_order(self._before.get(statement, []))

    def inserted_after(self, statement: cst.CSTNode) -> list[Insert]:
        return _in_order(self._after.get(statement, []))

    def block_around(self, statement: cst.CSTNode) -> tuple[str, str] | None:
        """``("if", test)`` for a guarded statement, ``("with", context)`` for one run in a
        context manager, None for the rest."""
        if statement in self._guards:
            return "if", self._guards[statement]
        if statement in self._contexts:
            return "with", self._contexts[statement]
        return None

    def new_parameter(self, function: cst.CSTNode) -> str | None:
        return self._new_parameters.get(function)

    # -- composition rules ------------------------------------------------------------------

    def _reaches_or_refuse(self, edit: Edit) -> bool:
        node = target(edit)
        if self.reaches(node):
            return True
        if self._lines is not None and not isinstance(edit, (InsertBefore, InsertAfter)):
            self._refused_lines.update(self._lines(node))
        return False

    def _planned(self, edit: Edit) -> bool:
        """``edit`` is in the plan already (asked for by a second site or step)."""
        if isinstance(edit, Replace):
            return self._replacements.get(edit.node) == edit.rewrite or any(
                edit == other for f in self._fallbacks for other in f.edits
            )
        if isinstance(edit, Wrap):
            return edit.wrapper in self._wraps.get(edit.node, [])
        if isinstance(edit, Remove):
            return edit.statement in self._removals
        if isinstance(edit, Guard):
            return self._guards.get(edit.statement) == edit.test
        if isinstance(edit, Within):
            return self._contexts.get(edit.statement) == edit.context
        inserts = self._before if isinstance(edit, InsertBefore) else self._after
        code = _code(edit.statement)
        return code is not None and any(
            _code(item) == code for _, item in inserts.get(edit.anchor, [])
        )

    def _conflicts(self, edit: Edit) -> bool:
        """A second, different replacement of one node (or a second test around a statement)."""
        if isinstance(edit, Replace):
            return edit.node in self._replacements
        if isinstance(edit, Guard):
            return edit.statement in self._guards
        return False

    def _store(self, edit: Edit, early: bool) -> None:
        if isinstance(edit, Replace):
            self._replacements[edit.node] = edit.rewrite
        elif isinstance(edit, Wrap):
            self._wraps.setdefault(edit.node, []).append(edit.wrapper)
        elif isinstance(edit, Remove):
            self._removals.add(edit.statement)
        elif isinstance(edit, Guard):
            self._guards[edit.statement] = edit.test
        elif isinstance(edit, Within):
            self._contexts[edit.statement] = edit.context
        elif isinstance(edit, InsertBefore):
            self._before.setdefault(edit.anchor, []).append((early, edit.statement))
        else:
            self._after.setdefault(edit.anchor, []).append((early, edit.statement))

    def _in_effect(self, fallback: _Fallback) -> bool:
        return not any(
            node in self._replacements
            or node in self._removals
            or (node in self._emptied and self._all_removed(self._emptied[node]))
            for node in fallback.gives_way_to
        )

    def _fallback_of(self, edit: Edit) -> _Fallback | None:
        return next((f for f in self._fallbacks if edit in f.edits), None)

    def _fallback_rewrite(self, node: cst.CSTNode) -> Rewrite | None:
        for fallback in self._fallbacks:
            for edit in fallback.edits:
                if isinstance(edit, Replace) and edit.node is node and self._in_effect(fallback):
                    return edit.rewrite
        return None

    def _all_removed(self, emptied: _Emptied) -> bool:
        return all(s in self._removals for block in emptied.blocks for s in block)

    def _note(self, line: int | None, text: str | None, in_effect=None) -> None:
        if line is not None and text:
            self._notes.append((Note(line, text), in_effect))


def _in_order(items: list[tuple[bool, Insert]]) -> list[Insert]:
    return [item for early, item in items if early] + [item for early, item in items if not early]


def _code(item: Insert) -> str | None:
    return cst.Module([]).code_for_node(item) if isinstance(item, cst.CSTNode) else None


def with_keyword(args: Sequence[cst.Arg], name: str, value: cst.BaseExpression) -> list[cst.Arg]:
    """``args`` plus ``name=value``, written as a formatter writes it (no spaces around ``=``)."""
    result = list(args)
    if result and result[-1].comma is cst.MaybeSentinel.DEFAULT:
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        result[-1] = result[-1].with_changes(comma=comma)
    tight = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
    result.append(cst.Arg(value, keyword=cst.Name(name), equal=tight))
    return result


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def expression(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)
