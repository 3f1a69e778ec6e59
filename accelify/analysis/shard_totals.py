"""Totals a training loop sums over its batches and then divides by the size of the whole data
set: ``running_loss += loss.item() * x.size(0)`` ... ``running_loss / len(loader.dataset)``.

Over a prepared loader each rank sums its own shard, so the quotient reads about 1/N of the
value on N ranks. Reducing the total is not enough to make it right: the prepared loader repeats
samples to even out the last batch, and only ``gather_for_metrics`` (per batch) drops them. So
the conversion names these places for review instead of rewriting them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import libcst as cst

from accelify.analysis import names
from accelify.analysis.call_graph import CallGraph
from accelify.analysis.loops import (
    enumerate_start,
    first_enumerate_name,
    iterated_expression,
    phase_name,
)
from accelify.analysis.objects import bound_arguments, callee
from accelify.analysis.placement import Placement
from accelify.analysis.sample_counts import bound_to, spelled
from accelify.analysis.script_model import Loop, ScriptModel
from accelify.analysis.syntax import argument_value, assigned_targets, dotted, walk


@dataclass
class ShardTotal:
    loop: Loop
    #: the name the loop sums into
    total: str
    #: the division by the data set's size, after the loop (``total / n`` or ``total /= n``),
    #: or the f-string that shows the total over it (``f"{correct}/{len(loader.dataset)}"``)
    division: cst.BinaryOperation | cst.AugAssign | cst.FormattedString
    #: what it is divided by (shown over): ``len(loader.dataset)``, ``n``
    divisor: cst.BaseExpression
    #: how that size is known, when the division does not read it itself: ``n_examples,
    #: which train_epoch's callers pass as len(df_train)``
    size_from: str | None = None
    #: divided by the loader's length (its batches): the mean of this rank's batches only,
    #: right on one process, one shard's on N (``total_loss / len(train_loader)``)
    over_batches: bool = False
    #: the mean as the script reads it when the total is a list of per-batch values
    #: (``sum(losses) / len(losses)``, ``np.mean(losses)``); None for a summed total
    mean: str | None = None


def totals_over_dataset(
    model: ScriptModel,
    placement: Placement,
    reads_loader: Callable[[Loop], bool],
    graph: CallGraph,
) -> list[ShardTotal]:
    """Every training loop over a loader (``reads_loader(loop)``) whose ``+=`` total is divided
    by ``len(<that loader>.dataset)`` after the loop, in the same scope, or by a parameter
    every caller passes the size of the data the loader was made from (`_sizes_passed`). A
    loop trains when its body runs a backward, or calls a function of the file that does
    (``history["loss"].append(train_step(x, y))`` of a closure a factory made): its values are
    one rank's shard alike."""
    found = []
    for loop in model.loops:
        if loop.iterable is None or not reads_loader(loop):
            continue
        if not (loop.trains or graph.trains_through_calls(loop.node)):
            continue
        totals = _summed_in(loop)
        found += divided_by_set_size(model, placement, graph, loop, totals)
        found += _averaged_over_batches(model, placement, loop, totals)
        found += _lists_averaged(model, placement, loop)
        found += _lists_averaged_elsewhere(model, placement, graph, loop)
    return found


def _lists_averaged(model: ScriptModel, placement: Placement, loop: Loop) -> list[ShardTotal]:
    """``losses.append(loss.item())`` per batch, then ``sum(losses) / len(losses)`` (or
    ``np.mean(losses)``, ``torch.tensor(losses).mean()``, ``sum(losses) / len(train_loader)``)
    after the loop, in its scope: the mean of the batches this rank read."""
    appended = _appended_in(loop)
    found = []
    for node in walk(loop.scope):
        if not isinstance(node, (cst.BinaryOperation, cst.Call)):
            continue
        listed = list_mean(model, node, loop.iterable)
        each = None  # the comprehension's name for each list (``v``), where it is one
        if listed is not None and listed not in appended:
            each, listed = listed, _each_list_of(model, node, listed, appended)
        if listed is None or listed not in appended:
            continue
        if not (
            model.order(node) > model.order(loop.node)
            and not placement.inside(node, loop.node)
            and model.scope_of(node) is loop.scope
        ):
            continue
        code = model.module.code_for_node(node)
        if each is not None:  # ``np.mean(v)`` said of the list: ``np.mean(metrics['loss'])``
            code = re.sub(rf"(?<![\w.]){re.escape(each)}(?!\w)", listed.replace("\\", r"\\"), code)
        found.append(ShardTotal(loop, listed, node, node, over_batches=True, mean=code))
    return found


