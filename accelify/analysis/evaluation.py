"""What an evaluation loop computes, and whether gathering can make its metrics global.

An evaluation loop reads a DataLoader, runs a model, has no ``.backward()``, and folds per-batch
values into something that outlives the batch: ``correct += ...``, ``preds.append(...)``,
``metric.add_batch(...)`` (the *sinks*). On N ranks each rank sees 1/N of the set, so every
sink must be fed from values gathered across ranks, predictions and labels alike.

The gather goes right after the statement holding the first forward pass. It gathers the
forward's outputs (a name, a tuple of names, or the fields read from a dict-like output such as
``out.logits``) and every batch value read after it (``y``, or ``batch["labels"]`` when the batch
itself was fed to the model). Then every sink is checked: one that still reads a per-rank value
(a count taken before the gather, an output field that is a scalar loss, anything computed from
an ungathered name, or under a condition on one) makes the whole loop *unsure*: it is left as
it is, with the reason, rather than gathered on one side only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names
from accelify.analysis.collectives import combines_ranks
from accelify.analysis.dataflow import (
    between,
    bound_by,
    fresh,
    is_attribute_name,
    is_binding,
    names_in_scope,
    names_read,
    plain_targets,
    statements,
    variables_in,
    within,
)
from accelify.analysis.inline_evaluations import runs_a_model_copy
from accelify.analysis.loops import (
    enumerate_start,
    enumerates,
    first_enumerate_name,
    iterated_expression,
    phase_name,
)
from accelify.analysis.loss_reduction import is_ctc_loss, made_as_a_loss, sums_its_batch
from accelify.analysis.objects import callee, methods_of
from accelify.analysis.script_model import Kind, Loop, ScriptModel
from accelify.analysis.shard_totals import averaged_over_batches, divided_by_set_size, is_len_of
from accelify.analysis.syntax import (
    argument_value,
    assigned_targets,
    children_of,
    dotted,
    keyword_value,
    root_name,
    statement_lines,
    strip_self_methods,
    target_names,
    unwrapped_argument,
    walk,
)

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts

RESHAPES = ("view", "reshape", "expand", "unflatten", "resize_")
BATCH_SIZE_NAMES = ("batch_size", "bs", "batch_sz", "test_batch_size", "eval_batch_size")
#: A tensor's own attributes: ``outputs.data`` reads the tensor, not a field of an output.
TENSOR_ATTRIBUTES = {"data", "shape", "T", "mT", "device", "dtype", "grad", "real", "imag"}
SINK_METHODS = ("append", "extend", "add_batch", "update", "add", "add_")
#: A row written per batch (``csv.writer(f).writerow(...)``, ``f.write(...)``) outlives the
#: batch in the file, as an appended one does in a list: prepared, the file holds one rank's
#: shard unless what is written is gathered.
WRITE_METHODS = ("writerow", "writerows", "write")
_SCOPES = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_COMPUTATIONS = (
    cst.BinaryOperation,
    cst.UnaryOperation,
    cst.Comparison,
    cst.BooleanOperation,
    cst.IfExp,
    *_SCOPES,
)


@dataclass
class GatheredField:
    """``out.logits`` / ``batch["labels"]``: read after the forward, gathered into ``name``."""

    name: str
    code: str
    uses: list[cst.CSTNode]


@dataclass
class Evaluation:
    loop: Loop
    #: the statement holding the first forward pass, and the forward call itself.
    statement: cst.SimpleStatementLine | None = None
    forward: cst.Call | None = None
    #: the forward sits inside an expression: it is bound to ``extracted`` first.
    extracted: str | None = None
    #: the loop's batch names and those unpacked or indexed from them before the forward.
    batch: set[str] = field(default_factory=set)
    #: the names the forward's output is bound to (``extracted`` when it is moved out).
    outputs: list[str] = field(default_factory=list)
    #: names gathered as they are (outputs, then labels), and fields gathered into new names.
    gathered: list[str] = field(default_factory=list)
    fields: list[GatheredField] = field(default_factory=list)
    #: names of ``gathered`` not known to be tensors (``ids`` a Dataset hands back as strings):
    #: each gets a gather of its own, since a tuple holding a list gathers as objects (the
    #: ranks' tuples joined into one list, not each value joined with its own).
    apart: list[str] = field(default_factory=list)
    #: outputs that are the model's own loss, one scalar per batch: never gathered.
    scalar_losses: list[str] = field(default_factory=list)
    sinks: list[cst.CSTNode] = field(default_factory=list)
    already_gathered: bool = False
    #: calls after the loop that combine its totals across ranks (``dist.all_reduce(correct)``):
    #: the script is distributed already, and a gather in the loop as well would count every
    #: sample once per rank.
    combined_by: list[cst.Call] = field(default_factory=list)
    #: a reshape to one rank's batch size that keeps the local values: everything is gathered
    #: under new names that only the metrics read.
    kept_local: cst.Call | None = None
    unsure: str | None = None
    #: ``unsure`` says the metric left as is changes with the number of ranks (a mean over the
    #: last index enumerate hands the loop): its review line is marked for `accelify verify`.
    unsure_differs_on_n_ranks: bool = False
    #: a torchmetrics metric it feeds combines the ranks' states itself: unprepared, every rank
    #: would feed it the whole set and its combined totals would count each sample N times.
    syncs_itself: bool = False
    #: what to do about it, when gathering predictions and labels is not the advice
    advice: str | None = None
    #: where the reason is: the metric that would stay per-rank, else the forward or the loop.
    unsure_at: cst.CSTNode | None = None
    #: the loader's collate_fn pads each batch to its own longest sequence with this value, and
    #: the metrics read the gathered values only where the labels differ from it: each gathered
    #: value is padded to the ranks' longest first (``pad_across_processes(x, dim=1,
    #: pad_index=...)``), and the extra positions count for nothing.
    pad_index: str | None = None
    #: gathered, a metric is near the whole set's but not exactly one process's (a mean of
    #: batch means whose merged batches differ in size): the gather is made and this says why
    #: and what makes it exact, on a review line at ``caveat_at``, which is always about a
    #: number that differs on N ranks.
    caveat: str | None = None
    caveat_at: cst.CSTNode | None = None

    @property
    def line_node(self) -> cst.CSTNode:
        return self.unsure_at or self.statement or self.loop.node


def evaluation_of(loop: Loop, facts: Facts) -> Evaluation | None:
    """The `Evaluation` of ``loop``, or None when it is not an evaluation over a DataLoader.
    One over ``loaders[split]`` whose every loader the key may pick is not known
    (`flow.keyed_loaders_unknown`) is left as it is: a gather could count an unprepared
    loader's samples N times, and none would report one rank's shard."""
    found = _evaluation_of(loop, facts)
    if (
        found is not None
        and found.sinks
        and found.unsure is None
        and not found.already_gathered
        and not loop.trains
        and facts.flow.keyed_loaders_unknown(loop)
    ):
        found.unsure_at = loop.node
        found.unsure = (
            f"it reads {loop.iterable}[...] with a key the conversion cannot read, and not "
            f"every loader {loop.iterable} may hold there is known prepared (an entry added "
            "later, a dict bound again or elsewhere, another caller's container; one dict "
            "made once after the prepare call from prepared loaders is followed)"
        )
    rows = facts.flow.row_loaders_unknown(loop)
    if found is not None and found.sinks and found.unsure is None and rows and not loop.trains:
        found.unsure_at = loop.node
        found.unsure = (
            f"it reads {loop.iterable}, taken from a row of the loop around it in a way the "
            f"conversion cannot follow, so it may be any of {', '.join(rows)}"
        )
    return found


def _evaluation_of(loop: Loop, facts: Facts) -> Evaluation | None:
    """`evaluation_of` before the check of a keyed read."""
    model = facts.model
    if not facts.flow.reads_loader(loop):
        return None
    if loop.trains:
        return _phase_evaluation(loop, facts)
    if _calls_a_training_step(loop, facts):
        return _step_evaluation(loop) if loop.evaluates else None
    found = Evaluation(loop)
    body = list(statements(loop.node.body))
    local = _assigned_in(loop.node)
    found.sinks = [
        sink for sink in body if _is_sink(sink, local) or _writes_a_row(sink, loop, local, model)
    ]
    if found.sinks and _feeds_training(loop, found.sinks, facts):
        return None
    forward = first_forward(loop, facts)
    if forward is not None:
        found.sinks += [sink for sink in body if _yields_to_the_caller(sink)]
        stores = [s for s in body if _stores_in_a_container(s, local) and s not in found.sinks]
        if stores and not _feeds_training(loop, stores, facts):
            found.sinks += stores
    synced = self_syncing_metrics(loop, model)
    if synced:
        # torchmetrics gathers its own states across ranks at compute(): gathered values fed to
        # it would count every sample N times
        others = [s for s in found.sinks if not any(within(model, c, s) for c in synced)]
        found.sinks = others or found.sinks
        found.already_gathered = not others
        found.syncs_itself = True
        if others:
            found.unsure_at = others[0]
            found.unsure = (
                f"this loop also feeds {dotted(_metric_of(synced[0]))}, a torchmetrics metric "
                "that combines the ranks itself at compute(): a gather before it would count "
                "every sample N times, and without one the other totals cover one rank's shard"
            )
            found.advice = (
                "feed the metric this rank's values and gather only what the other totals read"
            )
        return found
    if not found.sinks:
        return found if forward is not None else None
    found.already_gathered = _gathers(loop, facts)
    found.combined_by = _combined_after(loop, found.sinks, facts)
    if found.already_gathered:
        return found
    if forward is None:
        through = _through_a_member(loop, facts)
        if through is None:
            found.unsure = "no forward pass of a known model found"
        elif _summarises_the_batch(through, facts):
            found.unsure = (
                f"it runs {_member_label(through)}, a method of the model that returns Python "
                "numbers (.item(), len()): a summary of each batch, not its predictions, and a "
                "gather of it would be a list of every rank's objects"
            )
        else:
            found.unsure = (
                f"it runs {_member_label(through)}, a part or method of the model, not the "
                "model's own forward: what it returns per sample is not known here"
            )
        return found
    part = reads_part(loop, model)
    if part is not None:
        found.unsure_at = part
        how = "a break" if isinstance(part, cst.Break) else "islice"
        found.unsure = (
            f"it reads only the first batches of its loader ({how}): prepared, each rank would "
            "read that many batches of its own shard, and the totals would cover another "
            "subset, N times the size"
        )
        found.advice = (
            "read the whole loader and gather predictions and labels together with "
            "accelerator.gather_for_metrics"
        )
        return found
    found.forward = forward
    statement = next(
        (a for a in model.ancestors(forward) if isinstance(a, cst.SimpleStatementLine)), None
    )
    if statement is None:  # ``for p, t in zip(model(x).argmax(-1), y):``
        found.unsure_at = forward
        found.unsure = (
            "its forward pass sits in the header of a loop or a test, with no statement of its "
            "own after which to gather the predictions"
        )
        found.advice = (
            "bind the forward's output to a name first (`preds = model(x).argmax(-1)`), then "
            "gather it with the labels by accelerator.gather_for_metrics"
        )
        return found
    found.statement = statement
    found.batch = _batch_names(loop, facts, statement)
    found.unsure = _place(found, facts)
    if found.unsure is None:
        found.unsure = _skips_on_its_own(found, facts)
    if found.unsure is None:
        reshape = _per_rank_reshape(found, facts)
        if reshape is not None:
            found.unsure = _gather_for_the_metrics_only(found, facts, reshape)
    if found.unsure is None:
        found.unsure = _check_sinks(found, body, facts)
    if found.unsure is None:
        found.unsure = padded_per_batch(loop, facts)
        if found.unsure is not None:
            found.pad_index = _padding_masked(found, body, facts)
            if found.pad_index is not None:
                found.unsure = None
    if found.unsure is None:
        found.unsure = _sums_batch_means(found, body, facts)
    if found.unsure is None:
        found.unsure = _sums_batch_means_on_the_instance(found, body, facts)
    if found.unsure is None:
        found.unsure = _lists_batch_means(found, body, facts)
    if found.unsure is None:
        found.unsure = _scalar_of_a_gathered_value(found, body, facts)
    if found.unsure is None:
        found.unsure = _squeezed_to_one_sample(found, body, facts)
    if found.unsure is None:
        found.unsure = _one_sample_of_the_batch(found, body, facts)
    if found.unsure is None:
        found.unsure = _a_fixed_range_of_the_first_axis(found, body, facts)
    if found.unsure is None:
        found.unsure = _a_ctc_loss_of_gathered_values(found, body, facts)
    if found.unsure is None:
        found.unsure = _weighs_token_means(found, body, facts)
    if found.unsure is not None and found.unsure_at is None:
        found.unsure_at = found.sinks[0]  # the metric that stays this rank's
    if found.unsure is None:
        _caveat_batch_means_over_batches(found, body, facts)
    return found


def reads_part(loop: Loop, model: ScriptModel) -> cst.CSTNode | None:
    """The ``islice(loader, n)`` a loop reads (also through the name it assigned it to), or
    the ``break`` of its own body: the loop reads the first batches only, a count that means
    another subset once each rank reads its own shard."""
    for value in (loop.node.iter, loop.through):
        for node in walk(value) if value is not None else ():
            if isinstance(node, cst.Call) and "itertools.islice" in model.qualified(node.func):
                return node
    pending: list[cst.CSTNode] = [loop.node.body]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.Break):
            return node
        if not isinstance(node, _OWN_BREAKS):
            pending += children_of(node)
    return None


def _skips_on_its_own(found: Evaluation, facts: Facts) -> str | None:
    """``if (y == 0).all(): continue`` before the forward, on a value of this rank's batch:
    prepared, the rank that skips a batch does not reach the gather the others wait in (a
    hang), and a skip decided together would drop the other ranks' batches from the metric."""
    model = facts.model
    assert found.statement is not None
    pending: list[cst.CSTNode] = [found.loop.node.body]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.Continue) and model.order(node) < model.order(found.statement):
            test = next((a for a in model.ancestors(node) if isinstance(a, cst.If)), None)
            if test is not None and not facts.ranks.uniform(test.test):
                found.unsure_at = test
                found.advice = (
                    "count the batch as nothing instead of skipping it (a mask over its "
                    "values), so every rank gathers every batch"
                )
                return (
                    f"it skips a batch (continue, line {model.line(node)}) on a test of this "
                    "rank's own batch: prepared, the rank that skips would not reach the "
                    "gather the others wait in (a hang), and a skip decided by every rank "
                    "together would drop the other ranks' batches from the metrics"
                )
        elif not isinstance(node, _OWN_BREAKS):
            pending += children_of(node)
    return None


#: Where a ``break`` belongs to another loop, or to no loop of this one.
_OWN_BREAKS = (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)

#: Calls that pad a batch to its own longest sequence.
PADDING_CALLS = ("pad_sequence", "pad", "pad_packed_sequence", "DataCollatorWithPadding")


def padded_per_batch(loop: Loop, facts: Facts) -> str | None:
    """The loop's loader is made with a ``collate_fn`` of this file that pads each batch to its
    own longest sequence (``pad_sequence``): the ranks' batches differ in length, and a gather
    of them fails (a tensor of another size on each rank). The loader may be made by a factory
    of the file (``get_data_loader(data, batch_size, pad_index)``) and the collate function by
    another (``collate_fn = get_collate_fn(pad_index)``, returning a nested function)."""
    model = facts.model
    for argument in _collate_arguments(loop, facts):
        collate = _collate_function(model, argument)
        if collate is None:
            continue
        label = _label(model, collate)
        if _pads_time_major(collate):
            return (
                f"its loader's collate_fn ({label}) pads with pad_sequence "
                "without batch_first=True, so its batches are [length, batch]: "
                "gather_for_metrics joins and trims the first dimension, the time "
                "steps, not the samples (and the ranks' lengths differ); gather "
                "tensors whose first dimension is the batch (x.transpose(0, 1)), padded "
                "to one length first with accelerator.pad_across_processes(x, dim=1, "
                "pad_index=<a value the metric ignores>)"
            )
        listed = _returns_a_list(collate)
        if listed is not None:
            return (
                f"its loader's collate_fn ({label}) hands back {listed}, a "
                "Python list of per-sample items (dicts of tensors of their own sizes): "
                "gather_for_metrics joins the tensors inside each item, not the items, "
                "so the lists stop lining up with the samples; gather stacked tensors "
                "of the values the metric reads instead"
            )
        if _pads(collate):
            return (
                f"its loader's collate_fn ({label}) pads each batch to its "
                "own longest sequence, so the ranks' batches differ in length and a "
                "gather of them would fail; pad them to one length first with "
                "accelerator.pad_across_processes(x, dim=1, pad_index=<a value the "
                "metric ignores>)"
            )
    return None


