"""`accelify verify`: conversions of runnable fixtures of different shapes verify clean on 1 and 2
processes, and deliberately broken conversions are caught by the check that should catch them.

Each broken conversion in fixtures/verify/broken/ is the converter's output for
fixtures/verify/original.py with one mistake, named by its first line: ``# expect: check N:
<words of that check's verdict>``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from accelify.convert import convert_source
from accelify.verify.checks import check_ranks
from accelify.verify.evaluation_code import check_evaluation_code
from accelify.verify.learning_rates import ScheduleComparison, compare_learning_rates
from accelify.verify.records import LoaderPass, OptimizerAtPass, StepRecord
from accelify.verify.runs import Run
from conftest import FIXTURES, assert_ok, run_accelify

#: The original trains in processes it starts itself (mp.spawn), where the probe is not: verify
#: cannot compare it (test below); the conversion itself is run on 1 and 2 ranks by
#: test_convert_e2e.
SPAWNS = FIXTURES / "scripts" / "spawn_worker.py"
#: One of each shape verify must not fail (mixed precision added, accumulation, a trainer class,
#: early stopping, evaluations of several shapes). Every conversion of fixtures/scripts/ runs on 1
#: and 2 ranks in test_convert_e2e, and the runnable golden cases pass `verify --to-end` in
#: test_convert_runnable.
SCRIPTS = [
    FIXTURES / "scripts" / f"{name}.py"
    for name in ("amp_clip", "class_trainer", "early_stop", "eval_shapes", "grad_accumulation")
]
ORIGINAL = FIXTURES / "verify" / "original.py"
#: Diverges at step 1: verified (text output, with the changed lines nearest the divergence) by
#: test_the_first_divergence_shows_the_nearest_changed_lines, not launched twice.
DIVERGES = FIXTURES / "verify" / "broken" / "loss_divided_twice.py"
BROKEN = sorted(set((FIXTURES / "verify" / "broken").glob("*.py")) - {DIVERGES})
STEPS = "3"


def verify(*args: str | Path, cwd: Path, timeout: float = 300):
    return run_accelify("verify", "--steps", STEPS, *args, cwd=cwd, timeout=timeout)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_runnable_conversions_verify_clean(script: Path, tmp_path: Path):
    before = sorted(p.name for p in script.parent.iterdir())
    result = verify(script, cwd=tmp_path)
    assert_ok(result)
    assert "check 1" in result.stdout and "check 2" in result.stdout
    assert "verdict: PASS" in result.stdout
    # 3 steps end before eval_shapes' evaluations run: check 3 reads them from the code, and
    # the verdict says so; the other scripts have no evaluation loop to read
    assert "check 3: evaluation, read from the converted code" in result.stdout
    read = "its evaluation was read from the code, not run (`--to-end` runs it)"
    assert result.stdout.rstrip().endswith(read) == (script.stem == "eval_shapes"), result.stdout
    # the scripts ran in a scratch directory: nothing written beside them or in the cwd
    assert sorted(p.name for p in script.parent.iterdir()) == before
    assert list(tmp_path.iterdir()) == []


def test_an_original_that_spawns_its_own_processes_is_not_compared(tmp_path: Path):
    result = verify(SPAWNS, cwd=tmp_path)
    assert result.returncode == 2
    assert "makes no optimizer step: nothing to compare" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("broken", BROKEN, ids=lambda p: p.stem)
def test_broken_conversions_are_caught_by_the_right_check(broken: Path, tmp_path: Path):
    expect = broken.read_text().splitlines()[0].removeprefix("# expect: ")
    check, words = expect.split(": ", 1)
    # No case runs into the deadline: it only bounds a detection that broke. Under load (a
    # shared machine) reporting mismatched collectives, after its 5 s grace, took over 30 s.
    result = verify(ORIGINAL, broken, "--json", "--timeout", "120", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is False
    by_title = {c["title"].split(":")[0]: c for c in report["checks"]}
    assert by_title[check]["passed"] is False, report
    assert words in by_title[check]["verdict"], by_title[check]["verdict"]


def test_the_first_divergence_shows_the_nearest_changed_lines(tmp_path: Path):
    """Also the broken case DIVERGES, caught by the check its first line names."""
    expect = DIVERGES.read_text().splitlines()[0]
    assert expect == "# expect: check 1: diverge at step 1"
    result = verify(ORIGINAL, DIVERGES, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.rstrip().splitlines()[-1] == "verdict: FAIL - check 1"
    check_1 = result.stdout[result.stdout.index("check 1") : result.stdout.index("check 2")]
    assert "  -> FAIL: the scripts diverge at step 1" in check_1
    assert "nearest to the code that ran" in result.stdout
    assert "+             loss = nn.functional.mse_loss(model(x), y) / accum" in result.stdout


def test_an_original_that_fails_on_its_own_is_not_blamed_on_the_conversion(tmp_path: Path):
    script = tmp_path / "needs_data.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "data = torch.load('missing-data.pt')\n"
        "loader = DataLoader(data, batch_size=4)\nmodel = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in loader:\n    model(x).sum().backward()\n    opt.step()\n"
    )
    result = verify(script, cwd=tmp_path)
    assert result.returncode == 2
    assert "the original script fails on its own" in result.stderr
    assert "missing-data.pt" in result.stderr
    assert "Traceback (most recent call last)" in result.stderr  # the script's, shown as its own


def test_an_original_stopped_at_the_timeout_is_said_to_have_timed_out(tmp_path: Path):
    """A run stopped at the deadline may only be slow: the message says it timed out and names
    ``--timeout``, not that the script fails on its own."""
    script = tmp_path / "slow.py"
    script.write_text(
        "import time\nimport torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(torch.randn(8, 2), batch_size=4)\nmodel = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in loader:\n    time.sleep(60)\n    model(x).sum().backward()\n    opt.step()\n"
    )
    result = verify(script, "--timeout", "1", cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert "the original script timed out" in result.stderr
    assert "after 1 s (--timeout)" in result.stderr
    assert "--timeout 60" in result.stderr
    assert "fails on its own" not in result.stderr


def test_usage_errors_exit_2(tmp_path: Path):
    plain = tmp_path / "plain.py"
    plain.write_text("print('no training here')\n")
    result = verify(plain, cwd=tmp_path)
    assert result.returncode == 2
    assert "nothing to verify" in result.stderr
    assert run_accelify("verify", tmp_path / "missing.py").returncode == 2


def test_a_driver_that_trains_through_another_module_is_told_how_to_verify_it(tmp_path: Path):
    # converted alone it is left as it is: its folder's conversion converts it with the module
    project = tmp_path / "project"
    shutil.copytree(FIXTURES / "projects" / "engine_module_of_a_driver", project)
    result = verify(project / "main.py", cwd=project)
    assert result.returncode == 2
    assert "of another module" in result.stderr
    assert "convert a copy of its folder (`accelify convert COPY --write`)" in result.stderr
    assert "main.py COPY/main.py`" in result.stderr


EVALUATION = FIXTURES / "verify" / "evaluation"


def test_to_the_end_a_different_printed_line_fails_check_1(tmp_path: Path):
    converted = convert_source((EVALUATION / "original.py").read_bytes(), "original.py")
    changed = tmp_path / "changed.py"
    changed.write_bytes(converted.converted.replace(b"accuracy {correct}", b"acc {correct}"))
    result = run_accelify(
        "verify", EVALUATION / "original.py", changed, "--to-end", "--json", cwd=tmp_path
    )
    assert result.returncode == 1, result.stdout + result.stderr
    check_1 = json.loads(result.stdout)["checks"][0]
    assert check_1["passed"] is False
    assert "the printed output differs: line 1" in check_1["verdict"]


def test_an_evaluation_computed_from_one_shard_fails_check_2(tmp_path: Path):
    """The converter's output with its gather removed: on 2 ranks the accuracy covers half the
    evaluation set, and verify names the loop."""
    result = run_accelify(
        "verify",
        EVALUATION / "original.py",
        EVALUATION / "ungathered.py",
        "--to-end",
        "--json",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    check_1, check_2 = json.loads(result.stdout)["checks"]
    assert check_1["passed"] is True  # on one process nothing is missing
    assert check_2["passed"] is False
    assert "the evaluation loop at line 30" in check_2["verdict"]
    assert "gathers nothing" in check_2["verdict"]


def test_an_evaluation_over_an_unprepared_loader_that_gathers_fails_check_2(tmp_path: Path):
    """The converter's output with its evaluation loader left out of prepare: every rank
    evaluates the whole set, and the gather joins one copy per rank (what ACC401 says at the
    loop)."""
    result = run_accelify(
        "verify",
        EVALUATION / "original.py",
        EVALUATION / "unprepared_gathered.py",
        "--to-end",
        "--json",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    check_1, check_2 = json.loads(result.stdout)["checks"]
    assert check_1["passed"] is True  # on one process the gather joins one copy
    assert check_2["passed"] is False
    assert "the evaluation loop at line 29 runs over all 5 batches" in check_2["verdict"]
    assert "joins 2 copies of every sample" in check_2["verdict"]


def test_a_short_run_reads_the_evaluation_from_the_code():
    """Check 3 of a run cut short: the gathered conversion passes, the same code with its gather
    removed fails at the line that accumulates one rank's shard."""
    gathered = convert_source((EVALUATION / "original.py").read_bytes(), "original.py")
    check = check_evaluation_code(gathered.converted.decode(), "original.py", steps=5)
    assert check.passed, check.verdict
    assert check.rows == [["29", "for x, y in eval_loader:", "gathered"]]
    ungathered = (EVALUATION / "ungathered.py").read_text()
    check = check_evaluation_code(ungathered, "ungathered.py", steps=5)
    assert not check.passed
    assert check.verdict.startswith("FAIL: converted line 32 accumulates a metric"), check.verdict
    assert check.rows == [["30", "for x, y in eval_loader:", "ONE SHARD at line 32"]]


