"""Where the tracked objects go: what a helper's parameters receive from its call sites, what a
name holds at a given place, which loops read a DataLoader, which schedulers step per epoch.

``train(args, model, device, train_loader, optimizer)`` called from ``main()`` makes ``train``'s
``model`` a model and its ``train_loader`` a loader, so a rule or a conversion step sees a loop
in a helper the same as the loop written inline.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import libcst as cst

from accelify.analysis.iterated import iterated_sources, unread_row_entries
from accelify.analysis.keyed_dicts import (
    holds_a_loader,
    keyed_subscript,
    may_hold_a_loader,
    mutated_keys,
)
from accelify.analysis.loops import find_backward, iterated_expression
from accelify.analysis.name_scopes import local_owner
from accelify.analysis.names import DATALOADERS
from accelify.analysis.objects import bound_arguments, callee, returned_entry, returned_local
from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.placement import Placement
from accelify.analysis.prepare_order import handed_before_prepare
from accelify.analysis.prepare_outputs import renamed_from
from accelify.analysis.script_model import Kind, Loop, Scope, ScriptModel, prepared_inline
from accelify.analysis.syntax import (
    all_params,
    assigned_targets,
    dotted,
    keyword_value,
    rebound_targets,
    root_name,
    self_parameter,
    strip_self_methods,
    target_names,
    unpacked_pairs,
    walk,
)

#: Annotations that name a tracked kind, by the qualified name the file's imports give them.
_ANNOTATED_KINDS = {
    "torch.nn.Module": Kind.MODEL,
    "torch.nn.modules.module.Module": Kind.MODEL,
    "transformers.PreTrainedModel": Kind.MODEL,
    "torch.utils.data.DataLoader": Kind.DATALOADER,
    "torch.utils.data.dataloader.DataLoader": Kind.DATALOADER,
    "torch.optim.Optimizer": Kind.OPTIMIZER,
    "torch.optim.optimizer.Optimizer": Kind.OPTIMIZER,
    "torch.optim.lr_scheduler.LRScheduler": Kind.SCHEDULER,
    "torch.optim.lr_scheduler._LRScheduler": Kind.SCHEDULER,
}
_OPTIONAL = ("Optional", "typing.Optional")
#: The Accelerator's own flags for whether the optimizer's step ran: a scheduler stepped under a
#: test of one of them keeps the optimizer's pace.
_STEP_FLAGS = ("sync_gradients", "optimizer_step_was_skipped")


class ObjectFlow:
    def __init__(self, model: ScriptModel, placement: Placement) -> None:
        self.model = model
        self.placement = placement
        self._following: set[tuple[str, int]] = set()
        self.params: dict[cst.FunctionDef, dict[str, Kind]] = self._trained_parameters()
        for function, annotated in self._annotated_parameters().items():
            for name, kind in annotated.items():
                self.params.setdefault(function, {}).setdefault(name, kind)
        for function, accelerators in model.accelerator_params.items():
            for name in accelerators:
                self.params.setdefault(function, {})[name] = Kind.ACCELERATOR
        self._add_parameters_from_call_sites()

    def _trained_parameters(self) -> dict[cst.FunctionDef, dict[str, Kind]]:
        """``def main(model): optimizer = SGD(model.parameters())``: ``model`` is a model."""
        found: dict[cst.FunctionDef, dict[str, Kind]] = {}
        for optimizer in self.model.of_kind(Kind.OPTIMIZER):
            function = optimizer.scope
            if not isinstance(function, cst.FunctionDef):
                continue
            parameters = {
                p.name.value for p in (*function.params.params, *function.params.kwonly_params)
            }
            for name in parameter_owners(optimizer) & parameters:
                found.setdefault(function, {})[name] = Kind.MODEL
        return found

    def _annotated_parameters(self) -> dict[cst.FunctionDef, dict[str, Kind]]:
        """``def test(model: nn.Module, test_loader: DataLoader, ...)``: the annotation says what
        the parameter holds, where no call site of the file does (a library's evaluation helper,
        called from another module)."""
        found: dict[cst.FunctionDef, dict[str, Kind]] = {}
        for function in self.model.index.of_type(cst.FunctionDef):
            assert isinstance(function, cst.FunctionDef)
            for param in (*function.params.params, *function.params.kwonly_params):
                if param.annotation is None:
                    continue
                kind = self._annotated_kind(param.annotation.annotation)
                if kind is not None:
                    found.setdefault(function, {})[param.name.value] = kind
        return found

    def _annotated_kind(self, annotation: cst.BaseExpression) -> Kind | None:
        """The kind an annotation names: ``nn.Module``, ``Optional[DataLoader]``, ``Optimizer |
        None``, resolved through the file's imports (a class of the same name from elsewhere
        is not torch's)."""
        if isinstance(annotation, cst.BinaryOperation):  # ``X | None``
            return self._annotated_kind(annotation.left) or self._annotated_kind(annotation.right)
        if isinstance(annotation, cst.Subscript) and dotted(annotation.value) in _OPTIONAL:
            inner = annotation.slice[0].slice if annotation.slice else None
            if isinstance(inner, cst.Index):
                return self._annotated_kind(inner.value)
            return None
        name = dotted(annotation)
        resolved = self.model.imports.resolve(name) if name is not None else None
        return _ANNOTATED_KINDS.get(resolved or "")

    def _add_parameters_from_call_sites(self) -> None:
        """``train(args, model, device, train_loader, ...)``: ``train``'s ``model`` is a model;
        ``Trainer(model, loader)`` and ``self.evaluate(loader)`` likewise for the methods they
        run (the analysis's `objects` pass found them)."""
        for function, received in self.model.received_parameters.items():
            for parameter, kind in received.items():
                self.params.setdefault(function, {}).setdefault(parameter, kind)
        kinds_by_name: dict[str, Kind] = {}
        for binding in self.model.bindings:
            kinds_by_name.setdefault(binding.name, binding.kind)
        # Rounds: ``self.validate(loaders["val"])`` in ``fit(self, loaders)`` is written before
        # the ``trainer.fit(loaders)`` that makes ``fit``'s ``loaders`` a dict of loaders.
        for _ in range(3):
            if not self._add_parameters_once(kinds_by_name):
                break

    def _add_parameters_once(self, kinds_by_name: dict[str, Kind]) -> bool:
        """One pass over the file's calls; whether it learnt a parameter's kind."""
        added = False
        for call in self.model.calls:
            caller = self.placement.enclosing_function(call)
            for function, implicit in self._runs(call):
                for parameter, argument in bound_arguments(function, call, implicit):
                    if parameter in self.params.get(function, {}):
                        continue
                    kind = self._argument_kind(argument.value, call, caller, kinds_by_name)
                    if kind is not None:
                        self.params.setdefault(function, {})[parameter] = kind
                        added = True
        return added

    def _runs(self, call: cst.Call) -> list[tuple[cst.FunctionDef, int]]:
        """The function ``call`` runs, or each entry of a table of the module's functions it
        runs (``for name, fn in phases.items(): fn(model, loaders[name])``): each receives
        what the call passes."""
        graph = self.model.call_graph
        table = [(f, i) for f, i in graph.callees(call) if graph.owner(f) is None]
        if len(table) > 1:
            return table
        target = callee(self.model, call)
        return [target] if target is not None else []

    def _argument_kind(
        self,
        value: cst.BaseExpression,
        call: cst.Call,
        caller: cst.FunctionDef | None,
        kinds_by_name: dict[str, Kind],
    ) -> Kind | None:
        """What an argument holds: a tracked name, the caller's parameter, a loader of a loop
        over loaders, a record's field, or an entry of a dict of loaders
        (``loaders["val"]``, ``loaders.get("val")``)."""
        name = dotted(value) or ""
        kind = kinds_by_name.get(name) or self.params.get(caller, {}).get(name)  # type: ignore[arg-type]
        if kind is None and self._iterated_loaders(name, call):
            kind = Kind.DATALOADER
        if kind is None and self.record_arguments(name, call):
            kind = self.kind_of(name, call)
        entry = returned_entry(self.model, value, call) if kind is None else None
        if entry is not None:  # ``objs["val_loader"]`` of a factory's returned dict
            kind = self.kind_of(*entry)
        container = dotted(_container(value)) if _container(value) is not value else None
        if kind is None and container is not None:
            held = kinds_by_name.get(container) or self.params.get(caller, {}).get(container)  # type: ignore[arg-type]
            kind = held if held is Kind.DATALOADER else None
        if kind is None and name.count(".") == 1 and not name.startswith("self."):
            kind = self._made_instance_attribute(name, call)
        return kind

    def _made_instance_attribute(self, name: str, at: cst.CSTNode) -> Kind | None:
        """``trainer.val_loader`` where ``trainer = Trainer(...)`` (a class of the file) in the
        same function: what that class's ``self.val_loader`` holds, so a helper handed it
        (``summarize(trainer.model, trainer.val_loader)``) knows its parameter's kind."""
        base, attribute = name.split(".")
        made = self.model.call_graph.instance_class(base, at)
        owner = self.model.classes.get(made) if made is not None else None
        init = owner and self.model.call_graph.lookup(owner, "__init__")
        return self.kind_of(f"self.{attribute}", init) if init else None

    def calls_of(self, function: cst.FunctionDef) -> list[tuple[cst.Call, int]]:
        """Every call in the file that runs ``function``, with its implicit ``self``."""
        return self.model.call_graph.calls_of(function)

    def param_names(self, kind: Kind) -> set[str]:
        return {name for params in self.params.values() for name, k in params.items() if k is kind}

    def names_of(self, kind: Kind) -> set[str]:
        """Names bound to ``kind`` anywhere: the script's bindings and helpers' parameters."""
        return self.model.names_of(kind) | self.param_names(kind)

    def kind_of(self, name: str | None, at: cst.CSTNode) -> Kind | None:
        """What ``name`` holds where ``at`` is: the scope's own bindings, module globals,
        ``self.x`` of the same class, a helper's parameters, or an enclosing function's names.
        A name bound several ways (``model = DataParallel(net)``) counts as a model first."""
        if name is None:
            return None
        scope = self.model.scope_of(at)
        found = {
            binding.kind
            for binding in self.model.bindings
            if binding.name == name and self._visible(binding.scope, scope, name, at)
        }
        function = self.placement.enclosing_function(at)
        while function is not None and not found:
            kind = self.params.get(function, {}).get(name)
            if kind is not None:
                found.add(kind)
            function = self.placement.enclosing_function(function)
        if not found and (name, id(at)) not in self._following:
            self._following.add((name, id(at)))  # ``Trainer(self.loader)`` in Trainer itself
            for value, call in self.dataclass_arguments(name, at) or []:
                source = dotted(value)
                if source is not None:
                    kind = self.kind_of(source, call)
                elif isinstance(value, cst.Call) and self.model.call_names(value) & DATALOADERS:
                    kind = Kind.DATALOADER
                else:
                    kind = None
                if kind is not None:
                    found.add(kind)
            self._following.discard((name, id(at)))
        if not found and (name, id(at)) not in self._following:
            self._following.add((name, id(at)))  # ``loaders.val`` of ``Loaders(train, val)``
            for value, call in self.record_arguments(name, at):
                kind = self.kind_of(dotted(value), call)
                if kind is not None:
                    found.add(kind)
            self._following.discard((name, id(at)))
        if not found and (name, id(at)) not in self._following:
            self._following.add((name, id(at)))  # ``model = kwargs["model"]`` of ``train(kwargs)``
            for value, call in self.dict_entry_arguments(name, at):
                kind = self.kind_of(dotted(value), call)
                if kind is not None:
                    found.add(kind)
            self._following.discard((name, id(at)))
        if not found and self._iterated_loaders(name, at):
            found.add(Kind.DATALOADER)
        if not found and (name, id(at)) not in self._following:
            self._following.add((name, id(at)))  # ``sched2`` of ``..., sched2 = prepare(..., s)``
            try:
                found |= self._renamed_output_kinds(name, at)
            finally:
                self._following.discard((name, id(at)))
        if not found and (name, id(at)) not in self._following:
            self._following.add((name, id(at)))  # ``trainer.model`` in ``cb(self, loss)``
            try:
                found |= self._instance_attribute_kinds(name, at)
            finally:
                self._following.discard((name, id(at)))
        kept = self.kept_local(name, at) if not found else None
        if kept is not None and (name, id(at)) not in self._following:
            self._following.add((name, id(at)))  # ``self.scheduler = scheduler`` after prepare
            try:
                kind = self.kind_of(*kept)
            finally:
                self._following.discard((name, id(at)))
            if kind is not None:
                found.add(kind)
        return min(found, key=list(Kind).index) if found else None

    def kept_local(self, name: str | None, at: cst.CSTNode) -> tuple[str, cst.Assign] | None:
        """``self.scheduler`` read at ``at`` in a class that sets it once, from a plain name
        (``self.scheduler = scheduler``, or unpacked: ``self.model, self.scheduler = model,
        scheduler``): that name, with the assignment it is read at. The attribute is the object
        the name holds there (a prepare call's output, a parameter of the constructor)."""
        if name is None or not name.startswith("self.") or name.count(".") != 1:
            return None
        owner = self.placement.class_of(at)
        return _set_once_from(owner, name) if owner is not None else None

    def prepared_before(self, name: str, assign: cst.CSTNode) -> bool:
        """A ``prepare`` of the same function as ``assign`` binds ``name`` above it: what
        ``assign`` keeps of ``name`` is the prepared object."""
        function = self.placement.enclosing_function(assign)
        return any(
            name in prepare.outputs
            and self.placement.enclosing_function(prepare.call) is function
            and self.model.order(prepare.call) < self.model.order(assign)
            for prepare in self.model.prepare_calls
        )

    def _renamed_output_kinds(self, name: str, at: cst.CSTNode) -> set[Kind]:
        """What ``prepare`` was handed at the position of ``name`` among its outputs, where it
        binds ``name`` from an argument of another name (`prepare_outputs`): prepare returns
        each object, wrapped, where its argument was."""
        found: set[Kind] = set()
        for renamed in renamed_from(self.model, name, at):
            kind = self.kind_of(renamed.source, renamed.prepare.call)
            if kind is not None:
                found.add(kind)
        return found

    def _instance_attribute_kinds(self, name: str, at: cst.CSTNode) -> set[Kind]:
        """``trainer.model`` where ``trainer`` is an instance of a class of the file made in the
        enclosing function (`_made_instance_attribute`), or a parameter of it (a
        callback's ``__call__(self, trainer, loss)``) and every call of that function in the
        file passes an instance whose ``self.model`` tells: ``self`` in a trainer's method
        (``cb(self, val_loss)``), a name a class of the file made, or a parameter of the
        caller's that its own callers hand such an instance. Empty when any caller passes
        anything else."""
        if name.count(".") != 1 or name.startswith("self."):
            return set()
        base, attribute = name.split(".")
        function = self.placement.enclosing_function(at)
        if function is None:
            return set()
        if base not in {p.name.value for p in function.params.params}:
            # ``obj.model`` in ``main()`` after ``obj = Setup(...)``: what ``Setup`` holds
            made = self._made_instance_attribute(name, at)
            return {made} if made is not None else set()
        passed = self._passed_to(function, base)
        if not passed:
            return set()
        found: set[Kind] = set()
        for value, call in passed:
            source = dotted(value)
            if source == "self" and self.placement.class_of(call) is not None:
                kind = self.kind_of(f"self.{attribute}", call)
            elif source is not None and "." not in source:
                # a made instance, or the caller's own parameter (``run_epochs(t)`` calling
                # ``validate(t)``), followed to its callers in turn
                held = f"{source}.{attribute}"
                kind = self._made_instance_attribute(held, call) or self.kind_of(held, call)
            else:
                kind = None
            if kind is None:
                return set()
            found.add(kind)
        return found

    def record_arguments(
        self, name: str | None, at: cst.CSTNode
    ) -> list[tuple[cst.BaseExpression, cst.Call]]:
        """``loaders.val`` where ``loaders`` is a record (``Loaders(train_dl, val_dl)`` of a
        namedtuple, NamedTuple or ``@dataclass`` of the file), built here, assigned to the name,
        or handed to the helper ``loaders`` is a parameter of (also built in that call's
        arguments): what each such construction passes for the field, with the call. Empty
        when the field comes from anything else."""
        if name is None or name.count(".") != 1 or name.startswith("self."):
            return []
        base, field = name.split(".")
        found: list[tuple[cst.BaseExpression, cst.Call]] = []
        constructions = self._record_constructions(base, at) or []
        if any(_is_namespace(self.model, c) for c in constructions) and _set_anywhere(
            self.model, field
        ):
            return []  # ``s.val_loader = other`` somewhere: the field is no longer what was built
        for construction in constructions:
            fields = record_fields(self.model, dotted(construction.func))
            for index, argument in enumerate(construction.args):
                if argument.star or (argument.keyword is None and not fields):
                    return []
                keyword = argument.keyword.value if argument.keyword is not None else None
                if (keyword or (fields[index] if index < len(fields) else None)) == field:
                    found.append((argument.value, construction))
        return found

    def dict_entry_arguments(
        self, name: str | None, at: cst.CSTNode
    ) -> list[tuple[cst.BaseExpression, cst.Call]]:
        """``model = kwargs["model"]``, the one binding of ``model`` in a function whose
        parameter ``kwargs`` every call of the file hands a name bound once, in the caller's
        scope, to a dict display with that key (``kwargs = {"model": model, ...}``; a project's
        ``train(kwargs)``): what each such dict holds under the key, with the call. Empty when
        any call hands anything else."""
        function = self.placement.enclosing_function(at)
        if name is None or "." in name or function is None:
            return []
        bound = [
            a
            for a in self.model.index.assignments_to(name)
            if self.placement.enclosing_function(a) is function
        ]
        if len(bound) != 1 or not isinstance(bound[0], cst.Assign):
            return []
        entry = string_key_of(bound[0].value)
        if entry is None:
            return []
        base, key = entry
        passed = self._handed_in(function, base)
        found: list[tuple[cst.BaseExpression, cst.Call]] = []
        for value, call in passed or []:
            held = self.dict_display(value, call)
            if held is None or key not in held:
                return []
            found.append((held[key], call))
        return found

    def dict_display(
        self, value: cst.BaseExpression, call: cst.Call
    ) -> dict[str, cst.BaseExpression] | None:
        """What ``value`` (a name handed at ``call``) holds by key, when its one binding in the
        caller's function is a dict: a display (``{"model": model, ...}``) or ``dict(model=model,
        ...)``. The one reading of a handed dict that convert's steps and the analysis share.
        Only keys nothing later can override are read: a display's string keys after its last
        ``**`` splat (before it, the splat may replace them), every keyword of ``dict(...)``; a
        key missing here is not known (`dict_entry_arguments` then follows nothing). None for
        anything else."""
        if not isinstance(value, cst.Name):
            return None
        caller = self.placement.enclosing_function(call)
        bound = [
            a
            for a in self.model.index.assignments_to(value.value)
            if self.placement.enclosing_function(a) is caller
        ]
        if (
            len(bound) != 1
            or not isinstance(bound[0], (cst.Assign, cst.AnnAssign))
            or bound[0].value is None
        ):
            return None
        changed = mutated_keys(value.value, caller or self.model.module)
        if changed is None:
            return None  # changed in place in ways not known: the display is not what is read
        made = bound[0].value
        held = dict_entries(self.model, made)
        if held is None and isinstance(made, cst.Call):
            held = self._factory_dict(made)
        if held is None:
            return None
        return {key: entry for key, entry in held.items() if key not in changed}

    def _factory_dict(self, call: cst.Call) -> dict[str, cst.BaseExpression] | None:
        """``kwargs = make_kwargs(model, train_loader, ...)`` where ``make_kwargs`` is a
        function of the file whose one ``return`` is a dict of its own parameters: the entries
        are what this call hands those parameters (an entry holding anything else, or a
        parameter the factory binds again, is left out: not known here)."""
        found = callee(self.model, call)
        if found is None:
            return None
        function, implicit = found
        returns = [r for r in walk(function) if isinstance(r, cst.Return)]
        if len(returns) != 1 or returns[0].value is None:
            return None
        held = dict_entries(self.model, returns[0].value)
        if held is None:
            return None
        handed = {
            p: a.value
            for p, a in bound_arguments(function, call, implicit)
            if not any(  # a parameter bound again in the factory holds something else
                self.placement.enclosing_function(b) is function
                for b in self.model.index.assignments_to(p)
            )
        }
        return {
            key: handed[value.value]
            for key, value in held.items()
            if isinstance(value, cst.Name) and value.value in handed
        }

    def _record_constructions(self, name: str, at: cst.CSTNode) -> list[cst.Call] | None:
        """The record calls ``name`` holds at ``at``: followed back through the parameters of
        the helpers in between; None when any of its values is something else."""
        found: list[cst.Call] = []
        pending: list[tuple[str | None, cst.CSTNode]] = [(name, at)]
        for current, _, function in self._once_per_function(pending):
            handed = self._handed_in(function, current)
            values: list[tuple[cst.BaseExpression, cst.CSTNode]] = (
                list(handed)
                if handed is not None
                else [(a.value, a) for a in self.model.index.assignments_to(current or "")]
            )
            if not values:
                return None
            for value, where in values:
                if isinstance(value, cst.Call) and (
                    record_fields(self.model, dotted(value.func))
                    or _is_namespace(self.model, value)
                ):
                    found.append(value)
                elif isinstance(value, cst.Name):
                    pending.append((value.value, where))
                elif isinstance(value, cst.Call) and (made := self._returned_values(value)):
                    # ``run = prepare_run(...)``: the record the file's factory returns
                    for returned, statement in made:
                        values.append((returned, statement))
                else:
                    return None
        return found

    def _returned_values(
        self, call: cst.Call
    ) -> list[tuple[cst.BaseExpression, cst.CSTNode]] | None:
        """What the file's function ``call`` runs returns, each with its ``return``; None for a
        call of anything else, or a function with a bare ``return``."""
        target = callee(self.model, call)
        if target is None or target[0].name.value == "__init__":
            return None
        returns = self.model.index.own_returns(target[0])
        if not returns or any(r.value is None for r in returns):
            return None
        return [(r.value, r) for r in returns if r.value is not None]

    def _once_per_function(
        self, pending: list[tuple[str | None, cst.CSTNode]]
    ) -> Iterator[tuple[str | None, cst.CSTNode, cst.FunctionDef | None]]:
        """Takes ``(name, place)`` from ``pending`` (which the caller adds to as it follows a
        name back) until none is left, each name once in each function: the same name in
        another function is another object, in the same one it was followed already."""
        seen: set[tuple[str | None, int]] = set()
        while pending:
            current, place = pending.pop()
            function = self.placement.enclosing_function(place)
            if (current, id(function)) not in seen:
                seen.add((current, id(function)))
                yield current, place, function

    def _held_by_a_parameter(
        self, function: cst.FunctionDef | None, name: str | None
    ) -> tuple[list[tuple[cst.BaseExpression, cst.Call]], str] | None:
        """For ``t.val_loader`` in a function whose parameter ``t`` its callers hand an object
        (``validate(trainer)``): what every call passes for ``t``, with the attribute path
        (``val_loader``). None for a plain name, a method's own instance (``self.x`` is the
        class's, followed where the class keeps it), a function nothing in the file calls, or
        a call that hands anything but a name (a record built in the call's arguments)."""
        if function is None or name is None or "." not in name:
            return None
        root, path = name.split(".", 1)
        if self.placement.class_of(function) is not None and root == self_parameter(function):
            return None
        passed = self._handed_in(function, root)
        if not passed or any(dotted(value) is None for value, _ in passed):
            return None  # ``evaluate(Pair(train, val))``: a record's field, followed as one
        return passed, path

    def _handed_in(
        self, function: cst.FunctionDef | None, name: str | None
    ) -> list[tuple[cst.BaseExpression, cst.Call]] | None:
        """What every call of ``function`` passes for ``name`` when it is one of its parameters
        (by position or by keyword), with the call; None when it is no parameter of it."""
        if function is None or name not in {
            p.name.value for p in (*function.params.params, *function.params.kwonly_params)
        }:
            return None
        return self._passed_to(function, name)  # type: ignore[arg-type]

    def kept_argument_values(self, name: str | None, at: cst.CSTNode) -> list[cst.BaseExpression]:
        """`kept_arguments` as the arguments themselves, where the calls spell them (their
        scope is the caller's: ``ckpt_dir`` in ``Fit.__init__(self, ckpt_dir="ckpt")`` that
        builds ``ModelCheckpoint(ckpt_dir)``)."""
        return [value for value, _ in self.kept_passed(name, at)]

    def kept_passed(
        self, name: str | None, at: cst.CSTNode
    ) -> list[tuple[cst.BaseExpression, cst.Call]]:
        """`kept_argument_values` with the construction that hands each: whether it holds
        prepared objects depends on where that call runs."""
        init, kept = self.kept_parameter(name, at)
        if init is None or kept is None:
            return []
        return self._passed_to(init, kept)

    def kept_arguments(self, name: str | None, at: cst.CSTNode) -> list[str | None]:
        """The caller's names for ``self.scheduler`` in a method of a class whose ``__init__``
        keeps a parameter under that attribute (``self.scheduler = scheduler``), and sets it
        nowhere else: what every construction of the class in the file (``Model(model, ...,
        scheduler)``) hands that parameter (None for an argument that is not a name). Empty
        when the attribute is set anywhere else in the class or the class is never built."""
        init, kept = self.kept_parameter(name, at)
        if init is None or kept is None:
            return []
        return [dotted(value) for value, _ in self._passed_to(init, kept)]

    def kept_parameter(
        self, name: str | None, at: cst.CSTNode
    ) -> tuple[cst.FunctionDef | None, str | None]:
        """The ``__init__`` and its parameter that ``self.<attr>`` (``name``, read at ``at``)
        keeps, where it keeps one and nothing else in the class sets it."""
        if name is None or not name.startswith("self.") or name.count(".") != 1:
            return None, None
        owner = self.placement.class_of(at)
        init = owner and self.model.call_graph.lookup(owner, "__init__")
        if owner is None or init is None:
            return None, None
        sets = [
            node
            for node in walk(owner)
            if isinstance(node, cst.Assign | cst.AnnAssign | cst.AugAssign)
            and any(dotted(target) == name for target in _targets(node))
        ]
        if len(sets) != 1 or isinstance(sets[0], cst.AugAssign) or sets[0].value is None:
            return None, None
        kept = dotted(sets[0].value)
        parameters = {p.name.value for p in (*init.params.params, *init.params.kwonly_params)}
        if kept not in parameters or self.placement.enclosing_function(sets[0]) is not init:
            return None, None
        return init, kept

    def _passed_to(
        self, function: cst.FunctionDef, parameter: str
    ) -> list[tuple[cst.BaseExpression, cst.Call]]:
        """What every call of ``function`` in the file passes for ``parameter``, with the call:
        the step both `origins` and `_record_constructions` take back from a helper."""
        return [
            (argument.value, call)
            for call, implicit in self.calls_of(function)
            for bound, argument in bound_arguments(function, call, implicit)
            if bound == parameter
        ]

    def _iterated_loaders(self, name: str | None, at: cst.CSTNode) -> list[str]:
        """The loaders ``name`` takes in turn: ``loader`` of ``for name, loader in
        loaders.items()`` over a dict of DataLoaders (or of ``for loader in (val_loader,
        test_loader)``) is a DataLoader too. Loaders only: a loop over models or optimizers
        (``for net in (generator, critic)``) is left as it was, and gives nothing."""
        if name is None or (name, id(at)) in self._following:
            return []
        sources = iterated_sources(self.model, name, at)
        if not sources:
            return []
        self._following.add((name, id(at)))
        try:
            loaders = all(self.kind_of(source, at) is Kind.DATALOADER for source in sources)
        finally:
            self._following.discard((name, id(at)))
        return sources if loaders else []

    def dataclass_arguments(
        self, name: str | None, at: cst.CSTNode
    ) -> list[tuple[cst.BaseExpression, cst.Call]] | None:
        """``self.loader`` in a method of a ``@dataclass`` with a field ``loader``: what each
        ``Trainer(...)`` call of the file passes for it (by keyword, or by the fields' order),
        with the call. None when ``name`` is no such field."""
        owner = self.placement.class_of(at)
        if name is None or owner is None or not name.startswith("self.") or name.count(".") != 1:
            return None
        fields = dataclass_fields(owner)
        if name[len("self.") :] not in fields:
            return None
        found = []
        for call in self.model.calls:
            if dotted(call.func) != owner.name.value:
                continue
            for index, argument in enumerate(call.args):
                if argument.star:
                    continue
                keyword = argument.keyword.value if argument.keyword is not None else None
                field = keyword or (fields[index] if index < len(fields) else None)
                if field == name[len("self.") :]:
                    found.append((argument.value, call))
        return found

    def _visible(self, bound_in: Scope, scope: Scope, name: str, at: cst.CSTNode) -> bool:
        if (
            bound_in is scope
            or isinstance(bound_in, cst.Module)
            or self.placement.inside(at, bound_in)
        ):
            return True
        if name.startswith("self."):
            owner = self.placement.class_of(bound_in)
            here = self.placement.class_of(scope)
            # ``self.model`` set in a base class's constructor is the subclass's attribute too
            graph = self.model.call_graph
            return owner is not None and here is not None and graph.is_or_derives(here, owner)
        return False

    def is_model_name(self, name: str | None, at: cst.CSTNode) -> bool:
        return self.kind_of(name, at) is Kind.MODEL

    def model_names_in_scope(self, scope: Scope) -> list[str]:
        """The models ``scope`` can name: its own, its parameters, and in a method the
        instance's (``self.model``, set in ``__init__``)."""
        found = [b.name for b in self.model.of_kind(Kind.MODEL) if b.scope is scope]
        if isinstance(scope, cst.FunctionDef):
            found += [n for n, k in self.params.get(scope, {}).items() if k is Kind.MODEL]
            owner = self.model.index.enclosing_class(scope)
            me = self_parameter(scope) if owner is not None else None
            found += [
                b.name
                for b in self.model.of_kind(Kind.MODEL)
                if me == "self"
                and b.name.startswith("self.")
                and b.name.count(".") == 1
                and isinstance(b.scope, cst.FunctionDef)
                and self.model.index.enclosing_class(b.scope) is owner
            ]
        return list(dict.fromkeys(found))

    def reads_loader(self, loop: Loop) -> bool:
        """Over a DataLoader; in an Accelerator script also over anything that came out of
        ``prepare`` (only loaders are iterated), here or at a helper's call site."""
        if self.kind_of(loop.iterable, loop.node) is Kind.DATALOADER:
            return True
        entry = self.returned_entry_read(loop)
        if entry is not None and self.kind_of(*entry) is Kind.DATALOADER:
            return True
        prepared = self.model.prepared_names | self.model.given_prepared(loop.node)
        if loop.iterable in prepared or self.outer_name(loop.iterable, loop.node) in prepared:
            return True
        if isinstance(loop.node, cst.For) and prepared_inline(self.model, loop.node.iter):
            return True  # ``for x, y in accelerator.prepare(test_loader):``
        if self.keyed_loaders(loop) or self.keyed_loaders_unknown(loop):
            return True
        if self.row_loaders_unknown(loop):
            return True
        return self._handed_prepared(loop.iterable, loop.node)

    def keyed_loaders(self, loop: Loop) -> list[tuple[str, cst.CSTNode]]:
        """``for x, y in loaders[split]:`` with a key the analysis cannot read (a variable,
        maybe a parameter whose callers pass a phase), where ``loaders`` is, here or at every
        call site handing it in, a dict display whose every entry is a DataLoader by name
        (``{"train": train_loader, "val": val_loader}``, bound to a name or written in the call
        itself): those loaders, each with the place that makes its dict (where the dict takes
        the loader as it is then); the loop reads one of them. Empty for anything else."""
        if not isinstance(loop.node, cst.For):
            return []  # a comprehension
        node = keyed_subscript(iterated_expression(loop))
        if node is None or dotted(node.value) != loop.iterable:
            return []
        trail = self.origin_trail(loop.iterable, loop.node)
        if any(
            mutated_keys(name, function or self.model.module) != set()
            for name, function in trail.names
            if name is not None
        ):
            return []  # an entry stored on the way: the key may pick a loader not shown here
        found: list[tuple[str, cst.CSTNode]] = []
        for origin, place, argument in trail.found:
            made = self._keyed_dict(origin, place, argument)
            if made is None:
                return []
            held, where = made
            for value in held.values():
                name = dotted(value)
                if name is None or self.kind_of(name, place) is not Kind.DATALOADER:
                    return []
                found.append((name, where))
        return found

    def _keyed_dict(
        self, origin: str | None, place: cst.CSTNode, argument: cst.BaseExpression | None
    ) -> tuple[dict[str, cst.BaseExpression], cst.CSTNode] | None:
        """The dict display an origin of `keyed_loaders`'s container is, by key, with the node
        that makes it: the one assignment of a plain name in the caller, or, for an origin that
        is no name, the dict written in the call that hands it in (``fit(model, {"val": vl,
        "test": sl})``, also where ``fit`` hands it on to the function whose loop reads it),
        which holds the caller's loaders as they are at that call."""
        if origin is None:
            held = dict_entries(self.model, argument) if argument is not None else None
            return (held, place) if held else None
        if "." in origin:
            return None
        held = self.dict_display(cst.Name(origin), place)
        caller = self.placement.enclosing_function(place)
        if not held:
            return None
        (made,) = [
            a
            for a in self.model.index.assignments_to(origin)
            if self.placement.enclosing_function(a) is caller
        ]  # one, as `dict_display` found it
        return held, made

    def keyed_loaders_unknown(self, loop: Loop) -> bool:
        """``for x, y in loaders[split]:`` with a key the analysis cannot read, where
        `keyed_loaders` cannot name every loader the key may pick, yet the container (here or
        where a caller makes what it hands in) may hold a DataLoader: a dict bound twice, by a
        walrus, in an enclosing function, given an entry later (also by a helper that hands it
        on), a list at another call, or a dict written in a call with a loader made there. A
        gather there could run over an unprepared loader, and none would report one rank's
        shard: the evaluation is left as it is with a review line (`keyed_dicts`)."""
        if not isinstance(loop.node, cst.For) or loop.iterable is None:
            return False
        node = keyed_subscript(iterated_expression(loop))
        if node is None or dotted(node.value) != loop.iterable or self.keyed_loaders(loop):
            return False
        trail = self.origin_trail(loop.iterable, loop.node)
        names = {loop.iterable} | {name for name, _ in trail.names if name}
        names |= {origin for origin, _, _ in trail.found if origin}

        def is_loader(name: str, at: cst.CSTNode) -> bool:
            return self.kind_of(name, at) is Kind.DATALOADER

        written = [argument for _, _, argument in trail.found if argument is not None]
        return any(holds_a_loader(argument, is_loader) for argument in written) or (
            may_hold_a_loader(names, self.model.module, is_loader)
        )

    def row_loaders_unknown(self, loop: Loop) -> list[str]:
        """``for x, y in loader:`` where ``loader`` is taken from a row of a loop over rows
        written out in a way the analysis cannot follow (``for name, *rest in rows: loader, opt
        = rest.pop(0), rest.pop(0)``): every DataLoader a row holds, any of which the loop may
        read in a pass. Empty for anything else. Prepared, a loader this loop evaluates would
        give one rank's shard's totals with no word, so the conversion leaves them all whole
        with a review line (`evaluation_of`)."""
        if not isinstance(loop.node, cst.For) or not isinstance(loop.node.iter, cst.Name):
            return []
        if self.kind_of(loop.iterable, loop.node) is not None:
            return []
        entries = unread_row_entries(self.model, loop.node.iter.value, loop.node)
        return [e for e in entries if self.kind_of(e, loop.node) is Kind.DATALOADER]

    def _handed_prepared(self, name: str | None, at: cst.CSTNode) -> bool:
        """``name`` is a parameter of the function around ``at`` that its callers hand a
        prepared object, also on through helpers (nanoT5: ``main`` prepares, ``train(model,
        ..., test_dataloader)`` -> ``maybe_eval_predict(model, dataloader)`` -> ``predict``),
        or the attribute its class's constructor keeps such a parameter in (``self.loader``:
        `_kept_from_a_prepared_parameter`)."""
        function = self.placement.enclosing_function(at)
        return (
            function is not None
            and name is not None
            and (
                self.parameter_prepared(function, name) is True
                or self._kept_from_a_prepared_parameter(function, name)
            )
        )

    def returned_entry_read(self, loop: Loop) -> tuple[str, cst.CSTNode] | None:
        """``for x, y in objs["val_loader"]:`` (also through ``enumerate``/``tqdm``) where
        ``objs`` is a factory's returned dict: the factory's own name for that entry
        (`returned_entry`)."""
        node = loop.node.iter
        while isinstance(node, cst.Call) and node.args:
            node = node.args[0].value
        return returned_entry(self.model, node, loop.node)

    def loader_read(self, loop: Loop) -> tuple[str | None, cst.CSTNode]:
        """The loader ``loop`` reads, with a place to follow it from: ``vl`` where the caller
        builds the dict of ``loaders["val"]`` (``run(model, {"train": tl, "val": vl})``:
        `returned_entry_read`), else the loop's own iterable. The entry is the object to ask
        about (prepared or not), not the dict that holds it."""
        entry = self.returned_entry_read(loop) if isinstance(loop.node, cst.For) else None
        return entry or (loop.iterable, loop.node)

    def over_prepared_loader(self, loop: Loop) -> bool:
        """The loop reads a prepared loader, so each rank sees its own shard: by name, or as a
        helper's parameter that a call site fills with one (``evaluate(model, test_loader)``
        after prepare)."""
        if isinstance(loop.node, cst.For) and prepared_inline(self.model, loop.node.iter):
            return True  # ``for x, y in accelerator.prepare(test_loader):``
        prepared = self.model.prepared_names | self.model.given_prepared(loop.node)
        entry = self.returned_entry_read(loop)
        if entry is not None:  # ``state["val_loader"]``: the loader, not the dict it is in
            return entry[0] in prepared
        if self._made_here_unprepared(loop) or self._handed_unprepared(loop):
            return False
        if loop.iterable in prepared:
            return not self._prepared_by_another_class(loop)
        if self.outer_name(loop.iterable, loop.node) in prepared:
            return True
        fields = self.record_arguments(loop.iterable, loop.node)
        if fields and all(self.prepared_argument(call, value) for value, call in fields):
            return True  # ``s.val_loader`` of ``SimpleNamespace(val_loader=val_loader)``
        # handed on through helpers: ``train(dev_dl)`` -> ``train_epoch(dev_dataloader)`` ->
        # ``evaluate(dev_dataloader)`` (a tri-modal retrieval trainer's evaluation)
        function = self.placement.enclosing_function(loop.node)
        if function is not None and loop.iterable is not None:
            if self.parameter_prepared(function, loop.iterable) is True:
                return True
            return self._kept_from_a_prepared_parameter(function, loop.iterable)
        return False

    def _kept_from_a_prepared_parameter(self, function: cst.FunctionDef, name: str) -> bool:
        """``self.loader`` of an evaluator whose constructor keeps the loader it is handed
        (``self.loader = loader``), and every construction hands it a prepared one
        (``Evaluator(eval_loader)`` after prepare, here or in another module of the project):
        its ``__call__`` (or other method) iterates that rank's shard. Only where the
        constructor's assignment is the attribute's one binding in the class."""
        if not name.startswith("self.") or name.count(".") != 1:
            return False
        graph = self.model.call_graph
        owner = graph.owner(function)
        if owner is None:
            return False
        assignments = self.model.index.assignments_in_class(name, function)
        if len(assignments) != 1 or not isinstance(assignments[0], cst.Assign):
            return False
        assign = assignments[0]
        init = self.placement.enclosing_function(assign)
        if (
            init is None
            or init.name.value != "__init__"
            or graph.owner(init) is not owner
            or len(assign.targets) != 1
            or not isinstance(assign.value, cst.Name)
        ):
            return False
        return self.parameter_prepared(init, assign.value.value) is True

    def _prepared_by_another_class(self, loop: Loop) -> bool:
        """``self.data_loader`` read in ``Test.run_epoch`` while only ``Train.__init__`` prepares
        a ``self.data_loader``: an attribute of another object under the same spelling. Only when
        every prepare call returning the name is in a method of a class that is neither the
        loop's, nor one of its bases or subclasses."""
        name, graph = loop.iterable, self.model.call_graph
        function = self.placement.enclosing_function(loop.node)
        owner = graph.owner(function) if function is not None else None
        if name is None or not name.startswith("self.") or owner is None:
            return False
        related = {id(owner), *map(id, graph.bases(owner)), *map(id, graph.subclasses(owner))}
        owners = []
        for call in self.model.prepare_calls:
            if name not in call.outputs:
                continue
            method = self.placement.enclosing_function(call.call)
            owners.append(graph.owner(method) if method is not None else None)
        received = any(  # ``self.data_loader = data_loader`` handed a prepared loader
            b.received and b.name == name and b.prepared_sources & self.model.prepared_names
            for b in self.model.bindings
            if isinstance(b.scope, cst.FunctionDef) and id(graph.owner(b.scope)) in related
        )
        return (
            bool(owners)
            and not received
            and all(o is not None and id(o) not in related for o in owners)
        )

    def _handed_unprepared(self, loop: Loop) -> bool:
        """The loop reads a parameter of its function (``def accuracy(model, loader)``) that
        every call site of the file fills with a loader no prepare call returns
        (``accuracy(model, test_loader)``): each rank reads the whole set, whatever object
        another function prepared under the parameter's name."""
        function = self.placement.enclosing_function(loop.node)
        if loop.iterable is None or function is None:
            return False
        return self.parameter_prepared(function, loop.iterable) is False

    def parameter_prepared(
        self, function: cst.FunctionDef, parameter: str, depth: int = 0
    ) -> bool | None:
        """Whether the callers hand ``function``'s ``parameter`` a prepared object: True when a
        call site passes one (by a name a prepare call returns in the caller's scope, or by the
        prepare call itself, or by a parameter of the caller that is one in turn), False when
        every call is known and none does, None when the file cannot tell (the parameter is
        rebound in the function, the function is handed on as a value or called from
        outside, a call site leaves it to its default or passes something else)."""
        if parameter not in {p.name.value for p in all_params(function.params)}:
            return None
        given = self.model.given_parameters.get(function, {}).get(parameter)
        if given is not None and given.prepared:
            return True  # every call of the project's other modules hands it prepared
        if any(
            parameter in target_names(t)
            for a in self.model.index.own_assignments(function)
            for t in assigned_targets(a)
        ):
            return None
        graph = self.model.call_graph
        sites = self.calls_of(function)
        if not sites or graph.uncertain_callers(function) or graph.references(function):
            return None
        answers = []
        for call, implicit in sites:
            passed = [a for n, a in bound_arguments(function, call, implicit) if n == parameter]
            if not passed:
                return None
            answers.append(self._prepared_argument(call, passed[0].value, depth))
        if True in answers:
            return True
        return False if all(answer is False for answer in answers) else None

    def prepared_argument(self, call: cst.Call, value: cst.BaseExpression) -> bool:
        """``call`` certainly hands ``value`` prepared: a prepare call's result (here, or at
        the call sites of the caller that passes its own parameter on)."""
        return self._prepared_argument(call, value, 0) is True

    def _prepared_argument(
        self, call: cst.Call, value: cst.BaseExpression, depth: int
    ) -> bool | None:
        """`parameter_prepared` for one argument, at the call that passes it: a name is looked
        up in the caller's scope (its assignments, else the module's), a parameter of the
        caller at the caller's own call sites."""
        if isinstance(value, cst.Call):
            return self._prepared_value(value)
        name = dotted(value)
        if name is None or "." in name:
            return None
        caller = self.placement.enclosing_function(call)
        scope: cst.CSTNode = caller if caller is not None else self.model.module
        if handed_before_prepare(
            self.model, call, name, lambda v: self._prepared_value(v) is False
        ):
            return False  # ``Evaluator(val_loader)`` above the prepare call: the original
        if any(
            name in p.outputs and self.placement.inside(p.call, scope)
            for p in self.model.prepare_calls
        ):
            return True
        if caller is not None:
            values = self._assigned_in(caller, name)
            if not values and name in {p.name.value for p in all_params(caller.params)}:
                return None if depth >= 3 else self.parameter_prepared(caller, name, depth + 1)
        if caller is None or not values:
            if any(
                name in p.outputs and self.placement.enclosing_function(p.call) is None
                for p in self.model.prepare_calls
            ):
                return True
            values = [
                a.value
                for a in self.model.index.assignments_to(name)
                if self.model.scope_of(a) is self.model.module
            ]
        answers = [self._prepared_value(v) for v in values]
        if not answers or None in answers:
            return None
        return any(answers)

    def _assigned_in(self, function: cst.FunctionDef, name: str) -> list[cst.BaseExpression]:
        return [
            a.value
            for a in self.model.index.own_assignments(function)
            if any(name in target_names(t) for t in assigned_targets(a)) and a.value is not None
        ]

    def _prepared_value(self, value: cst.BaseExpression) -> bool | None:
        """A loader made here: False for ``DataLoader(...)`` or a call of a function of the
        file that prepares nothing, True for a prepare call, None for anything else."""
        if not isinstance(value, cst.Call):
            return None
        name = dotted(value.func) or ""
        if name.rsplit(".", 1)[-1] == "prepare":
            return True
        if self.model.qualified(value.func) & DATALOADERS:
            return False
        target = callee(self.model, value)
        if target is None:
            # a factory of another module: it can prepare only with an accelerator handed in
            accelerators = self.model.names_of(Kind.ACCELERATOR)
            handed = {dotted(a.value) for a in value.args} | {
                root_name(a.value) for a in value.args
            }
            return None if handed & accelerators else False
        function = target[0]
        prepares = any(
            isinstance(n, cst.Call)
            and isinstance(n.func, cst.Attribute)
            and n.func.attr.value == "prepare"
            for n in walk(function)
        )
        # ``pick(loaders, "test")`` hands back what it was given: prepared or not, as passed
        handed_back = {p.name.value for p in all_params(function.params)} & {
            root_name(r.value) for r in self.model.index.own_returns(function) if r.value
        }
        return None if prepares or handed_back else False

    def _made_here_unprepared(self, loop: Loop) -> bool:
        """``loader = DataLoader(...)`` made in the loop's own function (``evaluate(args)``) that
        no prepare call there returns: another object than the ``loader`` that ``train(args)``
        prepared under the same name, read whole by every rank."""
        name = loop.iterable
        function = self.placement.enclosing_function(loop.node)
        if name is None or "." in name or function is None:
            return False
        if not any(b.name == name and b.scope is function for b in self.model.bindings):
            return False
        return not any(
            name in p.outputs and self.placement.inside(p.call, function)
            for p in self.model.prepare_calls
        )

    def origins(
        self, name: str | None, at: cst.CSTNode, stop: set[str] | frozenset[str] = frozenset()
    ) -> set[str | None]:
        """The names of `origin_sites`."""
        return {origin for origin, _ in self.origin_sites(name, at, stop)}

    def origin_sites(
        self,
        name: str | None,
        at: cst.CSTNode,
        stop: set[str] | frozenset[str] = frozenset(),
        another_object: Callable[[str, cst.CSTNode], bool] | None = None,
    ) -> set[tuple[str | None, cst.CSTNode]]:
        """Where a helper's parameter comes from, followed back through every call site of
        every helper in between: ``{"val_loader"}`` for ``loader`` in ``def predict(self,
        loader)`` called as ``self.predict(val_loader)`` in ``fit(self, train_loader,
        val_loader)``, called as ``trainer.fit(train_loader, val_loader)`` in ``main()``.
        An entry of a dict or list (``evaluate(model, loaders["val"])``, ``loaders.get("val")``)
        comes from the container (``loaders``), as a loop over ``loaders[phase]`` reads it.
        None stands for an argument that is not a name (``fit(DataLoader(...))``); a name in
        ``stop`` (one ``prepare`` returned) is an origin of its own, not followed further.
        Each comes with the place it is read at: the same name in another function is another
        object, and a name of ``stop`` that ``another_object`` says is not the one prepared where
        it is read (``loader``, a helper's parameter its callers hand ``val_loader``) is
        followed on."""
        trail = self.origin_trail(name, at, stop, another_object)
        return {(origin, place) for origin, place, _ in trail.found}

    def origin_trail(
        self,
        name: str | None,
        at: cst.CSTNode,
        stop: set[str] | frozenset[str] = frozenset(),
        another_object: Callable[[str, cst.CSTNode], bool] | None = None,
    ) -> OriginTrail:
        """`origin_sites` with what a reader of the object itself needs: the argument each
        origin that is no name is (``{"val": vl, "test": sl}`` of ``fit(model, {...})``, however
        many helpers hand it on before the loop reads it), and every name the object goes by
        on the way, each in its function (an entry stored under any of them is one the
        origin does not show)."""
        trail = OriginTrail()
        pending: list[tuple[str | None, cst.CSTNode]] = [(name, at)]
        for current, place, function in self._once_per_function(pending):
            function = self._closure_owner(function, current, place)
            trail.names.append((current, function))
            stopped = current in stop and not (
                another_object is not None and another_object(current, place)  # type: ignore[arg-type]
            )
            held = self._held_by_a_parameter(function, current) if not stopped else None
            if held is not None:  # ``t.val_loader`` in ``def validate(t)``: the caller's
                for value, call in held[0]:  # ``trainer.val_loader`` for ``validate(trainer)``
                    holder = dotted(value)
                    if holder is None:
                        trail.found.add((None, call, value))
                    else:
                        pending.append((f"{holder}.{held[1]}", call))
                continue
            passed = (self._handed_in(function, current) or []) if not stopped else []
            if not stopped and not passed:
                passed = self.dataclass_arguments(current, place) or []
            if not stopped and not passed:
                passed = self.record_arguments(current, place)
            iterated = [] if passed or stopped else self._iterated_loaders(current, place)
            pending += [(source, place) for source in iterated]
            returned = None
            if current is not None and not stopped and not passed and not iterated:
                returned = returned_local(self.model, current, place)
            if returned is not None:  # ``model, train_dl = setup(cfg)``: setup()'s own names
                pending.append(returned)
            elif not passed and not iterated:
                trail.found.add((current, place, None))
            for value, call in passed:
                entry = returned_entry(self.model, value, call)
                if entry is not None:  # ``evaluate(model, objs["val_loader"])``
                    pending.append(entry)
                    continue
                source = dotted(_container(value))
                if source is None:
                    trail.found.add((None, call, value))
                else:
                    pending.append((source, call))
        return trail

    def _closure_owner(
        self, function: cst.FunctionDef | None, name: str | None, place: cst.CSTNode
    ) -> cst.FunctionDef | None:
        """The function whose own name ``name`` (its root) is where ``place`` reads it: the
        function around it, or, for a closure's free variable (``loader`` read in ``run()``
        nested in ``def make_evaluator(model, loader)``), the enclosing function that binds
        it, whose callers hand it in."""
        if function is None or name is None:
            return function
        owner = local_owner(self.model, name.split(".", 1)[0], place)
        if (
            isinstance(owner, cst.FunctionDef)
            and owner is not function
            and self.placement.inside(function, owner)
        ):
            return owner
        return function

    def is_forward(self, call: cst.Call) -> bool:
        """A call of a model; in an Accelerator script also of anything that came out of
        ``prepare`` (only models are called)."""
        name = dotted(call.func)
        entry = returned_entry(self.model, call.func, call) if name is None else None
        if entry is not None and self.is_model_name(*entry):
            return True  # ``state["model"](x)``: the model the dict was built with
        if name in ("self", "self.forward") and self._in_self_training_model(call):
            return True  # ``self(x)`` in a method of a model that trains itself
        return self.names_a_model(name, call)

    def names_a_model(self, name: str | None, at: cst.CSTNode) -> bool:
        """``name`` is a model where ``at`` calls it (or a method of it): by its kind, or in an
        Accelerator script anything that came out of ``prepare``, here or as what a helper's
        callers pass for its parameter (only models are called, or ``generate`` run)."""
        if self.is_model_name(name, at):
            return True
        prepared = self.model.prepared_names
        if name in prepared or self.outer_name(name, at) in prepared:
            return True
        return self._handed_prepared(name, at)

    def _in_self_training_model(self, node: cst.CSTNode) -> bool:
        """Inside a model class of the file whose own methods run a backward."""
        owner = self.placement.class_of(node)
        return (
            owner is not None
            and owner.name.value in self.model.module_classes
            and any(self.placement.inside(call, owner) for call in self.model.backward_calls)
        )

    def forward_of_prepared(self, call: cst.Call) -> bool:
        """``model(x)`` or ``model.generate(x)`` of an object ``prepare`` returned (here or at a
        helper's call site): under FSDP its forward gathers each layer's parameters from every
        rank."""
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "generate":
            name = dotted(func.value)
        else:
            name = dotted(func)
        if name is None:
            return False
        function = self.placement.enclosing_function(call)
        parameters = (
            {p.name.value for p in function.params.params + function.params.kwonly_params}
            if function is not None
            else set()
        )
        if name in parameters:  # a helper's parameter: prepared if what its callers pass is
            return bool(self.placement.callers(function)) and (  # type: ignore[arg-type]
                self.outer_name(name, call) in self.model.prepared_names
            )
        # prepared above, at module level or in a function around the call
        here = self.model.order(call)
        for prepare in self.model.prepare_calls:
            if name not in prepare.outputs or self.model.order(prepare.call) >= here:
                continue
            scope = self.model.scope_of(prepare.call)
            if type(scope) is cst.Module or self.model.inside(call, scope):
                return True
        return self._prepared_by_own_constructor(name, call)

    def _prepared_by_own_constructor(self, name: str, call: cst.Call) -> bool:
        """``self.model(**batch)`` in a method of a trainer class whose ``__init__`` prepared
        ``self.model`` (a DiLoCo/FSDP trainer's ``_validate``): every method runs after the
        constructor, so the attribute is the prepared model there (not in ``__init__`` itself,
        where order decides, above). Not where another method binds the attribute anew
        (``self.model = self.accelerator.unwrap_model(self.model)`` after training, or
        ``self.model, self.opt = ...``, ``self.model: nn.Module = ...``, ``for self.model in
        ...``, ``with ... as self.model``, ``del self.model``: `rebound_targets`)."""
        if not name.startswith("self."):
            return False
        function = self.placement.enclosing_function(call)
        owner = self.placement.class_of(call)
        if function is None or owner is None or function.name.value == "__init__":
            return False
        for node in walk(owner):
            if any(dotted(t) == name for t in rebound_targets(node)):
                where = self.placement.enclosing_function(node)
                if where is None or where.name.value != "__init__":
                    return False
        for prepare in self.model.prepare_calls:
            if name not in prepare.outputs:
                continue
            where = self.placement.enclosing_function(prepare.call)
            if (
                where is not None
                and where.name.value == "__init__"
                and self.placement.class_of(prepare.call) is owner
            ):
                return True
        return False

    def derived_batch_names(self, loop: Loop) -> set[str]:
        """Names unpacked or indexed out of the batch at the top of the loop body."""
        batch = set(loop.batch_names)
        derived: set[str] = set()
        for line in loop.node.body.body:
            if not isinstance(line, cst.SimpleStatementLine):
                continue
            for small in line.body:
                if isinstance(small, cst.Assign) and root_name(small.value) in batch | derived:
                    for target in assigned_targets(small):
                        derived |= target_names(target)
        return derived

    def per_epoch_schedulers(self, prepared: set[str]) -> set[str]:
        """Prepared schedulers stepped somewhere, but never inside a loop over batches."""
        schedulers = {b.name for b in self.model.of_kind(Kind.SCHEDULER) if b.name in prepared}
        stepped, per_step = self._scheduler_steps(schedulers)
        return {name for name in schedulers if name in stepped and name not in per_step}

    def mixed_pace_schedulers(self, prepared: set[str]) -> dict[str, list[SchedulerStep]]:
        """Prepared schedulers stepped both inside a loop over batches and outside every one
        (``if args.sched == "cosine": sched.step()`` per batch, ``if args.sched == "step":
        sched.step()`` per epoch): no one ``step_scheduler_with_optimizer`` fits both calls, so
        one of them would change pace on N ranks. Each maps to its step calls."""
        schedulers = {b.name for b in self.model.of_kind(Kind.SCHEDULER) if b.name in prepared}
        steps: dict[str, list[SchedulerStep]] = {}
        for step in self.scheduler_steps(schedulers):
            if step.scheduler in schedulers:
                steps.setdefault(step.scheduler, []).append(step)
        mixed = {}
        for name, found in steps.items():
            batch = [s for s in found if s.per_batch]
            # a per-epoch step for another class of scheduler than every per-batch one
            # (``if isinstance(sched, ReduceLROnPlateau): sched.step(val_loss)`` beside ``if not
            # isinstance(sched, ReduceLROnPlateau): sched.step()`` per batch) never shares a run
            epoch = [
                s
                for s in found
                if not s.per_batch
                and not all(self._exclusive_classes(s.call, b.call) for b in batch)
            ]
            if batch and epoch:
                mixed[name] = batch + epoch
        return mixed

    def _exclusive_classes(self, one: cst.Call, other: cst.Call) -> bool:
        """The two calls run under contradicting ``isinstance`` tests of one name (``if
        isinstance(s, C)`` around one, ``if not isinstance(s, C)`` around the other)."""
        first, second = self._isinstance_tests(one), self._isinstance_tests(other)
        return any(
            test[:2] == against[:2] and test[2] != against[2]
            for test in first
            for against in second
        )

    def _isinstance_tests(self, call: cst.Call) -> set[tuple[str, str, bool]]:
        """``(name, class, holds)`` for each ``if [not] isinstance(name, class)`` (also one part
        of an ``and``) whose body holds ``call``, up to its function."""
        found: set[tuple[str, str, bool]] = set()
        for ancestor in self.model.ancestors(call):
            if isinstance(ancestor, cst.FunctionDef):
                break
            if not isinstance(ancestor, cst.If) or not any(
                a is ancestor.body for a in self.model.ancestors(call)
            ):
                continue
            tests = [ancestor.test]
            while tests:
                test = tests.pop()
                if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
                    tests += [test.left, test.right]
                    continue
                holds = True
                if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                    test, holds = test.expression, False
                if (
                    isinstance(test, cst.Call)
                    and dotted(test.func) == "isinstance"
                    and len(test.args) == 2
                ):
                    name = dotted(test.args[0].value)
                    kind = self.model.module.code_for_node(test.args[1].value)
                    if name is not None:
                        found.add((name, kind, holds))
        return found

    def unstepped_schedulers(self, prepared: set[str]) -> set[str]:
        """Prepared schedulers whose ``step()`` is nowhere to be seen: stepped through a name the
        analysis does not follow (a dataclass field, a callback), at a pace it cannot tell."""
        schedulers = {b.name for b in self.model.of_kind(Kind.SCHEDULER) if b.name in prepared}
        stepped, _ = self._scheduler_steps(schedulers)
        return schedulers - stepped

    def _scheduler_steps(self, schedulers: set[str]) -> tuple[set[str], set[str]]:
        """The schedulers stepped somewhere, and those stepped inside a loop over batches."""
        per_step: set[str] = set()
        stepped: set[str] = set()
        for step in self.scheduler_steps(schedulers):
            stepped.add(step.scheduler or "")
            if step.per_batch:
                per_step.add(step.scheduler or "")
        return stepped, per_step

    def scheduler_steps(self, schedulers: set[str]) -> list[SchedulerStep]:
        """Every ``scheduler.step(...)`` call of a scheduler, named by the caller's name among
        ``schedulers`` where it runs in a helper (``sched.step()`` in ``def train(sched)``)."""
        steps: list[SchedulerStep] = []
        for call in self.model.calls:
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "step"):
                continue
            owner = dotted(call.func.value)
            if self.kind_of(owner, call) is not Kind.SCHEDULER:
                continue
            outer_name = owner if owner in schedulers else self.outer_name(owner, call)
            if outer_name not in schedulers:  # a dataclass field, a helper's helper
                outer_name = next(
                    (o for o in self.origins(owner, call) if o in schedulers), outer_name
                )
            if outer_name not in schedulers:  # ``self.scheduler`` kept from ``Model(sched)``
                kept = self.kept_arguments(owner, call)
                if kept and all(k in schedulers for k in kept) and len(set(kept)) == 1:
                    outer_name = kept[0]
            local = self.kept_local(owner, call) if outer_name not in schedulers else None
            kept = local is not None and local[0] in schedulers and self.prepared_before(*local)
            if kept:
                outer_name = local[0]  # ``self.scheduler = scheduler`` after prepare returned it
            per_batch = self._in_batch_loop(call, self.batch_loops, depth=3) or any(
                self.placement.in_loop_body(call, loop) for loop in self.training_while_loops
            )
            steps.append(SchedulerStep(call, outer_name, per_batch, kept))
        return steps

    @functools.cached_property
    def training_while_loops(self) -> list[cst.While]:
        """``while`` loops whose own body runs a backward (``while step < total: batch =
        next(batches)`` ... ``accelerator.backward(loss)``): each pass trains on one batch, so
        a step in that body runs once per batch, as in a ``for`` loop over the loader."""
        return [
            loop
            for loop in self.model.index.of_type((cst.While,))
            if isinstance(loop, cst.While)
            and next(find_backward(loop.body, skip_loops=True), None) is not None
        ]

    @functools.cached_property
    def batch_loops(self) -> list[cst.For]:
        """The loops over batches: those that train, and those that read a loader."""
        return [loop.node for loop in self.model.loops if loop.trains or self.reads_loader(loop)]

    def epoch_loop(self, step: SchedulerStep, depth: int = 2) -> cst.For | cst.While | None:
        """The loop that runs ``step`` once per pass over the data: the nearest loop around it
        (or around a call of the helper it is in) that runs a loop over batches elsewhere in its
        body, directly or in a helper (``train_one_epoch(...)``). None where the step runs per
        batch, or where that loop also steps something else outside its loops over batches
        (nanoGPT's ``optimizer.step()`` after ``for micro_step in range(accumulation)``: the
        scheduler beside it steps with the optimizer)."""
        if step.per_batch:
            return None
        return self._epoch_loop_around(step.call, depth)

    def _epoch_loop_around(self, node: cst.CSTNode, depth: int) -> cst.For | cst.While | None:
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                break
            if isinstance(ancestor, cst.For | cst.While) and self._runs_batches(ancestor, 2):
                return None if self._steps_beside_batches(ancestor) else ancestor
        function = self.placement.enclosing_function(node)
        if function is None or depth == 0:
            return None
        loops = {
            id(loop): loop
            for call, _ in self.calls_of(function)
            if (loop := self._epoch_loop_around(call, depth - 1)) is not None
        }
        return next(iter(loops.values())) if len(loops) == 1 else None

    def _runs_batches(self, node: cst.CSTNode, depth: int) -> bool:
        """A loop over batches inside ``node``, or in a function of the file it calls."""
        return self.reaches(
            node,
            depth,
            lambda here: any(
                loop is not here and self.placement.inside(loop, here) for loop in self.batch_loops
            ),
        )

    def reaches(self, node: cst.CSTNode, depth: int, holds: Callable[[cst.CSTNode], bool]) -> bool:
        """``holds`` for ``node`` or for a function of the file it calls, ``depth`` calls deep."""
        if holds(node):
            return True
        if depth == 0:
            return False
        return any(
            isinstance(call, cst.Call)
            and (target := callee(self.model, call)) is not None
            and target[0] is not node
            and self.reaches(target[0], depth - 1, holds)
            for call in walk(node)
        )

    def _steps_beside_batches(self, loop: cst.For | cst.While) -> bool:
        """``loop`` steps something other than a scheduler outside its loops over batches: a
        ``.step(...)`` (an optimizer, an engine, a scaler), or an optimizer used there or handed
        to a helper that runs no loop over batches (``optimizer_step(optimizer)``) — the
        optimizer then steps once per pass of ``loop``, and the scheduler beside it with it; or a
        helper of the file that steps an optimizer and runs no loop over batches (a vocoder's
        ``train_step()`` on ``next(batches)``, called once per pass of ``while steps < total``
        beside an evaluation loop). ``optimizer.zero_grad()`` before the loop over batches steps
        nothing."""
        optimizers = self.names_of(Kind.OPTIMIZER)

        def steps(node: cst.Call) -> bool:
            func = node.func
            return isinstance(func, cst.Attribute) and (
                (
                    func.attr.value == "step"
                    and self.kind_of(dotted(func.value), node) is not Kind.SCHEDULER
                    # a diffusion sampler's ``scheduler.step(noise_pred, t, x)`` denoises a
                    # sample (a DDPM trainer's image generation after each epoch); an
                    # optimizer, engine or scaler step takes at most one argument
                    and len(node.args) < 2
                )
                or (dotted(func.value) in optimizers and func.attr.value != "zero_grad")
            )

        for node in walk(loop.body):
            if not isinstance(node, cst.Call) or any(
                self.placement.inside(node, inner) for inner in self.batch_loops
            ):
                continue
            if steps(node):
                return True
            target = callee(self.model, node)
            if target is not None and self._runs_batches(target[0], 1):
                continue
            if any(dotted(argument.value) in optimizers for argument in node.args):
                return True
            # a helper that draws its own batch and steps (``train_step()`` on ``next(batches)``)
            if target is not None and any(
                isinstance(inner, cst.Call) and steps(inner) for inner in walk(target[0])
            ):
                return True
        return False

    def _in_batch_loop(self, node: cst.CSTNode, batch_loops: list[cst.For], depth: int) -> bool:
        """``node`` runs once per batch: inside a loop over batches, or in a helper called from
        one (``train_step(model, optimizer, scheduler, batch)`` in the loop)."""
        if any(self.placement.in_loop_body(node, loop) for loop in batch_loops):
            return True
        function = self.placement.enclosing_function(node)
        if function is None or depth == 0:
            return False
        return any(
            self._in_batch_loop(call, batch_loops, depth - 1) for call, _ in self.calls_of(function)
        )

    def sized_per_process_and_stepped_with_optimizer(self, step: cst.Call) -> bool:
        """``scheduler.step()`` of an unprepared scheduler that needs no preparing: built after
        ``accelerator.prepare`` (so from the prepared optimizer), sized from the prepared loader's
        per-process length (``len()`` of a name ``prepare`` returned, if any), and stepped right
        beside the optimizer's step, in the same block, outside ``accumulate()`` (where the
        prepared optimizer skips steps the scheduler would not) unless under ``if
        accelerator.sync_gradients``."""
        owner = dotted(step.func.value) if isinstance(step.func, cst.Attribute) else None
        bindings = [b for b in self.model.of_kind(Kind.SCHEDULER) if b.name == owner]
        prepares = [self.model.order(call.call) for call in self.model.prepare_calls]
        if len(bindings) != 1 or not prepares:
            return False
        if self.model.order(bindings[0].assign) < min(prepares) and not self._sized_by_loop_bound(
            bindings[0].value, step
        ):
            return False
        prepared = self.model.prepared_names
        if any(  # sized from a loader that was never prepared under that name: total steps
            isinstance(node, cst.Call)
            and dotted(node.func) == "len"
            and node.args
            and dotted(node.args[0].value) not in prepared
            for node in walk(bindings[0].value)
        ):
            return False
        statement = self.model.parent(step)
        line = self.model.parent(statement) if isinstance(statement, cst.Expr) else None
        block = self.model.parent(line) if line is not None else None
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return False
        # the optimizer the scheduler was built on is one, whatever the analysis knows of its
        # name (``optimizer, loader = accelerator.prepare(self.optimizer, loader)``)
        optimizers = self.names_of(Kind.OPTIMIZER) | _scheduled_optimizer(
            self.model, bindings[0].value
        )
        if not any(
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "step"
            and dotted(node.func.value) in optimizers
            for around in self._step_blocks(block)
            for sibling in around.body
            if isinstance(sibling, cst.SimpleStatementLine)
            for node in walk(sibling)
        ):
            return False
        return once_per_optimizer_step(self.model, step)

    def _step_blocks(self, block: cst.IndentedBlock | cst.Module) -> list[cst.CSTNode]:
        """The block of a scheduler's step, and, when that block is the body of ``if
        accelerator.sync_gradients:`` (or ``if not accelerator.optimizer_step_was_skipped:``,
        a Whisper fine-tune's guard against an fp16 overflow's skipped step), the block around
        the ``if``: ``optimizer.step()`` then ``if accelerator.sync_gradients:
        scheduler.step()`` steps the two together."""
        found: list[cst.CSTNode] = [block]
        test = self.model.parent(block)
        outer = self.model.parent(test) if isinstance(test, cst.If) else None
        if (
            isinstance(test, cst.If)
            and test.body is block
            and any(flag in self.model.module.code_for_node(test.test) for flag in _STEP_FLAGS)
            and isinstance(outer, (cst.IndentedBlock, cst.Module))
        ):
            found.append(outer)
        return found

    def _sized_by_loop_bound(self, schedule: cst.CSTNode, step: cst.Call) -> bool:
        """The schedule's length is the very bound that stops the loop stepping it
        (an argument of ``get_scheduler(..., num_training_steps=cfg.max_train_steps)`` and ``while
        completed_steps < cfg.max_train_steps`` or ``if completed_steps >= cfg.max_train_steps:
        break`` around the step): sized in the steps each process takes, by construction, so
        built before ``prepare`` it still needs no preparing (a VLA trainer's unprepared cosine
        schedule)."""
        if not isinstance(schedule, cst.Call):
            return False
        sizes = {dotted(argument.value) for argument in schedule.args} - {None}
        bounds: set[str] = set()
        for ancestor in self.model.ancestors(step):
            if isinstance(ancestor, cst.While):
                bounds |= _compared(ancestor.test)
            if isinstance(ancestor, cst.For | cst.While):
                for node in walk(ancestor.body):
                    if isinstance(node, cst.If) and any(
                        isinstance(inner, cst.Break) for inner in walk(node.body)
                    ):
                        bounds |= _compared(node.test)
        return bool(sizes & bounds)

    def call_site_arguments(self, parameter: str | None, at: cst.CSTNode) -> list[cst.Arg]:
        """What each call of the function around ``at`` passes for its ``parameter`` (empty
        when ``parameter`` is not one of its parameters)."""
        function = self.placement.enclosing_function(at)
        if function is None or parameter is None:
            return []
        return [
            argument
            for call, implicit in self.calls_of(function)
            for name, argument in bound_arguments(function, call, implicit)
            if name == parameter
        ]

    def outer_name(self, parameter: str | None, at: cst.CSTNode) -> str | None:
        """The caller's name for a helper's parameter: ``scheduler`` for ``sched`` in
        ``def train(sched)`` called as ``train(scheduler)``; and the name a record's field was
        built from (`record_source`): ``model`` for ``state.model`` of ``state =
        TrainState(model=model.to(device), optimizer=opt)``."""
        function = self.placement.enclosing_function(at)
        if parameter is None:
            return parameter
        for call, implicit in self.calls_of(function) if function is not None else ():
            for name, argument in bound_arguments(function, call, implicit):
                if name == parameter:
                    return dotted(argument.value)
        return self.record_source(parameter, at) or parameter

    def record_source(self, name: str, at: cst.CSTNode) -> str | None:
        """The one name every construction of the record ``name``'s base holds passes for its
        field (`record_arguments`), seen through self-returning calls (``model.to(device)``):
        the field is that very object. None when a construction passes anything else, or some
        ``x.field = ...`` of the file may have set the field since."""
        if name.count(".") != 1 or name.startswith("self."):
            return None
        passed = self.record_arguments(name, at)
        sources = {dotted(strip_self_methods(value)) for value, _ in passed}
        if len(sources) != 1 or None in sources or _set_anywhere(self.model, name.split(".")[1]):
            return None
        return sources.pop()


