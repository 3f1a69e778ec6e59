"""6. A hand-written DDP script's wrapping, DistributedSampler, process-group setup and
``set_epoch`` go (prepare and the launcher do them); rank and world-size reads and barriers
become the Accelerator's."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.dataflow import is_binding
from accelify.analysis.device_moves import strip_moves
from accelify.analysis.outside_forward import in_training_step
from accelify.analysis.script_model import Binding, Kind
from accelify.analysis.sharded_loaders import sharded_by_its_sampler
from accelify.analysis.syntax import assigned_targets, dotted, strip_self_methods, walk
from accelify.convert.steps.context import Context
from accelify.convert.steps.evaluation import reductions_replaced_by_gathers
from accelify.edits import rewrites
from accelify.edits.node_rewrites import Swap
from accelify.edits.plan import expression, with_keyword


def run(ctx: Context) -> None:
    _remove_wrappers(ctx)
    samplers, chosen = _remove_samplers(ctx)
    _process_group_calls(ctx, {*samplers, *chosen})
    _rank_reads_and_loaders(ctx, samplers)
    _module_access(ctx)
    _spawns(ctx)
    _launcher_variables(ctx)
    _all_reduces(ctx)


def _spawns(ctx: Context) -> None:
    """``mp.spawn(main_worker, nprocs=n, args=(a, b))`` -> ``main_worker(LOCAL_RANK, a, b)``: the
    launcher starts the processes, each runs the worker once with its local index."""
    os_imported = ctx.model.imports.bound.get("os") == "os"
    for _, call in ctx.facts.placement.expression_statements():
        if not ctx.model.call_names(call) & names.SPAWN:
            continue
        worker = call.args[0].value if call.args and not call.args[0].keyword else None
        extra = _spawn_arguments(call)
        if worker is None or extra is None or not os_imported:
            ctx.plan.review(
                ctx.line(call),
                f"{ctx.code(call.func)}(...) left as is: the launcher starts the processes; call "
                "the worker once per process with its local index (LOCAL_RANK)",
            )
            continue
        index = 'int(os.environ.get("LOCAL_RANK", 0))'
        code = f"{ctx.code(worker)}({', '.join([index, *extra])})"
        ctx.plan.replace(
            call,
            Swap(code),
            ctx.line(call),
            f"{ctx.code(call.func)}(...) -> {code}",
        )
        ctx.plan.review(
            ctx.line(call),
            "the launcher starts the processes now (accelify launch -n N): "
            f"what the script computed for its own spawn ({_spawn_sizes(ctx, call)}) is kept as "
            "written; check what it is used for",
        )


def _spawn_arguments(call: cst.Call) -> list[str] | None:
    """The worker's arguments after the process index, as code; None when not a literal tuple."""
    for index, argument in enumerate(call.args):
        if (argument.keyword and argument.keyword.value == "args") or (
            index == 1 and argument.keyword is None
        ):
            value = argument.value
            if not isinstance(value, cst.Tuple) or any(
                not isinstance(e, cst.Element) for e in value.elements
            ):
                return None
            return [cst.Module([]).code_for_node(e.value) for e in value.elements]
    return []


def _spawn_sizes(ctx: Context, call: cst.Call) -> str:
    sizes = [
        f"{a.keyword.value}={ctx.code(a.value)}"
        for a in call.args
        if a.keyword is not None and a.keyword.value == "nprocs"
    ]
    return ", ".join(sizes) or "nprocs"


def _launcher_variables(ctx: Context) -> None:
    """``os.environ["MASTER_PORT"] = "29500"`` would point the ranks away from the launcher's."""
    for assign in ctx.model.assignments:
        keys = [_environ_key(t) for t in assigned_targets(assign)]
        if keys and all(key in names.LAUNCHER_VARIABLES for key in keys):
            statement = ctx.model.parent(assign)
            if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
                ctx.plan.remove(
                    statement,
                    ctx.line(assign),
                    f"removed os.environ[{keys[0]!r}] = ... (the launcher sets it)",
                )


def _environ_key(target: cst.BaseExpression) -> str | None:
    if isinstance(target, cst.Subscript) and dotted(target.value) == "os.environ":
        index = target.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            value = index.value.evaluated_value
            return value if isinstance(value, str) else None
    return None


