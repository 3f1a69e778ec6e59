"""6. A hand-written DDP script's wrapping, DistributedSampler, process-group setup and
``set_epoch`` go (prepare and the launcher do them); rank and world-size reads and barriers
become the Accelerator's."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.device_moves import strip_moves
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import dotted, strip_self_methods
from accelify.convert.steps.context import Context
from accelify.edits.plan import expression, with_keyword


def run(ctx: Context) -> None:
    _remove_wrappers(ctx)
    samplers = _remove_samplers(ctx)
    _process_group_calls(ctx, samplers)
    _rank_reads_and_loaders(ctx, samplers)
    _module_access(ctx)


def _remove_wrappers(ctx: Context) -> None:
    for binding in ctx.model.of_kind(Kind.WRAPPER):
        call = _wrapper_call(binding.value)
        if call is None or not call.args:
            continue
        inner = strip_moves(call.args[0].value)
        wrapper = ctx.code(call.func)
        text = f"removed {wrapper} wrapping and device moves (prepare wraps the model)"
        if dotted(inner) == binding.name:
            ctx.plan.remove(binding.statement, binding.line, text)
        else:
            ctx.plan.replace(binding.value, lambda _, inner=inner: inner, binding.line, text)


def _remove_samplers(ctx: Context) -> dict[str, str]:
    """Each DistributedSampler goes; what the loader must do instead is its ``shuffle=``."""
    samplers: dict[str, str] = {}
    for binding in ctx.model.of_kind(Kind.SAMPLER):
        shuffle, dropped = _sampler_arguments(ctx, binding.value)
        samplers[binding.name] = shuffle
        ctx.plan.remove(
            binding.statement,
            binding.line,
            f"removed DistributedSampler {binding.name} (prepare shards the data)",
        )
        if dropped:
            ctx.plan.review(
                binding.line,
                f"DistributedSampler's {', '.join(dropped)} not carried over: the prepared "
                "loader shuffles with the run's seed and evens out the last batch itself",
            )
    return samplers


#: DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last)
_SAMPLER_POSITIONS = ("dataset", "num_replicas", "rank", "shuffle", "seed", "drop_last")


def _sampler_arguments(ctx: Context, value: cst.BaseExpression) -> tuple[str, list[str]]:
    """The sampler's ``shuffle`` as code (``True`` by default), and the arguments whose meaning
    the prepared loader does not keep."""
    shuffle, dropped = "True", []
    call = strip_self_methods(value)
    if not isinstance(call, cst.Call):
        return shuffle, dropped
    for index, argument in enumerate(call.args):
        name = argument.keyword.value if argument.keyword is not None else None
        if name is None and not argument.star and index < len(_SAMPLER_POSITIONS):
            name = _SAMPLER_POSITIONS[index]
        if name == "shuffle":
            shuffle = ctx.code(argument.value)
        elif name in ("seed", "drop_last"):
            dropped.append(f"{name}={ctx.code(argument.value)}")
    return shuffle, dropped


def _process_group_calls(ctx: Context, samplers: dict[str, str]) -> None:
    """Setup goes, teardown becomes ``end_training``, ``sampler.set_epoch`` goes."""
    for line_statement, call in ctx.facts.placement.expression_statements():
        qualified = ctx.model.call_names(call)
        if qualified & (names.INIT_PROCESS_GROUP | names.SET_CUDA_DEVICE):
            ctx.plan.remove(
                line_statement,
                ctx.line(call),
                "removed process-group setup (the launcher and Accelerator do it)",
            )
        elif qualified & names.DESTROY_PROCESS_GROUP:
            ctx.plan.replace(
                call,
                lambda _: expression(f"{ctx.acc}.end_training()"),
                ctx.line(call),
                f"destroy_process_group() -> {ctx.a('end_training')}()",
            )
            ctx.need(call)
        elif isinstance(call.func, cst.Attribute) and call.func.attr.value == "set_epoch":
            owner = dotted(call.func.value)
            if owner in samplers or (owner or "").endswith(".sampler"):
                ctx.plan.remove(
                    line_statement,
                    ctx.line(call),
                    "removed sampler.set_epoch (the prepared loader reshuffles each epoch)",
                )


def _rank_reads_and_loaders(ctx: Context, samplers: dict[str, str]) -> None:
    """Barriers, rank and world-size reads become the Accelerator's; a loader given the
    removed DistributedSampler shuffles as the sampler did."""
    for call in ctx.model.calls:
        qualified = ctx.model.call_names(call)
        replacement = None
        if qualified & names.BARRIER:
            replacement = f"{ctx.acc}.wait_for_everyone()"
        elif qualified & names.GET_RANK:
            replacement = f"{ctx.acc}.process_index"
        elif qualified & names.GET_WORLD_SIZE:
            replacement = f"{ctx.acc}.num_processes"
        elif _environ_rank(call) is not None:
            replacement = f"{ctx.acc}.{_environ_rank(call)}"
        if replacement is not None:
            ctx.plan.replace(
                call,
                lambda _, r=replacement: expression(r),
                ctx.line(call),
                f"{ctx.code(call)} -> {replacement}",
            )
            ctx.need(call)
        if ctx.model.call_names(call) & names.DATALOADERS:
            for argument in call.args:
                if (
                    argument.keyword
                    and argument.keyword.value == "sampler"
                    and dotted(argument.value) in samplers
                ):
                    shuffle = samplers[dotted(argument.value) or ""]
                    ctx.plan.replace(
                        call,
                        _drop_sampler_argument(shuffle),
                        ctx.line(call),
                        f"DataLoader(sampler=DistributedSampler) -> shuffle={shuffle} "
                        "(prepare shards the data)",
                    )


def _module_access(ctx: Context) -> None:
    """``model.module`` (the DataParallel/DDP inner model) -> ``unwrap_model(model)``."""
    for attribute in ctx.facts.placement.attributes():
        name = dotted(attribute.value)
        if attribute.attr.value == "module" and ctx.facts.flow.is_model_name(name, attribute):
            acc = ctx.acc
            ctx.plan.replace(
                attribute,
                lambda updated, acc=acc: cst.Call(
                    expression(f"{acc}.unwrap_model"), [cst.Arg(updated.value)]
                ),
                ctx.line(attribute),
                f"{name}.module -> {ctx.a('unwrap_model')}({name})",
            )
            ctx.need(attribute)


def _wrapper_call(value: cst.BaseExpression) -> cst.Call | None:
    """``DDP(model, ...)``, also as the branch of ``DDP(model) if distributed else model``."""
    core = strip_self_methods(value)
    if isinstance(core, cst.IfExp):
        for branch in (core.body, core.orelse):
            found = _wrapper_call(branch)
            if found is not None:
                return found
        return None
    return core if isinstance(core, cst.Call) else None


def _environ_rank(call: cst.Call) -> str | None:
    """``int(os.environ["LOCAL_RANK"])`` -> the Accelerator attribute that replaces it."""
    if dotted(call.func) != "int" or len(call.args) != 1:
        return None
    inner = call.args[0].value
    key = None
    if isinstance(inner, cst.Subscript) and dotted(inner.value) in ("os.environ",):
        index = inner.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            key = index.value.evaluated_value
    elif (
        isinstance(inner, cst.Call)
        and dotted(inner.func) in ("os.environ.get", "os.getenv")
        and inner.args
    ):
        first = inner.args[0].value
        if isinstance(first, cst.SimpleString):
            key = first.evaluated_value
    return {
        "LOCAL_RANK": "local_process_index",
        "RANK": "process_index",
        "WORLD_SIZE": "num_processes",
    }.get(str(key))


def _drop_sampler_argument(shuffle: str):
    def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        kept = [
            a for a in updated.args if not (a.keyword and a.keyword.value in ("sampler", "shuffle"))
        ]
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=with_keyword(kept, "shuffle", expression(shuffle)))

    return rewrite