def _scheduled_optimizer(model: ScriptModel, schedule: cst.BaseExpression | None) -> set[str]:
    """The name of the optimizer a scheduler is built on: ``optimizer=`` of
    ``get_scheduler(name, optimizer=opt, ...)``, else the first argument of
    ``OneCycleLR(opt, ...)``; empty when it is no call or names none."""
    if not isinstance(schedule, cst.Call):
        return set()
    named = keyword_value(schedule, "optimizer")
    if named is None:
        positional = [a for a in schedule.args if a.keyword is None and a.star == ""]
        # get_scheduler's first argument is the schedule's name, the optimizer its second
        named_first = any(
            q.rsplit(".", 1)[-1] == "get_scheduler" for q in model.call_names(schedule)
        )
        first = 1 if named_first else 0
        named = positional[first].value if len(positional) > first else None
    name = dotted(named) if named is not None else None
    return {name} if name is not None else set()


def _set_once_from(owner: cst.ClassDef, attribute: str) -> tuple[str, cst.Assign] | None:
    """The name ``self.<attribute>`` is set from, where the class sets it once, by a plain
    (or unpacked) assignment of a name."""
    sets: list[tuple[cst.BaseExpression, cst.Assign]] = []
    for node in walk(owner):
        if isinstance(node, cst.AugAssign | cst.AnnAssign) and dotted(node.target) == attribute:
            return None
        if not isinstance(node, cst.Assign):
            continue
        for target in assigned_targets(node):
            pairs = unpacked_pairs(target, node.value)
            sets += [
                (value, node)
                for bound, value in pairs or [(target, node.value)]
                if dotted(bound) == attribute
            ]
            if pairs is None and any(
                isinstance(element, cst.Element) and dotted(element.value) == attribute
                for element in getattr(target, "elements", ())
            ):
                return None  # ``self.a, self.scheduler = make()``: not a name
    if len(sets) != 1 or not isinstance(sets[0][0], cst.Name):
        return None
    value, assign = sets[0]
    return value.value, assign  # type: ignore[attr-defined]


