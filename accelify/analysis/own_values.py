"""Values one rank computed alone: what a rank folds from its shard of a prepared DataLoader
(a validation loss summed over its batches, in a loop or a comprehension, the training loss
from its ``loss.item()``), followed back through the bindings of the names a value reads,
loops, the file's own functions (their returns, with their parameters bound to the call's
arguments) and a helper's parameters. A collective on the way (``accelerator.reduce``,
``gather``, ``dist.all_reduce`` in place) makes the ranks agree and ends that path; a count of
batches or samples is the same on every rank.

ACC409 asks it of a plateau scheduler's metric, ACC420 of a stop's test."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import libcst as cst

from accelify.analysis.collectives import agreed_in_place, agrees_across_ranks
from accelify.analysis.dataflow import bound_by, statements, variables_in
from accelify.analysis.facts import Facts
from accelify.analysis.loops import enumerates
from accelify.analysis.name_scopes import binding_spellings
from accelify.analysis.objects import bound_arguments, callee
from accelify.analysis.returned_values import returned_tuples, unpacked_slot
from accelify.analysis.script_model import Kind, Loop, ScriptModel
from accelify.analysis.syntax import dotted, is_generator_function, target_names, walk

#: How many helpers deep a value is followed (``fit`` → ``evaluate`` → ``_loss_over``).
_DEPTH = 3

#: The key under which a method call's receiver is passed (no parameter is spelt so).
_RECEIVER = "<receiver>"


#: What makes an iterator over a loader that ``next`` draws batches from.
_ITERATORS = frozenset({"iter", "builtins.iter", "itertools.cycle"})


@dataclass(frozen=True)
class ShardView:
    """Which loaders are sharded, for a caller that asks before they are: the conversion reads
    the original script, where nothing is prepared yet, and names what it prepares. ``prepared``:
    the names it prepares (a comprehension over one, a parameter handed one); ``loop``: whether
    a loop reads one."""

    prepared: frozenset[str]
    loop: Callable[[Loop], bool]


class OwnValues:
    """Follows a value back to where it came from: the last binding of each name it reads
    before the place it is read (``=``, ``+=``, ``.append``), the target of the ``for`` around
    that place, the returns of the file's functions it calls (with their parameters bound to
    that call's arguments) and a helper's parameters. Data of this rank enters through the
    target of a loop over a prepared DataLoader (its shard); a collective on the way makes the
    ranks agree and ends that path."""

    def __init__(self, facts: Facts, view: ShardView | None = None) -> None:
        self.facts = facts
        self.script = facts.model
        self.view = view
        self.seen: set[tuple[str, int]] = set()

    def _prepared(self) -> set[str]:
        extra = self.view.prepared if self.view is not None else frozenset()
        return self.script.prepared_names | extra

    def origin(
        self,
        value: cst.CSTNode,
        at: cst.CSTNode,
        passed: dict[str, cst.BaseExpression],
        depth: int = _DEPTH,
        folded: cst.CSTNode | None = None,
    ) -> cst.CSTNode | None:
        """The statement in a loop over a prepared loader that folds this rank's batches into
        ``value`` (the outermost on the way), or None."""
        if _agrees(self.script, value):
            return None
        for node in walk(value):
            if isinstance(node, cst.GeneratorExp | cst.ListComp | cst.SetComp) and self._over_shard(
                node, passed
            ):
                return folded or at
        zipped: set[str] = set()
        for node in walk(value):
            entry = (
                self._zipped_entry(node, at, passed, depth, folded)
                or self._dict_entry(node, at, passed, depth, folded)
                or self._filled_entry(node, at, depth, folded)
            )
            if entry is None:
                continue
            base, found = entry
            if found is not None:
                return found
            zipped.add(base)
        for call in walk(value):
            if isinstance(call, cst.Call) and self._drawn_from_shard(call, passed):
                return folded or at
        followed: set[int] = set()  # the nodes of calls whose returns were followed
        if depth > 0:
            for call in walk(value):
                found = self._through_callee(call, depth, folded)
                if found is not None:
                    return found
                if self._returns_followed(call):
                    followed |= {id(node) for node in walk(call) if node is not call}
        outside = {
            dotted(node)
            for node in walk(value)
            if isinstance(node, cst.Name | cst.Attribute) and id(node) not in followed
        }
        for name in names_read(self.script, value):
            if name in zipped or name not in outside:
                # ``out = self.validation_step(batch)``: the batch is the parameter the
                # method's returns were followed with (a gathered result is the same on
                # every rank)
                continue
            found = self._name(name, at, passed, depth, folded)
            if found is not None:
                return found
        return None

    def _zipped_entry(
        self,
        node: cst.CSTNode,
        at: cst.CSTNode,
        passed: dict[str, cst.BaseExpression],
        depth: int,
        folded: cst.CSTNode | None,
    ) -> tuple[str, cst.CSTNode | None] | None:
        """For ``metrics["val_loss"]`` of ``metrics = dict(zip(keys, values))`` (or ``{k: v
        for k, v in zip(keys, values)}``): the dict's name and the origin of the one value
        zipped with that key, found by its place among the keys and the values (a ``*helper()``
        among them stands for as many as the helper's returned tuples hold). None when ``node``
        is no such entry; the origin is None too when the entry cannot be told (keys or values
        that are no literal list): the other entries are no part of it, so nothing is followed."""
        entry = _literal_key_entry(node)
        if entry is None:
            return None
        base, key = entry
        binding = _last_binding(self.facts, base, at)
        pair = _zipped(binding)
        if binding is None or pair is None:
            return None
        keys = self._elements(pair[0], binding)
        values = self._elements(pair[1], binding)
        if keys is None or values is None:
            return base, None
        names = [
            k.value.evaluated_value if isinstance(k.value, cst.SimpleString) else None for k in keys
        ]
        if key not in names or any(isinstance(k, cst.StarredElement) for k in keys):
            return base, None
        return base, self._slot(values, names.index(key), binding, passed, depth, folded)

    def _dict_entry(
        self,
        node: cst.CSTNode,
        at: cst.CSTNode,
        passed: dict[str, cst.BaseExpression],
        depth: int,
        folded: cst.CSTNode | None,
    ) -> tuple[str, cst.CSTNode | None] | None:
        """For ``logs["val_loss"]`` of ``logs = {"train_loss": total / n, "val_loss": ...}``
        (bound here, or handed down as a parameter by every call): the dict's name and the
        origin of the entry under that key alone (the other entries are no part of it). None
        when ``node`` is no such entry."""
        entry = _literal_key_entry(node)
        if entry is None or "." in entry[0]:
            return None
        base, key = entry
        displays = self._dict_displays(base, at, passed, depth)
        if not displays:
            return None
        for display, where in displays:
            entries = [
                e
                for e in display.elements
                if isinstance(e, cst.DictElement)
                and isinstance(e.key, cst.SimpleString)
                and e.key.evaluated_value == key
            ]
            if len(entries) != 1 or any(
                isinstance(e, cst.StarredDictElement) for e in display.elements
            ):
                return None  # the entry cannot be told: the name is followed whole
            found = self.origin(entries[0].value, where, {}, depth, folded)
            if found is not None:
                return base, found
        return base, None

    def _filled_entry(
        self, node: cst.CSTNode, at: cst.CSTNode, depth: int, folded: cst.CSTNode | None
    ) -> tuple[str, cst.CSTNode | None] | None:
        """For ``self.loss["train"]`` (also read as ``self.loss["train"][-1]``) of a dict whose
        entries the file fills by key, ``self.loss["train"].append(epoch_loss)`` or
        ``history["val"] = val_loss``: the dict's name and the origin of what is put under
        that key, followed where it is put (for ``self.x``, in any method of the class: a
        trainer's ``_train_epoch`` appends the mean of this rank's batches, and ``train()``
        steps its plateau scheduler on the last one). None when ``node`` is no such entry or
        nothing is put under the key (the name is then followed whole, as before)."""
        entry = _literal_key_entry(node)
        if entry is None:
            return None
        base, key = entry
        fills = _fills(self.facts, base, key, at)
        if not fills:
            return None
        for statement, value in fills:
            # ``batch["ids"] = batch["ids"].repeat(2)``: the value reads the entry it refills,
            # followed once
            seen = (f"{base}[{key!r}]", id(statement))
            if seen in self.seen:
                continue
            self.seen.add(seen)
            found = self.origin(value, statement, {}, depth, folded)
            if found is not None:
                return base, found
        return base, None

    def _dict_displays(
        self, name: str, at: cst.CSTNode, passed: dict[str, cst.BaseExpression], depth: int
    ) -> list[tuple[cst.Dict, cst.CSTNode]]:
        """The dict displays ``name`` holds at ``at``, with where each is bound: its last
        binding, or every argument the calls of its function pass for it. Empty when one of
        them is no dict display."""
        binding = _last_binding(self.facts, name, at)
        if binding is not None:
            value = binding.value if isinstance(binding, cst.Assign) else None
            return [(value, binding)] if isinstance(value, cst.Dict) else []
        if name in passed:
            given = passed[name]
            if isinstance(given, cst.Dict):
                return [(given, given)]
            if isinstance(given, cst.Name) and depth > 0:
                return self._dict_displays(given.value, given, {}, depth - 1)
            return []
        if depth == 0:
            return []
        found: list[tuple[cst.Dict, cst.CSTNode]] = []
        arguments = self.facts.flow.call_site_arguments(name, at)
        for argument in arguments:
            given = argument.value
            if isinstance(given, cst.Dict):
                found.append((given, argument))
            elif isinstance(given, cst.Name):
                more = self._dict_displays(given.value, argument, {}, depth - 1)
                if not more:
                    return []
                found += more
            else:
                return []
        return found

    def _elements(
        self, value: cst.BaseExpression, at: cst.CSTNode
    ) -> Sequence[cst.BaseElement] | None:
        """The elements of a list or tuple written out, here or as the last binding of the name
        ``value`` reads."""
        name = dotted(value)
        if name is not None:
            binding = _last_binding(self.facts, name, at)
            value = getattr(binding, "value", None) if isinstance(binding, cst.Assign) else None
        if isinstance(value, cst.List | cst.Tuple):
            return value.elements
        return None

    def _slot(
        self,
        values: Sequence[cst.BaseElement],
        slot: int,
        binding: cst.CSTNode,
        passed: dict[str, cst.BaseExpression],
        depth: int,
        folded: cst.CSTNode | None,
    ) -> cst.CSTNode | None:
        """The origin of the ``slot``-th of ``values``, a ``*helper(...)`` spread over as many
        slots as its returned tuples hold (None when their length cannot be told)."""
        offset = 0
        for element in values:
            if not isinstance(element, cst.StarredElement):
                if offset == slot:
                    return self.origin(element.value, binding, passed, depth, folded)
                offset += 1
                continue
            spread = self._returned_tuples(element.value) if depth > 0 else None
            if spread is None:
                return None
            bound, returns = spread
            width = len(returns[0].elements)
            if offset + width > slot:
                for returned in returns:
                    picked = returned.elements[slot - offset].value
                    found = self.origin(picked, picked, bound, depth - 1, folded)
                    if found is not None:
                        return found
                return None
            offset += width
        return None

    def _returned_tuples(
        self, call: cst.BaseExpression
    ) -> tuple[dict[str, cst.BaseExpression], list[cst.Tuple]] | None:
        """The tuples a function of the file returns (all written out, all as long) with its
        parameters bound to ``call``'s arguments."""
        target = callee(self.script, call) if isinstance(call, cst.Call) else None
        if target is None:
            return None
        function, implicit = target
        tuples = returned_tuples([r.value for r in self.script.index.own_returns(function)])
        if tuples is None:
            return None
        bound = {
            name: argument.value
            for name, argument in bound_arguments(function, call, implicit)  # type: ignore[arg-type]
        }
        return bound, tuples

    def _returns_followed(self, call: cst.CSTNode) -> bool:
        """``call`` runs a function of the file that returns a value (followed by
        `_through_callee`, with its parameters bound to the call's arguments). A method that
        returns nothing here (``def cal_loss(self, batch): raise NotImplementedError``, which
        a subclass overrides) is read as any call the file does not define: from its
        arguments."""
        target = callee(self.script, call) if isinstance(call, cst.Call) else None
        return target is not None and bool(self.script.index.own_returns(target[0]))

    def _through_callee(
        self, call: cst.CSTNode, depth: int, folded: cst.CSTNode | None
    ) -> cst.CSTNode | None:
        target = callee(self.script, call) if isinstance(call, cst.Call) else None
        if target is None:
            return None
        function, implicit = target
        passed = {
            name: argument.value
            for name, argument in bound_arguments(function, call, implicit)  # type: ignore[arg-type]
        }
        if implicit == 1 and isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
            # ``train_metric.compute()``: what its ``self.sse`` sums is what the calls on
            # ``train_metric`` hand it, not ``val_metric``'s (`_parameter`)
            passed[_RECEIVER] = call.func.value
        for returned in self.script.index.own_returns(function):
            found = self.origin(returned, returned, passed, depth - 1, folded)
            if found is not None:
                return found
        return None

    def _name(
        self,
        name: str,
        at: cst.CSTNode,
        passed: dict[str, cst.BaseExpression],
        depth: int,
        folded: cst.CSTNode | None,
    ) -> cst.CSTNode | None:
        binding = _last_binding(self.facts, name, at)
        loop = self._loop_binding(name, at, binding)
        key = (name, id(loop or binding or at))
        if key in self.seen:
            return None
        self.seen.add(key)
        if loop is not None:
            if _enumerated_index(loop, name):
                return None  # ``for step, batch in enumerate(loader)``: a count
            if self._sharded(loop, passed):
                return folded or loop
            return self.origin(loop.iter, loop, passed, depth, folded)
        if binding is None:
            return self._parameter(name, at, passed, depth, folded)
        if _agrees(self.script, binding) or _counts(binding):
            return None
        if folded is None and self._in_sharded_loop(binding, passed):
            folded = binding
        unpacked = unpacked_slot(binding, name)
        spread = (
            self._returned_tuples(unpacked[0].value) if unpacked is not None and depth > 0 else None
        )
        if (
            spread is not None
            and unpacked is not None
            and len(spread[1][0].elements) == unpacked[2]
        ):
            slot = unpacked[1]
            # ``em, hits, _, _ = self.evaluate(...)``: ``em`` is the first of what it returns
            # (decoded from gathered outputs), not ``hits`` (its own shard's retrievals)
            bound, returns = spread
            for returned in returns:
                picked = returned.elements[slot].value
                found = self.origin(picked, picked, bound, depth - 1, folded)
                if found is not None:
                    return found
            return None
        return self.origin(binding, binding, passed, depth, folded)

    def _parameter(
        self,
        name: str,
        at: cst.CSTNode,
        passed: dict[str, cst.BaseExpression],
        depth: int,
        folded: cst.CSTNode | None,
    ) -> cst.CSTNode | None:
        """A parameter: what this call passes, else what every call site passes."""
        if name in passed:
            return self.origin(passed[name], passed[name], {}, depth, folded)
        if depth == 0:
            return None
        receiver = dotted(passed[_RECEIVER]) if _RECEIVER in passed else None
        for argument in self.facts.flow.call_site_arguments(name, at):
            call = self.script.parent(argument)
            if (
                receiver not in (None, "self")
                and isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and dotted(call.func.value) not in (None, "self", receiver)
            ):
                continue  # a call on another instance of the class
            found = self.origin(argument.value, argument, {}, depth - 1, folded)
            if found is not None:
                return found
        return None

    def _loop_binding(
        self, name: str, at: cst.CSTNode, binding: cst.CSTNode | None
    ) -> cst.For | None:
        """The ``for`` around ``at`` whose target binds ``name`` after ``binding`` did."""
        for ancestor in self.script.ancestors(at):
            if isinstance(ancestor, cst.FunctionDef):
                return None
            if (
                isinstance(ancestor, cst.For)
                and name in target_names(ancestor.target)
                and (binding is None or not self.facts.placement.inside(binding, ancestor))
            ):
                return ancestor
        return None

    def _sharded(self, loop: cst.For, passed: dict[str, cst.BaseExpression]) -> bool:
        """A loop over a prepared DataLoader: by the argument this call passes for the
        parameter it iterates, else as the analysis knows it."""
        found = next((entry for entry in self.script.loops if entry.node is loop), None)
        if found is None:
            return False
        if found.iterable in passed:
            given = dotted(passed[found.iterable])
            return given is not None and given in self._prepared()
        if self.view is not None and self.view.loop(found):
            return True
        return self.facts.flow.over_prepared_loader(found)

    def _drawn_from_shard(self, call: cst.Call, passed: dict[str, cst.BaseExpression]) -> bool:
        """``next(it)`` of an iterator over a prepared DataLoader: ``it = iter(loader)``, or a
        generator the file defines handed the loader (lucidrains' ``dl_iter =
        cycle(self.dataloader)``), also through a helper's parameter (``batch =
        next(dl_iter)`` in ``self.next_data(dl_iter)``): a batch drawn by hand from this rank's
        shard, as a loop's target is one."""
        if dotted(call.func) != "next" or not call.args:
            return False
        source = call.args[0].value
        name = dotted(source)
        if name in passed:  # a parameter: what this call of its function hands it
            source = passed[name]
            name = dotted(source)
        if isinstance(source, cst.Call):
            made: object = source  # ``next(iter(loader))``: the iterator made in place
        elif name is None:
            return False
        else:
            made = getattr(_last_binding(self.facts, name, source), "value", None)
        if not isinstance(made, cst.Call) or len(made.args) != 1:
            return False
        if dotted(made.args[0].value) not in self._prepared():
            return False
        # ``cycle`` imported from itertools as well as spelled ``itertools.cycle``
        if dotted(made.func) in _ITERATORS or self.script.call_names(made) & _ITERATORS:
            return True
        target = callee(self.script, made)
        return target is not None and is_generator_function(target[0])

    def _over_shard(
        self,
        comprehension: cst.GeneratorExp | cst.ListComp | cst.SetComp,
        passed: dict[str, cst.BaseExpression],
    ) -> bool:
        """``sum(loss_fn(model(x), y).item() for x, y in val_loader)`` over a prepared DataLoader
        (by the argument this call passes for it, else as the file prepares it), its element
        read from the batch: this rank's shard folded (a count, ``len(y) for x, y in loader``, is
        not)."""
        if _a_count(comprehension.elt):
            return False
        read = variables_in(self.script, comprehension.elt)
        level: cst.CompFor | None = comprehension.for_in
        while level is not None:
            iterated = dotted(level.iter)
            if iterated in passed:
                iterated = dotted(passed[iterated])
            if iterated in self._prepared() and read & set(target_names(level.target)):
                return True
            level = level.inner_for_in
        return False

    def _in_sharded_loop(
        self, statement: cst.CSTNode, passed: dict[str, cst.BaseExpression]
    ) -> bool:
        return any(
            self.facts.placement.inside(statement, loop.node) and self._sharded(loop.node, passed)
            for loop in self.script.loops
        )


def _enumerated_index(loop: cst.For, name: str) -> bool:
    """``name`` is the count of ``for name, batch in enumerate(...)``: the same on every rank."""
    target = loop.target
    return (
        enumerates(loop.iter)  # also under a progress bar: ``tqdm(enumerate(loader))``
        and isinstance(target, cst.Tuple)
        and bool(target.elements)
        and dotted(target.elements[0].value) == name
    )


def _zipped(binding: cst.CSTNode | None) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The keys and the values of ``dict(zip(keys, values))`` or ``{k: v for k, v in zip(keys,
    values)}`` that ``binding`` assigns."""
    value = binding.value if isinstance(binding, cst.Assign) else None
    inner: cst.BaseExpression | None = None
    if isinstance(value, cst.Call) and dotted(value.func) == "dict" and len(value.args) == 1:
        if value.args[0].keyword is None and not value.args[0].star:
            inner = value.args[0].value
    elif (
        isinstance(value, cst.DictComp)
        and value.for_in.inner_for_in is None
        and not value.for_in.ifs
        and isinstance(value.for_in.target, cst.Tuple)
        and [dotted(e.value) for e in value.for_in.target.elements]
        == [dotted(value.key), dotted(value.value)]
    ):
        inner = value.for_in.iter
    if not (isinstance(inner, cst.Call) and dotted(inner.func) == "zip" and len(inner.args) == 2):
        return None
    if any(argument.keyword is not None or argument.star for argument in inner.args):
        return None
    return inner.args[0].value, inner.args[1].value


def names_read(script: ScriptModel, value: cst.CSTNode) -> list[str]:
    """The variables ``value`` reads, and the ``self.x`` attributes (a total kept on the
    trainer); for a binding, only its right-hand side (and an augmented target, which it reads)."""
    if isinstance(value, cst.Assign | cst.AnnAssign):
        read: cst.CSTNode | None = value.value
    elif isinstance(value, cst.AugAssign):
        return [*(names_read(script, value.value)), *(_target_name(value.target))]
    elif isinstance(value, cst.Expr):
        read = value.value
    else:
        read = value
    if read is None:
        return []
    names = sorted(variables_in(script, read))
    members = sorted(
        {
            name
            for node in walk(read)
            if isinstance(node, cst.Attribute)
            and (name := dotted(node)) is not None
            and name.startswith("self.")
            and name.count(".") == 1
        }
    )
    return [*members, *(n for n in names if n != "self")]


def _target_name(target: cst.BaseExpression) -> list[str]:
    name = dotted(target)
    return [name] if name is not None else []


def _last_binding(facts: Facts, name: str, at: cst.CSTNode) -> cst.CSTNode | None:
    """The last statement before ``at`` in its function (the module for a flat script) that
    binds ``name`` (``=``, ``+=``, an annotated one, ``.append(...)`` to a list); for
    ``self.x``, the last one in any method of the class."""
    script = facts.model
    function = facts.placement.enclosing_function(at)
    block: cst.CSTNode | None = function.body if function is not None else script.module
    if name.startswith("self."):
        block = script.index.nearest(at, cst.ClassDef) if function is not None else None
    if block is None:
        return None
    # "before ``at``" is where the statement starts, in the file's text; source order (no
    # code generation: `ScriptModel.position`) tells it but for the statement that holds
    # ``at`` (``x = f(x)`` asked at ``f(x)``), which comes before ``at`` only when it starts
    # before it, and is the last statement before ``at`` either way
    here = script.order(at)
    found: cst.CSTNode | None = None
    for small in statements(block):
        if facts.placement.enclosing_function(small) is not function and not name.startswith(
            "self."
        ):
            continue
        if not name.startswith("self."):
            if script.order(small) >= here:
                break
            if script.inside(at, small):
                if binds(script, small, name) and _position(script, small) < _position(script, at):
                    found = small
                break
        if binds(script, small, name):
            found = small
    return found


def _fills(
    facts: Facts, base: str, key: str | bytes, at: cst.CSTNode
) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
    """The statements that put a value under ``base[key]``, each with that value:
    ``base[key].append(value)`` (or ``extend``) and ``base[key] = value``, in the function of
    ``at`` (the module for a flat script; for ``self.x``, in any method of the class)."""
    script = facts.model
    function = facts.placement.enclosing_function(at)
    block: cst.CSTNode | None = function.body if function is not None else script.module
    if base.startswith("self."):
        block = script.index.nearest(at, cst.ClassDef) if function is not None else None
    if block is None:
        return []
    found: list[tuple[cst.CSTNode, cst.BaseExpression]] = []
    for small in statements(block):
        if (
            not base.startswith("self.")
            and facts.placement.enclosing_function(small) is not function
        ):
            continue
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            if _literal_key_entry(small.targets[0].target) == (base, key):
                found.append((small, small.value))
            continue
        call = small.value if isinstance(small, cst.Expr) else None
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in ("append", "extend")
            and len(call.args) == 1
            and _literal_key_entry(call.func.value) == (base, key)
        ):
            found.append((small, call.args[0].value))
    return found


def binds(script: ScriptModel, small: cst.CSTNode, name: str) -> bool:
    """``name = ...``, ``name += ...``, ``name.append(...)``; and ``dist.all_reduce(name)``,
    which writes the value every rank agrees on into ``name``."""
    if isinstance(small, cst.Assign):
        return any(name in _dotted_targets(t.target) for t in small.targets) or name in bound_by(
            small
        )
    if isinstance(small, cst.AugAssign | cst.AnnAssign):
        return dotted(small.target) == name or name in bound_by(small)
    call = small.value if isinstance(small, cst.Expr) else None
    if isinstance(call, cst.Call) and _written_in_place(script, call) == name:
        return True
    if isinstance(call, cst.Call) and _set_by_setattr(script, call, name):
        return True
    if isinstance(call, cst.Call) and name in _set_by_dict_update(call):
        return True
    return (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value in ("append", "extend")
        and dotted(call.func.value) == name
    )


def may_bind(script: ScriptModel, small: cst.CSTNode, name: str) -> bool:
    """`binds`, or ``setattr(owner, key, ...)`` on the owner of ``name`` (``self`` of
    ``self.bad``) with a key the file does not pin to one string (`_module_string`: a name
    bound by a ``for``, an import, twice, a parameter): it may write ``name``. A stop's counter
    is followed through such a write too, so an unread key makes the stop collective (which
    costs nothing where the ranks agree) rather than leave a per-rank ``break``."""
    if binds(script, small, name):
        return True
    call = small.value if isinstance(small, cst.Expr) else None
    if not (isinstance(call, cst.Call) and dotted(call.func) == "setattr" and len(call.args) == 3):
        return False
    owner = dotted(call.args[0].value)
    if owner is None or not name.startswith(f"{owner}.") or "." in name[len(owner) + 1 :]:
        return False  # it writes ``owner.<key>``, not a member of one (``self.acc.check``)
    if name in script.names_of(Kind.ACCELERATOR):
        return False  # ``if self.accelerator.check_trigger():`` asks every rank
    return _module_string(script, call.args[1].value, call) is None


def _dotted_targets(target: cst.BaseExpression) -> set[str]:
    """``self.best`` and ``self.bad`` of ``self.best, self.bad = ...``: an unpacking binds each
    of its elements as a plain assignment would."""
    if isinstance(target, cst.Tuple | cst.List):
        return {name for element in target.elements for name in _dotted_targets(element.value)}
    if isinstance(target, cst.StarredElement):
        return _dotted_targets(target.value)
    name = dotted(target) or _dict_entry_attribute(target)
    return {name} if name else set()


def _set_by_setattr(script: ScriptModel, call: cst.Call, name: str) -> bool:
    """``setattr(self, "bad", value)`` writes ``self.bad``: the same write as ``self.bad =
    value``, spelt so that an assignment's targets do not show it. A key the module binds once
    to a string (``KEY = "bad"``), or an entry of a dict of strings it binds once
    (``NAMES["counter"]`` of ``NAMES = {"counter": "bad"}``), is read as that string."""
    if dotted(call.func) != "setattr" or len(call.args) != 3:
        return False
    owner = dotted(call.args[0].value)
    if owner is None or not name.startswith(f"{owner}."):
        return False
    return _module_string(script, call.args[1].value, call) == name[len(owner) + 1 :]


def _module_string(
    script: ScriptModel, key: cst.BaseExpression, at: cst.CSTNode | None = None
) -> str | None:
    """The string ``key`` surely is: a literal (implicit concatenation too), a name bound once
    to a literal at the module's top level or in the function around ``at`` (``key =
    "bad_epochs"`` before ``setattr(self, key, 0)``), such a name's dict display's entry under
    a literal key, or ``self.KEY`` of a class constant (``KEY = "bad_epochs"`` in the class
    body around ``at``, no instance attribute of that name)."""
    if isinstance(key, (cst.SimpleString, cst.ConcatenatedString)):
        value = key.evaluated_value
        return value if isinstance(value, str) else None
    if at is not None and isinstance(key, cst.Attribute) and dotted(key.value) == "self":
        return _class_constant(script, key.attr.value, at)
    entry = None
    if (
        isinstance(key, cst.Subscript)
        and len(key.slice) == 1
        and isinstance(key.slice[0].slice, cst.Index)
    ):
        entry = _module_string(script, key.slice[0].slice.value, at)
        key = key.value
        if entry is None:
            return None
    if not isinstance(key, cst.Name):
        return None
    value = _sole_value(script, key.value, at)
    if value is None:
        return None
    if entry is None:
        return _module_string(script, value) if _is_string(value) else None
    if not isinstance(value, cst.Dict):
        return None
    for element in value.elements:
        if isinstance(element, cst.DictElement) and _module_string(script, element.key) == entry:
            found = element.value
            return _module_string(script, found) if _is_string(found) else None
    return None


def _sole_value(
    script: ScriptModel, name: str, at: cst.CSTNode | None
) -> cst.BaseExpression | None:
    """What ``name`` is bound to where the file binds it once, at the module's top level or in
    the function around ``at``: ``KEY = "bad"``, or its slot of an unpacking of a display of as
    many plain values (``KEY, OTHER = "bad", "x"``). Every binding of the name in the file
    counts (`binding_spellings`: a ``for``, an import, a ``with ... as``, a walrus, a rebinding
    through ``global``), so one the assignments do not show leaves the name unread (None)."""
    spelled = binding_spellings(script, name)
    if len(spelled) != 1:
        return None
    slots: list[tuple[cst.Tuple | cst.List, int]] = []  # the innermost unpacking first
    holder = script.parent(spelled[0])
    while isinstance(holder, cst.Element) and isinstance(
        outer := script.parent(holder), cst.Tuple | cst.List
    ):
        slots.append((outer, list(outer.elements).index(holder)))
        holder = script.parent(outer)
    if isinstance(holder, cst.AssignTarget):
        statement = script.parent(holder)
        if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
            return None
    elif isinstance(holder, cst.AnnAssign) and not slots:
        statement = holder
    else:
        return None
    scopes = {id(script.module)} | ({id(script.scope_of(at))} if at is not None else set())
    value = statement.value
    if id(script.scope_of(statement)) not in scopes or value is None:
        return None
    for unpacked, slot in reversed(slots):  # the outermost unpacking first
        if not isinstance(value, cst.Tuple | cst.List) or any(
            isinstance(element, cst.StarredElement)
            for element in (*value.elements, *unpacked.elements)
        ):
            return None
        if len(value.elements) != len(unpacked.elements):
            return None
        value = value.elements[slot].value
    return value


def _is_string(value: cst.BaseExpression) -> bool:
    return isinstance(value, (cst.SimpleString, cst.ConcatenatedString))


def _class_constant(script: ScriptModel, name: str, at: cst.CSTNode) -> str | None:
    """The literal string ``name`` is bound to once in the body of the class around ``at``,
    where no ``self.<name> = ...`` rebinds it on an instance."""
    owner = script.index.enclosing_class(at)
    if owner is None or script.index.assignments_to(f"self.{name}"):
        return None
    values = [
        statement.value
        for line in owner.body.body
        if isinstance(line, cst.SimpleStatementLine)
        for statement in line.body
        if isinstance(statement, (cst.Assign, cst.AnnAssign))
        for target in (
            [t.target for t in statement.targets]
            if isinstance(statement, cst.Assign)
            else [statement.target]
        )
        if isinstance(target, cst.Name) and target.value == name
    ]
    if len(values) != 1 or values[0] is None or not _is_string(values[0]):
        return None
    return _module_string(script, values[0])


def _dict_entry_attribute(target: cst.BaseExpression) -> str | None:
    """``self.bad`` for ``self.__dict__["bad"]`` or ``vars(self)["bad"]``: an attribute written
    through the instance's dict."""
    if not (
        isinstance(target, cst.Subscript)
        and len(target.slice) == 1
        and isinstance(target.slice[0].slice, cst.Index)
        and isinstance(target.slice[0].slice.value, cst.SimpleString)
    ):
        return None
    owner = _instance_dict_owner(target.value)
    attribute = target.slice[0].slice.value.evaluated_value
    return f"{owner}.{attribute}" if owner and isinstance(attribute, str) else None