def _padding_masked(found: Evaluation, body: list[cst.CSTNode], facts: Facts) -> str | None:
    """The value to pad the gathered values with so that the extra positions count for
    nothing, when the loader's collate_fn pads with ``pad_sequence(..., batch_first=True)``
    only and every metric reads what the gather returns only through a mask that compares a
    gathered value with that one (``mask = labels != -100``; ``correct += (preds[mask] ==
    labels[mask]).sum()``, ``total += mask.sum()``): padded with it, that value is the mask's
    value at every position a rank adds, whatever the collate padded with, and on one process
    nothing is padded. None otherwise."""
    if found.statement is None or not _pads_batch_first_only(found.loop, facts):
        return None
    model = facts.model
    gathered = set(found.gathered) | {f.name for f in found.fields}
    derived = set(gathered)
    masks: dict[str, str] = {}
    after = False
    for small in body:
        if small is found.statement.body[0]:
            after = True
            derived |= bound_by(small)  # ``preds = model(x).argmax(-1)``: from the outputs
            continue
        if not after or small in found.sinks:
            continue
        bound = bound_by(small)
        if bound & gathered:
            return None  # a gathered name rebound: what the mask compares is no longer padded
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            pad = _masks_out(small.value, gathered, model)
            if isinstance(target, cst.Name) and pad is not None:
                masks[target.value] = pad
                continue
        if variables_in(model, small) & (derived | set(masks)):
            derived |= bound
    if len(set(masks.values())) != 1:
        return None
    for sink in found.sinks:
        for node in walk(sink):
            if (
                isinstance(node, cst.Name)
                and node.value in derived
                and not is_attribute_name(model, node)
                and not _masked(node, set(masks), model)
            ):
                return None
    return next(iter(masks.values()))


def _masks_out(value: cst.BaseExpression, gathered: set[str], model: ScriptModel) -> str | None:
    """The integer of ``labels != -100`` / ``labels.ne(-100)`` on a gathered value."""
    compared: cst.BaseExpression | None = None
    if isinstance(value, cst.Comparison) and len(value.comparisons) == 1:
        if isinstance(value.comparisons[0].operator, cst.NotEqual):
            compared, pad = value.left, value.comparisons[0].comparator
    elif (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "ne"
        and len(value.args) == 1
    ):
        compared, pad = value.func.value, value.args[0].value
    if not (isinstance(compared, cst.Name) and compared.value in gathered):
        return None
    if isinstance(pad, cst.UnaryOperation) and isinstance(pad.operator, cst.Minus):
        return (
            "-" + model.module.code_for_node(pad.expression)
            if isinstance(pad.expression, cst.Integer)
            else None
        )
    return pad.value if isinstance(pad, cst.Integer) else None


def _masked(name: cst.Name, masks: set[str], model: ScriptModel) -> bool:
    """``name[mask]``."""
    parent = model.parent(name)
    if not isinstance(parent, cst.Subscript) or parent.value is not name or len(parent.slice) != 1:
        return False
    index = parent.slice[0].slice
    return (
        isinstance(index, cst.Index)
        and isinstance(index.value, cst.Name)
        and index.value.value in masks
    )


def _pads_batch_first_only(loop: Loop, facts: Facts) -> bool:
    """The loop's loader's collate_fn pads only with ``pad_sequence(..., batch_first=True)``:
    its batches are ``[batch, length, ...]``, the length the second dimension."""
    found = False
    for argument in _collate_arguments(loop, facts):
        collate = _collate_function(facts.model, argument)
        if collate is None or _pads_time_major(collate) or _returns_a_list(collate) is not None:
            return False
        for node in walk(collate):
            if not isinstance(node, cst.Call):
                continue
            name = (dotted(node.func) or "").rsplit(".", 1)[-1]
            if name == "max" and any(_measures_length(n) for a in node.args for n in walk(a.value)):
                return False  # padded by hand: which dimension is not said
            if name in PADDING_CALLS and name != "pad_sequence":
                return False
            found = found or name == "pad_sequence"
    return found


#: Hugging Face collators that pad each batch to its own longest sequence (unless told
#: ``padding="max_length"``), and whether they pad the labels too (token-level tasks).
PADDING_COLLATORS = {
    "DataCollatorWithPadding": False,
    "DataCollatorForSeq2Seq": True,
    "DataCollatorForTokenClassification": True,
    "DataCollatorForLanguageModeling": True,
    "DataCollatorForWholeWordMask": True,
    "DataCollatorForPermutationLanguageModeling": True,
    "DataCollatorWithFlattening": True,
}


@dataclass(frozen=True)
class PaddingCollator:
    """A loader's collator that pads each batch to its own longest sequence: the ranks'
    batches differ in their second dimension."""

    name: str  # ``DataCollatorForSeq2Seq``, or the file's collate function
    labels_padded: bool  # the labels are sequences too (token-level tasks)


def tokenizer_pads_to_its_longest(call: cst.Call) -> bool:
    """``tokenizer(texts, padding=True, return_tensors="pt")`` (or ``padding="longest"``): the
    tensors are as long as this batch's longest text, as a padding collator's are; a call told
    ``padding="max_length"`` (or not told to pad) is not one."""
    padding = keyword_value(call, "padding")
    told = (isinstance(padding, cst.Name) and padding.value == "True") or (
        isinstance(padding, cst.SimpleString) and padding.evaluated_value == "longest"
    )
    called = (dotted(call.func) or "").lower()
    return told and (keyword_value(call, "return_tensors") is not None or "tokeniz" in called)


def padding_collator(loop: Loop, facts: Facts) -> PaddingCollator | None:
    """The collator of the loader ``loop`` reads, when it pads per batch: a Hugging Face
    padding collator (``collate_fn=data_collator`` with ``data_collator =
    DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)``; any assignment of that name
    counts, the others may be a ``--pad_to_max_length`` branch) or a collate function of the
    file that pads (`padded_per_batch`)."""
    for argument in _collate_arguments(loop, facts):
        found = _padding_collator_of(facts.model, argument)
        if found is not None:
            return found
    return None


def _collate_arguments(loop: Loop, facts: Facts) -> Iterator[cst.BaseExpression]:
    """The ``collate_fn=`` of each construction of the loader ``loop`` reads, wherever it was
    made (a factory of the file too: `_loader_constructions`)."""
    model = facts.model
    origins = facts.flow.origins(loop.iterable, loop.node)
    for binding in model.bindings:
        if binding.name not in origins or not isinstance(binding.value, cst.Call):
            continue
        for construction in _loader_constructions(model, binding.value):
            for argument in construction.args:
                if argument.keyword is not None and argument.keyword.value == "collate_fn":
                    yield argument.value


def _padding_collator_of(model: ScriptModel, value: cst.BaseExpression) -> PaddingCollator | None:
    values = [value]
    name = dotted(value)
    if name is not None and not isinstance(value, cst.Call):
        values = [a.value for a in model.index.assignments_to(name) if a.value is not None]
    for made in values:
        for node in walk(made):  # ``A if flag else B`` too
            if not isinstance(node, cst.Call):
                continue
            called = (dotted(node.func) or "").rsplit(".", 1)[-1]
            if called not in PADDING_COLLATORS:
                continue
            padding = keyword_value(node, "padding")
            if isinstance(padding, cst.SimpleString) and "max_length" in padding.value:
                continue
            return PaddingCollator(called, PADDING_COLLATORS[called])
    collate = _collate_function(model, value)
    if collate is not None and _pads(collate) and not _pads_time_major(collate):
        return PaddingCollator(_label(model, collate), _pads_with_ignore_index(collate))
    return None


def _pads_with_ignore_index(collate: cst.FunctionDef) -> bool:
    """``pad_sequence(tags, batch_first=True, padding_value=-100)``: labels padded with the
    index the loss ignores, so the labels are sequences."""
    return any(
        isinstance(node, cst.Call) and any(_code(argument) == "-100" for argument in node.args)
        for node in walk(collate)
    )


def _code(argument: cst.Arg) -> str:
    value = argument.value
    if (
        isinstance(value, cst.UnaryOperation)
        and isinstance(value.operator, cst.Minus)
        and isinstance(value.expression, cst.Integer)
    ):
        return f"-{value.expression.value}"
    return ""


def _loader_constructions(model: ScriptModel, value: cst.Call) -> list[cst.Call]:
    """The calls that build the loader ``value`` makes: itself, or the ``DataLoader(...)`` a
    factory function of this file returns (directly or through a name it assigns)."""
    target = callee(model, value)
    if target is None or target[0].name.value == "__init__":
        return [value]
    factory = target[0]
    found = []
    for returned in model.index.own_returns(factory):
        result = returned.value
        if isinstance(result, cst.Name):
            assigned = [
                a.value
                for a in model.index.own_assignments(factory)
                if any(dotted(t) == result.value for t in assigned_targets(a))
            ]
            result = assigned[-1] if assigned else result
        if isinstance(result, cst.Call):
            found.append(result)
    return found or [value]


def _collate_function(model: ScriptModel, value: cst.BaseExpression) -> cst.FunctionDef | None:
    """The function a ``collate_fn=`` argument names: one of the file's, or the nested function
    that a factory of the file returns (``collate_fn = get_collate_fn(pad_index)``), through a
    name assigned in the scope of the argument."""
    if (
        isinstance(value, cst.Lambda)
        and isinstance(value.body, cst.Call)
        and _forwards_its_parameters(value, value.body)
    ):
        value = value.body.func  # ``lambda x: data_processing(x, "valid")``: that function
    if isinstance(value, cst.Call) and dotted(value.func) in model.classes:
        # ``collate_fn=Collator(pad_index)``: an instance of the file's class, called per batch
        return methods_of(model, dotted(value.func)).get("__call__")  # type: ignore[arg-type]
    name = dotted(value)
    if name is None:
        return None
    if name in model.classes:
        # ``collate_fn=Batch``: the class itself, whose constructor builds each batch
        return methods_of(model, name).get("__init__")
    function = model.index.enclosing_function(value)
    if function is not None:
        assigned = [
            a.value
            for a in model.index.own_assignments(function)
            if any(dotted(t) == name for t in assigned_targets(a))
        ]
        if len(assigned) == 1 and isinstance(assigned[0], cst.Call):
            return _returned_function(model, assigned[0])
        if assigned:
            return None
    if name in model.functions:
        return model.functions[name]
    for assign in model.index.assignments_to(name):
        if model.scope_of(assign) is model.module and isinstance(assign.value, cst.Call):
            return _returned_function(model, assign.value)
    return None


def _label(model: ScriptModel, collate: cst.FunctionDef) -> str:
    """``collate_batch``, or ``Batch.__init__`` for a method of a collating class."""
    owner = model.call_graph.owner(collate)
    return f"{owner.name.value}.{collate.name.value}" if owner is not None else collate.name.value


def _forwards_its_parameters(function: cst.Lambda, call: cst.Call) -> bool:
    """``lambda x: data_processing(x, "valid")`` (the speech tutorial's collate_fn): the lambda
    hands the batch it receives to ``call``, so the batches are what ``call`` makes."""
    parameters = [p.name.value for p in function.params.params]
    passed = {dotted(a.value) for a in call.args}
    return bool(parameters) and all(p in passed for p in parameters)


def _returned_function(model: ScriptModel, call: cst.Call) -> cst.FunctionDef | None:
    """The function defined inside the factory ``call`` runs and returned by name."""
    target = callee(model, call)
    if target is None:
        return None
    factory = target[0]
    nested = {
        node.name.value: node for node in walk(factory.body) if isinstance(node, cst.FunctionDef)
    }
    for returned in model.index.own_returns(factory):
        name = dotted(returned.value) if returned.value is not None else None
        if name in nested:
            return nested[name]
    return None


def _pads_time_major(collate: cst.FunctionDef) -> bool:
    """``pad_sequence(seqs)`` without ``batch_first=True``: the batch is [length, batch]."""
    for node in walk(collate):
        if not isinstance(node, cst.Call):
            continue
        name = dotted(node.func)
        if name is None or name.rsplit(".", 1)[-1] != "pad_sequence":
            continue
        batch_first = [a for a in node.args if a.keyword and a.keyword.value == "batch_first"]
        if not batch_first or (
            isinstance(batch_first[0].value, cst.Name) and batch_first[0].value.value == "False"
        ):
            return True
    return False


def _returns_a_list(collate: cst.FunctionDef) -> str | None:
    """``targets = [b[1] for b in batch]; return images, targets``: what ``collate`` returns a
    list comprehension for, directly or through a name it assigned one to (detection targets,
    one dict per image); None when it returns tensors only. A name rebound to something else
    (``seqs = [s for s, _ in batch]`` then ``seqs = pad_sequence(seqs)``) is no list."""
    assigned = [node for node in walk(collate.body) if isinstance(node, cst.Assign)]
    listed = {
        dotted(t)
        for node in assigned
        if isinstance(node.value, cst.ListComp)
        for t in assigned_targets(node)
    } - {
        dotted(t)
        for node in assigned
        if not isinstance(node.value, cst.ListComp)
        for t in assigned_targets(node)
    }
    for node in walk(collate.body):
        if not isinstance(node, cst.Return) or node.value is None:
            continue
        value = node.value
        parts = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        for part in parts:
            if isinstance(part, cst.ListComp):
                return "a list comprehension"
            name = dotted(part)
            if name is not None and name in listed:
                return name
    return None


def _pads(collate: cst.FunctionDef) -> bool:
    """``collate`` calls a padding function (``pad_sequence``), or sizes what it builds by the
    batch's own longest item: ``L = max(len(s) for s in seqs)`` then ``torch.zeros(n, L)``, or
    ``lengths = torch.tensor([len(x) for x, _ in batch])`` then ``T = int(lengths.max())``."""
    for node in walk(collate):
        if not isinstance(node, cst.Call):
            continue
        name = dotted(node.func)
        if name is not None and name.rsplit(".", 1)[-1] in PADDING_CALLS:
            return True
        if name == "max" and any(_measures_length(n) for a in node.args for n in walk(a.value)):
            return True
        if (
            isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "max"
            and _holds_lengths(collate, node.func.value)
        ):
            return True
    return False


def _holds_lengths(collate: cst.FunctionDef, value: cst.BaseExpression) -> bool:
    """``value`` is made of the items' lengths: it measures them itself, or is a name
    ``collate`` binds to something that does (``lengths = torch.tensor([len(x) for x in
    batch])``)."""
    if any(_measures_length(n) for n in walk(value)):
        return True
    if not isinstance(value, cst.Name):
        return False
    return any(
        isinstance(node, cst.Assign)
        and any(
            isinstance(t.target, cst.Name) and t.target.value == value.value for t in node.targets
        )
        and any(_measures_length(n) for n in walk(node.value))
        for node in walk(collate)
    )


def _measures_length(node: cst.CSTNode) -> bool:
    """``len(s)``, ``s.size(0)``, ``s.shape[0]``: an item's length."""
    if isinstance(node, cst.Call):
        name = dotted(node.func)
        return name == "len" or (name is not None and name.endswith(".size"))
    return isinstance(node, cst.Attribute) and node.attr.value == "shape"


def _calls_a_training_step(loop: Loop, facts: Facts) -> bool:
    """``for batch in train_loader: metrics = train_step(model, optimizer, batch)``: the
    backward is in a function of this file the loop calls; a training loop, not an evaluation.
    The backward may be the accelerator's (``self.accelerator.backward(loss)`` in a trainer's
    ``backward_pass``), which the model's tensor backwards leave out, and a few calls down
    (``self.update(loss)`` that calls ``self._backward(loss)``): the call graph's one answer
    (`CallGraph.trains_through_calls`, the conversion's too)."""
    return facts.model.call_graph.trains_through_calls(loop.node)


def _step_evaluation(loop: Loop) -> Evaluation:
    """``with torch.no_grad(): for batch in test_loader: loss, logits = self.make_step(batch,
    update_model=False)``: gradients are off, so the step function that also trains runs its
    forward only. No gather fits there (the training steps run it too), and the loop's totals
    would be this rank's: left as it is, with the reason."""
    found = Evaluation(loop)
    found.sinks = [s for s in statements(loop.node.body) if _is_sink(s, _assigned_in(loop.node))]
    found.unsure_at = loop.node
    found.unsure = (
        "its forward runs in a function that also trains (its backward skipped here, with "
        "gradients off): no gather fits inside it, and the loop's totals would cover one rank's "
        "shard"
    )
    found.advice = (
        "give evaluation a forward of its own in this loop and gather predictions and labels "
        "together with accelerator.gather_for_metrics"
    )
    return found


def _phase_evaluation(loop: Loop, facts: Facts) -> Evaluation | None:
    """``for x, y in loaders[phase]:`` with ``if phase == "train": loss.backward()``: one loop
    trains in one phase and evaluates in the other. Its totals are this rank's in evaluation,
    and a gather could only run in one phase: left as it is, with the reason."""
    model = facts.model
    backwards = [call for call in model.backward_calls if within(model, call, loop.node)]
    conditions = []
    for call in backwards:
        tests = [
            model.module.code_for_node(a.test)
            for a in between(model, call, loop.node)
            if isinstance(a, cst.If)
        ]
        if not tests:
            return None
        conditions += tests
    if not any(word in test for test in conditions for word in ("train", "phase", "mode")):
        return None
    if _trains_in_every_phase(loop, backwards, model):
        return None
    local = _assigned_in(loop.node)
    sinks = [sink for sink in statements(loop.node.body) if _is_sink(sink, local)]
    if not sinks:
        return None
    found = Evaluation(loop, sinks=sinks, unsure_at=sinks[0])
    found.already_gathered = _gathers(loop, facts)
    found.unsure = (
        "this loop trains in one phase and evaluates in the other (the backward runs under "
        f"`if {conditions[0]}`): over a prepared loader its evaluation totals would cover one "
        "rank's shard, and a gather could run in one phase only"
    )
    found.advice = (
        "give evaluation a loop of its own and gather predictions and labels there with "
        "accelerator.gather_for_metrics"
    )
    return found


