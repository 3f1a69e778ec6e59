"""The two checks, as verdicts over the probe's records.

Check 1 (one process): the converted script makes the same optimizer steps as the original,
with the same losses and parameter fingerprints (exactly, or within ``atol``).
Check 2 (K ranks): every rank holds the same parameters after every step, losses are finite,
the ranks' losses differ (the data is sharded; an optimizer whose losses alone are the same on
every rank, a GAN generator's fed the same noise, is named as repeating its work), every
optimizer's learning rates at the start of each training pass are the original's
(`learning_rates`), and the run ends on all ranks.
Run to the end, check 1 also compares every printed line, and check 2 requires every evaluation
loop over a sharded loader to gather or reduce what it computes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from accelify.verify.learning_rates import ScheduleComparison, compare_learning_rates
from accelify.verify.records import StepRecord
from accelify.verify.runs import Run


@dataclass
class CheckResult:
    title: str
    passed: bool
    verdict: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    diverged_at: StepRecord | None = None  # the converted script's record at the divergence
    output: str = ""  # the failing script's output, when it failed


def numbered(checks: list[CheckResult]) -> list[CheckResult]:
    """The checks that ran, titled ``check 1: ...``, ``check 2: ...`` in the order shown: which
    checks run depends on the run (a run to the end reads no evaluation from the code), so a
    check's number is its place in this report, never a fixed one that could leave a gap."""
    for number, check in enumerate(checks, start=1):
        check.title = f"check {number}: {check.title}"
    return checks


