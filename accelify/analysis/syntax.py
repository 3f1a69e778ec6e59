"""Small questions about libcst nodes, asked everywhere: the dotted name of an expression, the
names a target binds, a walk that skips libcst's per-attribute visitor hooks."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names


def dotted(node: cst.BaseExpression) -> str | None:
    """``model`` or ``self.model`` for a Name or an attribute chain of Names."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def root_name(node: cst.BaseExpression) -> str | None:
    """``batch`` for ``batch["x"]``, ``batch.x``, ``batch[0].y``."""
    while isinstance(node, (cst.Subscript, cst.Attribute)):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def strip_self_methods(node: cst.BaseExpression) -> cst.BaseExpression:
    """``Net().to(device).train()`` -> ``Net()``: calls that hand the module back."""
    while (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in names.MODULE_SELF_METHODS
    ):
        node = node.func.value
    return node


class Visitor(cst.CSTVisitor):
    """A libcst visitor without ``visit_<Node>_<attribute>`` hooks: libcst looks such hooks up by
    name for every attribute of every node, which is 40% of a walk; none of ours uses them."""

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


def target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        found: set[str] = set()
        for element in target.elements:
            found |= target_names(element.value)
        return found
    return set()


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and everything under it, in source order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def if_chain(node: cst.If) -> tuple[list[cst.BaseExpression], list[cst.BaseSuite], bool]:
    """An ``if``/``elif``/``else`` chain as its tests, its blocks (the ``else`` block last) and
    whether it ends in an ``else``."""
    tests, blocks = [node.test], [node.body]
    rest = node.orelse
    while isinstance(rest, cst.If):
        tests.append(rest.test)
        blocks.append(rest.body)
        rest = rest.orelse
    if rest is not None:
        blocks.append(rest.body)
    return tests, blocks, rest is not None


def is_docstring(line: cst.CSTNode) -> bool:
    return (
        isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
        and isinstance(line.body[0], cst.Expr)
        and isinstance(line.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
