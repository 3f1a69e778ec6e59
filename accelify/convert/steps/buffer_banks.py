"""A memory bank in a module's buffer filled from each training step's values (a MoCo queue
on an EMA teacher, `accelify.analysis.buffer_banks`): on N ranks each rank's bank holds only
its own shard's values and the banks drift apart. Left as written, with a review line that
says to gather the values before they are stored."""

from __future__ import annotations

from accelify.analysis.buffer_banks import banks_filled_per_step
from accelify.convert.steps.context import Context
from accelify.edits.plan import NoteKind


def run(ctx: Context) -> None:
    for fill in banks_filled_per_step(ctx.model):
        values = ctx.code(fill.call.args[0].value)
        gather = ctx.a_at(fill.call, "gather")
        ctx.plan.review(
            ctx.line(fill.call),
            f"{fill.method}() stores {values} into the buffer {fill.buffer} (line "
            f"{ctx.line(fill.write)}) at every training step: on N ranks each rank stores "
            f"only its own shard's values, so the ranks' copies of {fill.buffer} hold "
            "different entries and drift apart; gather them from every rank first, as MoCo does "
            f"({fill.method}({gather}({values})), every rank storing the same values)",
            kind=NoteKind.DIFFERS_ON_N_RANKS,
        )
