"""`accelify lint`'s cache (ruff's): the same findings with and without it, on every fixture and
across --jobs; kept out of git; invalidated by content, settings, fixes; never a crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelify.analysis.script_model import analyze
from accelify.errors import UserError
from accelify.lint import cli as lint_cli
from accelify.lint import engine
from accelify.lint.cache import open_cache
from accelify.lint.cli import _lint_all
from accelify.lint.output import render
from accelify.lint.registry import all_rules
from accelify.lint.selection import Selection
from accelify.source import parse
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
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with a bad script, its cache where users have it (`.accelify_cache/`)."""
    monkeypatch.delenv("ACCELIFY_CACHE_DIR")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "train.py").write_text(BAD)
    return tmp_path


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/*.json"))


def lint_json(*args: str | Path, cwd: Path) -> list[dict]:
    result = run_accelify("lint", "--exit-zero", "--output-format", "json", *args, cwd=cwd)
    assert_ok(result)
    return json.loads(result.stdout)


def test_every_fixture_has_the_same_findings_with_a_cold_and_a_warm_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A cold run computes every file's findings as a run without a cache does (the same
    `lint_source` call; the cache only stores its result), so the cold run is the reference:
    the warm run, which analyses nothing, must report the same on every file."""
    files = sorted(FIXTURES.rglob("*.py"))
    selection = Selection(select=["ACC"])
    cache = open_cache(tmp_path / "cache", selection)
    assert cache is not None
    assert entries(tmp_path / "cache") == []

    def findings() -> dict[str, str]:
        results = _lint_all(files, selection, False, 1, True, cache)
        return {result.path: render(result.findings, "json") for result in results}

    cold = findings()
    assert any(text != "[]" for text in cold.values())  # the corpus has findings to compare
    assert len(entries(tmp_path / "cache")) == len(files)

    analysed: list[str] = []
    real = lint_cli.lint_source
    monkeypatch.setattr(
        lint_cli,
        "lint_source",
        lambda data, path, *rest: analysed.append(path) or real(data, path, *rest),
    )
    warm = findings()
    assert analysed == []  # every file came from the cache
    assert [path for path in cold if warm[path] != cold[path]] == []


def test_jobs_with_and_without_the_cache_report_the_same(tmp_path: Path):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for index, source in enumerate(sorted((FIXTURES / "convert").glob("*/after.py"))[:6]):
        (scripts / f"{index}_{source.parent.name}.py").write_text(source.read_text())
    (scripts / "train.py").write_text(BAD)
    baseline = lint_json("--no-cache", "--select", "ALL", "scripts", cwd=tmp_path)
    assert baseline
    cache = tmp_path / "cache"
    for jobs in ("2", "1", "2"):  # cold with 2 processes, then warm with 1 and 2
        found = lint_json(
            "--cache-dir", cache, "--jobs", jobs, "--select", "ALL", "scripts", cwd=tmp_path
        )
        assert found == baseline, jobs
    assert len(entries(cache)) == 7


