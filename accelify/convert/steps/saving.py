"""9. Saving and other writes meant to happen once: ``torch.save`` -> ``accelerator.save`` after a
barrier every rank reaches, files opened for writing on the main process only."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.loss_sources import last_binding, runs_before
from accelify.analysis.objects import property_alias
from accelify.analysis.saved_values import saved_whole_objects
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import assigned_targets, dotted, target_names, walk
from accelify.convert import project
from accelify.convert.saver_modules import saves_guarded
from accelify.convert.steps import collective_stops, main_process, saved_states
from accelify.convert.steps.context import Context, star_imported_from_the_project, unwrap
from accelify.convert.steps.host_inputs import returned_by
from accelify.edits import rewrites
from accelify.edits.node_rewrites import Swap

if TYPE_CHECKING:
    from accelify.convert.project import ObjectSaver, StateSaver


def run(ctx: Context) -> None:
    guarded_writes = _plan_file_writes(ctx)
    _project_writers(ctx)
    _project_object_savers(ctx)
    saved_states.gather_or_review_optimizer_states(ctx)
    saved_states.review_optimizer_loads_under_hf(ctx)
    for line_statement, call in ctx.facts.placement.expression_statements():
        if not ctx.model.call_names(call) & names.TORCH_SAVE:
            continue
        _unwrap_saved_model(ctx, call, ctx.instance_outside_class(call))
        _unwrap_state_of_a_returned_object(ctx, call)
        if any(ctx.facts.placement.inside(call, block) for block in guarded_writes):
            continue  # writes into a file only the main process opens
        if ctx.facts.shared_files.kept_on_every_rank(call):
            continue  # a per-process path read back: each rank saves its own file
        barriers = []
        unreached = None
        parted = ctx.facts.shared_files.parting_before(
            call, decided_alike=collective_stops.decided_alike(ctx)
        )
        if not ctx.facts.ranks.under_rank_guard(call) and parted is None:
            barriers = ctx.facts.ranks.barrier_places(line_statement)
            unreached = ctx.facts.shared_files.barrier_unreached(
                barriers, decided_alike=collective_stops.decided_alike(ctx)
            )
            if unreached is not None:
                barriers = []
                _review_no_barrier(ctx, call, unreached)
        outside = ctx.instance_outside_class(call)
        if outside is not None:
            _save_through_instance(ctx, call, outside, barriers)
            continue
        if not ctx.plan.reaches(call):
            _save_on_the_main_process(ctx, line_statement, call, barriers)
            continue
        ctx.plan.add(
            *rewrites.save(call, ctx.acc, barriers),
            line=ctx.line(call),
            text=f"torch.save -> {ctx.a('save')} (main process only)"
            + _waits_first(ctx, call, barriers, ctx.acc)
            + _no_barrier_in(ctx, parted)
            + (", with no barrier before it (see the review line)" if unreached else ""),
        )
        ctx.need(call)
        for anchor in barriers:
            ctx.need(anchor)


def _project_writers(ctx: Context) -> None:
    """``utils.save_checkpoint(model, path)``: a function of the project's own module, which the
    conversion cannot read, named as a write and handed the model or optimizer (or their
    state). Every rank runs it, so every rank writes the same file, racing, and the prepared
    model's state carries DDP's ``module.`` prefix. Not rewritten: what it does is unseen."""
    flow = ctx.facts.flow
    for call in ctx.model.calls:
        name = dotted(call.func)
        saver = ctx.imported_state_savers.get(name or "")
        # a file writer handed a loader may evaluate it (each rank its shard): not this advice
        named = name is not None and _named_as_a_write(name.rsplit(".", 1)[-1])
        writes = (
            None
            if named or saver or _hands_a_loader(ctx, call)
            else ctx.imported_file_writers.get(name or "")
        )
        if name is None or not (named or saver or writes):
            continue
        if ctx.facts.calls.targets(call) or not _imported_from_the_project(ctx, name):
            continue
        unwrapped_here = _unwrap_models_a_saver_is_handed(ctx, call, name, saver)
        if ctx.facts.ranks.under_rank_guard(call):
            continue
        handed = {
            held: kind
            for argument in call.args
            if (held := _held_object(argument.value)) is not None
            and (kind := flow.kind_of(held, call)) in (Kind.MODEL, Kind.OPTIMIZER)
        }
        if saver is not None and saver.guardable and _saved_once(ctx, call, name, saver):
            continue
        if not handed and saver is not None:
            # ``save_checkpoint({"model": model.state_dict(), ...}, is_best, path)``: what it
            # saves is built at the call, but every rank still writes the file
            _review_a_saver_left_on_every_rank(ctx, call, name, saver)
            continue
        if not handed:
            continue
        models = [
            held
            for held, kind in handed.items()
            if kind is Kind.MODEL and held not in unwrapped_here
        ]
        unwrap_model = ctx.a("unwrap_model")
        unwrapped = ", ".join(f"{unwrap_model}({m})" for m in models)
        unwrap = f", handing it {unwrapped}" if models else ""
        prefix = ", and a prepared model's state has DDP's `module.` prefix" if models else ""
        if saver is not None:
            seen = (
                f"{name}() is a function of another module that saves what it is handed "
                f"({saver.where}), handed"
            )
        elif writes:
            # ``generate_new_image(self.generator, z, save_path=...)``: it runs the model
            # handed and saves what it makes
            seen = f"{name}() is a function of another module that writes a file ({writes}), handed"
        else:
            seen = f"{name}() is a function of another module the conversion cannot see, handed"
        if writes and saver is None:
            # it writes for sure; what it does with the model is unseen (it may run it: the
            # prepared model's forward is a collective the main process must not run alone)
            prefix = ", and the prepared model is DDP's wrapper" if models else ""
            ctx.plan.review(
                ctx.line(call),
                f"{seen} {', '.join(handed)}: every rank calls it, so every rank writes that "
                f"file (N writes racing on one path){prefix}; call it under "
                f"`if {ctx.a('is_main_process')}:`{unwrap} (unwrapped, its forward is no "
                "collective the other ranks must join)",
            )
            continue
        ctx.plan.review(
            ctx.line(call),
            f"{seen} {', '.join(handed)}: every rank calls it, so if it writes a file every rank "
            f"writes it (N writes racing on one path){prefix}; call it under "
            f"`if {ctx.a('is_main_process')}:` after {ctx.a('wait_for_everyone')}(){unwrap}",
        )


def _hands_a_loader(ctx: Context, call: cst.Call) -> bool:
    """An argument of ``call`` reads a DataLoader."""
    return any(
        ctx.facts.flow.kind_of(name, call) is Kind.DATALOADER
        for argument in call.args
        for node in walk(argument.value)
        if isinstance(node, (cst.Name, cst.Attribute)) and (name := dotted(node)) is not None
    )


def _review_a_saver_left_on_every_rank(
    ctx: Context, call: cst.Call, name: str, saver: StateSaver
) -> None:
    """The review line of a call of a saving function of another module (`StateSaver`) that is
    left running on every rank: what to do depends on whether the function does more than
    save (then only its save may move to the main process, inside it)."""
    if saver.guardable:
        todo = (
            f"make it a statement every rank reaches, and call it under "
            f"`if {ctx.a('is_main_process')}:` after {ctx.a('wait_for_everyone')}()"
        )
    else:
        todo = (
            "it does more than save (something another rank may need), so the call stays on "
            "every rank: put its torch.save under `if PartialState().is_main_process:` there"
        )
    ctx.plan.review(
        ctx.line(call),
        f"{name}() is a function of another module that saves what it is handed "
        f"({saver.where}): every rank calls it, so every rank writes its file (N writes racing "
        f"on one path); {todo}, and have every rank wait ({ctx.a('wait_for_everyone')}()) "
        "after the call before any rank reads the file back",
    )


def _project_object_savers(ctx: Context) -> None:
    """``self.early_stopping(val_loss, self.model)`` of an object whose class, in a module of
    the project, saves the state dict of the model it is handed (`project.ObjectSaver`):
    handed the unwrapped model, so its file holds the model's own keys; and every rank waits
    after the call (where every rank gets), so a rank that reads the file back later finds it
    whole. The save itself runs on the main process only where that module is converted in
    the same run (`project.guarded_saves`); else a review line says every rank writes it."""
    for name, saver in ctx.imported_object_savers.items():
        instances = project.saver_instances(ctx.model, name)
        for made in project.unfollowed_instances(ctx.model, name, instances):
            ctx.plan.review(
                ctx.line(made),
                f"{ctx.code(made)}: {saver.class_name} ({saver.module.name}) saves the state "
                f"dict of the model it is handed ({saver.where}) on every rank, and the "
                "conversion cannot follow this object to its calls: hand it the accelerator's "
                "unwrap_model(model) (a prepared model's keys start with `module.`), have every "
                "rank call wait_for_everyone() after each call before any rank reads the file "
                "back, and put that torch.save under `if PartialState().is_main_process:`",
            )
        for call in ctx.model.calls:
            found = project.saver_method(call, instances)
            if found is None or found[1] not in saver.methods:
                continue
            instance, method = found
            shown = instance if method == "__call__" else f"{instance}.{method}"
            _unwrap_models_a_saver_is_handed(ctx, call, shown, saver.methods[method])
            _wait_after_an_object_save(ctx, call, shown, saver)


def _wait_after_an_object_save(
    ctx: Context, call: cst.Call, shown: str, saver: ObjectSaver
) -> None:
    """Every rank waits after the call, where every rank gets (`barrier_places`): the file the
    object may have saved is whole before any rank reads it back. Left for review where the
    call is not a statement of its own, or a rank may have left before it."""
    module = saver.module.name
    line = project.own_line(ctx.model, call)
    converted = str(saver.module.resolve()) in ctx.options.converted_with
    # the module's save runs on the main process alone only where every call of every file
    # converted with it waits after it (the module's conversion asks the same question)
    converted_with = (
        saver.guardable
        and converted
        and saves_guarded(saver.module, saver.class_name, ctx.options.converted_with)
    )
    if line is None or _barriers_unreached(ctx, call, line):
        kept = f" ({module}'s save is left on every rank too)" if converted else ""
        ctx.plan.review(
            ctx.line(call),
            f"{shown}() may save the model's state ({saver.where}) on every rank{kept}: left "
            "without a barrier after it (it is not a statement of its own, or a rank may have "
            "left before it): make it a statement every rank reaches, then put "
            f"{ctx.a('wait_for_everyone')}() after it and that torch.save under `if "
            f"PartialState().is_main_process:` in {module}, so that no rank reads the file "
            "back before it is whole",
        )
        return
    acc = ctx.accelerator_at(line)
    places = ctx.facts.ranks.barrier_places(line)
    where = (
        f"on the main process only ({module} is converted with this file)"
        if converted_with
        else "on every rank"
    )
    ctx.plan.add(
        *(rewrites.barrier_after(place, acc) for place in places),
        line=ctx.line(call),
        text=f"{shown}() may save the model's state ({saver.where}, {where}): every rank waits "
        f"for the file after it ({acc}.wait_for_everyone())",
        anywhere=acc != ctx.acc,
    )
    if acc == ctx.acc:
        for place in places:
            ctx.need(place)
    if not converted_with and converted and saver.guardable:
        ctx.plan.review(
            ctx.line(call),
            f"{shown}() saves the model's state in {saver.module.name}'s {saver.class_name} "
            f"({saver.where}) on every rank: N writes racing on one path; {module}, converted "
            "with this file, keeps that save on every rank: the conversion could not tell that "
            "every rank reaches each call of the class's saving methods as a statement of its "
            "own (here or in another file converted with it), and a rank that read the file "
            "before the main process wrote it would fail; once every call is followed by "
            f"{ctx.a('wait_for_everyone')}(), put that torch.save under `if "
            "PartialState().is_main_process:`",
        )
    elif not converted_with:
        ctx.plan.review(
            ctx.line(call),
            f"{shown}() saves the model's state in {saver.module.name}'s {saver.class_name} "
            f"({saver.where}) on every rank: N writes racing on one path; convert {module} "
            "with this file (accelify convert on the folder: its save then runs on the main "
            "process only), or put that torch.save under `if PartialState().is_main_process:`",
        )
    else:
        ctx.plan.review(
            ctx.line(call),
            f"{shown}() takes the model's state itself ({saver.where}), on the main process "
            "alone once converted: right under DDP, but under FSDP or ZeRO-3 that state is "
            "sharded and gathering it needs every rank",
        )


def _barriers_unreached(ctx: Context, call: cst.Call, line: cst.CSTNode) -> bool:
    """A rank may leave before ``call``, or never reach a place its barriers would go (they
    go around the branch the ranks may disagree on, which itself may be reached by some ranks
    only, through a caller under a rank test)."""
    decided_alike = collective_stops.decided_alike(ctx)
    files = ctx.facts.shared_files
    return bool(
        files.parting_before(call, decided_alike=decided_alike)
        or files.barrier_unreached(ctx.facts.ranks.barrier_places(line), decided_alike)
    )


def _saved_once(ctx: Context, call: cst.Call, name: str, saver: StateSaver) -> bool:
    """A call of a sibling module's function that saves a model's state (`StateSaver`), a
    statement of its own that every rank reaches: it runs on the main process only, between
    two barriers (the first: every rank done with the step it saves; the second: no rank reads
    the file back before it is whole). Every rank running it writes one path N times at once.
    The barriers go around the outermost branch around it that the ranks may disagree on.
    False where that cannot be done (the call's value is used, a rank may have left the loop
    or function before it): the review line then says what to do."""
    line = project.own_line(ctx.model, call)
    if line is None:
        return False
    if _barriers_unreached(ctx, call, line):
        return False  # a rank that left early, or skips a branch, would never reach them
    acc = ctx.accelerator_at(line)
    # around the outermost branch the ranks may disagree on, where there is one (`barrier_places`)
    places = ctx.facts.ranks.barrier_places(line)
    ctx.plan.add(
        *(rewrites.barrier(place, acc) for place in places),
        rewrites.main_process_only(line, acc),
        *(rewrites.barrier_after(place, acc) for place in places),
        line=ctx.line(call),
        text=f"{name}() saves a model's state ({saver.where}): on the main process only, "
        f"after {acc}.wait_for_everyone(), and every rank waits for the file after it",
        anywhere=acc != ctx.acc,
    )
    # the helper's own ``model.state_dict()`` is out of the conversion's reach: DDP's is whole,
    # FSDP's and ZeRO-3's is this rank's shard and gathering it needs every rank
    if saver.saved:
        ctx.plan.review(
            ctx.line(call),
            f"{name}() takes the model's state itself ({saver.where}), now on the main process "
            "alone: right under DDP, but under FSDP or ZeRO-3 that state is sharded and "
            f"gathering it needs every rank; for those, have it take "
            f"{ctx.a('get_state_dict')}(model), called on every rank, instead",
        )
    elif any(
        isinstance(node, cst.Attribute) and node.attr.value == "state_dict"
        for argument in call.args
        for node in walk(argument.value)
    ):  # ``save_checkpoint({"model": model.state_dict(), ...}, ...)``: taken at the call
        ctx.plan.review(
            ctx.line(call),
            f"{name}() saves what it is handed ({saver.where}), and the state_dict() calls in "
            "its arguments now run on the main process alone: right under DDP, but under FSDP "
            "or ZeRO-3 that state is sharded and gathering it needs every rank; for those, "
            f"take {ctx.a('get_state_dict')}(model) into a name on every rank before "
            f"{ctx.a('wait_for_everyone')}() and hand that name to {name}()",
        )
    if acc == ctx.acc:
        ctx.need(line)
        for place in places:
            ctx.need(place)
    return True


def _unwrap_models_a_saver_is_handed(
    ctx: Context, call: cst.Call, name: str, saver: StateSaver | None
) -> set[str]:
    """``utils.save_checkpoint(path, model, optimizer)`` where the sibling module's function
    saves ``model.state_dict()`` (`project.imported_state_savers`): handed the prepared model,
    it would save the DDP wrapper's keys (``module.``-prefixed), which the resume's plain model
    does not load. It is handed ``accelerator.unwrap_model(model)`` instead (the model itself
    where nothing wraps it). The names so unwrapped."""
    if saver is None or any(argument.star for argument in call.args):
        return set()
    done = set()
    for index, argument in enumerate(call.args):
        if argument.keyword is not None:
            parameter = argument.keyword.value
        elif index < len(saver.parameters):
            parameter = saver.parameters[index]
        else:
            continue
        held = dotted(argument.value)
        if (
            parameter not in saver.saved | saver.whole
            or held is None
            or not ctx.facts.flow.is_model_name(held, call)
        ):
            continue
        unwrap(
            ctx,
            argument.value,
            call,
            f"{name}() is handed {ctx.a('unwrap_model')}({held}): it saves "
            f"{parameter}.state_dict() ({saver.where}), which the DDP wrapper would prefix "
            "with `module.`",
        )
        done.add(held)
    return done


#: Words naming a function that writes what it is handed: save_checkpoint, write_state,
#: checkpoint(model, path); and words that make it a read (load_checkpoint, restore_weights,
#: resume_from_checkpoint), which every rank must run.
_WRITE_WORDS = frozenset(
    {"save", "saver", "write", "dump", "export", "store", "checkpoint", "ckpt"}
)
_READ_WORDS = frozenset({"load", "loader", "restore", "resume", "read", "get", "open", "find"})


def _named_as_a_write(function: str) -> bool:
    words = set(names.identifier_words(function))
    return bool(words & _WRITE_WORDS) and not words & _READ_WORDS


def _held_object(value: cst.BaseExpression) -> str | None:
    """``model``, ``self.model``, ``model.state_dict()``: the object an argument hands on."""
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "state_dict"
    ):
        value = value.func.value
    return dotted(value)


def _imported_from_the_project(ctx: Context, name: str) -> bool:
    """``utils.save_checkpoint`` or ``save_checkpoint`` bound by an import of a module that is
    neither the standard library nor a library the analysis knows: the project's own code."""
    imported = ctx.model.imports.bound.get(name.split(".")[0])
    if imported is None:
        return "." not in name and star_imported_from_the_project(ctx, name)
    root = imported.lstrip(".").split(".")[0]
    if imported.startswith("."):
        return True
    if ctx.model.imports.resolve(name) in names.FILE_WRITERS:
        return False  # a writer the side-effect analysis knows: guarded where it is
    return root not in sys.stdlib_module_names and root not in names.KNOWN_LIBRARIES


