"""The learning-rate schedule on N ranks against the original's on one process.

Check 1 runs the conversion on one process, where a scheduler's pace cannot change, and check 2
compares the ranks with each other, which all step alike; neither sees a conversion whose
scheduler steps at another pace on N ranks (one stepped per epoch that was prepared steps N
times per epoch; one stepped per batch left unprepared counts 1/N of the batches). Here every
optimizer's learning rates at the start of each training pass (a loop over a loader that
calls backward) on each rank are compared with the original's at the same pass.

What matches: each rank's loader is 1/N as long, and a prepared scheduler steps N times per
optimizer step (Accelerate's semantics), so at the start of a pass it has made N times this
rank's steps, which is the original's count where the shards are even. A shard padded to even
length (N * ceil(B / N) batches for the original's B) makes the schedule run ahead by up to
N - 1 steps per pass; the rates any such position gives (the original's at its own steps between
the two counts) match too. Optimizers are paired by the order of their first step, as in check 1.
An optimizer a ReduceLROnPlateau drives is not compared: its rates follow a metric, and N ranks
(a batch N times larger per step) reach other values than one process, where the same decision
may come an epoch apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from accelify.verify.records import LoaderPass, OptimizerAtPass, StepRecord

#: Whether two lists of learning rates are the same (exactly, or within verify's tolerance).
Same = Callable[[tuple[float, ...], tuple[float, ...]], bool]


@dataclass(frozen=True)
class ScheduleComparison:
    compared: int  # training passes (or optimizer steps, `by_step`) compared, on each rank
    difference: str | None  # the first difference, said in words
    by_step: bool = False  # the run counts optimizer steps, not passes: compared step by step


def compare_learning_rates(
    original: list[StepRecord],
    original_passes: list[LoaderPass],
    ranks: list[list[StepRecord]],
    ranks_passes: list[list[LoaderPass]],
    same: Same,
    to_end: bool = True,
) -> ScheduleComparison:
    """``original`` and ``original_passes``: the one-process run of the original script;
    ``ranks`` and ``ranks_passes``: each rank's of the conversion; ``to_end``: both ran to
    their end (not stopped after a number of steps).

    A script that counts optimizer steps (``while step < max_steps:`` around its loop over the
    loader) makes as many steps on every rank as on one process, over N times the data: its
    schedule follows the steps, not the passes, and is compared step by step. Run to the end,
    the step counts tell the two apart (each rank makes the original's count, or about 1/N of
    it). Stopped early, both made the same count: a difference then fails only when neither the
    passes nor the steps match (an unprepared per-batch scheduler of a script that counts
    epochs matches step by step, and is caught run to the end)."""
    by_pass = _by_pass(original, original_passes, ranks, ranks_passes, same)
    by_step = _by_step(original, ranks, same)
    if to_end:
        counts_steps = all(len(records) == len(original) for records in ranks)
        return by_step if counts_steps else by_pass
    if by_pass.difference is None or by_step.difference is None:
        return by_pass if by_pass.difference is None else by_step
    return by_pass


def _by_pass(
    original: list[StepRecord],
    original_passes: list[LoaderPass],
    ranks: list[list[StepRecord]],
    ranks_passes: list[list[LoaderPass]],
    same: Same,
) -> ScheduleComparison:
    theirs = _training(original_passes)
    their_order = _stepping_order(original)
    trace = _trace(original)
    processes = len(ranks)
    compared = 0
    for rank, (records, passes) in enumerate(zip(ranks, ranks_passes, strict=True)):
        our_order = _stepping_order(records)
        ours = _training(passes)
        compared = max(compared, min(len(ours), len(theirs)))
        for number, (their_pass, our_pass) in enumerate(zip(theirs, ours, strict=False), 1):
            their_optimizers = _by_order(their_pass, their_order)
            our_optimizers = _by_order(our_pass, our_order)
            for order in sorted(their_optimizers.keys() & our_optimizers.keys()):
                a, b = their_optimizers[order], our_optimizers[order]
                if same(a.lrs, b.lrs):
                    continue
                low, high = sorted((a.steps, processes * b.steps))
                rates = trace.get(order, [])[low : high + 1]
                if any(same(lrs, b.lrs) for lrs in rates):
                    continue  # a padded shard ran the schedule ahead by less than N steps
                where = "" if processes == 1 else f" on rank {rank}"
                return ScheduleComparison(
                    compared,
                    f"the learning rate differs from the original's at the start of training "
                    f"pass {number} (the loop over a loader at {_converted(our_pass)}): "
                    f"{_name(order, a, b)} has {_rates(b.lrs)}{where}, the original "
                    f"{_rates(a.lrs)} on one process: {_advice(processes)}",
                )
    return ScheduleComparison(compared, None)


def _by_step(
    original: list[StepRecord], ranks: list[list[StepRecord]], same: Same
) -> ScheduleComparison:
    processes = len(ranks)
    compared = 0
    for rank, records in enumerate(ranks):
        compared = max(compared, min(len(records), len(original)))
        for a, b in zip(original, records, strict=False):
            if a.optimizer != b.optimizer or not a.lrs or not b.lrs or same(a.lrs, b.lrs):
                continue  # another optimizer steps: check 1 and the parameters say so
            where = "" if processes == 1 else f" on rank {rank}"
            return ScheduleComparison(
                compared,
                f"the learning rate differs from the original's at optimizer step {b.step} "
                f"(every rank makes the original's steps): {_rates(b.lrs)}{where}, the "
                f"original {_rates(a.lrs)} on one process: {_advice(processes)}",
                by_step=True,
            )
    return ScheduleComparison(compared, None, by_step=True)


def _advice(processes: int) -> str:
    return (
        f"a scheduler steps at another pace on {processes} ranks (one stepped per epoch must "
        "not be prepared; one stepped per batch must be, or step num_processes times)"
    )


def _training(passes: list[LoaderPass]) -> list[LoaderPass]:
    """Passes that train: backward was called before the next pass started."""
    return [p for p in passes if p.backward > 0]


def _stepping_order(records: list[StepRecord]) -> dict[int, int]:
    """Each stepping optimizer's number in the order made -> in the order of first step."""
    order: dict[int, int] = {}
    for record in records:
        if record.made is not None:
            order.setdefault(record.made, record.optimizer)
    return order