def _trains_in_every_phase(loop: Loop, backwards: list[cst.Call], model: ScriptModel) -> bool:
    """``for phase in ["train"]:`` around ``for x, y in loaders[phase]:`` whose backward runs
    under ``if phase == "train":``: every phase the list names passes every test around the
    backward, so the loop only ever trains (the transfer-learning tutorial with its validation
    phase taken out): a training loop, sharded, with nothing to gather."""
    phase = phase_name(iterated_expression(loop))
    phases = _listed_phases(loop, phase, model) if phase is not None else None
    if not phases:
        return False
    for call in backwards:
        for ancestor in between(model, call, loop.node):
            if isinstance(ancestor, cst.If) and not all(
                _phase_test(ancestor.test, phase, value)
                for value in phases  # type: ignore[arg-type]
            ):
                return False
    return True


def _listed_phases(loop: Loop, phase: str, model: ScriptModel) -> list[str] | None:
    """The strings of ``for phase in ["train", "val"]:`` around ``loop``, or None when the
    phases are not written out."""
    for ancestor in model.ancestors(loop.node):
        if (
            isinstance(ancestor, cst.For)
            and isinstance(ancestor.target, cst.Name)
            and ancestor.target.value == phase
        ):
            values = ancestor.iter
            if not isinstance(values, (cst.List, cst.Tuple)) or not values.elements:
                return None
            strings = [element.value for element in values.elements]
            if not all(isinstance(value, cst.SimpleString) for value in strings):
                return None
            return [value.evaluated_value for value in strings]  # type: ignore[union-attr]
    return None


def _phase_test(test: cst.BaseExpression, phase: str, value: str) -> bool:
    """``phase == "train"`` (``!=``, ``in ("train", "finetune")``) holds when ``phase`` is
    ``value``; False for any other test (not known to hold)."""
    if not (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.left, cst.Name)
        and test.left.value == phase
    ):
        return False
    operator, right = test.comparisons[0].operator, test.comparisons[0].comparator
    if isinstance(right, cst.SimpleString):
        if isinstance(operator, cst.Equal):
            return right.evaluated_value == value
        if isinstance(operator, cst.NotEqual):
            return right.evaluated_value != value
        return False
    if isinstance(right, (cst.List, cst.Tuple, cst.Set)) and isinstance(operator, cst.In):
        return any(
            isinstance(e.value, cst.SimpleString) and e.value.evaluated_value == value
            for e in right.elements
        )
    return False


def _place(found: Evaluation, facts: Facts) -> str | None:
    """Decide what is gathered; a reason when it cannot be decided safely."""
    model, statement, forward = facts.model, found.statement, found.forward
    assert statement is not None and forward is not None
    for ancestor in model.ancestors(statement):
        if ancestor is found.loop.node:
            break
        if isinstance(ancestor, (cst.If, cst.For, cst.While, cst.Try, cst.FunctionDef)):
            return "the forward pass runs under a condition: a gather there could hang"
    if len(statement.body) != 1:
        return "the forward pass shares its line with other statements"
    small = statement.body[0]
    taken = names_in_scope(model, found.loop.scope)
    if (
        isinstance(small, cst.Assign)
        and small.value is forward
        and len(assigned_targets(small)) == 1
    ):
        outputs = plain_targets(assigned_targets(small)[0])
        if outputs is None:
            return "the forward's output is not bound to plain names"
    else:
        if any(isinstance(a, _SCOPES) for a in between(model, forward, statement)):
            return "the forward pass runs inside a lambda or comprehension"
        found.extracted = fresh("outputs", taken)
        outputs = [found.extracted]
    found.outputs = outputs
    if found.extracted is not None and _reads_the_models_loss(forward, model):
        # ``loss = model(x, labels=y).loss``: the same scalar per batch as a returned loss,
        # read through a field of the output in the forward's own expression
        found.scalar_losses.append(found.extracted)
        found.scalar_losses += _plain_names_bound(small)
    later = _uses_after(found, facts)
    for output in outputs:
        if output != found.extracted and not _read_after(model, output, statement):
            # ``pred, _, _ = model(x)``: an output nothing reads after the forward needs no
            # gather (Accelerate's gather refuses the None one may be), and ``out, h = net(x,
            # h)``'s state, read only by the next forward, must stay this rank's batch's
            continue
        fields = _fields_only(later.get(output, []), model, allow_index=False)
        if output in found.scalar_losses:
            continue
        if fields is None and "loss" in output.lower():
            # ``logits, loss = model(x, y)``: the model's own loss is one scalar per batch (its
            # mean); gathered it is N values, ``loss.item()`` fails, and a mean of the ranks'
            # means is not the set's. Left this rank's: a sink reading it makes the loop unsure.
            found.scalar_losses.append(output)
            continue
        if fields is None:
            found.gathered.append(output)
        else:
            _add_fields(found, fields, taken)
    fed = {n.value for n in walk(forward) if isinstance(n, cst.Name)}
    for name in sorted(found.batch):
        uses = later.get(name, [])
        if not uses:
            continue
        # Only the fields read (``batch["labels"]``, ``batch.label``) when that is all, else
        # the whole value (``data`` compared with its reconstruction). A batch read only
        # through its attributes may be no container gather knows (a torchtext ``Batch``, a
        # ``SimpleNamespace`` from a collate_fn): gathered whole, it comes back as a list of
        # each rank's objects; its fields are tensors.
        index = name in fed and name in _whole_batches(found.loop)
        fields = _fields_only(uses, model, allow_index=index)
        if fields is None:
            found.gathered.append(name)
        else:
            _add_fields(found, fields, taken)
    tensor_batches = _reads_a_tensor_dataset(found.loop, facts)
    found.apart = [
        name
        for name in found.gathered
        if (
            _made_into_a_tensor(name, found, facts)
            if name in outputs
            else not tensor_batches and not _used_as_a_tensor(name, found.loop, facts)
        )
    ]
    return None


#: Calls that build a tensor from Python data: a value handed to one is a list or a number.
_TENSOR_BUILDERS = frozenset(
    [
        *(f"torch.{n}" for n in ("tensor", "as_tensor", "Tensor", "LongTensor", "FloatTensor")),
        *("numpy.array", "numpy.asarray"),
    ]
)


def _made_into_a_tensor(name: str, found: Evaluation, facts: Facts) -> bool:
    """The loop hands a forward's output to ``torch.tensor(...)`` (or ``np.array``): a
    predicting method that returns a list (``labels = model.decode(x)``, then
    ``torch.tensor(labels)``), also in the forward's own expression
    (``np.array(model.decode(x))``, whose output is moved out); or the method the forward
    calls is the file's and returns a list (``.tolist()``) at every return. Gathered in one
    tuple with a tensor, the pair is gathered as objects and comes back as one list, not the
    two values unpacked from it; gathered on its own, the ranks' lists are joined into one."""
    model = facts.model
    inline = name == found.extracted and found.forward is not None
    for node in walk(found.loop.node.body):
        if not (
            isinstance(node, cst.Call)
            and node.args
            and model.qualified(node.func) & _TENSOR_BUILDERS
        ):
            continue
        first = node.args[0].value
        if isinstance(first, cst.Name) and first.value == name:
            return True
        if inline and first is found.forward:
            return True
    return found.forward is not None and _runs_a_method_returning_a_list(model, found.forward)


def _runs_a_method_returning_a_list(model: ScriptModel, call: cst.Call) -> bool:
    """``call`` runs a function of the file every return of which hands back a list: a
    ``.tolist()``, a list display or a list comprehension (review10a: a ``decode`` method
    returning ``argmax(-1).tolist()``, compared with the labels in a ``zip``)."""
    target = callee(model, call)
    if target is None:
        return False
    returns = model.index.own_returns(target[0])
    return bool(returns) and all(
        isinstance(r.value, (cst.List, cst.ListComp))
        or (
            isinstance(r.value, cst.Call)
            and isinstance(r.value.func, cst.Attribute)
            and r.value.func.attr.value == "tolist"
            and not r.value.args
        )
        for r in returns
    )


def _reads_the_models_loss(forward: cst.Call, model: ScriptModel) -> bool:
    """``model(...).loss`` (``.loss``, ``.total_loss``...): a field named for a loss, read off
    the forward's output where it is made."""
    read = model.parent(forward)
    return (
        isinstance(read, cst.Attribute)
        and read.value is forward
        and "loss" in read.attr.value.lower()
    )


def _plain_names_bound(small: cst.BaseSmallStatement) -> list[str]:
    """The names ``loss = ...`` binds (none for anything but one plain assignment)."""
    if not isinstance(small, cst.Assign) or len(assigned_targets(small)) != 1:
        return []
    return plain_targets(assigned_targets(small)[0]) or []


def _reads_a_tensor_dataset(loop: Loop, facts: Facts) -> bool:
    """Every loader the loop may read is a ``DataLoader`` of a ``TensorDataset`` (made in the
    call or bound to a name first): each value of its batches is a tensor."""
    model = facts.model
    origins = facts.flow.origins(loop.iterable, loop.node)
    datasets = []
    for binding in model.bindings:
        if binding.name not in origins or not isinstance(binding.value, cst.Call):
            continue
        for construction in _loader_constructions(model, binding.value):
            datasets.append(argument_value(construction, "dataset"))
    return bool(datasets) and all(_a_tensor_dataset(d, model) for d in datasets)


def _a_tensor_dataset(value: cst.BaseExpression | None, model: ScriptModel) -> bool:
    """``TensorDataset(x, y)``, a name assigned only that, or a call of a function of this file
    that returns only that (``make_data(64, 1)``)."""
    if isinstance(value, cst.Name):
        assigned = [a.value for a in model.index.assignments_to(value.value)]
        return bool(assigned) and all(_a_tensor_dataset(v, model) for v in assigned)
    if not isinstance(value, cst.Call):
        return False
    if any(q.endswith("TensorDataset") for q in model.qualified(value.func)):
        return True
    target = callee(model, value)
    if target is None or target[0].name.value == "__init__":
        return False
    returned = [r.value for r in model.index.own_returns(target[0])]
    return bool(returned) and all(
        isinstance(r, cst.Call) and _a_tensor_dataset(r, model) for r in returned
    )


#: Methods of the Python values a batch can hold besides tensors (lists, strings): a call of
#: one says nothing about a tensor.
_SEQUENCE_METHODS = frozenset(
    [
        "append",
        "extend",
        "index",
        "count",
        "join",
        "split",
        "strip",
        "lower",
        "upper",
        "format",
        "startswith",
        "endswith",
        "replace",
        "encode",
    ]
)


def _used_as_a_tensor(name: str, loop: Loop, facts: Facts) -> bool:
    """The loop reads ``name`` as a tensor: moved (``y.to(device)``) or read through a tensor's
    attribute, in arithmetic or a comparison, indexed by more than one axis or a slice, or
    handed to torch/NumPy, the model or a loss. A batch field read none of these ways may be a
    Python list (the ids of ``for ids, x, y in loader``, only zipped with the predictions)."""
    model = facts.model
    for node in walk(loop.node.body):
        if not (isinstance(node, cst.Name) and node.value == name):
            continue
        parent = model.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            if parent.attr.value not in _SEQUENCE_METHODS:
                return True
        elif isinstance(
            parent, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.ComparisonTarget)
        ):
            return True
        elif isinstance(parent, cst.Subscript) and parent.value is node:
            if len(parent.slice) > 1 or isinstance(parent.slice[0].slice, cst.Slice):
                return True
        elif isinstance(parent, cst.Arg) and (
            _tensor_call(model.parent(parent), facts)
            or _appended_to_joined_tensors(parent, loop, facts)  # then ``torch.cat`` of them
        ):
            return True
    return False


#: torch's calls that join a list of tensors: a list of lists makes them raise.
_TENSOR_JOINS = frozenset(
    f"torch.{name}" for name in ("cat", "concat", "concatenate", "stack", "vstack", "hstack")
)


def _appended_to_joined_tensors(argument: cst.Arg, loop: Loop, facts: Facts) -> bool:
    """``targets.append(y)`` in the loop, and ``torch.cat(targets)`` (or ``torch.stack``) in
    the same function: each appended value is a tensor, since torch joins nothing else."""
    model = facts.model
    call = model.parent(argument)
    if not (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "append"
        and isinstance(call.func.value, cst.Name)
        and len(call.args) == 1
    ):
        return False
    listed = call.func.value.value
    scope = facts.placement.enclosing_function(loop.node) or model.module
    return _handed_first(listed, scope, _TENSOR_JOINS, model)


def _handed_first(
    name: str, within: cst.CSTNode, functions: set[str] | frozenset[str], model: ScriptModel
) -> bool:
    """A call in ``within`` of one of ``functions`` (qualified names) is handed the name
    ``name`` as its first argument: ``torch.tensor(labels)``, ``torch.cat(preds)``."""
    return any(
        isinstance(node, cst.Call)
        and node.args
        and isinstance(node.args[0].value, cst.Name)
        and node.args[0].value.value == name
        and model.qualified(node.func) & functions
        for node in walk(within)
    )


def _tensor_call(call: cst.CSTNode | None, facts: Facts) -> bool:
    """A call that takes tensors: torch's or NumPy's, a model's, a loss's."""
    if not isinstance(call, cst.Call):
        return False
    qualified = facts.model.qualified(call.func)
    if any(q.split(".")[0] in ("torch", "numpy") for q in qualified):
        return True
    name = (dotted(call.func) or "").lower()
    return any(k in name for k in _MEAN_CALLS) or facts.flow.is_forward(call)


def _per_rank_reshape(found: Evaluation, facts: Facts) -> cst.Call | None:
    """``recon.view(args.batch_size, 1, 28, 28)`` after the gather: the gathered tensor holds
    every rank's batch, so a reshape to one rank's batch size would fail."""
    model, statement = facts.model, found.statement
    assert statement is not None
    gathered = set(found.gathered)
    for node in walk(found.loop.node.body):
        if not (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in RESHAPES
            and model.line(node) > model.line(statement)
            and variables_in(model, node.func.value) & gathered
        ):
            continue
        sizes = {dotted(n) or "" for n in walk(node) if isinstance(n, (cst.Name, cst.Attribute))}
        if any(size.rsplit(".", 1)[-1].lower() in BATCH_SIZE_NAMES for size in sizes):
            return node
    return None


def _gather_for_the_metrics_only(found: Evaluation, facts: Facts, reshape: cst.Call) -> str | None:
    """The reshape to one rank's batch size (``save_image(recon.view(args.batch_size, ...))``
    of the first batch) does not feed the metrics: the gathered values go under new names that
    only the metrics and the statements computing them read, and everything else keeps this
    rank's batch. When the reshape feeds a metric, or reads what the metrics' statements
    compute, the loop cannot be split so: the reason."""
    model = facts.model
    assert isinstance(reshape.func, cst.Attribute)
    reshaped = ", ".join(sorted(variables_in(model, reshape.func.value) & set(found.gathered)))
    reason = (
        f"line {model.line(reshape)} reshapes {reshaped} to the batch size, which a gathered "
        "tensor (every rank's batch) does not have"
    )
    if found.extracted is not None:
        return reason
    metric_statements = _metric_statements(found, facts)
    reshaping = next(
        small for small in statements(found.loop.node.body) if within(model, reshape, small)
    )
    computed = {name for small in metric_statements for name in bound_by(small)}
    reads = names_read(reshaping, set(), model, found.loop)
    if reshaping in metric_statements or reads & computed:
        return reason
    taken = names_in_scope(model, found.loop.scope) | {f.name for f in found.fields}
    later = _uses_after(found, facts)
    for name in found.gathered:
        uses: list[cst.CSTNode] = [
            use
            for use in later.get(name, [])
            if any(within(model, use, s) for s in metric_statements)
        ]
        if uses:
            found.fields.append(GatheredField(fresh(f"{name}_all", taken), name, uses))
    found.gathered = []
    found.kept_local = reshape
    return None


def _metric_statements(found: Evaluation, facts: Facts) -> list[cst.CSTNode]:
    """The sinks and the statements after the forward whose values they read, transitively."""
    model, statement = facts.model, found.statement
    assert statement is not None
    after = [
        small
        for small in statements(found.loop.node.body)
        if model.order(small) > model.order(statement) and small not in statement.body
    ]
    chosen = [small for small in after if small in found.sinks]
    needed: set[str] = set()
    grown = True
    while grown:
        grown = False
        for small in chosen:
            needed |= names_read(small, set(), model, found.loop)
        for small in after:
            if small not in chosen and bound_by(small) & needed:
                chosen.append(small)
                grown = True
    return chosen