def test_check_3_reads_rows_written_per_batch_as_the_conversion_does():
    """A CSV written row by row in the loop over a prepared test loader keeps every batch's rows,
    as a list does. The conversion gathers before the rows are made, and check 3 says so; the
    same code without that gather (what the conversion made before) writes rank 0's shard only,
    and check 3 said "gathers what it accumulates" and passed: it fails at the write."""
    case = FIXTURES / "convert" / "rows_written_per_batch_to_a_csv"
    converted = (case / "after.py").read_text()
    check = check_evaluation_code(converted, "after.py", steps=5)
    assert check.passed, check.verdict
    assert [row[2] for row in check.rows] == ["gathered", "gathered"]
    gather = "                    outputs, y = self.accelerator.gather_for_metrics((outputs, y))\n"
    assert converted.count(gather) == 1
    check = check_evaluation_code(converted.replace(gather, ""), "after.py", steps=5)
    assert not check.passed
    write = 'w.writerow([yi, int(pi[1] > 0.5), f"{pi[1]:.4f}"])'
    line = next(n for n, text in enumerate(converted.splitlines(), 1) if write in text) - 1
    assert check.verdict.startswith(f"FAIL: converted line {line} accumulates"), check.verdict
    assert check.rows[1][2] == f"ONE SHARD at line {line}"


