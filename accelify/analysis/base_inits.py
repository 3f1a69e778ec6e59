"""Whether a subclass's instances run a base class's ``__init__``. The conversion creates a
trainer's ``self.accelerator`` in its constructor; a subclass whose own ``__init__`` does not
call the base's (``super().__init__()``, ``Base.__init__(self)``) makes instances without it,
and the methods they inherit fail with AttributeError at their first use of it."""

from __future__ import annotations

from typing import Protocol

import libcst as cst

from accelify.analysis.syntax import dotted, walk


class _Bases(Protocol):
    def bases(self, owner: cst.ClassDef) -> list[cst.ClassDef]: ...

    def is_or_derives(self, cls: cst.ClassDef, base: cst.ClassDef) -> bool: ...


def own_init(cls: cst.ClassDef) -> cst.FunctionDef | None:
    """The ``__init__`` defined in ``cls``'s own body (the last one, as Python keeps it)."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    found = [m for m in body if isinstance(m, cst.FunctionDef) and m.name.value == "__init__"]
    return found[-1] if found else None


def calls_base_init(init: cst.FunctionDef, cls: cst.ClassDef) -> bool:
    """``init`` calls a base's constructor: ``super().__init__(...)`` (``super(Cls,
    self)`` too) or ``Base.__init__(self, ...)`` of a base ``cls`` names."""
    bases = {dotted(base.value) for base in cls.bases} - {None}
    for node in walk(init):
        if not (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "__init__"
        ):
            continue
        receiver = node.func.value
        if isinstance(receiver, cst.Call) and dotted(receiver.func) == "super":
            return True
        if dotted(receiver) in bases:
            return True
    return False


def runs_init_of(graph: _Bases, cls: cst.ClassDef, owner: cst.ClassDef, depth: int = 0) -> bool:
    """An instance of ``cls`` (``owner`` or a subclass of it in the file) runs ``owner``'s
    ``__init__``: every ``__init__`` on the way down from ``cls`` to ``owner`` calls its
    base's, or the class has none of its own (Python runs the base's)."""
    if cls is owner:
        return True
    if depth > 20:
        return False
    init = own_init(cls)
    if init is not None and not calls_base_init(init, cls):
        return False
    return any(
        runs_init_of(graph, base, owner, depth + 1)
        for base in graph.bases(cls)
        if graph.is_or_derives(base, owner)
    )
