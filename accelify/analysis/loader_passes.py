"""Prepared DataLoaders whose every pass starts with a collective.

Iterating a prepared DataLoader is each rank's own work, except where the loader must agree on
something with the other ranks as a pass starts. HF Accelerate's ``DataLoaderShard.__iter__``
synchronises its sampler's generator (``synchronize_rng_states``: a ``broadcast`` from rank 0)
when the DataLoader shuffles (a ``RandomSampler``, ``shuffle=True``); accelify's runtime
broadcasts rank 0's seed for that pass the same way (`runtime/data.py`). With
``dispatch_batches=True`` rank 0 reads every batch and broadcasts it. A loader that reads its
data in order (``shuffle=False``, an evaluation loader) meets nobody: measured on 2 CPU ranks
(HF Accelerate 1.15 and accelify), a main-process-only pass over it returns, over a shuffled
one it hangs in the broadcast.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis.loops import loop_source
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, strip_self_methods, walk

#: Builtins that read a whole pass of the iterable they are handed (``list(loader)``), and
#: ``next``, which starts one (``next(iter(loader))``: the first batch of a fresh pass).
_PASS_READERS = frozenset({"list", "tuple", "set", "sorted", "next"})
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)

_SHUFFLING_SAMPLERS = frozenset(
    {"torch.utils.data.RandomSampler", "torch.utils.data.sampler.RandomSampler"}
)
#: Where a script turns on dispatched batches (rank 0 reads, then broadcasts each batch).
_DISPATCH_SETTINGS = ("Accelerator", "DataLoaderConfiguration")


def pass_collective(script: ScriptModel, loader: str) -> str | None:
    """What each pass over the prepared DataLoader ``loader`` (a name ``prepare`` returned)
    does with the other ranks as it starts, in words for advice: its DataLoader, as the file
    builds it, shuffles, or the script dispatches batches. None where it meets nobody, or the
    file does not show the loader being built."""
    if _dispatches_batches(script):
        return "with dispatch_batches=True, rank 0 reads every batch and broadcasts it"
    source = _prepared_from(script, loader)
    if source is not None and _shuffles(script, source):
        return "it shuffles, and each pass starts with a broadcast of rank 0's shuffling seed"
    return None


def passes_read(script: ScriptModel) -> list[tuple[cst.For | cst.BaseExpression, str]]:
    """Where the file starts a pass over something it names, with that name: its ``for``
    loops, its comprehensions and generator expressions (``[len(x) for x, y in loader]``,
    ``sum(len(x) for x, y in loader)``: the comprehension), and the builtins that read a pass
    (``list(loader)``, ``next(iter(loader))``: the outer call). Iterating a prepared
    DataLoader by any of these runs its ``__iter__``, where a shuffling one broadcasts. A
    comprehension or call inside another one read from the same name is the same pass."""
    found: list[tuple[cst.For | cst.BaseExpression, str]] = []
    loops = [(loop.node, loop.iterable) for loop in script.loops if loop.iterable is not None]
    taken: list[tuple[cst.CSTNode, str]] = [(node.iter, name) for node, name in loops]
    for node in walk(script.module):
        iterable = _expression_pass(node)
        if iterable is None or any(
            name == iterable and script.inside(node, outer) for outer, name in taken
        ):
            continue
        taken.append((node, iterable))
        found.append((node, iterable))
    return [*loops, *found, *_iterator_passes(script)]


def _iterator_passes(script: ScriptModel) -> list[tuple[cst.CSTNode, str]]:
    """The draw that starts a pass of an iterator the file keeps (``it = iter(loader)``,
    ``self._it = iter(self.loader)``, ``batches = cycle(loader)``), with the loader: ``iter()``
    starts nothing, the prepared loader meets the other ranks at its first batch (a
    ``next(it)``, or a ``for`` over ``it``). Only where that first draw is known: the first in
    source order of the iterator's draws, all of them in one function (a method's call may come
    before another's, in any order)."""
    draws: dict[int, list[cst.CSTNode]] = {}
    made: dict[int, cst.Call] = {}
    loops = [loop.node for loop in script.loops]
    for node in [*script.calls, *loops]:
        made_by = iterator_made(script, node)
        if made_by is not None:
            draws.setdefault(id(made_by), []).append(node)
            made[id(made_by)] = made_by
    found: list[tuple[cst.CSTNode, str]] = []
    for key, nodes in draws.items():
        functions = {id(script.index.enclosing_function(node)) for node in nodes}
        loader = loop_source(made[key].args[0].value)
        if len(functions) == 1 and loader is not None:
            found.append((min(nodes, key=script.order), loader))
    return found