def test_check_3_claims_no_gather_of_a_loop_that_keeps_nothing():
    """A loop over a prepared loader that prints each batch's loss keeps nothing past the batch:
    nothing to gather, and check 3 does not say it gathers."""
    code = (
        "import torch\nfrom accelify import Accelerator\n\n"
        "accelerator = Accelerator()\n"
        "model = torch.nn.Linear(4, 2)\n"
        "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset("
        "torch.randn(8, 4), torch.zeros(8, dtype=torch.long)), batch_size=4)\n"
        "model, loader = accelerator.prepare(model, loader)\n"
        "with torch.no_grad():\n"
        "    for x, y in loader:\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        accelerator.print(loss.item())\n"
    )
    check = check_evaluation_code(code, "show.py", steps=5)
    assert check.passed, check.verdict
    assert check.rows == [["9", "for x, y in loader:", "keeps nothing past each batch"]]
    assert check.verdict.startswith("pass: the loop at line 9 keeps nothing past each batch")


SHARD_LOSS = FIXTURES / "verify" / "shard_loss_printed.py"


def test_the_reviews_numbers_that_differ_on_n_ranks_are_listed():
    """The conversion's review says the printed training loss covers one rank's shard on N
    ranks: the check lists that line, passes (the runs cannot tell it wrong), and a PASS
    verdict names it instead of standing unqualified."""
    from accelify.verify.review_notes import caveat, check_rank_reviews

    conversion = convert_source(SHARD_LOSS.read_bytes(), SHARD_LOSS)
    check = check_rank_reviews(conversion.reviews, "shard_loss_printed.py", 2)
    assert check is not None and check.passed
    ((place, text),) = check.rows
    assert place == "shard_loss_printed.py:21"
    assert "on N ranks it reads about 1/N of the value" in text
    assert check.verdict.startswith("see the review: on 2 ranks the converted script computes")
    check.title = "check 3: " + check.title
    assert caveat(check, 2) == (
        "; but the conversion's review says 1 number differs on 2 ranks "
        "(shard_loss_printed.py:21: check 3)"
    )
    others = [note for note in conversion.reviews if note.line != 21]
    assert check_rank_reviews(others, "shard_loss_printed.py", 2) is None


