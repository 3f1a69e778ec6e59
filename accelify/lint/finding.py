"""A finding, kept free of libcst so that rendering and file walking do not import it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelify.convert.plan import Plan


@dataclass
class Finding:
    code: str
    message: str
    line: int
    column: int
    fix: Plan | None = None  # the edits that fix it, when the fix is safe
    path: str = ""
