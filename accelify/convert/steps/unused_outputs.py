"""A model whose outputs some steps do not use (``validity, _, _ = discriminator(x)``: a GAN's
auxiliary heads) leaves parameters without gradients in those steps, and DDP stops with
"Expected to have finished reduction in the prior iteration". So does a model class whose
forward never computes with some of its parameters (``self.dummy_param`` read for its
``.device``, a layer built and never called), uses them only under ``torch.no_grad()`` (a
frozen backbone) or only in some calls (``if with_aux: aux = self.aux_head(h)``), and a
prepared model whose parameters the script switches off while it runs (``p.requires_grad =
False`` for a first epoch). The Accelerator gets the DDP option that lets such parameters go:
``find_unused_parameters=True``."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.idle_members import (
    OutputMembers,
    idle_members,
    members_behind_outputs,
    members_only_dropped,
    requires_grad_writes,
    sets_every_parameter,
    sometimes_idle_members,
)
from accelify.analysis.objects import instance_class, received_classes
from accelify.analysis.outside_forward import in_training_step
from accelify.analysis.script_model import Binding, Kind, Loop
from accelify.analysis.syntax import dotted, strip_self_methods
from accelify.convert.steps.context import Context

HANDLER = "DistributedDataParallelKwargs"


def run(ctx: Context) -> None:
    if not _dropped_outputs(ctx) and not _switched_parameters(ctx):
        _idle_members(ctx)


def _expect_unused(ctx: Context) -> None:
    ctx.constructor.setdefault("kwargs_handlers", f"[{HANDLER}(find_unused_parameters=True)]")
    if HANDLER not in ctx.uses:
        ctx.uses.append(HANDLER)


def _idle_members(ctx: Context) -> None:
    for binding in ctx.model.of_kind(Kind.MODEL):
        if binding.name not in ctx.plan.prepared:
            continue
        made_by = instance_class(ctx.model, binding.name, binding.assign)
        classes = [made_by] if made_by is not None else sorted(received_classes(ctx.model, binding))
        for made_by in classes:
            if _expects_idle_members(ctx, binding, made_by):
                return


def _expects_idle_members(ctx: Context, binding: Binding, made_by: str) -> bool:
    idle = idle_members(ctx.model, made_by)
    if idle:
        members = ", ".join(f"self.{name} (line {ctx.line(node)})" for name, node in idle)
        why = f"{made_by}'s forward computes no gradient for {members}"
    else:
        idle = sometimes_idle_members(ctx.model, made_by)
        if not idle:
            return False
        members = ", ".join(f"self.{name} (line {ctx.line(node)})" for name, node in idle)
        why = (
            f"{made_by}'s forward computes with {members} only in some calls (under a branch "
            "or after an early return)"
        )
    calls = _forwards_of_one_step(ctx, binding.name) if not idle_members(ctx.model, made_by) else []
    if calls:
        _expect_a_static_graph(ctx, binding, why, calls)
        return True
    _expect_unused(ctx)
    ctx.plan.change(
        ctx.line(binding.assign),
        f"{why}: DDP told to expect parameters without gradients (find_unused_parameters=True)",
    )
    return True


def _expect_a_static_graph(ctx: Context, binding: Binding, why: str, calls: list[cst.Call]) -> None:
    """The step calls the model more than once before its backward (a multi-task step:
    ``model(xa, "a")`` and ``model(xb, "b")``). Under ``find_unused_parameters=True`` DDP marks
    what one call leaves unused ready at once, then the other call's gradient marks it again:
    "Expected to mark a variable ready only once". Told the graph is static, DDP learns from
    the first step which parameters each step uses, and the steps here use the same ones when
    the calls pass the same constants every step; other arguments get a review line. DDP
    refuses a static graph under ``no_sync`` (accumulated steps): there no option is set, and
    a review line says every parameter must then get a gradient in each step."""
    at = sorted({ctx.line(call) for call in calls})
    lines = f"line{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}"
    step = f"{why}, and one training step calls {binding.name} {len(calls)} times ({lines})"
    if any(_accumulates(ctx, loop) for loop in ctx.model.loops):
        ctx.plan.review(
            ctx.line(binding.assign),
            f"{step} before its backward while gradients are accumulated: DDP fails there under "
            "find_unused_parameters=True (a parameter one call leaves unused gets its gradient "
            "from another) and under static_graph=True (refused with no_sync); left without "
            "either, which holds when the calls together use every parameter in each step",
        )
        return
    ctx.constructor.setdefault("kwargs_handlers", f"[{HANDLER}(static_graph=True)]")
    if HANDLER not in ctx.uses:
        ctx.uses.append(HANDLER)
    ctx.plan.change(
        ctx.line(binding.assign),
        f"{step} before its backward: find_unused_parameters=True would stop DDP there (a "
        "parameter one call leaves unused gets its gradient from another); DDP told the step "
        "uses the same parameters every time (static_graph=True)",
    )
    varying = next((call for call in calls if not _constant_options(call)), None)
    if varying is not None:
        ctx.plan.review(
            ctx.line(varying),
            f"{binding.name} is called here with arguments that may change between steps: "
            "static_graph=True needs every step to use the same parameters (DDP stops when a "
            "later step uses others); if they change, call the model once per backward and pass "
            f"{HANDLER}(find_unused_parameters=True) instead",
        )


def _accumulates(ctx: Context, loop: Loop) -> bool:
    """The conversion turns ``loop``'s hand-written accumulation into ``accelerator.accumulate``
    (`steps/accumulation.py`), whose steps between updates run under ``no_sync``."""
    found = ctx.facts.accumulation_in(loop)
    return found is not None and found.unaccounted is None


def _constant_options(call: cst.Call) -> bool:
    """Every argument after the first positional one (the input) is a literal constant
    (``"a"``, ``2``, ``True``): the branch the forward takes is the same at every step."""
    for arg in call.args[1:]:
        value = arg.value
        if isinstance(value, (cst.SimpleString, cst.Integer, cst.Float)):
            continue
        if isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
            continue
        return False
    return True


def _forwards_of_one_step(ctx: Context, name: str) -> list[cst.Call]:
    """Two or more forward calls of ``name`` in the innermost loop (or function) that also
    runs its backward, outside any evaluation: calls of one training step."""
    steps: dict[int, list[cst.Call]] = {}
    for call in ctx.model.calls:
        if dotted(call.func) != name or not ctx.facts.flow.is_forward(call):
            continue
        if not in_training_step(ctx.model, ctx.facts.placement, call) or any(
            ctx.facts.placement.inside(call, evaluation.loop.node)
            for evaluation in ctx.facts.evaluations
        ):
            continue
        steps.setdefault(id(_step_of(ctx, call)), []).append(call)
    backward_steps = {id(_step_of(ctx, backward)) for backward in ctx.model.backward_calls}
    for key, calls in steps.items():
        if key not in backward_steps:
            continue
        together = [
            call
            for call in calls
            if any(other is not call and not _other_arms(ctx, call, other) for other in calls)
        ]
        if len(together) > 1:  # not ``if aux: model(x, True) else: model(x)``: one per step
            return together
    return []


def _other_arms(ctx: Context, one: cst.CSTNode, other: cst.CSTNode) -> bool:
    """``one`` and ``other`` sit in different arms of one ``if``/``else`` (or conditional
    expression): a step runs one of them, in a loop too."""
    arms: dict[int, cst.CSTNode] = {}
    child = one
    for ancestor in ctx.model.ancestors(one):
        if isinstance(ancestor, (cst.If, cst.IfExp)) and child is not ancestor.test:
            arms[id(ancestor)] = child
        child = ancestor
    child = other
    for ancestor in ctx.model.ancestors(other):
        arm = arms.get(id(ancestor))
        if arm is not None and child is not ancestor.test:
            return arm is not child
        child = ancestor
    return False


def _step_of(ctx: Context, node: cst.CSTNode) -> cst.CSTNode | None:
    """The innermost loop or function around ``node``."""
    parent = ctx.model.parent(node)
    while parent is not None and not isinstance(parent, (cst.For, cst.While, cst.FunctionDef)):
        parent = ctx.model.parent(parent)
    return parent


def _dropped_outputs(ctx: Context) -> bool:
    for call in ctx.model.calls:
        if not ctx.facts.flow.is_forward(call):
            continue
        model = dotted(call.func)
        if (
            model not in ctx.plan.prepared
            and ctx.facts.flow.outer_name(model, call) not in ctx.plan.prepared
        ):
            continue
        only = _dropped_members(ctx, call)
        if only == []:
            continue
        _expect_unused(ctx)
        why = (
            f"{model} drops outputs here that only {', '.join(f'self.{m}' for m in only)} compute"
            if only
            else f"{model}'s outputs are partly dropped here, and its forward does not show "
            "which layers only they need"
        )
        ctx.plan.change(
            ctx.line(call),
            f"{why}: DDP told to expect parameters without gradients (find_unused_parameters=True)",
        )
        return True
    return False


def _dropped_members(ctx: Context, call: cst.Call) -> list[str] | None:
    """What ``a, _ = model(x)`` in a training step (a backward follows in the same function)
    leaves without a gradient: the members only the dropped outputs compute
    (`idle_members.members_only_dropped`, the question ACC310 asks), an empty list where the
    kept outputs reach every layer the dropped ones do (``logits, _ = model(x)`` whose
    ``_`` is a GRU's hidden state) or nothing is dropped, None where the forward cannot be read
    (a model of a library, a helper's parameter): then DDP must be told, for a parameter that
    does go without a gradient stops it. An evaluation's forward (``_, pred = model(x)`` under
    ``no_grad``, or in a loop over a loader without a backward) runs no backward, so DDP waits
    for no gradient there."""
    parent = ctx.model.parent(call)
    if not isinstance(parent, cst.Assign) or parent.value is not call:
        return []
    if not any(_drops(target.target) for target in parent.targets):
        return []
    scope = ctx.model.scope_of(call)
    if not any(ctx.model.scope_of(backward) is scope for backward in ctx.model.backward_calls):
        return []
    if not in_training_step(ctx.model, ctx.facts.placement, call) or any(
        ctx.facts.placement.inside(call, evaluation.loop.node)
        for evaluation in ctx.facts.evaluations
    ):
        return []
    behind = _outputs_of(ctx, call)
    found: set[str] = set()
    for target in parent.targets:
        only = members_only_dropped(behind, target.target)
        if only is None:
            return None
        found.update(only[0])
    return sorted(found)


def _drops(target: cst.BaseAssignTargetExpression) -> bool:
    """``a, _, _`` or ``a, *_``: a target that drops an output."""
    return isinstance(target, (cst.Tuple, cst.List)) and any(
        isinstance(element.value, cst.Name) and element.value.value.startswith("_")
        for element in target.elements  # ``_`` of an Element, ``*_`` of a StarredElement
    )


def _outputs_of(ctx: Context, call: cst.Call) -> OutputMembers:
    """`members_behind_outputs` of the called model's class: one of this file, or one the
    file builds from a module of the project (``model = CharGRU(...)`` with ``from model import
    CharGRU``: `project.imported_output_members`); None for any other."""
    name = dotted(call.func)
    if name is None:
        return None
    made = instance_class(ctx.model, name, call)
    if made is not None:
        return members_behind_outputs(ctx.model, made, call)
    built = {
        dotted(core.func)
        for assign in ctx.model.index.assignments_to(name)
        if isinstance(core := strip_self_methods(assign.value), cst.Call)
    }
    if len(built) != 1:
        return None
    return ctx.imported_output_members.get(next(iter(built)) or "")


def _switched_parameters(ctx: Context) -> bool:
    """``p.requires_grad = flag`` over a prepared model's parameters (here, or in a helper
    handed the prepared model), or ``= False`` after ``prepare`` wrapped it with them: in the
    steps where they are off they get no gradient. The whole model on or off
    (``teacher.requires_grad_(False)``, a GAN's discriminator frozen for the generator's step)
    needs no option: in a step DDP waits for all of its parameters or for none. Turned off
    before ``prepare`` wraps the
    model, DDP leaves them out for good: once turned on again their gradients are never
    averaged, and the ranks drift apart (a review line says so)."""
    writes = requires_grad_writes(ctx.model)
    for node, owner, turns_on in writes:
        found = _prepared_name(ctx, owner, node)
        if found is None:
            continue
        prepared_as, whole = found
        if (
            whole
            and sets_every_parameter(ctx.model, node)
            and _frozen_before_prepare(ctx, writes, prepared_as) is None
        ):
            continue  # all its parameters on or off: in a step DDP waits for all or none
        if turns_on:
            how = "switched on and off here"
        elif _runs_after_prepare(ctx, node, prepared_as):
            how = f"turned off here, after prepare wrapped {prepared_as} with them"
        else:
            continue  # frozen before it is wrapped, for good: DDP leaves them out
        _expect_unused(ctx)
        ctx.plan.change(
            ctx.line(node),
            f"the parameters of {owner} are {how} (requires_grad): DDP told to expect "
            "parameters without gradients (find_unused_parameters=True)",
        )
        frozen = _frozen_before_prepare(ctx, writes, prepared_as)
        if frozen is not None:
            ctx.plan.review(
                ctx.line(frozen),
                f"the parameters of {owner} may be turned off here, before prepare wraps "
                f"{prepared_as}: DDP leaves out the parameters that need no gradient when it "
                "wraps the model, so once turned on again their gradients are never averaged "
                "across ranks and the ranks drift apart; turn them off after the prepare call",
            )
        return True
    return False


def _runs_after_prepare(ctx: Context, node: cst.CSTNode, model: str) -> bool:
    """``node`` runs after the prepare call of ``model``: later in its scope, or in a function
    one of whose calls does (one nothing in the file calls may run any time)."""
    anchor = ctx.prepared_after.get(model, ctx.prepare_anchor)
    if anchor is None:
        return False
    if ctx.model.scope_of(node) is ctx.model.scope_of(anchor):
        return ctx.after_prepare(node, model)
    function = ctx.facts.placement.enclosing_function(node)
    calls = ctx.facts.calls.callers(function) if function is not None else []
    return not calls or any(ctx.after_prepare(call, model) for call in calls)


def _prepared_as(ctx: Context, owner: str, at: cst.CSTNode) -> str | None:
    found = _prepared_name(ctx, owner, at)
    return found[0] if found is not None else None


def _prepared_name(ctx: Context, owner: str, at: cst.CSTNode) -> tuple[str, bool] | None:
    """The prepared model ``owner`` (``model.backbone``) belongs to, under its name there or
    at a helper's call sites, and whether ``owner`` is that whole model (``teacher``, or a
    helper's parameter handed it) rather than a part of it."""
    flow = ctx.facts.flow
    prepared = set(ctx.plan.prepared) | ctx.model.prepared_names
    for name in _prefixes(owner):
        if name in prepared:
            return name, name == owner
        for origin in sorted(o for o in flow.origins(name, at, stop=prepared) if o is not None):
            found = next((p for p in _prefixes(origin) if p in prepared), None)
            if found is not None:
                return found, name == owner and origin == found
    return None


def _prefixes(name: str) -> list[str]:
    """``model.backbone.layer``, ``model.backbone``, ``model``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _frozen_before_prepare(
    ctx: Context, writes: list[tuple[cst.CSTNode, str, bool]], model: str
) -> cst.CSTNode | None:
    """A write of ``writes`` for ``model``, or a call of a function that makes one, in the
    scope that prepares ``model`` and before the prepare call."""
    anchor = ctx.prepared_after.get(model, ctx.prepare_anchor)
    if anchor is None:
        return None
    scope = ctx.model.scope_of(anchor)
    mine = [node for node, owner, _ in writes if _prepared_as(ctx, owner, node) == model]
    functions = {ctx.facts.placement.enclosing_function(node) for node in mine} - {None}
    reaching = [
        call
        for call in ctx.model.calls
        if any(target in functions for target in ctx.facts.calls.targets(call))
    ]
    for node in [*mine, *reaching]:
        if ctx.model.scope_of(node) is scope and not ctx.after_prepare(node, model):
            return node
    return None
