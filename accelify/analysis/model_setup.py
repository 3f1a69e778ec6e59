"""The statements that finish building a model after the line that creates it.

``self.model = resnet50()`` is often followed, in the same block, by a backbone frozen
(``for p in self.model.parameters(): p.requires_grad = False``) and a new head
(``self.model.fc = nn.Linear(...)``). A ``prepare`` call placed right after the creating line
wraps the half-built model: the new head is then set on the wrapper (the wrapped model keeps its
old, frozen head, so nothing trains), and DDP registers the parameters that need a gradient
before the freeze. A model is prepared once such statements are done."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, if_chain

#: methods called on a model (or one of its parts) that change what it holds, not run it
_BUILDING_METHODS = frozenset(
    {
        "apply",
        "requires_grad_",
        "load_state_dict",
        "add_module",
        "register_module",
        "register_buffer",
        "register_parameter",
    }
)
#: methods whose result a loop freezes or unfreezes parameter by parameter
_PARAMETER_LISTS = frozenset(
    {"parameters", "named_parameters", "children", "modules", "named_children", "named_modules"}
)


def last_building_statement(model: ScriptModel, statement: cst.CSTNode, name: str) -> cst.CSTNode:
    """The last of the statements right after ``statement`` (which binds the model ``name``) in
    its block that only build the model further: ``statement`` itself when none does. The first
    statement that does anything else (runs the model, makes its optimizer) ends the run."""
    suite = model.parent(statement)
    lines = getattr(suite, "body", None)
    if not isinstance(lines, (list, tuple)) or statement not in lines:
        return statement
    last = statement
    for line in lines[lines.index(statement) + 1 :]:
        if not _builds(line, name):
            break
        last = line
    return last


def _builds(line: cst.CSTNode, name: str) -> bool:
    if isinstance(line, cst.SimpleStatementLine):
        return bool(line.body) and all(_builds_small(small, name) for small in line.body)
    if isinstance(line, cst.For):
        return _freezes_parameters(line, name)
    if isinstance(line, cst.If):
        _, blocks, _ = if_chain(line)
        return all(
            isinstance(block, cst.IndentedBlock)
            and all(_builds(inner, name) for inner in block.body)
            for block in blocks
        )
    return False


def _part_of(expression: cst.BaseExpression, name: str) -> bool:
    """``self.model.fc`` is a part of ``self.model``; ``self.model`` itself is not."""
    written = dotted(expression)
    return written is not None and written.startswith(name + ".")


def _builds_small(small: cst.BaseSmallStatement, name: str) -> bool:
    """``model.fc = nn.Linear(...)`` (a part replaced, not the model rebound) or
    ``model.apply(init)`` / ``model.backbone.requires_grad_(False)``; also a move of the model
    between them (``model.to(device)``, ``model = model.cuda()``), which the conversion removes:
    stopping there, the prepare went above the freeze and the new head, which DDP then never
    registered (on 2 ranks the new head trained apart on each rank, silently)."""
    if _moves(small, name):
        return True
    if isinstance(small, cst.Assign):
        return all(
            isinstance(target.target, cst.Attribute) and _part_of(target.target, name)
            for target in small.targets
        )
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = small.value.func
        return (
            isinstance(func, cst.Attribute)
            and func.attr.value in _BUILDING_METHODS
            and (_part_of(func.value, name) or dotted(func.value) == name)
        )
    return False


def _moves(small: cst.BaseSmallStatement, name: str) -> bool:
    """``model.to(device)`` / ``model.cuda()``, or ``model = model.to(device)``."""
    if isinstance(small, cst.Expr) or (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and dotted(small.targets[0].target) == name
    ):
        value = small.value
    else:
        return False
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _MOVES
        and dotted(value.func.value) == name
    )


#: methods that move a model to a device and return it
_MOVES = frozenset({"to", "cuda"})


def _freezes_parameters(loop: cst.For, name: str) -> bool:
    """``for p in model.parameters(): p.requires_grad = False`` (or of one of its parts): a loop
    over the model's parameters whose body only switches them on or off."""
    source = loop.iter
    if not (isinstance(source, cst.Call) and isinstance(source.func, cst.Attribute)):
        return False
    if source.func.attr.value not in _PARAMETER_LISTS:
        return False
    owner = source.func.value
    if not (dotted(owner) == name or _part_of(owner, name)):
        return False
    if not isinstance(loop.body, cst.IndentedBlock) or loop.orelse is not None:
        return False
    for line in loop.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            return False
        for small in line.body:
            if isinstance(small, cst.Assign) and all(
                isinstance(t.target, cst.Attribute) and t.target.attr.value == "requires_grad"
                for t in small.targets
            ):
                continue
            if (
                isinstance(small, cst.Expr)
                and isinstance(small.value, cst.Call)
                and isinstance(small.value.func, cst.Attribute)
                and small.value.func.attr.value == "requires_grad_"
            ):
                continue
            return False
    return True
