"""libcst imported with its node classes' generated methods compiled once, not at every start.

libcst defines its ~200 node classes as dataclasses. For each, Python's ``dataclasses`` writes
the source of ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``... and
compiles it with ``exec`` of the text at import: ~1,000 compiles, about 0.05 CPU-s of libcst's
~0.13 (Python 3.11), paid by every ``accelify lint one_file.py`` that needs an analysis and by
every ``--jobs`` worker that is not forked (`accelify.lint.engine` imports through here).

The code ``exec`` compiles is a function of the text alone (``dataclasses`` has no
``from __future__`` import, so no compiler flag is inherited: `_compiled` compiles with none),
so it is kept, keyed by the text, in one file in the user's cache folder (`cache_folder`; not
beside accelify's byte code: ``pip uninstall`` would leave it behind, and a read-only install
could not keep it), named by accelify's version and the interpreter's cache tag, headed by the
interpreter's magic number and a digest of the rest; ``exec`` runs the kept code instead of
compiling the text again. A text not kept is compiled as before, so nothing kept can be wrong
for another libcst: a changed method has another text. Written only where Python writes byte
code (not under ``PYTHONDONTWRITEBYTECODE``), atomically, with the entries this import used
(so the file never outgrows one libcst); a file that cannot be read, written or trusted (of
another interpreter, or damaged on disk: its digest differs) is ignored, and rewritten by the
import that compiled over it.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import CodeType
from typing import Any

from accelify import __version__
from accelify.lint.cache import blake2b

#: Bytes of the payload's digest in a store's header, after the magic number
DIGEST_SIZE = 16


def store_named(name: str) -> str | None:
    """The store of one set of imports, in `cache_folder`, named for this accelify and this
    interpreter (as a ``.pyc`` is named for it); None where the interpreter keeps no byte code
    (no cache tag): nothing kept."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    try:
        folder = cache_folder()
    except RuntimeError:  # no home folder to be found (``Path.home``)
        return None
    return os.path.join(folder, f"{name}_dataclasses.{__version__}.{tag}.bin")


def cache_folder() -> str:
    """accelify's folder in the user's cache: ``$XDG_CACHE_HOME/accelify``, else the
    platform's (``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows, ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, or relative: the XDG spec says to ignore it
        if sys.platform == "win32":
            base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        elif sys.platform == "darwin":
            base = str(Path.home() / "Library" / "Caches")
        else:
            base = str(Path.home() / ".cache")
    return os.path.join(base, "accelify")


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
    """The code kept in ``store``; nothing where it is missing, of another interpreter, or
    damaged: the digest is checked first (``marshal.loads`` of damaged bytes may raise any
    error or crash the interpreter, and code damaged but loaded would fail when it runs)."""
    try:
        with open(store, "rb") as file:
            data = file.read()
    except OSError:
        return {}
    magic = _magic()
    header = len(magic) + DIGEST_SIZE
    if len(data) < header or not data.startswith(magic):
        return {}
    payload = data[header:]
    if _digest(payload) != data[len(magic) : header]:
        return {}
    try:
        kept = marshal.loads(payload)
    except Exception:  # (its digest matched: written so by another accelify; never expected)
        return {}
    if not isinstance(kept, dict):
        return {}
    return {
        text: code
        for text, code in kept.items()
        if isinstance(text, str) and isinstance(code, CodeType)
    }


def _write(store: str, used: dict[str, CodeType]) -> None:
    """Replaced whole, never half-written: another process reads the old file or the new. No
    partial file is left, even when interrupted (Ctrl-C); a folder that cannot be written: nothing
    kept, silently (the next start compiles, as without a store)."""
    partial = f"{store}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(store), exist_ok=True)
        payload = marshal.dumps(used)
        with open(partial, "wb") as file:
            file.write(_magic() + _digest(payload) + payload)
        os.replace(partial, store)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.unlink(partial)


def _digest(payload: bytes) -> bytes:
    return blake2b(payload, digest_size=DIGEST_SIZE).digest()