def _save_on_the_main_process(
    ctx: Context, line_statement: cst.CSTNode, call: cst.Call, barriers: list[cst.CSTNode]
) -> None:
    """``torch.save(...)`` where ``self.accelerator`` cannot be reached and no instance is
    named: kept as it is, under ``if PartialState().is_main_process:``, after the same
    barriers (the process state has both, not ``save``)."""
    state = ctx.process_state()
    ctx.plan.add(
        rewrites.main_process_only(line_statement, state),
        *(rewrites.barrier(anchor, state) for anchor in barriers),
        line=ctx.line(call),
        text=f"torch.save on the main process only (if {state}.is_main_process:)"
        + _waits_first(ctx, call, barriers, state),
        anywhere=True,
    )


def _save_through_instance(
    ctx: Context, call: cst.Call, instance: str, barriers: list[cst.CSTNode]
) -> None:
    """``torch.save(trainer.model.state_dict(), path)`` outside the class that owns
    ``self.accelerator`` (a callback handed the trainer, ``main()`` after ``trainer.fit()``):
    saved through ``trainer.accelerator``, the model unwrapped (its state gathered where every
    rank saves: `saved_states`), when every barrier before it is in the same function (where
    ``trainer`` is the same name); else left for review."""
    function = ctx.facts.placement.enclosing_function(call)
    if any(ctx.facts.placement.enclosing_function(b) is not function for b in barriers):
        ctx.plan.review(
            ctx.line(call),
            f"left as is: the barrier before this save would be outside the reach of {instance}",
        )
        return
    acc = f"{instance}.accelerator"
    saved = call.args[0].value if call.args else None
    state = None
    if (
        isinstance(saved, cst.Call)
        and isinstance(saved.func, cst.Attribute)
        and saved.func.attr.value == "state_dict"
        and not saved.args
    ):
        state, saved = saved, saved.func.value
    owned = dotted(saved) if isinstance(saved, cst.Attribute) else None
    if owned is not None and owned.startswith(f"{instance}.") and owned.count(".") == 1:
        attribute = "self." + owned.split(".", 1)[1]
        prepared = attribute in ctx.plan.prepared and ctx.facts.flow.is_model_name(
            attribute, ctx.scope
        )
        # ``trainer.accelerator.get_state_dict(trainer.model)`` where every rank saves
        gathered = (
            prepared and state is not None and saved_states.gather_or_review(ctx, saved, state, acc)  # type: ignore[arg-type]
        )
        if prepared and not gathered:
            ctx.plan.add(
                rewrites.unwrap(saved, acc),
                line=ctx.line(call),
                text=f"saves {acc}.unwrap_model({owned}), not the DDP wrapper",
                anywhere=True,
            )
    ctx.plan.add(
        *rewrites.save(call, acc, barriers),
        line=ctx.line(call),
        text=f"torch.save -> {acc}.save (main process only)"
        + _waits_first(ctx, call, barriers, acc),
        anywhere=True,
    )