def test_the_reviews_numbers_are_read_from_the_note_kind_not_its_wording():
    """verify lists the notes the conversion marks as differing on N ranks, whatever their
    words: a rewording of a review line does not change what verify says."""
    from accelify.edits.plan import Note, NoteKind
    from accelify.verify.review_notes import check_rank_reviews

    marked = Note(4, "train_mse covers this rank's shard", NoteKind.DIFFERS_ON_N_RANKS)
    worded = Note(9, "the loader is left whole: right on N ranks as it is")
    check = check_rank_reviews([marked, worded], "train.py", 2)
    assert check is not None
    assert check.rows == [["train.py:4", "train_mse covers this rank's shard"]]
    assert check_rank_reviews([worded], "train.py", 2) is None


_ENUMERATE_INDEX = (
    FIXTURES / "convert" / "validation_loss_divided_by_an_alias_of_the_last_enumerate_index"
)
_FUNCTION_OF_MEANS = (
    FIXTURES
    / "convert"
    / "loaders_prepared_by_the_constructor_read_through_the_attributes_it_keeps"
)


@pytest.mark.parametrize(
    ("source", "line", "marked"),
    [
        # the quotient of the last enumerate index over val_loader, which is left whole: every
        # rank computes the original's number (the text says what prepared would change)
        ((_ENUMERATE_INDEX / "before.py").read_text(), 15, False),
        ((_ENUMERATE_INDEX / "before.py").read_text(), 41, False),
        # the same over the prepared train_loader: each rank takes N times fewer steps
        (
            (_ENUMERATE_INDEX / "before.py")
            .read_text()
            .replace("enumerate(val_loader)", "enumerate(train_loader)"),
            41,
            True,
        ),
        # gathered, the mean of a function of batch means is not one process's, though the
        # caveat's words lack "on N ranks"
        ((_FUNCTION_OF_MEANS / "before.py").read_text(), 40, True),
    ],
    ids=[
        "whole-loader-enumerate-index-in-a-helper",
        "whole-loader-enumerate-index",
        "prepared-loader-enumerate-index",
        "caveat-function-of-batch-means",
    ],
)
def test_the_evaluations_reviews_are_marked_when_their_number_differs_on_n_ranks(
    source: str, line: int, marked: bool
):
    """Where the old match of "on N ranks" in the text was wrong: over a loader left whole,
    and a caveat worded another way."""
    from accelify.verify.review_notes import differs_on_n_ranks

    conversion = convert_source(source.encode(), "train.py")
    (note,) = [n for n in conversion.reviews if n.line == line and "evaluation" in n.text]
    assert differs_on_n_ranks(note) is marked, note.text


@pytest.mark.distributed
def test_a_run_to_the_end_passes_naming_the_number_the_review_says_differs(tmp_path: Path):
    """trial22's train_reg.py: its printed train_mse is about 1/N on N ranks, as the
    conversion's review says, and `verify --to-end` said a bare PASS."""
    result = run_accelify("verify", SHARD_LOSS, "--to-end", cwd=tmp_path)
    assert_ok(result)
    verdict = result.stdout.rstrip().splitlines()[-1]
    assert verdict.startswith("verdict: PASS"), result.stdout
    assert verdict.endswith(
        "; but the conversion's review says 1 number differs on 2 ranks "
        "(shard_loss_printed.py:21: check 3)"
    ), verdict
    assert "check 3: numbers the conversion's review says differ on N ranks" in result.stdout


