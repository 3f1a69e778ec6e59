"""libcst imported with its node classes' generated methods compiled once, not at every start.

libcst defines its ~200 node classes as dataclasses. For each, Python's ``dataclasses`` writes
the source of ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``... and
compiles it with ``exec`` of the text at import: ~1,000 compiles, about 0.05 CPU-s of libcst's
~0.13 (Python 3.11), paid by every ``accelify lint one_file.py`` that needs an analysis and by
every ``--jobs`` worker that is not forked.

The code ``exec`` compiles is a function of the text alone (``dataclasses`` has no
``from __future__`` import, so no compiler flag is inherited: `_compiled` compiles with none),
so it is kept, keyed by the text, in one file beside accelify's byte code (``__pycache__``, as
Python keeps ``.pyc`` files; named by the interpreter's cache tag and headed by its magic
number), and ``exec`` runs the kept code instead of compiling the text again. A text not kept
is compiled as before, so nothing kept can be wrong for another libcst: a changed method has
another text. Written only where Python writes byte code (not under ``PYTHONDONTWRITEBYTECODE``),
atomically, with the entries this import used (so the file never outgrows one libcst); a file
that cannot be read, written or trusted is ignored.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import sys
from collections.abc import Iterator
from types import CodeType, ModuleType
from typing import Any


def store_named(name: str) -> str:
    """A store in accelify's own byte-code folder, named for the interpreter as ``.pyc`` are."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    return os.path.join(folder, f"{name}_dataclasses.{sys.implementation.cache_tag}.bin")


#: Where libcst's methods are kept when libcst is imported alone (`load`)
STORE = store_named("libcst")


def load(store: str | None = STORE) -> ModuleType:
    """``import libcst``, its dataclasses' methods compiled from ``store`` where kept there.

    Only the first import is changed (later calls return the imported module). ``store=None``:
    a plain import."""
    if "libcst" not in sys.modules:
        with kept_compiles(store):
            import libcst
    import libcst

    return libcst


@contextlib.contextmanager
def kept_compiles(store: str | None) -> Iterator[None]:
    """While inside, the dataclasses defined (by the modules imported here) run their
    methods' code from ``store`` where it is kept there; ``store`` is rewritten after with the
    code used inside when some of it had to be compiled (a store is for one set of imports:
    another set's would evict it). ``store=None``, or another hook already in place: nothing
    changed. Another thread's dataclass made meanwhile gets the same code it would have
    compiled itself."""
    import dataclasses

    if store is None or "exec" in vars(dataclasses):
        yield
        return
    kept = _read(store)
    used: dict[str, CodeType] = {}
    missed = False

    def kept_exec(source: Any, globals: Any = None, locals: Any = None, /) -> None:
        nonlocal missed
        if globals is None:  # the caller's globals, as the builtin would take them
            globals = vars(dataclasses)
        if not isinstance(source, str):
            exec(source, globals, locals)
            return
        code = used.get(source) or kept.get(source)
        if code is None:
            code = _compiled(source)
            missed = True
        used[source] = code
        exec(code, globals, locals)

    dataclasses.exec = kept_exec  # type: ignore[attr-defined]  # found before the builtin
    try:
        yield
    finally:
        if vars(dataclasses).get("exec") is kept_exec:  # (another thread's may have replaced it)
            del dataclasses.exec  # type: ignore[attr-defined]
    if missed and not sys.dont_write_bytecode:
        _write(store, used)


def _compiled(source: str) -> CodeType:
    """What ``exec(source)`` in ``dataclasses`` compiles: no flag inherited from this module
    (its ``from __future__ import annotations`` would turn the methods' annotations into
    strings)."""
    return compile(source, "<string>", "exec", dont_inherit=True)


def _magic() -> bytes:
    from importlib.util import MAGIC_NUMBER

    return MAGIC_NUMBER


def _read(store: str) -> dict[str, CodeType]:
    try:
        with open(store, "rb") as file:
            data = file.read()
    except OSError:
        return {}
    magic = _magic()
    if not data.startswith(magic):
        return {}
    try:
        kept = marshal.loads(data[len(magic) :])
    except (EOFError, ValueError, TypeError):
        return {}
    if not isinstance(kept, dict):
        return {}
    return {
        text: code
        for text, code in kept.items()
        if isinstance(text, str) and isinstance(code, CodeType)
    }


def _write(store: str, used: dict[str, CodeType]) -> None:
    """Replaced whole, never half-written: another process reads the old file or the new."""
    partial = f"{store}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(store), exist_ok=True)
        with open(partial, "wb") as file:
            file.write(_magic() + marshal.dumps(used))
        os.replace(partial, store)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(partial)