def _review_no_barrier(ctx: Context, call: cst.Call, parted: cst.If | cst.ExceptHandler) -> None:
    """The save runs on the main process with no barrier before it, as some ranks may never
    reach the place the barrier would go: say what that leaves to the user."""
    ctx.plan.review(
        ctx.line(call),
        f"this save runs on the main process with no barrier before it{_where_parted(ctx, parted)}"
        ": a wait_for_everyone() there would wait for ranks that never come (a hang); "
        "before any rank reads this file back, call it where every rank runs it (after the "
        "branch, or before the call that every rank makes)",
    )


def _where_parted(ctx: Context, parted: cst.If | cst.ExceptHandler) -> str:
    if isinstance(parted, cst.ExceptHandler):
        return f": the `except` block (line {ctx.line(parted)}) may be entered by one rank alone"
    return (
        f": it is reached under or after `{ctx.code(parted.test)}` (line {ctx.line(parted)}), "
        "which the ranks may decide differently"
    )


def _no_barrier_in(ctx: Context, parted: cst.If | cst.ExceptHandler | None) -> str:
    """A save some ranks may never get to gets no barrier: the others would wait there for
    them. In an ``except`` block (here or around a call of its function) the rank that raised
    may enter it alone; after ``if <this rank's value>: continue`` (or ``return``) a rank
    may leave alone."""
    if parted is None:
        return ""
    if isinstance(parted, cst.ExceptHandler):
        return (
            f", with no barrier before it: the `except` block (line {ctx.line(parted)}) may be "
            "entered by one rank alone"
        )
    return (
        f", with no barrier before it: after `{ctx.code(parted.test)}` (line "
        f"{ctx.line(parted)}) a rank may leave alone"
    )