def _all_reduces(ctx: Context) -> None:
    """``dist.all_reduce(t)`` -> ``t.copy_(accelerator.reduce(t, reduction="sum"))``: the same
    in-place sum, and on one process (no process group) the tensor as it is."""
    gathered_instead = reductions_replaced_by_gathers(ctx)
    for _, call in ctx.facts.placement.expression_statements():
        if not ctx.model.call_names(call) & names.ALL_REDUCE or not call.args:
            continue
        if call in gathered_instead:
            ctx.plan.remove(
                gathered_instead[call],
                ctx.line(call),
                f"removed {ctx.code(call)}: the evaluation gathers every rank's predictions and "
                f"labels in the loop ({ctx.a('gather_for_metrics')} drops the samples the "
                "prepared loader repeats)",
            )
            continue
        op = next(
            (
                a.value
                for i, a in enumerate(call.args)
                if (a.keyword and a.keyword.value == "op") or (i == 1 and not a.keyword)
            ),
            None,
        )
        reduction = (
            "sum" if op is None else names.REDUCTIONS.get((dotted(op) or "").rsplit(".", 1)[-1])
        )
        others = [
            a
            for a in call.args[1:]
            if not (a.keyword and a.keyword.value == "op") and a.keyword is not None
        ]
        if reduction is None or others or call.args[0].keyword or call.args[0].star:
            ctx.plan.review(
                ctx.line(call),
                "all_reduce left as is: it needs a process group on one process too; "
                f"use {ctx.a('reduce')}(tensor, reduction=...)",
            )
            continue
        tensor = ctx.code(call.args[0].value)
        code = f'{tensor}.copy_({ctx.a("reduce")}({tensor}, reduction="{reduction}"))'
        ctx.plan.replace(
            call,
            Swap(code),
            ctx.line(call),
            f"{ctx.code(call.func)}({tensor}) -> {code}",
        )
        ctx.need(call)


def _remove_wrappers(ctx: Context) -> None:
    for binding in ctx.model.of_kind(Kind.WRAPPER):
        call = _wrapper_call(binding.value)
        if call is None or not call.args:
            continue
        inner = strip_moves(call.args[0].value)
        wrapper = ctx.code(call.func)
        text = f"removed {wrapper} wrapping and device moves (prepare wraps the model)"
        # needs no accelerator: made outside the class that owns ``self.accelerator`` too
        # (``generator = nn.DataParallel(generator)`` in the script that hands it to a Trainer
        # that prepares it), where DDP would otherwise wrap a DataParallel over every GPU
        if dotted(inner) == binding.name:
            ctx.plan.remove(binding.statement, binding.line, text, anywhere=True)
        else:
            ctx.plan.replace(
                binding.value, lambda _, inner=inner: inner, binding.line, text, anywhere=True
            )
        _review_wrapper_handed_on(ctx, binding, wrapper)


#: Calls that may see the wrapper go without a change of meaning for the script.
_NEUTRAL_CALLS = {"print", "len", "isinstance", "hasattr", "getattr", "type", "id", "str", "repr"}


def _review_wrapper_handed_on(ctx: Context, binding: Binding, wrapper: str) -> None:
    """The wrapper alone handed, for its effect, to a function below its removal
    (Synchronized-BatchNorm's ``patch_replication_callback(model)``, which asserts it receives a
    DataParallel and patches its replicas): that function now gets the bare model, and prepare
    wraps it for DDP later, so a helper made for the wrapper may fail or do nothing. Each such
    call gets a review line. A call that returns something (``Trainer(model)``,
    ``evaluate(model, loader)``) uses the model, which works on the bare one."""
    for _, call in ctx.facts.placement.expression_statements():
        function = dotted(call.func)
        if (
            function is None
            or len(call.args) != 1
            or function in _NEUTRAL_CALLS
            or function.startswith((f"{binding.name}.", f"{ctx.acc}."))
            or ctx.model.scope_of(call) is not binding.scope
            or ctx.model.order(call) <= ctx.model.order(binding.statement)
            or ctx.facts.placement.inside(call, binding.statement)
            or not any(dotted(a.value) == binding.name for a in call.args)
        ):
            continue
        ctx.plan.review(
            ctx.line(call),
            f"{function}({binding.name}) receives the {wrapper} wrapper, which the conversion "
            f"removes: it now receives the model itself (prepare wraps it for DDP): check that "
            f"{function} works with the model, or drop the call if it only serves {wrapper}",
        )


