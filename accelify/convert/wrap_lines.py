"""Lines the conversion made too long are wrapped the way black wraps a call: the arguments on
one indented line, else one per line with a trailing comma, and an argument still too long (a
call, a dict or a list) split the same way one level in. Only lines the conversion wrote are
touched; a line that was already long in the original is the user's. A statement the user laid
out over several lines (``torch.save(\n    obj,\n    path)``) whose rewrite made one of its
lines long is laid out again as a whole; one with a comment or a string over several lines
inside keeps the user's layout."""

from __future__ import annotations

import re

import libcst as cst

from accelify.analysis.script_model import positions_of

LINE_LENGTH = 88
INDENT = "    "


def wrap_long_lines(module: cst.Module, original: bytes) -> cst.Module:
    kept = set(original.decode("utf-8", errors="replace").splitlines())
    lines = module.code.splitlines()
    if not any(len(line) > LINE_LENGTH and line not in kept for line in lines):
        return module  # no new long line: no statement to wrap, no positions to compute
    # libcst's ranges from our cheaper pass (half the CPU of its PositionProvider's)
    wrap = _WrapLongCalls(positions_of(module), lines, kept)
    wrapped = module.visit(wrap)
    return wrapped if wrap.wrapped else module


class _WrapLongCalls(cst.CSTTransformer):
    """The outermost call of each simple statement that sits alone on a new, long line, laid
    out anew, in one pass that enters only what can hold such a statement or is one: no
    expression holds a statement, so the expressions of every other statement (most of the
    tree) are left unvisited. (A visit to find the calls and a second, whole, to replace them
    cost twice that and more.) The hooks are dispatched here, not by libcst's name lookups."""

    def __init__(self, positions, lines: list[str], kept: set[str]) -> None:
        self.positions = positions
        self.lines = lines
        self.kept = kept
        #: the calls to lay out, each with its statement's indentation
        self.calls: dict[cst.Call, str] = {}
        self.wrapped = False
        self._statement: cst.SimpleStatementLine | None = None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.SimpleStatementLine):
            self._statement = node if self._new_and_long(node) else None
            return self._statement is not None
        if self._statement is None:
            return not isinstance(node, cst.BaseExpression)
        if isinstance(node, cst.Call) and node.args:
            self._found(node)
            return False
        return True

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:
        if isinstance(original_node, cst.SimpleStatementLine):
            self._statement = None
            return updated_node
        indent = self.calls.get(original_node) if isinstance(original_node, cst.Call) else None
        if indent is None:
            return updated_node
        collapsed = _collapsed(updated_node)  # type: ignore[arg-type]
        if collapsed is None:
            return updated_node
        self.wrapped = True
        return _laid_out(collapsed, len(indent), 0)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    def _new_and_long(self, node: cst.SimpleStatementLine) -> bool:
        position = self.positions[node]
        span = self.lines[position.start.line - 1 : position.end.line]
        new_and_long = any(len(text) > LINE_LENGTH and text not in self.kept for text in span)
        if len(span) > 1 and new_and_long and not _collapsible(node):
            return False  # a comment or a multi-line string inside: the user's layout
        return new_and_long and len(node.body) == 1

    def _found(self, node: cst.Call) -> None:
        """``node``, a call with arguments and none of the calls around it, when it is the call
        the statement's line breaks are in (the statement's outermost one)."""
        position = self.positions[self._statement]
        if position.start.line != position.end.line and "\n" not in _code(node):
            return  # not the call the user's line breaks are in
        text = self.lines[position.start.line - 1]
        self.calls[node] = text[: len(text) - len(text.lstrip())]
        self._statement = None  # the outermost call only


#: What `_split` lays out: a call's arguments, a dict's or a list's elements.
_Bracketed = cst.Call | cst.Dict | cst.List


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _collapsible(statement: cst.SimpleStatementLine) -> bool:
    """No comment and no string over several lines inside ``statement``: joining its lines
    loses nothing."""
    pending: list[cst.CSTNode] = [statement.body[0]]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.Comment):
            return False
        if isinstance(node, (cst.SimpleString, cst.FormattedString)) and "\n" in _code(node):
            return False
        pending.extend(node.children)  # whitespace too, where comments live
    return True


#: a line break inside brackets, with what joins the two lines: nothing after an opening
#: bracket or before a closing one, else one space
_BREAK = re.compile(r"(?<=[(\[{])[ \t]*\\?\n\s*|\s*\\?\n\s*(?=[)\]}])|[ \t]*\\?\n\s*")


def _collapsed(call: cst.Call) -> cst.Call | None:
    """``call`` on one line: the user's line breaks inside its brackets joined; None when the
    joined code is not the same call (then the user's layout stays)."""
    code = _code(call)
    if "\n" not in code:
        return call
    joined = _BREAK.sub(lambda m: "" if "\n" in m.group(0) and _bracket_side(m) else " ", code)
    try:
        parsed = cst.parse_expression(joined)
    except cst.ParserSyntaxError:
        return None
    return parsed if isinstance(parsed, cst.Call) else None


