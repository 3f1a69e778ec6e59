"""`accelify lint` as users run it: output formats, exit codes, noqa, config, fixes, corpus."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accelify.lint.engine import lint_source
from accelify.lint.selection import Selection
from conftest import FIXTURES, assert_ok, run_accelify

BAD = """\
import torch
from accelify import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for x, y in loader:
    loss = model(x).sum()
    loss.backward()
    print(loss.item())
torch.save(model.state_dict(), "model.pt")
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(BAD)
    return tmp_path


def test_text_output_is_path_line_col_code_message(project: Path):
    result = run_accelify("lint", "train.py", cwd=project)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert (
        "train.py:8:5: ACC301 Call accelerator.backward(loss) instead of loss.backward()" in lines
    )
    assert any(line.startswith("train.py:10:1: ACC201 ") for line in lines)
    assert any(line.startswith("train.py:10:12: ACC503 ") for line in lines)
    assert "Found 3 errors." in result.stdout
    assert "ACC203" not in result.stdout  # opt-in: N copies of a log line are not a bug
    extended = run_accelify("lint", "--extend-select", "ACC203", "train.py", cwd=project)
    assert any(line.startswith("train.py:9:5: ACC203 ") for line in extended.stdout.splitlines())
    assert "Found 4 errors." in extended.stdout


def test_clean_file_exits_0(tmp_path: Path):
    shutil.copy(FIXTURES / "examples" / "classify.py", tmp_path / "classify.py")
    result = run_accelify("lint", "classify.py", cwd=tmp_path)
    assert_ok(result)
    assert "All checks passed!" in result.stdout


def test_fix_applies_safe_fixes_and_fixing_again_changes_nothing(project: Path):
    result = run_accelify("lint", "--fix", "--extend-select", "ACC203", "train.py", cwd=project)
    assert result.returncode == 0
    assert "Fixed 4 errors (0 remaining)." in result.stdout
    fixed = (project / "train.py").read_text()
    assert "accelerator.backward(loss)" in fixed
    assert "accelerator.print(loss.item())" in fixed
    assert (  # the barrier `convert` puts before a save comes with the fix
        "accelerator.wait_for_everyone()\n"
        'accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")'
    ) in fixed
    assert_ok(run_accelify("lint", "--fix", "train.py", cwd=project))
    assert (project / "train.py").read_text() == fixed


def test_fix_reports_what_remains(project: Path):
    (project / "train.py").write_text(
        BAD + "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n"
    )
    result = run_accelify("lint", "--fix", "train.py", cwd=project)
    assert result.returncode == 1
    assert "Fixed 3 errors (1 remaining)." in result.stdout
    assert "ACC202" in result.stdout


def test_fixes_use_an_accelerator_only_where_one_is_bound(tmp_path: Path):
    source = (
        "from accelify import Accelerator\n\n\n"
        "def train(model, loader):\n"
        "    for x, y in loader:\n"
        "        loss = model(x).sum()\n"
        "        loss.backward()\n"
        "        print(loss.item())\n\n\n"
        "def main():\n"
        "    accelerator = Accelerator()\n"
        "    model, loader = accelerator.prepare(model, loader)\n"
        "    train(model, loader)\n"
    )
    (tmp_path / "train.py").write_text(source)
    result = run_accelify("lint", "--fix", "train.py", cwd=tmp_path)
    assert result.returncode == 1  # reported, not fixed: `accelerator` is not visible in train()
    assert "ACC301" in result.stdout
    assert (tmp_path / "train.py").read_text() == source


def test_jobs_report_and_fix_the_same_as_one_process(project: Path):
    for index in range(3):
        (project / f"copy_{index}.py").write_text(BAD)
    serial = run_accelify("lint", "--exit-zero", ".", cwd=project)
    parallel = run_accelify("lint", "--exit-zero", "--jobs", "2", ".", cwd=project)
    assert_ok(parallel)
    assert parallel.stdout == serial.stdout
    assert parallel.stderr == serial.stderr  # the summary, with the fixable count
    assert_ok(run_accelify("lint", "--fix", "--jobs", "2", ".", cwd=project))
    assert all("accelerator.backward(loss)" in p.read_text() for p in project.glob("*.py"))