def _waits_first(ctx: Context, call: cst.Call, barriers: list[cst.CSTNode], acc: str) -> str:
    """The barrier the save needs, where it is not on the save's own line: before a branch the
    ranks may disagree on (``if val_loss < best:``), or at the calls of the method that saves.
    The summary says where, as the diff shows it far from the save."""
    elsewhere = sorted({ctx.line(b) for b in barriers} - {ctx.line(call)})
    if not elsewhere:
        return ""
    lines = ", ".join(map(str, elsewhere))
    where = f"line{'s' if len(elsewhere) > 1 else ''} {lines}"
    return f", after {acc}.wait_for_everyone() before {where}, which every rank reaches"


def _unwrap_saved_model(ctx: Context, call: cst.Call, instance: str | None) -> None:
    """``torch.save(model, path)`` of a prepared model pickles the DDP wrapper otherwise; so
    does ``torch.save(model.to("cpu"), path)``, whose move then moves the model itself (as the
    original's does) instead of leaving the wrapper on one fixed device, and a checkpoint dict
    that keeps the model whole (``state = {'net': net, 'acc': acc}``, then ``torch.save(state,
    path)``, as mixup-cifar10 does): the wrapper's hooks do not pickle, and a resumed run would
    load a wrapper. Outside the class that owns ``self.accelerator``, ``torch.save(
    trainer.model, path)`` is unwrapped through the instance (`_save_through_instance`)."""
    for model in saved_whole_objects(ctx.model, call):
        if not ctx.facts.flow.is_model_name(dotted(model), call):
            continue
        if instance is not None and _saved_through(call, model, instance):
            continue
        unwrap(
            ctx, model, call, f"saves {ctx.a('unwrap_model')}({dotted(model)}), not the DDP wrapper"
        )