def _remove_samplers(ctx: Context) -> tuple[dict[str, str], set[str]]:
    """Each DistributedSampler goes; what the loader must do instead is its ``shuffle=``. A
    name that held a DistributedSampler only when launched keeps its one-process value (the
    second set): its ``set_epoch`` goes too."""
    samplers: dict[str, str] = {}
    chosen: set[str] = set()
    for binding in ctx.model.of_kind(Kind.SAMPLER):
        if isinstance(binding.value, cst.IfExp):
            # ``DistributedSampler(ds) if world_size > 1 else None``: the script's own
            # one-process choice, so every use of the name (``shuffle=sampler is None``,
            # ``if sampler is not None: sampler.set_epoch(...)``) keeps working
            choice = binding.value
            single = choice.orelse if _is_sampler(ctx, choice.body) else choice.body
            code = ctx.code(single)
            ctx.plan.replace(
                choice,
                Swap(code),
                binding.line,
                f"{binding.name} = {code}: the DistributedSampler goes (prepare shards the data)",
            )
            chosen.add(binding.name)
            continue
        shuffle, dropped = _sampler_arguments(ctx, binding.value)
        samplers[binding.name] = shuffle
        if _read_besides_loaders(ctx, binding):
            # ``BatchSampler(sampler, 8, False)``: the name stays bound, to the sampler one
            # process reads the data set with (prepare shards the batches it makes)
            _one_process_sampler(ctx, binding.value)
        else:
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
    bound = [binding.value for binding in ctx.model.of_kind(Kind.SAMPLER)]
    inside = ctx.facts.placement.inside
    for call in ctx.model.calls:
        if _is_sampler(ctx, call) and not any(
            call is value or inside(call, value) for value in bound
        ):
            # in place (``BatchSampler(DistributedSampler(ds), 8, False)``): prepared, the
            # loader would shard batches of this rank's part again (1/N² of the data)
            _one_process_sampler(ctx, call)
    return samplers, chosen


def _read_besides_loaders(ctx: Context, binding: Binding) -> bool:
    """The sampler's name is read other than as a loader's ``sampler=`` (rewritten to its
    ``shuffle=``) or a ``set_epoch`` receiver (removed): removing its binding would leave
    that read a NameError (``BatchSampler(sampler, 8, False)``)."""
    for name in ctx.model.index.names_spelled(binding.name):
        if ctx.model.scope_of(name) is not binding.scope or ctx.facts.placement.inside(
            name, binding.assign
        ):
            continue
        parent = ctx.model.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            continue  # ``loader.sampler``: another object's attribute
        if isinstance(parent, cst.Arg) and parent.keyword is name:
            continue
        if isinstance(parent, cst.Attribute) and parent.attr.value == "set_epoch":
            continue
        if _in_a_rewritten_loader_argument(ctx, name, binding.name):
            continue
        return True
    return False


def _in_a_rewritten_loader_argument(ctx: Context, name: cst.Name, sampler: str) -> bool:
    """``name`` is read in the ``sampler=`` or ``shuffle=`` of a loader given ``sampler=``
    ``sampler`` (``shuffle=(sampler is None)``): both become the one ``shuffle=`` the sampler
    had (`_rank_reads_and_loaders`), so the read goes with them."""
    argument = ctx.model.index.nearest(name, cst.Arg)
    call = ctx.model.parent(argument) if argument is not None else None
    return (
        isinstance(argument, cst.Arg)
        and argument.keyword is not None
        and argument.keyword.value in ("sampler", "shuffle")
        and isinstance(call, cst.Call)
        and bool(ctx.model.call_names(call) & names.DATALOADERS)
        and any(
            a.keyword is not None and a.keyword.value == "sampler" and dotted(a.value) == sampler
            for a in call.args
        )
    )