def _each_list_of(
    model: ScriptModel, node: cst.CSTNode, name: str, appended: set[str]
) -> str | None:
    """``{k: np.mean(v) for k, v in metrics.items()}`` (or ``for v in metrics.values()``)
    where the loop appends to ``metrics["train_loss"]``: ``v`` is each list of ``metrics`` in
    turn, that one among them. The first such list, or None."""
    for ancestor in model.ancestors(node):
        if not isinstance(ancestor, (cst.DictComp, cst.ListComp, cst.GeneratorExp)):
            continue
        for_in = ancestor.for_in
        call = for_in.iter
        if not (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in ("items", "values")
            and not call.args
        ):
            continue
        held = dotted(call.func.value)
        target = for_in.target
        if call.func.attr.value == "items":
            if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
                continue
            target = target.elements[1].value
        if held is None or not (isinstance(target, cst.Name) and target.value == name):
            continue
        lists = sorted(a for a in appended if a.startswith(f"{held}["))
        return lists[0] if lists else None
    return None


def _lists_averaged_elsewhere(
    model: ScriptModel, placement: Placement, graph: CallGraph, loop: Loop
) -> list[ShardTotal]:
    """The same list averaged outside the loop's function: returned (``return losses``) and
    averaged by a caller that binds the call to a name (``losses = self.train_epoch()`` then
    ``np.mean(losses)``, after that call in the caller's scope), or kept on the instance
    (``self.losses.append(...)``) and averaged by another method of the class. Either way it
    holds the batches this rank read."""
    function = loop.scope
    if not isinstance(function, cst.FunctionDef):
        return []
    appended = _appended_in(loop)
    places: list[tuple[str, cst.CSTNode, cst.CSTNode]] = []  # (name there, scope, after)
    for node in walk(function.body):
        if isinstance(node, cst.Return) and _list_named(node.value) in appended:  # type: ignore[arg-type]
            for call in graph.callers(function):
                statement = model.parent(call)
                targets = assigned_targets(statement) if isinstance(statement, cst.Assign) else []
                if len(targets) == 1 and isinstance(targets[0], cst.Name):
                    places.append((targets[0].value, model.scope_of(call), call))
    owner = placement.class_of(function)
    if owner is not None:
        for listed in sorted(a for a in appended if a.startswith("self.")):
            for method in graph.methods(owner).values():
                if method is not function:
                    places.append((listed, method, method))
    found = []
    for listed, scope, after in places:
        for node in walk(scope):
            if not isinstance(node, (cst.BinaryOperation, cst.Call)):
                continue
            if model.order(node) <= model.order(after) and after is not scope:
                continue
            if model.scope_of(node) is not scope or list_mean(model, node, None) != listed:
                continue
            code = model.module.code_for_node(node)
            found.append(ShardTotal(loop, listed, node, node, over_batches=True, mean=code))
    return found


def _appended_in(loop: Loop) -> set[str]:
    """``values.append(...)`` in the loop's body: a name, an attribute (``self.losses``) or a
    list kept under a string key (``log["train_loss"]``)."""
    return {
        listed
        for node in walk(loop.node.body)
        if isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "append"
        and (listed := _list_named(node.func.value)) is not None
    }


