"""Whether a driver's read of a file already waits for the module it trains through: a
``trainer.accelerator.wait_for_everyone()`` stands before it, with nothing in between that may
run that module again (and write the file anew). The driver's conversion places exactly that
barrier before such a read; without this test, converting the converted driver adds another
one each time (trial20: ``accelify convert --check`` never passed on a converted project)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, walk


def waited_before(model: ScriptModel, statement: cst.CSTNode, acc: str) -> bool:
    """A barrier on ``acc`` (``trainer.accelerator``, or a name bound to it) runs before
    ``statement`` on the way to it: above it in its block, or above the ``if``/``with`` that
    holds the block, and nothing between them calls anything that may reach the project's
    other modules (a method of the trainer, a function of this file or another module). The
    walk stops at a loop or a function: an earlier round, or a caller, may have written the
    file again after the barrier."""
    outside = {id(call) for call, _, _ in facts_of(model).project_calls}
    node = statement
    while True:
        block = model.parent(node)
        if not isinstance(block, (cst.Module, cst.IndentedBlock)):
            return False
        above = block.body[: next(i for i, s in enumerate(block.body) if s is node)]
        for earlier in _reversed_units(above):
            if _barrier(model, earlier, acc):
                return True
            if not _runs_nothing_of_the_project(model, earlier, outside):
                return False
        if isinstance(block, cst.Module):
            return False
        climbed = _through_its_header(model, model.parent(block))
        if climbed is None:
            return False
        node, heads = climbed
        if not all(_runs_nothing_of_the_project(model, head, outside) for head in heads):
            return False


def _reversed_units(statements: list[cst.BaseStatement]) -> Iterator[cst.CSTNode]:
    """The statements last first, each small statement of a ``a(); b()`` line on its own."""
    for line in reversed(statements):
        if isinstance(line, cst.SimpleStatementLine):
            yield from reversed(line.body)
        else:
            yield line


def _through_its_header(
    model: ScriptModel, owner: cst.CSTNode | None
) -> tuple[cst.CSTNode, list[cst.CSTNode]] | None:
    """The statement that holds a block run once on the way through (``if``/``elif``/``else``,
    ``with``), and the expressions its header ran first (each test of the ``if`` chain, the
    ``with`` items); None for a loop, a function, a ``try``'s handlers and the like."""
    if isinstance(owner, cst.With):
        return owner, list(owner.items)
    if isinstance(owner, cst.Else):
        owner = model.parent(owner)
        if not isinstance(owner, cst.If):
            return None  # a loop's or a try's ``else``
    if not isinstance(owner, cst.If):
        return None
    heads: list[cst.CSTNode] = [owner.test]
    parent = model.parent(owner)
    while isinstance(parent, cst.If) and parent.orelse is owner:  # an ``elif``
        owner = parent
        heads.append(owner.test)
        parent = model.parent(owner)
    return owner, heads


def _barrier(model: ScriptModel, node: cst.CSTNode, acc: str) -> bool:
    if not (isinstance(node, cst.Expr) and isinstance(node.value, cst.Call)):
        return False
    func = node.value.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "wait_for_everyone"):
        return False
    receiver = dotted(func.value)
    if receiver == acc:
        return True
    # ``accelerator = trainer.accelerator`` (every binding of the name is that chain)
    if receiver is None or model.index.unpacked_assignments_to(receiver):
        return False
    bindings = model.index.assignments_to(receiver)
    return bool(bindings) and all(dotted(b.value) == acc for b in bindings)


def _runs_nothing_of_the_project(model: ScriptModel, node: cst.CSTNode, outside: set[int]) -> bool:
    """Every call in ``node`` is a builtin's or an imported library's (``os.path.join``,
    ``torch.load``), none of another project module (``outside``): nothing there may run the
    module that writes the file. A method of an object (``trainer.fit()``), a function of this
    file, or anything not resolved counts as running it."""
    for call in walk(node):
        if not isinstance(call, cst.Call):
            continue
        if id(call) in outside:
            return False
        name = dotted(call.func)
        if name is None:
            return False
        qualified = model.call_names(call)
        if not any(q.startswith("builtins.") for q in qualified) and (
            name.split(".")[0] not in model.imports.bound
        ):
            return False
    return True
