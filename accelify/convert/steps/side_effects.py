"""9. Other writes meant to happen once: files written or deleted by any API run on the main
process, with the code that only feeds them (a visualisation under ``if i == 0:``); TensorBoard
writers exist on the main process only; check-then-create directory races become
``os.makedirs(d, exist_ok=True)``. A block that also runs the model or a collective is never
guarded whole: only its write is (a forward on one rank alone can hang DDP)."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import collectives, side_effects
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, walk
from accelify.analysis.writing_helpers import arguments_change_state
from accelify.convert.steps import main_process
from accelify.convert.steps.context import Context, unwrap
from accelify.convert.steps.saving import in_writing_helper
from accelify.edits import rewrites


def run(ctx: Context) -> None:
    guarded: list[cst.CSTNode] = []
    model, placement = ctx.model, ctx.facts.placement
    for write in [*side_effects.writes(model, placement), *_helper_writes(ctx)]:
        if _already_once(ctx, write.statement) or side_effects.per_rank_path(model, write.call):
            continue
        if in_writing_helper(ctx, write.statement):
            continue  # its calls are guarded
        if ctx.facts.shared_files.kept_on_every_rank(write.call):
            continue  # a per-process path read back: each rank writes its own file
        region = _feeding_region(ctx, write.statement)
        if any(placement.inside(region, done) for done in guarded):
            continue
        _unwrap_receiver(ctx, write.call)
        where = ctx.imported_writers.get(dotted(write.call.func) or "")
        text = f"{ctx.code(write.call.func)}(...) runs on the main process only"
        _guard(ctx, region, text + (f" (it only writes files: {where})" if where else ""))
        guarded.append(region)
    for writer in side_effects.summary_writers(model, placement):
        _guard_writer(ctx, writer)
    for race in side_effects.makedirs_races(model, placement):
        if not ctx.facts.ranks.under_rank_guard(race.call):
            _fix_makedirs(ctx, race)
    for made, source in side_effects.folders_named_by_the_clock(model, ctx.facts):
        if not ctx.facts.ranks.under_rank_guard(made):
            ctx.plan.review(ctx.line(made), clock_named_folder(ctx.code(source.func), source, ctx))


def clock_named_folder(clock: str, source: cst.Call, ctx: Context) -> str:
    """Why a folder named from the clock and made on every rank is left for review."""
    return (
        f"every rank makes this folder, named from {clock}() (line {ctx.line(source)}), a "
        "timestamp each rank reads itself: ranks a second apart make two folders, and each "
        "rank's path names its own; the name is left as it is: make it once, on the main "
        "process, and hand it to every rank (broadcast_object_list([name])[0]), or name it "
        "by a setting"
    )


def _helper_writes(ctx: Context) -> list[side_effects.Write]:
    """Calls of the file's functions that only write files (`writing_helpers`): each is a
    write, as ``json.dump(...)`` in its place would be."""
    helpers = ctx.facts.writing_helpers
    imported = ctx.imported_writers if not ctx.facts.shared_files.reads_files else {}
    if not helpers and not imported:
        return []
    return [
        side_effects.Write(line, call)
        for line, call in ctx.facts.placement.expression_statements()
        if (
            ((targets := ctx.facts.calls.targets(call)) and all(t in helpers for t in targets))
            or (not targets and dotted(call.func) in imported)
        )
        and not _hands_trained(ctx, call)
        and not _arguments_change_state(ctx, call)
    ]


def _hands_trained(ctx: Context, call: cst.Call) -> bool:
    """``save_results(model, path)``: handed a model or optimizer, whose prepared state
    differs (a helper of another module keeps its review line, `saving._project_writers`),
    or a loader or scheduler: a prepared one may synchronise the ranks when iterated or
    stepped, and a model may run in there, which on one rank alone can hang."""
    flow = ctx.facts.flow
    return any(
        flow.kind_of(name, call) in (Kind.MODEL, Kind.OPTIMIZER, Kind.DATALOADER, Kind.SCHEDULER)
        for argument in call.args
        for node in walk(argument.value)
        if isinstance(node, (cst.Name, cst.Attribute)) and (name := dotted(node)) is not None
    )


def _arguments_change_state(ctx: Context, call: cst.Call) -> bool:
    """An argument of ``call`` that changes what every rank reads on (`arguments_change_state`):
    a helper of another module called so is left on every rank."""
    return arguments_change_state(ctx.model, ctx.facts.calls, call, ctx.facts.writing_helpers)


def _already_once(ctx: Context, node: cst.CSTNode) -> bool:
    """Under a rank guard, or inside ``with open(path, "w")`` (guarded by the saving step). A
    block the saving step leaves on every rank (it trains, or computes what is read after it)
    keeps its review line for the writes into its own file; any other write in it
    (``shutil.copyfile(last, best)``) is guarded here like one outside it."""
    if ctx.facts.ranks.under_rank_guard(node):
        return True
    return any(
        isinstance(ancestor, cst.With)
        and any(side_effects.opens_for_writing(i.item) for i in ancestor.items)
        and (
            not any(ancestor is block for block in (*ctx.written_everywhere, *ctx.opened_on_main))
            or side_effects.writes_into(node, ancestor)
        )
        for ancestor in ctx.model.ancestors(node)
    )


def _feeding_region(ctx: Context, write: cst.SimpleStatementLine) -> cst.CSTNode:
    """The write, or the ``if`` blocks around it that do nothing but feed it."""
    region: cst.CSTNode = write
    while True:
        block = ctx.model.parent(region)
        branch = ctx.model.parent(block) if block is not None else None
        if not (
            isinstance(branch, cst.If)
            and branch.orelse is None
            and not isinstance(ctx.model.parent(branch), cst.If)  # not an elif
            and not _runs_shared_work(ctx, branch.test)
        ):
            return region
        others = [s for s in branch.body.body if s is not region]  # type: ignore[union-attr]
        outside = {
            n.value
            for n in walk(ctx.model.scope_of(branch))
            if isinstance(n, cst.Name) and not ctx.facts.placement.inside(n, branch)
        }
        if not all(_only_feeds(ctx, s, outside) for s in others):
            return region
        region = branch


def _only_feeds(ctx: Context, line: cst.CSTNode, outside: set[str]) -> bool:
    """A simple statement with no shared work whose names are not read outside its block
    (``outside``: the names used elsewhere in the scope)."""
    if not isinstance(line, cst.SimpleStatementLine) or _runs_shared_work(ctx, line):
        return False
    bound = {
        n
        for small in line.body
        if isinstance(small, cst.Assign)
        for t in small.targets
        for n in _names(t.target)
    }
    return not bound & outside


def _names(target: cst.BaseExpression) -> set[str]:
    return {n.value for n in walk(target) if isinstance(n, cst.Name)}


def _runs_shared_work(ctx: Context, node: cst.CSTNode) -> bool:
    """A forward of a model, or a call on the accelerator (collectives among them)."""
    for inner in walk(node):
        if not isinstance(inner, cst.Call):
            continue
        func = dotted(inner.func) or ""
        if ctx.facts.flow.is_model_name(func, inner) or func.startswith(
            ("accelerator.", "self.accelerator.")
        ):
            return True
        if ctx.model.call_names(inner) & collectives.FUNCTIONS:
            return True
    return False


def _unwrap_receiver(ctx: Context, call: cst.Call) -> None:
    """``model.save_pretrained(d)`` of a prepared model: the wrapper has no such method."""
    func = call.func
    if isinstance(func, cst.Attribute) and ctx.facts.flow.is_model_name(dotted(func.value), call):
        name = dotted(func.value)
        unwrap(
            ctx, func.value, call, f"{name}.{func.attr.value} -> {ctx.a('unwrap_model')}({name})"
        )


def _guard(ctx: Context, node: cst.CSTNode, text: str) -> None:
    main_process.guard(ctx, node, text, "this runs on every rank")


def _guard_writer(ctx: Context, writer: side_effects.SummaryWriterUse) -> None:
    if ctx.facts.ranks.under_rank_guard(writer.created):
        return
    if writer.escapes is not None:
        ctx.plan.review(
            writer.escapes,
            f"{writer.name} (a TensorBoard writer) is used here on every rank: create and use it "
            f"under `if {ctx.a('is_main_process')}:`",
        )
        return
    _guard(ctx, writer.created, f"{writer.name} = SummaryWriter(...) on the main process only")
    for use in writer.uses:
        if not ctx.facts.ranks.under_rank_guard(use):
            _guard(ctx, use, f"{writer.name} used on the main process only")


def _fix_makedirs(ctx: Context, race: side_effects.MakedirsRace) -> None:
    call = race.call
    edit = rewrites.makedirs_exist_ok(race.statement, call)
    if edit is None:
        ctx.plan.review(ctx.line(call), "directory created on every rank: use exist_ok=True")
        return
    makedirs = (dotted(call.func) or "").rsplit(".", 1)[0] + ".makedirs"
    path = ctx.code(call.args[0].value) if call.args else ""
    # Needs no accelerator: fixed anywhere.
    ctx.plan.add(
        edit,
        line=ctx.line(call),
        text=f"every rank creates the directory: {makedirs}({path}, exist_ok=True)",
        anywhere=True,
    )
