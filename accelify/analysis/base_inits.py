"""Whether a subclass's instances run a base class's ``__init__``. The conversion creates a
trainer's ``self.accelerator`` in its constructor; a subclass whose own ``__init__`` does not
call the base's (``super().__init__()``, ``Base.__init__(self)``) makes instances without it,
and the methods they inherit fail with AttributeError at their first use of it."""

from __future__ import annotations

from typing import Protocol

import libcst as cst

from accelify.analysis.syntax import dotted


class _Bases(Protocol):
    def bases(self, owner: cst.ClassDef) -> list[cst.ClassDef]: ...

    def is_or_derives(self, cls: cst.ClassDef, base: cst.ClassDef) -> bool: ...


def own_init(cls: cst.ClassDef) -> cst.FunctionDef | None:
    """The ``__init__`` defined in ``cls``'s own body (the last one, as Python keeps it)."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    found = [m for m in body if isinstance(m, cst.FunctionDef) and m.name.value == "__init__"]
    return found[-1] if found else None


def base_init_run(init: cst.FunctionDef, cls: cst.ClassDef) -> str | None:
    """The base of ``cls`` whose constructor ``init`` always runs, as ``cls`` spells it:
    ``Base.__init__(self, ...)`` names it; ``super().__init__(...)`` (``super(Cls, self)`` too)
    runs the next class of the instance's order, the first base. Only a call that is a statement
    of ``init``'s own body counts: one under an ``if`` (``if fresh: super().__init__()``), a
    loop, a ``try`` or a nested function may not run, and ``Mixin.__init__(self)`` of
    ``class Logged(Mixin, Trainer)`` runs the mixin's alone (Trainer's never ran: the
    inherited ``train()`` raised AttributeError on ``self.accelerator``)."""
    bases = [dotted(base.value) for base in cls.bases if base.keyword is None]
    body = init.body.body if isinstance(init.body, cst.IndentedBlock) else [init.body]
    for line in body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            call = small.value if isinstance(small, cst.Expr) else None
            if not (
                isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "__init__"
            ):
                continue
            receiver = call.func.value
            if isinstance(receiver, cst.Call) and dotted(receiver.func) == "super":
                return bases[0] if bases else None
            if dotted(receiver) in bases:
                return dotted(receiver)
    return None


def runs_init_of(graph: _Bases, cls: cst.ClassDef, owner: cst.ClassDef, depth: int = 0) -> bool:
    """An instance of ``cls`` (``owner`` or a subclass of it in the file) runs ``owner``'s
    ``__init__``: every ``__init__`` on the way down from ``cls`` to ``owner`` runs the base's
    that leads to ``owner`` (`base_init_run`). A class without one of its own runs the first
    base's in its order; a base of the file that defines none anywhere up its chain is passed
    over, as Python does; a base of another module may define one, so the chain stops there."""
    if cls is owner:
        return True
    if depth > 20:
        return False
    known = {base.name.value: base for base in graph.bases(cls)}
    init = own_init(cls)
    if init is not None:
        run = base_init_run(init, cls)
        base = known.get(run) if run is not None else None
        return base is not None and runs_init_of(graph, base, owner, depth + 1)
    for spelled in (dotted(base.value) for base in cls.bases if base.keyword is None):
        if spelled == "object":
            continue
        base = known.get(spelled)  # type: ignore[arg-type]
        if base is None:
            return False
        if graph.is_or_derives(base, owner):
            return runs_init_of(graph, base, owner, depth + 1)
        if _defines_init(graph, base, depth + 1):
            return False
    return False


def _defines_init(graph: _Bases, cls: cst.ClassDef, depth: int) -> bool:
    """``cls`` or a class up its chain defines an ``__init__`` (one of another module may)."""
    if own_init(cls) is not None or depth > 20:
        return True
    spelled = [dotted(b.value) for b in cls.bases if b.keyword is None]
    known = {base.name.value: base for base in graph.bases(cls)}
    return any(
        name not in ("object", "ABC", "abc.ABC")
        and (name not in known or _defines_init(graph, known[name], depth + 1))  # type: ignore[operator]
        for name in spelled
    )