def _saved_through(call: cst.Call, model: cst.BaseExpression, instance: str) -> bool:
    """``model`` is the saved object itself, an attribute of ``instance``
    (``torch.save(trainer.model, path)``): `_save_through_instance` unwraps it."""
    saved = call.args[0].value if call.args else None
    name = dotted(model)
    return (
        saved is model
        and name is not None
        and name.startswith(f"{instance}.")
        and name.count(".") == 1
    )


def _unwrap_state_of_a_returned_object(ctx: Context, call: cst.Call) -> None:
    """``torch.save(model.state_dict(), path)`` where ``model`` is what a function of this file
    returned (``mse, lr, model = experiment.sweep(lrs)``, the best of models each prepared in
    ``run()``) and the analysis cannot tell what it is: if it is a prepared model, on several
    ranks it is the DDP wrapper, whose state dict prefixes every key with ``module.`` and loads
    into no plain model. ``unwrap_model`` hands anything else back as it is, so the state dict
    is taken from it: the plain model's keys either way. Where no accelerator can be reached,
    the save stays as it is, with a review line."""
    saved = call.args[0].value if call.args else None
    if not (
        isinstance(saved, cst.Call)
        and isinstance(saved.func, cst.Attribute)
        and saved.func.attr.value == "state_dict"
        and not saved.args
    ):
        return
    owner = saved.func.value
    name = dotted(owner)
    if name is None or ctx.facts.flow.kind_of(name, call) is not None:
        return
    if not any(b.name in ctx.plan.prepared for b in ctx.model.of_kind(Kind.MODEL)):
        return
    if _instance_state_saved(ctx, call, name):
        return
    # ``runner = Runner()`` calls ``Runner.__init__``, but what it binds is the instance
    functions = [f for f in returned_by(ctx, name, call) if f.name.value != "__init__"]
    if not functions:
        return
    why = f"{name} is what {functions[0].name.value}() returned, maybe the prepared model"
    outside = ctx.instance_outside_class(call)
    if outside is not None:
        acc = f"{outside}.accelerator"
        ctx.plan.add(
            rewrites.unwrap(owner, acc),
            line=ctx.line(call),
            text=f"saves {acc}.unwrap_model({name}) ({why})",
            anywhere=True,
        )
    elif ctx.plan.reaches(call):
        unwrap(ctx, owner, call, f"saves {ctx.a('unwrap_model')}({name}) ({why})")
    else:
        ctx.plan.review(
            ctx.line(call),
            f"{why}: on several ranks the DDP wrapper, whose state dict prefixes every key "
            f"with 'module.'; left as it is: save the unwrapped model's state dict",
        )


