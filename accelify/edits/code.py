"""Code as text -> libcst nodes, written as a formatter writes it."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst


def with_keyword(args: Sequence[cst.Arg], name: str, value: cst.BaseExpression) -> list[cst.Arg]:
    """``args`` plus ``name=value``, written as a formatter writes it (no spaces around ``=``).

    In a call written one argument a line, the line break before ``)`` belongs to the last
    argument (or to its trailing comma): it moves to the new argument, which goes on a line of
    its own and keeps the trailing comma if there was one. Left where it was, the new argument
    would follow a comma and a trailing space on the closing parenthesis's line (or start that
    line unindented)."""
    result = list(args)
    closing: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace("")
    comma: cst.Comma | cst.MaybeSentinel = cst.MaybeSentinel.DEFAULT
    if result:
        last = result[-1]
        between: cst.BaseParenthesizableWhitespace = cst.SimpleWhitespace(" ")
        if isinstance(last.comma, cst.Comma):
            comma = last.comma  # the trailing comma, and the break after it, go to the new one
            if _breaks_line(last.comma.whitespace_after):
                between = _line_between(result) or between
        elif _breaks_line(last.whitespace_after_arg):
            closing = last.whitespace_after_arg
            between = _line_between(result) or between
            last = last.with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
        result[-1] = last.with_changes(comma=cst.Comma(whitespace_after=between))
    tight = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
    added = cst.Arg(
        value, keyword=cst.Name(name), equal=tight, comma=comma, whitespace_after_arg=closing
    )
    return [*result, added]


def _breaks_line(whitespace: cst.BaseParenthesizableWhitespace) -> bool:
    return isinstance(whitespace, cst.ParenthesizedWhitespace)


def _line_between(args: Sequence[cst.Arg]) -> cst.BaseParenthesizableWhitespace | None:
    """The line break (and indent) after the other arguments' commas, when they have one."""
    for arg in args[:-1]:
        if isinstance(arg.comma, cst.Comma) and _breaks_line(arg.comma.whitespace_after):
            return arg.comma.whitespace_after
    return None


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def expression(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)
