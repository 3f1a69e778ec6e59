"""Whether a line of the user's script runs on some ranks only: the static analysis's answer
(`ScriptModel.under_rank_guard`), asked by the launcher once a run has hung.

Ranks that wait in different collectives tell the launcher where each waits, not why. When one
rank's collective (or the call of the helper that makes it) sits under ``if
accelerator.is_main_process:``, ``if rank == 0:``, a function decorated with
``@accelerator.on_main_process`` or after ``if not accelerator.is_main_process: return``, that
guard is the line to fix: the other ranks skip the collective and go on to their next one. Told
apart from a rank that left the loop early by the same analysis `accelify lint` uses, not by the
ranks' backward counts (a guarded gather between two epochs looks like a rank that stopped).
Parsed only when asked: the analysis imports libcst, which a healthy run never pays for.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import libcst as cst

    from accelify.analysis.script_model import ScriptModel


@dataclass(frozen=True)
class RankGuard:
    line: int  # the guard's own line: the ``if``, the decorator, the early ``return``
    text: str  # that line as written, stripped
    #: the call sits in the ``else:`` (or an ``elif``) of that ``if``: the ranks the test holds
    #: for take the ``if`` and skip the call, not the other way round
    in_else: bool = False


def rank_guard(path: str, line: int) -> RankGuard | None:
    """The guard that keeps ``path:line`` from some ranks, or None when every rank reaches it
    (or the file cannot be read or parsed: the report then says less, never something wrong)."""
    try:
        return _guards(path).get(line)
    except Exception:  # a diagnosis must never break the launcher's report
        return None


@lru_cache(maxsize=8)
def _guards(path: str) -> dict[int, RankGuard]:
    """Each line of a call the analysis finds under a rank guard, with that guard."""
    import libcst as cst

    from accelify.analysis.positions import Positions
    from accelify.analysis.script_model import analyze
    from accelify.source import parse

    data = Path(path).read_bytes()
    module = parse(data, path)
    model = analyze(module)
    positions = Positions(module)
    lines = data.decode("utf-8", "replace").splitlines()
    found: dict[int, RankGuard] = {}
    for call in model.calls:
        guard = model.rank_guard_of(call)
        if guard is None:
            continue
        # a decorated function is named by its decorators' first line, as it is read
        shown = guard.decorators[0] if isinstance(guard, cst.FunctionDef) else guard
        guard_line = positions[shown].start.line
        text = lines[guard_line - 1].strip() if guard_line <= len(lines) else ""
        in_else = isinstance(guard, cst.If) and _in_else(model, call, guard)
        span = positions[call]
        for number in range(span.start.line, span.end.line + 1):
            found.setdefault(number, RankGuard(guard_line, text, in_else))
    return found


def _in_else(model: ScriptModel, call: cst.CSTNode, guard: cst.If) -> bool:
    """``call`` sits in ``guard``'s ``else:``/``elif`` arm rather than in its body."""
    child = call
    for ancestor in model.ancestors(call):
        if ancestor is guard:
            return child is guard.orelse
        child = ancestor
    return False