def _targets(node: cst.Assign | cst.AnnAssign | cst.AugAssign) -> list[cst.BaseExpression]:
    """What an assignment binds: each target of ``a = b = value``, else its one target."""
    if isinstance(node, cst.Assign):
        return list(assigned_targets(node))
    return [node.target]


def once_per_optimizer_step(model: ScriptModel, step: cst.Call) -> bool:
    """``step`` runs once per optimizer step as far as ``accumulate()`` goes: outside it, or
    inside it under ``if accelerator.sync_gradients:``. Unguarded inside ``accumulate()`` it
    runs on every batch, ``gradient_accumulation_steps`` times per optimizer step."""
    for ancestor in model.ancestors(step):
        if isinstance(ancestor, cst.If) and "sync_gradients" in model.module.code_for_node(
            ancestor.test
        ):
            return True
        if isinstance(ancestor, cst.With) and accumulate_context(ancestor) is not None:
            return False
    return True


def accumulate_context(node: cst.With) -> str | None:
    """The accelerator of ``with <accelerator>.accumulate(...)``; None for another ``with``."""
    for item in node.items:
        func = item.item.func if isinstance(item.item, cst.Call) else None
        if isinstance(func, cst.Attribute) and func.attr.value == "accumulate":
            return dotted(func.value) or ""
    return None