def _instance_state_saved(ctx: Context, call: cst.Call, name: str) -> bool:
    """``torch.save(runner.state_dict(), path)`` where ``runner = Runner()`` is an instance of
    a class of this file that is not a model: its ``state_dict()`` is the class's own method,
    and unwrapping the instance changes nothing. When that method takes the state dict of
    something it holds (``{"model": self.model.state_dict(), ...}``) through a name the
    conversion does not follow to the prepared model (a ``@property``), a review line says
    that on several ranks the keys carry the DDP wrapper's ``module.``. True when ``name``
    is such an instance (the save is then left to the other rewrites)."""
    calls = ctx.facts.calls
    made = calls.instance_class(name, call)
    owner = calls.classes.get(made or "")
    if owner is None or made in ctx.model.module_classes:
        return False
    method = calls.lookup(owner, "state_dict")
    states = (
        [
            node
            for node in walk(method.body)
            if isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "state_dict"
            and dotted(node.func.value) is not None
        ]
        if method is not None
        else []
    )
    held = dotted(states[0].func.value) if states else None  # type: ignore[attr-defined]
    followed = (property_alias(ctx.model, held, states[0]) or held) if states else None
    if held is not None and followed not in ctx.plan.prepared:  # a prepared one is unwrapped
        ctx.plan.review(
            ctx.line(call),
            f"{name}.state_dict() is {made}.state_dict() (line {ctx.line(method)}), which saves "
            f"{held}.state_dict(): if {held} is the prepared model, on several ranks that is "
            "the DDP wrapper's, whose keys carry 'module.' and load into no plain model (nor "
            f"into a run on another number of processes); take it from "
            f"self.accelerator.unwrap_model({held}) there, and load it the same way",
        )
    return True


def file_write_blocks(ctx: Context) -> list[cst.With]:
    """``with open(path, "w") as f:`` blocks meant to run on the main process only: every rank
    truncating and writing the same file races. Not one under a rank test already, nor a
    per-process path."""
    return [
        with_node
        for with_node in ctx.facts.placement.withs()
        if not ctx.facts.ranks.under_rank_guard(with_node)
        and not in_writing_helper(ctx, with_node)
        and any(
            side_effects.opens_for_writing(item.item)
            and not ctx.facts.shared_files.kept_on_every_rank(item.item)  # type: ignore[arg-type]
            for item in with_node.items
        )
    ]