def iterator_made(script: ScriptModel, node: cst.CSTNode) -> cst.Call | None:
    """The ``iter(loader)`` (or ``cycle(loader)``) that ``node``, a ``next(it)`` or a ``for``
    over ``it``, draws from: every binding of ``it`` (in the function around it, or of
    ``self.it`` in its class) is such a call of one same loader; the first of them. None for
    anything else."""
    drawn = _drawn(node)
    name = dotted(drawn) if drawn is not None else None
    attribute = name is not None and name.startswith("self.") and name.count(".") == 1
    if name is None or ("." in name and not attribute):
        return None
    index = script.index
    if attribute:
        bindings = index.assignments_in_class(name, node)
    else:
        scope = index.enclosing_function(node)
        bindings = [a for a in index.assignments_to(name) if index.enclosing_function(a) is scope]
    values = [
        binding.value if isinstance(binding, cst.Assign) and len(binding.targets) == 1 else None
        for binding in bindings
    ]
    if not values or not all(_iter_call(value) for value in values):
        return None
    sources = {loop_source(value.args[0].value) for value in values}  # type: ignore[union-attr]
    return values[0] if len(sources) == 1 else None  # type: ignore[return-value]


def _drawn(node: cst.CSTNode) -> cst.BaseExpression | None:
    """``it`` of ``next(it)`` and of ``for batch in it:`` (also ``enumerate(it)``)."""
    if isinstance(node, cst.For):
        iterated = node.iter
        while (
            isinstance(iterated, cst.Call)
            and iterated.args
            and dotted(iterated.func)
            in (
                "enumerate",
                "tqdm",
                "tqdm.tqdm",
            )
        ):
            iterated = iterated.args[0].value
        return iterated
    if (
        isinstance(node, cst.Call)
        and dotted(node.func) == "next"
        and node.args
        and node.args[0].keyword is None
        and not node.args[0].star
    ):
        return node.args[0].value
    return None


#: What makes an iterator of a loader whose first batch starts a pass: ``cycle`` (itertools', or
#: a script's own generator, ``while True: for x in dl: yield x``) iterates it at its first draw.
_ITERATORS = frozenset({"iter", "cycle", "itertools.cycle"})


def _iter_call(value: cst.BaseExpression | None) -> bool:
    """``iter(loader)``, ``cycle(loader)``: one positional argument."""
    return (
        isinstance(value, cst.Call)
        and dotted(value.func) in _ITERATORS
        and len(value.args) == 1
        and value.args[0].keyword is None
        and not value.args[0].star
    )


def _expression_pass(node: cst.CSTNode) -> str | None:
    """The name a comprehension, or a pass-reading builtin's call, iterates."""
    if isinstance(node, _COMPREHENSIONS):
        return loop_source(node.for_in.iter)
    if (
        isinstance(node, cst.Call)
        and dotted(node.func) in _PASS_READERS
        and len(node.args) >= 1
        and node.args[0].keyword is None
        and not node.args[0].star
    ):
        handed = node.args[0].value
        # next(batches) continues a pass, next(iter(loader)) starts one; iter() alone starts
        # nothing (HF's and accelify's prepared loaders meet at the first batch)
        starts = isinstance(handed, cst.Call) and dotted(handed.func) == "iter"
        return loop_source(handed) if starts or dotted(node.func) != "next" else None
    return None


def _prepared_from(script: ScriptModel, loader: str) -> str | None:
    """The name ``prepare`` took the DataLoader ``loader`` from (``train_dl =
    accelerator.prepare(train_loader)``: ``train_loader``)."""
    for prepare in script.prepare_calls:
        for index, output in enumerate(prepare.outputs):
            if output == loader and index < len(prepare.inputs) and prepare.inputs[index]:
                return prepare.inputs[index]
    return None


def _shuffles(script: ScriptModel, name: str) -> bool:
    """Every DataLoader the file binds to ``name`` is built shuffling: ``shuffle=True`` or a
    ``RandomSampler`` as its ``sampler=``."""
    made = [
        strip_self_methods(binding.value)
        for binding in script.of_kind(Kind.DATALOADER)
        if binding.name == name
    ]
    return bool(made) and all(
        isinstance(value, cst.Call) and _shuffling_call(script, value) for value in made
    )


def _shuffling_call(script: ScriptModel, call: cst.Call) -> bool:
    for argument in call.args:
        keyword = argument.keyword.value if argument.keyword is not None else None
        if keyword == "shuffle" and dotted(argument.value) == "True":
            return True
        value = argument.value
        if (
            keyword == "sampler"
            and isinstance(value, cst.Call)
            and script.call_names(value) & _SHUFFLING_SAMPLERS
        ):
            return True
    return False


def _dispatches_batches(script: ScriptModel) -> bool:
    """``Accelerator(dispatch_batches=True)`` or ``DataLoaderConfiguration(dispatch_batches=
    True)`` in the file."""
    for call in script.calls:
        called = dotted(call.func) or ""
        if not called.endswith(_DISPATCH_SETTINGS):
            continue
        for argument in call.args:
            if (
                argument.keyword is not None
                and argument.keyword.value == "dispatch_batches"
                and dotted(argument.value) == "True"
            ):
                return True
    return False