def _one_process_sampler(ctx: Context, value: cst.BaseExpression) -> None:
    """``DistributedSampler(ds, shuffle=s)`` -> ``RandomSampler(ds)`` (``SequentialSampler``
    for ``shuffle=False``): what one process reads the data set with, so that the loader,
    prepared, shards the batches built over it once (the Accelerator draws the shuffle alike
    on every rank). Without its data set in view, the call stays with a review line."""
    call = strip_self_methods(value)
    if not isinstance(call, cst.Call):
        return
    dataset = next(
        (
            a.value
            for i, a in enumerate(call.args)
            if (a.keyword is None and not a.star and i == 0)
            or (a.keyword is not None and a.keyword.value == "dataset")
        ),
        None,
    )
    shuffle, dropped = _sampler_arguments(ctx, call)
    if dataset is None:
        ctx.plan.review(
            ctx.line(call),
            "a DistributedSampler whose data set the conversion cannot see: left as it is; "
            "replace it with RandomSampler(dataset) (SequentialSampler without shuffling), "
            "or the prepared loader shards this rank's part again",
        )
        return
    data = ctx.code(dataset)
    code = {
        "True": f"RandomSampler({data})",
        "False": f"SequentialSampler({data})",
    }.get(shuffle, f"RandomSampler({data}) if {shuffle} else SequentialSampler({data})")
    ctx.plan.replace(
        call,
        Swap(code),
        ctx.line(call),
        f"{ctx.code(call)} -> {code} (prepare shards the batches made over it)",
    )
    for imported in ("RandomSampler", "SequentialSampler"):
        line = f"from torch.utils.data import {imported}"
        if imported in code and line not in ctx.extra_imports:
            ctx.extra_imports.append(line)
    if dropped:
        ctx.plan.review(
            ctx.line(call),
            f"DistributedSampler's {', '.join(dropped)} not carried over: the prepared "
            "loader shuffles with the run's seed and evens out the last batch itself",
        )


def _is_sampler(ctx: Context, value: cst.BaseExpression) -> bool:
    call = strip_self_methods(value)
    return isinstance(call, cst.Call) and bool(
        ctx.model.call_names(call) & names.DISTRIBUTED_SAMPLERS
    )


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


def _process_group_calls(ctx: Context, samplers: set[str]) -> None:
    """Setup goes, teardown becomes ``end_training``, a DistributedSampler's ``set_epoch`` goes
    (the prepared loader shuffles each pass itself). A sampler of the project's own (a bucket
    sampler seeded by seed + epoch) keeps its call: it reads the whole data set, and its epoch
    is the script's to set."""
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
                Swap(f"{ctx.acc}.end_training()"),
                ctx.line(call),
                f"destroy_process_group() -> {ctx.a('end_training')}()",
            )
            ctx.need(call)
        elif isinstance(call.func, cst.Attribute) and call.func.attr.value == "set_epoch":
            owner = dotted(call.func.value) or ""
            loader = _sampler_owner(owner)
            if owner in samplers or (loader != owner and sharded_by_its_sampler(ctx.model, loader)):
                ctx.plan.remove(
                    line_statement,
                    ctx.line(call),
                    "removed sampler.set_epoch (the prepared loader reshuffles each epoch)",
                )
            elif loader != owner and loader in ctx.plan.prepared:
                _own_sampler_epoch(ctx, call, loader)


def _sampler_owner(owner: str) -> str:
    """``loader`` of ``loader.sampler`` or ``loader.batch_sampler`` (``owner`` itself
    otherwise): prepared, both are the loader's copies (the batch sampler the Accelerator's
    shard wrapper, which has no ``set_epoch``), so either call is the loader's to make."""
    for suffix in (".sampler", ".batch_sampler"):
        if owner.endswith(suffix):
            return owner.removesuffix(suffix)
    return owner