def in_writing_helper(ctx: Context, node: cst.CSTNode) -> bool:
    """``node`` is in a function whose calls are guarded as writes (`writing_helpers`): it runs
    on the main process only, as it is."""
    helpers = ctx.facts.writing_helpers
    return bool(helpers) and any(a in helpers for a in ctx.model.ancestors(node))


def result_read_after(ctx: Context, block: cst.With) -> str | None:
    """A name ``block`` computes (``correct += ...`` beside the writes) that its scope reads
    outside it: under ``if accelerator.is_main_process:`` the other ranks would read it never
    updated (a count of 0, then a division by it). None when the block only writes."""
    bound: set[str] = set()
    for node in walk(block.body):
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
            bound |= target_names(node.target)
    if not bound:
        return None
    targets = {
        id(name)
        for node in walk(ctx.model.scope_of(block))
        if isinstance(node, (cst.AssignTarget, cst.For, cst.AsName))
        for name in walk(node.target if not isinstance(node, cst.AsName) else node.name)
    }
    for node in walk(ctx.model.scope_of(block)):
        if (
            isinstance(node, cst.Name)
            and node.value in bound
            and id(node) not in targets
            and not ctx.facts.placement.inside(node, block)
            and _may_read_from(ctx, node, block)
        ):
            return node.value
    return None


def _may_read_from(ctx: Context, read: cst.Name, block: cst.With) -> bool:
    """``read`` may see the value ``block`` bound: unless the name is bound again, on every
    path, between the block and the read (the next ``with open(log, 'a') as f: writer =
    csv.writer(f)`` of a per-epoch log makes its own writer, in the loop's next turn too)."""
    model = ctx.model
    rebound = last_binding(model, read.value, read)
    if rebound is None or ctx.facts.placement.inside(rebound, block):
        return True
    if not runs_before(model, rebound, read):
        return True
    if model.order(read) > model.order(block):
        return model.order(rebound) < model.order(block)
    loops = [
        a
        for a in model.ancestors(read)
        if isinstance(a, (cst.For, cst.While)) and ctx.facts.placement.inside(block, a)
    ]
    return any(model.order(rebound) < model.order(loop) for loop in loops)


def _plan_file_writes(ctx: Context) -> list[cst.With]:
    """The blocks of `file_write_blocks` under ``if accelerator.is_main_process:``, the
    prepared models they run called unwrapped (a DDP forward is a collective: from one rank it
    hangs). A block that trains, gathers or iterates a loader every rank shards stays on every
    rank, for review. A bare ``open`` for writing is left for review."""
    guarded = []
    reviewed = []
    for with_node in file_write_blocks(ctx):
        kept = result_read_after(ctx, with_node)
        stays = _must_run_everywhere(ctx, with_node) if kept is None else None
        if (kept is not None or stays is not None) and _opened_on_main_only(ctx, with_node):
            ctx.opened_on_main.append(with_node)
            continue
        if kept is not None:
            ctx.plan.review(
                ctx.line(with_node),
                f"a file is written on every rank, and this block also computes {kept}, which "
                f"is read after it: guarded whole with `if {ctx.a('is_main_process')}:` the "
                f"other ranks would read {kept} never updated; guard the writes alone, or "
                "write the file after the block from what it computed",
            )
            reviewed.append(with_node)
            continue
        if stays is not None:
            ctx.plan.review(
                ctx.line(with_node),
                f"a file is written on every rank, and this block {stays}: guarded whole with "
                f"`if {ctx.a('is_main_process')}:` the other ranks would skip that and hang, or "
                "the file would hold one rank's shard; open and write the file under that test "
                "around the writes alone (values that differ between ranks gathered first with "
                f"{ctx.a('gather_for_metrics')})",
            )
            reviewed.append(with_node)
            continue
        if not main_process.guard(
            ctx,
            with_node,
            f"file written on the main process only (if {ctx.a('is_main_process')}:)",
            "a file is written on every rank",
        ):
            reviewed.append(with_node)
            continue
        guarded.append(with_node)
    ctx.written_everywhere += reviewed
    for call in ctx.model.calls:
        inside_guarded = any(
            ctx.facts.placement.inside(call, block) for block in (*guarded, *reviewed)
        )
        if (
            side_effects.opens_for_writing(call)
            and not inside_guarded
            and not ctx.facts.shared_files.kept_on_every_rank(call)
            and not ctx.facts.ranks.under_rank_guard(call)
            and not _opened_to_read(ctx, call)
            and not in_writing_helper(ctx, call)
            and not _opened_on_main_only(ctx, call)
        ):
            ctx.review_at(
                call,
                "a file is written on every rank: guard it with `if accelerator.is_main_process:`",
            )
    return guarded


