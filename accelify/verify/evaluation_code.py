"""Check 3, for runs cut short by ``--steps``: the conversion's evaluation, read from its code.

A few optimizer steps end before most scripts evaluate, so the runs cannot show that an
evaluation covers the whole set. What they could not show is checked the way ``accelify lint``
checks it (ACC403, the same analysis): an evaluation loop over a prepared DataLoader that
accumulates a metric and gathers nothing computes it from one rank's shard; and (ACC401) one
over a DataLoader never prepared that gathers joins one copy of the whole set per rank. A
``# noqa`` does not silence it here: the verdict says what the conversion computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from accelify.errors import UserError
from accelify.verify.checks import CheckResult

if TYPE_CHECKING:
    import libcst as cst

    from accelify.analysis.evaluation import Evaluation
    from accelify.analysis.facts import Facts
    from accelify.analysis.script_model import ScriptModel
    from accelify.analysis.shared_loops import SharedLoopEvaluation

#: A loop over a prepared loader that runs the model and folds nothing into a metric, a list
#: or a file (a per-batch print): nothing to gather, and no claim that it gathers.
KEEPS_NOTHING = "keeps nothing past each batch"
TITLE = "evaluation, read from the converted code (the runs stopped after {steps} steps)"


def check_evaluation_code(
    code: str, label: str, steps: int, path: Path | None = None
) -> CheckResult:
    """``path``: where the converted script stands (the runs import the project modules beside
    it); its imported modules are read too (`project_code`), each place in one named by the
    module (``src/engine.py:80``). None: the script alone."""
    from accelify.analysis.script_model import analyze
    from accelify.source import parse
    from accelify.verify.project_code import AnalysedModule, analysed_project

    result = CheckResult(TITLE.format(steps=steps), False, "", ["line", "loop", "verdict"])
    try:
        if path is None:
            modules = [AnalysedModule("", analyze(parse(code.encode("utf-8"), label), code))]
        else:
            modules = analysed_project(code, path)
    except UserError as error:
        result.verdict = f"FAIL: the converted script does not parse: {error}"
        return result
    found = _Found()
    for module in modules:
        _read_module(module.script, module.label, found, result)
    others = [module.label for module in modules if module.label]
    if not found.loops:
        result.passed = True
        result.verdict = (
            "not read: no evaluation loop over a DataLoader found in the conversion"
            + _and_modules(others)
            + " (a blind spot, not a pass: a loop over a loader the analysis does not follow, "
            "such as one made inside a dict, or in a module the script does not import, is "
            "not read; `--to-end` runs every evaluation)"
        )
    elif found.every_rank and not found.one_shard:
        result.verdict = (
            f"FAIL: the evaluation loop at {found.every_rank[0]} reads a DataLoader "
            "that is never prepared and combines what it computes over the ranks: every rank "
            "brings the whole set, so the gather joins one copy of every sample per rank (pass "
            "the loader to accelerator.prepare; `--to-end` runs the evaluation)"
        )
    elif found.one_shard:
        result.verdict = (
            f"FAIL: {found.one_shard[0]} accumulates a metric from this rank's shard "
            "of the evaluation set and nothing gathers it: on N ranks it covers 1/N of the set "
            "(gather predictions and labels with accelerator.gather_for_metrics; "
            "`--to-end` runs the evaluation)"
        )
    else:
        result.passed = True
        covered = _covered(result.rows, found.whole, found.nothing_kept)
        result.verdict = f"pass: {covered} (read from the code, not run: `--to-end` runs it)"
    return result


@dataclass
class _Found:
    """What the modules' evaluation loops were found to do, each place as a verdict names it
    (``converted line 32``, ``src/engine.py:80``)."""

    loops: int = 0
    one_shard: list[str] = field(default_factory=list)
    every_rank: list[str] = field(default_factory=list)
    whole: list[str] = field(default_factory=list)  # rows' first cells
    nothing_kept: list[str] = field(default_factory=list)


def _read_module(script: ScriptModel, module: str, found: _Found, result: CheckResult) -> None:
    """One module's evaluation loops, as rows of ``result`` and places in ``found``."""
    from accelify.analysis.facts import facts_of
    from accelify.lint.registry import rule_by_code

    def cell(line: int) -> str:
        return f"{module}:{line}" if module else str(line)

    def place(line: int) -> str:
        return f"line {line} of {module}" if module else f"converted line {line}"

    rule = rule_by_code("ACC403")
    assert rule is not None, "ACC403 is the rule this check runs"
    findings = list(rule.check(script)) if script.uses_accelerator else []
    # ACC401 at an evaluation loop's own line: its loader is never prepared and what it
    # computes is combined over the ranks (each rank brings the whole set)
    unprepared = rule_by_code("ACC401")
    assert unprepared is not None, "ACC401 is the rule this check runs"
    combined = {f.line for f in unprepared.check(script)} if script.uses_accelerator else set()
    facts = facts_of(script)
    loops = [evaluation.loop.node for evaluation in facts.evaluations]
    for evaluation in facts.evaluations:
        loop = evaluation.loop.node
        span = script.position(loop)
        first, last = span.start.line, span.end.line
        at = [f.line for f in findings if first <= f.line <= last]
        found.one_shard += [place(line) for line in at]
        header = script.module.code_for_node(loop).splitlines()[0].strip()
        sharded = facts.flow.over_prepared_loader(evaluation.loop)
        left = _kept_ungathered(evaluation, script) if sharded and not at else None
        if left is not None:
            at = [script.line(left)]
            found.one_shard.append(place(at[0]))
        if at:
            verdict = f"ONE SHARD at line {at[0]}"
        elif first in combined:
            found.every_rank.append(place(first))
            verdict = "WHOLE SET ON EVERY RANK"
        elif evaluation.already_gathered or sharded:
            kept = bool(evaluation.sinks) or evaluation.already_gathered
            verdict = "gathered" if kept else KEEPS_NOTHING
            if not kept:
                found.nothing_kept.append(cell(first))
        else:  # nothing to gather: the loop reads a loader no prepare call shards
            verdict = "whole set: its loader is not prepared"
            found.whole.append(cell(first))
        result.rows.append([cell(first), header, verdict])
    for shared in _shared_loop_evaluations(facts, loops):
        # ``run_epoch(model, val_loader, ..., train=False)``: the loop that trains evaluates
        # this loader, as the conversion found it (one analysis, one answer)
        first = script.position(shared.call).start.line
        header = f"{script.module.code_for_node(shared.call.func)}(..., {shared.loader}, ...)"
        loops.append(shared.loop.node)
        if shared.loader in script.prepared_names or shared.prepared_at_call:
            found.one_shard.append(place(first))
            verdict = f"ONE SHARD at line {first}"
        else:
            verdict = "whole set: its loader is not prepared"
            found.whole.append(cell(first))
        result.rows.append([cell(first), header, verdict])
    found.loops += len(loops)