def _own_sampler_epoch(ctx: Context, call: cst.Call, loader: str) -> None:
    """``loader.sampler.set_epoch(e)`` (or ``loader.batch_sampler.set_epoch(e)``) of a sampler
    of the project's own (a bucket sampler seeded by seed + epoch) -> ``loader.set_epoch(e)``:
    prepared, ``loader.sampler`` is the user's object, not the copy the loader reads, and each
    pass sets the copy's epoch to the loader's pass count (as HF's loader does); ``set_epoch``
    on the loader sets both, so the pass reads epoch ``e`` as before. A loop that reads the
    loader more than once per epoch (``next(iter(loader))`` before the pass) moves the count
    on: said in a review line."""
    code = ctx.code(call.with_changes(func=cst.parse_expression(f"{loader}.set_epoch")))
    ctx.plan.replace(
        call,
        Swap(code),
        ctx.line(call),
        f"{ctx.code(call)} -> {code} (the prepared loader reads a copy of the sampler)",
    )
    loops = [
        loop.node for loop in ctx.model.loops if ctx.facts.placement.in_loop_body(call, loop.node)
    ]
    if not loops:
        return
    innermost = min(loops, key=lambda node: len(list(walk(node))))
    passes = [
        node
        for node in walk(innermost)
        if (isinstance(node, cst.For) and dotted(node.iter) == loader)
        or (
            isinstance(node, cst.Call)
            and dotted(node.func) == "iter"
            and node.args
            and dotted(node.args[0].value) == loader
        )
    ]
    if len(passes) > 1:
        ctx.plan.review(
            ctx.line(call),
            f"{loader} is read {len(passes)} times per epoch here: each pass of the prepared "
            "loader moves its sampler's epoch on by one (as HF's does), so the passes after the "
            f"first read other epochs than before; call {loader}.set_epoch(...) before each one",
        )


def _rank_reads_and_loaders(ctx: Context, samplers: dict[str, str]) -> None:
    """Barriers, rank and world-size reads become the Accelerator's; a loader given the
    removed DistributedSampler shuffles as the sampler did."""
    launched_tests = _launched_tests(ctx)
    for call in ctx.model.calls:
        if any(ctx.facts.placement.inside(call, test) for test in launched_tests):
            continue
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
                Swap(replacement),
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


def replaces_the_inner_model(ctx: Context) -> bool:
    """``net.module = new_model``: the script swaps the wrapper's inner model by hand. Without
    the wrapper that assignment would add a submodule named ``module`` to the model, and
    ``unwrap_model(net) = ...`` is not Python: the script is left as it is, with the reason."""
    found = False
    for attribute in ctx.facts.placement.attributes():
        name = dotted(attribute.value)
        if (
            attribute.attr.value == "module"
            and _holds_a_model(ctx, name, attribute)
            and _assigned(ctx, attribute)
        ):
            found = True
            ctx.plan.review(
                ctx.line(attribute),
                f"{name}.module is assigned here: the script replaces the DDP wrapper's inner "
                "model by hand, which neither prepare nor unwrap_model can express; left as it "
                "is: build the new model first and prepare that one, then convert",
            )
    return found


def _module_access(ctx: Context) -> None:
    """``model.module`` (the DataParallel/DDP inner model) -> ``unwrap_model(model)``; a
    ``model = model.module`` that strips the wrapper to train the inner model goes instead
    (`_stripped_for_training`)."""
    for attribute in ctx.facts.placement.attributes():
        name = dotted(attribute.value)
        if attribute.attr.value != "module" or not _holds_a_model(ctx, name, attribute):
            continue
        if not _stripped_for_training(ctx, attribute):
            ctx.plan.add(
                rewrites.unwrap_module(attribute, ctx.acc),
                line=ctx.line(attribute),
                text=f"{name}.module -> {ctx.a('unwrap_model')}({name})",
            )
            ctx.need(attribute)


def _stripped_for_training(ctx: Context, attribute: cst.Attribute) -> bool:
    """``model = model.module`` (or ``net = model.module``) whose target a training step then
    calls: the script strips its DataParallel to train the inner model. Kept as
    ``unwrap_model``, the training would run past the DDP wrapper that prepare makes (no
    gradient is reduced; the ranks drift apart). When the conversion removes the script's
    wrapper, the line goes (``net = model`` for another name); otherwise it stays as written,
    with a review line. False when the line does not strip the wrapper for training."""
    assign = ctx.model.parent(attribute)
    if not isinstance(assign, cst.Assign) or assign.value is not attribute:
        return False
    targets = [dotted(t.target) for t in assign.targets]
    if len(targets) != 1 or targets[0] is None or not _trained_after(ctx, targets[0], assign):
        return False
    target, name = targets[0], dotted(attribute.value)
    statement = ctx.model.parent(assign)
    if not _wrapper_removed(ctx):
        ctx.plan.review(
            ctx.line(attribute),
            f"{target} = {name}.module trains the model inside the wrapper, past the DDP "
            f"wrapper that prepare makes: its gradients are not reduced and the ranks drift "
            f"apart; left as is: train through {name} itself",
        )
        return True
    text = f"removed {target} = {name}.module: training runs through the prepared (DDP) model"
    if target == name and isinstance(statement, cst.SimpleStatementLine):
        ctx.plan.remove(statement, ctx.line(attribute), text)
    else:
        ctx.plan.replace(attribute, Swap(name or ""), ctx.line(attribute), text)
    return True