def _list_named(node: cst.BaseExpression) -> str | None:
    """How a list is named, the same for every spelling of it: ``losses``, ``self.losses``,
    ``log["train_loss"]`` (and ``log['train_loss']``); None for anything else."""
    name = dotted(node)
    if name is not None or not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return name
    held, key = dotted(node.value), node.slice[0].slice
    if held is None or not isinstance(key, cst.Index):
        return None
    if not isinstance(key.value, cst.SimpleString):
        return None
    return f"{held}[{key.value.evaluated_value!r}]"


#: functions whose value is the mean of the list they are handed
_MEANS = {"numpy.mean", "statistics.mean", "statistics.fmean", "numpy.average"}
#: calls that make a list into an array, whose ``.mean()`` is the list's mean
_ARRAYS = {"torch.tensor", "torch.stack", "torch.as_tensor", "numpy.array", "numpy.asarray"}


def list_mean(
    model: ScriptModel, node: cst.BinaryOperation | cst.Call, loader: str | None
) -> str | None:
    """The list ``node`` takes the mean of: ``sum(xs) / len(xs)``, ``sum(xs) / len(loader)``,
    ``np.mean(xs)``, ``statistics.mean(xs)``, ``torch.tensor(xs).mean()``."""
    if isinstance(node, cst.BinaryOperation):
        if not isinstance(node.operator, cst.Divide):
            return None
        summed = _only_argument(node.left, {"sum"}, model)
        if summed is None:
            return None
        counted = _only_argument(node.right, {"len"}, model)
        return summed if counted in (summed, loader) else None
    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value == "mean" and not node.args:
        return _only_argument(func.value, _ARRAYS, model)
    return _only_argument(node, _MEANS, model)


def _only_argument(node: cst.BaseExpression, functions: set[str], model: ScriptModel) -> str | None:
    """``f(name)`` with ``f`` one of ``functions`` (built-ins by name, others as imported):
    the name."""
    if not isinstance(node, cst.Call) or len(node.args) != 1 or node.args[0].keyword:
        return None
    called = dotted(node.func) or ""
    if called not in functions and not model.qualified(node.func) & functions:
        return None
    return _list_named(node.args[0].value)


def _averaged_over_batches(
    model: ScriptModel, placement: Placement, loop: Loop, totals: set[str]
) -> list[ShardTotal]:
    """``total_loss / len(train_loader)`` (or ``/ steps``, with ``steps += 1`` per batch) after
    the loop, in its scope: the mean of the batches this rank read. Over a prepared loader that
    is one shard's mean, not the whole set's."""
    found = []
    counted = _batch_counters(loop)
    for node, (divided, divisor) in _divisions_in(loop.scope):
        if isinstance(node, cst.FormattedString) or not (
            is_len_of(divisor, loop.iterable) or dotted(divisor) in counted
        ):
            continue
        if not (
            model.order(node) > model.order(loop.node)
            and not placement.inside(node, loop.node)
            and model.scope_of(node) is loop.scope
        ):
            continue
        for name in sorted(_names(divided) & totals):
            found.append(ShardTotal(loop, name, node, divisor, over_batches=True))
    return found


def averaged_over_batches(
    model: ScriptModel, placement: Placement, loop: Loop, total: str
) -> cst.CSTNode | None:
    """Where ``total`` (a list the loop appends to, or a ``+=`` sum) is averaged over the
    batches ``loop`` read, after the loop and in its scope: a list's mean (``np.mean(total)``,
    ``sum(total) / len(total)``, ``sum(total) / len(loader)``, ...), or the sum divided by the
    loader's length or by a count the loop takes one batch at a time (``total / len(loader)``,
    ``total / steps`` with ``steps += 1``). On a prepared loader each rank reads fewer batches:
    a mean over them is not the whole set's once the loop's values are gathered."""
    counted = _batch_counters(loop) | _lengths_of_the_loader(model, loop)
    for node in walk(loop.scope):
        if not (
            model.order(node) > model.order(loop.node)
            and not placement.inside(node, loop.node)
            and model.scope_of(node) is loop.scope
        ):
            continue
        if (
            isinstance(node, (cst.BinaryOperation, cst.Call))
            and list_mean(model, node, loop.iterable) == total
        ):
            return node
        averaged = _averaged_by_helper(model, node, total) if isinstance(node, cst.Call) else None
        if averaged is not None:
            return averaged
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
            divided, divisor = node.left, node.right
        elif isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign):
            divided, divisor = node.target, node.value
        else:
            continue
        if dotted(divided) == total and (
            is_len_of(divisor, loop.iterable) or dotted(divisor) in counted
        ):
            return node
    return None


