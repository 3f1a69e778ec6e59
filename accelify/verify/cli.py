"""`accelify verify`: run the original and the converted script under the probe, compare."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from accelify.errors import UserError
from accelify.verify.checks import CheckResult, check_equivalence, check_ranks, numbered
from accelify.verify.evaluation_code import check_evaluation_code, training_cache_lines
from accelify.verify.records import PROBE_FAILED
from accelify.verify.report import nearest_changes, render_json, render_text
from accelify.verify.review_notes import caveat, check_rank_reviews
from accelify.verify.runs import Run, RunSettings, start_runs, stop_all
from accelify.verify.shared_files_code import check_shared_files_code

if TYPE_CHECKING:
    from accelify.edits.plan import Note

MIXED_PRECISION = re.compile(r"mixed_precision\s*=\s*['\"](bf16|fp16)['\"]")
MIXED_PRECISION_ATOL = 1e-2


def run_verify(
    original: Path,
    converted: Path | None,
    *,
    steps: int,
    processes: int,
    atol: float | None,
    timeout: float,
    as_json: bool,
    script_args: tuple[str, ...],
) -> int:
    original_code = _read(original)
    reviews: list[Note] = []  # the conversion's, when verify converts it itself
    if converted is not None:
        converted_code = _read(converted)
    else:
        converted_code, reviews = _convert(original)
    if atol is None:
        added = MIXED_PRECISION.search(converted_code) and not MIXED_PRECISION.search(original_code)
        atol = MIXED_PRECISION_ATOL if added else 0.0
    # Each run imports its own project's modules: a converted driver beside its converted
    # trainer.py must not import the original's (`verify ../a/train.py train.py`).
    converted_folder = None if converted is None else converted.resolve().parent
    settings = RunSettings(
        steps,
        timeout,
        search_path=original.resolve().parent,
        search_paths=()
        if converted_folder is None
        else (("converted", converted_folder), ("ranks", converted_folder)),
        args=script_args,
    )
    with tempfile.TemporaryDirectory(prefix="accelify-verify-") as folder:
        scratch = Path(folder)
        # Copies under the same name: the scripts' own writes (next to __file__ or in the working
        # directory) land in the scratch folder, never beside the user's files.
        original_copy = _place(scratch / "original" / original.name, original_code)
        converted_copy = _place(scratch / "converted" / original.name, converted_code)
        length = "to the end" if steps == 0 else f"{steps} steps each"
        _progress(as_json, f"running {original} and its conversion ({length})")
        runs = start_runs(
            [
                (original_copy, "original", 1),
                (converted_copy, "converted", 1),
                (converted_copy, "ranks", processes),
            ],
            scratch,
            settings,
        )
        try:
            first = runs[0].finish()
            _probe_worked(first)
            if first.failed:
                return _original_fails(first, timeout)
            if not first.ranks[0]:
                raise UserError(
                    "the original script makes no optimizer step: nothing to compare"
                    + _copied_note(original.resolve().parent, scratch / "original-work"),
                    str(original),
                )
            second = runs[1].finish()
            _probe_worked(second)
            to_end = steps == 0
            checks = [check_equivalence(first, second, atol, compare_output=to_end)]
            caches = frozenset(training_cache_lines(converted_code, str(converted or original)))
            checks.append(
                check_ranks(
                    runs[2].finish(),
                    atol,
                    single=second,
                    caches=caches,
                    original=first,
                    to_end=to_end or len(first.ranks[0]) < steps,
                )
            )
        finally:
            stop_all(runs)
    evaluation_read = ""  # "read", "blind" (no loop found), or "" (the runs evaluated)
    if steps != 0:  # the runs stopped early: the evaluation is checked from the code
        evaluation = check_evaluation_code(
            converted_code, str(converted or original), steps, (converted or original).resolve()
        )
        checks.append(evaluation)
        evaluation_read = "read" if evaluation.rows else "blind"
    shared = check_shared_files_code(converted_code, str(converted or original))
    if shared is not None:
        checks.append(shared)
    reviewed = check_rank_reviews(reviews, original.name, processes)
    if reviewed is not None:
        checks.append(reviewed)
    numbered(checks)
    passed = all(check.passed for check in checks)
    verdict = _verdict(passed, checks, processes, evaluation_read)
    if passed:
        verdict += caveat(reviewed, processes)
    if as_json:
        click.echo(render_json(checks, verdict, passed))
    else:
        near = _lines_near_divergence(checks[0])
        changes = nearest_changes(original_code, converted_code, near)
        click.echo(render_text(checks, verdict, changes))
    return 0 if passed else 1


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as error:
        raise UserError(f"cannot read: {error.strerror}", str(path)) from None
    except UnicodeDecodeError as error:
        raise UserError(f"not UTF-8: {error.reason}", str(path)) from None


def _convert(original: Path) -> tuple[str, list[Note]]:
    """The conversion's code, and its review lines."""
    from accelify.convert.conversion import convert_source

    conversion = convert_source(original.read_bytes(), original)
    if conversion.skipped and "of another module" in conversion.skipped:
        # converted alone it is left: the folder's conversion converts it with that module
        raise UserError(
            f"nothing to verify: {conversion.skipped}; convert a copy of its folder "
            "(`accelify convert COPY --write`) and verify the two: "
            f"`accelify verify {original} COPY/{original.name}`",
            str(original),
        )
    if conversion.skipped:
        raise UserError(f"nothing to verify: {conversion.skipped}", str(original))
    return conversion.converted.decode("utf-8"), list(conversion.reviews)


