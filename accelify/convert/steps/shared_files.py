"""9. Files the ranks share: a file the main process saves and every rank loads again gets
``accelerator.wait_for_everyone()`` between the save and the loads, where every rank reaches it
(never inside a branch the ranks may disagree on); a save whose path is made per process
(``tempfile.TemporaryDirectory()``, ``os.getpid()``, a timestamp) and read back stays on every
rank, each rank writing and reading its own file, and the summary says so. Data downloaded or
prepared by every rank at once is downloaded by the main process first
(``with accelerator.main_process_first():``, a barrier every rank reaches, so never inside a
branch the ranks may disagree on); a bare download statement whose result nothing reads runs on
the main process alone, the others waiting for it."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import side_effects
from accelify.analysis.shared_files import CacheBuild, Download, SharedFile
from accelify.analysis.syntax import dotted
from accelify.convert.steps import collective_stops
from accelify.convert.steps.context import Context
from accelify.edits import rewrites


def run(ctx: Context) -> None:
    opened: set[int] = set()
    for shared in ctx.facts.shared_files.read_back:
        if shared.per_process is not None:
            _kept_on_every_rank(ctx, shared)
            continue
        # ``with open(p, "rb") as f: torch.load(f)``: the open and the load read one file,
        # from one place (before the ``with``): one barrier, one line of the summary
        at = ctx.statement_of(ctx.facts.shared_files.opened_at(shared.read))
        if id(at) not in opened:
            opened.add(id(at))
            _barrier_before_read(ctx, shared)
    for download in ctx.facts.shared_files.downloads:
        _download_once(ctx, download)
    for cache in ctx.facts.shared_files.cache_builds:
        _main_process_builds_first(ctx, cache)
    for deleted in ctx.facts.shared_files.deleted_after_read:
        _barrier_before_deletion(ctx, deleted)
    for statement, call, where in _data_built_by_project_helpers(ctx):
        _built_by_the_main_process_first(ctx, statement, call, where)


def _data_built_by_project_helpers(
    ctx: Context,
) -> list[tuple[cst.SimpleStatementLine, cst.Call, str]]:
    """``vocab = build_vocab(train_dataset, df, save_path="outputs/vocab.pkl")``: a statement
    that keeps what a function of the project's other module returns, where that function also
    writes a file (`project.imported_file_writers`). Every rank needs the value, so the call
    cannot move to the main process; run by every rank at once, each writes the same file
    while another may be writing it (two truncations and dumps interleaved, a reader seeing
    half of it). Only calls handed plain values (names, constants, their members: nothing
    that runs the model, trains or meets the other ranks), where every rank gets."""
    found: list[tuple[cst.SimpleStatementLine, cst.Call, str]] = []
    flow = ctx.facts.flow
    for line in ctx.model.index.of_type(cst.SimpleStatementLine):
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            continue
        assign = line.body[0]
        if not isinstance(assign, cst.Assign) or not isinstance(assign.value, cst.Call):
            continue
        call = assign.value
        where = ctx.imported_file_writers.get(dotted(call.func) or "")
        if where is None or ctx.facts.calls.targets(call):
            continue
        values = [argument.value for argument in call.args]
        if not all(_plain(value) for value in values):
            continue
        if any(flow.kind_of(dotted(value), call) is not None for value in values):
            continue  # handed a model, loader, optimizer...: not data preparation
        if ctx.facts.ranks.under_rank_guard(call) or side_effects.per_rank_path(ctx.model, call):
            continue
        if ctx.facts.shared_files.divergent_around(line) is not None:
            continue
        found.append((line, call, where))
    return found


def _plain(value: cst.BaseExpression) -> bool:
    """A name, a constant or a member of one: computing it runs nothing."""
    if isinstance(value, (cst.Name, cst.Attribute)):
        return dotted(value) is not None
    return isinstance(value, (cst.SimpleString, cst.Integer, cst.Float, cst.ConcatenatedString))


def _built_by_the_main_process_first(
    ctx: Context, statement: cst.SimpleStatementLine, call: cst.Call, where: str
) -> None:
    what = f"{ctx.code(call.func)}(...)"
    ctx.plan.wrap_in(
        statement,
        ctx.a("main_process_first()"),
        ctx.line(statement),
        f"{what} writes a file ({where}) and returns what every rank needs: in `with "
        f"{ctx.a('main_process_first()')}:` the main process runs it first, then the others, "
        "and no rank leaves the block before every rank has written it (none reads it half "
        "written)",
    )
    ctx.need(statement)


def _barrier_before_deletion(ctx: Context, shared: SharedFile) -> None:
    """The deletion runs on the main process (side effects step): every rank must have read the
    file by then, so the ranks wait for each other before it, where every rank gets."""
    deletion, read = shared.write, shared.read
    places = ctx.facts.ranks.barrier_places(ctx.statement_of(deletion))
    path = ctx.code(shared.path)
    shared_branch = next((p for p in places if ctx.facts.placement.inside(read, p)), None)
    unreached = next(
        (b for b in map(ctx.facts.shared_files.divergent_around, places) if b is not None),
        shared_branch,
    )
    if unreached is not None:
        ctx.review_at(
            deletion,
            f"{path} is read by every rank at line {ctx.line(read)} and deleted here on the main "
            f"process; left without a barrier between them: the ranks may disagree on line "
            f"{ctx.line(unreached)}, and a barrier must be reached by every rank: delete it "
            "where every rank gets, after accelerator.wait_for_everyone()",
        )
        return
    used = ctx.acc
    for place in places:
        acc = used = ctx.accelerator_at(place)
        ctx.plan.add(rewrites.barrier(place, acc), anywhere=acc != ctx.acc)
        if acc == ctx.acc:
            ctx.need(place)
    ctx.plan.change(
        ctx.line(deletion),
        f"{used}.wait_for_everyone() before the deletion: {path} is read by every rank at "
        f"line {ctx.line(read)}, and the main process must not delete it before a slower rank "
        "has read it",
    )


def _download_once(ctx: Context, download: Download) -> None:
    line, what = ctx.line(download.statement), f"{ctx.code(download.call.func)}(...)"
    if download.with_shared_work:
        ctx.plan.review(
            line,
            f"{what} downloads data on every rank at once; left as is: the same statement "
            "does work every rank must do in step (a forward, a collective, a save the "
            "conversion puts behind a barrier), so the main process cannot go first: "
            "download in a statement of its own",
        )
        return
    if download.divergent is not None:
        ctx.plan.review(
            line,
            f"{what} downloads data on every rank that gets here, at once; left as is: the "
            f"ranks may disagree on line {ctx.line(download.divergent)}, and the block that "
            f"makes the main process go first ({ctx.a('main_process_first()')}) must be "
            "reached by every rank: download before that branch",
        )
        return
    if _effects_only(download.statement):
        ctx.plan.add(
            rewrites.main_process_only(download.statement, ctx.acc),
            rewrites.barrier_after(download.statement, ctx.acc),
            line=line,
            text=f"{what} downloads on the main process only; every rank then waits for it "
            f"({ctx.a('wait_for_everyone()')})",
        )
    else:
        ctx.plan.wrap_in(
            download.statement,
            ctx.a("main_process_first()"),
            line,
            f"{what} downloads data: in `with {ctx.a('main_process_first()')}:` the main "
            "process downloads first, then the others read what it wrote",
        )
    ctx.need(download.statement)


def _main_process_builds_first(ctx: Context, cache: CacheBuild) -> None:
    """A file built if missing and read otherwise, by every rank: in
    ``with accelerator.main_process_first():`` the main process builds and writes it, and the
    others, let in after it, find it whole and read it."""
    line, path = ctx.line(cache.statement), ctx.code(cache.path)
    what = (
        f"{path} is read if it exists (line {ctx.line(cache.read)}) and else built and written "
        f"(line {ctx.line(cache.write)}, on the main process once converted), by every rank"
    )
    if cache.with_shared_work:
        # the build trains (or gathers) with every rank in step: no rank gets to the test
        # after the main process has written the file in this run, so there is no race
        return
    if cache.divergent is not None or cache.saved_behind_a_barrier:
        why = (
            f"the ranks may disagree on line {ctx.line(cache.divergent)}, and `with "
            f"{ctx.a('main_process_first()')}:` must be reached by every rank: build the file "
            "before that branch, where every rank gets"
            if cache.divergent is not None
            else f"the save becomes {ctx.a('save')}, whose barrier cannot go inside `with "
            f"{ctx.a('main_process_first()')}:`: write the file with torch.save under `if "
            f"{ctx.a('is_main_process')}:` inside such a block"
        )
        ctx.plan.review(
            line,
            f"{what}: the other ranks may read it half written or build it again; left as is: "
            f"{why}",
        )
        return
    ctx.plan.wrap_in(
        cache.statement,
        ctx.a("main_process_first()"),
        line,
        f"{what}: in `with {ctx.a('main_process_first()')}:` the main process builds it first, "
        "then the others read what it wrote (not half of it, nor build it again)",
    )
    ctx.need(cache.statement)


def _effects_only(node: cst.CSTNode) -> bool:
    """A line of bare calls (``urlretrieve(url, path)``): nothing it returns is kept."""
    return isinstance(node, cst.SimpleStatementLine) and all(
        isinstance(small, cst.Expr) for small in node.body
    )


def _barrier_before_read(ctx: Context, shared: SharedFile) -> None:
    read, write = shared.read, shared.write
    opened = ctx.facts.shared_files.opened_at(read)
    # ``with open(trainer.test()) as f:``: the read's own statement runs the write, so the
    # barrier goes where test() hands the written path back
    waited = ctx.statement_of(opened if shared.returned_at is None else shared.returned_at)
    places = ctx.facts.ranks.barrier_places(waited)
    path = ctx.code(ctx.facts.shared_files.opened_path(shared.path))
    if any(ctx.facts.placement.inside(write, place) for place in places):
        ctx.review_at(
            read,
            f"{path} is saved at line {ctx.line(write)} on the main process and read here by "
            "every rank, in a branch the ranks may disagree on: no barrier can go between "
            "them; read it after the branch, behind accelerator.wait_for_everyone()",
        )
        return
    unreached = next(
        (b for b in map(ctx.facts.shared_files.divergent_around, places) if b is not None), None
    )
    if unreached is not None:
        ctx.review_at(
            read,
            f"{path} is saved on the main process at line {ctx.line(write)} and read here by "
            f"every rank that gets here; left without a barrier: the ranks may disagree on "
            f"line {ctx.line(unreached)}, and a barrier must be reached by every rank: read it "
            "where every rank does, after accelerator.wait_for_everyone()",
        )
        return
    accelerators = []
    for place in places:
        # Outside the class that owns ``self.accelerator``: through the instance the scope made
        # (``trainer.accelerator.wait_for_everyone()``) or the process state, as prints are.
        acc = ctx.accelerator_at(place)
        accelerators.append(acc)
        ctx.plan.add(rewrites.barrier(place, acc), anywhere=acc != ctx.acc)
        if acc == ctx.acc:
            ctx.need(place)
    code = f"{accelerators[0] if accelerators else ctx.acc}.wait_for_everyone()"
    everywhere = any(
        ctx.facts.placement.inside(write, b) and side_effects.writes_into(write, b)
        for b in ctx.written_everywhere
    )
    saved = "written by every rank" if everywhere else "saved on the main process"
    if shared.returned_at is not None:
        ctx.plan.change(
            ctx.line(read),
            f"{code} before line {ctx.line(shared.returned_at)} returns the path that this line "
            f"reads: {path} is {saved} at line {ctx.line(write)} and read by every rank",
        )
        return
    if shared.unsure:
        ctx.plan.change(
            ctx.line(read),
            f"{code} before the read: it may read the file saved on the main process at line "
            f"{ctx.line(write)} ({path}): the file does not show the two paths apart",
        )
        return
    ctx.plan.change(
        ctx.line(read),
        f"{code} before the read: {path} is {saved} at line {ctx.line(write)} and read by "
        "every rank",
    )


def _kept_on_every_rank(ctx: Context, shared: SharedFile) -> None:
    source = shared.per_process
    assert source is not None
    made = f"{ctx.code(source.source.func)}() (line {ctx.line(source.source)})"
    where = f"saved and read back at line {ctx.line(shared.read)} on every rank"
    if source.clock:
        ctx.review_at(
            shared.write,
            f"the path comes from {made}, a timestamp: ranks may get different paths or the "
            f"same one; {where}, each its own file, and two ranks with one path write it at "
            "once: make it one path for the run, or put accelerator.process_index in it",
        )
        return
    # a test of a metric the conversion gathers (``acc > best``) is decided alike by every rank
    branch = ctx.facts.shared_files.divergent_around(
        shared.write, decided_alike=collective_stops.decided_alike(ctx)
    )
    if branch is not None:
        ctx.review_at(
            shared.write,
            f"kept on every rank (the path comes from {made}, another file on each process), "
            f"but whether to save is decided by `{ctx.code(branch.test)}` (line "
            f"{ctx.line(branch)}), which the ranks may decide differently: each rank reads "
            f"back its own file at line {ctx.line(shared.read)} and the ranks no longer agree; "
            "decide on a value every rank shares (accelerator.reduce it) or make the path one",
        )
        return
    ctx.plan.change(
        ctx.line(shared.write),
        f"kept on every rank: the path comes from {made}, another file on each process; {where}",
    )