def _lengths_of_the_loader(model: ScriptModel, loop: Loop) -> set[str]:
    """``num_batches = len(data_loader)`` in the loop's scope, the name's one binding there:
    the batches ``loop`` reads, counted before it (a quotient by it is one by the loader's
    length)."""
    bound: dict[str, list[cst.BaseExpression]] = {}
    for node in walk(loop.scope):
        if model.scope_of(node) is not loop.scope:
            continue
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            target = node.targets[0].target
            if isinstance(target, cst.Name):
                bound.setdefault(target.value, []).append(node.value)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)) and isinstance(node.target, cst.Name):
            bound.setdefault(node.target.value, []).append(cst.Name("_"))
    return {
        name
        for name, values in bound.items()
        if len(values) == 1 and is_len_of(values[0], loop.iterable)
    }


def _batch_counters(loop: Loop) -> set[str]:
    """``steps += 1`` in the loop's body, or the index of ``enumerate(loader, start=1)``: names
    that count the batches it reads."""
    counted = {
        node.target.value
        for node in walk(loop.node.body)
        if isinstance(node, cst.AugAssign)
        and isinstance(node.operator, cst.AddAssign)
        and isinstance(node.target, cst.Name)
        and isinstance(node.value, cst.Integer)
        and node.value.value == "1"
    }
    if enumerate_start(loop) == 1:
        counted |= first_enumerate_name(loop.node.target)
    return counted


def _averaged_by_helper(model: ScriptModel, call: cst.Call, total: str) -> cst.CSTNode | None:
    """``log_mean("val loss", losses)``: a function of the file handed the list ``total``
    whose parameter it takes the mean of (``sum(values) / len(values)``, ``np.mean(values)``):
    the mean it makes, inside the helper."""
    target = callee(model, call)
    if target is None:
        return None
    function, implicit = target
    handed = [
        name
        for name, argument in bound_arguments(function, call, implicit)
        if dotted(argument.value) == total
    ]
    if not handed:  # the call does not hand it ``total``: nothing to look for in its body
        return None
    for node in walk(function.body):
        if (
            isinstance(node, (cst.BinaryOperation, cst.Call))
            and model.scope_of(node) is function
            and list_mean(model, node, None) in handed
        ):
            return node
    return None


def is_len_of(node: cst.BaseExpression, loader: str | None) -> bool:
    """``len(loader)``: the count of batches ``loader`` yields."""
    return (
        isinstance(node, cst.Call)
        and dotted(node.func) == "len"
        and len(node.args) == 1
        and loader is not None
        and dotted(node.args[0].value) == loader
    )