def _check_sinks(found: Evaluation, body: list[cst.CSTNode], facts: Facts) -> str | None:
    """Every sink must read only gathered values (or values computed from them)."""
    model = facts.model
    per_rank = set(found.batch)
    # Read through a gathered field, or inside the forward that moves out of its statement:
    # not reads of the per-rank names they mention.
    replaced = {id(use) for f in found.fields for use in f.uses}
    if found.extracted is not None and found.forward is not None:
        replaced.add(id(found.forward))
    gathered_after = set(found.gathered) | {f.name for f in found.fields}
    counted = _step_counters(found.loop)
    seen_forward = False
    for small in body:
        reads = names_read(small, replaced, model, found.loop)
        if small in found.sinks and _stores_at(small, counted):
            found.unsure_at = small
            found.advice = (
                "collect each batch's values in a list, gather them with "
                "accelerator.gather_for_metrics, and concatenate them after the loop"
            )
            counter = ", ".join(sorted(_stores_at(small, counted)))
            return (
                f"line {model.line(small)} stores the batch's values at a position computed "
                f"from the step count ({counter}): prepared, step {counter} of each rank is "
                "another batch of the set, and gathered, it holds N batches, so the positions "
                "would not match the samples"
            )
        if reads & counted:
            counted |= bound_by(small)
        is_forward = found.statement is not None and found.statement.body[0] is small
        if is_forward:
            seen_forward = True
            per_rank -= gathered_after
            # An output read through a field that is not gathered (``outputs.loss``) is this
            # rank's; the gathered fields' uses are skipped above.
            per_rank |= set(found.outputs) - set(found.gathered)
            if found.extracted is None:
                continue
        if small in found.sinks:
            bad = reads & per_rank
            if bad or not seen_forward:
                found.unsure_at = small
                line = model.line(small)
                if not seen_forward:
                    carried = _carried_into_the_forward(small, found, model)
                    if carried is not None:
                        return (
                            f"line {line} carries {carried} from one batch to the next into the "
                            "forward pass (a recurrent state, not a metric): gathered with the "
                            "outputs it would no longer match this rank's batch"
                        )
                    return f"the metric at line {line} is taken before the forward pass"
                scalar = sorted(bad & set(found.scalar_losses))
                if scalar:
                    found.advice = (
                        "compute the loss from the gathered outputs and labels, or total it over "
                        "this rank's samples (a batch mean times the batch size) and reduce the "
                        "totals across ranks"
                    )
                    return (
                        f"the metric at line {line} reads {', '.join(scalar)}, a loss the "
                        "forward pass returns: one scalar per batch, computed from this rank's "
                        "batch alone (a mean or a total), which gather_for_metrics cannot turn "
                        "into per-sample values"
                    )
                return (
                    f"the metric at line {line} reads {', '.join(sorted(bad))}, this rank's alone"
                )
            continue
        bound = bound_by(small)
        forward = found.forward if is_forward else None
        if reads & per_rank or _calls_a_model(small, facts, forward):
            per_rank |= bound
        else:
            per_rank -= bound
        if is_forward:  # ``loss = model(x, labels=y).loss``: stays this rank's scalar
            per_rank |= bound & set(found.scalar_losses)
    return None


def _step_counters(loop: Loop) -> set[str]:
    """The count ``enumerate`` hands the loop (``for i, (x, y) in enumerate(loader)``, also
    through a bar): the step's number on this rank, not a position in the set once each rank
    reads its own shard. None for a loop that is no ``for`` (a helper's body stands for one)."""
    if not isinstance(loop.node, cst.For):
        return set()
    sources = [loop.node.iter] + ([loop.through] if loop.through is not None else [])
    if any(enumerates(source) for source in sources):
        return first_enumerate_name(loop.node.target)
    return set()


def _last_indices(loop: Loop) -> set[str]:
    """`_step_counters` of an ``enumerate`` that counts from 0: after the loop its index is the
    batches less one. Counted from 1 (``enumerate(loader, start=1)``) it is the loop's count
    of batches, a divisor in proportion with the steps taken, as ``len(loader)`` is
    (`shard_totals.averaged_over_batches` reads it so; review10a e1: it was said to be one
    less)."""
    return _step_counters(loop) if enumerate_start(loop) == 0 else set()


def _stores_at(sink: cst.CSTNode, counted: set[str]) -> set[str]:
    """The step counts (``counted``) that the position ``sink`` stores at reads:
    ``preds[i * bs : i * bs + len(out)] = out`` reads ``i``."""
    if not (isinstance(sink, cst.Assign) and len(assigned_targets(sink)) == 1):
        return set()
    written = assigned_targets(sink)[0]
    if not isinstance(written, cst.Subscript) or not counted:
        return set()
    read = {n.value for element in written.slice for n in walk(element) if isinstance(n, cst.Name)}
    return read & counted


def _sums_added(
    found: Evaluation, attributes: bool = False
) -> Iterator[tuple[cst.CSTNode, cst.AugAssign]]:
    """The evaluation's sinks that add to a plain name (``val_loss += ...``), with their
    statements; with ``attributes``, to something the instance holds instead
    (``self.validation_loss += ...``, ``self.stats.validation_loss``,
    ``self.history["validation_loss"]``)."""
    for sink in found.sinks:
        statement = sink.body[0] if isinstance(sink, cst.SimpleStatementLine) else sink
        if not (
            isinstance(statement, cst.AugAssign) and isinstance(statement.operator, cst.AddAssign)
        ):
            continue
        target = statement.target
        on_the_instance = (
            isinstance(target, (cst.Attribute, cst.Subscript)) and root_name(target) == "self"
        )
        if on_the_instance if attributes else isinstance(target, cst.Name):
            yield sink, statement


def _means_added(statement: cst.AugAssign, means: set[str], model: ScriptModel) -> list[str]:
    """The batch means ``statement`` adds: names bound to one (`_batch_means`), else the loss
    added as it is computed (``val_loss += criterion(output, target).item()``), spelled as in
    the code; not a call of a function of the file (it may sum)."""
    read = {n.value for n in walk(statement.value) if isinstance(n, cst.Name)}
    return sorted(read & means) or [
        model.module.code_for_node(call)
        for call in _added_batch_means(statement.value, model)
        if dotted(call.func) not in model.functions
    ]


def _sums_batch_means_on_the_instance(
    found: Evaluation, body: list[cst.CSTNode], facts: Facts
) -> str | None:
    """``self.validation_loss += loss.item()`` of a batch's mean, where nothing in the file
    divides ``validation_loss`` (a trainer's ``_validation_step`` whose callback prints the
    attribute as it is): as for a local total (`_sums_batch_means`), the gathered sum covers
    N times fewer batches and reads about 1/N of one process's value."""
    model = facts.model
    means = _batch_means(body, model)
    for sink, statement in _sums_added(found, attributes=True):
        mean = _means_added(statement, means, model)
        if not mean or _divided_as_added(statement.value):
            continue
        target = statement.target
        total = model.module.code_for_node(target)
        if averaged_over_batches(model, facts.placement, found.loop, total) is not None:
            continue  # ``self.loss /= len(loader)`` after the loop: the batches it read
        found.unsure_at = sink
        found.advice = (
            f"divide {total} by the number of batches (len of the loader) or sum each "
            "batch's loss times its size and divide by the samples counted"
        )
        # Divided elsewhere (a callback's ``/ len(val_loader)`` of main's loader as it is,
        # ``/ 4``, ``/= len(loader.dataset)``): not by the batches this rank's loop read, so
        # the quotient of the gathered sum would still read about 1/N of the value.
        direct = isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)
        if not direct:  # ``self.stats.loss``, ``self.history["loss"]``: not followed further
            how = "is not divided by the batches this loop reads"
        elif _attribute_divided(model.module, target.attr.value):
            how = "is divided only by a count other than the batches this loop reads"
        else:
            how = "is never divided by a count"
        return (
            f"the metric at line {model.line(sink)} sums {mean[0]}, one batch's mean, and "
            f"{total} {how}: gathered, each step holds every rank's batch, so the sum would "
            "cover N times fewer batches"
        )
    return None


def _attribute_divided(module: cst.Module, attribute: str) -> bool:
    """An attribute of that name (of any object: ``trainer.validation_loss`` in a callback) is
    divided somewhere in the file, or handed to a mean: only to word the review line, since the
    divisor is not judged here."""
    for node in walk(module):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
            read = node.left
        elif isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign):
            read = node.target
        elif isinstance(node, cst.Call) and (dotted(node.func) or "").endswith("mean"):
            read = node
        else:
            continue
        if any(isinstance(n, cst.Attribute) and n.attr.value == attribute for n in walk(read)):
            return True
    return False


def _sums_batch_means(found: Evaluation, body: list[cst.CSTNode], facts: Facts) -> str | None:
    """``epoch_loss += loss`` where ``loss = criterion(output, trg)`` is one batch's mean, and
    nothing in the function ever divides ``epoch_loss`` (by ``len(loader)``, a counter): the
    total counts batches. Gathered, each iteration holds every rank's batch, so there are N
    times fewer of them and the sum shrinks with N (liuc-v/NMT's ``valid()``). So does a sum of
    means divided by the whole set's size (``valid_loss / len(valid_loader.sampler)``, a DPOD
    trainer): it counts batches over samples, and only a sum weighted by each batch's size
    (``loss.item() * x.size(0)``) is the whole set's total once gathered."""
    model = facts.model
    means = _batch_means(body, model)
    scope = model.scope_of(found.loop.node)
    for sink, statement in _sums_added(found):
        mean = _means_added(statement, means, model)
        total = statement.target.value
        summed = _summed_over_the_batch(statement.value)
        averaged = (
            averaged_over_batches(model, facts.placement, found.loop, total) if summed else None
        )
        if summed is not None and averaged is not None:
            # ``total += t_loss.sum().item()`` then ``total /= len(loader)``: the batch's values
            # summed whole (a loss per sample, ``size_average=False``) are one batch's total
            # whatever the call is named, and their mean over this rank's batches is no
            # whole-set number once gathered; undivided, such a sum is asked about as before
            return _totals_averaged_over_batches(
                found, sink, summed, total, averaged, facts, listed=False, summed_whole=True
            )
        if not mean:
            # ``total += criterion(model(x), y).item() * len(y)``: a loss call's batch total
            called = _weighted_mean(statement.value, set(), model)
            averaged = (
                averaged_over_batches(model, facts.placement, found.loop, total)
                if called is not None
                else None
            )
            if averaged is not None:
                return _totals_averaged_over_batches(
                    found, sink, called, total, averaged, facts, listed=False
                )
            if _batch_fraction(statement.value, found.loop.iterable) is not None:
                continue  # a batch's accuracy: gathered, with the caveat of `_fraction_caveat`
            averaged = averaged_over_batches(model, facts.placement, found.loop, total)
            if averaged is not None:
                return _values_averaged_over_batches(found, sink, statement, total, averaged, facts)
            continue
        if _divided_as_added(statement.value):
            continue
        by_index = _divided_by_the_last_index(scope, total, _last_indices(found.loop))
        if by_index is not None:
            index = by_index.value
            loader = found.loop.iterable or "the loader"
            found.unsure_at = sink
            found.unsure_differs_on_n_ranks = True
            found.advice = (
                f"divide {total} by len({loader}), the steps each rank takes (as many as the "
                f"gathered steps), for the mean of the batches' means; {index} is one less"
            )
            return (
                f"the metric at line {model.line(sink)} sums {mean[0]}, one batch's mean, and "
                f"line {model.line(by_index)} divides {total} by {index}, the last index "
                "enumerate handed the loop (its batches less one): on N ranks each rank takes "
                "N times fewer steps, so the quotient changes with N"
            )
        if not _divided(scope, total):
            found.unsure_at = sink
            found.advice = (
                f"divide {total} by the number of batches (len of the loader) or sum each "
                "batch's loss times its size and divide by the samples counted"
            )
            return (
                f"the metric at line {model.line(sink)} sums {mean[0]}, one batch's mean, and "
                f"{total} is never divided by a count: gathered, each step holds every rank's "
                "batch, so the sum would cover N times fewer batches"
            )
        weighted = _weighted_by_batch_size(statement.value)
        averaged = (
            averaged_over_batches(model, facts.placement, found.loop, total) if weighted else None
        )
        if averaged is not None:
            return _totals_averaged_over_batches(
                found, sink, mean[0], total, averaged, facts, listed=False
            )
        over_set = _over_the_set(found.loop, total, body, facts)
        if over_set is not None and not weighted:
            found.unsure_at = sink
            found.advice = (
                f"sum each batch's loss times its size ({mean[0]}.item() * x.size(0)) to divide "
                f"by a count of samples, or divide {total} by the number of batches (len of the "
                "loader)"
            )
            return (
                f"the metric at line {model.line(sink)} sums {mean[0]}, one batch's mean, and "
                f"{over_set}: gathered, each step holds every rank's batch, so the sum would "
                "cover N times fewer batches and the quotient would read about 1/N of the value"
            )
    return None


def _lists_batch_means(found: Evaluation, body: list[cst.CSTNode], facts: Facts) -> str | None:
    """``losses.append(loss.item())`` where ``loss = criterion(logits, labels)`` is one batch's
    mean, for ``math.exp(sum(losses) / len(losses))`` or ``np.mean(losses)`` after the loop.
    Gathered, the loss is computed again on each step's N merged batches: the list holds N
    times fewer values, each a mean with other weights (the tokens an ``ignore_index`` leaves
    out, a short last batch), so whatever is made of it differs from one process's number. A
    batch's mean times its size (``loss.item() * x.size(0)``) is the batch's total, and is not
    asked about."""
    model = facts.model
    means = _batch_means(body, model)
    for sink in found.sinks:
        statement = sink.body[0] if isinstance(sink, cst.SimpleStatementLine) else sink
        if not (
            isinstance(statement, cst.Expr)
            and isinstance(statement.value, cst.Call)
            and isinstance(statement.value.func, cst.Attribute)
            and statement.value.func.attr.value == "append"
            and len(statement.value.args) == 1
        ):
            continue
        value = _unwrapped(statement.value.args[0].value)
        listed = model.module.code_for_node(statement.value.func.value)
        weighted = _weighted_mean(value, means, model)
        if weighted is not None:
            averaged = averaged_over_batches(
                model, facts.placement, found.loop, listed
            ) or _handed_back(found.loop, listed)
            if averaged is None:
                continue  # batch totals summed: the whole set's total once gathered
            return _totals_averaged_over_batches(
                found, sink, weighted, listed, averaged, facts, listed=True
            )
        if isinstance(value, cst.Name) and value.value in means:
            mean = value.value
        elif _a_loss_call(value, model):
            mean = model.module.code_for_node(value)
        else:
            continue
        found.unsure_at = sink
        found.advice = (
            f"prepare the loader and extend {listed} with each batch's value from every rank, "
            f"in order ({listed}.extend(accelerator.gather({mean}.detach()[None]).tolist())): "
            "the mean is then one process's when the set splits into equal batches, a multiple "
            "of N of them"
        )
        return (
            f"the metric at line {model.line(sink)} appends {mean}, one batch's mean, to "
            f"{listed}: gathered, the loss would be computed on each step's N merged batches, "
            "so the list would hold N times fewer values, each weighted otherwise (padding "
            "ignored, a short last batch), and a mean over it would differ from one process's"
        )
    return None


def _a_loss_call(value: cst.BaseExpression, model: ScriptModel) -> bool:
    """``criterion(output, target)``: one batch's mean computed where it is used (not by a
    function of the file, which may sum)."""
    return (
        isinstance(value, cst.Call)
        and bool(_added_batch_means(value, model))
        and dotted(value.func) not in model.functions
    )


def _summed_over_the_batch(value: cst.BaseExpression) -> str | None:
    """``t_loss.sum().item()`` (or ``torch.sum(t_loss)``): a batch's values summed whole, over
    every sample it holds (no ``dim``), the batch's total. What is summed, as the code spells
    it, or None."""
    value = _unwrapped(value)
    if not isinstance(value, cst.Call):
        return None
    if (
        isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "sum"
        and not value.args
        and isinstance(value.func.value, (cst.Name, cst.Attribute))
    ):
        return dotted(value.func.value)
    if dotted(value.func) == "torch.sum" and len(value.args) == 1 and value.args[0].keyword is None:
        return dotted(value.args[0].value)
    return None


def _weighted_mean(value: cst.BaseExpression, means: set[str], model: ScriptModel) -> str | None:
    """``loss.item() * x.size(0)`` (or ``len(y) * criterion(out, y)``): one batch's mean times
    its sample count, the batch's total. The mean as the code spells it, or None."""
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply)):
        return None
    for factor, other in ((value.left, value.right), (value.right, value.left)):
        if not _batch_size(other):
            continue
        mean = _unwrapped(factor)
        if isinstance(mean, cst.Name) and mean.value in means:
            return mean.value
        if _a_loss_call(mean, model):
            return model.module.code_for_node(mean)
    return None


def _caveat_batch_means_over_batches(
    found: Evaluation, body: list[cst.CSTNode], facts: Facts
) -> None:
    """``test_loss += criterion(out, y).item()`` then ``test_loss /= len(test_loader)`` (or
    each mean added already divided, ``loss.item() / len(loader)``): the mean of the batches'
    means. Gathered, each step's loss is the mean of N ranks' batches merged, and the last step
    holds fewer samples than the others (the padding dropped), yet counts as much: the number is
    the whole set's mean only when every merged batch is full (the set's size a multiple of the
    batch size times N), which no number in the file proves (a PointNet test loop, batches of
    one, 13 samples on 2 ranks). The gather stays (the counts beside it are exact) and this is
    said on a review line, with the sum that is exact on any number of ranks."""
    loop = found.loop
    model = facts.model
    means = _batch_means(body, model)
    for sink, statement in _sums_added(found):
        value = statement.value
        counted = _batch_fraction(value, loop.iterable)
        if counted is not None:
            averaged = averaged_over_batches(model, facts.placement, loop, statement.target.value)
            if averaged is not None:
                found.caveat_at = sink
                found.caveat = _fraction_caveat(
                    model, statement, counted, averaged, loop.iterable or "the loader"
                )
                return
            continue
        over = value.right if _divided_as_added(value) else None  # type: ignore[attr-defined]
        added = value.left if over is not None else value  # type: ignore[attr-defined]
        read = {n.value for n in walk(added) if isinstance(n, cst.Name)}
        mean = sorted(read & means) or [
            model.module.code_for_node(call)
            for call in _added_batch_means(added, model)
            if dotted(call.func) not in model.functions
        ]
        if not mean or _weighted_by_batch_size(added) or _summed_over_the_batch(added):
            continue
        total = statement.target.value
        if over is not None:
            if not is_len_of(over, loop.iterable):
                continue
            averaged: cst.CSTNode | None = statement
        else:
            averaged = averaged_over_batches(model, facts.placement, loop, total)
        if averaged is None:
            continue
        loader = loop.iterable or "the loader"
        unwrapped = _unwrapped(added)
        direct = bool(_added_batch_means(added, model)) or (
            isinstance(unwrapped, cst.Name) and unwrapped.value in means
        )
        found.caveat_at = sink
        if direct:
            found.caveat = (
                f"{total} sums {mean[0]}, one batch's mean, and line {model.line(averaged)} "
                "averages it over the batches: gathered, each step's mean covers N ranks' "
                "batches and the last step fewer samples than the others while counting as "
                "much, so on N ranks the number is the whole set's mean only when the set "
                "splits into full batches on every rank; for the exact mean add "
                f"{mean[0]} times the batch's count of samples to {total} and divide it by "
                f"len({loader}.dataset)"
            )
        else:
            found.caveat = (
                f"{total} sums {model.module.code_for_node(added)}, a function of {mean[0]}, "
                f"one batch's mean, and line {model.line(averaged)} averages it over the "
                f"batches: gathered, {mean[0]} is the mean of N ranks' batches merged, and "
                "the average of the function over the merged batches differs from one "
                "process's over its own; for one process's number on any count of ranks, "
                "compute the value per sample, gather those and average them"
            )
        return


