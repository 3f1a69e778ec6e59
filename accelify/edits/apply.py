"""Apply a `Plan` to the tree in one pass.

Replacements are functions of the *updated* node, so edits nested inside an edited node survive.
Statements are never removed by their own ``leave_*``; their block drops them, moving the
comment lines above a dropped statement onto the next one, and puts ``pass`` in a block that
would be left empty.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from accelify.edits.fstring_quotes import requote_inside_fstrings
from accelify.edits.plan import Plan


class ApplyPlan(cst.CSTTransformer):
    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def on_leave(
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        rewrite = self.plan.rewrite_of(original_node)
        if rewrite is not None:
            updated_node = rewrite(updated_node)
        parameter = self.plan.new_parameter(original_node)
        if isinstance(original_node, cst.FunctionDef) and parameter is not None:
            updated_node = _add_parameter(updated_node, parameter)
        if isinstance(original_node, (cst.IndentedBlock, cst.Module)):
            updated_node = self._rebuild_body(original_node, updated_node)
        if isinstance(updated_node, cst.Module):  # every edit is in: the strings they put in
            updated_node = requote_inside_fstrings(updated_node)
        return updated_node

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