def _kept_ungathered(evaluation: Evaluation, script: ScriptModel) -> cst.CSTNode | None:
    """The first row a loop over a prepared loader writes to a file per batch
    (``w.writerow(...)``) while nothing in the loop gathers it: read as the conversion reads
    it (`evaluation.written_rows`), where ACC403 reads totals and lists only. A row written
    is past gathering: no caller can gather it afterwards, so the file holds one rank's
    shard."""
    from accelify.analysis.evaluation import written_rows

    if evaluation.already_gathered:
        return None
    return next(iter(written_rows(evaluation, script)), None)


def _and_modules(labels: list[str]) -> str:
    """`` or the 2 project modules it imports (src/a.py, src/b.py)``; empty for none."""
    if not labels:
        return ""
    shown = ", ".join(labels[:4]) + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")
    modules = "project module" if len(labels) == 1 else f"{len(labels)} project modules"
    return f" or the {modules} it imports ({shown})"


def _shared_loop_evaluations(facts: Facts, loops: list[cst.CSTNode]) -> list[SharedLoopEvaluation]:
    """The loaders evaluated through a loop that also trains (`facts.shared_loop_evaluations`:
    ``run_epoch(model, val_loader, ..., train=False)``), one per call, that no evaluation loop
    of ``loops`` stands for."""
    seen: set[int] = set()
    found = []
    for shared in facts.shared_loop_evaluations.values():
        if id(shared.call) in seen or any(shared.loop.node is loop for loop in loops):
            continue
        seen.add(id(shared.call))
        found.append(shared)
    return found


def _covered(rows: list[list[str]], whole: list[str], nothing_kept: list[str]) -> str:
    """Why each evaluation covers the whole set: it gathers, or every rank reads all of its
    loader (left unprepared); or why it has nothing to cover (it keeps no batch's values)."""
    gathered = [row[0] for row in rows if row[0] not in whole and row[0] not in nothing_kept]
    parts = []
    if gathered:
        gathers = "gathers what it accumulates"
        if len(gathered) > 1:
            gathers = "gather what they accumulate"
        parts.append(f"the evaluation {_loops(gathered)} {gathers}")
    if whole:
        reads = "read loaders" if len(whole) > 1 else "reads a loader"
        parts.append(
            f"the evaluation {_loops(whole)} {reads} no prepare call shards: every rank "
            "evaluates the whole set"
        )
    if nothing_kept:
        keeps = "keep" if len(nothing_kept) > 1 else "keeps"
        parts.append(
            f"the {_loops(nothing_kept)} {keeps} nothing past each batch (no total, list or "
            "file to gather)"
        )
    return "; ".join(parts)


def _loops(cells: list[str]) -> str:
    """A row's first cells as places: ``12`` (the script's line), ``src/engine.py:80``."""
    if all(":" not in cell for cell in cells):
        if len(cells) > 1:
            return f"loops at converted lines {', '.join(cells)}"
        return f"loop at line {cells[0]}"
    named = [cell if ":" in cell else f"converted line {cell}" for cell in cells]
    return f"loop{'s' if len(cells) > 1 else ''} at {', '.join(named)}"


def training_cache_lines(code: str, label: str) -> set[int]:
    """Lines of the converted script's loops over a loader that cache what training reads back
    (a distillation teacher's outputs over the training loader): a run sees a pass with no
    backward over a sharded loader, but there is nothing to gather: each rank's cache must
    follow its own shard."""
    from accelify.analysis.evaluation import caches_for_training
    from accelify.analysis.facts import facts_of
    from accelify.analysis.script_model import analyze
    from accelify.source import parse

    try:
        script = analyze(parse(code.encode("utf-8"), label), code)
    except UserError:
        return set()
    facts = facts_of(script)
    return {
        script.position(loop.node).start.line
        for loop in script.loops
        if caches_for_training(loop, facts)
    }