#: calls that count or sum what a batch holds: the numerator of a batch's fraction
_COUNTS = frozenset({"sum", "count_nonzero"})


def _batch_fraction(value: cst.BaseExpression, loader: str | None) -> cst.BaseExpression | None:
    """``np.sum(pred == labels) / len(labels)``, ``(pred == y).sum().item() / y.size(0)``: what
    the batch counts (its correct predictions) over its own count of samples, one batch's mean
    spelled as a division (a classifier's per-batch accuracy). The count, or None. A division by
    ``len(loader)`` (the count of batches) or ``len(loader.dataset)`` is no batch's size."""
    value = _unwrapped(value)
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide)):
        return None
    if not _batch_size(value.right) or is_len_of(value.right, loader):
        return None
    right = value.right
    counted = right.args[0].value if isinstance(right, cst.Call) and right.args else None
    if counted is not None and (dotted(counted) or "").endswith((".dataset", ".sampler")):
        return None  # ``correct / len(loader.dataset)``: the whole set's share, exact
    counts = any(
        isinstance(node, cst.Call)
        and (
            (isinstance(node.func, cst.Attribute) and node.func.attr.value in _COUNTS)
            or (dotted(node.func) or "").rsplit(".", 1)[-1] in _COUNTS
        )
        for node in walk(value.left)
    )
    return value.left if counts else None


def _fraction_caveat(
    model: ScriptModel,
    statement: cst.AugAssign,
    counted: cst.BaseExpression,
    averaged: cst.CSTNode,
    loader: str,
) -> str:
    """The review for each batch's fraction summed and averaged over the batches: like a batch's
    mean loss (`_caveat_batch_means_over_batches`), exact on N ranks only when every merged
    batch is full."""
    total = statement.target.value
    added = model.module.code_for_node(statement.value)
    return (
        f"{total} sums {added}, one batch's fraction of its samples, and line "
        f"{model.line(averaged)} averages it over the batches: gathered, each step's fraction "
        "covers N ranks' batches and the last step fewer samples than the others while counting "
        "as much, so on N ranks the number is the whole set's fraction only when the set splits "
        f"into full batches on every rank; for the exact number add "
        f"{model.module.code_for_node(counted)} to {total} and divide it by len({loader}.dataset)"
    )


def _values_averaged_over_batches(
    found: Evaluation,
    sink: cst.CSTNode,
    statement: cst.AugAssign,
    total: str,
    averaged: cst.CSTNode,
    facts: Facts,
) -> str:
    """``acc += accuracy(prob, y)[0].item()`` then ``acc / cnt`` with ``cnt += 1`` a batch: one
    value per batch of a kind the analysis cannot tell (a helper of another module: a batch's
    percentage, its count), averaged over the batches this rank read. Whatever the value is,
    gathered each step's value is computed on N merged batches and there are N times fewer of
    them, so the mean is not one process's (a mean of batch means weighs the short last batch
    as much as a full one, the merged steps do not): left as it is (pseudo-labelling's
    ``validate()`` showed 3.125 for 3.571 on 2 ranks)."""
    model = facts.model
    found.unsure_at = sink
    found.advice = (
        f"build {total} from totals that add up across batches (correct predictions, summed "
        "errors, samples) and divide them after the loop: gathered, those are the whole set's"
    )
    value = model.module.code_for_node(statement.value).strip()
    return (
        f"the metric at line {model.line(sink)} adds {value}, one value per batch, to {total}, "
        f"and line {model.line(averaged)} averages it over the batches "
        f"({model.module.code_for_node(averaged).strip()}): gathered, each step's value would "
        "be computed on N merged batches and there would be N times fewer of them, so the mean "
        "would differ from one process's"
    )


def _totals_averaged_over_batches(
    found: Evaluation,
    sink: cst.CSTNode,
    mean: str,
    total: str,
    averaged: cst.CSTNode,
    facts: Facts,
    *,
    listed: bool,
    summed_whole: bool = False,
) -> str:
    """The reason (and advice) for batch totals (``loss.item() * x.size(0)``, or, with
    ``summed_whole``, ``per_sample.sum().item()``) that the code averages over the batches it read
    (``np.mean(losses)``, ``total / len(loader)``): gathered, each step's value covers N
    batches and there are N times fewer steps, so the mean reads about N times one process's
    number."""
    model = facts.model
    found.unsure_at = sink
    summed = f"sum({total})" if listed else total
    found.advice = (
        f"divide {summed} by the number of samples (len of the loader's dataset), which "
        "gathered is the whole set's mean loss"
    )
    how = (
        "hands it back to the callers, who may average it over the batches"
        if isinstance(averaged, cst.Return)
        else "averages it over the batches"
    )
    folded = (
        f"the sum of {mean} over the batch" if summed_whole else f"{mean} times the batch's size"
    )
    return (
        f"the metric at line {model.line(sink)} folds {folded}, one "
        f"batch's total, into {total}, and line {model.line(averaged)} {how} "
        f"({model.module.code_for_node(averaged).strip()}): gathered, each step would hold N "
        "batches, so there would be N times fewer totals, each N times larger, and a mean over "
        "the batches would read about N times one process's value"
    )


def _weighs_token_means(found: Evaluation, body: list[cst.CSTNode], facts: Facts) -> str | None:
    """``val_loss += loss.item() * x.size(0)`` where ``loss`` is a mean over the batch's tokens
    (`_over_tokens`): one process weighs each batch's token mean by its samples; gathered, the
    loss of N merged batches weighs each batch by its tokens instead, and the total differs
    (exact only for a per-sample loss)."""
    model = facts.model
    means = _batch_means(body, model)
    for sink, statement in _sums_added(found):
        mean = _weighted_mean(statement.value, means, model)
        tokens = _over_tokens(mean, body, facts) if mean is not None else None
        if tokens is None:
            continue
        total = statement.target.value
        found.unsure_at = sink
        found.advice = (
            f"sum the loss over the tokens (reduction='sum') into {total} and count the tokens "
            "it covers ((labels != ignore_index).sum()), and divide the two totals"
        )
        return (
            f"the metric at line {model.line(sink)} weighs {mean} by the batch's size, but "
            f"{mean} is a mean over the batch's tokens ({tokens}): gathered, it would be the "
            "mean over the tokens of N merged batches, which weighs each batch by its tokens, "
            "not its samples, so the total would differ from one process's"
        )
    return None


#: reshapes that lay a batch's tokens out as one list: ``logits.view(-1, vocab)``
_FLATTENING = ("view", "reshape", "flatten")


def _over_tokens(mean: str, body: list[cst.CSTNode], facts: Facts) -> str | None:
    """How the loss ``mean`` (a name the loop binds to a loss call, or the call's code)
    averages over tokens rather than samples: a loss built with ``ignore_index``
    (``nn.CrossEntropyLoss(ignore_index=pad)``, ``F.cross_entropy(..., ignore_index=pad)``)
    counts only the tokens it does not ignore, and one handed logits laid out flat
    (``logits.view(-1, vocab)``, ``.flatten(0, 1)``) counts every token. None for a
    per-sample loss. The loss object is followed to where it is made (a helper's
    ``criterion`` parameter to the caller's name)."""
    model = facts.model
    calls = [
        node.value
        for small in body
        for node in walk(small)
        if isinstance(node, cst.Assign)
        and isinstance(node.value, cst.Call)
        and any(dotted(t) == mean for t in assigned_targets(node))
    ] + [
        node
        for small in body
        for node in walk(small)
        if isinstance(node, cst.Call) and model.module.code_for_node(node) == mean
    ]
    for call in calls:
        func = dotted(call.func) or ""
        made = [
            assignment.value
            for name in {func, facts.flow.outer_name(func, call) or func}
            for assignment in model.index.assignments_to(name)
            if isinstance(assignment.value, cst.Call)
        ]
        for built in [call, *made]:
            if keyword_value(built, "ignore_index") is not None:
                return f"{model.module.code_for_node(built.func)} with ignore_index"
        for argument in call.args:
            for node in walk(argument.value):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in _FLATTENING
                    and (
                        node.func.attr.value == "flatten"
                        or (
                            len(node.args) == 2  # ``(-1, vocab)``: [batch, tokens] made one
                            and model.module.code_for_node(node.args[0].value) == "-1"
                        )
                    )
                ):
                    return f"handed {model.module.code_for_node(node)}, laid out by token"
    return None


def _handed_back(loop: Loop, listed: str) -> cst.Return | None:
    """The ``return`` of the loop's function that hands ``listed`` back as it is (``return
    losses``, ``return losses, acc``): what the callers make of it is out of sight."""
    if not isinstance(loop.scope, cst.FunctionDef):
        return None
    for node in statement_lines(loop.scope.body):
        returned = node.body[0] if node.body else None
        if not isinstance(returned, cst.Return) or returned.value is None:
            continue
        value = returned.value
        parts = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        if any(dotted(part) == listed for part in parts):
            return returned
    return None


def _unwrapped(value: cst.BaseExpression) -> cst.BaseExpression:
    """``value`` read through ``.item()``, ``.detach()``, ``.cpu()``, ``.numpy()``, ``float()``."""
    while True:
        if isinstance(value, cst.Call) and dotted(value.func) == "float" and len(value.args) == 1:
            value = value.args[0].value
        elif (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("item", "detach", "cpu", "numpy")
            and not value.args
        ):
            value = value.func.value
        else:
            return value


def _added_batch_means(value: cst.BaseExpression, model: ScriptModel) -> list[cst.Call]:
    """The loss calls ``value`` adds as they are (``criterion(output, target)`` of
    ``criterion(output, target).item()``), read through ``.item()``, ``.detach()``,
    ``float()`` and a constant weight; none where the value is anything else."""
    value = _unwrapped(value)
    if isinstance(value, cst.Call) and _a_batch_mean(value, set(), model):
        return [value]
    return []


def _over_the_set(loop: Loop, total: str, body: list[cst.CSTNode], facts: Facts) -> str | None:
    """What ``total`` is divided by when that counts samples, not batches: the size of the
    whole set ``loop``'s loader reads (``len(loader.dataset)``, ``len(loader.sampler)``, a size
    the callers pass) or a count the loop sums by batch sizes (``seen += y.size(0)``)."""
    counted = frozenset(
        node.target.value
        for small in body
        for node in walk(small)
        if isinstance(node, cst.AugAssign)
        and isinstance(node.operator, cst.AddAssign)
        and isinstance(node.target, cst.Name)
        and _batch_size(node.value)
    )
    model = facts.model
    divisions = divided_by_set_size(model, facts.placement, facts.calls, loop, {total}, counted)
    if not divisions:
        return None
    division = divisions[0]
    return (
        f"line {model.line(division.division)} divides {total} by "
        f"{model.module.code_for_node(division.divisor)}, a count of samples"
    )


def _weighted_by_batch_size(value: cst.BaseExpression) -> bool:
    """``loss.item() * x.size(0)``, ``len(y) * loss``: a batch's mean times its sample count,
    the batch's total."""
    return any(
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Multiply)
        and (_batch_size(node.left) or _batch_size(node.right))
        for node in walk(value)
    )


def _scalar_of_a_gathered_value(
    found: Evaluation, body: list[cst.CSTNode], facts: Facts
) -> str | None:
    """``predictions.append(output.item())`` after the forward of a loader with
    ``batch_size=1``: one sample's value on one process, but gathered the tensor holds one
    per rank and ``.item()`` (or ``float(output)``) raises on every rank. Only a gathered
    tensor itself is asked about, or one reshaped or moved from it (``output =
    model(x).squeeze()``, ``p = output.cpu()``): ``(pred == y).sum().item()`` and a loss are
    reduced first and stay one number. Left as it is: the loop evaluates the whole set on every
    rank."""
    model = facts.model
    hit = _gathered_read(found, body, model, _taken_as_a_number)
    if hit is None:
        return None
    small, node, read = hit
    found.unsure_at = small
    found.advice = (
        "gather with accelerator.gather_for_metrics, then take per-sample values with "
        ".tolist() (not .item())"
    )
    return (
        f"line {model.line(small)} takes {model.module.code_for_node(read)} as one "
        f"number ({model.module.code_for_node(node)}): gathered, it holds one value per "
        "rank and that would raise"
    )


def _squeezed_to_one_sample(found: Evaluation, body: list[cst.CSTNode], facts: Facts) -> str | None:
    """``sr_img = ToPILImage()(sr.cpu().squeeze())`` after the forward of a loader with
    ``batch_size=1`` (an SRResNet validation loop): ``.squeeze()`` drops the batch's axis of
    one sample, and what follows treats the result as one image (PIL conversion, a PSNR, one
    file per step). Gathered, each step holds one image per rank: the squeeze keeps the
    batch's axis and the per-image code raises, or measures N images as one. Left as it is:
    the loop evaluates the whole set on every rank."""
    model = facts.model
    if not _batches_of_one(found.loop, model):
        return None
    hit = _gathered_read(found, body, model, _squeezed)
    if hit is None:
        return None
    small, node, read = hit
    found.unsure_at = small
    found.advice = (
        "compute the per-image metric on every rank as one value per sample (a tensor of "
        "shape [batch]), gather those with accelerator.gather_for_metrics and average them"
    )
    return (
        f"line {model.line(small)} squeezes {model.module.code_for_node(read)} to one "
        f"sample ({model.module.code_for_node(node)}) of a loader whose batches may be one "
        "sample each, and "
        "treats it as one image: gathered, a step holds one sample per rank, the squeeze "
        "keeps the batch's axis and the per-sample code would raise or measure N samples as one"
    )


