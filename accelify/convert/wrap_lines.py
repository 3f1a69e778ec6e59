"""Lines the conversion made too long are wrapped the way black wraps a call: the arguments on
one indented line, else one per line with a trailing comma. Only lines the conversion wrote are
touched; a line that was already long in the original is the user's."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from accelify.analysis.syntax import Visitor

LINE_LENGTH = 88
INDENT = "    "


def wrap_long_lines(module: cst.Module, original: bytes) -> cst.Module:
    kept = set(original.decode("utf-8", errors="replace").splitlines())
    lines = module.code.splitlines()
    if not any(len(line) > LINE_LENGTH and line not in kept for line in lines):
        return module  # no new long line: no statement to wrap, no positions to compute
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    found = _LongCalls(positions, lines, kept)
    module.visit(found)
    if not found.calls:
        return module
    return module.visit(_Wrap(found.calls))


class _LongCalls(Visitor):
    """The outermost call of each simple statement that sits alone on a new, long line."""

    def __init__(self, positions, lines: list[str], kept: set[str]) -> None:
        self.positions = positions
        self.lines = lines
        self.kept = kept
        self.calls: dict[cst.Call, str] = {}
        self._statement: cst.SimpleStatementLine | None = None

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        position = self.positions[node]
        one_line = position.start.line == position.end.line
        text = self.lines[position.start.line - 1] if one_line else ""
        new_and_long = len(text) > LINE_LENGTH and text not in self.kept
        self._statement = node if new_and_long and len(node.body) == 1 else None

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statement = None

    def visit_Call(self, node: cst.Call) -> bool:
        if self._statement is None or not node.args:
            return True
        text = self.lines[self.positions[self._statement].start.line - 1]
        indent = text[: len(text) - len(text.lstrip())]
        self.calls[node] = indent
        self._statement = None  # the outermost call only
        return False


class _Wrap(cst.CSTTransformer):
    def __init__(self, calls: dict[cst.Call, str]) -> None:
        self.calls = calls

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        indent = self.calls.get(original_node)
        if indent is None:
            return updated_node
        arguments = cst.Module([]).code_for_node(updated_node.with_changes(func=cst.Name("f")))[
            2:-1
        ]
        fits = len(indent) + len(INDENT) + len(arguments) <= LINE_LENGTH
        if fits or len(updated_node.args) == 1:
            return _split(updated_node, per_line=False)
        return _split(updated_node, per_line=True)


def _split(call: cst.Call, per_line: bool) -> cst.Call:
    def newline(extra: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(),
            empty_lines=[],
            indent=True,
            last_line=cst.SimpleWhitespace(extra),
        )

    args = list(call.args)
    for index, argument in enumerate(args):
        last = index == len(args) - 1
        if per_line:
            comma = cst.Comma(whitespace_after=newline("" if last else INDENT))
            args[index] = argument.with_changes(comma=comma)
        elif last:
            args[index] = argument.with_changes(
                comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=newline("")
            )
        else:
            args[index] = argument.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
    return call.with_changes(args=args, whitespace_before_args=newline(INDENT))
