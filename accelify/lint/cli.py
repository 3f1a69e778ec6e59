"""`accelify lint` and `accelify rules`: run, render, return the exit code."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from accelify.errors import UserError
from accelify.lint import engine
from accelify.lint.cache import LintCache, cache_root, open_cache, project_context
from accelify.lint.engine import FileResult, lint_source
from accelify.lint.finding import Finding
from accelify.lint.output import render, statistics
from accelify.lint.selection import Selection, load_settings, resolve_selectors
from accelify.source import python_files, write_atomically
from accelify.terminal import echo_diff, use_color

if TYPE_CHECKING:
    import subprocess

    from accelify.analysis.outside_callers import HandedCall


def run_lint(
    paths: list[Path],
    *,
    fix: bool,
    diff: bool,
    select: list[str],
    ignore: list[str],
    output_format: str,
    extend_select: tuple[str, ...] = (),
    exit_zero: bool,
    show_statistics: bool,
    jobs: int,
    cache: bool = True,
    cache_dir: Path | None = None,
    quiet: bool = False,
    color: bool | None = None,
) -> int:
    try:
        settings = load_settings(Path.cwd())
        selection = _selection(settings, select, ignore, list(extend_select))
    except UserError as error:
        click.echo(f"accelify: error: {error}", err=True)
        return 2
    files = list(_collect(paths or [Path(".")], selection))
    if not files:
        click.echo("accelify: warning: No Python files found under the given paths", err=True)
        return 0
    portable = output_format in ("json", "sarif")
    cached = open_cache(cache_root(cache_dir, settings, Path.cwd()), selection) if cache else None
    results = _lint_all(files, selection, fix or diff, jobs, portable, cached)
    changed = [r for r in results if r.fixed is not None and r.fixed != r.original]
    findings = [f for result in results for f in result.findings]
    failed = [r for r in results if r.error is not None]
    for result in failed:
        click.echo(f"accelify: error: {result.path}: {result.error}", err=True)
    if diff:
        _show_diffs(changed, use_color(color))
        fixes = sum(r.fixed_count for r in changed)
        click.echo(f"Would fix {fixes} error{_plural(fixes)}." if fixes else "No fixes.")
        return 2 if failed else 1 if changed and not exit_zero else 0
    for result in changed if fix else ():
        write_atomically(Path(result.path), result.fixed)
    if show_statistics:
        if findings:
            click.echo(statistics(findings))
    elif findings or output_format in ("json", "sarif"):
        click.echo(render(findings, output_format))
    if output_format == "text" and not show_statistics:
        # on stdout, after the findings, as ruff prints it (a script reads the outcome there)
        click.echo(_summary(findings, sum(r.fixed_count for r in changed) if fix else 0))
        if not quiet and not findings and not failed and all(r.no_accelerator for r in results):
            click.echo(NO_ACCELERATOR_NOTE, err=True)
    if failed:
        return 2
    if exit_zero:
        return 0
    return 1 if findings else 0


def _selection(
    settings: Selection, select: list[str], ignore: list[str], extend_select: list[str]
) -> Selection:
    """The command line's selectors over pyproject's, each checked against the catalog."""
    from_settings = settings.resolved(settings.source or "pyproject.toml")
    return Selection(
        select=resolve_selectors(select, "--select") if select else from_settings.select,
        extend_select=[
            *from_settings.extend_select,
            *resolve_selectors(extend_select, "--extend-select"),
        ],
        ignore=[*from_settings.ignore, *resolve_selectors(ignore, "--ignore")],
        per_file_ignores=from_settings.per_file_ignores,
        exclude=settings.exclude,
    )


def _show_diffs(changed: list[FileResult], color: bool) -> None:
    from accelify.edits.diff import unified_diff

    for result in changed:
        text = unified_diff(result.path, result.original, result.fixed, change="fixed")
        echo_diff(text, color)


def _summary(findings: list[Finding], fixed: int) -> str:
    """ruff's last line: what was found, what --fix would fix, or what it fixed."""
    if fixed:
        return f"Fixed {fixed} error{_plural(fixed)} ({len(findings)} remaining)."
    if not findings:
        return "All checks passed!"
    text = f"Found {len(findings)} error{_plural(len(findings))}."
    fixable = sum(1 for f in findings if f.fixable)
    if fixable:
        text += f" [*] {fixable} fixable with `accelify lint --fix`."
    return text


def _plural(count: int) -> str:
    return "" if count == 1 else "s"