#: What a checkpoint the script may resume from is saved as.
_CHECKPOINT_SUFFIXES = frozenset({".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".pkl"})


def _copied_note(folder: Path, workdir: Path) -> str:
    """What of the script's folder its run found copied beside it (`runs.copy_beside`): a
    script that resumes from its own checkpoints (``gan_ckpt/``) may find its training done
    there and step nothing. Empty when nothing was copied."""
    try:
        copied = sorted(
            p.name + ("/" if p.is_dir() else "")
            for p in workdir.iterdir()
            if (folder / p.name).exists() and (p.is_dir() or p.suffix in _CHECKPOINT_SUFFIXES)
        )
    except OSError:
        return ""
    if not copied:
        return ""
    shown = ", ".join(copied[:5]) + (f" and {len(copied) - 5} more" if len(copied) > 5 else "")
    return (
        f" (it ran beside copies of the folders and checkpoints beside it: {shown}; one "
        "of them that the script resumes from may leave it nothing to train: move it "
        "aside, or verify from a folder without it)"
    )


def _place(path: Path, code: str) -> Path:
    path.parent.mkdir(parents=True)
    path.write_text(code, encoding="utf-8")
    return path


def _probe_worked(run: Run) -> None:
    if run.returncode == PROBE_FAILED:
        raise UserError(f"internal error: accelify's probe failed to start:\n{run.tail()}")


def _original_fails(run: Run, timeout: float) -> int:
    """The original run did not end well. A run stopped at the deadline has not failed: it
    may only be slower than ``--timeout`` allows (three runs share the machine, and ``--to-end``
    runs every epoch), so the message says it timed out and how to give it longer, not that
    the script fails."""
    if run.timed_out:
        message = (
            f"accelify: error: the original script timed out: it was still running after "
            f"{timeout:g} s (--timeout) and was stopped, before any conversion is involved; "
            f"give the runs longer (--timeout {_longer(timeout)}) or less to do (arguments "
            "after `--` go to both scripts: fewer epochs or a smaller data set); its output:"
        )
    else:
        message = (
            f"accelify: error: the original script fails on its own (exited with code "
            f"{run.returncode}), before any conversion is involved; its output:"
        )
    click.echo(message, err=True)
    click.echo("\n".join("  | " + line for line in run.tail().splitlines()[-40:]), err=True)
    return 2


def _longer(timeout: float) -> str:
    """A ``--timeout`` worth trying after ``timeout`` ran out: four times it, rounded up to a
    whole minute."""
    return f"{-(-timeout * 4 // 60) * 60:g}"


def _lines_near_divergence(check: CheckResult) -> list[int]:
    record = check.diverged_at
    if record is None:
        return []
    return [line for line in (record.backward_line, record.step_line) if line is not None]


def _verdict(passed: bool, checks: list[CheckResult], processes: int, evaluation_read: str) -> str:
    if passed:
        verdict = (
            f"verdict: PASS - the conversion trains like the original on 1 process and keeps "
            f"{processes} ranks in step"
        )
        if evaluation_read == "read":
            verdict += "; its evaluation was read from the code, not run (`--to-end` runs it)"
        elif evaluation_read == "blind":
            verdict += (
                "; no evaluation was found in the code to read, and the runs stopped before "
                "any (`--to-end` runs every evaluation)"
            )
        return verdict
    failed = [check.title.split(":")[0] for check in checks if not check.passed]
    return "verdict: FAIL - " + "; ".join(failed)


def _progress(as_json: bool, message: str) -> None:
    if not as_json:
        click.echo(f"accelify verify: {message}", err=True)
    sys.stderr.flush()