def _by_order(loader_pass: LoaderPass, order: dict[int, int]) -> dict[int, OptimizerAtPass]:
    return {order[o.made]: o for o in loader_pass.optimizers if o.made in order}


def _converted(loader_pass: LoaderPass) -> str:
    """``converted line 12``, ``src/engine.py:58``: where a pass's loop is."""
    return loader_pass.where if loader_pass.module else f"converted {loader_pass.where}"


def _trace(records: list[StepRecord]) -> dict[int, list[tuple[float, ...]]]:
    """Each optimizer's learning rates at each of its steps, in order (by stepping order)."""
    trace: dict[int, list[tuple[float, ...]]] = {}
    for record in records:
        if record.lrs:
            trace.setdefault(record.optimizer, []).append(record.lrs)
    return trace


def _name(order: int, original: OptimizerAtPass, converted: OptimizerAtPass) -> str:
    ordinal = {0: "first", 1: "second", 2: "third"}.get(order, f"#{order + 1}")
    lines = []
    if original.line is not None:
        lines.append(f"line {original.line} of the original")
    if converted.line is not None:
        lines.append(f"line {converted.line} of the conversion")
    made = f" (made at {', '.join(lines)})" if lines else ""
    return f"the {ordinal} optimizer to step{made}"


def _rates(lrs: tuple[float, ...]) -> str:
    shown = ", ".join(repr(lr) for lr in lrs)
    return f"lr {shown}" if len(lrs) == 1 else f"lrs [{shown}] (one per param group)"