def _instance_dict_owner(node: cst.BaseExpression) -> str | None:
    """``self`` for ``self.__dict__`` and ``vars(self)``: the instance whose attributes that
    dict holds."""
    if isinstance(node, cst.Attribute) and node.attr.value == "__dict__":
        return dotted(node.value)
    if isinstance(node, cst.Call) and dotted(node.func) == "vars" and len(node.args) == 1:
        return dotted(node.args[0].value)
    return None


def _set_by_dict_update(call: cst.Call) -> set[str]:
    """``self.bad`` for ``vars(self).update(bad=...)`` or ``self.__dict__.update(bad=...)``:
    attributes set through the instance's dict, by keyword."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "update"):
        return set()
    owner = _instance_dict_owner(call.func.value)
    if owner is None:
        return set()
    return {f"{owner}.{a.keyword.value}" for a in call.args if a.keyword is not None}


def _written_in_place(script: ScriptModel, call: cst.Call) -> str | None:
    written = agreed_in_place(script, call)
    return dotted(written) if written is not None else None


def _position(script: ScriptModel, node: cst.CSTNode) -> tuple[int, int]:
    start = script.position(node).start
    return start.line, start.column


def _counts(binding: cst.CSTNode) -> bool:
    """``steps += 1``, ``seen += len(y)``, ``n += x.size(0)``: a count of batches or samples,
    the same on every rank (prepare evens out the shards), not a value of this rank's data.
    Scaling a value by one (``val_loss /= len(val_loader)``) keeps it what it was."""
    if isinstance(binding, cst.AugAssign) and not isinstance(
        binding.operator, cst.AddAssign | cst.SubtractAssign
    ):
        return False
    value = getattr(binding, "value", None)
    return isinstance(value, cst.BaseExpression) and _a_count(value)


def _a_count(value: cst.BaseExpression) -> bool:
    """``1``, ``len(y)``, ``x.size(0)``, ``x.shape[0]``: how many, not what."""
    if isinstance(value, cst.Integer | cst.Float):
        return True
    if isinstance(value, cst.Call):
        func = value.func
        return dotted(func) == "len" or (
            isinstance(func, cst.Attribute) and func.attr.value in ("size", "numel")
        )
    return (
        isinstance(value, cst.Subscript)
        and isinstance(value.value, cst.Attribute)
        and value.value.attr.value == "shape"
    )


def _agrees(script: ScriptModel, node: cst.CSTNode) -> bool:
    """``node`` calls a collective after which every rank holds the same value (the one table
    of `accelify.analysis.collectives`)."""
    return any(
        isinstance(call, cst.Call) and agrees_across_ranks(script, call) for call in walk(node)
    )


def _literal_key_entry(node: cst.CSTNode) -> tuple[str, str | bytes] | None:
    """``metrics["val_loss"]``: the subscripted name and its literal key; None for any other
    node (a key that is no string literal names no one entry)."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return None
    index = node.slice[0].slice
    if not isinstance(index, cst.Index) or not isinstance(index.value, cst.SimpleString):
        return None
    base = dotted(node.value)
    return None if base is None else (base, index.value.evaluated_value)