def _trained_after(ctx: Context, target: str, assign: cst.Assign) -> bool:
    """A call of ``target`` after ``assign``, in its function, that runs in a training step."""
    function = ctx.facts.placement.enclosing_function(assign)
    here = ctx.model.order(assign)
    return any(
        dotted(call.func) == target
        and ctx.facts.placement.enclosing_function(call) is function
        and ctx.model.order(call) > here
        and in_training_step(ctx.model, ctx.facts.placement, call)
        for call in ctx.model.calls
    )


def _wrapper_removed(ctx: Context) -> bool:
    """The conversion removes a DataParallel/DDP wrapping the script makes (`_remove_wrappers`)."""
    return any(
        (call := _wrapper_call(binding.value)) is not None and bool(call.args)
        for binding in ctx.model.of_kind(Kind.WRAPPER)
    )


def _holds_a_model(ctx: Context, name: str | None, at: cst.CSTNode) -> bool:
    """A model, or the wrapper the script made around one: ``self.model`` of a trainer handed
    ``nn.DataParallel(Net())`` holds the wrapper, whose ``.module`` is the model; prepare makes
    the wrapper now, so the inner model is ``unwrap_model``'s."""
    return ctx.facts.flow.kind_of(name, at) in (Kind.MODEL, Kind.WRAPPER)


def _assigned(ctx: Context, node: cst.CSTNode) -> bool:
    """``node`` is written, not read: an assignment or loop target (`is_binding`), or what
    ``del`` or a comprehension's ``for`` names. ``net.module.fc = ...`` reads ``net.module``."""
    if is_binding(ctx.model, node):
        return True
    child, parent = node, ctx.model.parent(node)
    while isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
        child, parent = parent, ctx.model.parent(parent)
    return isinstance(parent, (cst.Del, cst.CompFor)) and parent.target is child


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


def _launched_tests(ctx: Context) -> list[cst.Comparison]:
    """``int(os.environ.get("RANK", -1)) != -1`` (torchrun's variables set: "is this run
    distributed?") -> ``accelerator.num_processes > 1``; a rank read would be always set."""
    found = []
    for node in ctx.facts.placement.all_nodes():
        if not isinstance(node, cst.Comparison) or len(node.comparisons) != 1:
            continue
        target = node.comparisons[0]
        distributed = _launch_test(node.left, target)
        if distributed is None:
            continue
        code = f"{ctx.a('num_processes')} {'>' if distributed else '=='} 1"
        ctx.plan.replace(
            node,
            Swap(code),
            ctx.line(node),
            f"{ctx.code(node)} -> {code}",
        )
        ctx.need(node)
        found.append(node)
    return found


def _launch_test(left: cst.BaseExpression, target: cst.ComparisonTarget) -> bool | None:
    """True for a test that holds when launched distributed, False for its negation, None for
    anything else."""
    operator = target.operator
    if isinstance(left, cst.SimpleString) and isinstance(operator, (cst.In, cst.NotIn)):
        if dotted(target.comparator) == "os.environ" and left.evaluated_value in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
        ):
            return isinstance(operator, cst.In)
        return None
    if not isinstance(operator, (cst.Equal, cst.NotEqual)):
        return None
    inner = left
    if isinstance(inner, cst.Call) and dotted(inner.func) == "int" and len(inner.args) == 1:
        inner = inner.args[0].value
    if not (
        isinstance(inner, cst.Call)
        and dotted(inner.func) in ("os.environ.get", "os.getenv")
        and len(inner.args) == 2
        and isinstance(inner.args[0].value, cst.SimpleString)
        and inner.args[0].value.evaluated_value in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    ):
        return None
    default = cst.Module([]).code_for_node(inner.args[1].value)
    if cst.Module([]).code_for_node(target.comparator) != default:
        return None
    return isinstance(operator, cst.NotEqual)


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