def _container(value: cst.BaseExpression) -> cst.BaseExpression:
    """``loaders`` for ``loaders["val"]`` and ``loaders.get("val")``; else ``value``."""
    if isinstance(value, cst.Subscript):
        return value.value
    func = value.func if isinstance(value, cst.Call) else None
    if isinstance(func, cst.Attribute) and func.attr.value == "get":
        return func.value
    return value


def _compared(test: cst.BaseExpression) -> set[str]:
    """The dotted names a comparison in ``test`` compares (both sides)."""
    found: set[str] = set()
    for node in walk(test):
        if isinstance(node, cst.Comparison):
            for side in [node.left, *(target.comparator for target in node.comparisons)]:
                if name := dotted(side):
                    found.add(name)
    return found


def _is_namespace(model: ScriptModel, call: cst.Call) -> bool:
    """``SimpleNamespace(model=model, val_loader=val_loader)``: a record whose fields are the
    keywords it is built with, each the very object handed in (as a namedtuple's are)."""
    return model.imports.resolve(dotted(call.func) or "") == "types.SimpleNamespace"


def _set_anywhere(model: ScriptModel, field: str) -> bool:
    """Some ``x.field = ...`` of the file (not on ``self``): a namespace's field may be
    rebound after it was built, so what it was built with no longer tells what it holds."""
    return any(
        isinstance(target, cst.Attribute)
        and target.attr.value == field
        and dotted(target.value) != "self"
        for assignment in model.assignments
        for target in assigned_targets(assignment)
    )


