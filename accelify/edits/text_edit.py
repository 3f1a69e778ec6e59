"""A plan as plain data: the text it changes, as ``(start, end, replacement)`` on the file's
characters (ruff's edit shape). Plans hold functions of libcst nodes and live only in the
process that parsed the file; text edits cross processes (``--jobs``) and go into JSON output.
Fixes are applied from plans, where the tree is (``lint --fix`` applies them in the worker)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a TextEdit read back from the lint cache needs no parser
    import libcst as cst

    from accelify.edits.plan import Plan


@dataclass(frozen=True)
class TextEdit:
    start: int  # offset of the first replaced character
    end: int  # offset after the last replaced character
    content: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def text_edit(module: cst.Module, plan: Plan, before: str) -> TextEdit | None:
    """The one span of ``module`` (whose code is ``before``) that ``plan`` rewrites (None when
    it changes nothing)."""
    from accelify.edits.apply import ApplyPlan

    after = module.visit(ApplyPlan(plan)).code
    if after == before:
        return None
    start = 0
    limit = min(len(before), len(after))
    while start < limit and before[start] == after[start]:
        start += 1
    common_suffix = 0
    while (
        common_suffix < limit - start
        and before[len(before) - 1 - common_suffix] == after[len(after) - 1 - common_suffix]
    ):
        common_suffix += 1
    return TextEdit(start, len(before) - common_suffix, after[start : len(after) - common_suffix])
