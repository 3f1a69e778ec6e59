"""Errors a user can cause: a value with a message and a place, turned into exit code 2 by the CLI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class UserError(Exception):
    """Bad input from the user (a config file, a flag, a script path), never one of our bugs."""

    message: str
    path: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        if self.path is None:
            return self.message
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"