def _squeezed(node: cst.CSTNode) -> cst.BaseExpression | None:
    """``x`` of ``x.squeeze()`` (every axis of size one, the batch's too)."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "squeeze"
        and not node.args
    ):
        return node.func.value
    return None


def _batches_of_one(loop: Loop, model: ScriptModel) -> bool:
    """``loop`` reads a DataLoader whose batches may be one sample each: made with
    ``batch_size=1``, with none (DataLoader's default is 1), or with a size the run picks
    (``batch_size=args.val_batch``, whose default is often 1): only a literal other than 1
    rules it out."""
    for binding in model.of_kind(Kind.DATALOADER):
        if binding.name != loop.iterable or not isinstance(binding.value, cst.Call):
            continue
        size = argument_value(binding.value, "batch_size", 1)
        if isinstance(size, cst.Name):  # ``batch_size=BATCH``, ``BATCH = 64`` at the top
            size = module_constant(model.module, size.value) or size
        if not isinstance(size, cst.Integer) or size.value == "1":
            return True
    return False


def module_constant(module: cst.Module, name: str) -> cst.BaseExpression | None:
    """The value ``name`` is bound to by the module's own top-level ``NAME = <literal>``, when
    that is its only binding anywhere in the file (no other assignment, loop or ``with``
    target, walrus, ``global`` or ``del`` of it): a setting every read sees."""
    value: cst.BaseExpression | None = None
    for line in module.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and small.targets[0].target.value == name
                and isinstance(small.value, cst.Integer | cst.Float | cst.SimpleString)
            ):
                value = small.value
    if value is None:
        return None
    bindings = 0
    for node in walk(module):
        if isinstance(node, cst.Global | cst.Nonlocal) and any(
            n.name.value == name for n in node.names
        ):
            return None
        targets: list[cst.CSTNode] = []
        if isinstance(
            node, cst.AssignTarget | cst.AugAssign | cst.AnnAssign | cst.For | cst.NamedExpr
        ):
            targets = [node.target]
        elif isinstance(node, cst.AsName | cst.Del):
            targets = [node.name if isinstance(node, cst.AsName) else node.target]
        bindings += sum(
            isinstance(part, cst.Name) and part.value == name
            for target in targets
            for part in walk(target)
        )
    return value if bindings == 1 else None


def _gathered_read(
    found: Evaluation,
    body: list[cst.CSTNode],
    model: ScriptModel,
    taken: Callable[[cst.CSTNode], cst.BaseExpression | None],
) -> tuple[cst.CSTNode, cst.CSTNode, cst.BaseExpression] | None:
    """The first node after the forward that ``taken`` reads a gathered value through (the
    gathered tensor itself, or one reshaped or moved from it: ``output = model(x).squeeze()``,
    ``p = output.cpu()``), with its statement and the value read."""
    gathered = set(found.gathered) | {f.name for f in found.fields}
    if found.statement is None:
        return None
    for small in body:
        if model.order(small) < model.order(found.statement):
            continue
        assign = small.body[0] if isinstance(small, cst.SimpleStatementLine) else small
        # ``output = model(x).squeeze()``: what the forward's statement binds is gathered next
        forward = small is found.statement or any(small is b for b in found.statement.body)
        if isinstance(assign, cst.Assign) and _same_values(
            assign.value, gathered, found.forward if forward else None
        ):
            gathered |= {t for target in assigned_targets(assign) for t in target_names(target)}
        for node in walk(small):
            read = taken(node)
            # in the forward's own statement, what is taken of the forward itself
            # (``sr = model(lr).squeeze()``): the conversion gathers the forward first
            if read is not None and _same_values(
                read, set() if forward else gathered, found.forward
            ):
                return small, node, read
    return None


def _one_sample_of_the_batch(
    found: Evaluation, body: list[cst.CSTNode], facts: Facts
) -> str | None:
    """``gt_item = item[0].item()`` after the forward (guoyang9/NCF's ``metrics()``, whose test
    loader hands one user's candidates per batch, ranked as one group by ``torch.topk``): the
    metric reads one sample of a batch field by its position, so each batch is a group on its
    own. Gathered, a step holds every rank's batch: ``[0]`` is the first rank's sample alone
    and the ranking mixes the groups, a wrong metric with no error. Left as it is: the loop
    evaluates the whole set on every rank."""
    model = facts.model
    fields = set(found.batch) & (set(found.gathered) | {f.name for f in found.fields})
    if found.statement is None or not fields:
        return None
    for small, node in _subscripts_after_the_forward(found, body, fields, model):
        if not (
            len(node.slice) == 1
            and isinstance(node.slice[0].slice, cst.Index)
            and isinstance(node.slice[0].slice.value, cst.Integer)
        ):
            continue
        if not _feeds_a_metric(small, found):
            continue  # ``save_image(x[0])``: a sample shown, not measured
        found.unsure_at = small
        found.advice = (
            "compute the per-batch results (one group each) on every rank and gather "
            "those, not the batch"
        )
        return (
            f"line {model.line(small)} reads {model.module.code_for_node(node)}, one "
            "sample of the batch by its position, so each batch is a group the metric "
            "takes as a whole: gathered, a step holds every rank's batch, the position "
            "is the first rank's sample alone and the groups mix"
        )
    return None


def _subscripts_after_the_forward(
    found: Evaluation, body: list[cst.CSTNode], names: set[str], model: ScriptModel
) -> Iterator[tuple[cst.CSTNode, cst.Subscript]]:
    """Each ``name[...]`` of one of ``names`` in the statements of ``body`` after the
    forward's, in source order, with its statement."""
    if found.statement is None:
        return
    for small in body:
        if model.order(small) <= model.order(found.statement):
            continue
        for node in walk(small):
            if (
                isinstance(node, cst.Subscript)
                and isinstance(node.value, cst.Name)
                and node.value.value in names
            ):
                yield small, node


def _a_fixed_range_of_the_first_axis(
    found: Evaluation, body: list[cst.CSTNode], facts: Facts
) -> str | None:
    """``output = output[1:].view(-1, output_dim)`` after the forward (the seq2seq tutorials'
    evaluation, whose tensors are [length, batch]: the first time step is the start token):
    the metric cuts a fixed range off the first dimension of a value the loop would gather.
    A first dimension cut by constants is not the samples (time steps first), or the cut
    keeps a fixed part of one batch; gather_for_metrics joins and trims the first dimension,
    so the cut would drop the first rank's first step only and keep the other ranks', and the
    trim at the end of the set would drop time steps: a wrong metric with no error. Left as
    it is: the loop evaluates the whole set on every rank."""
    model = facts.model
    gathered = set(found.gathered) | {f.name for f in found.fields}
    if found.statement is None or not gathered:
        return None
    for small, node in _subscripts_after_the_forward(found, body, gathered, model):
        if not (node.slice and a_fixed_range(node.slice[0].slice)):
            continue
        if not _reaches_a_metric(small, body, found):
            continue
        found.unsure_at = small
        found.advice = (
            "gather tensors whose first dimension is the batch (x.transpose(0, 1)) and cut "
            "the range from the dimension it belongs to"
        )
        return (
            f"line {model.line(small)} reads {model.module.code_for_node(node)}, a fixed "
            "range of the first dimension, so that dimension is not the samples (time "
            "steps first, [length, batch]): gather_for_metrics joins and trims the first "
            "dimension, and the range would be cut from the first rank's part only"
        )
    return None


def _a_ctc_loss_of_gathered_values(
    found: Evaluation, body: list[cst.CSTNode], facts: Facts
) -> str | None:
    """``loss = ctc_loss(log_probs, targets, input_lens, target_lens)`` after the forward, on
    values the loop would gather (an OCR or speech model's validation): CTC's log-probabilities
    are [time, batch, classes] and its targets the batch's labels joined end to end, so neither
    has one row per sample. gather_for_metrics joins and trims the first dimension: it would
    join time steps, and cut the joined labels at a count of samples, a loss of mismatched
    lengths (an error) or of the wrong values. Left as it is: the loop evaluates the whole set
    on every rank."""
    model = facts.model
    gathered = set(found.gathered) | {f.name for f in found.fields}
    if found.statement is None or not gathered:
        return None
    for small in body:
        if model.order(small) <= model.order(found.statement):
            continue
        for node in walk(small):
            if not isinstance(node, cst.Call) or not is_ctc_loss(model, node):
                continue
            read = sorted(
                {n.value for a in node.args for n in walk(a.value) if isinstance(n, cst.Name)}
                & gathered
            )
            if not read:
                continue
            found.unsure_at = small
            found.advice = (
                "compute the loss on this rank's batch and combine the ranks' results "
                "(accelerator.reduce of the loss times the batch size, and of the batch "
                "size), or gather per-sample values such as decoded predictions"
            )
            return (
                f"line {model.line(small)} computes a CTC loss from {', '.join(read)}: CTC "
                "takes log-probabilities as [time, batch, classes] and targets as the "
                "batch's labels joined end to end, not one row per sample; gather_for_metrics "
                "joins and trims the first dimension, so it would join time steps and cut "
                "the joined labels at a count of samples"
            )
    return None


def _reaches_a_metric(small: cst.CSTNode, body: list[cst.CSTNode], found: Evaluation) -> bool:
    """``small`` is a metric, or binds a name a metric reads through any chain of the loop's
    assignments (``output = output[1:]``, ``loss = criterion(output, trg)``, then
    ``epoch_loss += loss.item()``)."""
    return _reaches(small, body, found.sinks)


def reaches_a_sink(small: cst.CSTNode, loop: cst.For) -> bool:
    """``small``, a statement of ``loop``, is one of its sinks (``correct += ...``,
    ``preds.append(...)``) or binds a name one of them reads through any chain of the loop's
    assignments: what it computes is scored, not only printed or logged."""
    body = list(statements(loop.body))
    local = _assigned_in(loop)
    return _reaches(small, body, [sink for sink in body if _is_sink(sink, local)])


def _reaches(small: cst.CSTNode, body: list[cst.CSTNode], sinks: list[cst.CSTNode]) -> bool:
    if any(small is sink for sink in sinks):
        return True
    read = {n.value for sink in sinks for n in walk(sink) if isinstance(n, cst.Name)}
    changed = True
    while changed:
        changed = False
        for other in body:
            bound = _bound_in(other)
            if other is small and bound & read:
                return True
            if bound & read:
                more = {n.value for n in walk(other) if isinstance(n, cst.Name)} - read
                if more:
                    read |= more
                    changed = True
    return False


def _bound_in(small: cst.CSTNode) -> set[str]:
    return {
        name
        for node in walk(small)
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign))
        for target in (
            list(assigned_targets(node)) if isinstance(node, cst.Assign) else [node.target]
        )
        for name in target_names(target)
    }


def a_fixed_range(index: cst.BaseSlice) -> bool:
    """``[1:]``, ``[:-1]``, ``[1:-1]``: a slice whose given bounds are all integer literals
    (no step: ``[::-1]`` reverses, every sample kept)."""
    if not isinstance(index, cst.Slice) or index.step is not None:
        return False
    bounds = [b for b in (index.lower, index.upper) if b is not None]
    return bool(bounds) and all(_an_integer(b) for b in bounds)


def _an_integer(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, cst.Integer)


def _feeds_a_metric(small: cst.CSTNode, found: Evaluation) -> bool:
    """``small`` is one of the evaluation's metrics, or binds a name one of them reads
    (``gt_item = item[0].item()`` before ``HR.append(hit(gt_item, recommends))``)."""
    if any(small is sink for sink in found.sinks):
        return True
    bound = {
        name
        for node in walk(small)
        if isinstance(node, cst.Assign)
        for target in assigned_targets(node)
        for name in target_names(target)
    }
    return any(
        isinstance(node, cst.Name) and node.value in bound
        for sink in found.sinks
        for node in walk(sink)
    )


#: Tensor methods that keep every element: a value made with them from a gathered tensor
#: holds one value per rank as the tensor does.
_ELEMENTWISE = frozenset(
    {"squeeze", "unsqueeze", "view", "reshape", "flatten", "cpu", "detach", "float", "double"}
    | {"long", "to", "clone", "contiguous", "sigmoid", "exp", "abs", "round"}
)


def _same_values(
    value: cst.BaseExpression, gathered: set[str], forward: cst.Call | None = None
) -> bool:
    """``value`` is a gathered name, or a chain of `_ELEMENTWISE` methods on one (or on the
    ``forward`` call, gathered as it is: ``model(x).squeeze()``, not ``criterion(model(x),
    y)``)."""
    while value is not forward and isinstance(value, cst.Call):
        if not isinstance(value.func, cst.Attribute) or value.func.attr.value not in _ELEMENTWISE:
            return False
        value = value.func.value
    if value is forward:
        return True
    return isinstance(value, cst.Name) and value.value in gathered


def _taken_as_a_number(node: cst.CSTNode) -> cst.BaseExpression | None:
    """The tensor ``node`` reads as one Python number: ``x`` of ``x.item()``, ``float(x)``."""
    if not isinstance(node, cst.Call):
        return None
    if isinstance(node.func, cst.Attribute) and node.func.attr.value == "item" and not node.args:
        return node.func.value
    if dotted(node.func) in ("float", "int") and len(node.args) == 1:
        return node.args[0].value
    return None


#: Calls whose result is one batch's mean (a loss module or function with its default
#: reduction).
_MEAN_CALLS = ("loss", "criterion", "cross_entropy")


def _batch_means(body: list[cst.CSTNode], model: ScriptModel) -> set[str]:
    """Names the loop body binds to a loss of its batch: ``loss = criterion(out, y)``,
    ``loss = F.cross_entropy(out, y)``, ``loss = (out - y).pow(2).mean()`` (not with
    ``reduction="sum"``), and a weighted sum of them (``loss = loss_id + 0.5 * loss_u``)."""
    found: set[str] = set()
    for small in body:
        for node in walk(small):
            if not isinstance(node, cst.Assign) or len(assigned_targets(node)) != 1:
                continue
            target = assigned_targets(node)[0]
            if isinstance(target, cst.Name) and _a_batch_mean(node.value, found, model):
                found.add(target.value)
    return found


def _a_batch_mean(value: cst.BaseExpression, means: set[str], model: ScriptModel) -> bool:
    """``value`` is one batch's mean: a loss call, a name bound to one (``means``), or a sum of
    them, each possibly scaled by a constant weight (not by a batch size: that is a total). A
    loss built with ``reduction="sum"`` (where it is called or where it was constructed:
    `sums_its_batch`) is a batch's total, not its mean."""
    if isinstance(value, cst.Name):
        return value.value in means
    if isinstance(value, cst.Call):
        name = (dotted(value.func) or "").lower()
        if not name and isinstance(value.func, cst.Attribute) and not value.args:
            # ``(pred == y).float().mean()``: a chain's whole mean, a batch's accuracy
            name = value.func.attr.value
        last = name.rsplit(".", 1)[-1]
        if not (
            last == "mean" or any(k in last for k in _MEAN_CALLS) or made_as_a_loss(model, value)
        ):
            return False
        return not sums_its_batch(model, value)
    if not isinstance(value, cst.BinaryOperation):
        return False
    if isinstance(value.operator, cst.Add | cst.Subtract):
        return _a_batch_mean(value.left, means, model) and _a_batch_mean(value.right, means, model)
    if isinstance(value.operator, cst.Multiply):
        return (_a_batch_mean(value.left, means, model) and _a_weight(value.right)) or (
            _a_weight(value.left) and _a_batch_mean(value.right, means, model)
        )
    if isinstance(value.operator, cst.Divide):
        return _a_batch_mean(value.left, means, model) and _a_weight(value.right)
    return False


def _a_weight(value: cst.BaseExpression) -> bool:
    """A constant a loss is scaled by: ``0.5``, ``alpha``, ``cfg.lambda_u`` (not a batch size)."""
    if isinstance(value, cst.Integer | cst.Float):
        return True
    name = dotted(value)
    return name is not None and name.rsplit(".", 1)[-1] not in BATCH_SIZE_NAMES


def _divided_as_added(value: cst.BaseExpression) -> bool:
    """``loss.item() / len(loader)``: each batch's mean added already divided by the count of
    batches (the speech tutorial's ``test_loss += loss.item() / len(test_loader)``)."""
    return (
        isinstance(value, cst.BinaryOperation)
        and isinstance(value.operator, cst.Divide)
        and isinstance(value.right, cst.Call)
        and dotted(value.right.func) == "len"
    )


def sums_over_the_last_index(model: ScriptModel, loop: Loop) -> list[tuple[str, cst.Name]]:
    """``train_loss += loss.item()`` in ``loop`` (any loop, a training one included), then
    ``train_loss / num`` where ``num`` is the last index ``enumerate`` handed the loop (also
    through ``n = num``, ``float(num)``): by name, each such total and the divisor read. The
    index is the loop's batches less one, which no number of ranks keeps in proportion: over
    a prepared loader the quotient changes with N (`_divided_by_the_last_index`)."""
    indices = _last_indices(loop)
    if not indices:
        return []
    scope = model.scope_of(loop.node)
    found: list[tuple[str, cst.Name]] = []
    for node in walk(loop.node.body):
        if not (
            isinstance(node, cst.AugAssign)
            and isinstance(node.operator, cst.AddAssign)
            and isinstance(node.target, cst.Name)
        ):
            continue
        total = node.target.value
        over = _divided_by_the_last_index(scope, total, indices)
        if over is not None and all(total != t for t, _ in found):
            found.append((total, over))
    return found


def _divided_by_the_last_index(
    scope: cst.CSTNode, total: str, indices: set[str]
) -> cst.Name | None:
    """The ``num`` of ``total / num`` (``total /= num``) in ``scope`` where ``num`` is the index
    ``enumerate`` hands the loop (`_step_counters`): after the loop it is the last index, this
    rank's count of batches less one, which no number of ranks keeps in proportion (a
    whole-set sum over it, gathered, reads other than on one process)."""
    if not indices:
        return None
    indices = indices | _index_aliases(scope, indices)
    for node in walk(scope):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
            read, over = node.left, node.right
        elif isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign):
            read, over = node.target, node.value
        else:
            continue
        over = _bare_count(over)
        if (
            isinstance(read, cst.Name)
            and read.value == total
            and isinstance(over, cst.Name)
            and over.value in indices
        ):
            return over
    return None


def _index_aliases(scope: cst.CSTNode, indices: set[str]) -> set[str]:
    """Names ``scope`` binds only to one of ``indices`` (``n = i`` after the loop, then
    ``total / n``): the same last index under another name (review10a: the validation loss
    divided through such a name was gathered, and its printed value changed with N)."""
    bound: dict[str, bool] = {}
    for node in walk(scope):
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
            from_index = isinstance(node.value, cst.Name) and node.value.value in indices
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
            targets = [node.target]
            from_index = False
        else:
            continue
        for target in targets:
            if isinstance(target, cst.Name):
                bound[target.value] = bound.get(target.value, True) and from_index
    return {name for name, only in bound.items() if only}


def _bare_count(over: cst.BaseExpression) -> cst.BaseExpression:
    """``over`` without the casts and floors that keep its value: ``float(i)``, ``int(i)``,
    ``max(i, 1)`` divide by the index as ``i`` does."""
    while (
        isinstance(over, cst.Call)
        and isinstance(over.func, cst.Name)
        and over.func.value in ("float", "int", "max")
        and over.args
        and all(arg.keyword is None and arg.star == "" for arg in over.args)
    ):
        counts = [
            arg.value for arg in over.args if not isinstance(arg.value, (cst.Integer, cst.Float))
        ]
        if len(counts) != 1 or (over.func.value != "max" and len(over.args) != 1):
            return over
        over = counts[0]
    return over


def _divided(scope: cst.CSTNode, total: str) -> bool:
    """``total`` is divided somewhere in ``scope``: ``total / n``, ``total /= n``, or handed
    to a mean (``np.mean(total)``)."""
    for node in walk(scope):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
            read = node.left
        elif isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign):
            read = node.target
        elif isinstance(node, cst.Call) and (dotted(node.func) or "").endswith("mean"):
            read = node
        else:
            continue
        if any(isinstance(n, cst.Name) and n.value == total for n in walk(read)):
            return True
    return False


def _carried_into_the_forward(
    small: cst.CSTNode, found: Evaluation, model: ScriptModel
) -> str | None:
    """``val_h = tuple([each.data for each in val_h])`` before ``output, val_h = net(x, val_h)``:
    the name the statement rebinds from itself, when the forward reads it."""
    if not (isinstance(small, cst.Assign) and len(assigned_targets(small)) == 1):
        return None
    target = assigned_targets(small)[0]
    if not isinstance(target, cst.Name) or found.forward is None:
        return None
    return target.value if target.value in variables_in(model, found.forward) else None


