"""Errors a user can cause: a message and a place, turned into exit code 2 by the CLI."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import NoReturn


@dataclass
class UserError(Exception):
    """Bad input from the user (a config file, a flag, a script path), never one of our bugs."""

    message: str
    path: str | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        place = [str(part) for part in (self.path, self.line, self.column) if part is not None]
        return ": ".join([":".join(place), self.message]) if place else self.message


def fail(error: UserError) -> NoReturn:
    """How every command reports a user error: one line on stderr, exit 2, no traceback."""
    import click

    click.echo(f"accelify: error: {error}", err=True)
    sys.exit(2)