def _lint_one(
    path: Path,
    selection: Selection,
    fix: bool,
    portable: bool = False,
    cache: LintCache | None = None,
    collect: bool = True,
    importers: tuple[Path, ...] = (),
    handed: tuple[HandedCall, ...] = (),
    wanted: tuple[str, ...] = (),
    callers: tuple[Path, ...] = (),
) -> FileResult:
    """``collect``: free the cycles the file left before the next one (`_cycles_collected_once`);
    not after the last file of a serial run. ``importers``: the linted files that import this
    one and were not linted before it (an import cycle: `lint_order`); ``handed``: what the
    calls of those linted before it hand it; ``wanted``: the linted modules that wait for what
    its own calls hand them (a cache entry keeps those facts: they are part of its key);
    ``callers``: every linted file that imports it, read only where a rule asks who runs one
    of its methods (`ProjectView.callers_of`)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        return FileResult(
            str(path), [Finding("ACC000", f"cannot read: {error.strerror}", 1, 1, None, str(path))]
        )
    read = b""
    if cache is not None:
        # the linted importers a rule may ask who runs a method (`ProjectView.callers_of`): a
        # new one may call it; their content, once read, is checked by digest (`read_modules`)
        read = (
            project_context(path, data, importers, handed)
            + "\0".join(wanted).encode()
            + b"\0\0"
            + "\0".join(sorted(str(c) for c in callers)).encode("utf-8", "surrogateescape")
        )
    stored = cache.get(str(path), data, read) if cache is not None else None
    # --fix needs the tree of a file with something to fix; the rest is done
    if stored is not None and not (fix and any(f.fixable for f in stored.findings)):
        return FileResult(
            str(path),
            stored.findings,
            original=data,
            no_accelerator=stored.no_accelerator,
            handed=stored.handed,
        )
    try:
        with _cycles_collected_once(collect):
            result = lint_source(
                data,
                str(path),
                selection,
                fix,
                portable or cache is not None,
                importers,
                handed,
                wanted,
                callers,
            )
    except Exception as error:  # our bug, not the user's: one line, the other files go on
        return FileResult(
            str(path),
            original=data,
            error=f"internal error, not checked ({type(error).__name__}: {error}); "
            "please report this file",
        )
    if cache is not None:  # after a fix, the findings are those of the fixed content
        content = data if result.fixed is None else result.fixed
        cache.put(
            str(path),
            content,
            result.findings,
            result.no_accelerator,
            read,
            result.read_modules,
            result.handed,
        )
    return result


@contextlib.contextmanager
def _cycles_collected_once(collect: bool = True) -> Iterator[None]:
    """Python's cycle collector paused while one file is linted, then run once over what that
    file made (``collect``). Left to itself it runs every 700 allocations and each run traverses
    the young objects again: the tree being parsed and analysed survives every one of them, gets
    promoted and traversed again by the older generations' runs (1.8 of 15 CPU-s over the
    bench's corpus). No file needs it meanwhile: what is freed as it goes is freed by reference
    counts; the cycles a file leaves (a binding points back at its model) are freed here by one
    pass over the youngest generation (0.6 CPU-s over the corpus, peak memory unchanged). After
    the last file there is nothing to make room for: the collector, enabled again, frees them
    when it next runs (`_no_collection_at_exit`: in the CLI, never)."""
    if not gc.isenabled():
        yield
        return
    _no_collection_at_exit()
    engine.freeze_imports = True  # the modules an analysis imports: out of this pass's view
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        if collect:
            gc.collect(0)


@functools.cache
def _no_collection_at_exit() -> None:
    """At the end of the process, Python collects cycles once more over every object: the
    modules the analysis imported (libcst's ~250 node classes, the rules), ~45k objects, 0.04 s
    of a one-file lint's start-up of ~0.4 s, to free memory the process is giving back anyway.
    Frozen at exit (`gc.freeze`: the final collection skips them), once per process; nothing
    lint leaves relies on a collection to be finalized (its files are written and closed in
    ``with`` blocks, its workers joined before `run_lint` returns)."""
    atexit.register(gc.freeze)


def _lint_all(
    files: list[Path],
    selection: Selection,
    fix: bool,
    jobs: int,
    portable: bool,
    cache: LintCache | None = None,
) -> list[FileResult]:
    """Each file linted once, importers before the modules they import (`lint_order`): what an
    importer's calls hand a module (`FileResult.handed`, from the analysis its own findings
    came from) is what that module is linted with. With ``jobs``, a file starts as soon as the
    files it waits for are done; the findings are those of a serial run."""
    from accelify.analysis.project_modules import resolved

    order = lint_order(files)
    waiting_for: dict[Path, list[str]] = {}
    for path in files:
        for importer in order[path][0]:
            waiting_for.setdefault(importer, []).append(str(resolved(path)))
    results: dict[Path, FileResult] = {}

    def arguments(
        path: Path,
    ) -> tuple[tuple[Path, ...], tuple[HandedCall, ...], tuple[str, ...], tuple[Path, ...]]:
        waits, cyclic = order[path]
        this = str(resolved(path))
        handed = tuple(c for w in waits for c in results[w].handed if c.module == this)
        return cyclic, handed, tuple(sorted(set(waiting_for.get(path, ())))), waits + cyclic

    from graphlib import TopologicalSorter

    # the cycles are cut (`lint_order`): every wait ends
    sorter = TopologicalSorter({path: order[path][0] for path in files})
    sorter.prepare()
    if jobs <= 1 or len(files) < 2:
        last = len(files) - 1
        while sorter.is_active():
            for path in sorter.get_ready():
                results[path] = _lint_one(
                    path, selection, fix, portable, cache, len(results) < last, *arguments(path)
                )
                sorter.done(path)
        return [results[path] for path in files]
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    _load_analysis_for_workers(files)
    # what the workers inherit is out of their collector's view: its passes neither traverse
    # it nor write to its pages (each write copies a page the fork shared); back after
    gc.freeze()
    running: dict = {}
    try:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            # findings come back with their fixes as text edits (plain data): plans do not pickle
            while sorter.is_active():
                for path in sorter.get_ready():
                    future = pool.submit(
                        _lint_one, path, selection, fix, True, cache, True, *arguments(path)
                    )
                    running[future] = path
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    path = running.pop(future)
                    results[path] = future.result()
                    sorter.done(path)
    finally:
        gc.unfreeze()
    return [results[path] for path in files]


def _load_analysis_for_workers(files: list[Path]) -> None:
    """Where the workers are forked (Linux's default), libcst, the analysis and the rules
    imported once here, before the pool starts: each worker inherits them instead of importing
    them itself (~0.25 CPU-s a worker, a fifth of a 46-file tree's lint at --jobs 2). Only when
    a file names what an analysis looks for (`MAY_USE_ACCELERATOR`): a tree of plain scripts is
    syntax-checked with Python's parser and needs none of it."""
    import multiprocessing

    from accelify.analysis.project_modules import read
    from accelify.lint.engine import MAY_USE_ACCELERATOR

    if multiprocessing.get_start_method() != "fork":
        return  # a spawned or forkserver worker imports what it needs itself
    if not any(MAY_USE_ACCELERATOR.search(read(path)) for path in files):
        return
    from accelify.lint.engine import load_analysis, load_rules

    load_analysis()
    load_rules()


def lint_order(files: list[Path]) -> dict[Path, tuple[tuple[Path, ...], tuple[Path, ...]]]:
    """For each linted file, the linted files that import it, in two parts: those it waits
    for (the analysis their findings came from tells what their calls hand it), and those it
    cannot wait for, as they wait for it through an import cycle (``utils`` imports ``state``,
    which imports ``utils``): analysed again where they are read (`ProjectView.importers`).
    Which edge of a cycle is cut depends only on the files' order: the findings of `--jobs N`
    are those of one process. One file alone has none: nothing more is read."""
    if len(files) < 2:
        return {path: ((), ()) for path in files}
    from accelify.analysis.project_modules import importers_of, read

    importers = importers_of(files, read)
    cut = _cycle_edges(files, importers)
    return {
        path: (
            tuple(i for i in importers.get(path, ()) if (path, i) not in cut),
            tuple(i for i in importers.get(path, ()) if (path, i) in cut),
        )
        for path in files
    }


def _cycle_edges(files: list[Path], waits: dict[Path, list[Path]]) -> set[tuple[Path, Path]]:
    """The edges (file, what it waits for) that close a cycle: the back edges of a depth-first
    walk in the files' order (without recursion). Without them, every wait ends."""
    state: dict[Path, int] = {}  # 1: on the walk's path, 2: done
    cut: set[tuple[Path, Path]] = set()
    for root in files:
        if root in state:
            continue
        state[root] = 1
        work = [(root, iter(waits.get(root, ())))]
        while work:
            node, edges = work[-1]
            for target in edges:
                seen = state.get(target)
                if seen == 1:
                    cut.add((node, target))
                elif seen is None:
                    state[target] = 1
                    work.append((target, iter(waits.get(target, ()))))
                    break
            else:
                state[node] = 2
                work.pop()
    return cut


def _collect(paths: list[Path], selection: Selection):
    """Named files always; under a named folder, what git would track (``.gitignore`` holds for
    what is found below, not for the folder named: as in ruff, naming a path asks for it)."""
    for path in paths:
        if path.is_file():
            yield path
            continue
        listed = _git_files(path)
        if listed is not None and _git_ignored(path):
            listed = None  # (outside a repository, git is not asked twice)
        candidates = listed if listed is not None else python_files(path)
        for candidate in candidates:
            if candidate.suffix == ".py" and not selection.excluded(candidate):
                yield candidate


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess | None:
    import subprocess  # a folder's files only: `accelify lint FILE` starts without it

    try:
        return subprocess.run(["git", *args], cwd=folder, capture_output=True)
    except OSError:
        return None  # no git


def _git_ignored(folder: Path) -> bool:
    done = _git(folder, "check-ignore", "-q", ".")
    return done is not None and done.returncode == 0


def _git_files(folder: Path) -> list[Path] | None:
    """Files git tracks or would track (``.gitignore`` respected); None outside a repository."""
    if not _maybe_in_repository(folder):
        return None
    done = _git(folder, "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", ".")
    if done is None or done.returncode != 0:
        return None
    names = [name for name in done.stdout.decode().split("\0") if name]
    return sorted(folder / name for name in names if (folder / name).is_file())


def _maybe_in_repository(folder: Path) -> bool:
    """Git could find a repository from ``folder``: a ``.git`` there or in a folder above it
    (of the real path, as git walks it), or one named by ``GIT_DIR``. Where there is none,
    git is not started to say so (importing ``subprocess`` and the process: ~5 ms of a
    cached run of ~90; a tree of downloaded examples is linted outside any repository)."""
    import os

    if "GIT_DIR" in os.environ:
        return True
    real = folder.resolve()
    return any((each / ".git").exists() for each in (real, *real.parents))


def show_rules(code: str | None) -> int:
    from accelify.lint.registry import REDIRECTS, all_rules, rule_by_code

    if code is None:
        for rule in all_rules():
            mark = "fixable" if rule.fixable else ""
            default = "default" if rule.default else "opt-in"
            click.echo(f"{rule.code}  {rule.name:30} {default:8} {mark:8} {rule.message}")
        click.echo(f"\n{DEFAULT_SET}\n\n{PLAIN_SCRIPTS}")
        return 0
    rule = rule_by_code(code)
    if rule is None:
        click.echo(f"accelify: error: no rule {code}; `accelify rules` lists them", err=True)
        return 2
    if code.upper() in REDIRECTS:
        click.echo(f"({code.upper()} is now {rule.code}.)\n")
    click.echo(rule_page(rule))
    return 0


#: Said after "All checks passed!" when no linted file uses an accelerator: the pass means
#: only that they parse, and a user linting a plain script wants to know what makes it
#: distributed.
NO_ACCELERATOR_NOTE = (
    "Note: no file here uses an accelerator, so only its syntax was checked (ACC000); "
    "`accelify convert FILE` makes a single-device PyTorch script distributed."
)

#: What runs by default, said in `accelify rules` and docs/lint.md.
DEFAULT_SET = (
    "default: runs unless --select says otherwise; each finding is a bug (a hang, a crash, a\n"
    "lost or corrupted file, a silently wrong number). opt-in: runs when selected\n"
    "(--extend-select ACC203, --select ALL); `accelify rules CODE` says why it is opt-in."
)

#: What runs where, said in `accelify rules` and docs/lint.md.
PLAIN_SCRIPTS = (
    "Every rule checks files that use an accelerator (accelify's or Hugging Face Accelerate's):\n"
    "created there, returned by a factory, held by a class or received as a parameter. A file\n"
    "without one is checked for ACC000 (a file that cannot be read or parsed) only, whatever\n"
    "--select says: run `accelify convert` on it first."
)


def _use_instead(rule) -> str | None:
    """The code the page advises: the shown example as the rule's fix leaves it (the example and
    its cure side by side, the fix the message advises), else the rule's first good example (a
    rule with no automatic fix)."""
    if rule.bad and rule.bad[0].fixed is not None:
        return rule.bad[0].fixed
    return rule.good[0] if rule.good else None


def rule_page(rule) -> str:
    doc = " ".join((rule.__doc__ or "").split())
    bad = rule.bad[0] if rule.bad else None
    lines = [
        f"# {rule.code} {rule.name}",
        "",
        "## What it does",
        doc,
        "",
        "## Why it breaks on N processes",
        rule.why or doc,
        "",
    ]
    if bad is not None:
        lines += ["## Example", "```python", bad.code.rstrip(), "```", ""]
    instead = _use_instead(rule)
    if instead is not None:
        lines += ["## Use instead", "```python", instead.rstrip(), "```", ""]
    lines += [
        "## Default set",
        f"Opt-in (`--extend-select {rule.code}` or `--select ALL`): {rule.opt_in}."
        if rule.opt_in
        else "In the default set: a finding is a bug.",
        "",
        "## Fix",
        "Safe fix available (`accelify lint --fix`)."
        if rule.fixable
        else "No automatic fix: the right change depends on the script.",
        "",
        f"Message: {rule.message}",
    ]
    return "\n".join(lines)
