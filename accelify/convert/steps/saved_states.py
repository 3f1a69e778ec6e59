"""A prepared model's state saved by the script: ``torch.save(model.state_dict(), path)``, or a
checkpoint dict holding it, becomes ``accelerator.get_state_dict(model)``.

``accelerator.save`` writes on the main process alone. Under DDP the unwrapped model's own
``state_dict()`` is the whole model on every rank, but under FSDP it holds DTensor shards and
under DeepSpeed ZeRO-3 empty partitions: the file would hold rank 0's part only, and a reload
would load rank 0's rows on every rank (a test accuracy of 37/77 for 70/77). ``get_state_dict``
(Hugging Face Accelerate's name and meaning) gathers the whole tensors for the main process
under those engines and is the unwrapped state dict under DDP; it is a collective there, so it
is emitted only where every rank reaches it: no rank test or condition the ranks may decide
differently around it, in its function or around the calls of that function (a test of a metric
the conversion gathers, ``if acc > best:``, is decided alike). Elsewhere the unwrapped state
dict stays, with a review line saying what to write. An optimizer's state is split by those
engines too, and is gathered the same way where the same holds
(`gather_or_review_optimizer_states`).
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps import collective_stops
from accelify.convert.steps.context import Context
from accelify.edits.rewrites import gathered_state

#: Where a review line says what a sharding engine does to a state dict kept as it is.
_SHARDED = "under --backend fsdp or DeepSpeed ZeRO-3"


def saved_state(ctx: Context, attribute: cst.Attribute) -> cst.Call | None:
    """The ``model.state_dict()`` call that ``attribute`` heads, when a save writes its result."""
    call = ctx.model.parent(attribute)
    if isinstance(call, cst.Call) and call.func is attribute and id(call) in ctx.facts.saved_states:
        return call
    return None


def gather_or_review(
    ctx: Context, owner: cst.Name | cst.Attribute, state: cst.Call, through: str | None = None
) -> bool:
    """``model.state_dict()`` saved -> ``accelerator.get_state_dict(model)`` where every rank
    reaches it (True). Elsewhere False, with a review line: the caller unwraps it as before.
    ``through``: the accelerator of an instance outside its class (``trainer.accelerator``
    for ``torch.save(trainer.model.state_dict(), path)`` in ``main()``)."""
    name = dotted(owner)
    save = ctx.facts.saved_states[id(state)][1]
    if ctx.facts.shared_files.kept_on_every_rank(save):
        return False  # each rank saves its own shards and reads them back itself
    acc = through or ctx.acc
    kept = _read_besides_the_save(ctx, state, save)
    if kept is not None:
        ctx.plan.review(
            ctx.line(state),
            f"{name}'s state is saved through {kept[0]}, which line {kept[1]} also reads: kept "
            f"as {acc}.unwrap_model({name}).state_dict(), as {acc}.get_state_dict({name}) "
            f"would hand the other ranks an empty dict {_SHARDED}; there the kept one holds "
            "this rank's shard only, which accelerator.save refuses: for those engines save "
            f"`{acc}.get_state_dict({name})` itself, on every rank",
        )
        return False
    apart = _where_ranks_part(ctx, state, save, instance=through is not None)
    if apart is None:
        planned = ctx.plan.replace(
            state,
            gathered_state(acc),
            ctx.line(state),
            f"{name}.state_dict() -> {acc}.get_state_dict({name}): the whole model's state "
            "for the main process to save (gathered from every rank under FSDP and ZeRO-3)",
            anywhere=through is not None,
        )
        if planned and through is None:
            ctx.need(state)
        return bool(planned)
    ctx.plan.review(
        ctx.line(state),
        f"{name}'s state is saved {apart[0]}: kept as {acc}.unwrap_model({name}).state_dict(), "
        f"which {_SHARDED} holds this rank's shard only (accelerator.save refuses it there); "
        f"for those engines write `state = {acc}.get_state_dict({name})` where every rank "
        f"runs it{apart[1]}, and save `state`",
    )
    return False


def gather_or_review_optimizer_states(ctx: Context) -> None:
    """A prepared optimizer's ``state_dict()`` in what a save writes (``{"model": ...,
    "optimizer": optimizer.state_dict(), "epoch": e}``): FSDP and DeepSpeed ZeRO split the
    optimizer's state across the ranks, so the main process alone holds one rank's part, which
    cannot resume a run (accelify's ``accelerator.save`` refuses it). Where every rank reaches
    the save, as for a model's state (`gather_or_review`), it becomes
    ``accelerator.get_state_dict(optimizer)``: the whole state in torch's one-process format,
    the file's format before conversion, which the prepared optimizer's ``load_state_dict``
    takes back on every engine (after ``prepare``, or before it). Hugging Face Accelerate's
    ``get_state_dict`` takes models only: under ``--target accelerate``, and where some ranks
    may not reach the save, the call stays, with a review line saying what to write."""
    for state, save in ctx.facts.saved_states.values():
        owner = dotted(state.func.value)  # type: ignore[attr-defined]
        if (
            owner is None
            or owner not in ctx.plan.prepared
            or ctx.facts.flow.kind_of(owner, state) is not Kind.OPTIMIZER
            or not ctx.after_prepare(state, owner)
            or ctx.facts.shared_files.kept_on_every_rank(save)
        ):
            continue
        reachable = ctx.reachable_accelerator(state)
        acc = reachable or ctx.accelerator_at(state)
        if ctx.options.target == "accelerate":
            ctx.plan.review(
                ctx.line(state),
                _hf_optimizer_advice(owner, acc, optimizer_model(ctx, owner, state)),
            )
            continue
        if reachable is None:
            why = f"where no Accelerator is in reach ({acc} has no get_state_dict)"
            ctx.plan.review(ctx.line(state), _optimizer_kept(owner, "accelerator", why, ""))
            continue
        kept = _read_besides_the_save(ctx, state, save)
        if kept is not None:
            why = f"through {kept[0]}, which line {kept[1]} also reads"
            ctx.plan.review(ctx.line(state), _optimizer_kept(owner, acc, why, ""))
            continue
        instance = acc != ctx.acc
        apart = _where_ranks_part(ctx, state, save, instance=instance)
        if apart is not None:
            ctx.plan.review(ctx.line(state), _optimizer_kept(owner, acc, *apart))
            continue
        planned = ctx.plan.replace(
            state,
            gathered_state(acc),
            ctx.line(state),
            f"{owner}.state_dict() -> {acc}.get_state_dict({owner}): the optimizer's whole "
            "state, as one process saves it (gathered from every rank under FSDP and "
            "DeepSpeed ZeRO); the prepared optimizer's load_state_dict takes it back on every "
            "engine",
            anywhere=instance,
        )
        if planned and not instance:
            ctx.need(state)


def review_optimizer_loads_under_hf(ctx: Context) -> None:
    """``optimizer.load_state_dict(state)`` of a prepared optimizer, converted for Hugging Face
    Accelerate: a whole state (what one process or DDP saved) loads there only under DDP.
    Under HF's FSDP2 a load after ``prepare`` puts plain tensors beside the DTensor parameters
    and the next step fails; one before ``prepare`` is dropped silently (prepare points the
    optimizer's groups at the sharded parameters, the state stays keyed by the old ones).
    accelify's runtime takes it on every engine, so only ``--target accelerate`` says so."""
    if ctx.options.target != "accelerate":
        return
    for call in ctx.model.calls:
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "load_state_dict":
            continue
        owner = dotted(func.value)
        if (
            owner is None
            or owner not in ctx.plan.prepared
            or ctx.facts.flow.kind_of(owner, call) is not Kind.OPTIMIZER
        ):
            continue
        when = (
            "the next step fails (mixed torch.Tensor and DTensor)"
            if ctx.after_prepare(call, owner)
            else "prepare drops it silently (the state stays keyed by the parameters FSDP replaces)"
        )
        model = optimizer_model(ctx, owner, call)
        ctx.plan.review(
            ctx.line(call),
            f"{owner}.load_state_dict(...) loads a whole optimizer state: under Hugging Face "
            f"Accelerate's FSDP2 {when}, and under its FSDP1 (fsdp_version 1, its default) the "
            "optimizer holds FSDP's flattened parameters, which a whole state does not fit; "
            "under either, after prepare, load it with torch's "
            f"set_optimizer_state_dict({model}, {owner}, state, options=StateDictOptions("
            "full_state_dict=True)) on every rank, and under DeepSpeed (whose optimizer state "
            "has the engine's own format) resume with accelerator.save_state/load_state",
        )


def optimizer_model(ctx: Context, optimizer: str, at: cst.CSTNode) -> str:
    """The model whose parameters ``optimizer`` is built from (`parameter_owners`), as ``at``
    names it: torch's get/set_optimizer_state_dict take that model; ``<your model>`` when
    the optimizer is built from several, none the file shows, or one ``at`` cannot name."""
    owners = {
        owner
        for binding in ctx.model.of_kind(Kind.OPTIMIZER)
        if binding.name == optimizer
        for owner in parameter_owners(binding)
    }
    if len(owners) == 1:
        (owner,) = owners
        if ctx.facts.flow.kind_of(owner, at) is Kind.MODEL:
            return owner
    return "<your model>"


def _optimizer_kept(owner: str, acc: str, why: str, where: str) -> str:
    return (
        f"{owner}'s state is saved {why}: kept as {owner}.state_dict(), which under --backend "
        "fsdp or deepspeed holds this rank's part only (accelerator.save refuses it there); "
        f"for those engines write `state = {acc}.get_state_dict({owner})` where every rank "
        f"runs it{where}, and save `state` (or save and load the whole training state with "
        f"{acc}.save_state(folder) and {acc}.load_state(folder), on every rank)"
    )


def _hf_optimizer_advice(owner: str, acc: str, model: str) -> str:
    """Hugging Face Accelerate has no whole optimizer state of its own: what to write there
    (torch's get/set_optimizer_state_dict take FSDP1's and FSDP2's models alike)."""
    return (
        f"{owner}.state_dict() is saved: under Hugging Face Accelerate's FSDP (1 or 2) or "
        "DeepSpeed it holds this rank's part only, and HF's get_state_dict takes models only; "
        f"to resume there save and load the whole training state with {acc}.save_state(folder) "
        f"and {acc}.load_state(folder) on every rank, or, under FSDP, torch's "
        f"get_optimizer_state_dict({model}, {owner}, options=StateDictOptions("
        "full_state_dict=True, cpu_offload=True)) on every rank and set_optimizer_state_dict "
        "to load it (torch.distributed.checkpoint.state_dict)"
    )


def _read_besides_the_save(ctx: Context, state: cst.Call, save: cst.Call) -> tuple[str, int] | None:
    """``best = model.state_dict()`` (or a checkpoint dict holding it) saved by name, and that
    name read elsewhere too (``model.load_state_dict(best)`` restoring the weights in memory):
    the name and the line of such a read. None when the state is built in the save's own call,
    or the name is only bound, stored into and saved."""
    saved = save.args[0].value
    if ctx.facts.placement.inside(state, save) or not isinstance(saved, cst.Name):
        return None
    scope = ctx.model.scope_of(save)
    for node in walk(scope):
        if not isinstance(node, cst.Name) or node.value != saved.value or node is saved:
            continue
        if _bound_or_stored_into(ctx, node):
            continue  # a read in a nested function counts too (``def restore(): ...(best)``)
        if _printed(ctx, node):
            continue  # ``print(sorted(state["model"]))``: shown by the main process only
        return saved.value, ctx.line(node)
    return None


def _printed(ctx: Context, node: cst.CSTNode) -> bool:
    """``node`` is inside a ``print(...)`` or ``accelerator.print(...)``: it is only shown."""
    return any(
        isinstance(a, cst.Call)
        and isinstance(a.func, (cst.Name, cst.Attribute))
        and (dotted(a.func) or "").rsplit(".", 1)[-1] == "print"
        for a in ctx.model.ancestors(node)
    )


def _bound_or_stored_into(ctx: Context, name: cst.Name) -> bool:
    """``name = ...`` or ``name[key] = ...``: not a read of what ``name`` holds."""
    parent = ctx.model.parent(name)
    if isinstance(parent, cst.Subscript) and parent.value is name:
        parent = ctx.model.parent(parent)
    return isinstance(parent, cst.AssignTarget)


def _where_ranks_part(
    ctx: Context, state: cst.Call, save: cst.Call, instance: bool
) -> tuple[str, str] | None:
    """Why some ranks may not reach ``state`` once converted, and where every rank would (both
    in words); None when every rank does (`get_state_dict` is a collective under the sharding
    engines)."""
    if not instance and not ctx.plan.reaches(save):
        return f"where {ctx.acc} is out of reach (on the main process only)", ""
    if not instance and ctx.instance_outside_class(save) is not None:
        return "outside the class that holds the accelerator", ""
    if ctx.facts.ranks.under_rank_guard(state):
        return "under a rank test", ", before that test"

    decided_alike = collective_stops.decided_alike(ctx)
    # a method's calls from other classes too: ``get_state_dict`` is a collective there
    parted = ctx.facts.shared_files.parting_before(state, decided_alike=decided_alike, outside=True)
    if isinstance(parted, cst.ExceptHandler):
        return (
            f"in an `except` block (line {ctx.line(parted)}), which some ranks may enter",
            ", before the `try`",
        )
    if parted is not None:
        return (
            f"after `{ctx.code(parted.test)}` (line {ctx.line(parted)}), where this rank may "
            "leave alone",
            ", before that test",
        )
    branch = ctx.facts.shared_files.divergent_around(
        state, decided_alike=decided_alike, outside=True
    )
    if branch is not None:
        return (
            f"under `{ctx.code(branch.test)}` (line {ctx.line(branch)}), which the ranks may "
            "decide differently",
            ", before that test",
        )
    return None