# --- pieces -------------------------------------------------------------------------------------
def _is_sink(small: cst.CSTNode, local: set[str]) -> bool:
    """Folds a per-batch value into something the loop does not bind itself (``local``)."""
    if isinstance(small, cst.AugAssign):
        return root_name(small.target) not in local
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = small.value.func
        return (
            isinstance(func, cst.Attribute)
            and func.attr.value in SINK_METHODS
            and root_name(func.value) not in local
        )
    if isinstance(small, cst.Assign) and len(assigned_targets(small)) == 1:
        written = assigned_targets(small)[0]
        # ``total = total + x``, and ``sums[key] = sums.get(key, 0) + value``
        target = root_name(written) if isinstance(written, cst.Subscript) else dotted(written)
        if target is None or target in local:
            return False
        if isinstance(written, (cst.Name, cst.Attribute)) and dotted(
            strip_self_methods(small.value)
        ) == dotted(written):
            return False  # ``model = model.eval()`` hands the same object back, folds in nothing
        return target in _variables(small.value) or _fills_a_range(written)
    return False


def written_rows(found: Evaluation, model: ScriptModel) -> list[cst.CSTNode]:
    """The sinks of ``found`` that write a batch's rows to a file opened before the loop
    (`_writes_a_row`): unlike a list or a total, nothing after the loop can gather them."""
    local = _assigned_in(found.loop.node)
    return [sink for sink in found.sinks if _writes_a_row(sink, found.loop, local, model)]


def _writes_a_row(small: cst.CSTNode, loop: Loop, local: set[str], model: ScriptModel) -> bool:
    """``w.writerow([y, p])`` (a csv writer's) or ``f.write(line)`` into a file opened before
    the loop: the file keeps every batch's rows, as a list does. A file the loop opens itself
    (``with open(f"{i}.txt") as f``) is one per batch, and a ``.write`` of anything not opened
    as a file (``bar.write(...)`` of a tqdm bar, ``sys.stdout.write``) keeps nothing."""
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    func = small.value.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in WRITE_METHODS):
        return False
    owner = root_name(func.value)
    if owner is None or owner in local or _opened_in(loop.node.body, owner):
        return False
    if func.attr.value != "write":
        return True
    scope = model.index.enclosing_function(loop.node)
    return isinstance(func.value, cst.Name) and _opened_in(scope or model.module, owner)


#: Calls that open a file and hand back its object.
_OPENS = ("open", "io.open", "gzip.open", "bz2.open", "lzma.open", "codecs.open")


def _opened_in(scope: cst.CSTNode, name: str) -> bool:
    """``name`` is bound in ``scope`` to an opened file: ``with open(...) as name`` or
    ``name = open(...)`` (also ``path.open(...)``)."""
    for node in walk(scope):
        if isinstance(node, cst.WithItem) and node.asname is not None:
            bound, value = node.asname.name, node.item
        elif isinstance(node, cst.Assign) and len(node.targets) == 1:
            bound, value = node.targets[0].target, node.value
        else:
            continue
        if name in target_names(bound) and isinstance(value, cst.Call) and _opens(value):
            return True
    return False


def _opens(call: cst.Call) -> bool:
    name = dotted(call.func) or ""
    return name in _OPENS or name.endswith(".open")


def _stores_in_a_container(small: cst.CSTNode, local: set[str]) -> bool:
    """``preds[i * bs : (i + 1) * bs] = out.numpy()``, ``by_id[name] = p``: a store into a
    container the loop did not make keeps the batch's values past it, as a sum does (asked only
    of a loop that runs a forward: a loop over a dict of loaders stores each one's score)."""
    if not (isinstance(small, cst.Assign) and len(assigned_targets(small)) == 1):
        return False
    written = assigned_targets(small)[0]
    if not isinstance(written, cst.Subscript):
        return False
    target = root_name(written)
    return target is not None and target not in local


def _fills_a_range(written: cst.BaseAssignTargetExpression) -> bool:
    """``preds[start:end] = batch_preds`` (also ``preds[start:end, k]``): each batch fills its
    rows of an array made before the loop, at a running offset. A key set per pass
    (``row[name] = acc``) is not a fold of batches."""
    return isinstance(written, cst.Subscript) and any(
        isinstance(element.slice, cst.Slice) for element in written.slice
    )


def _yields_to_the_caller(small: cst.CSTNode) -> bool:
    """``yield preds, y`` in a generator that evaluates: the caller folds what it yields into
    its metrics, so a yield is a sink like ``correct += ...`` (a generator that only passes
    batches on runs no forward, and is not asked)."""
    return isinstance(small, cst.Expr) and isinstance(small.value, cst.Yield)


def _metric_of(call: cst.Call) -> cst.BaseExpression:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in ("update", "forward"):
        return func.value
    return func


def self_syncing_metrics(loop: Loop, model: ScriptModel) -> list[cst.Call]:
    """Calls in the loop that feed a torchmetrics metric (``metric.update(preds, y)``,
    ``metric(preds, y)``): an instance made from ``torchmetrics`` in this file."""
    found = []
    for node in walk(loop.node.body):
        if not isinstance(node, cst.Call):
            continue
        name = dotted(_metric_of(node))
        if name is None:
            continue
        for assign in model.index.assignments_to(name):
            value = assign.value
            while (  # ``Accuracy(...).to(device)``
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and isinstance(value.func.value, cst.Call)
            ):
                value = value.func.value
            if isinstance(value, cst.Call) and any(
                q.startswith("torchmetrics.") for q in model.qualified(value.func)
            ):
                found.append(node)
                break
    return found


def _assigned_in(loop: cst.For) -> set[str]:
    """Names the loop binds itself (its targets and plain assignments): per-batch values.

    An inner loop's target is one only when it walks a per-batch value (``for p, t in
    zip(preds, y)``): one over a container made before the loop (``for m in
    self.metrics.values(): m.update(out, y)``) hands out the objects the metrics live in,
    and what is fed to them outlives the batch like ``correct += ...`` does."""
    bound = set(target_names(loop.target))
    inner = []
    for node in walk(loop.body):
        if isinstance(node, cst.Assign):
            for target in assigned_targets(node):
                value_names = _variables(node.value)
                bound |= {t for t in target_names(target) if t not in value_names}
        elif isinstance(node, cst.For):
            inner.append(node)
    grown = True
    while grown:
        grown = False
        for node in inner:
            names = target_names(node.target)
            if not names <= bound and _walks_per_batch(node.iter, bound):
                bound |= names
                grown = True
    return bound


def _walks_per_batch(iterated: cst.BaseExpression, bound: set[str]) -> bool:
    """An inner loop's iterable reads a per-batch name, or is a plain count (``range(n)``):
    anything but a container made outside the loop."""
    if isinstance(iterated, cst.Call) and dotted(iterated.func) == "range":
        return True
    return bool(_variables(iterated) & bound)


def caches_for_training(loop: Loop, facts: Facts) -> bool:
    """``loop`` reads a loader, trains nothing and caches what training reads back
    (`_feeds_training`): no evaluation, whatever a run sees it do."""
    if loop.trains or not facts.flow.reads_loader(loop):
        return False
    local = _assigned_in(loop.node)
    sinks = [sink for sink in statements(loop.node.body) if _is_sink(sink, local)]
    return bool(sinks) and _feeds_training(loop, sinks, facts)


def _feeds_training(loop: Loop, sinks: list[cst.CSTNode], facts: Facts) -> bool:
    """The loop caches model outputs that training reads back batch by batch (a distillation
    teacher's outputs over the training loader, returned and handed to ``train_kd``): not an
    evaluation. Each rank's cache must stay aligned with its own shard of batches; gathered,
    it would hold every rank's batches where the training step expects one rank's."""
    model, placement = facts.model, facts.placement
    cached = {name for sink in sinks for name in _folded_into(sink)}
    function = placement.enclosing_function(loop.node)
    places: list[tuple[set[str], cst.CSTNode]] = [(cached, function or model.module)]
    returned = function is not None and any(
        r.value is not None and dotted(r.value) in cached for r in model.index.own_returns(function)
    )
    if returned:
        for call, _ in facts.flow.calls_of(function):  # type: ignore[arg-type]
            assign = model.parent(call)
            if isinstance(assign, cst.Assign) and len(assigned_targets(assign)) == 1:
                names = target_names(assigned_targets(assign)[0])
                places.append((names, placement.enclosing_function(call) or model.module))
    if any(_read_by_training(names, scope, loop.node, facts) for names, scope in places):
        return True
    return _member_read_by_training(sinks, loop, facts)


def _member_read_by_training(sinks: list[cst.CSTNode], loop: Loop, facts: Facts) -> bool:
    """``self.rollout_buffer.add(prompt, response, logprobs, reward)`` in a rollout loop, read
    back by ``for prompts, responses, ... in self.rollout_buffer:`` in the loop of ``learn()``
    that trains: a member of the trainer that a training loop of the same class reads, and
    never folds into itself, is that training's input (this rank's own rollouts), not an
    evaluation's total."""
    model, placement = facts.model, facts.placement
    home = placement.class_of(loop.node)
    if home is None:
        return False
    members = {
        member
        for sink in sinks
        for member in _folded_members(sink)
        if member.startswith("self.") and member.count(".") == 1
    }
    for training in model.loops:
        if not training.trains or placement.class_of(training.node) is not home:
            continue
        if placement.inside(loop.node, training.node):
            continue  # the loop that folds is itself inside the training: its total, not a cache
        written = {member for small in walk(training.node) for member in _folded_members(small)}
        if _draws_from(training.node, members) - written:
            return True
    return False


def _draws_from(training: cst.CSTNode, members: set[str]) -> set[str]:
    """The ``members`` a training loop takes its batches from: iterated (``for x in
    self.buffer``, ``DataLoader(self.buffer)`` in a ``for``) or sampled (``self.buffer.sample(
    64)``); not merely read (``if self.val_losses[-1] > best``, a total compared)."""
    found: set[str] = set()
    for node in walk(training):
        if isinstance(node, cst.For):
            found |= {
                dotted(n)
                for n in walk(node.iter)
                if isinstance(n, cst.Attribute) and dotted(n) in members
            }
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            owner = dotted(node.func.value)
            if owner in members and node.func.attr.value not in (*SINK_METHODS, "clear"):
                found.add(owner)
    return found


def _folded_members(sink: cst.CSTNode) -> set[str]:
    """``self.buffer`` of ``self.buffer.add(...)``, ``self.total`` of ``self.total += ...``: the
    attribute chain a statement folds into (``_folded_into`` keeps only its root, ``self``)."""
    if isinstance(sink, cst.AugAssign):
        target = dotted(sink.target)
        return {target} if target else set()
    if isinstance(sink, cst.Expr) and isinstance(sink.value, cst.Call):
        func = sink.value.func
        if isinstance(func, cst.Attribute):
            owner = dotted(func.value)
            return {owner} if owner else set()
    return set()


def _read_by_training(
    names: set[str], scope: cst.CSTNode, loop_node: cst.CSTNode, facts: Facts
) -> bool:
    """One of ``names`` is read in a later training loop of ``scope`` that never writes it (a
    total both loops fold into is no cache), or handed to a function of the file that has a
    training loop."""
    model, placement = facts.model, facts.placement
    for node in walk(scope):
        if not (isinstance(node, cst.Name) and node.value in names):
            continue
        if any(
            t.trains
            and placement.inside(node, t.node)
            and node.value not in _written_in(t.node)
            and model.order(t.node) > model.order(loop_node)
            for t in model.loops
        ):
            return True  # read there, written only before it: an input of training
        argument = model.parent(node)
        call = model.parent(argument) if isinstance(argument, cst.Arg) else None
        target = callee(model, call) if isinstance(call, cst.Call) else None
        if target is not None and any(
            t.trains and placement.inside(t.node, target[0]) for t in model.loops
        ):
            return True
    return False


def _written_in(node: cst.CSTNode) -> set[str]:
    return {
        name
        for small in walk(node)
        if isinstance(small, (cst.AugAssign, cst.Assign, cst.Expr))
        for name in _folded_into(small)
    }


def _folded_into(sink: cst.CSTNode) -> set[str]:
    """``teacher_outputs`` of ``teacher_outputs.append(...)``, ``total`` of ``total += ...``."""
    if isinstance(sink, cst.AugAssign):
        return {root_name(sink.target) or ""}
    if isinstance(sink, cst.Expr) and isinstance(sink.value, cst.Call):
        func = sink.value.func
        if isinstance(func, cst.Attribute):
            return {root_name(func.value) or ""}
    if isinstance(sink, cst.Assign):
        return {root_name(t) or "" for t in assigned_targets(sink)}
    return set()


def _variables(node: cst.CSTNode) -> set[str]:
    """The variables ``node`` reads: ``batch`` of ``src, lengths = batch.src``, not the member
    ``src`` (the same word as the target, which the loop still binds itself), nor a keyword."""
    members = {
        id(n.attr) if isinstance(n, cst.Attribute) else id(n.keyword)
        for n in walk(node)
        if isinstance(n, cst.Attribute) or (isinstance(n, cst.Arg) and n.keyword is not None)
    }
    return {n.value for n in walk(node) if isinstance(n, cst.Name) and id(n) not in members}


def first_forward(loop: Loop, facts: Facts) -> cst.Call | None:
    """The loop's first call of a model, or of a copy of one (``self.ema(x)`` of ``self.ema =
    copy.deepcopy(self.model)``: it forwards as the model does, on the model's device); with
    none, its first prediction through a method of one (`predicting_method`): ``pred =
    model.greedy(src, length)`` decodes as much as ``model(src)`` forwards, and its output is
    what the metric reads."""
    calls = [node for node in walk(loop.node.body) if isinstance(node, cst.Call)]
    for node in calls:
        if facts.flow.is_forward(node) or runs_a_model_copy(facts, node):
            return node
    for node in calls:
        if predicting_method(node, facts):
            return node
    return None


def _member_label(call: cst.Call) -> str:
    """``module.validation_step()`` for a call of a model's member, as a review line names it."""
    func = call.func
    assert isinstance(func, cst.Attribute)
    owner = unwrapped_argument(func.value) or func.value
    return f"{dotted(owner)}.{func.attr.value}()"


def _summarises_the_batch(call: cst.Call, facts: Facts) -> bool:
    """``call`` runs a method of a model class of this file that returns Python numbers
    (`_returns_host_numbers`): a Lightning-style ``validation_step``."""
    index = facts.model.index
    method = call.func.attr.value  # type: ignore[attr-defined]
    return any(
        _returns_host_numbers(index.own_returns(index.methods_of(name)[method]))
        for name in index.model_classes_with(method)
    )


def _through_a_member(loop: Loop, facts: Facts) -> cst.Call | None:
    """The loop's first call of a known model's member (``student.backbone(x)``,
    ``module.validation_step(batch, i)``): the loop does run the model, through a part of it
    whose output the conversion does not follow."""
    for node in walk(loop.node.body):
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            continue
        owner = unwrapped_argument(node.func.value) or node.func.value
        member = node.func.attr.value
        if member in names.MODULE_API or member.startswith("_"):
            continue
        if facts.flow.is_model_name(dotted(owner), node):
            return node
    return None


def predicting_method(call: cst.Call, facts: Facts) -> bool:
    """``model.greedy(x)`` or ``accelerator.unwrap_model(model).predict(x)``, with ``model`` a
    known model: a method named for predicting (``predict``, ``generate``...), or one the
    model's class of this file defines that runs its layers and returns a value
    (``Seq2Seq.greedy``). Not ``model.eval()``, ``model.init_hidden(n)`` nor
    ``model.reset_state()``."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    owner = unwrapped_argument(func.value) or func.value  # a node is always true
    method = func.attr.value
    if method.startswith(_PREDICTING) and facts.flow.names_a_model(dotted(owner), call):
        # ``model.generate(...)`` in a helper handed the prepared model (nanoT5's predict)
        return True
    if not facts.flow.is_model_name(dotted(owner), call):
        return False
    if method.startswith(_PREDICTING):
        return True
    index = facts.model.index
    defined = [index.methods_of(name)[method] for name in index.model_classes_with(method)]
    return any(
        _runs_its_layers(found) and not _returns_host_numbers(index.own_returns(found))
        for found in defined
    )


#: Calls whose result is one Python number, never a tensor: a batch's summary, not per-sample
#: values (``.tolist()`` keeps one per sample: `_runs_a_method_returning_a_list`)
_HOST_NUMBER_METHODS = frozenset({"item"})
_HOST_NUMBER_FUNCTIONS = frozenset({"len", "float", "int"})


def _returns_host_numbers(returns: list[cst.Return]) -> bool:
    """A return hands back a Python number as the value or as an entry of the dict, tuple or
    list it builds (a Lightning-style ``validation_step`` returning ``{"val_loss":
    loss.item(), "n": len(y)}``): what the method returns is a batch's summary, not its
    predictions, and a gather of it is a list of every rank's objects, not the dict."""
    for node in returns:
        value = node.value
        if isinstance(value, cst.Dict):
            leaves = [e.value for e in value.elements if isinstance(e, cst.DictElement)]
        elif isinstance(value, (cst.Tuple, cst.List)):
            leaves = [e.value for e in value.elements if isinstance(e, cst.Element)]
        else:
            leaves = [value]
        if any(_is_host_number(leaf) for leaf in leaves):
            return True
    return False


