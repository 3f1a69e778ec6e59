"""Strings an edit puts inside an f-string's replacement field take the other quote.

Before Python 3.12 a replacement field cannot hold the quote its f-string is written with:
``f"{send_to_device(model(x), "cpu")}"`` does not parse on 3.11. The edits (of a conversion and
of lint's fixes alike) build their strings with double quotes (``"cpu"``) wherever they land;
the original script could not have had such a string there, so every one found is an edit's, and
``'cpu'`` means the same."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.syntax import walk


def requote_inside_fstrings(module: cst.Module) -> cst.Module:
    """Most modules hold no string inside an f-string's replacement field: a walk that
    rebuilds nothing finds that out, and the transform (which rebuilds every node, a twelfth
    of a conversion's time) runs only where there is one."""
    if not any(_holds_a_string(node) for node in walk(module) if _is_fstring(node)):
        return module
    return module.visit(_Requote())


def _is_fstring(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.FormattedString)


def _holds_a_string(fstring: cst.CSTNode) -> bool:
    return any(isinstance(node, cst.SimpleString) for node in walk(fstring))


def requote(statement: cst.CSTNode) -> cst.CSTNode:
    """`requote_inside_fstrings` over one statement or block (never inside an f-string)."""
    return statement.visit(_Requote())  # type: ignore[return-value]


class _Requote(cst.CSTTransformer):
    def __init__(self) -> None:
        super().__init__()
        self.quotes: list[str] = []  # the quote of each f-string we are inside, innermost last

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        self.quotes.append(node.quote)

    def leave_FormattedString(
        self, original_node: cst.FormattedString, updated_node: cst.FormattedString
    ) -> cst.FormattedString:
        self.quotes.pop()
        return updated_node

    def leave_SimpleString(
        self, original_node: cst.SimpleString, updated_node: cst.SimpleString
    ) -> cst.SimpleString:
        if not self.quotes or len(updated_node.quote) != 1:
            return updated_node
        quote = updated_node.quote
        if quote not in self.quotes:
            return updated_node
        other = "'" if quote == '"' else '"'
        prefix = updated_node.prefix
        body = updated_node.value[len(prefix) + 1 : -1]
        if other in self.quotes or other in body or "\\" in body:
            return updated_node  # no quote left that parses: the check after says so
        return updated_node.with_changes(value=f"{prefix}{other}{body}{other}")
