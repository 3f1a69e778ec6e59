"""Which calls of the file reach each of its functions and methods.

``train(model, loader)`` calls the module's ``train``; inside a class, ``self.train_one_epoch()``
calls the class's method (or a subclass's override), ``super().fit()`` the base class's;
``trainer.fit()`` after ``trainer = Trainer(...)`` calls ``Trainer.fit``, and ``Trainer(...)``
itself calls ``Trainer.__init__``. A function named where it is not called (``mp.spawn(worker)``,
``Thread(target=train)``) is a reference: someone else calls it, with arguments the file does not
show. A call through an object the analysis cannot place (``runner.fit()`` on a value from a
factory) is an uncertain caller of every method of that name.

One resolution serves the conversion and the rules: `targets` (every function a call may run)
and `callee` (the one it runs, with the ``self`` the call binds) are the same answer. A receiver
is placed by its construction in scope (``trainer = Trainer(...)``), else by any assignment of
the file that makes it, also through a factory (``model = build_model()`` where ``build_model``
returns ``Net(...)``), else, for a model, by the one model class of the file that has the
method. The last depends on the bindings the analysis is still adding, so it is asked again
until the analysis is complete; everything else is computed once per call.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

import libcst as cst

from accelify.analysis import names
from accelify.analysis.loops import find_backward
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import (
    all_params,
    assigned_targets,
    dotted,
    self_parameter,
    strip_self_methods,
    target_names,
    walk,
)

_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
#: The same, for tests by exact type: the walks up from every call resolved test each ancestor,
#: and an isinstance miss on libcst's classes (ABCs) runs Python code; none has subclasses.
_COMPREHENSION_TYPES = frozenset(_COMPREHENSIONS)
#: Method names every torch object has: ``x.train()`` on an unknown ``x`` is not a Trainer's.
_LIBRARY_METHODS = names.MODULE_API | {"step", "zero_grad", "backward", "item", "numpy"}
#: How many names, parameters and lists a list of callbacks is followed through.
_MAX_DEPTH = 6


class CallGraph:
    """The file's one call resolver, built on first use (`ScriptModel.call_graph`); each
    answer is computed once (what depends on the bindings the analysis is still adding, once
    the analysis is complete)."""

    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self.index = model.index
        self._resolved: dict[cst.Call, _Resolution] = {}
        self._methods_around: dict[cst.CSTNode, cst.FunctionDef | None] = {}
        self._instances: dict[tuple[str, str | None], str | None] = {}
        self._made: dict[tuple[cst.BaseExpression, int], str | None] = {}
        self._by_callee: dict[cst.FunctionDef, list[tuple[cst.Call, int]]] | None = None

    # --- what the file defines -------------------------------------------------------------------
    @cached_property
    def classes(self) -> dict[str, cst.ClassDef]:
        return {n.name.value: n for n in self.index.of_type(cst.ClassDef)}  # type: ignore[attr-defined]

    def methods(self, owner: cst.ClassDef) -> dict[str, cst.FunctionDef]:
        body = owner.body.body if isinstance(owner.body, cst.IndentedBlock) else []
        return {s.name.value: s for s in body if isinstance(s, cst.FunctionDef)}

    def owner(self, function: cst.FunctionDef) -> cst.ClassDef | None:
        """The class ``function`` is a method of (directly in its body)."""
        block = self.model.parent(function)
        parent = self.model.parent(block) if block is not None else None
        return parent if isinstance(parent, cst.ClassDef) else None

    def without_instance(self, function: cst.FunctionDef) -> bool:
        """A function of a class body that runs with no instance: a static or class method, or
        an undecorated one the file calls only through its class, its first parameter filled by
        the call's own arguments (``Trainer.train_model(model=model, ...)`` of a
        ``def train_model(model, train_loader, ...)``, a class used as a namespace). There is no
        ``self`` there to hold an accelerator: it takes one as a function does. One whose first
        parameter is ``self`` (``Trainer.fit(trainer)`` hands the instance), or that is also
        named or maybe called through an instance, has one."""
        if self.owner(function) is None:
            return False
        if self_parameter(function) is None:
            return True
        if self_parameter(function) == "self":
            return False
        calls = self.calls_of(function)
        return (
            bool(calls)
            and all(implicit == 0 for _, implicit in calls)
            and not self.references(function)
            and not self.uncertain_callers(function)
        )

    def bases(self, owner: cst.ClassDef) -> list[cst.ClassDef]:
        found = []
        for base in owner.bases:
            name = dotted(base.value)
            if name in self.classes and self.classes[name] is not owner:
                found.append(self.classes[name])
        return found

    def subclasses(self, owner: cst.ClassDef) -> list[cst.ClassDef]:
        found: list[cst.ClassDef] = []
        for other in self.classes.values():
            if other is not owner and self._derives(other, owner, 0):
                found.append(other)
        return found

    def is_or_derives(self, cls: cst.ClassDef, base: cst.ClassDef) -> bool:
        """``cls`` is ``base`` or a subclass of it in this file."""
        return cls is base or self._derives(cls, base, 0)

    def _derives(self, cls: cst.ClassDef, base: cst.ClassDef, depth: int) -> bool:
        if depth > 20:
            return False
        return any(b is base or self._derives(b, base, depth + 1) for b in self.bases(cls))

    def lookup(self, owner: cst.ClassDef, name: str, depth: int = 0) -> cst.FunctionDef | None:
        """``name`` as an instance of ``owner`` finds it: its own, else a base class's."""
        found = self.methods(owner).get(name)
        if found is not None or depth > 20:
            return found
        for base in self.bases(owner):
            found = self.lookup(base, name, depth + 1)
            if found is not None:
                return found
        return None

    # --- calls -----------------------------------------------------------------------------------
    @cached_property
    def _targets(self) -> dict[cst.Call, list[cst.FunctionDef]]:
        """Asked once the analysis is complete (the conversion and the rules ask)."""
        return {call: self._all_targets(call) for call in self.model.calls}

    def targets(self, call: cst.Call) -> list[cst.FunctionDef]:
        """The functions of this file ``call`` may run: the method a call through ``self``
        finds and its subclasses' overrides."""
        return self._targets.get(call, [])

    @cached_property
    def _callers(self) -> dict[cst.FunctionDef, list[cst.Call]]:
        found: dict[cst.FunctionDef, list[cst.Call]] = {}
        for call, targets in self._targets.items():
            for function in dict.fromkeys(targets):
                found.setdefault(function, []).append(call)
        return found

    def callers(self, function: cst.FunctionDef) -> list[cst.Call]:
        """Every call in the file that may run ``function``."""
        return list(self._callers.get(function, ()))

    def uncertain_callers(self, function: cst.FunctionDef) -> list[cst.Call]:
        """``x.fit()`` where ``x`` could be an instance of ``function``'s class: the analysis
        does not know what ``x`` is."""
        owner = self.owner(function)
        name = function.name.value
        if owner is not None and name == "__call__":
            return self._uncertain_instance_calls(owner)
        if owner is None or name in _LIBRARY_METHODS or name.startswith("__"):
            return []
        found = []
        for call, targets in self._targets.items():
            func = call.func
            if targets or not (isinstance(func, cst.Attribute) and func.attr.value == name):
                continue
            receiver = dotted(func.value)
            root = (receiver or "").split(".")[0]
            if receiver is not None and root in self.model.imports.bound:
                continue  # a module's function: ``np.save``, ``torch.save``
            if receiver is not None and self._receiver_class(receiver, call) is not None:
                continue  # an instance of another class of the file, which has no such method
            found.append(call)
        return found

    def _uncertain_instance_calls(self, owner: cst.ClassDef) -> list[cst.Call]:
        """Calls of a loop variable the analysis cannot follow to its list (``for cb in
        self.callbacks: cb(model, loss)`` where the list is filled by ``append``) that could run
        the ``__call__`` of ``owner``, when the file makes instances of it."""
        if not self.index.calls_named(owner.name.value):
            return []
        return [
            call
            for call, targets in self._targets.items()
            if not targets
            and isinstance(call.func, cst.Name)
            and self._loop_over(call.func.value, call) is not None
        ]

    def references(self, function: cst.FunctionDef) -> list[cst.CSTNode]:
        """Places that name ``function`` without calling it: handed to someone who will."""
        name = function.name.value
        owner = self.owner(function)
        found: list[cst.CSTNode] = []
        if owner is None:  # the Names that spell it (the index's, in source order)
            for node in self.index.names_spelled(name):
                parent = self.model.parent(node)
                if isinstance(parent, cst.Call) and parent.func is node:
                    continue
                if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is node:
                    continue
                if isinstance(parent, cst.Attribute) and parent.attr is node:
                    continue
                if isinstance(parent, cst.Arg) and parent.keyword is node:
                    continue
                if isinstance(parent, (cst.ImportAlias, cst.Param)):
                    continue
                if self._called_alias(node, function):
                    continue  # ``step = train_one_epoch``: each ``step(...)`` is a caller
                local = self._local_def(name, node)
                if local is function or (
                    local is None
                    and self.model.functions.get(name) is function
                    and not self._shadowed(name, node)
                ):
                    found.append(node)
            return found
        for attribute in self.index.attributes_named(name):  # ``self.name``, ``trainer.name``
            parent = self.model.parent(attribute)
            if isinstance(parent, cst.Call) and parent.func is attribute:
                continue
            if self._attribute_target(attribute, name) is function:
                found.append(attribute)
        return found

    def callee(self, call: cst.Call) -> tuple[cst.FunctionDef, int] | None:
        """The function of this file that ``call`` runs (the first of `targets`), and how many
        of its leading parameters the call binds implicitly (``self``): ``train(...)``,
        ``Trainer(...)`` (its ``__init__``), ``self.evaluate(...)``, ``trainer.fit(...)``,
        ``model.configure_optimizers(...)`` when a class of this file made the receiver."""
        resolution = self._resolution(call)
        if resolution.targets:
            return resolution.targets[0], resolution.implicit
        method = self._model_method(call, resolution)
        return (method, 1) if method is not None else None

    def trains_through_calls(self, loop: cst.CSTNode, depth: int = 3) -> bool:
        """A backward runs in a function or method of this file that ``loop``'s body calls
        (not in a nested loop's), through up to ``depth`` calls: a GAN trainer's epoch loop
        whose ``d_tot += self.update_d(real)`` runs the discriminator's step. Its per-batch
        values are one rank's shard as much as an in-body backward's are."""
        body = loop.body if isinstance(loop, (cst.For, cst.While)) else loop
        return self._calls_a_backward(body, depth, set())

    def _calls_a_backward(self, node: cst.CSTNode, depth: int, seen: set[int]) -> bool:
        if depth == 0:
            return False
        for call in walk(node):
            if not isinstance(call, cst.Call):
                continue
            for function, _ in self.callees(call):
                if id(function) in seen:
                    continue
                seen.add(id(function))
                if next(find_backward(function.body, skip_loops=True), None) is not None:
                    return True
                if self._calls_a_backward(function.body, depth - 1, seen):
                    return True
        return False

    def callees(self, call: cst.Call) -> list[tuple[cst.FunctionDef, int]]:
        """Every function of this file ``call`` may run (`callee` gives the first), each with
        the implicit ``self`` it binds: an override in a subclass, each callback class of a
        list the call iterates."""
        resolution = self._resolution(call)
        if resolution.targets:
            return [
                (t, resolution.implicit if t is resolution.targets[0] else self._implicit(t))
                for t in resolution.targets
            ]
        found = self.callee(call)
        return [found] if found is not None else []

    def _implicit(self, function: cst.FunctionDef) -> int:
        """What a call binds implicitly in ``function``, another target than the first: a
        method's ``self`` (an override, a callback's ``__call__``), nothing for a function of
        the module (one entry of a table of functions the call runs)."""
        return _bound(function) if self.owner(function) is not None else 0

    def _all_targets(self, call: cst.Call) -> list[cst.FunctionDef]:
        resolution = self._resolution(call)
        if resolution.targets:
            return resolution.targets
        method = self._model_method(call, resolution)
        return [method] if method is not None else []

    def _model_method(self, call: cst.Call, resolution: _Resolution) -> cst.FunctionDef | None:
        """A method of the one model class of the file that has it, called on a model the
        file did not make (from a hub or a loader)."""
        if resolution.unplaced is None:
            return None
        method = call.func.attr.value  # type: ignore[attr-defined]
        having = self.index.model_classes_with(method)
        if len(having) != 1 or resolution.unplaced not in self.model.names_of(Kind.MODEL):
            return None
        return self.index.methods_of(having[0])[method]

    def _resolution(self, call: cst.Call) -> _Resolution:
        found = self._resolved.get(call)
        if found is None:
            found = self._resolved[call] = self._resolve(call)
        return found

    def _resolve(self, call: cst.Call) -> _Resolution:
        func = call.func
        if type(func) is cst.Name and func.value in self._only_called:
            return _Resolution([], 1)  # ``print(...)``: what runs is not of this file
        if isinstance(func, cst.Name):
            local = self._local_def(func.value, call)
            if local is not None:
                return _Resolution([local], 0)
            instance = self._instance_call(func.value, call)
            if instance is not None:
                return _Resolution([instance], 1)
            elements = self._element_calls(func.value, call)
            if elements:  # ``for callback in self.callbacks: callback(model, val_loss)``
                return _Resolution(elements, 1)
            table = self._function_table_calls(func.value, call)
            if table:  # ``for name, fn in phases.items(): fn(model, loaders[name])``
                return _Resolution(table, 0)
            made = self._class_parameter(func.value, call)
            if made is not None:  # ``cls(model, optimizer)`` in a classmethod factory
                init = self.lookup(made, "__init__")
                return _Resolution([init] if init is not None else [], 1)
            closure = self._returned_closure(func.value, call)
            if closure is not None:  # ``train_step = make_train_step(model, opt)``
                return _Resolution([closure], 0)
            aliased = self._aliased_function(func.value, call)
            if aliased is not None:  # ``step = train_one_epoch`` then ``step(model, ...)``
                return _Resolution([aliased], 0)
            if self._shadowed(func.value, call):
                # ``def fit(step): step()``: the parameter, not the module's step
                return _Resolution([], 0)
            function = self.model.functions.get(func.value)
            if function is not None:
                return _Resolution([function], 0)
            owner = self.classes.get(func.value)
            init = self.lookup(owner, "__init__") if owner is not None else None
            return _Resolution([init] if init is not None else [], 1)
        if isinstance(func, cst.Call):
            looked_up = self._looked_up_methods(func, call)
            if looked_up:  # ``for cb in self.callbacks: getattr(cb, hook)(self, *args)``
                return _Resolution(looked_up, _bound(looked_up[0]))
            made = self._made_instance_call(func)
            return _Resolution([made] if made is not None else [], 1)
        if not isinstance(func, cst.Attribute):
            return _Resolution([], 0)
        name = func.attr.value
        receiver = func.value
        if _is_super_call(receiver):
            owner = self.index.enclosing_class(call)
            for base in self.bases(owner) if owner is not None else []:
                found = self.lookup(base, name)
                if found is not None:
                    return _Resolution([found], 1)
            return _Resolution([], 1)
        if self._is_self(receiver, call):
            owner = self._enclosing_class(call)
            if owner is None:
                return _Resolution([], 1)
            found_here = self.lookup(owner, name)
            overrides = [
                sub_method
                for sub in self.subclasses(owner)
                if (sub_method := self.methods(sub).get(name)) is not None
            ]
            found = [f for f in [found_here, *overrides] if f is not None]
            if not found:  # ``self.early_stopping(...)``: an instance held by an attribute
                instance = self._instance_call(f"self.{name}", call)
                found = [instance] if instance is not None else []
            return _Resolution(found, _bound(found[0]) if found else 1)
        built = strip_self_methods(receiver)
        if isinstance(built, cst.Call) and dotted(built.func) in self.classes:
            found = self.lookup(self.classes[dotted(built.func)], name)  # ``Trainer(...).fit()``
            return _Resolution([found] if found is not None else [], _bound(found))
        if isinstance(built, cst.Call) and isinstance(built.func, cst.Attribute):
            factory = self._class_factory(built.func)  # ``Experiment.from_config(p).run()``
            if factory is not None:
                found = self.lookup(self.classes[factory], name)
                return _Resolution([found] if found is not None else [], _bound(found))
        receiver_name = dotted(receiver)
        if receiver_name in self.classes:  # ``Trainer.fit(trainer)``, a static or class method
            found = self.lookup(self.classes[receiver_name], name)
            if found is None:
                return _Resolution([], 0)
            decorators = {dotted(d.decorator) for d in found.decorators}
            return _Resolution([found], 1 if "classmethod" in decorators else 0)
        if receiver_name is None:
            return _Resolution([], 1)
        stand_in = self._namespace_function(receiver, name, call)
        if stand_in is not None:  # ``utils.save_checkpoint(...)`` of a SimpleNamespace
            return _Resolution([stand_in], 0)
        if isinstance(receiver, cst.Name) and not name.startswith("__"):
            elements = self._element_methods(receiver_name, name, call)
            if elements:  # ``for cb in callbacks: cb.on_epoch_end(epoch, logs, model)``
                return _Resolution(elements, _bound(elements[0]))
        owner = self._receiver_class(receiver_name, call)
        if owner is None:
            return _Resolution([], 1, unplaced=receiver_name)
        found = self.lookup(owner, name)
        return _Resolution([found] if found is not None else [], _bound(found))

    def _namespace_function(
        self, receiver: cst.BaseExpression, name: str, call: cst.Call
    ) -> cst.FunctionDef | None:
        """``save_fn`` for ``utils.save_checkpoint`` where the module binds ``utils`` once, at
        its top level or in the function that makes the call, to
        ``SimpleNamespace(save_checkpoint=save_fn)`` (a stand-in for a module of helpers; also
        ``SimpleNamespace(**{"save_checkpoint": save_fn})``, or a lambda forwarding to it) and
        ``save_fn`` is a function of the module, nowhere bound again, nor the attribute."""
        if not isinstance(receiver, cst.Name):
            return None
        bound = self.index.assignments_to(receiver.value)
        if self.index.assignments_to(f"{receiver.value}.{name}"):
            return None  # ``utils.save_checkpoint = ...``: the attribute is set again
        if len(bound) != 1 or self.model.scope_of(bound[0]) not in (
            self.model.module,
            self.model.scope_of(call),
        ):
            return None
        made = bound[0].value
        if not isinstance(made, cst.Call) or self.model.call_names(made) != {
            "types.SimpleNamespace"
        }:
            return None
        for key, value in _namespace_entries(made):
            value = _forwarded(value)
            if (
                key == name
                and isinstance(value, cst.Name)
                and not self.index.assignments_to(value.value)
            ):
                return self.model.functions.get(value.value)
        return None

    @cached_property
    def _only_called(self) -> frozenset[str]:
        """The names the file holds in no node but the called name of its calls (``len``,
        ``print``): no ``def``, class, import, parameter or target of the file binds them (each
        of those holds the name it binds), so every way `_resolve` places a plain-name call
        finds nothing for them, and it answers at once."""
        held: dict[str, int] = {}
        for node in self.index.of_type(cst.Name):
            held[node.value] = held.get(node.value, 0) + 1  # type: ignore[attr-defined]
        called: dict[str, int] = {}
        for call in self.model.calls:
            if type(call.func) is cst.Name:
                called[call.func.value] = called.get(call.func.value, 0) + 1
        return frozenset(name for name, count in called.items() if held.get(name) == count)

    def _instance_call(self, name: str, call: cst.Call) -> cst.FunctionDef | None:
        """``early_stopping(val_loss, model)`` after ``early_stopping = EarlyStopping(...)``:
        calling an instance of a class of this file runs its ``__call__`` (a callback handed the
        prepared model must see it as one, to unwrap what it saves)."""
        if name in self.classes or name in self.model.functions:
            return None
        return self._dunder_call(self._receiver_class(name, call))

    def _dunder_call(self, owner: cst.ClassDef | None) -> cst.FunctionDef | None:
        """What calling an instance of ``owner`` runs: its ``__call__``."""
        if owner is None or owner.name.value in self.model.module_classes:
            return None  # a module's ``__call__`` is nn.Module's: it runs forward
        return self.lookup(owner, "__call__")

    def _made_instance_call(self, made: cst.Call) -> cst.FunctionDef | None:
        """``Loop(model, opt, loader)(epochs)``: the instance is called as soon as it is made,
        which runs its class's ``__call__`` (a parameter the conversion adds to it must be
        passed here too)."""
        return self._dunder_call(self.classes.get(dotted(made.func) or ""))

    def _element_calls(self, name: str, call: cst.Call) -> list[cst.FunctionDef]:
        """``callback(...)`` in ``for callback in self.callbacks:``, where every element of the
        list is an instance of a class of this file with a ``__call__`` (callbacks handed to a
        trainer as ``[ModelCheckpoint(path), ...]``): the call runs each of them. Empty when
        any element is not known to be one: a call that may run code of another file."""
        return self._element_methods(name, "__call__", call)

    def _element_methods(self, name: str, method: str, call: cst.Call) -> list[cst.FunctionDef]:
        """``method`` of each element of the list that ``for name in ...`` around ``call``
        iterates (``for cb in callbacks: cb.on_epoch_end(epoch, logs, model)`` runs the
        ``on_epoch_end`` of each callback class the list holds), when every element is an
        instance of a class of this file that has it. Empty when any is not known to be one."""
        if name in self.classes or name in self.model.functions:
            return []
        loop = self._loop_over(name, call)
        if loop is None or any(
            dotted(t) == name
            for a in self.index.assignments_to(name)
            if self.model.order(a) > self.model.order(loop) and self._inside(a, loop)
            for t in assigned_targets(a)
        ):
            return []
        made = self._element_classes(loop.iter, depth=_MAX_DEPTH)
        if not made:
            return []
        found = [self.lookup(self.model.classes[c], method) for c in sorted(made)]
        if any(f is None for f in found) or made & set(self.model.module_classes):
            return []
        return [f for f in found if f is not None]

    def _looked_up_methods(self, lookup: cst.Call, call: cst.Call) -> list[cst.FunctionDef]:
        """What ``getattr(cb, hook)(...)`` runs in ``for cb in self.callbacks:``: the method of
        each element's class (`_element_methods`) named by ``hook``, a string, or a parameter
        of the function around that every call of it hands a string (a trainer's
        ``_run_callbacks("on_epoch_end", epoch, logs)``). Empty when any name is not known."""
        if dotted(lookup.func) != "getattr" or len(lookup.args) != 2:
            return []
        receiver, key = (argument.value for argument in lookup.args)
        if not isinstance(receiver, cst.Name) or any(a.keyword or a.star for a in lookup.args):
            return []
        methods = self._hook_names(key, call)
        found: list[cst.FunctionDef] = []
        for method in sorted(methods):
            each = self._element_methods(receiver.value, method, call)
            if not each:
                return []
            found += [f for f in each if all(f is not known for known in found)]
        return found

    def _hook_names(self, key: cst.BaseExpression, at: cst.CSTNode) -> set[str]:
        """The method names ``key`` stands for: its string, or the strings every call of the
        function around ``at`` hands it when it is that function's parameter (calls by the
        function's plain name, or through ``self`` in its class); empty when any is another
        value, or nothing calls it."""
        if isinstance(key, cst.SimpleString):
            return {str(key.evaluated_value)}
        function = self.index.enclosing_function(at)
        if not isinstance(key, cst.Name) or function is None:
            return set()
        if key.value not in {p.name.value for p in all_params(function.params)}:
            return set()
        owner = self.owner(function)
        calls = [
            (c, 1)
            for c in self.model.calls
            if owner is not None
            and isinstance(c.func, cst.Attribute)
            and c.func.attr.value == function.name.value
            and self._is_self(c.func.value, c)
            and self._enclosing_class(c) is owner
        ]
        if owner is None and self.model.functions.get(function.name.value) is function:
            calls = [(c, 0) for c in self.index.calls_named(function.name.value)]
        names: set[str] = set()
        for made, implicit in calls:
            handed = dict(bound_arguments(function, made, implicit)).get(key.value)
            value = handed.value if handed is not None else None
            if not isinstance(value, cst.SimpleString):
                return set()
            names.add(str(value.evaluated_value))
        return names

    def _function_table_calls(self, name: str, call: cst.Call) -> list[cst.FunctionDef]:
        """``fn(...)`` in ``for name, fn in phases.items()`` (or ``for fn in phases.values()``,
        ``for fn in (train_epoch, evaluate)``), where the table is a dict, list or tuple display
        of this file's module-level functions, bound once in the same function: the call runs
        each of them. Empty when any entry is something else."""
        if name in self.classes or name in self.model.functions:
            return []
        loop = self._table_loop(name, call)
        if loop is None:
            return []
        iterated, position = loop
        table = self._table_display(iterated, call)
        if table is None:
            return []
        if isinstance(table, cst.Dict):
            entries = [e.value for e in table.elements if isinstance(e, cst.DictElement)]
            if len(entries) != len(table.elements) or position != "value":
                return []
        else:
            entries = [e.value for e in table.elements if not isinstance(e, cst.StarredElement)]
            if len(entries) != len(table.elements) or position != "plain":
                return []
        found = []
        for entry in entries:
            function = (
                self.model.functions.get(entry.value) if isinstance(entry, cst.Name) else None
            )
            if function is None or self._shadowed(entry.value, call):
                return []
            found.append(function)
        return list(dict.fromkeys(found))

    def _table_loop(self, name: str, at: cst.CSTNode) -> tuple[cst.BaseExpression, str] | None:
        """What the closest loop around ``at`` that binds ``name`` iterates, and how ``name``
        reads it: ``"plain"`` for ``for fn in table``, ``"value"`` for the value of
        ``for key, fn in table.items()`` and ``for fn in table.values()``; ``"keys"`` else."""
        for ancestor in self.model.ancestors(at):
            clauses: list[cst.For | cst.CompFor] = []
            kind = type(ancestor)
            if kind is cst.For:
                clauses = [ancestor]  # type: ignore[list-item]
            elif kind in _COMPREHENSION_TYPES:
                clause: cst.CompFor | None = ancestor.for_in  # type: ignore[attr-defined]
                while clause is not None:
                    clauses.append(clause)
                    clause = clause.inner_for_in
            elif kind is cst.FunctionDef or kind is cst.Lambda:
                return None
            for loop in clauses:
                if name not in target_names(loop.target):
                    continue
                iterated = loop.iter
                method = (
                    iterated.func.attr.value
                    if isinstance(iterated, cst.Call)
                    and isinstance(iterated.func, cst.Attribute)
                    and not iterated.args
                    else None
                )
                target = loop.target
                if (
                    method == "items"
                    and isinstance(target, cst.Tuple)
                    and len(target.elements) == 2
                ):
                    second = target.elements[1].value
                    held = isinstance(second, cst.Name) and second.value == name
                    return iterated.func.value, "value" if held else "keys"  # type: ignore[union-attr]
                if method == "values" and dotted(target) == name:
                    return iterated.func.value, "value"  # type: ignore[union-attr]
                if method is None and dotted(target) == name:
                    return iterated, "plain"
                return None
        return None

    def _table_display(
        self, value: cst.BaseExpression, at: cst.CSTNode
    ) -> cst.Dict | cst.List | cst.Tuple | None:
        """The display ``value`` is, or the one a plain name was bound to once in the same
        function (and never written into after)."""
        if isinstance(value, (cst.Dict, cst.List, cst.Tuple)):
            return value
        if not isinstance(value, cst.Name):
            return None
        function = self.index.enclosing_function(at)
        assigned = [
            a
            for a in self.index.assignments_to(value.value)
            if self.index.enclosing_function(a) is function
        ]
        if len(assigned) != 1 or self._written_into(value.value, function):
            return None
        display = assigned[0].value
        return display if isinstance(display, (cst.Dict, cst.List, cst.Tuple)) else None

    def _written_into(self, name: str, function: cst.CSTNode | None) -> bool:
        """``table[key] = ...`` or ``table.append(...)``/``update``/``extend`` in ``function``."""
        scope = function if function is not None else self.model.module
        for node in walk(scope):
            if (
                isinstance(node, cst.AssignTarget)
                and isinstance(node.target, cst.Subscript)
                and dotted(node.target.value) == name
            ):
                return True
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and dotted(node.func.value) == name
                and node.func.attr.value in ("append", "extend", "update", "insert", "setdefault")
            ):
                return True
        return False

    def _loop_over(self, name: str, at: cst.CSTNode) -> cst.For | cst.CompFor | None:
        """The closest ``for name in ...`` around ``at``: a statement, or a comprehension's
        (``[cb(model, loss) for cb in self.callbacks]``)."""
        for ancestor in self.model.ancestors(at):
            kind = type(ancestor)
            if kind is cst.For and dotted(ancestor.target) == name:  # type: ignore[attr-defined]
                return ancestor  # type: ignore[return-value]
            if kind in _COMPREHENSION_TYPES:
                clause: cst.CompFor | None = ancestor.for_in  # type: ignore[attr-defined]
                while clause is not None:
                    if dotted(clause.target) == name:
                        return clause
                    clause = clause.inner_for_in
            if kind is cst.FunctionDef or kind is cst.Lambda:
                return None
        return None

    def _inside(self, node: cst.CSTNode, block: cst.CSTNode) -> bool:
        return node is not block and self.model.inside(node, block)

    def _direct_callers(self, function: cst.FunctionDef) -> list[tuple[cst.Call, int]] | None:
        """The calls of a module-level function by its name, or of a constructor by its class's
        name, with the implicit ``self``; None for other methods. Found without resolving
        calls (`callee` asks this while it resolves one)."""
        owner = self.owner(function)
        if owner is None:
            if self.model.functions.get(function.name.value) is not function:
                return None
            return [(c, 0) for c in self.index.calls_named(function.name.value)]
        if function.name.value != "__init__" or self.classes.get(owner.name.value) is not owner:
            return None
        found = [(c, 1) for c in self.index.calls_named(owner.name.value)]
        for sub in self.subclasses(owner):  # ``super().__init__(model, optimizer, callbacks)``
            init = self.methods(sub).get("__init__")
            if init is None:
                # ``ClassifierTrainer(model, optimizer, callbacks=...)``: a subclass with no
                # constructor of its own runs this one
                if self.lookup(sub, "__init__") is function:
                    found += [(c, 1) for c in self.index.calls_named(sub.name.value)]
                continue
            found += [
                (c, 1)
                for c in self.index.calls_directly_in(init)
                if isinstance(c.func, cst.Attribute)
                and c.func.attr.value == "__init__"
                and _is_super_call(c.func.value)
            ]
        return found

    def _element_classes(self, value: cst.BaseExpression, depth: int) -> set[str] | None:
        """The classes of this file whose instances ``value`` (a list) holds: a list or tuple
        display of instances, ``list(x)``, ``x or []``, a name assigned once, an attribute set
        in its class, a parameter followed to the arguments its callers pass. None: unknown."""
        if isinstance(value, (cst.List, cst.Tuple)):
            found: set[str] = set()
            for element in value.elements:
                if isinstance(element, cst.StarredElement):
                    return None
                made = self._made_by(element.value, depth=2) or self._local_instance(element.value)
                if made is None:
                    return None
                found.add(made)
            return found
        if isinstance(value, (cst.ListComp, cst.SetComp, cst.GeneratorExp)):
            made = self._made_by(value.elt, depth=2)  # ``[ModelCheckpoint(p) for p in paths]``
            return {made} if made is not None else None
        if isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
            left = self._element_classes(value.left, depth)
            right = self._element_classes(value.right, depth)
            return None if left is None or right is None else left | right
        if (
            isinstance(value, cst.Call)
            and dotted(value.func) in ("list", "tuple")
            and len(value.args) == 1
        ):
            return self._element_classes(value.args[0].value, depth)
        name = dotted(value)
        if name is None or depth == 0:
            return None
        return self._element_classes_of_name(name, value, depth - 1)

    def _local_instance(self, value: cst.BaseExpression) -> str | None:
        """``history`` of ``[EarlyStopping(), history]``: a local name every assignment of
        its function binds to an instance of one class of this file (``history =
        History()``)."""
        if not isinstance(value, cst.Name):
            return None
        function = self.index.enclosing_function(value)
        made = {
            self._made_by(a.value, depth=2)
            for a in self.index.assignments_to(value.value)
            if self.index.enclosing_function(a) is function
        }
        return made.pop() if len(made) == 1 else None

    def _element_classes_of_name(self, name: str, at: cst.CSTNode, depth: int) -> set[str] | None:
        wanted = self.index.enclosing_class_name(at) if name.startswith("self.") else None
        function = self.index.enclosing_function(at)
        values: list[cst.BaseExpression] = [
            a.value
            for a in self.index.assignments_to(name)
            if (wanted is None or self.index.enclosing_class_name(a) == wanted)
            and (wanted is not None or self.index.enclosing_function(a) is function)
        ]
        if not values and function is not None and "." not in name:
            params = [p for p in all_params(function.params) if p.name.value == name]
            if not params:
                return None
            callers = self._direct_callers(function)
            if callers is None:
                return None
            for caller, implicit in callers:
                passed = [
                    a.value for p, a in bound_arguments(function, caller, implicit) if p == name
                ]
                if not passed:
                    passed = self._forwarded_keyword(caller, name, depth)
                if not passed:
                    default = params[0].default
                    if default is None:
                        return None
                    passed = [default]
                values.extend(passed)
        if not values:
            return None
        found: set[str] = set()
        for value in values:
            made = self._element_classes(value, depth)
            if made is None:
                return None
            found |= made
        for appended in self._appended_to(name, wanted, function):
            made = self._instance_classes(appended, depth)
            if made is None:
                return None
            found |= made
        return found

    def forwarded_arguments(
        self, function: cst.FunctionDef, call: cst.Call, implicit: int
    ) -> list[tuple[str, cst.Arg]]:
        """(parameter, argument) pairs for the parameters of ``function`` that ``call`` passes
        only through the enclosing function's ``**kwargs`` (`_forwarded_keyword`): each is the
        keyword argument of an outer call, in that call's scope."""
        bound = {p for p, _ in bound_arguments(function, call, implicit)}
        found: list[tuple[str, cst.Arg]] = []
        positional = function.params.params[implicit:]
        for param in [*function.params.params, *function.params.kwonly_params]:
            name = param.name.value
            if name in bound:
                continue
            passed = self._forwarded_keyword_args(call, name, _MAX_DEPTH)
            if not passed and param in positional:
                passed = self._forwarded_positional_args(call, positional.index(param), _MAX_DEPTH)
            found += [(name, a) for a in passed]
        return found

    def _forwarded_positional_args(self, call: cst.Call, index: int, depth: int) -> list[cst.Arg]:
        """What reaches the ``index``-th positional parameter of ``call``'s callee through the
        enclosing function's own ``*args`` (``super().__init__(*args, **kwargs)`` in
        ``ClassifierTrainer.__init__(self, *args, label_smoothing=0.1, **kwargs)``): the
        positional argument at that place of each of its callers (``ClassifierTrainer(model,
        optimizer, train_loader, val_loader)``). Empty when a caller's positionals are not all
        plain (a star of its own), or any caller passes none there."""
        enclosing = self.index.enclosing_function(call)
        star = enclosing.params.star_arg if enclosing is not None else None
        if enclosing is None or not isinstance(star, cst.Param) or depth == 0:
            return []
        own = star.name.value
        spread = [i for i, a in enumerate(call.args) if a.star == "*" and dotted(a.value) == own]
        if len(spread) != 1 or any(a.star or a.keyword for a in call.args[: spread[0]]):
            return []
        if index < spread[0]:
            return []
        callers = self._direct_callers(enclosing)
        if not callers:
            return []
        found: list[cst.Arg] = []
        for outer, implicit in callers:
            named = len(enclosing.params.params) - implicit  # its own positionals come first
            place = named + index - spread[0]
            plain = [a for a in outer.args if a.keyword is None]
            if any(a.star for a in plain[: place + 1]):
                return []
            if place < len(plain):
                found.append(plain[place])
            else:
                passed = self._forwarded_positional_args(outer, place, depth - 1)
                if not passed:
                    return []
                found.extend(passed)
        return found

    def _forwarded_keyword(self, call: cst.Call, name: str, depth: int) -> list[cst.BaseExpression]:
        return [a.value for a in self._forwarded_keyword_args(call, name, depth)]

    def _forwarded_keyword_args(self, call: cst.Call, name: str, depth: int) -> list[cst.Arg]:
        """What reaches parameter ``name`` through ``call``'s ``**kwargs`` when that is the
        enclosing function's own (``super().__init__(**kwargs)`` in
        ``ClassificationTrainer.__init__(self, num_classes, **kwargs)``): the keyword ``name``
        its callers pass (``ClassificationTrainer(..., callbacks=[SaveCheckpoint(p)])``).
        Empty when any caller passes no such keyword, or when it is one of its own parameters."""
        enclosing = self.index.enclosing_function(call)
        star = enclosing.params.star_kwarg if enclosing is not None else None
        if enclosing is None or star is None or depth == 0:
            return []
        forwards = any(a.star == "**" and dotted(a.value) == star.name.value for a in call.args)
        named = {p.name.value for p in all_params(enclosing.params) if p is not star}
        callers = self._direct_callers(enclosing)
        if not forwards or name in named or not callers:
            return []
        found: list[cst.Arg] = []
        for outer, _ in callers:
            passed = [a for a in outer.args if a.keyword is not None and a.keyword.value == name]
            passed = passed or self._forwarded_keyword_args(outer, name, depth - 1)
            if not passed:
                return []
            found.extend(passed)
        return found

    def _appended_to(
        self, name: str, wanted: str | None, function: cst.FunctionDef | None
    ) -> list[cst.BaseExpression]:
        """What ``name.append(x)`` adds to the list, in its class (``self.callbacks``) or in
        its function; for a list the class keeps, also through an instance of it (or of a
        subclass) from outside the class: ``trainer.callbacks.append(Checkpoint(path))``."""
        found = []
        for call in self.model.calls:
            func = call.func
            if not (
                isinstance(func, cst.Attribute)
                and func.attr.value == "append"
                and len(call.args) == 1
            ):
                continue
            if dotted(func.value) != name:
                if wanted is not None and self._appends_through_an_instance(
                    func.value, name, wanted, call
                ):
                    found.append(call.args[0].value)
                continue
            if wanted is not None and self.index.enclosing_class_name(call) != wanted:
                continue
            if wanted is None and self.index.enclosing_function(call) is not function:
                continue
            found.append(call.args[0].value)
        return found

    def _appends_through_an_instance(
        self, target: cst.BaseExpression, name: str, wanted: str, at: cst.CSTNode
    ) -> bool:
        """``target`` (``trainer.callbacks``) is the list ``name`` (``self.callbacks``) of
        class ``wanted`` kept by an instance that a class deriving from it made."""
        if not (isinstance(target, cst.Attribute) and f"self.{target.attr.value}" == name):
            return False
        receiver = dotted(target.value)
        owner = self.classes.get(wanted)
        if receiver is None or receiver.startswith("self.") or owner is None:
            return False
        made = self._receiver_class(receiver, at)
        return made is not None and self.is_or_derives(made, owner)

    def _instance_classes(self, value: cst.BaseExpression, depth: int) -> set[str] | None:
        """The classes of this file ``value`` is an instance of: built here (``Cls(...)``), or
        a loop variable over a list of them (``for cb in callbacks: ...append(cb)``)."""
        made = self._made_by(value, depth=2)
        if made is not None:
            return {made}
        if not isinstance(value, cst.Name):
            return None
        loop = self._loop_over(value.value, value)
        if loop is None or depth == 0:
            return None
        return self._element_classes(loop.iter, depth - 1)

    def _receiver_class(self, receiver: str, at: cst.CSTNode) -> cst.ClassDef | None:
        """The class of this file that made ``receiver``: built in scope, else by any
        assignment of the file (`instance_class`)."""
        built = self._instance_class(receiver, at)
        if built is not None:
            return built
        made = self.instance_class(receiver, at)
        if made is not None:
            return self.model.classes.get(made)
        return self._parameter_class(receiver, at, depth=2)

    def _parameter_class(self, name: str, at: cst.CSTNode, depth: int) -> cst.ClassDef | None:
        """The class of this file whose instance every call of the function around ``at``
        hands it for its parameter ``name`` (``train(..., early_stopper=es)`` after ``es =
        EarlyStopping()``): the parameter is the object its callers made. A ``None`` passed or
        defaulted (``early_stopper=None``) is no instance; any other value, or a parameter the
        function also rebinds, leaves it unknown."""
        function = self.index.enclosing_function(at)
        if function is None or "." in name or depth == 0:
            return None
        params = [p for p in all_params(function.params) if p.name.value == name]
        if not params or name in {
            dotted(t) for a in self.index.own_assignments(function) for t in assigned_targets(a)
        }:
            return None
        callers = self._direct_callers(function)
        if not callers:
            return None
        found: set[str] = set()
        for caller, implicit in callers:
            passed = [a.value for p, a in bound_arguments(function, caller, implicit) if p == name]
            if not passed and params[0].default is not None:
                passed = [params[0].default]
            if not passed:
                return None
            for value in passed:
                if dotted(value) == "None":
                    continue
                made = self._made_by(value, depth=2)
                if made is None and isinstance(value, cst.Name):
                    owner = self._instance_class(value.value, caller) or (
                        self._parameter_class(value.value, caller, depth - 1)
                    )
                    made = owner.name.value if owner is not None else None
                    made = made or self.instance_class(value.value, caller)
                if made is None:
                    return None
                found.add(made)
        return self.model.classes.get(found.pop()) if len(found) == 1 else None

    def calls_by_callee(self) -> dict[cst.FunctionDef, list[tuple[cst.Call, int]]]:
        """Every call of the file grouped by the function `callee` says it runs, in source
        order, with the implicit ``self``."""
        if self._by_callee is not None:
            return self._by_callee
        found: dict[cst.FunctionDef, list[tuple[cst.Call, int]]] = {}
        for call in self.model.calls:
            for function, implicit in self.callees(call):
                found.setdefault(function, []).append((call, implicit))
        if self.model.complete:
            self._by_callee = found
        return found

    def calls_of(self, function: cst.FunctionDef) -> list[tuple[cst.Call, int]]:
        """Every call in the file that runs ``function`` (`callee`), with its implicit ``self``."""
        return list(self.calls_by_callee().get(function, ()))

    def instance_class(self, name: str, at: cst.CSTNode) -> str | None:
        """The class of this file that made ``name``: ``trainer = Trainer(...)``, or
        ``model = build_model()`` where ``build_model`` returns ``Net(...)``; for ``self.x``,
        an assignment in the class around ``at``. The last such assignment of the file that
        tells decides."""
        wanted = self.index.enclosing_class_name(at) if name.startswith("self.") else None
        key = (name, wanted)
        if key in self._instances:
            return self._instances[key]
        found = None
        for assign in self.index.assignments_to(name):
            if wanted is not None and self.index.enclosing_class_name(assign) != wanted:
                continue
            found = (
                self._made_by(assign.value, depth=2)
                or self._narrowed_class(assign)
                or self._kept_parameter_class(assign, wanted)
                or found
            )
        self._instances[key] = found
        return found

    def _kept_parameter_class(self, assign: cst.Assign, wanted: str | None) -> str | None:
        """``self.early_stopping = early_stopping`` in ``Trainer.__init__``, where every
        ``Trainer(...)`` of the file hands it an ``EarlyStopping(...)``: the attribute holds
        that instance, so ``self.early_stopping(loss, self.model)`` runs its ``__call__`` (which
        must see the prepared model it is handed, to unwrap what it saves)."""
        if wanted is None or not isinstance(assign.value, cst.Name):
            return None
        owner = self._parameter_class(assign.value.value, assign, depth=2)
        return None if owner is None else owner.name.value

    def made_by(self, value: cst.BaseExpression) -> str | None:
        """The class of this file ``value`` makes: ``Trainer(...)`` (also moved, ``.to(d)``),
        or a call of a function that returns one (two factories deep)."""
        return self._made_by(value, depth=2)

    def _narrowed_class(self, assign: cst.Assign) -> str | None:
        """``self.checkpoint = cb`` under ``if isinstance(cb, ModelCheckpoint):`` (callbacks
        sorted out of a list by type): the value is an instance of that class of this file, so a
        call of the attribute runs its ``__call__``. Only the ``if`` branch tells, not ``else``."""
        value = dotted(assign.value)
        if value is None:
            return None
        child: cst.CSTNode = assign
        for ancestor in self.model.ancestors(assign):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.If) and ancestor.body is child:
                made = _isinstance_of(ancestor.test, value)
                if made in self.model.classes:
                    return made
            child = ancestor
        return None

    def _made_by(self, value: cst.BaseExpression, depth: int) -> str | None:
        key = (value, depth)
        if key not in self._made:
            self._made[key] = self._make(value, depth)
        return self._made[key]

    def _make(self, value: cst.BaseExpression, depth: int) -> str | None:
        core = strip_self_methods(value)
        if isinstance(core, cst.Call) and isinstance(core.func, cst.Attribute):
            return self._class_factory(core.func)
        if not (isinstance(core, cst.Call) and isinstance(core.func, cst.Name)):
            return None
        if core.func.value in self.model.classes:
            return core.func.value
        factory = self.model.functions.get(core.func.value)
        if factory is None or depth == 0:
            return None
        made = set()
        for node in self.index.own_returns(factory):
            returned = node.value
            name = dotted(returned)  # type: ignore[arg-type]
            if name is not None:
                values = [
                    a.value
                    for a in self.index.own_assignments(factory)
                    if any(dotted(t) == name for t in assigned_targets(a))
                ]
                made |= {self._made_by(v, depth - 1) for v in values}
            else:
                made.add(self._made_by(returned, depth - 1))  # type: ignore[arg-type]
        return made.pop() if len(made) == 1 else None

    def _class_factory(self, func: cst.Attribute) -> str | None:
        """``Experiment.from_config(path)``: a classmethod of a class of this file every
        ``return`` of which builds the class (``return cls(**cfg)``) makes an instance of it,
        as ``Experiment(...)`` does; its name."""
        owner_name = dotted(func.value)
        owner = self.model.classes.get(owner_name or "")
        if owner is None:
            return None
        method = self.methods(owner).get(func.attr.value)
        if method is None or "classmethod" not in {dotted(d.decorator) for d in method.decorators}:
            return None
        params = all_params(method.params)
        if not params:
            return None
        builders = {params[0].name.value, owner.name.value}
        returns = self.index.own_returns(method)
        if returns and all(
            isinstance(r.value, cst.Call)
            and isinstance(r.value.func, cst.Name)
            and r.value.func.value in builders
            for r in returns
        ):
            return owner_name
        return None

    def _attribute_target(self, node: cst.Attribute, name: str) -> cst.FunctionDef | None:
        if self._is_self(node.value, node):
            owner = self._enclosing_class(node)
            return self.lookup(owner, name) if owner is not None else None
        receiver = dotted(node.value)
        owner = self._receiver_class(receiver, node) if receiver else None
        return self.lookup(owner, name) if owner is not None else None

    @cached_property
    def _nested_defs(self) -> dict[cst.FunctionDef, dict[str, cst.FunctionDef]]:
        """The functions defined directly inside each function, by name."""
        found: dict[cst.FunctionDef, dict[str, cst.FunctionDef]] = {}
        for node in self.index.of_type(cst.FunctionDef):
            outer = self.index.enclosing_function(node)
            if outer is not None and self.owner(node) is None:  # type: ignore[arg-type]
                found.setdefault(outer, {}).setdefault(node.name.value, node)  # type: ignore
        return found

    def _local_def(self, name: str, at: cst.CSTNode) -> cst.FunctionDef | None:
        """A function ``name`` defined inside one of the functions around ``at``."""
        if not self._nested_defs:
            return None
        function = self.index.enclosing_function(at)
        while function is not None:
            found = self._nested_defs.get(function, {}).get(name)
            if found is not None:
                return found
            function = self.index.enclosing_function(function)
        return None

    @cached_property
    def _local_names(self) -> dict[cst.FunctionDef, set[str]]:
        """The names each function binds itself (parameters, assignment and loop targets,
        ``as`` names): there a name is the function's own variable, whatever the module defines
        under it (``def __init__(self, root, train): MNIST(root, train=train)``)."""
        found: dict[cst.FunctionDef, set[str]] = {}
        for node in self._binding_nodes():
            if type(node) is cst.Param:
                if isinstance(self.model.parent(self.model.parent(node)), cst.Lambda):
                    continue  # the lambda's own
                bound: set[str] = {node.name.value}
            elif type(node) is cst.AsName:
                bound = target_names(node.name)  # type: ignore[attr-defined]
            else:  # an assignment's or augmented assignment's target, a loop's
                bound = target_names(node.target)  # type: ignore[attr-defined]
            function = self.index.enclosing_function(node)
            if function is not None:
                found.setdefault(function, set()).update(bound)
        return found

    def _binding_nodes(self) -> Iterator[cst.CSTNode]:
        """The nodes whose names `_local_names` reads, by type (what each binds is a set)."""
        for kind in (cst.Param, cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For):
            yield from self.index.of_type(kind)
        yield from self.index.of_type(cst.AsName)

    def _returned_closure(self, name: str, at: cst.CSTNode) -> cst.FunctionDef | None:
        """The nested ``def`` that a function of this file returns, where ``name`` is bound
        once, in the function around ``at``, to that function's call: ``train_step =
        make_train_step(model, opt, loss_fn)`` then ``train_step(x, y)`` runs the ``def
        train_step`` inside ``make_train_step`` (a functional script's step: its backward
        trains the loop that calls it)."""
        function = self.index.enclosing_function(at)
        bound = [
            assign
            for assign in self.index.assignments_to(name)
            if self.index.enclosing_function(assign) is function
        ]
        if len(bound) != 1 or len(assigned_targets(bound[0])) != 1:
            return None
        value = bound[0].value
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
            return None
        factory = self.model.functions.get(value.func.value)
        if factory is None or self._shadowed(value.func.value, value):
            return None
        nested = {
            statement.name.value: statement
            for statement in factory.body.body
            if isinstance(statement, cst.FunctionDef)
        }
        returned = {
            nested.get(node.value.value) if isinstance(node.value, cst.Name) else None
            for node in self.index.own_returns(factory)
        }
        if len(returned) != 1:
            return None
        return returned.pop()

    def _aliased_function(self, name: str, at: cst.CSTNode) -> cst.FunctionDef | None:
        """The module-level function of this file that ``name`` is a local alias of, where
        ``name`` is bound once, in the function around ``at`` and by nothing else there, to
        that function's plain name: ``step = train_one_epoch`` then ``step(model, loader)``
        runs ``train_one_epoch`` (its backward trains the loop that calls it, and its
        parameters receive what the call hands over)."""
        function = self.index.enclosing_function(at)
        if function is None:
            return None
        bindings = [
            node
            for node in self._binding_nodes()
            if self.index.enclosing_function(node) is function
            and name in self._names_bound_by(node)
        ]
        if len(bindings) != 1 or type(bindings[0]) is not cst.AssignTarget:
            return None
        assign = self.model.parent(bindings[0])
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return None
        if not isinstance(assign.targets[0].target, cst.Name):
            return None
        value = assign.value
        if not isinstance(value, cst.Name) or self._shadowed(value.value, assign):
            return None
        return self.model.functions.get(value.value)

    def _called_alias(self, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
        """``node`` is the value of ``step = train_one_epoch``, an alias `_aliased_function`
        resolves to ``function``, and the function around it reads ``step`` only to call it:
        those calls are ``function``'s callers, and nothing else receives it."""
        assign = self.model.parent(node)
        if not isinstance(assign, cst.Assign) or assign.value is not node:
            return False
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
            return False
        alias = assign.targets[0].target
        around = self.index.enclosing_function(assign)
        reads = [
            read
            for read in self.index.names_spelled(alias.value)
            if read is not alias and self.index.enclosing_function(read) is around
        ]
        if not reads:
            return False
        for read in reads:
            call = self.model.parent(read)
            if not (isinstance(call, cst.Call) and call.func is read):
                return False
            if self._aliased_function(alias.value, call) is not function:
                return False
        return True

    def _names_bound_by(self, node: cst.CSTNode) -> set[str]:
        """The names one of `_binding_nodes` binds."""
        if type(node) is cst.Param:
            return {node.name.value}  # type: ignore[attr-defined]
        if type(node) is cst.AsName:
            return target_names(node.name)  # type: ignore[attr-defined]
        return target_names(node.target)  # type: ignore[attr-defined]

    def _shadowed(self, name: str, at: cst.CSTNode) -> bool:
        """``name`` at ``at`` is a variable of a function, lambda or comprehension around it,
        not a module-level name."""
        for ancestor in self.model.ancestors(at):
            kind = type(ancestor)
            if kind is cst.FunctionDef:
                bound: Iterable[str] = self._local_names.get(ancestor, ())  # type: ignore[call-overload]
            elif kind is cst.Lambda:
                bound = [param.name.value for param in all_params(ancestor.params)]  # type: ignore[attr-defined]
            elif kind in _COMPREHENSION_TYPES:
                bound = _comprehension_names(ancestor.for_in)  # type: ignore[attr-defined]
            else:
                continue
            if name in bound:
                return True
        return False

    def _class_parameter(self, name: str, at: cst.CSTNode) -> cst.ClassDef | None:
        """The class ``name`` stands for when it is the first parameter of the classmethod
        around ``at`` (``cls``)."""
        method = self._enclosing_method(at)
        if method is None or self.index.enclosing_function(at) is not method:
            return None
        if "classmethod" not in {dotted(d.decorator) for d in method.decorators}:
            return None
        first = method.params.params[0].name.value if method.params.params else None
        return self.owner(method) if first == name else None

    def _enclosing_class(self, at: cst.CSTNode) -> cst.ClassDef | None:
        method = self._enclosing_method(at)
        return self.owner(method) if method is not None else None

    def _enclosing_method(self, at: cst.CSTNode) -> cst.FunctionDef | None:
        if at not in self._methods_around:
            function = self.index.enclosing_function(at)
            while function is not None and self.owner(function) is None:
                function = self.index.enclosing_function(function)
            self._methods_around[at] = function
        return self._methods_around[at]

    def _is_self(self, receiver: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """The method's first parameter (``self``), read in the method or a closure inside it."""
        method = self._enclosing_method(at)
        if method is None or not isinstance(receiver, cst.Name):
            return False
        params = [*method.params.posonly_params, *method.params.params]
        return bool(params) and params[0].name.value == receiver.value

    @cached_property
    def _constructions(self) -> dict[str, list[tuple[cst.Assign, cst.ClassDef]]]:
        """``trainer = Trainer(...)`` (also ``Trainer(...).to(device)``), by target name."""
        found: dict[str, list[tuple[cst.Assign, cst.ClassDef]]] = {}
        for assign in self.model.assignments:
            for name, made in _paired_constructions(assign):
                if made in self.classes:  # ``train_metric, val_metric = Metric(), Metric()``
                    found.setdefault(name, []).append((assign, self.classes[made]))
            value = strip_self_methods(assign.value)
            if not isinstance(value, cst.Call) or dotted(value.func) not in self.classes:
                continue
            for target in assigned_targets(assign):
                name = dotted(target)
                if name is not None:
                    found.setdefault(name, []).append((assign, self.classes[dotted(value.func)]))
        return found

    def _instance_class(self, receiver: str, at: cst.CSTNode) -> cst.ClassDef | None:
        """``trainer`` after ``trainer = Trainer(...)`` in the same scope (or the module), or
        ``self.trainer`` after ``self.trainer = Trainer(...)`` in the same class."""
        scope = self.model.scope_of(at)
        owner = self._enclosing_class(at) if receiver.startswith("self.") else None
        for assign, built in self._constructions.get(receiver, []):
            if owner is not None:
                if self._enclosing_class(assign) is owner:
                    return built
            elif self.model.scope_of(assign) is scope or isinstance(
                self.model.scope_of(assign), cst.Module
            ):
                return built
        return None


@dataclass
class _Resolution:
    """What a call runs as far as the file's definitions tell: its targets, the parameters it
    binds implicitly, and the receiver when only the model fallback can still place it."""

    targets: list[cst.FunctionDef]
    implicit: int
    unplaced: str | None = None


def _paired_constructions(assign: cst.CSTNode) -> list[tuple[str, str]]:
    """``a, b = Metric(), Other()``: each target name with the class its own element calls
    (by name); empty for any other assignment."""
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return []
    target, value = assign.targets[0].target, assign.value
    if not isinstance(target, cst.Tuple | cst.List) or not isinstance(value, cst.Tuple | cst.List):
        return []
    if len(target.elements) != len(value.elements):
        return []
    found = []
    for left, right in zip(target.elements, value.elements, strict=True):
        name = dotted(left.value)
        element = strip_self_methods(right.value)
        if name is not None and isinstance(element, cst.Call) and dotted(element.func):
            found.append((name, dotted(element.func) or ""))
    return found


def _is_super_call(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and dotted(node.func) == "super"


def _comprehension_names(for_in: cst.CompFor) -> set[str]:
    names = target_names(for_in.target)
    return names | _comprehension_names(for_in.inner_for_in) if for_in.inner_for_in else names


def _bound(method: cst.FunctionDef | None) -> int:
    """How many leading parameters a call through an instance binds: none for a static method
    (``self._foreach_batch(dl, fn)`` hands ``dl`` to its first parameter), else ``self`` or
    ``cls``."""
    if method is None:
        return 1
    return 0 if any(dotted(d.decorator) == "staticmethod" for d in method.decorators) else 1


def _isinstance_of(test: cst.BaseExpression, name: str) -> str | None:
    """The class ``test`` checks ``name`` against: ``isinstance(name, Cls)``, else None."""
    if not (isinstance(test, cst.Call) and dotted(test.func) == "isinstance"):
        return None
    if len(test.args) != 2 or dotted(test.args[0].value) != name:
        return None
    return dotted(test.args[1].value)


def _namespace_entries(made: cst.Call) -> list[tuple[str, cst.BaseExpression]]:
    """The attributes ``SimpleNamespace(...)`` gives its object with their values: its keywords
    and the string keys of a ``**{...}`` display it unpacks."""
    found: list[tuple[str, cst.BaseExpression]] = []
    for argument in made.args:
        if argument.keyword is not None:
            found.append((argument.keyword.value, argument.value))
        elif argument.star == "**" and isinstance(argument.value, cst.Dict):
            for element in argument.value.elements:
                if isinstance(element, cst.DictElement) and isinstance(
                    element.key, cst.SimpleString
                ):
                    key = element.key.evaluated_value
                    if isinstance(key, str):
                        found.append((key, element.value))
    return found


def _forwarded(value: cst.BaseExpression) -> cst.BaseExpression:
    """``save_fn`` for ``lambda m, p: save_fn(m, p)``: a lambda that hands its own parameters,
    in order and nothing else, to one function is that function; anything else as it is."""
    if not isinstance(value, cst.Lambda) or not isinstance(value.body, cst.Call):
        return value
    params = value.params
    if (
        params.star_arg is not cst.MaybeSentinel.DEFAULT
        or params.kwonly_params
        or (params.star_kwarg is not None or params.posonly_params)
    ):
        return value
    names = [p.name.value for p in params.params if p.default is None]
    handed = [a.value for a in value.body.args]
    if len(names) != len(params.params) or any(
        a.keyword is not None or a.star for a in value.body.args
    ):
        return value
    if [h.value if isinstance(h, cst.Name) else None for h in handed] != names:
        return value
    return value.body.func
