"""Trainers whose own ``prepare`` hands everything to their accelerator's: ``def prepare(self,
*args): return self.accelerator.prepare(*args)``, defined by the class, a base class of the
file, or a base class imported from another module of the project (a package's
``BaseAcceleratedTrainer``, whose subclasses call ``self.model, self.optim, ... =
self.prepare(...)``). Such a ``self.prepare(...)`` is an ``accelerator.prepare`` call: what it
returns is prepared (`ScriptModel.prepare_calls`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.syntax import dotted

if TYPE_CHECKING:
    from accelify.analysis.script_model import ScriptModel

#: How many base classes up a ``prepare`` method is looked for.
_DEPTH = 3


def classes_wrapping_prepare(model: ScriptModel) -> set[int]:
    """The ids of the file's classes whose instances' ``self.prepare(...)`` is their
    accelerator's ``prepare``; none in a file that calls no ``self.prepare(`` (most)."""
    if "self.prepare(" not in model.source:
        return set()
    return {
        id(cls)
        for cls in model.index.of_type(cst.ClassDef)
        if isinstance(cls, cst.ClassDef) and _wraps_prepare(model, cls, _DEPTH)
    }


def _wraps_prepare(model: ScriptModel, cls: cst.ClassDef, depth: int) -> bool:
    method = next(
        (
            statement
            for statement in cls.body.body
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "prepare"
        ),
        None,
    )
    if method is not None:
        return _delegates(method)
    if depth == 0:
        return False
    local = {
        c.name.value: c for c in model.module.body if isinstance(c, cst.ClassDef) and c is not cls
    }
    for base in cls.bases:
        name = dotted(base.value)
        if name is None:
            continue
        if name in local:
            if _wraps_prepare(model, local[name], depth - 1):
                return True
            continue
        imported = model.project.imported_class(model, name) if model.project else None
        if imported is not None and _wraps_prepare(imported[0], imported[1], depth - 1):
            return True
    return False


def _delegates(method: cst.FunctionDef) -> bool:
    """``def prepare(self, *args): return self.accelerator.prepare(*args)`` (a docstring
    before the ``return`` aside): every argument goes to the accelerator's ``prepare``, and
    its result comes back."""
    statements = [
        s
        for s in method.body.body
        if not (
            isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.Expr)
            and isinstance(s.body[0].value, cst.SimpleString | cst.ConcatenatedString)
        )
    ]
    if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
        return False
    returned = statements[0].body[0]
    if not isinstance(returned, cst.Return) or not isinstance(returned.value, cst.Call):
        return False
    call = returned.value
    func = call.func
    receiver = dotted(func.value) if isinstance(func, cst.Attribute) else None
    if (
        receiver is None
        or not isinstance(func, cst.Attribute)
        or func.attr.value != "prepare"
        or not receiver.startswith("self.")
        or not receiver.endswith("accelerator")
    ):
        return False
    star = method.params.star_arg
    if not isinstance(star, cst.Param):
        return False
    return any(a.star == "*" and dotted(a.value) == star.name.value for a in call.args)
