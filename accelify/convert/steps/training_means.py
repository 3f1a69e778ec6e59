"""A training loss summed over the steps of a loop over a prepared loader and divided by the
last index ``enumerate`` handed the loop (``train_loss / num``, realconv36's whilestop): that
index is this rank's steps less one. On one process the printed number is the script's own;
on N ranks each rank sums N times fewer steps and divides by its own count less one, so the
number printed changes with N by more than the shard it reads (7 steps over 6, not 14 over
13). The evaluation analysis already leaves such a validation loss whole with its review line
(`accelify.analysis.evaluation`); a training loop is never gathered, so the conversion keeps
the line as it is (a one-process run prints what it did) and says so, with the divisor that
keeps the meaning."""

from __future__ import annotations

from accelify.analysis.evaluation import sums_over_the_last_index
from accelify.convert.steps.context import Context
from accelify.edits.plan import NoteKind


def run(ctx: Context) -> None:
    for loop in ctx.model.loops:
        if not loop.trains or ctx.unprepared_loaders(loop):
            continue  # a loader left whole: every rank takes every step
        if not ctx.facts.flow.reads_loader(loop):
            continue
        loader = loop.iterable or "the loader"
        reduce = ctx.a_at(loop.node, "reduce")
        for total, divisor in sums_over_the_last_index(ctx.model, loop):
            index = divisor.value
            ctx.review_at(
                divisor,
                f"{total} / {index}: {index} is the last index enumerate handed the training "
                f"loop over the prepared {loader} (its steps less one): on N ranks each rank "
                "sums its own N times fewer steps and divides by their count less one, so the "
                "average printed changes with N (one process prints what it did); left as it "
                f"is: divide {total} by len({loader}), the steps this rank takes, for its mean "
                f"of the batches' means (a tensor of it through {reduce}(..., 'mean') for every "
                "rank's)",
                kind=NoteKind.DIFFERS_ON_N_RANKS,
            )