def divided_by_set_size(
    model: ScriptModel,
    placement: Placement,
    graph: CallGraph,
    loop: Loop,
    totals: set[str],
    counted: frozenset[str] = frozenset(),
) -> list[ShardTotal]:
    """Where the ``totals`` ``loop`` sums are divided by the size of the whole set its loader
    reads, after the loop and in its scope (see `totals_over_dataset`), or by a name in
    ``counted`` (the samples the loop counts: ``seen += y.size(0)``). Any loop: an evaluation
    that sums one mean per batch and divides by a count of samples counts batches over
    samples, and gathered, each step holds N batches (`accelify.analysis.evaluation`)."""
    if not totals or loop.iterable is None:
        return []
    found = []
    sizes = _dataset_sizes(model, loop)
    made_from = _dataset_made_from(model, loop)
    passed = _sizes_passed(model, graph, loop)
    phase = phase_name(iterated_expression(loop))
    for node, divided in _divisions_in(loop.scope):
        if not (
            model.order(node) > model.order(loop.node)
            and not placement.inside(node, loop.node)
            and model.scope_of(node) is loop.scope
            and (
                _is_size(divided[1], loop.iterable, sizes)
                or _is_len_of_one(divided[1], made_from)
                or _is_phase_size(model, divided[1], loop.iterable, phase)
                or dotted(divided[1]) in passed
                or dotted(divided[1]) in counted
            )
        ):
            continue
        size_from = passed.get(dotted(divided[1]) or "")
        for name in sorted(_names(divided[0]) & totals):
            found.append(ShardTotal(loop, name, node, divided[1], size_from))
    return found


def _sizes_passed(model: ScriptModel, graph: CallGraph, loop: Loop) -> dict[str, str]:
    """Parameters of the loop's function that every caller passes the size of the data its
    loader argument was made from: ``train_epoch(model, loader, ..., n_examples)`` called as
    ``train_epoch(model, train_loader, ..., len(df_train))`` where ``train_loader =
    create_data_loader(df_train, ...)`` (the BERT sentiment tutorial), or as
    ``len(train_loader.dataset)``. ``len(train_loader)`` counts batches: not a set's size."""
    function = loop.scope
    if not isinstance(function, cst.FunctionDef) or loop.iterable is None:
        return {}
    parameters = {p.name.value for p in function.params.params}
    if loop.iterable not in parameters:
        return {}
    calls = graph.calls_of(function)
    found: dict[str, str] = {}
    for parameter in parameters - {loop.iterable}:
        sizes = []
        for call, implicit in calls:
            bound = dict(bound_arguments(function, call, implicit))
            loader, size = bound.get(loop.iterable), bound.get(parameter)
            if loader is None or size is None:
                break
            if not _size_of_loader_data(model, loader.value, size.value):
                break
            sizes.append(model.module.code_for_node(size.value))
        else:
            if sizes:
                callers = " and ".join(dict.fromkeys(sizes))
                found[parameter] = (
                    f"{parameter}, which {function.name.value}()'s callers pass as {callers}"
                )
    return found


def _size_of_loader_data(
    model: ScriptModel, loader: cst.BaseExpression, size: cst.BaseExpression
) -> bool:
    """``len(loader.dataset)``, or ``len(data)`` where ``loader`` is a name assigned a call
    that is handed ``data`` (``DataLoader(data, ...)``, ``create_data_loader(data, ...)``)."""
    if not (isinstance(size, cst.Call) and dotted(size.func) == "len" and len(size.args) == 1):
        return False
    counted, name = dotted(size.args[0].value), dotted(loader)
    if counted is None or name is None:
        return False
    if counted in _whole_set_of(name):
        return True
    made = [
        a.value
        for a in model.index.assignments_to(name)
        if model.scope_of(a) is model.scope_of(size) and len(assigned_targets(a)) == 1
    ]
    return len(made) == 1 and any(
        isinstance(value, cst.Call) and counted in {dotted(arg.value) for arg in value.args}
        for value in made
    )


def _divisions_in(
    scope: cst.CSTNode,
) -> Iterator[tuple[cst.CSTNode, tuple[cst.CSTNode, cst.BaseExpression]]]:
    """Each node of ``scope`` that divides something, with what it divides and by what:
    ``total / n``, ``total /= n``, and a total shown over a size in an f-string
    (``f"{correct}/{n}"``, ``f"{correct} of {n}"``), which reads as the same fraction."""
    for node in walk(scope):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
            yield node, (node.left, node.right)
        elif isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign):
            yield node, (node.target, node.value)
        elif isinstance(node, cst.FormattedString):
            for shown in _shown_over(node.parts):
                yield node, shown