def test_diff_shows_fixes_without_writing_and_exits_1(project: Path):
    result = run_accelify("lint", "--diff", "train.py", cwd=project)
    assert result.returncode == 1
    assert "+    accelerator.backward(loss)" in result.stdout
    assert "+++ train.py\t(fixed)" in result.stdout
    assert "Would fix 3 errors." in result.stdout
    assert (project / "train.py").read_text() == BAD
    (project / "clean.py").write_text("print('nothing to fix')\n")
    assert_ok(run_accelify("lint", "--diff", "clean.py", cwd=project))


def test_diff_of_a_file_without_final_newline_ends_its_last_line(project: Path):
    (project / "train.py").write_text(BAD.rstrip("\n"))
    merged = subprocess.run(
        [sys.executable, "-m", "accelify", "lint", "--diff", "train.py"],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert merged.returncode == 1
    *diff, summary = merged.stdout.splitlines()
    assert diff[-1] == '+accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")'
    assert summary.startswith("Would fix "), merged.stdout


def test_statistics_prints_only_the_counts(project: Path):
    result = run_accelify("lint", "--statistics", "train.py", cwd=project)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(line.split()[0] == "1" for line in lines)
    assert result.stderr == ""


def test_noqa_suppresses_one_code_or_all(project: Path):
    source = BAD.replace("loss.backward()", "loss.backward()  # noqa: ACC301")
    source = source.replace("print(loss.item())", "print(loss.item())  # noqa")
    (project / "train.py").write_text(source)
    codes = {f.code for f in lint_source(source.encode(), "train.py", Selection()).findings}
    assert codes == {"ACC201", "ACC503"}
    moved = BAD.replace('"model.pt")', '"model.pt")  # noqa: ACC204, ACC201')
    codes = {f.code for f in lint_source(moved.encode(), "train.py", Selection()).findings}
    assert codes == {"ACC301"}  # ACC204 is ACC503 now; the old code still suppresses


def test_select_ignore_and_pyproject_settings(project: Path):
    result = run_accelify("lint", "--select", "ACC3", "train.py", cwd=project)
    assert {line.split()[1] for line in _findings(result.stdout)} == {"ACC301"}
    (project / "pyproject.toml").write_text('[tool.accelify]\nignore = ["ACC2", "ACC5"]\n')
    result = run_accelify("lint", "train.py", cwd=project)
    assert {line.split()[1] for line in _findings(result.stdout)} == {"ACC301"}
    (project / "pyproject.toml").write_text(
        '[tool.accelify]\nper-file-ignores = {"train.py" = ["ACC301", "ACC2", "ACC503"]}\n'
    )
    assert_ok(run_accelify("lint", "train.py", cwd=project))
    (project / "pyproject.toml").write_text(
        '[tool.accelify]\nextend-select = ["ACC203"]\nignore = ["ACC5"]\n'
    )
    result = run_accelify("lint", "train.py", cwd=project)
    assert {line.split()[1] for line in _findings(result.stdout)} == {
        "ACC201",
        "ACC203",
        "ACC301",
    }


def test_selectors_are_prefixes_all_and_acc_select_everything(project: Path):
    default = _findings(run_accelify("lint", "train.py", cwd=project).stdout)
    everything = run_accelify("lint", "--select", "ALL", "train.py", cwd=project).stdout
    assert run_accelify("lint", "--select", "ACC", "train.py", cwd=project).stdout == everything
    assert set(_findings(everything)) - set(default) == {  # the opt-in rule
        "train.py:9:5: ACC203 Use accelerator.print in loops: it prints on the local main "
        "process only"
    }
    group = _findings(run_accelify("lint", "--select", "acc2", "train.py", cwd=project).stdout)
    assert {line.split()[1] for line in group} == {"ACC201", "ACC203"}


def _findings(stdout: str) -> list[str]:
    """The finding lines of a text report (without ruff's summary line after them)."""
    return [line for line in stdout.splitlines() if ": ACC" in line]


def test_an_unknown_selector_is_a_usage_error(project: Path):
    for option in ("--select", "--ignore"):
        result = run_accelify("lint", option, "FOO", "train.py", cwd=project)
        assert result.returncode == 2
        assert "'FOO'" in result.stderr and "Traceback" not in result.stderr
    (project / "pyproject.toml").write_text('[tool.accelify]\nselect = ["ACC9"]\n')
    result = run_accelify("lint", "train.py", cwd=project)
    assert result.returncode == 2 and "pyproject.toml" in result.stderr


def test_a_moved_code_still_selects_its_rule_with_a_warning(project: Path):
    result = run_accelify("lint", "--select", "ACC204", "train.py", cwd=project)
    assert [line.split()[1] for line in _findings(result.stdout)] == ["ACC503"]
    assert "ACC204 is now ACC503" in result.stderr


def test_syntax_errors_are_reported_whatever_is_selected(tmp_path: Path):
    (tmp_path / "broken.py").write_text("import torch\nfor x in range(3)\n    pass\n")
    for selection in (["--select", "ACC3"], ["--ignore", "ACC0"], ["--ignore", "ALL"]):
        result = run_accelify("lint", *selection, "broken.py", cwd=tmp_path)
        assert result.returncode == 1 and "ACC000" in result.stdout, selection


def test_plain_single_device_scripts_are_left_alone_whatever_is_selected(tmp_path: Path):
    shutil.copy(FIXTURES / "scripts" / "gan.py", tmp_path / "gan.py")
    assert_ok(run_accelify("lint", "gan.py", cwd=tmp_path))
    assert_ok(run_accelify("lint", "--select", "ACC301", "gan.py", cwd=tmp_path))


def test_a_pass_of_plain_scripts_alone_says_only_their_syntax_was_checked(tmp_path: Path):
    """A single-device script passes whatever is selected; the note says why (no accelerator:
    syntax only) and what makes it distributed, also when the cache answers, and only when
    every file linted was plain."""
    shutil.copy(FIXTURES / "scripts" / "gan.py", tmp_path / "gan.py")
    note = "no file here uses an accelerator, so only its syntax was checked"
    for _ in range(2):  # the second run reads the cache
        result = run_accelify("lint", "--select", "ALL", "gan.py", cwd=tmp_path)
        assert_ok(result)
        assert "All checks passed!" in result.stdout and note in result.stderr
        assert "accelify convert" in result.stderr and note not in result.stdout
    assert note not in run_accelify("lint", "--quiet", "gan.py", cwd=tmp_path).stderr
    shutil.copy(FIXTURES / "examples" / "classify.py", tmp_path / "classify.py")
    mixed = run_accelify("lint", "gan.py", "classify.py", cwd=tmp_path)
    assert_ok(mixed)
    assert "All checks passed!" in mixed.stdout and note not in mixed.stderr
    (tmp_path / "train.py").write_text(BAD)
    assert note not in run_accelify("lint", "train.py", "gan.py", cwd=tmp_path).stderr


def test_nothing_to_check_is_a_warning_not_a_pass(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    result = run_accelify("lint", "empty", cwd=tmp_path)
    assert result.returncode == 0
    assert "No Python files found" in result.stderr and "All checks passed" not in result.stdout


def test_a_named_folder_is_linted_even_when_gitignored(project: Path):
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    (project / ".gitignore").write_text("build/\n")
    (project / "build").mkdir()
    shutil.move(project / "train.py", project / "build" / "train.py")
    assert "No Python files found" in run_accelify("lint", ".", cwd=project).stderr
    named = run_accelify("lint", "build", cwd=project)
    assert named.returncode == 1 and "build/train.py:8:5: ACC301" in named.stdout


def test_syntax_error_is_acc000_not_a_crash(tmp_path: Path):
    (tmp_path / "broken.py").write_text("import torch\nfor x in range(3)\n    pass\n")
    result = run_accelify("lint", "broken.py", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.startswith("broken.py:2:18: ACC000 syntax error")
    assert "Traceback" not in result.stderr


def test_json_and_github_formats(project: Path):
    data = json.loads(
        run_accelify("lint", "--output-format", "json", "train.py", cwd=project).stdout
    )
    assert {"code", "message", "filename", "location", "fixable"} <= set(data[0])
    github = run_accelify("lint", "--output-format", "github", "train.py", cwd=project).stdout
    assert "::error title=accelify (ACC301),file=train.py,line=8,col=5::ACC301 " in github


def test_sarif_has_the_fields_code_scanning_reads(project: Path):
    sarif = json.loads(
        run_accelify("lint", "--output-format", "sarif", "train.py", cwd=project).stdout
    )
    assert sarif["version"] == "2.1.0" and "$schema" in sarif
    run = sarif["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "accelify" and driver["rules"]
    assert all({"id", "shortDescription"} <= set(rule) for rule in driver["rules"])
    rule_ids = {rule["id"] for rule in driver["rules"]}
    for result in run["results"]:
        assert result["ruleId"] in rule_ids
        assert result["message"]["text"]
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1


def test_rules_lists_and_documents_every_rule():
    listing = run_accelify("rules")
    assert_ok(listing)
    assert "ACC301  loss-backward" in listing.stdout
    marks = {
        line.split()[0]: line.split()[2]
        for line in listing.stdout.splitlines()
        if line.startswith("ACC")
    }
    assert marks["ACC201"] == "default" and marks["ACC206"] == "opt-in"
    assert "RNG state" in run_accelify("rules", "ACC206").stdout.split("## Default set")[1]
    page = run_accelify("rules", "acc201")
    assert_ok(page)
    for heading in (
        "## What it does",
        "## Why it breaks on N processes",
        "## Example",
        "## Use instead",
        "## Fix",
    ):
        assert heading in page.stdout
    assert run_accelify("rules", "ACC999").returncode == 2


def test_the_whole_fixture_corpus_lints_without_crashing():
    result = run_accelify("lint", "--exit-zero", "--statistics", FIXTURES)
    assert_ok(result)
    assert "Traceback" not in result.stderr


def test_lint_does_not_import_torch(project: Path):
    code = (
        "import sys\nfrom accelify.cli import main\n"
        f"try:\n    main(['lint', {str(project / 'train.py')!r}])\nexcept SystemExit:\n    pass\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "torch imported: False" in result.stdout, result.stderr


@pytest.mark.parametrize(
    "script", sorted((FIXTURES / "lint").glob("accelerate_*.py")), ids=lambda p: p.stem
)
def test_accelerate_style_scripts_lint_clean(script: Path):
    findings = lint_source(script.read_bytes(), str(script), Selection()).findings
    assert findings == []


def test_a_fix_is_plain_data_in_json_and_across_jobs(project: Path):
    (project / "other.py").write_text(BAD)
    serial = run_accelify("lint", "--output-format", "json", ".", cwd=project)
    parallel = run_accelify("lint", "--output-format", "json", "--jobs", "2", ".", cwd=project)
    assert parallel.stdout == serial.stdout
    findings = json.loads(serial.stdout)
    backward = next(f for f in findings if f["code"] == "ACC301" and f["filename"] == "train.py")
    (edit,) = backward["fix"]["edits"]
    fixed = BAD[: edit["start"]] + edit["content"] + BAD[edit["end"] :]
    assert "    accelerator.backward(loss)\n" in fixed and "loss.backward()" not in fixed
    assert next(f for f in findings if f["code"] == "ACC503")["fix"] is not None


def test_a_selection_of_all_built_in_code_selects_every_rule():
    """``Selection(select=["ALL"])`` built by an API caller, not resolved by the command line."""
    from accelify.lint.registry import all_codes

    selection = Selection(select=["ALL"])
    assert all(selection.enabled(code, "train.py") for code in all_codes())
    assert not Selection(select=["ALL"], ignore=["ALL"]).enabled("ACC101", "train.py")
