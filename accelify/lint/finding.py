"""A finding, kept free of libcst so that rendering and file walking do not import it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelify.edits.plan import Plan


@dataclass
class Finding:
    code: str
    message: str
    line: int
    column: int
    fix: Plan | None = None  # the edits that fix it, when the fix is safe
    path: str = ""
    fixable: bool = False  # kept when `fix` is dropped (a Plan does not cross processes)

    def __post_init__(self) -> None:
        self.fixable = self.fixable or self.fix is not None

    def portable(self) -> Finding:
        """This finding without its edit plan (it holds closures), to send to another process."""
        return replace(self, fix=None)