#: What stands between a count and the size it is shown over: ``{c}/{n}``, ``{c} of {n}``.
_SHOWN_OVER = frozenset({"/", "of", "out of"})


def _shown_over(
    parts: Sequence[cst.BaseFormattedStringContent],
) -> Iterator[tuple[cst.CSTNode, cst.BaseExpression]]:
    for first, between, second in zip(parts, parts[1:], parts[2:], strict=False):
        if (
            isinstance(first, cst.FormattedStringExpression)
            and isinstance(between, cst.FormattedStringText)
            and between.value.strip() in _SHOWN_OVER
            and isinstance(second, cst.FormattedStringExpression)
        ):
            yield first.expression, second.expression


def _summed_in(loop: Loop) -> set[str]:
    """``total += ...`` in the loop's body (plain names, not in nested functions)."""
    found = set()
    for node in walk(loop.node.body):
        if (
            isinstance(node, cst.AugAssign)
            and isinstance(node.operator, cst.AddAssign)
            and isinstance(node.target, cst.Name)
        ):
            found.add(node.target.value)
    return found


def _dataset_sizes(model: ScriptModel, loop: Loop) -> set[str]:
    """Names of the loop's scope assigned ``len(<loader>.dataset)``: ``n = len(loader.dataset)``."""
    found = set()
    for assign in model.assignments:
        if model.scope_of(assign) is not loop.scope or len(assigned_targets(assign)) != 1:
            continue
        target = assigned_targets(assign)[0]
        if isinstance(target, cst.Name) and _is_len_of_dataset(assign.value, loop.iterable):
            found.add(target.value)
    return found


def _dataset_made_from(model: ScriptModel, loop: Loop) -> set[str]:
    """The data set the loop's loader was made from, as the file spells it: ``self.train_data``
    for ``self.train_loader = DataLoader(self.train_data, ...)`` (torchmf's pipeline divides by
    ``len(self.train_interactions)``), or a local handed to a ``DataLoader`` made in the loop's
    own scope. Empty when the loader is made more than once from different data, or by anything
    but a ``DataLoader``."""
    if loop.iterable is None:
        return set()
    found = set()
    for assignment in model.index.assignments_to(loop.iterable):
        value = assignment.value
        if len(assigned_targets(assignment)) != 1 or not (
            isinstance(value, cst.Call) and model.call_names(value) & names.DATALOADERS
        ):
            return set()
        dataset = argument_value(value, "dataset", 0)
        spelled = dotted(dataset) if dataset is not None else None
        if spelled is None:
            return set()
        if "." not in spelled and model.scope_of(assignment) is not loop.scope:
            return set()
        found.add(spelled)
    return found if len(found) == 1 else set()


def _is_len_of_one(node: cst.BaseExpression, datasets: set[str]) -> bool:
    return (
        isinstance(node, cst.Call)
        and dotted(node.func) == "len"
        and len(node.args) == 1
        and dotted(node.args[0].value) in datasets
    )


def _is_size(node: cst.BaseExpression, loader: str | None, sizes: set[str]) -> bool:
    if isinstance(node, cst.Name) and node.value in sizes:
        return True
    return _is_len_of_dataset(node, loader)


def _is_len_of_dataset(node: cst.BaseExpression, loader: str | None) -> bool:
    return (
        isinstance(node, cst.Call)
        and dotted(node.func) == "len"
        and len(node.args) == 1
        and dotted(node.args[0].value) in _whole_set_of(loader)
    )


def _whole_set_of(loader: str | None) -> tuple[str, ...]:
    """What ``len()`` of counts the samples ``loader`` reads: its dataset, or its sampler (a
    ``SubsetRandomSampler`` of the split's indices: ``valid_loss / len(valid_loader.sampler)``,
    Udacity's CIFAR exercise)."""
    return (f"{loader}.dataset", f"{loader}.sampler")