def _opened_on_main_only(ctx: Context, opened: cst.With | cst.Call) -> bool:
    """A file the script opens itself around code every rank must run (``with open(log, "w")
    as log:`` around the training loop, or ``log = open(log_path, "a")`` written to each epoch):
    every rank runs that code as before, and each rank but the main process opens
    ``os.devnull`` instead, so the file is written once, with the main process's lines (those
    ``accelerator.print`` shows). Planned, it is True. Not a mode that also reads (``"w+"``: the
    other ranks would read back nothing), nor a file something below reads back (the other
    ranks would read it while the main process writes it), nor where ``os`` names something
    else."""
    devnull = _devnull(ctx)
    if devnull is None or not can_open_on_main_only(ctx, opened):
        return False
    for call in _opened_for_writing(opened):
        path = call.args[0].value
        # a callback's method handed the trainer: ``trainer.accelerator``; the process state
        # where no accelerator is reached (`accelerator_at`)
        acc = ctx.accelerator_at(call)
        shown = ctx.code(path)
        ctx.plan.replace(
            path,
            Swap(f"{shown} if {acc}.is_main_process else {devnull}"),
            ctx.line(call),
            f"{shown} opened on the main process only, {devnull} on the others (the code "
            "around its writes runs on every rank)",
            anywhere=acc != ctx.acc,
        )
        if acc == ctx.acc:
            ctx.need(call)
    if (
        devnull == "os.devnull"
        and "os" not in ctx.model.imports.bound
        and "import os" not in ctx.extra_imports
    ):
        ctx.extra_imports.append("import os")
    return True


def _devnull(ctx: Context) -> str | None:
    """How the script spells ``os.devnull``: ``os`` imported under its name or another; None
    when ``os`` names something else."""
    bound = ctx.model.imports.bound
    if bound.get("os", "os") == "os":
        return "os.devnull"
    alias = next((local for local, target in bound.items() if target == "os"), None)
    return None if alias is None else f"{alias}.devnull"


#: What reading a file object does: nothing of it writes.
_READS = {"seek", "read", "readline", "readlines", "tell", "close", "fileno"}


def _opened_to_read(ctx: Context, call: cst.Call) -> bool:
    """``f = open(log, "a+")`` then only ``f.seek(0)``, ``f.readlines()``, ``f.close()`` (a
    resumed run counting the epochs its log holds): an append mode that no write follows, so
    every rank at most creates the same empty file, and each needs what it reads. Guarded on
    the main process, the other ranks would have no count. Uses are those before the name is
    bound again in its scope."""
    if side_effects.opens_truncating(call) or side_effects.opens_exclusively(call):
        return False
    assign = ctx.model.parent(call)
    if not (
        isinstance(assign, cst.Assign)
        and len(assigned_targets(assign)) == 1
        and isinstance(assigned_targets(assign)[0], cst.Name)
    ):
        return False
    name = assigned_targets(assign)[0].value
    scope = ctx.model.scope_of(assign)
    start = ctx.model.order(assign)
    rebound = [
        ctx.model.order(a)
        for a in ctx.model.index.assignments_to(name)
        if ctx.model.scope_of(a) is scope and ctx.model.order(a) > start
    ]
    end = min(rebound, default=None)
    for node in walk(scope):
        if (
            not isinstance(node, cst.Name)
            or node.value != name
            or node is assigned_targets(assign)[0]
        ):
            continue
        at = ctx.model.order(node)
        if at < start or (end is not None and at > end):
            continue
        parent = ctx.model.parent(node)
        if not (
            isinstance(parent, cst.Attribute)
            and parent.value is node
            and parent.attr.value in _READS
        ):
            return False
    return True


def can_open_on_main_only(ctx: Context, opened: cst.With | cst.Call) -> bool:
    """`_opened_on_main_only` can give every rank but the main process ``os.devnull`` for the
    file ``opened`` writes (asked before the plan is made: a loop inside it that gathers keeps
    its loader prepared only where the block can then run on every rank)."""
    calls = _opened_for_writing(opened)
    if _devnull(ctx) is None or not calls:
        return False
    for call in calls:
        mode = side_effects.open_mode(call)
        if (
            "+" in mode
            or "x" in mode  # ``open(os.devnull, "x")`` fails: the sink exists
            or not call.args
            or call.args[0].keyword is not None
            or ctx.facts.shared_files.read_back_below(call) is not None
        ):
            return False
    return True


def _opened_for_writing(opened: cst.With | cst.Call) -> list[cst.Call]:
    if not isinstance(opened, cst.With):
        return [opened]
    return [
        item.item
        for item in opened.items
        if isinstance(item.item, cst.Call) and side_effects.opens_for_writing(item.item)
    ]


def _must_run_everywhere(ctx: Context, block: cst.With) -> str | None:
    """What in ``block`` every rank must run, in words, or None."""
    synchronising = ctx.facts.collective_reach.synchronising_in(block)
    if synchronising is not None:
        return f"runs {ctx.code(synchronising.func)}(...) (line {ctx.line(synchronising)})"
    prepared = set(ctx.plan.prepared)
    for loop in ctx.model.loops:
        if not ctx.facts.placement.inside(loop.node, block) or not ctx.facts.flow.reads_loader(
            loop
        ):
            continue
        origins = ctx.facts.flow.origins(loop.iterable, loop.node)
        if origins & prepared or not origins:
            return f"iterates {loop.iterable}, which every rank shards (line {ctx.line(loop.node)})"
    return None
