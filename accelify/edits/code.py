"""Code as text -> libcst nodes, written as a formatter writes it."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst


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
