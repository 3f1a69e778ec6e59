"""Reading and writing the user's files: bytes in, bytes out, nothing about them lost.

libcst parses bytes and keeps the encoding, newline style, BOM-less text and comments; a file
that cannot be read or parsed becomes a `UserError` with its line and column, never a traceback.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from accelify.errors import UserError

if TYPE_CHECKING:
    import libcst as cst

BOM = b"\xef\xbb\xbf"

P = ParamSpec("P")
R = TypeVar("R")


def render(module: cst.Module, original: bytes) -> bytes:
    """The module's bytes, with the BOM the original file started with (libcst drops it)."""
    rendered = module.bytes
    return BOM + rendered if original.startswith(BOM) and not rendered.startswith(BOM) else rendered


SKIPPED_DIRS = {
    ".git",
    ".hg",
    ".venv",
    "venv",
    "__pycache__",
    "node_modules",
    "build",
    "dist",
    ".tox",
}


def python_files(folder: Path) -> list[Path]:
    """The ``.py`` files under ``folder``, sorted, skipping virtualenvs, caches and hidden dirs."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        found += [Path(root) / name for name in sorted(files) if name.endswith(".py")]
    return found


#: Python frames a deep tree may take: libcst's code generation and position metadata recurse
#: through every nesting level (a sum of 600 terms is 600 nested binary operations, three or
#: four frames each), past the interpreter's default of 1000.
DEEP_TREE_FRAMES = 30_000


def room_for_deep_trees(function: Callable[P, R]) -> Callable[P, R]:
    """Run ``function`` with the recursion limit raised to `DEEP_TREE_FRAMES` (restored after):
    valid Python nested that deep parses (libcst's parser is not recursive in Python) and must
    be analysed and printed too."""

    @functools.wraps(function)
    def roomy(*args: P.args, **kwargs: P.kwargs) -> R:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, DEEP_TREE_FRAMES))
        try:
            return function(*args, **kwargs)
        finally:
            sys.setrecursionlimit(limit)

    return roomy


def parse(data: bytes, label: str) -> cst.Module:
    # ~0.13-0.25 s: paid only when a file is parsed (lint has imported it already, its
    # dataclasses' methods kept compiled: `accelify.lint.engine.load_analysis`)
    import libcst as cst

    try:
        with _nodes_unchecked(cst.CSTNode):
            return cst.parse_module(data[len(BOM) :] if data.startswith(BOM) else data)
    except cst.ParserSyntaxError as error:
        raise _syntax_error(data, label, error) from None
    except (UnicodeDecodeError, LookupError) as error:
        raise UserError(f"cannot decode: {error}", label) from None


@contextlib.contextmanager
def _nodes_unchecked(base: type) -> Iterator[None]:
    """libcst checks every node it makes (``CSTNode.__post_init__`` runs ``_validate``); for
    the nodes its parser makes from source that parsed, that checks again what the grammar did
    (libcst's own note there says so): a sixth of the parse. Not while its parser runs; every
    node made after (the edits') is checked as before. The switch is the class's, so it is
    thrown only where no other thread can be making nodes meanwhile (the CLI's workers are
    processes), and never twice (a parse inside a parse keeps the outer one's state)."""
    checked = base.__dict__["__post_init__"]
    if checked is _parsed_node or threading.active_count() > 1:
        yield
        return
    base.__post_init__ = _parsed_node  # type: ignore[attr-defined]
    try:
        yield
    finally:
        base.__post_init__ = checked  # type: ignore[attr-defined]


def _parsed_node(node: object) -> None:
    """A node libcst's parser made: nothing to check (see `parse`)."""


def check_syntax(data: bytes, label: str) -> None:
    """`parse`'s verdict without building a tree: Python's parser (several times faster) says
    that the file parses; a file it rejects goes to `parse`, so the error is the one `parse`
    reports."""
    try:
        ast.parse(data, filename=label)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        parse(data, label)


def _syntax_error(data: bytes, label: str, error: cst.ParserSyntaxError) -> UserError:
    """Python's own message and position where it has one: clearer than the grammar's."""
    try:
        ast.parse(data, filename=label)
    except SyntaxError as python_error:
        return UserError(
            f"syntax error: {python_error.msg}", label, python_error.lineno, python_error.offset
        )
    except ValueError:
        pass
    message = error.message.splitlines()[0] if error.message else "invalid syntax"
    return UserError(f"syntax error: {message}", label, error.raw_line, error.raw_column + 1)


def write_atomically(path: Path, data: bytes, like: Path | None = None) -> None:
    """Replace ``path`` in one rename, keeping its permission bits; a new file gets those of
    ``like`` (the converted script's own, for ``convert x.py -o y.py``), else what the umask
    gives any new file: the temporary file is made 0600, which a rename would keep."""
    import tempfile  # what writes files imports it, not every `accelify lint` start

    if path.exists():
        mode: int = path.stat().st_mode
    elif like is not None and like.exists():
        mode = like.stat().st_mode
    else:
        mode = 0o666 & ~_umask()
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    current = os.umask(0o022)
    os.umask(current)
    return current
