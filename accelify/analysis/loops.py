"""What a ``for`` loop reads and binds, and whether it trains: the loader behind
``enumerate(tqdm(loader))``, the batch names, the ``.backward()`` calls of its own body."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.syntax import Visitor, dotted, result_used, visit_code

if TYPE_CHECKING:
    from accelify.analysis.script_model import Loop


def loop_source(node: cst.BaseExpression) -> str | None:
    """The loader a ``for`` reads: ``loader``, ``enumerate(loader)``, ``tqdm(loader, ...)``, or
    the dict ``loaders[phase]`` reads one from."""
    if isinstance(node, cst.Call) and node.args:
        return loop_source(node.args[0].value)
    if isinstance(node, cst.Subscript):
        return dotted(node.value)
    return dotted(node)


def entry_read(module: cst.Module, node: cst.BaseExpression) -> str | None:
    """``loaders["train"]`` of ``for batch in enumerate(loaders["train"]):``, one entry of a dict
    at a constant key, spelled as a prepare that assigns back into it records its output
    (``loaders["train"], model = accelerator.prepare(loaders["train"], model)``)."""
    while isinstance(node, cst.Call) and node.args:
        node = node.args[0].value
    if not (isinstance(node, cst.Subscript) and len(node.slice) == 1):
        return None
    index = node.slice[0].slice
    if not (isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString)):
        return None
    if dotted(node.value) is None:
        return None
    return module.code_for_node(node).replace("'", '"')


def phase_name(node: cst.BaseExpression) -> str | None:
    """``phase`` of ``for x, y in loaders[phase]:`` (also inside ``tqdm(...)``,
    ``enumerate(...)``): each phase reads its own loader."""
    while isinstance(node, cst.Call) and node.args:
        node = node.args[0].value
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.Name):
            return index.value.value
    return None


def iterated_expression(loop: Loop) -> cst.BaseExpression:
    """What ``loop`` reads, as written where it is chosen: the value of the name it iterates
    where that name is seen through (``loader = loaders[split]`` then ``for x, y in loader:``
    reads ``loaders[split]``), else its own iterable."""
    return loop.through if loop.through is not None else loop.node.iter


def enumerates(node: cst.BaseExpression) -> bool:
    """``enumerate(loader)``, also under the wrappers ``loop_source`` sees through
    (``tqdm(enumerate(loader))``): the loop's first name is a count, not part of the batch."""
    while isinstance(node, cst.Call) and node.args:
        if dotted(node.func) == "enumerate":
            return True
        node = node.args[0].value
    return False


def enumerate_start(loop: Loop) -> int | None:
    """Where the ``enumerate`` of ``loop`` (its iterable, or what a bar wraps) counts from: 0
    unless a ``start`` is given (``enumerate(loader, start=1)``, ``enumerate(loader, 1)``);
    None where the loop enumerates nothing or starts at a value not written out."""
    sources = [loop.node.iter] + ([loop.through] if loop.through is not None else [])
    for node in sources:
        while isinstance(node, cst.Call) and node.args:
            if dotted(node.func) == "enumerate":
                start = [
                    a for a in node.args[1:] if a.keyword is None or a.keyword.value == "start"
                ]
                if not start:
                    return 0
                value = start[0].value
                return int(value.value) if isinstance(value, cst.Integer) else None
            node = node.args[0].value
    return None


def first_enumerate_name(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
        first = target.elements[0].value
        if isinstance(first, cst.Name):
            return {first.value}
    return set()


def find_backward(node: cst.CSTNode, skip_loops: bool = False) -> Iterator[cst.Call]:
    """``.backward()`` calls under ``node``; with ``skip_loops``, not those of nested loops."""
    finder = _BackwardFinder(skip_loops)
    visit_code(node, finder)
    yield from finder.found


class _BackwardFinder(Visitor):
    def __init__(self, skip_loops: bool) -> None:
        self.skip_loops = skip_loops
        self.found: list[cst.Call] = []
        #: what holds each call that is a statement or a lambda's body (see syntax.result_used)
        self.holders: dict[int, cst.CSTNode] = {}

    def visit_For(self, loop: cst.For) -> bool:
        return not self.skip_loops

    def visit_While(self, loop: cst.While) -> bool:
        return not self.skip_loops

    def visit_Expr(self, node: cst.Expr) -> None:
        self.holders[id(node.value)] = node

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.holders[id(node.body)] = node

    def visit_Call(self, call: cst.Call) -> None:
        if result_used(call, self.holders.get(id(call))):  # ``z = flow.backward(z)[0]``
            return
        if (isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward") or (
            dotted(call.func) and str(dotted(call.func)).endswith(".backward")
        ):
            self.found.append(call)