def record_fields(model: ScriptModel, class_name: str | None) -> list[str]:
    """The fields, in the order its constructor takes them, of a record type of the file:
    ``Loaders = namedtuple("Loaders", ["train", "val"])`` (or ``"train val"``), a
    ``typing.NamedTuple`` subclass, or a ``@dataclass``; empty for anything else."""
    if class_name is None:
        return []
    owner = model.classes.get(class_name)
    if owner is not None:
        bases = {model.imports.resolve(dotted(b.value) or "") for b in owner.bases}
        if bases & {"typing.NamedTuple"}:
            return _annotated_fields(owner)
        return dataclass_fields(owner)
    assignments = model.index.assignments_to(class_name)
    if len(assignments) != 1 or not isinstance(assignments[0].value, cst.Call):
        return []
    call = assignments[0].value
    if model.imports.resolve(dotted(call.func) or "") != "collections.namedtuple":
        return []
    if len(call.args) < 2:
        return []
    names = call.args[1].value
    if isinstance(names, cst.SimpleString):
        text = names.evaluated_value
        return text.replace(",", " ").split() if isinstance(text, str) else []
    if isinstance(names, (cst.List, cst.Tuple)):
        found = [
            e.value.evaluated_value
            for e in names.elements
            if isinstance(e.value, cst.SimpleString) and isinstance(e.value.evaluated_value, str)
        ]
        return found if len(found) == len(names.elements) else []  # type: ignore[return-value]
    return []


