"""`accelify verify` on a project whose evaluation runs in another module of it (trial12: the
loop in ``src/engine.py``, the loader prepared in ``train.py`` and handed in as a dict entry):
check 3, read from the code, reads the imported module with what the script's calls hand it;
the probe counts the passes of the module's loops, so a run to the end checks them too; a
script where no evaluation is found says so as a blind spot, not a pass; the checks shown are
numbered without gaps (`checks.numbered`).

fixtures/verify/project/: ``original/`` (plain PyTorch), ``ungathered/`` (its conversion with
the loaders prepared and the module's evaluation left ungathered), ``gathered/`` (right).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from accelify.verify.checks import CheckResult
from accelify.verify.evaluation_code import check_evaluation_code
from accelify.verify.probe import in_project
from accelify.verify.records import LoaderPass
from conftest import FIXTURES, run_accelify

PROJECT = FIXTURES / "verify" / "project"


def _check(folder: str, *, with_project: bool = True) -> CheckResult:
    script = PROJECT / folder / "train.py"
    path = script.resolve() if with_project else None
    return check_evaluation_code(script.read_text(), str(script), steps=5, path=path)


def test_check_3_reads_the_evaluation_in_the_module_the_script_imports():
    check = _check("ungathered")
    assert not check.passed, check.verdict
    assert check.rows == [["engine.py:22", "for x, y in loader:", "ONE SHARD at line 24"]]
    assert check.verdict.startswith("FAIL: line 24 of engine.py accumulates a metric")


def test_check_3_passes_the_module_s_gathered_evaluation():
    check = _check("gathered")
    assert check.passed, check.verdict
    assert check.rows == [["engine.py:22", "for x, y in loader:", "gathered"]]
    assert check.verdict.startswith("pass: the evaluation loop at engine.py:22 gathers")


def test_an_evaluation_check_that_finds_no_loop_says_so_and_does_not_call_it_a_pass():
    """Read alone (as before: its imports not followed), the script holds no evaluation loop:
    the verdict names the blind spot instead of a plain "pass"."""
    check = _check("ungathered", with_project=False)
    assert check.rows == []
    assert check.verdict.startswith("not read: no evaluation loop over a DataLoader found")
    assert "a blind spot, not a pass" in check.verdict
    assert "`--to-end` runs every evaluation" in check.verdict


def test_a_pass_is_named_by_its_module_and_line():
    assert LoaderPass(22, 3, 0, 0, module="src/engine.py").where == "src/engine.py:22"
    assert LoaderPass(22, 3, 0, 0).where == "line 22"
    assert LoaderPass(22, 3, 0, 0, module="a.py").place != LoaderPass(22, 3, 0, 0).place


def test_the_probe_counts_loops_of_the_project_s_files_only(tmp_path: Path):
    """A module beside the script is the project's; a library's (an environment kept in the
    project's folder, accelify's own runtime) and a file elsewhere are not."""
    folder = tmp_path.resolve()
    (folder / "src").mkdir()
    (folder / "src" / "engine.py").write_text("")
    assert in_project(str(folder / "src" / "engine.py"), folder)
    assert not in_project(str(folder / ".venv" / "lib" / "site-packages" / "x.py"), folder)
    assert not in_project(str(Path(sys.prefix) / "lib" / "x.py"), folder)
    assert not in_project(str(Path(__file__)), folder)
    assert not in_project("<string>", folder)


@pytest.mark.distributed
def test_a_run_to_the_end_fails_the_module_s_ungathered_evaluation(tmp_path: Path):
    result = run_accelify(
        "verify",
        PROJECT / "original" / "train.py",
        PROJECT / "ungathered" / "train.py",
        "--to-end",
        "--json",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    check_1, check_2 = report["checks"]
    assert check_1["passed"] is True  # on one process nothing is missing
    assert check_2["passed"] is False
    assert "the evaluation loop at engine.py:22 runs over 3 of 6 batches" in check_2["verdict"]
    assert "gathers nothing" in check_2["verdict"]


@pytest.mark.distributed
def test_the_default_run_fails_the_module_s_ungathered_evaluation(tmp_path: Path):
    result = run_accelify(
        "verify",
        PROJECT / "original" / "train.py",
        PROJECT / "ungathered" / "train.py",
        "--json",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert [c["title"].split(":")[0] for c in report["checks"]] == [
        "check 1",
        "check 2",
        "check 3",
    ]
    assert report["checks"][2]["verdict"].startswith("FAIL: line 24 of engine.py accumulates")
    assert report["verdict"] == "verdict: FAIL - check 3"