def _is_host_number(value: cst.BaseExpression | None) -> bool:
    if isinstance(value, (cst.Integer, cst.Float)):
        return True
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute):
        return func.attr.value in _HOST_NUMBER_METHODS
    return isinstance(func, cst.Name) and func.value in _HOST_NUMBER_FUNCTIONS


def _runs_its_layers(method: cst.FunctionDef) -> bool:
    """``method`` returns a value and calls the model or a layer of it (``self(x)``,
    ``self.dec(...)``): a prediction, not ``init_hidden`` (``torch.zeros(...)``) nor ``reset``."""
    nodes = list(walk(method.body))
    returns = any(isinstance(n, cst.Return) and n.value is not None for n in nodes)
    me = method.params.params[0].name.value if method.params.params else None
    return returns and any(
        isinstance(n, cst.Call)
        and me is not None
        and (dotted(n.func) == me or (dotted(n.func) or "").count(".") == 1)
        and (dotted(n.func) or "").partition(".")[0] == me
        for n in nodes
    )


def _gathers(loop: Loop, facts: Facts) -> bool:
    return any(
        isinstance(node, cst.Call) and combines_ranks(facts.model, node)
        for node in walk(loop.node.body)
    )


def _combined_after(
    loop: Loop, sinks: list[cst.CSTNode], facts: Facts, scope: cst.CSTNode | None = None
) -> list[cst.Call]:
    """The totals are combined across ranks after the loop, by the script itself:
    ``dist.all_reduce(correct)``, ``accelerator.reduce(total)``, or a tensor made from them
    (``t = torch.tensor([correct, total]); dist.all_reduce(t)``). Already distributed: a gather
    inside the loop as well would count every sample once per rank. Looked for in the loop's
    function (in ``scope`` when given: the module, for a loop at module level)."""
    totals = {_sink_name(sink) for sink in sinks} - {None}
    function = scope or facts.placement.enclosing_function(loop.node)
    if not totals or function is None:
        return []
    model = facts.model
    start = model.order(loop.node)
    made_from: set[str] = set(totals)
    found = []
    for node in walk(function.body if isinstance(function, cst.FunctionDef) else function):
        if model.order(node) <= start or facts.placement.inside(node, loop.node):
            continue
        if isinstance(node, cst.Assign) and len(assigned_targets(node)) == 1:
            reads = {n.value for n in walk(node.value) if isinstance(n, cst.Name)}
            if reads & made_from:
                made_from |= target_names(assigned_targets(node)[0])
        if not isinstance(node, cst.Call) or not node.args:
            continue
        if combines_ranks(model, node) and _combines(node.args[0].value, made_from):
            found.append(node)
    return found


def _combines(argument: cst.BaseExpression, totals: set[str]) -> bool:
    """``correct`` or a tensor made from it in place (``torch.tensor(correct, device=d)``,
    ``torch.tensor([correct, total])``): one of ``totals`` combined."""
    if root_name(argument) in totals:
        return True
    return (
        isinstance(argument, cst.Call)
        and (dotted(argument.func) or "").rsplit(".", 1)[-1] in ("tensor", "as_tensor")
        and any(
            isinstance(n, cst.Name) and n.value in totals
            for a in argument.args
            if a.keyword is None
            for n in walk(a.value)
        )
    )


def _sink_name(sink: cst.CSTNode) -> str | None:
    if isinstance(sink, cst.AugAssign):
        return root_name(sink.target)
    if isinstance(sink, cst.Assign) and len(assigned_targets(sink)) == 1:
        return root_name(assigned_targets(sink)[0])
    if isinstance(sink, cst.Expr) and isinstance(sink.value, cst.Call):
        func = sink.value.func
        return root_name(func.value) if isinstance(func, cst.Attribute) else None
    return None


def _calls_a_model(small: cst.CSTNode, facts: Facts, gathered: cst.Call | None) -> bool:
    """A forward pass other than ``gathered`` (whose output the gather covers)."""
    return any(
        isinstance(n, cst.Call) and n is not gathered and facts.flow.is_forward(n)
        for n in walk(small)
    )


def _batch_names(loop: Loop, facts: Facts, before: cst.CSTNode | None) -> set[str]:
    """The loop's batch names and those unpacked or indexed from them before the forward."""
    batch = set(loop.batch_names)
    limit = facts.model.order(before) if before is not None else None
    for small in statements(loop.node.body):
        if limit is not None and facts.model.order(small) >= limit:
            break
        if isinstance(small, cst.Assign) and _pure_access(small.value):
            reads = variables_in(facts.model, small.value)
            if reads and reads <= batch | {"device"} | _device_names(small.value):
                for target in assigned_targets(small):
                    batch |= target_names(target)
    return batch


def _whole_batches(loop: Loop) -> set[str]:
    """The loop's names for a whole batch (``for batch in loader``, ``for i, batch in
    enumerate(loader)``): an integer index of one reads a field of the batch (``batch[1]``, the
    labels), where one of a name unpacked from it (``for x, y in loader``) reads one sample
    (``x[0]``), which gathered would become the first rank's sample alone. A helper's body read
    as the loop it is called from (`helper_evaluation`) has no target: none is known whole."""
    if not isinstance(loop.node, cst.For):
        return set()
    target = loop.node.target
    if isinstance(target, cst.Name):
        return {target.value}
    if not isinstance(target, (cst.Tuple, cst.List)) or len(loop.batch_names) != 1:
        return set()
    plain = {e.value.value for e in target.elements if isinstance(e.value, cst.Name)}
    return loop.batch_names & plain  # the batch beside enumerate's index, not unpacked


def _pure_access(value: cst.BaseExpression) -> bool:
    """``batch[0]``, ``batch["x"]``, ``a, b = batch``, ``x.to(device)``: no computation."""
    for node in walk(value):
        if isinstance(node, cst.Call):
            func = node.func
            if not (isinstance(func, cst.Attribute) and func.attr.value in names.DEVICE_MOVES):
                return False
        elif isinstance(node, _COMPUTATIONS):
            return False
    return True


def _device_names(value: cst.BaseExpression) -> set[str]:
    found = set()
    for node in walk(value):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            for argument in node.args:
                found |= {n.value for n in walk(argument.value) if isinstance(n, cst.Name)}
    return found


def _read_after(model: ScriptModel, name: str, statement: cst.CSTNode) -> bool:
    """``name`` is read below ``statement`` in the function (or module code) that holds it:
    in the loop, or after it (a helper's ``return {"sse": ...(pred, y)}``)."""
    scope = model.scope_of(statement)
    start = model.order(statement)
    for node in walk(scope):
        if (
            isinstance(node, cst.Name)
            and node.value == name
            and model.order(node) > start
            and not is_binding(model, node)
            and not _is_attribute_name(model, node)
        ):
            return True
    return False


def _is_attribute_name(model: ScriptModel, node: cst.Name) -> bool:
    parent = model.parent(node)
    return isinstance(parent, cst.Attribute) and parent.attr is node


def _uses_after(found: Evaluation, facts: Facts) -> dict[str, list[cst.Name]]:
    """Name uses in the loop after the forward statement (and inside it, when extracted)."""
    model, statement = facts.model, found.statement
    assert statement is not None
    start = model.order(statement)
    uses: dict[str, list[cst.Name]] = {}
    for node in walk(found.loop.node.body):
        if not isinstance(node, cst.Name) or model.order(node) < start:
            continue
        parent = model.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue  # ``outputs.data``: the attribute's name, not a use of ``data``
        inside = any(a is statement for a in model.ancestors(node))
        if inside and (found.extracted is None or within(model, node, found.forward)):
            continue
        if is_binding(model, node):
            continue
        uses.setdefault(node.value, []).append(node)
    return uses


def _fields_only(
    uses: list[cst.Name], model: ScriptModel, allow_index: bool
) -> dict[str, list[cst.CSTNode]] | None:
    """``{"out.logits": [nodes]}`` when every use reads a field (not a method, not the whole
    object); None when the name is used as a value of its own."""
    if not uses:
        return None
    fields: dict[str, list[cst.CSTNode]] = {}
    for use in uses:
        access = _field_access(use, model, allow_index)
        if access is None or is_binding(model, access):
            return None
        fields.setdefault(model.module.code_for_node(access), []).append(access)
    return fields


def _field_access(use: cst.Name, model: ScriptModel, allow_index: bool) -> cst.CSTNode | None:
    """``out.logits`` or ``batch["labels"]`` (``batch[1]`` with ``allow_index``) around ``use``."""
    parent = model.parent(use)
    if isinstance(parent, cst.Attribute) and parent.attr.value in TENSOR_ATTRIBUTES:
        return None  # ``outputs.data``: the tensor itself, not a field of a dict-like output
    if isinstance(parent, cst.Attribute) and parent.value is use:
        caller = model.parent(parent)
        is_method = isinstance(caller, cst.Call) and caller.func is parent
        return None if is_method else parent
    if isinstance(parent, cst.Subscript) and parent.value is use and len(parent.slice) == 1:
        index = parent.slice[0].slice
        kinds = (cst.SimpleString, cst.Integer) if allow_index else (cst.SimpleString,)
        if isinstance(index, cst.Index) and isinstance(index.value, kinds):
            return parent
    return None


def _add_fields(found: Evaluation, fields: dict[str, list[cst.CSTNode]], taken: set[str]) -> None:
    for code, uses in fields.items():
        node = uses[0]
        if isinstance(node, cst.Attribute):
            base = node.attr.value
        else:
            index = node.slice[0].slice.value  # type: ignore[union-attr]
            text = str(getattr(index, "evaluated_value", ""))
            base = text if text.isidentifier() else "labels"
        if "loss" in base:
            continue  # a scalar per batch: gathering it would not give a per-sample value
        name = fresh(base, taken)
        found.fields.append(GatheredField(name, code, uses))


#: Methods of a model that predict (``model.predict(batch)``, ``generate``, ``predict_class``).
_PREDICTING = ("predict", "generate", "infer", "sample", "forward")


def predicts_through_the_model(loop: Loop) -> bool:
    """The loop predicts through the model itself: ``accelerator.unwrap_model(model).predict(
    batch)`` (or ``generate``, ``predict_class``...) is its forward pass as much as
    ``model(batch)`` (OmniGenBench's evaluate, a log-anomaly Predicter)."""
    for node in walk(loop.node.body):
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
            continue
        inner = node.func.value
        if (
            isinstance(inner, cst.Call)
            and isinstance(inner.func, cst.Attribute)
            and inner.func.attr.value == "unwrap_model"
            and node.func.attr.value.startswith(_PREDICTING)
        ):
            return True
    return False


def evaluates_each_batch(loop: Loop, model: ScriptModel) -> bool:
    """A loop over batches that trains nothing and turns gradients off inside it, for each
    batch (``for batch in loader: with torch.no_grad(): outputs = model(**batch)``): an
    evaluation as much as a loop under ``no_grad``, wherever its loader came from. Not a loop
    over ``range`` (epochs, steps), whose batches come from elsewhere."""
    if loop.evaluates:
        return True
    if loop.trains:
        return False
    source = loop.node.iter
    if isinstance(source, cst.Call) and dotted(source.func) == "enumerate" and source.args:
        source = source.args[0].value
    if isinstance(source, cst.Call) and dotted(source.func) in {"range", "trange", *names.TRANGE}:
        return False
    return any(
        isinstance(statement, cst.With) and model.disables_grad(statement)
        for statement in loop.node.body.body
    )


def gather_counts_padding(loop: Loop, gather: cst.Call, facts: Facts) -> bool:
    """``accelerator.gather`` in ``loop``, an evaluation of a model, keeps the samples a prepared
    DataLoader repeats to even out the last batch: they are counted twice. Not when the script
    drops them by hand (``predictions = predictions[: len(dataset) - samples_seen]``, the idiom
    from before ``gather_for_metrics``) or the loop runs no forward pass (a test of the gather
    itself)."""
    if first_forward(loop, facts) is None and not predicts_through_the_model(loop):
        return False
    model = facts.model
    assign = next((a for a in model.ancestors(gather) if isinstance(a, cst.Assign)), None)
    gathered = (
        {name for target in assigned_targets(assign) for name in target_names(target)}
        if assign is not None
        else set()
    ) | _collected_into(model, gather)
    for node in walk(loop.node.body):
        if (
            isinstance(node, cst.Assign)
            and isinstance(node.value, cst.Subscript)
            and dotted(node.value.value) in gathered
            and any(isinstance(e.slice, cst.Slice) for e in node.value.slice)
        ):
            return False
    return not _trimmed_to_the_set_after(loop, gathered, facts)


def _collected_into(model: ScriptModel, gather: cst.Call) -> set[str]:
    """The list a gather is appended to where it is made (``losses.append(accelerator.gather(
    loss.repeat(bs)))``, Hugging Face's no_trainer idiom): it holds the gathered rows."""
    parent = model.parent(model.parent(gather))
    if (
        isinstance(parent, cst.Call)
        and isinstance(parent.func, cst.Attribute)
        and parent.func.attr.value in ("append", "extend")
        and (owner := dotted(parent.func.value)) is not None
    ):
        return {owner}
    return set()


def _trimmed_to_the_set_after(loop: Loop, gathered: set[str], facts: Facts) -> bool:
    """What the loop collects from the gathered values is cut to a length after it
    (``predictions = list(chunks(predictions, k))[:len(test_dataset)]``, a T5 generator's
    "hack to deal with the auto-filling of the last incomplete batch"): the gathered rows come
    in the dataset's order, the repeats last, so the cut drops exactly them. Followed from the
    gathered names through the loop's assignments and ``append``/``extend``/``+=`` to the
    name cut, in the loop's function."""
    model = facts.model
    scope = facts.placement.enclosing_function(loop.node) or model.module
    derived = set(gathered)
    for _ in range(4):  # a few hops: gathered -> decoded -> preds -> predictions
        before = len(derived)
        for node in walk(loop.node.body):
            if isinstance(node, (cst.Assign, cst.AugAssign)) and _reads_any(node.value, derived):
                targets = assigned_targets(node) if isinstance(node, cst.Assign) else [node.target]
                derived |= {name for target in targets for name in target_names(target)}
            elif (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("append", "extend")
                and any(_reads_any(arg.value, derived) for arg in node.args)
                and (owner := dotted(node.func.value)) is not None
            ):
                derived.add(owner)
        if len(derived) == before:
            break
    for node in walk(scope):
        if (
            isinstance(node, cst.Subscript)
            and model.order(node) > model.order(loop.node)
            and not model.inside(node, loop.node)
            and _reads_any(node.value, derived)
            and any(
                isinstance(element.slice, cst.Slice)
                and element.slice.upper is not None
                and any(
                    isinstance(n, cst.Call) and dotted(n.func) == "len"
                    for n in walk(element.slice.upper)
                )
                for element in node.slice
            )
        ):
            return True
    return False


def _reads_any(value: cst.BaseExpression, read: set[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in read for n in walk(value))


#: Calls that keep a value's shape: ``loss.detach().float()`` is still the loss.
_SAME_VALUE = ("detach", "float", "double", "cpu", "clone", "contiguous", "to")
#: Reshapes that leave one value per rank a single row (``loss.unsqueeze(0)``).
_ONE_ROW = ("unsqueeze", "view", "reshape", "flatten")


def totals_combined_after(evaluation: Evaluation, facts: Facts) -> list[cst.Call]:
    """The calls after ``evaluation``'s loop that combine its totals across ranks, at module
    level too (`_combined_after`)."""
    if evaluation.combined_by:
        return evaluation.combined_by
    scope = facts.placement.enclosing_function(evaluation.loop.node) or facts.model.module
    return _combined_after(evaluation.loop, evaluation.sinks, facts, scope)


def gathers_batch_loss(gather: cst.Call) -> bool:
    """``accelerator.gather(loss_mel)``: the batch's loss, one mean per rank (named a loss, as the
    conversion reads ``logits, loss = model(x, y)``). The padding repeats are inside that mean, and
    ``gather_for_metrics`` trims gathered rows, not samples inside a mean: it cannot drop them
    (gathering the per-sample losses can). ``loss.repeat(batch_size)`` is per sample again. Also
    one row of it (``loss_mel.unsqueeze(0)``), a sum of losses (``(loss_fm_s +
    loss_fm_f).unsqueeze(0)``), and the batch's size beside them (``torch.tensor(x.size(0))``):
    one value per rank, as a HiFi-GAN vocoder's validation gathers them."""
    if not gather.args:
        return False
    return _one_value_per_rank(gather.args[0].value)


def _one_value_per_rank(value: cst.BaseExpression) -> bool:
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _SAME_VALUE + _ONE_ROW
    ):
        value = value.func.value
    if isinstance(value, cst.BinaryOperation):
        return _one_value_per_rank(value.left) and _one_value_per_rank(value.right)
    if isinstance(value, cst.Call) and dotted(value.func) == "torch.tensor" and value.args:
        first = value.args[0].value
        if isinstance(first, cst.List) and len(first.elements) == 1:
            return True  # ``torch.tensor([batch_mae])``: one number of this rank's batch
        return _batch_size(first)
    name = dotted(value)
    return name is not None and "loss" in name.rsplit(".", 1)[-1].lower()


def _batch_size(value: cst.BaseExpression) -> bool:
    """``x.size(0)``, ``x.shape[0]``, ``len(x)``: how many samples this rank's batch holds."""
    if isinstance(value, cst.Call):
        if dotted(value.func) == "len":
            return True
        func = value.func
        return isinstance(func, cst.Attribute) and func.attr.value == "size" and bool(value.args)
    return isinstance(value, cst.Subscript) and (dotted(value.value) or "").endswith(".shape")
