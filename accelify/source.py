"""Reading and writing the user's files: bytes in, bytes out, nothing about them lost.

libcst parses bytes and keeps the encoding, newline style, BOM-less text and comments; a file
that cannot be read or parsed becomes a `UserError` with its line and column, never a traceback.
"""

from __future__ import annotations

import ast
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from accelify.errors import UserError

BOM = b"\xef\xbb\xbf"


@dataclass
class SourceFile:
    path: Path
    data: bytes
    module: cst.Module

    @property
    def had_bom(self) -> bool:
        return self.data.startswith(BOM)

    def render(self, module: cst.Module) -> bytes:
        rendered = module.bytes
        return BOM + rendered if self.had_bom and not rendered.startswith(BOM) else rendered


def read(path: Path) -> SourceFile:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"cannot read: {error.strerror}", str(path)) from None
    return SourceFile(path, data, parse(data, str(path)))


def parse(data: bytes, label: str) -> cst.Module:
    try:
        return cst.parse_module(data[len(BOM) :] if data.startswith(BOM) else data)
    except cst.ParserSyntaxError as error:
        raise _syntax_error(data, label, error) from None
    except (UnicodeDecodeError, LookupError) as error:
        raise UserError(f"cannot decode: {error}", label) from None


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


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` in one rename, keeping its permission bits."""
    mode = path.stat().st_mode if path.exists() else None
    descriptor, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