def _annotated_fields(owner: cst.ClassDef) -> list[str]:
    """The annotated names of a class body, in order."""
    if not isinstance(owner.body, cst.IndentedBlock):
        return []
    fields = []
    for line in owner.body.body:
        if isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.AnnAssign):
            target = line.body[0].target
            if isinstance(target, cst.Name):
                fields.append(target.value)
    return fields


def dataclass_fields(owner: cst.ClassDef) -> list[str]:
    """The fields of a ``@dataclass`` class that has no ``__init__`` of its own, in order (its
    generated ``__init__``'s parameters); empty for any other class."""
    decorators = {
        dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
        for d in owner.decorators
    }
    if not decorators & {"dataclass", "dataclasses.dataclass"}:
        return []
    if not isinstance(owner.body, cst.IndentedBlock):
        return []
    fields = []
    for line in owner.body.body:
        if isinstance(line, cst.FunctionDef) and line.name.value == "__init__":
            return []
        if isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.AnnAssign):
            target = line.body[0].target
            if isinstance(target, cst.Name):
                fields.append(target.value)
    return fields


@dataclass
class OriginTrail:
    """What `ObjectFlow.origin_trail` finds: each origin with the place it is read at and, for
    one that is no name, the argument itself; and each name the object is read under on the
    way there, with the function that reads it (None: the module)."""

    found: set[tuple[str | None, cst.CSTNode, cst.BaseExpression | None]] = field(
        default_factory=set
    )
    names: list[tuple[str | None, cst.FunctionDef | None]] = field(default_factory=list)


