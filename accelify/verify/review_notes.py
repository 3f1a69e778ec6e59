"""The numbers the conversion's own review says differ on N ranks, beside the runs' verdict.

The runs compare training (losses, parameters, ranks in step) and, on one process, every printed
line. A number the converted script prints from one rank's shard (a training loss summed over
this rank's batches, ``train_mse`` about 1/N of the original's on N ranks) trains nothing
differently: every check passes, while the conversion's own review says the number differs.
Comparing the N-rank run's printed numbers with the original's cannot tell that apart from the
ordinary difference sharding makes (another batch order, another last batch), so the verdict
does not guess from the output: it says what the review says, line by line, and a PASS names
them instead of standing unqualified.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from accelify.edits.plan import NoteKind
from accelify.verify.checks import CheckResult

if TYPE_CHECKING:
    from accelify.edits.plan import Note

TITLE = "numbers the conversion's review says differ on N ranks (not compared by the runs)"
_SHOWN = 160


def differs_on_n_ranks(note: Note) -> bool:
    """Marked so by the step that wrote it (`accelify.convert.steps.data_notes`,
    `training_means`, the evaluation's caveats): the field, never the wording, which may
    change."""
    return note.kind is NoteKind.DIFFERS_ON_N_RANKS


def check_rank_reviews(reviews: Sequence[Note], label: str, processes: int) -> CheckResult | None:
    """The check's result, which passes (the runs cannot tell these numbers wrong) and lists
    the review lines; None when the review says nothing differs on N ranks."""
    found = [note for note in reviews if differs_on_n_ranks(note)]
    if not found:
        return None
    result = CheckResult(TITLE, True, "", ["line", "the conversion's review"])
    for note in found:
        text = note.text if len(note.text) <= _SHOWN else note.text[: _SHOWN - 3] + "..."
        result.rows.append([f"{label}:{note.line}", text])
    lines = ", ".join(str(note.line) for note in found)
    result.verdict = (
        f"see the review: on {processes} ranks the converted script computes "
        f"{_count(len(found))} differently from the original (line{'s' if len(found) > 1 else ''}"
        f" {lines} of {label}); the runs compare training, so they pass all the same"
    )
    return result


def caveat(check: CheckResult | None, processes: int) -> str:
    """What a PASS verdict adds for ``check`` (`check_rank_reviews`): empty for None."""
    if check is None:
        return ""
    lines = ", ".join(row[0] for row in check.rows)
    return (
        f"; but the conversion's review says {_count(len(check.rows))} "
        f"{'differs' if len(check.rows) == 1 else 'differ'} on {processes} ranks ({lines}: "
        f"{check.title.split(':')[0]})"
    )


def _count(found: int) -> str:
    return "1 number" if found == 1 else f"{found} numbers"
