"""A finding, kept free of libcst so that rendering and file walking do not import it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelify.edits.plan import Plan
    from accelify.edits.text_edit import TextEdit


@dataclass
class Finding:
    code: str
    message: str
    line: int
    column: int
    fix: Plan | None = None  # the edits that fix it, when the fix is safe
    path: str = ""
    fixable: bool = False  # kept when `fix` is dropped (a Plan does not cross processes)
    edit: TextEdit | None = None  # the fix as plain data (see `portable`)
    #: other rules' findings, by (line, column, code), that report the same bug at another
    #: place: this one names it where the user sees it (a wrong evaluation total over the
    #: loader another rule reports), so where both are selected only this one is kept. The
    #: column tells apart two loaders on one line (``evaluate(model, test_loader, val_loader)``):
    #: covering one keeps the other's finding
    covers: tuple[tuple[int, int, str], ...] = ()

    def __post_init__(self) -> None:
        self.fixable = self.fixable or self.fix is not None

    def portable(self, edit: TextEdit | None) -> Finding:
        """This finding with its fix as ``edit``, a text edit (`text_edits` of its plan),
        instead of an edit plan, which holds functions of the parsed tree: to send to another
        process, or to print as JSON."""
        if self.fix is None:
            return self
        return replace(self, fix=None, edit=edit, fixable=True)