@dataclass(frozen=True)
class SchedulerStep:
    """``scheduler.step(...)``: the call, the scheduler's name where it was created or prepared
    (the caller's name for a helper's parameter), and whether it runs once per batch."""

    call: cst.Call
    scheduler: str | None
    per_batch: bool
    #: named through the attribute its class keeps the prepared scheduler under (``self.scheduler
    #: = scheduler`` after prepare, `ObjectFlow.kept_local`): a method the file may never call
    kept: bool = False


def string_key_of(value: cst.BaseExpression) -> tuple[str, str] | None:
    """``("kwargs", "model")`` for ``kwargs["model"]``; None for any other expression."""
    if (
        isinstance(value, cst.Subscript)
        and isinstance(value.value, cst.Name)
        and len(value.slice) == 1
        and isinstance(value.slice[0].slice, cst.Index)
        and isinstance(value.slice[0].slice.value, cst.SimpleString)
    ):
        key = value.slice[0].slice.value.evaluated_value
        return (value.value.value, key) if isinstance(key, str) else None
    return None


def entry_name(container: str, key: str) -> str:
    """``loaders["train"]``: how the plan names a dict entry it prepares on its own, and how
    every step that asks whether that entry was prepared must spell it."""
    return f'{container}["{key}"]'


def dict_entries(
    model: ScriptModel, value: cst.BaseExpression
) -> dict[str, cst.BaseExpression] | None:
    """The entries a dict expression surely holds, by key: a display's string keys after its
    last ``**`` splat or computed key, the keywords of ``dict(...)`` (which no positional
    mapping or splat beside them can override); None when ``value`` is no dict built here."""
    held: dict[str, cst.BaseExpression] = {}
    if isinstance(value, cst.Dict):
        for element in value.elements:
            if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
                held[element.key.evaluated_value] = element.value  # type: ignore[index]
            elif isinstance(element, cst.DictElement) and isinstance(
                element.key, (cst.Integer, cst.Float, cst.Imaginary)
            ):
                continue  # a number replaces no string key
            else:
                held.clear()  # a splat or a computed key may replace any key written before it
        return held
    if isinstance(value, cst.Call) and model.qualified(value.func) == {"builtins.dict"}:
        return {a.keyword.value: a.value for a in value.args if a.keyword is not None}
    return None