def _is_phase_size(
    model: ScriptModel, node: cst.BaseExpression, loaders: str | None, phase: str | None
) -> bool:
    """The size of the phase's data set: ``dataset_sizes[phase]``,
    ``len(loaders[phase].dataset)``."""
    if phase is None:
        return False
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        return isinstance(index, cst.Index) and dotted(index.value) == phase
    if isinstance(node, cst.Call) and dotted(node.func) == "len" and len(node.args) == 1:
        return model.module.code_for_node(node.args[0].value) in _whole_set_of(
            f"{loaders}[{phase}]"
        )
    return False


def _names(node: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


@dataclass
class MeterTotal:
    """A metric object (an ``AverageMeter``, a torchmetrics-like ``MeanMetric``) a training
    loop over a loader updates with each batch's values and that is read after the loop
    (``meter.avg``, ``metric.compute()``): over a prepared loader it holds this rank's batches
    only, so what the main process shows is its own shard's value, not the whole set's."""

    loop: Loop
    #: the meter as the loop spells it: ``meter``, ``self.train_loss``
    meter: str
    #: the class it is an instance of, defined in this file
    kind: str
    update: cst.Call
    #: the first read of it after the loop
    read: cst.CSTNode


def meters_over_shards(
    model: ScriptModel,
    placement: Placement,
    reads_loader: Callable[[Loop], bool],
    graph: CallGraph,
    imported: Mapping[str, cst.ClassDef] | None = None,
) -> list[MeterTotal]:
    """Each training loop's meters, as `MeterTotal` says. A meter is an instance of a class of
    this file whose ``update`` method accumulates into its own attributes (``self.sum +=
    val * n``), or of such a class of another module of the project, by the name this file
    calls it (``imported``: the ImageNet example's ``AverageMeter`` of ``utils.py``). An
    update handed a value the script already gathered or reduced across ranks is right as
    it is."""
    classes = accumulating_classes(model.module)
    classes.update(imported or {})
    if not classes:
        return []
    made = _instances(model, classes)
    found = []
    for loop in model.loops:
        if not loop.trains or loop.iterable is None or not reads_loader(loop):
            continue
        seen: set[str] = set()
        for node in walk(loop.node.body):
            if not (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "update"
            ):
                continue
            meter = spelled(model, node.func.value)
            if meter is None or meter not in made or meter in seen or _across_ranks(node):
                continue
            read = _read_after(model, placement, loop, meter)
            if read is None:
                read = _read_elsewhere(model, placement, graph, loop, meter)
            if read is not None and not _synchronises(classes[made[meter]], read):
                seen.add(meter)
                found.append(MeterTotal(loop, meter, made[meter], node, read))
    return found


def accumulating_classes(module: cst.Module) -> dict[str, cst.ClassDef]:
    """The classes of ``module`` whose ``update`` method adds into their own attributes
    (``self.sum += val * n``): meters, by name."""
    found = {}
    for node in walk(module):
        if not isinstance(node, cst.ClassDef):
            continue
        for statement in node.body.body:
            if (
                isinstance(statement, cst.FunctionDef)
                and statement.name.value == "update"
                and any(
                    isinstance(inner, cst.AugAssign)
                    and (dotted(inner.target) or "").startswith("self.")
                    for inner in walk(statement.body)
                )
            ):
                found[node.name.value] = node
    return found


def _instances(model: ScriptModel, classes: Mapping[str, cst.ClassDef]) -> dict[str, str]:
    """Names, attributes and constant keys of a dict bound to an instance of one of
    ``classes`` (``meter = AverageMeter()``, ``self.meters = {"acc": AverageMeter()}``):
    spelled as `spelled` spells them -> class."""
    made = {}
    for node in walk(model.module):
        if not isinstance(node, cst.Assign):
            continue
        for target in assigned_targets(node):
            name = spelled(model, target)
            if name is None:
                continue
            if isinstance(node.value, cst.Call) and dotted(node.value.func) in classes:
                made[name] = dotted(node.value.func) or ""
            elif isinstance(node.value, cst.Dict):
                for element in node.value.elements:
                    if (
                        isinstance(element, cst.DictElement)
                        and isinstance(element.key, cst.SimpleString)
                        and isinstance(element.key.evaluated_value, str)
                        and isinstance(element.value, cst.Call)
                        and dotted(element.value.func) in classes
                    ):
                        key = f"{name}[{element.key.evaluated_value!r}]"
                        made[key] = dotted(element.value.func) or ""
    return made


_ACROSS_RANKS = ("gather", "gather_for_metrics", "reduce", "all_reduce", "all_gather")


def _across_ranks(node: cst.CSTNode) -> bool:
    return any(
        isinstance(inner, cst.Call)
        and isinstance(inner.func, cst.Attribute)
        and inner.func.attr.value in _ACROSS_RANKS
        for inner in walk(node)
    )


def _synchronises(kind: cst.ClassDef, read: cst.CSTNode) -> bool:
    """The first thing done with the meter after the loop combines it across ranks
    (``meter.all_reduce()``, ``metric.sync()``, a method of its class ``kind`` that calls
    ``dist.all_reduce``): the script made it the whole set's itself."""
    assert isinstance(read, cst.Attribute)
    method = read.attr.value
    if any(word in method for word in ("reduce", "sync", "gather")):
        return True
    return any(
        isinstance(statement, cst.FunctionDef)
        and statement.name.value == method
        and _across_ranks(statement)
        for statement in kind.body.body
    )


def _read_after(
    model: ScriptModel, placement: Placement, loop: Loop, meter: str
) -> cst.CSTNode | None:
    """The first read of ``meter`` (``meter.avg``, ``meter.compute()``) after ``loop`` in its
    scope, other than starting it over (``meter.reset()``) or updating it again."""
    nodes = [
        node
        for node in walk(loop.scope)
        if model.order(node) > model.order(loop.node)
        and not placement.inside(node, loop.node)
        and model.scope_of(node) is loop.scope
    ]
    return _first_read(model, nodes, meter)


def _first_read(model: ScriptModel, nodes: list[cst.CSTNode], meter: str) -> cst.CSTNode | None:
    for node in nodes:
        if (
            isinstance(node, cst.Attribute)
            and spelled(model, node.value) == meter
            and node.attr.value not in ("reset", "update")
        ):
            return node
    return None


def _read_elsewhere(
    model: ScriptModel, placement: Placement, graph: CallGraph, loop: Loop, meter: str
) -> cst.CSTNode | None:
    """A meter kept on the instance (``self.loss_meter``) read in another method of the
    loop's class (``fit`` shows ``self.loss_meter.avg``), or one the loop's function returns
    (``return meter``) read by the caller it hands it to (``meter = train_epoch(...)``)."""
    function = loop.scope
    if not isinstance(function, cst.FunctionDef):
        return None
    owner = placement.class_of(loop.node)
    if meter.startswith("self.") and owner is not None:
        for method in model.index.methods_of(owner.name.value).values():
            if method is not function:
                read = _first_read(model, list(walk(method)), meter)
                if read is not None:
                    return read
    returns = model.index.own_returns(function)
    if not returns or any(r.value is None or spelled(model, r.value) != meter for r in returns):
        return None
    for call, _ in graph.calls_of(function):
        bound = bound_to(model, call, 1)
        if bound is None or bound[0] is None:
            continue
        scope = model.scope_of(call)
        nodes = [
            node
            for node in walk(scope)
            if model.order(node) > model.order(call) and model.scope_of(node) is scope
        ]
        read = _first_read(model, nodes, bound[0])
        if read is not None:
            return read
    return None
