"""A conversion before it is applied: edits keyed by the original nodes, and the notes for the
summary. Planning reads the `ScriptModel` of the untouched tree; `transform.py` applies the plan
in one pass, so every decision is made against the code the user wrote."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst

Replace = Callable[[cst.CSTNode], cst.CSTNode]
#: A statement to insert, or a function that builds it while the plan is applied (from nodes
#: the pass has already rewritten).
Insert = cst.BaseStatement | Callable[[], cst.BaseStatement]


@dataclass(frozen=True)
class Note:
    line: int
    text: str


@dataclass
class Plan:
    accelerator: str = "accelerator"
    replacements: dict[cst.CSTNode, Replace] = field(default_factory=dict)
    removals: set[cst.CSTNode] = field(default_factory=set)
    before: dict[cst.CSTNode, list[Insert]] = field(default_factory=dict)
    after: dict[cst.CSTNode, list[Insert]] = field(default_factory=dict)
    new_parameters: dict[cst.FunctionDef, str] = field(default_factory=dict)
    #: statements run only where a test holds (``accelerator.is_main_process``); consecutive
    #: ones with the same test share one ``if``.
    guards: dict[cst.CSTNode, str] = field(default_factory=dict)
    #: statements run inside ``with <context>:`` (``accelerator.main_process_first()``);
    #: consecutive ones with the same context share one block.
    contexts: dict[cst.CSTNode, str] = field(default_factory=dict)
    changes: list[Note] = field(default_factory=list)
    reviews: list[Note] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)
    #: import lines the edits need, added after the file's last top-level import.
    imports: list[str] = field(default_factory=list)

    def replace(self, node: cst.CSTNode, replace: Replace, line: int, text: str) -> None:
        self.replacements[node] = replace
        self.change(line, text)

    def remove(self, statement: cst.CSTNode, line: int, text: str) -> None:
        self.removals.add(statement)
        self.change(line, text)

    def insert_before(self, statement: cst.CSTNode, *new: Insert) -> None:
        """``new`` before ``statement``; a statement already planned there (a second edit's
        barrier) is not doubled."""
        planned = self.before.setdefault(statement, [])
        known = {_code(item) for item in planned}
        planned.extend(item for item in new if _code(item) is None or _code(item) not in known)

    def insert_after(self, statement: cst.CSTNode, *new: Insert) -> None:
        self.after.setdefault(statement, []).extend(new)

    def guard(self, statement: cst.CSTNode, test: str, line: int, text: str) -> None:
        self.guards[statement] = test
        self.change(line, text)

    def wrap_in(self, statement: cst.CSTNode, context: str, line: int, text: str) -> None:
        """Run ``statement`` inside ``with context:``; a statement already guarded is left as
        it is, with a review line: one statement, one block around it."""
        if statement in self.guards:
            self.review(line, f"left as is: already run under `if {self.guards[statement]}:`")
            return
        self.contexts[statement] = context
        self.change(line, text)

    def change(self, line: int, text: str) -> None:
        note = Note(line, text)
        if note not in self.changes:
            self.changes.append(note)

    def review(self, line: int, text: str) -> None:
        note = Note(line, text)
        if note not in self.reviews:
            self.reviews.append(note)

    def merge(self, other: Plan) -> None:
        """``other``'s edits added where they do not touch a node this plan already edits; an
        insert already planned at the same place (a second finding's barrier) is not doubled."""
        for node, replace in other.replacements.items():
            self.replacements.setdefault(node, replace)
        self.removals |= other.removals
        for mine, theirs in ((self.before, other.before), (self.after, other.after)):
            for anchor, inserts in theirs.items():
                planned = mine.setdefault(anchor, [])
                known = {_code(item) for item in planned}
                planned.extend(i for i in inserts if _code(i) is None or _code(i) not in known)

    @property
    def empty(self) -> bool:
        return not (
            self.replacements
            or self.removals
            or self.before
            or self.after
            or self.guards
            or self.contexts
        )


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