def test_the_cache_is_at_the_project_root_and_keeps_out_of_git(project: Path):
    (project / "src").mkdir()
    (project / "src" / "train.py").write_text(BAD)
    result = run_accelify("lint", "--exit-zero", "train.py", cwd=project / "src")
    assert_ok(result)
    cache = project / ".accelify_cache"
    assert (cache / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (cache / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172")
    assert len(entries(cache)) == 1
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    untracked = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ".accelify_cache" not in untracked
    assert "train.py" in untracked


@pytest.mark.parametrize("where", ["flag", "environment", "pyproject"])
def test_the_cache_folder_can_be_chosen(project: Path, where: str):
    env, args = {}, []
    if where == "flag":
        args = ["--cache-dir", "elsewhere"]
    elif where == "environment":
        env = {"ACCELIFY_CACHE_DIR": str(project / "elsewhere")}
    else:
        (project / "pyproject.toml").write_text("[tool.accelify]\ncache-dir = 'elsewhere'\n")
    result = run_accelify("lint", "--exit-zero", *args, "train.py", cwd=project, env=env)
    assert_ok(result)
    assert len(entries(project / "elsewhere")) == 1
    assert not (project / ".accelify_cache").exists()


def test_no_cache_reads_and_writes_nothing(project: Path):
    result = run_accelify("lint", "--no-cache", "--exit-zero", "train.py", cwd=project)
    assert_ok(result)
    assert not (project / ".accelify_cache").exists()


def test_a_stored_entry_is_what_a_warm_run_reports_and_a_foreign_one_is_ignored(project: Path):
    first = lint_json("train.py", cwd=project)
    (entry,) = entries(project / ".accelify_cache")
    stored = json.loads(entry.read_text())
    stored["findings"] = [{**stored["findings"][0], "message": "read from the cache"}]
    entry.write_text(json.dumps(stored))
    assert [f["message"] for f in lint_json("train.py", cwd=project)] == ["read from the cache"]
    entry.write_text(json.dumps({**stored, "accelify": "0.0.1"}))
    assert lint_json("train.py", cwd=project) == first


@pytest.mark.parametrize(
    "damage",
    ["garbage", "empty", "wrong-shape", "folder"],
)
def test_a_corrupt_cache_is_ignored(project: Path, damage: str):
    first = lint_json("train.py", cwd=project)
    (entry,) = entries(project / ".accelify_cache")
    if damage == "garbage":
        entry.write_bytes(b"\x00\xffnot json")
    elif damage == "empty":
        entry.write_text("")
    elif damage == "wrong-shape":
        entry.write_text(json.dumps({"accelify": "x", "findings": 3}))
    else:
        entry.unlink()
        entry.mkdir()
    result = run_accelify("lint", "--output-format", "json", "train.py", cwd=project)
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout) == first


def test_a_cache_that_cannot_be_written_is_no_cache(project: Path):
    (project / "blocked").write_text("a file where the cache folder would be")
    env = {"ACCELIFY_CACHE_DIR": str(project / "blocked" / "cache")}
    result = run_accelify("lint", "--output-format", "json", "train.py", cwd=project, env=env)
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    assert {f["code"] for f in json.loads(result.stdout)} == {"ACC201", "ACC301", "ACC503"}


def test_changed_content_or_settings_are_linted_again(project: Path):
    assert len(lint_json("train.py", cwd=project)) == 3
    assert {f["code"] for f in lint_json("--select", "ACC3", "train.py", cwd=project)} == {"ACC301"}
    (project / "train.py").write_text(BAD.replace("loss.backward()", "loss.backward()  # noqa"))
    assert len(lint_json("train.py", cwd=project)) == 2
    extended = lint_json("--extend-select", "ACC203", "train.py", cwd=project)
    assert {f["code"] for f in extended} == {"ACC201", "ACC203", "ACC503"}


def test_fix_leaves_the_cache_true_to_the_fixed_file(project: Path):
    assert len(lint_json("train.py", cwd=project)) == 3  # the cache holds the unfixed file's
    fixed = run_accelify("lint", "--fix", "train.py", cwd=project)
    assert "Fixed 3 errors (0 remaining)." in fixed.stdout
    warm = run_accelify("lint", "train.py", cwd=project)
    cold = run_accelify("lint", "--no-cache", "train.py", cwd=project)
    assert_ok(warm)
    assert (warm.stdout, warm.stderr) == (cold.stdout, cold.stderr)
    (project / "train.py").write_text(BAD)  # back to the content cached before the fix
    again = run_accelify("lint", "--fix", "train.py", cwd=project)
    assert "Fixed 3 errors (0 remaining)." in again.stdout  # a cached finding still gets fixed


def test_a_caller_added_or_edited_to_run_a_hook_is_linted_again(project: Path):
    """ACC312 asks the linted importers who runs ``Trainer.update`` (`ProjectView.callers_of`):
    a new importer, or one edited to call it, changes the answer for ``trainer.py``."""
    example = FIXTURES / "lint" / "projects" / "hook_run_from_a_plain_module"
    (project / "train.py").unlink()
    (project / "trainer.py").write_text((example / "trainer.py").read_text())
    schedule = (example / "schedule.py").read_text()
    assert "runner.update()" in schedule

    def codes() -> list[str]:
        warm = sorted(f["code"] for f in lint_json(".", cwd=project))
        assert warm == sorted(f["code"] for f in lint_json("--no-cache", ".", cwd=project))
        return warm

    assert codes() == ["ACC301", "ACC312"]  # nothing runs the hook yet
    (project / "schedule.py").write_text(schedule)
    assert codes() == ["ACC301"]  # a new importer runs it
    (project / "schedule.py").write_text(schedule.replace("runner.update()", "pass"))
    assert codes() == ["ACC301", "ACC312"]
    (project / "schedule.py").write_text(schedule)  # edited back: calls it again
    assert codes() == ["ACC301"]


@pytest.mark.parametrize("case", ["warm-cache", "no-accelerator"])
def test_lint_imports_no_parser_no_rules_no_torch_when_it_parses_nothing(project: Path, case):
    """A warm cache, or a file that never names an accelerator (ast checks its syntax)."""
    if case == "warm-cache":
        assert_ok(run_accelify("lint", "--exit-zero", "train.py", cwd=project))
        args = "'--exit-zero', 'train.py'"
    else:
        (project / "plain.py").write_text("import torch\n\nmodel = torch.nn.Linear(2, 2)\n")
        args = "'--no-cache', 'plain.py'"
    code = (
        "import sys\nfrom accelify.cli import main\n"
        f"try:\n    main(['lint', {args}])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'libcst')"
        " or m.startswith(('accelify.rules', 'accelify.runtime', 'accelify.run_cli'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=project, env=os.environ
    )
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr


def test_lint_without_a_cache_imports_what_only_a_cache_a_write_or_git_needs_not(tmp_path: Path):
    """``accelify lint --no-cache FILE`` of a plain file: no hashing, temporary files, folder
    removal or subprocesses (start-up: each is imported where a cache, a fix's write or a
    folder's git listing needs it)."""
    (tmp_path / "plain.py").write_text("import torch\n\nmodel = torch.nn.Linear(2, 2)\n")
    code = (
        "import sys\nfrom accelify.cli import main\n"
        "try:\n    main(['lint', '--no-cache', 'plain.py'])\nexcept SystemExit:\n    pass\n"
        "names = ('hashlib', 'shutil', 'subprocess', 'tempfile')\n"
        "print(sorted(m for m in names if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=os.environ
    )
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr


def test_lint_imports_a_fixs_edits_only_for_a_fixable_finding(tmp_path: Path):
    """A file that is analysed (libcst, the rules) and has no fixable finding: the edits a fix
    is made of are not imported (start-up)."""
    (tmp_path / "classify.py").write_bytes((FIXTURES / "examples" / "classify.py").read_bytes())
    code = (
        "import sys\nfrom accelify.cli import main\n"
        "try:\n    main(['lint', '--no-cache', '--select', 'ALL', 'classify.py'])\n"
        "except SystemExit:\n    pass\n"
        "print('libcst' in sys.modules, 'accelify.rules.print_in_loop' in sys.modules,"
        " sorted(m for m in sys.modules if m.startswith('accelify.edits')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=os.environ
    )
    assert result.stdout.strip().splitlines()[-1] == "True True []", result.stderr


@pytest.mark.parametrize(
    ("source", "plainly"),
    [
        ("import torch\nfrom accelerate import Accelerator\n", True),
        ("import torch\ndef train(accelerator):\n    accelerator.wait_for_everyone()\n", True),
        ('"""\nfrom accelerate import Accelerator\n"""\nimport torch\n', False),
        ("import torch\n# accelerator.prepare(model)\n", False),
        ("import torch\n>>> accelerator.prepare(model)\n", False),
        ("import torch\nx = AcceleratorState()\n", False),  # a longer name
        ("import torch\nprint('Accelerator')\n", False),
    ],
)
def test_an_accelerator_plainly_named_in_code_is_told_from_the_text(source: str, plainly: bool):
    assert engine._plainly_named_in_code(source.encode()) is plainly


def test_a_name_that_only_looks_like_code_costs_a_parse_and_changes_nothing(monkeypatch):
    """`_plainly_named_in_code` reads text: a string continued by a backslash onto a line of
    its own fools it. The file is then built into a tree, where the analysis finds no
    accelerator; and a libcst error on it is not reported, as with the ast test alone."""
    source = b"import torch\nnote = 'see \\\nAccelerator'\n"
    assert engine._plainly_named_in_code(source)
    assert not engine.code_may_use_accelerator(source, "note.py")
    every_rule = Selection(select=["ALL"])
    result = engine.lint_source(source, "note.py", every_rule)
    assert (result.findings, result.no_accelerator) == ([], True)

    def failing(data: bytes, path: str) -> None:
        raise UserError("libcst cannot read it", path, 2, 1)

    monkeypatch.setattr(engine, "parse", failing)
    assert engine.lint_source(source, "note.py", every_rule).findings == []
    # one Python's parser reads and whose code names an Accelerator: libcst's error reported
    named = b"import torch\nfrom accelerate import Accelerator\n"
    assert [f.code for f in engine.lint_source(named, "named.py", every_rule).findings] == [
        "ACC000"
    ]


def test_a_file_that_cannot_hold_an_accelerator_is_not_built_into_a_tree(monkeypatch):
    parsed: list[str] = []
    real_parse = engine.parse
    monkeypatch.setattr(
        engine, "parse", lambda data, path: parsed.append(path) or real_parse(data, path)
    )
    sources = {
        "plain.py": "import torch\nmodel = torch.nn.Linear(2, 2)\n",
        "parameter.py": "import torch\ndef train(accelerator, x):\n    accelerator.backward(x)",
        "attribute.py": "class T:\n    def f(self):\n        self.accelerator.print(1)  # torch",
        "imported.py": "import torch\nfrom accelerate.utils import set_seed\n",
        "annotated.py": "import torch\ndef f(a: 'Accelerator'):\n    pass\n",
        "factory.py": "import torch\nacc = make()\nmodel = acc.prepare(model)\n",
        "settings.py": "import torch\nif args.process_index == 0:\n    print(accelerate)\n",
        # named in a docstring, a comment or a string only: Python's parser reads it, no tree
        "docstring.py": '"""With an Accelerator: accelerator.prepare(model)."""\nimport torch\n',
        "comment.py": "import torch\n# then accelerator.backward(loss) and .prepare()\n",
        "string.py": "import torch\nprint('accelerator.is_main_process', 'Accelerator()')\n",
        "aliased.py": "import torch\nfrom accelerate import Accelerator as A\n",
        "held.py": "import torch\ndef f(trainer):\n    trainer.accelerator.print(1)\n",
        "broken.py": "import torch\n# Accelerator\nfor\n",  # Python rejects it: parse reports
    }
    for path, source in sources.items():
        engine.lint_source(source.encode(), path, Selection())
    assert parsed == [
        "parameter.py",
        "attribute.py",
        "factory.py",
        "aliased.py",
        "held.py",
        "broken.py",
    ]


def _examples() -> list[tuple[str, str]]:
    found = [(str(path), path.read_text()) for path in sorted(FIXTURES.rglob("*.py"))]
    for rule in all_rules():
        found += [(f"{rule.code}-bad", example.code) for example in rule.bad]
        found += [(f"{rule.code}-good", code) for code in rule.good]
    return found


def test_every_accelerator_file_of_the_fixtures_and_rule_examples_passes_the_text_test():
    """`MAY_USE_ACCELERATOR`, then `code_may_use_accelerator`, decide before parsing which
    files are analysed: a file the analysis calls an Accelerator file must never fail either
    (its findings would be lost)."""
    accelerator_files, missed = 0, []
    for label, code in _examples():
        try:
            script = analyze(parse(code.encode(), label), code)
        except UserError:
            continue
        if script.uses_accelerator:
            accelerator_files += 1
            if engine.MAY_USE_ACCELERATOR.search(code.encode()) is None:
                missed.append(label)
            elif not engine.code_may_use_accelerator(code.encode(), label):
                missed.append(f"{label} (code)")
    assert accelerator_files > 300
    assert missed == []


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nfor x in range(3)\n    pass\n",
        "import torch\nx = (1,\n",
        "import torch\ndef f():\n\treturn 1\n        return 2\n",
        b"import torch\nname = '\xff'\n",
        "# -*- coding: latin-1 -*-\nimport torch\nx = 'caf\xe9'\nfor\n",
    ],
    ids=["missing-colon", "unclosed-paren", "bad-indent", "not-utf8", "latin1-cookie"],
)
def test_a_syntax_error_is_reported_alike_with_or_without_an_accelerator(source):
    data = source if isinstance(source, bytes) else source.encode("latin-1")
    plain = engine.lint_source(data, "plain.py", Selection()).findings
    named = engine.lint_source(data + b"\n# accelerator\n", "plain.py", Selection()).findings
    # a name the text test finds (in a comment): Python's parser rejects it, libcst reports it
    found = engine.lint_source(data + b"\n# Accelerator\n", "plain.py", Selection()).findings
    assert [f.code for f in plain] == ["ACC000"]
    assert [(f.message, f.line, f.column) for f in plain] == [
        (f.message, f.line, f.column) for f in named
    ]
    assert [(f.message, f.line, f.column) for f in plain] == [
        (f.message, f.line, f.column) for f in found
    ]