def close(a: float, b: float, atol: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True
    return a == b if atol == 0 else math.isclose(a, b, rel_tol=atol, abs_tol=atol)


def _all_close(a: tuple[float, ...], b: tuple[float, ...], atol: float) -> bool:
    return len(a) == len(b) and all(close(x, y, atol) for x, y in zip(a, b, strict=True))


def _max_diff(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    if len(a) != len(b):
        return math.inf
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def _losses(record: StepRecord | None) -> str:
    if record is None:
        return "-"
    return ", ".join(f"{loss:.8g}" for loss in record.losses) or "(none)"


def check_equivalence(
    original: Run, converted: Run, atol: float, compare_output: bool = False
) -> CheckResult:
    tolerance = "exact" if atol == 0 else f"within {atol:g}"
    result = CheckResult(
        f"one process, original vs converted ({tolerance})",
        False,
        "",
        ["step", "original loss", "converted loss", "params max |diff|", "verdict"],
    )
    if converted.failed:
        result.verdict = _failure("the converted script", converted)
        result.output = converted.tail()
    theirs, ours = original.ranks[0], converted.ranks[0]
    first_bad: int | None = None
    for index in range(max(len(theirs), len(ours))):
        a = theirs[index] if index < len(theirs) else None
        b = ours[index] if index < len(ours) else None
        same = (
            a is not None
            and b is not None
            and a.optimizer == b.optimizer
            and _all_close(a.losses, b.losses, atol)
            and _all_close(a.params, b.params, atol)
        )
        difference = _max_diff(a.params, b.params) if a and b else math.inf
        result.rows.append(
            [
                str(index + 1),
                _losses(a),
                _losses(b),
                "-" if difference == math.inf else f"{difference:.3g}",
                "same" if same else "DIFFERS",
            ]
        )
        if not same and first_bad is None:
            first_bad = index
            result.diverged_at = b or (ours[-1] if ours else None)
    if converted.failed:
        return result
    printed = _first_printed_difference(original, converted) if compare_output else None
    if first_bad is None and theirs and printed is not None:
        result.verdict = f"FAIL: the printed output differs: {printed}"
    elif first_bad is None and theirs:
        result.passed = True
        result.verdict = f"pass: {len(theirs)} steps, losses and parameters {tolerance}"
        if compare_output:
            lines = len(original.stdout.splitlines())
            result.verdict += f", all {lines} printed lines identical"
    elif first_bad is None:
        result.verdict = "the original script made no optimizer step: nothing to compare"
    else:
        a = theirs[first_bad] if first_bad < len(theirs) else None
        b = ours[first_bad] if first_bad < len(ours) else None
        result.verdict = f"FAIL: the scripts diverge at step {first_bad + 1}: " + _what_differs(
            a, b, atol
        )
    return result


#: A progress bar's times and rates (``[00:01<00:03, 48.2it/s]``): they differ from run to run.
_PROGRESS_TIMES = re.compile(r"\[\d+:\d\d(?::\d\d)?(?:<(?:\d+:\d\d(?::\d\d)?|\?))?,[^\]\n]*\]")


def _printed_lines(stdout: str) -> list[str]:
    """The lines as a terminal leaves them: a line redrawn with ``\\r`` (a progress bar) is its
    last drawing, times and rates blanked; how often a bar redraws depends on the clock."""
    lines = []
    for line in stdout.split("\n"):
        drawn = line.rstrip("\r").rpartition("\r")[2]
        lines.append(_PROGRESS_TIMES.sub("[...]", drawn) if "\r" in line else drawn)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _first_printed_difference(original: Run, converted: Run) -> str | None:
    theirs, ours = _printed_lines(original.stdout), _printed_lines(converted.stdout)
    for number, (a, b) in enumerate(zip(theirs, ours, strict=False), start=1):
        if a != b:
            return f"line {number}: {a!r} (original) vs {b!r} (converted)"
    if len(theirs) != len(ours):
        return f"{len(theirs)} lines printed by the original, {len(ours)} by the conversion"
    return None


def _what_differs(a: StepRecord | None, b: StepRecord | None, atol: float) -> str:
    if a is None:
        return "the converted script makes more optimizer steps than the original"
    if b is None:
        return "the converted script stops before this step"
    if a.optimizer != b.optimizer:
        return "a different optimizer steps"
    if not _all_close(a.losses, b.losses, atol):
        return f"loss {_losses(a)} (original) vs {_losses(b)} (converted)"
    return f"parameters differ after the step (max |norm diff| {_max_diff(a.params, b.params):.3g})"


def check_ranks(
    run: Run,
    atol: float,
    single: Run | None = None,
    caches: frozenset[int] = frozenset(),
    original: Run | None = None,
    to_end: bool = True,
) -> CheckResult:
    """``single``: the conversion on one process; ``original``: the original script's run,
    whose learning rates at each training pass the ranks' must match; ``caches``: lines of
    loops that cache what training reads back, no evaluation."""
    ranks = run.processes
    result = CheckResult(
        f"{ranks} ranks, the converted script",
        False,
        "",
        ["step", *(f"loss rank {r}" for r in range(ranks)), "params across ranks", "verdict"],
    )
    steps = max((len(records) for records in run.ranks), default=0)
    problems = _step_rows(run, atol, result)
    last_steps = ", ".join(f"rank {r}: {len(records)}" for r, records in enumerate(run.ranks))
    if run.timed_out:
        result.verdict = (
            f"FAIL: the run did not end within the timeout (--timeout): a hang, or a run "
            f"that needs longer than it allows (steps made per rank: {last_steps})"
        )
        result.output = run.tail()
        return result
    if run.failed:
        result.verdict = _failure(f"the converted script on {ranks} ranks", run)
        result.output = run.tail()
        return result
    if steps == 0:
        result.verdict = "FAIL: no optimizer step was made on any rank"
        return result
    if len({len(records) for records in run.ranks}) > 1:
        problems.append(f"the ranks made different numbers of optimizer steps ({last_steps})")
    if ranks > 1 and _same_losses_everywhere(run.ranks):
        problems.append(
            "every rank computed the same loss at every step: the data is not sharded "
            "(is the training DataLoader passed to accelerator.prepare?)"
        )
    schedule = _schedule(original, run, atol, to_end)
    if schedule is not None and schedule.difference is not None:
        problems.append(schedule.difference)
    if single is not None:
        problems += _ungathered_evaluations(run, single, caches)
    if problems:
        result.verdict = "FAIL: " + problems[0]
    else:
        result.passed = True
        result.verdict = (
            f"pass: {steps} steps, parameters identical on every rank, "
            + _losses_per_shard(run.ranks)
        )
        if schedule is not None and schedule.compared > 1:
            result.verdict += ", learning rates as the original's " + (
                f"at {schedule.compared} optimizer steps"
                if schedule.by_step
                else f"at the start of {schedule.compared} training passes"
            )
    return result


def _schedule(
    original: Run | None, run: Run, atol: float, to_end: bool
) -> ScheduleComparison | None:
    if original is None or not original.passes or len(run.passes) != run.processes:
        return None
    return compare_learning_rates(
        original.ranks[0],
        original.passes[0],
        run.ranks,
        run.passes,
        lambda a, b: _all_close(a, b, atol),
        to_end,
    )


def _step_rows(run: Run, atol: float, result: CheckResult) -> list[str]:
    """One row per step across the ranks; the problems seen, in step order."""
    ranks = run.processes
    problems: list[str] = []
    for index in range(max((len(records) for records in run.ranks), default=0)):
        at = [records[index] if index < len(records) else None for records in run.ranks]
        present = [record for record in at if record is not None]
        identical = len(present) == ranks and all(
            _all_close(present[0].params, other.params, atol) for other in present[1:]
        )
        finite = all(math.isfinite(loss) for record in present for loss in record.losses)
        verdict = "ok"
        if not identical:
            verdict = "DIVERGE" if len(present) == ranks else "MISSING"
            if len(present) == ranks:
                problems.append(f"the ranks' parameters differ after step {index + 1}")
        if not finite:
            verdict = "NOT FINITE"
            problems.append(f"a loss is not finite at step {index + 1}")
        identity = "identical" if identical else "differ"
        result.rows.append([str(index + 1), *(_losses(record) for record in at), identity, verdict])
    return problems


def _ungathered_evaluations(
    run: Run, single: Run, caches: frozenset[int] = frozenset()
) -> list[str]:
    """Passes with no backward over a loader that is sharded here (fewer batches per rank than
    the same pass on one process) that gather and reduce nothing: their metrics cover a shard.
    And passes with no backward over a loader that is not sharded (every batch on every rank,
    where a prepared loader would give each fewer) that gather before the function that runs
    the loop returns: the gather joins one copy of every sample per rank. A pass at one of
    ``caches`` fills a per-rank cache for training: no metric."""
    if not run.passes or not single.passes:
        return []
    problems = []
    seen: dict[tuple[str, int], int] = {}
    reference = single.passes[0]
    for loader_pass in run.passes[0]:
        occurrence = seen.get(loader_pass.place, 0)
        seen[loader_pass.place] = occurrence + 1
        same = [p for p in reference if p.place == loader_pass.place]
        if occurrence >= len(same) or loader_pass.place in {("", line) for line in caches}:
            continue
        whole = same[occurrence]
        sharded = 0 < loader_pass.batches < whole.batches
        if sharded and loader_pass.backward == 0 and loader_pass.collectives == 0:
            problems.append(
                f"the evaluation loop at {loader_pass.where} runs over {loader_pass.batches} "
                f"of {whole.batches} batches on each rank and gathers nothing: what it computes "
                "covers one rank's shard (gather predictions and labels with "
                "accelerator.gather_for_metrics)"
            )
            break
        # 2 batches or more: a prepared loader on 2 ranks or more gives each rank fewer
        whole_everywhere = run.processes > 1 and loader_pass.batches == whole.batches >= 2
        # only the gathers made before the loop's function returned: its caller may gather
        # something else afterwards (the training loss, once ``evaluate()`` has returned)
        if whole_everywhere and loader_pass.backward == 0 and loader_pass.gathers > 0:
            problems.append(
                f"the evaluation loop at {loader_pass.where} runs over all "
                f"{loader_pass.batches} batches on every rank and gathers what it computes: "
                f"the gather joins {run.processes} copies of every sample (counts and sums "
                f"{run.processes} times too large); pass its DataLoader to accelerator.prepare"
            )
            break
    return problems


def _losses_per_shard(ranks: list[list[StepRecord]]) -> str:
    """What the ranks' losses say about the split of the work. One optimizer whose losses are
    the same on every rank at every one of its steps while another's differ (a GAN's generator
    fed noise drawn after the same seed on every rank) repeats its work on each rank: its
    effective batch is one rank's, not N ranks'. Said, not passed over as sharded."""
    repeated = _optimizers_repeated(ranks)
    if not repeated:
        return "losses differ per shard"
    lines = ", ".join(_stepped_at(ranks[0], optimizer) for optimizer in repeated)
    return (
        f"losses differ per shard except those of the optimizer stepped at {lines}: identical "
        "on every rank at every one of its steps, so its inputs do not differ between ranks "
        "(random values drawn after the same seed on every rank?) and each rank repeats its "
        "work instead of splitting it"
    )


def _optimizers_repeated(ranks: list[list[StepRecord]]) -> list[int]:
    """The optimizers (in the order they first step) whose losses were the same on every rank
    at each of their steps, when the ranks made the same steps with the same optimizers."""
    if len(ranks) < 2 or len({len(records) for records in ranks}) > 1:
        return []
    same: dict[int, bool] = {}
    for at in zip(*ranks, strict=True):
        optimizer = at[0].optimizer
        if any(record.optimizer != optimizer for record in at):
            return []
        if not any(record.losses for record in at):
            continue  # a step with no loss recorded (a closure's) says nothing either way
        alike = all(record.losses == at[0].losses for record in at[1:])
        same[optimizer] = same.get(optimizer, True) and alike
    if len(same) < 2 or all(same.values()):
        return []
    return [optimizer for optimizer, alike in same.items() if alike]


def _stepped_at(records: list[StepRecord], optimizer: int) -> str:
    line = next((r.step_line for r in records if r.optimizer == optimizer), None)
    return f"line {line}" if line is not None else f"the script's optimizer #{optimizer + 1}"


def _same_losses_everywhere(ranks: list[list[StepRecord]]) -> bool:
    steps = min(len(records) for records in ranks)
    if steps == 0:
        return False
    return all(
        all(ranks[r][i].losses == ranks[0][i].losses for r in range(1, len(ranks)))
        for i in range(steps)
    )


#: The launcher's last word when its watcher stopped a run that could not finish.
_STOPPED = re.compile(r"^accelify launch: the run was stopped: (.+) \(above\)$", re.MULTILINE)


def _failure(what: str, run: Run) -> str:
    if run.timed_out:
        return f"FAIL: {what} did not end within the timeout (--timeout)"
    stopped = _STOPPED.search(run.output)
    if stopped:
        return f"FAIL: {what} could not finish: {stopped.group(1)} (the launcher's report below)"
    return f"FAIL: {what} exited with code {run.returncode}"