def _bracket_side(match: re.Match[str]) -> bool:
    text, start, end = match.string, match.start(), match.end()
    return (start > 0 and text[start - 1] in "([{") or (end < len(text) and text[end] in ")]}")


def _laid_out(node: cst.BaseExpression, column: int, depth: int) -> cst.BaseExpression:
    """``node`` (a call, a dict or a list starting at ``column``'s indentation, ``depth``
    levels in) split as black splits it when its line is too long: the items on one indented
    line, else one per line with a trailing comma, each still too long split the same way."""
    start = column + len(INDENT) * depth
    if isinstance(node, cst.ConcatenatedString):
        return _strings_per_line(node, depth)
    if isinstance(node, cst.Call) and depth and start + len(_code(node.func)) + 1 > LINE_LENGTH:
        return node  # the call's head alone is too long: splitting its arguments gains nothing
    if isinstance(node, cst.Call) and node.args:
        items = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in node.args]
        inner = _code(node.with_changes(func=cst.Name("f"), args=items))[2:-1]
    elif isinstance(node, (cst.Dict, cst.List)) and node.elements:
        items = [e.with_changes(comma=cst.MaybeSentinel.DEFAULT) for e in node.elements]
        inner = _code(node.with_changes(elements=items))[1:-1]
    else:
        return node
    width = column + len(INDENT) * (depth + 1)
    if width + len(inner) <= LINE_LENGTH or (len(items) == 1 and not _splittable(items[0])):
        return _split(node, per_line=False, depth=depth)
    if len(items) == 1:  # one argument, itself split: ``f(\n    g(\n        ...\n    )\n)``
        value = _laid_out(items[0].value, column, depth + 1)  # type: ignore[attr-defined]
        return _split(node, per_line=False, depth=depth, items=[items[0].with_changes(value=value)])
    split = []
    for item in items:
        if width + len(_code(item)) + 1 > LINE_LENGTH and _splittable(item):
            item = item.with_changes(value=_laid_out(item.value, column, depth + 1))  # type: ignore[attr-defined]
        split.append(item)
    return _split(node, per_line=True, depth=depth, items=split)


def _splittable(item: cst.CSTNode) -> bool:
    value = getattr(item, "value", None)
    return (
        (isinstance(value, cst.Call) and bool(value.args))
        or (isinstance(value, (cst.Dict, cst.List)) and bool(value.elements))
        or isinstance(value, cst.ConcatenatedString)
    )


def _strings_per_line(node: cst.ConcatenatedString, depth: int) -> cst.ConcatenatedString:
    """``f"a " f"b " f"c"`` (a message the user wrote over several lines, joined when the
    statement was collapsed) back to one string per line, ``depth`` levels in: inside the
    brackets of the call or the display that holds it, the strings still join."""
    right = node.right
    if isinstance(right, cst.ConcatenatedString):
        right = _strings_per_line(right, depth)
    return node.with_changes(
        right=right,
        whitespace_between=cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(),
            empty_lines=[],
            indent=True,
            last_line=cst.SimpleWhitespace(INDENT * depth),
        ),
    )


def _split(
    node: _Bracketed, per_line: bool, depth: int = 0, items: list | None = None
) -> _Bracketed:
    """``node``'s items (``items``, else its own) split over lines ``depth`` levels in."""

    def newline(levels: int) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(),
            empty_lines=[],
            indent=True,
            last_line=cst.SimpleWhitespace(INDENT * levels),
        )

    call = isinstance(node, cst.Call)
    args = list(items if items is not None else (node.args if call else node.elements))
    for index, argument in enumerate(args):
        last = index == len(args) - 1
        if per_line:
            comma = cst.Comma(whitespace_after=newline(depth if last else depth + 1))
            args[index] = argument.with_changes(comma=comma)
        elif last:
            args[index] = argument.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        else:
            args[index] = argument.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
    if call:
        if not per_line:
            args[-1] = args[-1].with_changes(whitespace_after_arg=newline(depth))
        return node.with_changes(args=args, whitespace_before_args=newline(depth + 1))
    opening, closing = (
        (cst.LeftCurlyBrace, cst.RightCurlyBrace)
        if isinstance(node, cst.Dict)
        else (cst.LeftSquareBracket, cst.RightSquareBracket)
    )
    return node.with_changes(
        elements=args,
        **{
            "lbrace" if isinstance(node, cst.Dict) else "lbracket": opening(
                whitespace_after=newline(depth + 1)
            ),
            "rbrace" if isinstance(node, cst.Dict) else "rbracket": closing(
                whitespace_before=newline(depth) if not per_line else cst.SimpleWhitespace("")
            ),
        },
    )
