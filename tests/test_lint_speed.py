"""What lint keeps or does once for speed (issue 21) answers as the work it replaces did."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accelify.analysis import project_modules


def test_a_listed_folder_finds_what_a_lookup_of_each_file_finds(tmp_path: Path):
    """`_may_hold` reads a folder's listing instead of a stat per candidate: a module beside
    the script, a package's module, a package itself and a library name resolve as before."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "core.py").write_text("def f():\n    pass\n")
    (tmp_path / "util.py").write_text("def g():\n    pass\n")
    (tmp_path / "data.py").mkdir()  # a folder named like a module is no module
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport util\nimport data\nfrom pkg.core import f\nimport pkg\n"
    )
    found = project_modules.imported_files(script, script.read_bytes())
    assert found == {
        "util": tmp_path / "util.py",
        "pkg.core": tmp_path / "pkg" / "core.py",
        "pkg": tmp_path / "pkg" / "__init__.py",
    }


def test_kept_answers_are_copies():
    """The names and files kept per text are handed out as copies: a caller that changes its
    answer does not change the next caller's."""
    text = b"def a():\n    pass\nclass B:\n    pass\n"
    names = project_modules.top_level_names(text)
    names.add("c")
    assert project_modules.top_level_names(text) == {"a", "B"}


@pytest.mark.parametrize(
    ("code", "loaded"),
    [
        ("import torch\nprint(torch.ones(1))\n", False),
        ("from accelerate import Accelerator\naccelerator = Accelerator()\n", True),
    ],
)
def test_workers_inherit_the_analysis_only_where_a_file_needs_it(
    tmp_path: Path, code: str, loaded: bool
):
    """Before a --jobs pool forks, libcst and the rules are imported where a file names what
    an analysis looks for; a tree of plain scripts (syntax-checked with `ast`) never imports
    them."""
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(code)
    probe = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from accelify.lint.cli import _load_analysis_for_workers
        _load_analysis_for_workers([Path({str(tmp_path)!r}) / n for n in ("a.py", "b.py")])
        print("libcst" in sys.modules, "accelify.rules.hard_coded_cuda" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    forks = multiprocessing.get_all_start_methods()[0] == "fork"  # the platform's default
    expected = "True True" if loaded and forks else "False False"
    assert done.stdout.split() == expected.split()


def test_git_is_started_only_where_it_could_find_a_repository(tmp_path: Path, monkeypatch):
    """`_git_files` outside any repository answers None without starting git, as git itself
    answers there; in a repository's subfolder (a ``.git`` folder above, or a worktree's
    ``.git`` file) git is asked and ``.gitignore`` holds."""
    from accelify.lint import cli

    plain = tmp_path / "plain" / "sub"
    plain.mkdir(parents=True)
    if cli._git(plain, "rev-parse", "--git-dir").returncode == 0:
        pytest.skip("the temporary folder is inside a git repository")
    repository = tmp_path / "repository"
    (repository / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repository, check=True)
    (repository / ".gitignore").write_text("ignored.py\n")
    for name in ("kept.py", "ignored.py"):
        (repository / "src" / name).write_text("x = 1\n")
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / ".git").write_text("gitdir: /nowhere\n")
    monkeypatch.delenv("GIT_DIR", raising=False)
    assert not cli._maybe_in_repository(plain)
    assert cli._maybe_in_repository(repository / "src") and cli._maybe_in_repository(worktree)
    started = []
    real_git = cli._git
    monkeypatch.setattr(cli, "_git", lambda *args: started.append(args) or real_git(*args))
    assert cli._git_files(plain) is None and not started
    assert cli._git_files(repository / "src") == [repository / "src" / "kept.py"]
    assert started


def test_the_command_line_freezes_what_the_analysis_imports_before_the_first_parse(
    tmp_path: Path,
):
    """Linting through the command line's collector policy, libcst and the analysis are out of
    the collector's view from their import on (the pass after the first file does not traverse
    them), and a file's own cycles are still freed after it; a plain `lint_source` call (a
    library's user) changes nothing of the process's collector."""
    code = "from accelerate import Accelerator\n\naccelerator = Accelerator()\nmodel = net.cuda()\n"
    (tmp_path / "a.py").write_text(code)
    probe = textwrap.dedent(
        f"""
        import gc, weakref
        from pathlib import Path
        from accelify.lint import cli, engine
        from accelify.lint.selection import Selection
        path = Path({str(tmp_path)!r}) / "a.py"
        data = path.read_bytes()
        before = gc.get_freeze_count()
        if {{cli}}:
            with cli._cycles_collected_once(True):
                result = engine.lint_source(data, str(path), Selection())
        else:
            result = engine.lint_source(data, str(path), Selection())
        import libcst
        frozen = gc.get_freeze_count()
        class Cycle: pass
        cycle = Cycle(); cycle.me = cycle; seen = weakref.ref(cycle); del cycle
        with cli._cycles_collected_once(True):
            pass
        print(before, frozen > 10000, seen() is None, [f.code for f in result.findings])
        """
    )
    said = []
    for through_cli, frozen in ((True, "True"), (False, "False")):
        done = subprocess.run(
            [sys.executable, "-c", probe.replace("{cli}", str(through_cli))],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[:3] == ["0", frozen, "True"], done.stdout
        said.append(done.stdout.split(maxsplit=3)[3])
    assert said[0] == said[1]  # the same findings