def test_check_3_says_an_unprepared_evaluation_reads_the_whole_set():
    """The converter leaves this evaluation as it is and its loader unprepared: nothing gathers
    it, and check 3 says why it still covers the set (every rank reads all of it) rather than
    calling it gathered."""
    script = EVALUATION / "left_for_review.py"
    conversion = convert_source(script.read_bytes(), script)
    check = check_evaluation_code(conversion.converted.decode(), "left_for_review.py", steps=5)
    assert check.passed, check.verdict
    assert [row[2] for row in check.rows] == ["whole set: its loader is not prepared"]
    assert "no prepare call shards: every rank evaluates the whole set" in check.verdict
    assert "gathers" not in check.verdict


@pytest.mark.distributed
def test_the_default_run_fails_a_conversion_that_evaluates_one_shard(tmp_path: Path):
    """The converter leaves this evaluation as it is (a review line) and its loader whole. A
    conversion that prepares that loader anyway evaluates one rank's shard on each rank: 5
    steps end before the evaluation runs, and check 3 fails it from the code instead of passing
    what was not run."""
    script = EVALUATION / "left_for_review.py"
    conversion = convert_source(script.read_bytes(), script)
    assert conversion.reviews  # left for review, not gathered
    whole = "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)"
    sharded = (
        "model, optimizer, train_loader, eval_loader = accelerator.prepare(\n"
        "    model, optimizer, train_loader, eval_loader\n)"
    )
    assert whole in conversion.converted.decode()  # the loader it evaluates stays whole
    broken = tmp_path / "converted.py"
    broken.write_text(conversion.converted.decode().replace(whole, sharded))
    result = run_accelify("verify", script, broken, "--json", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    check_1, check_2, check_3 = report["checks"]
    assert check_1["passed"] and check_2["passed"]  # the steps themselves are right
    assert check_3["passed"] is False
    assert "accumulates a metric from this rank's shard" in check_3["verdict"]
    assert report["verdict"] == "verdict: FAIL - check 3"


def test_a_progress_bar_is_compared_as_its_last_drawing_without_its_times():
    from accelify.verify.checks import _printed_lines

    bar = "\rtrain:   0%|  | 0/4 [00:00<?, ?it/s]\rtrain: 50%|# | 2/4 [00:00<00:00, {}it/s]"
    done = "\rtrain (loss 0.5): 100%|##| 4/4 [00:0{}<00:00, {}it/s]\n"
    first = "epoch 1\n" + bar.format("18.8") + done.format(0, "49.68") + "saved\n"
    second = "epoch 1\n" + done.format(1, "97.14") + "saved\n"
    assert (
        _printed_lines(first)
        == _printed_lines(second)
        == [
            "epoch 1",
            "train (loss 0.5): 100%|##| 4/4 [...]",
            "saved",
        ]
    )
    # a value printed by the script itself is still compared
    assert _printed_lines("loss [00:01, 3.2]\n") == ["loss [00:01, 3.2]"]


SCHEDULE = FIXTURES / "verify" / "schedule"


@pytest.mark.parametrize("original", ["per_epoch", "per_batch"])
def test_a_schedule_kept_on_two_ranks_passes(original: str, tmp_path: Path):
    """The converter's output: a per-epoch scheduler prepared with
    step_scheduler_with_optimizer=False, a per-batch one prepared (it steps once per rank). The
    per-batch original has 7 batches, 4 per rank once padded: the schedule runs one step ahead
    per epoch on 2 ranks, as on Hugging Face Accelerate, and that is not a difference."""
    script = SCHEDULE / f"{original}.py"
    result = run_accelify("verify", script, "--to-end", cwd=tmp_path, timeout=300)
    assert_ok(result)
    assert "learning rates as the original's at the start of 3 training passes" in result.stdout
    # --to-end compares every printed line (one per epoch) of the runs on one process
    assert "all 3 printed lines identical" in result.stdout
    assert "verdict: PASS" in result.stdout


@pytest.mark.parametrize(
    ("original", "broken"),
    [
        ("per_epoch", "per_epoch_scheduler_prepared"),
        ("per_batch", "per_batch_scheduler_unprepared"),
    ],
)
def test_a_schedule_changed_on_two_ranks_fails_check_2(original: str, broken: str, tmp_path: Path):
    """On one process the conversion steps exactly as the original (check 1 passes) and the
    ranks agree with each other; only the original's learning rates tell."""
    converted = SCHEDULE / "broken" / f"{broken}.py"
    expect = converted.read_text().splitlines()[0].removeprefix("# expect: check 2: ")
    result = run_accelify(
        "verify",
        SCHEDULE / f"{original}.py",
        converted,
        "--to-end",
        "--json",
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    check_1, check_2 = json.loads(result.stdout)["checks"]
    assert check_1["passed"] is True
    assert check_2["passed"] is False
    assert expect in check_2["verdict"], check_2["verdict"]
    assert "the first optimizer to step (made at line" in check_2["verdict"]


def _record(step: int, lr: float) -> StepRecord:
    return StepRecord(step, 0, (1.0,), (1.0,), None, None, made=0, lrs=(lr,))


def _pass(steps: int, lr: float) -> LoaderPass:
    return LoaderPass(10, 4, 4, 0, (OptimizerAtPass(0, 5, steps, (lr,)),))


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a == b


def test_learning_rates_match_within_the_steps_a_padded_shard_adds():
    """The original: 7 steps per pass, lr 1 - k/100 at its k-th step. On 2 ranks, 4 steps per
    rank per pass: a prepared scheduler is at 8 as the second pass starts (the original at 7),
    an unprepared one at 4."""
    original = [_record(k + 1, 1 - k / 100) for k in range(21)]
    passes = [_pass(0, 1.0), _pass(7, 0.93), _pass(14, 0.86)]
    ahead = [[_record(k + 1, 1 - 2 * k / 100) for k in range(12)]] * 2
    prepared = [[_pass(0, 1.0), _pass(4, 0.92), _pass(8, 0.84)]] * 2
    result = compare_learning_rates(original, passes, ahead, prepared, _same)
    assert result == ScheduleComparison(3, None)
    behind = [[_pass(0, 1.0), _pass(4, 0.96), _pass(8, 0.92)]] * 2
    result = compare_learning_rates(original, passes, ahead, behind, _same)
    assert result.difference is not None
    assert "at the start of training pass 2" in result.difference
    assert "has lr 0.96 on rank 0, the original lr 0.93 on one process" in result.difference
    # more than N - 1 steps ahead is not padding
    far = [[_pass(0, 1.0), _pass(4, 0.90), _pass(8, 0.84)]] * 2
    assert compare_learning_rates(original, passes, ahead, far, _same).difference is not None


def test_a_script_that_counts_optimizer_steps_is_compared_step_by_step():
    """``while step < max_steps:`` around the loop over the loader: every rank makes the
    original's 12 steps over passes half as long, so its passes start at other steps; the rates
    at each step are what must match. Stopped early, the same records pass too."""
    original = [_record(k + 1, 1 - k / 100) for k in range(12)]
    passes = [_pass(0, 1.0), _pass(6, 0.94)]
    ranks = [original] * 2
    halves = [[_pass(0, 1.0), _pass(3, 0.97), _pass(6, 0.94), _pass(9, 0.91)]] * 2
    result = compare_learning_rates(original, passes, ranks, halves, _same)
    assert result == ScheduleComparison(12, None, by_step=True)
    assert compare_learning_rates(original, passes, ranks, halves, _same, to_end=False) == (
        ScheduleComparison(12, None, by_step=True)
    )
    faster = [[_record(k + 1, 1 - 2 * k / 100) for k in range(12)]] * 2
    result = compare_learning_rates(original, passes, faster, halves, _same)
    assert result.difference is not None
    assert "at optimizer step 2 (every rank makes the original's steps)" in result.difference


def _step(step: int, optimizer: int, loss: float, line: int) -> StepRecord:
    return StepRecord(step, optimizer, (loss,), (1.0,), line, line)


def test_an_optimizer_whose_losses_repeat_on_every_rank_is_named_not_called_sharded():
    """A GAN seeded alike on every rank: the discriminator's losses differ per shard, the
    generator's (fed the same noise on each rank) are the same at every step. Check 2 still
    passes (the ranks are in step) but does not say the losses differ per shard."""
    rank_0 = [
        _step(1, 0, 0.7, 36),
        _step(2, 1, 0.5, 40),
        _step(3, 0, 0.6, 36),
        _step(4, 1, 0.4, 40),
    ]
    rank_1 = [
        _step(1, 0, 0.8, 36),
        _step(2, 1, 0.5, 40),
        _step(3, 0, 0.9, 36),
        _step(4, 1, 0.4, 40),
    ]
    run = Run("converted", 2, 0, "", ranks=[rank_0, rank_1])
    result = check_ranks(run, 0.0)
    assert result.passed, result.verdict
    assert "losses differ per shard except those of the optimizer stepped at line 40" in (
        result.verdict
    )
    assert "each rank repeats its work" in result.verdict
    split = [rank_0, [*rank_1[:3], _step(4, 1, 0.3, 40)]]
    result = check_ranks(Run("converted", 2, 0, "", ranks=split), 0.0)
    assert result.verdict.startswith(
        "pass: 4 steps, parameters identical on every rank, losses differ per shard"
    )
    assert "except" not in result.verdict


SHARED_LOOP = """
import torch
from torch.utils.data import DataLoader, TensorDataset


def run_epoch(model, loader, optimizer, train):
    model.train(train)
    total = 0.0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if train:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        total += loss.item()
    return total / len(loader)


def main():
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    train_loader = DataLoader(data, batch_size=8, shuffle=True)
    val_loader = DataLoader(data, batch_size=8)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        run_epoch(model, train_loader, optimizer, train=True)
        print(epoch, run_epoch(model, val_loader, optimizer, train=False))


main()
"""


def test_check_3_reads_an_evaluation_through_a_loop_that_also_trains():
    """``run_epoch(model, val_loader, ..., train=False)``: the conversion finds this evaluation
    (and leaves its loader unprepared); check 3 reads the same analysis, not "no evaluation
    loop found"."""
    conversion = convert_source(SHARED_LOOP.encode(), "shared.py")
    assert any("val_loader is evaluated by run_epoch()" in r.text for r in conversion.reviews)
    check = check_evaluation_code(conversion.converted.decode(), "shared.py", steps=5)
    assert check.passed, check.verdict
    ((_, header, verdict),) = check.rows
    assert header == "run_epoch(..., val_loader, ...)"
    assert verdict == "whole set: its loader is not prepared"
    assert "no evaluation loop" not in check.verdict


def test_check_3_reads_a_loader_prepared_where_it_is_handed_to_a_loop_that_also_trains():
    """``trainer.run_epoch(trainer.accelerator.prepare(test_loader))``, through the trainer's
    loop that also trains (a trial's test pass, prepared at the call): its totals are one
    rank's shard, and check 3 lists that pass (it was left out of the rows, and passed)."""
    case = FIXTURES / "convert" / "test_pass_through_a_loop_that_also_trains_reads_its_loader_whole"
    converted = (case / "after.py").read_text(encoding="utf-8")
    handed = "trainer.run_epoch(test_loader)"
    assert handed in converted
    converted = converted.replace(
        handed, "trainer.run_epoch(trainer.accelerator.prepare(test_loader))"
    )
    check = check_evaluation_code(converted, "after.py", steps=5)
    assert not check.passed, check.verdict
    rows = {header: verdict for _, header, verdict in check.rows}
    assert rows["trainer.run_epoch(..., test_loader, ...)"].startswith("ONE SHARD"), rows
    assert rows["self.run_epoch(..., val_loader, ...)"] == "whole set: its loader is not prepared"


def test_loaders_zipped_on_one_for_line_share_the_steps_backward(tmp_path: Path):
    """``for a, b in zip(loader_a, loader_b):`` starts both passes on one line before either
    yields: the step's backward belongs to both, so neither reads as an evaluation that gathers
    nothing (a multi-task script's conversion failed check 2 on its training loop)."""
    from accelify.verify.loader_passes import LoaderPasses

    script = tmp_path / "train.py"
    script.write_text("for a, b in zip(loader_a, loader_b):\n    pass\nfor x in val:\n")

    def frame(line: int) -> Any:  # what the pass reads of a frame: its file and line
        return SimpleNamespace(
            f_code=SimpleNamespace(co_filename=str(script)), f_lineno=line, f_back=None
        )

    loop = frame(1)
    passes = LoaderPasses(str(script), place=lambda: loop)
    first, second = passes.start(loop), passes.start(loop)
    assert first is not None and second is not None
    first["batches"], second["batches"] = 2, 2
    passes.backward += 2
    passes.start(frame(3))  # the evaluation after the loop closes the shared window
    passes.close_last()
    assert [p["backward"] for p in passes.passes] == [2, 2, 0]
