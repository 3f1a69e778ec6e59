"""Apply a `Plan` to the tree in one pass.

Replacements are functions of the *updated* node, so edits nested inside an edited node survive.
Statements are never removed by their own ``leave_*``; their block drops them, moving the
comment lines above a dropped statement onto the next one, and puts ``pass`` in a block that
would be left empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import libcst as cst

from accelify.edits.fstring_quotes import requote_inside_fstrings
from accelify.edits.plan import Plan

if TYPE_CHECKING:
    from libcst.metadata import CodeRange


class ApplyPlan(cst.CSTTransformer):
    """``position``: where each node of the module being changed stands (the analysis's
    `ScriptModel.position`); with it, a call whose name the plan changes keeps the argument
    lines the user aligned under its opening bracket aligned there (`_realigned`)."""

    def __init__(
        self, plan: Plan, position: Callable[[cst.CSTNode], CodeRange] | None = None
    ) -> None:
        self.plan = plan
        self.position = position
        self._default_indent = "    "
        self._indents: list[str] = []  # the blocks around the node being left

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Module):
            self._default_indent = node.default_indent
        elif isinstance(node, cst.IndentedBlock):
            self._indents.append(node.indent if node.indent is not None else self._default_indent)
        return super().on_visit(node)

    def on_leave(
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        if isinstance(original_node, cst.IndentedBlock):
            self._indents.pop()
        rewrite = self.plan.rewrite_of(original_node)
        if rewrite is not None:
            rewritten = rewrite(updated_node)
            if isinstance(original_node, cst.Call) and isinstance(rewritten, cst.Call):
                rewritten = self._realigned(original_node, rewritten)
            updated_node = rewritten
        parameter = self.plan.new_parameter(original_node)
        if isinstance(original_node, cst.FunctionDef) and parameter is not None:
            updated_node = _add_parameter(updated_node, parameter)
        if isinstance(original_node, (cst.IndentedBlock, cst.Module)):
            updated_node = self._rebuild_body(original_node, updated_node)
        if isinstance(updated_node, cst.Module):  # every edit is in: the strings they put in
            updated_node = requote_inside_fstrings(updated_node)
        return updated_node

    def _realigned(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``print(f"..."`` / ``      f"...")`` -> ``accelerator.print(f"..."`` /
        ``                  f"...")``: where the user put the first argument beside the
        opening bracket and the lines after it under that argument (or further right), a new
        name of another length moves the bracket, and those lines move with it, as far; lines
        left of it (a hanging indent, a closing bracket) stay. A layout that lines up nothing
        with the bracket is kept as it is."""
        code = cst.Module([]).code_for_node
        old_head, new_head = code(original.func), code(updated.func)
        delta = len(new_head) - len(old_head)
        if (
            self.position is None
            or delta == 0
            or "\n" in old_head + new_head
            or isinstance(original.whitespace_before_args, cst.ParenthesizedWhitespace)
            or code(original.whitespace_after_func) != code(updated.whitespace_after_func)
            or "\n" not in code(updated)
        ):
            return updated
        column = (
            self.position(original.func).start.column
            + len(old_head)
            + len(code(original.whitespace_after_func))
            + 1  # the bracket
            + len(code(original.whitespace_before_args))
        )
        shift = _Shift("".join(self._indents), column, delta)
        first = _first_line_break(original)
        if first is None or shift.column_of(first) < column:
            return updated  # not laid out under the bracket
        return updated.with_changes(args=[argument.visit(shift) for argument in updated.args])

    def _rebuild_body(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
        old_body: Sequence[cst.CSTNode] = original.body  # type: ignore[attr-defined]
        new_body: Sequence[cst.CSTNode] = updated.body  # type: ignore[attr-defined]
        if len(old_body) != len(new_body):  # pragma: no cover - statements are never removed
            return updated
        rebuilt: list[tuple[cst.CSTNode, str | None]] = []
        carried_comments: list[cst.EmptyLine] = []
        for old, new in zip(old_body, new_body, strict=True):
            # A deferred insert is built now, from nodes this pass has already rewritten.
            inserted = [
                item() if callable(item) else item for item in self.plan.inserted_before(old)
            ]
            if inserted:
                # Blank lines that separated this statement from the one above now separate
                # the inserted code; comments stay with the statement they describe.
                blank, new = _split_leading_blank_lines(new)
                inserted = [_with_leading(inserted[0], blank), *inserted[1:]]
            rebuilt.extend((node, None) for node in inserted)
            if self.plan.removes(old):
                carried_comments.extend(_comment_lines(new))
            else:
                if carried_comments:
                    new = _with_leading(new, carried_comments)
                    carried_comments = []
                rebuilt.append((new, self.plan.block_around(old)))
            after = self.plan.inserted_after(old)
            rebuilt.extend((item() if callable(item) else item, None) for item in after)
        return _with_body(updated, _fold_guards(rebuilt))


class _Shift(cst.CSTTransformer):
    """Moves each line break's next line that starts at ``column`` or right of it (inside
    ``indent``, the blocks around the statement) by ``delta`` columns."""

    def __init__(self, indent: str, column: int, delta: int) -> None:
        self.indent, self.column, self.delta = indent, column, delta

    def column_of(self, node: cst.ParenthesizedWhitespace) -> int:
        return (len(self.indent) if node.indent else 0) + len(node.last_line.value)

    def leave_ParenthesizedWhitespace(
        self, original_node: cst.ParenthesizedWhitespace, updated_node: cst.ParenthesizedWhitespace
    ) -> cst.ParenthesizedWhitespace:
        spaces = updated_node.last_line.value
        if (
            self.column_of(updated_node) < self.column
            or len(spaces) + self.delta < 0
            or "\t" in spaces + self.indent  # columns counted in spaces only
        ):
            return updated_node
        moved = " " * (len(spaces) + self.delta)
        return updated_node.with_changes(last_line=cst.SimpleWhitespace(moved))


def _first_line_break(call: cst.Call) -> cst.ParenthesizedWhitespace | None:
    """The first line break inside ``call``'s arguments, in source order."""
    pending: list[cst.CSTNode] = list(reversed(call.args))
    while pending:
        node = pending.pop()
        if isinstance(node, cst.ParenthesizedWhitespace):
            return node
        pending.extend(reversed(node.children))
    return None


def _block_header(kind: str, code: str, body: list[cst.CSTNode], leading) -> cst.CSTNode:
    block = cst.IndentedBlock(body)  # type: ignore[arg-type]
    if kind == "with":
        item = cst.WithItem(cst.parse_expression(code))
        return cst.With(items=[item], body=block, leading_lines=leading)
    return cst.If(test=cst.parse_expression(code), body=block, leading_lines=leading)


def _with_body(updated: cst.CSTNode, rebuilt: list[cst.CSTNode]) -> cst.CSTNode:
    if isinstance(updated, cst.Module):
        return updated.with_changes(body=rebuilt)
    if not rebuilt:
        rebuilt = [cst.SimpleStatementLine([cst.Pass()])]
    return updated.with_changes(body=rebuilt)


def _fold_guards(
    statements: list[tuple[cst.CSTNode, tuple[str, str] | None]],
) -> list[cst.CSTNode]:
    """Consecutive statements guarded by the same test go under one ``if`` of that test, and
    consecutive ones run in the same context under one ``with``."""
    folded: list[cst.CSTNode] = []
    group: list[cst.CSTNode] = []
    test: tuple[str, str] | None = None
    for node, guard in [*statements, (None, None)]:
        if group and guard != test:
            first = group[0]
            body = [first.with_changes(leading_lines=[]), *group[1:]]  # type: ignore[attr-defined]
            leading = getattr(first, "leading_lines", ())
            folded.append(_block_header(*test, body, leading))  # type: ignore[misc]
            group = []
        if node is None:
            break
        if guard is None:
            folded.append(node)
        else:
            group.append(node)
        test = guard
    return folded


def _split_leading_blank_lines(node: cst.CSTNode) -> tuple[list[cst.EmptyLine], cst.CSTNode]:
    leading = list(getattr(node, "leading_lines", ()))
    count = 0
    while count < len(leading) and leading[count].comment is None:
        count += 1
    if count == 0:
        return [], node
    return leading[:count], node.with_changes(leading_lines=leading[count:])  # type: ignore[attr-defined]


def _comment_lines(node: cst.CSTNode) -> list[cst.EmptyLine]:
    leading = getattr(node, "leading_lines", ())
    return [line for line in leading if line.comment is not None]


def _with_leading(node: cst.CSTNode, lines: list[cst.EmptyLine]) -> cst.CSTNode:
    if not hasattr(node, "leading_lines"):
        return node
    return node.with_changes(leading_lines=[*lines, *node.leading_lines])  # type: ignore[attr-defined]


def _add_parameter(function: cst.FunctionDef, name: str) -> cst.FunctionDef:
    """Add ``name`` as the last positional parameter; keyword-only (after ``*`` or ``*args``)
    when a positional one cannot follow: after defaulted parameters, ``*args`` or keyword-only
    ones. Call sites pass it by keyword, so either binds."""
    params = function.params
    star = params.star_arg
    existing = {
        p.name.value
        for p in (*params.params, *params.kwonly_params, *params.posonly_params, star)
        if isinstance(p, cst.Param)
    }
    if isinstance(params.star_kwarg, cst.Param):
        existing.add(params.star_kwarg.name.value)
    if name in existing:
        return function
    new_param = cst.Param(cst.Name(name))
    defaulted = any(p.default is not None for p in (*params.posonly_params, *params.params))
    if defaulted or star is not cst.MaybeSentinel.DEFAULT or params.kwonly_params:
        if star is cst.MaybeSentinel.DEFAULT:
            star = cst.ParamStar()
        changed = params.with_changes(
            star_arg=star, kwonly_params=[*params.kwonly_params, new_param]
        )
    else:
        changed = params.with_changes(params=[*params.params, new_param])
    return function.with_changes(params=_with_commas(params, changed))


_PARAMETER_FIELDS = ("posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params")


def _elements(params: cst.Parameters) -> list[tuple[str, int]]:
    """(field, index) of each comma-bearing part of a signature, in source order."""
    found = []
    for name in (*_PARAMETER_FIELDS, "star_kwarg"):
        value = getattr(params, name)
        if isinstance(value, (list, tuple)):
            found += [(name, index) for index in range(len(value))]
        elif isinstance(value, (cst.Param, cst.ParamStar, cst.ParamSlash)):
            found.append((name, -1))
    return found


def _get(params: cst.Parameters, where: tuple[str, int]) -> cst.CSTNode:
    value = getattr(params, where[0])
    return value if where[1] < 0 else value[where[1]]


def _set(params: cst.Parameters, where: tuple[str, int], node: cst.CSTNode) -> cst.Parameters:
    name, index = where
    if index < 0:
        return params.with_changes(**{name: node})
    items = list(getattr(params, name))
    items[index] = node
    return params.with_changes(**{name: items})


def _with_commas(original: cst.Parameters, changed: cst.Parameters) -> cst.Parameters:
    """Commas laid out as the user laid out the original: the separator they used between
    parameters (one per line, or ``, ``), and their trailing comma, if any, on the new last."""
    old = [_get(original, where) for where in _elements(original)]
    commas = [getattr(node, "comma", cst.MaybeSentinel.DEFAULT) for node in old]
    separator = next(
        (c for c in commas[:-1] if isinstance(c, cst.Comma)),
        cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
    )
    trailing = commas[-1] if commas else cst.MaybeSentinel.DEFAULT
    places = _elements(changed)
    for position, where in enumerate(places):
        node = _get(changed, where)
        last = position == len(places) - 1
        if last:
            comma = trailing
        elif any(node is kept for kept in old[:-1]):
            continue
        else:
            comma = separator
        changed = _set(changed, where, node.with_changes(comma=comma))
    return changed
