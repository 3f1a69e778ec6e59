"""Objects across functions and classes: an attribute, a parameter and a return value are the
same object as the local they came from.

``Trainer(model, train_loader)`` makes ``__init__``'s ``train_loader`` a loader, and
``self.train_loader = train_loader`` makes ``self.train_loader`` one too (a *received* binding:
the object was made elsewhere). ``train_loader, val_loader = get_loaders()`` binds two loaders
when ``get_loaders`` returns them, and ``optimizer = model.configure_optimizers()`` an optimizer
when the model's class builds and returns one. One question answers which function a call runs
(`callee`, the file's one call resolver: `call_graph`) and which parameter each argument lands
in (`bound_arguments`): the analysis and the object flow ask it, nothing else re-derives it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import libcst as cst

from accelify.analysis.imported_returns import Returned
from accelify.analysis.names import DATALOADERS
from accelify.analysis.prepare_order import handed_before_prepare
from accelify.analysis.prepare_outputs import same_object_names
from accelify.analysis.script_model import Binding, Kind, ScriptModel, value_classifier
from accelify.analysis.syntax import (
    Path,
    assigned_targets,
    dotted,
    element_at,
    has_parameter,
    is_assignment,
    is_docstring,
    strip_self_methods,
    tuple_leaves,
    unpacked_pairs,
)

Classify = Callable[[cst.BaseExpression, str], Kind | None]

#: Rounds of propagation: a factory that returns what a constructor received, and so on.
ROUNDS = 4


def methods_of(model: ScriptModel, class_name: str) -> dict[str, cst.FunctionDef]:
    return model.index.methods_of(class_name)


def callee(model: ScriptModel, call: cst.Call) -> tuple[cst.FunctionDef, int] | None:
    """The function of this file that ``call`` runs, and how many of its leading parameters the
    call binds implicitly (``self``): the file's one call resolver (`call_graph`) answers."""
    return model.call_graph.callee(call)


def is_loader_dict(model: ScriptModel, binding: Binding) -> bool:
    """A dict of DataLoaders (``{"train": DataLoader(...), ...}``, or built by a comprehension),
    made here or returned by a
    factory (``loaders = get_dataloaders()``), or received from a caller that passes one
    (``self.loaders = loaders`` of ``Runner(model, loaders)``): ``prepare`` hands a dict back
    untouched, so each loader in it must be prepared on its own."""
    value = binding.value
    if binding.kind is not Kind.DATALOADER:
        return False
    if binding.received:
        return _made_as(model, binding, is_loader_dict) or any(
            _returns_loader_dicts(model, argument) is False
            if isinstance(argument, cst.Call)
            else not _of_dicts(argument)
            for argument in _passed_calls(model, binding)
        )
    if isinstance(value, cst.Dict | cst.DictComp):
        return not _of_dicts(value)
    return _returns_loader_dicts(model, value, _unpacked_path(binding)) is False


def _returns_loader_dicts(
    model: ScriptModel, value: cst.BaseExpression, path: Path = ()
) -> bool | None:
    """Whether ``value`` calls a factory every ``return`` of which is a dict (the element at
    ``path`` of a returned tuple): ``get_loaders(cfg)`` returning ``{"train": ..., ...}``,
    False; True when those dicts hold dicts (``{"a": {"train": ...}}``); None when it returns
    no dict there. The factory is a function of the file, or of another module of the project
    (``from data import make_loaders``: its answer found there, `imported_returns`), whose
    loaders are analysed as made here."""
    if not isinstance(value, cst.Call):
        return None
    target = callee(model, value)
    if target is None:
        return _imported_call_returns(model, value).dicts.get(path)
    return returned_loader_dicts(model, target[0]).get(path)


def returned_loader_dicts(model: ScriptModel, function: cst.FunctionDef) -> dict[Path, bool]:
    """Where every ``return`` of ``function`` hands back a dict (``return {"train": ...,
    "val": ...}``, or a name it assigns once to one), by position in a returned tuple (``()``:
    the one object returned), each with whether those dicts hold dicts: a factory of loader
    dicts. Only positions where every return agrees are kept."""
    returned = [r.value for r in model.index.own_returns(function) if r.value is not None]
    if not returned:
        return {}
    answers: list[dict[Path, bool]] = []
    for result in returned:
        found = {}
        for path, leaf in tuple_leaves(result) or []:
            held = _held(model, function, leaf)
            if isinstance(held, cst.Dict):  # ``{"a": loaders}`` of ``loaders = {...}``: dicts
                found[path] = _of_dicts(held) or any(
                    isinstance(e, cst.DictElement)
                    and isinstance(_held(model, function, e.value), cst.Dict | cst.DictComp)
                    for e in held.elements
                )
        answers.append(found)
    agreed = set(answers[0].items())
    for answer in answers[1:]:
        agreed &= set(answer.items())
    return dict(agreed)


def _imported_call_returns(model: ScriptModel, call: cst.Call) -> Returned:
    """What ``call`` of a function of another module of the project returns (`Returned`:
    found beforehand by the conversion, `ScriptModel.imported_returns`, or asked of the
    linter's project view); empty for any other call."""
    if id(call) in model.imported_returns:
        return Returned.of(model.imported_returns[id(call)])
    if model.project is not None:
        return Returned.of(model.project.imported_returns(model, call))
    return Returned()


def _held(
    model: ScriptModel, function: cst.FunctionDef, result: cst.BaseExpression
) -> cst.BaseExpression:
    """What a returned name holds: the one value ``function`` assigns it (``loaders = {...}``
    then ``return loaders``); else ``result`` itself."""
    if not isinstance(result, cst.Name):
        return result
    values = [
        a.value
        for a in model.index.own_assignments(function)
        if any(dotted(t) == result.value for t in assigned_targets(a))
    ]
    return values[0] if len(values) == 1 else result


def is_dict_of_loader_dicts(model: ScriptModel, binding: Binding) -> bool:
    """``{task: {"train": DataLoader(...), "test": DataLoader(...)} for ...}``, made here or
    received from a caller that made one: ``prepare`` hands back a dict untouched, and preparing
    each value would hand back each inner dict untouched too."""
    if binding.kind is not Kind.DATALOADER:
        return False
    if binding.received:
        return _made_as(model, binding, is_dict_of_loader_dicts)
    if isinstance(binding.value, cst.Dict | cst.DictComp):
        return _of_dicts(binding.value)
    return _returns_loader_dicts(model, binding.value, _unpacked_path(binding)) is True


def _passed_calls(model: ScriptModel, binding: Binding) -> list[cst.Call | cst.Dict]:
    """The calls and dict displays callers pass straight in for a received ``binding``:
    ``get_loaders(cfg)`` of ``cls(cfg, model, get_loaders(cfg))``, ``{"train": tl, "val": vl}``
    of ``super().__init__(model, loaders={"train": tl, "val": vl})``, for ``self.loaders =
    loaders`` (no name holds it, so `Binding.sources` cannot say what it is)."""
    function = binding.scope
    if not isinstance(function, cst.FunctionDef):
        return []
    parameter = received_name(function, binding.value)
    return [
        argument.value
        for call, implicit in model.call_graph.calls_of(function)
        for name, argument in _arguments(model, function, call, implicit)
        if name == parameter and isinstance(argument.value, cst.Call | cst.Dict)
    ]


def _made_as(
    model: ScriptModel, binding: Binding, kind: Callable[[ScriptModel, Binding], bool]
) -> bool:
    """A received ``binding`` is of ``kind`` when what a caller passes in is."""
    return any(
        kind(model, source)
        for source in model.bindings
        if source.name in binding.sources and not source.received
    )


def _of_dicts(value: cst.Dict | cst.DictComp) -> bool:
    nested = (cst.Dict, cst.DictComp)
    if isinstance(value, cst.DictComp):
        return isinstance(value.value, nested)
    return any(
        isinstance(element, cst.DictElement) and isinstance(element.value, nested)
        for element in value.elements
    )


def _unpacked_path(binding: Binding) -> Path:
    """Where ``binding`` stands in the tuple its assignment unpacks (``(1,)`` for ``evals`` in
    ``train, evals = build_loaders(cfg)``, ``(1, 0)`` for ``tr`` in ``(m, o), (tr, va) =
    build()``), or ``()`` when it is bound whole."""
    assign = binding.assign
    targets = assign.targets if isinstance(assign, cst.Assign) else []
    for target in targets:
        path = _path_in(target.target, binding.name)
        if path:
            return path
    return ()


def _path_in(target: cst.BaseExpression, name: str) -> Path | None:
    """Where ``name`` sits in an unpacking target (``a, name, c``; ``(a, b), (name, d)``); None
    when it is not there as a plain element, or a starred element makes positions uncertain."""
    leaves = tuple_leaves(target, (cst.Tuple, cst.List))
    if leaves is None:
        return None
    paths = [path for path, leaf in leaves if dotted(leaf) == name]
    return paths[0] if len(paths) == 1 else None


def instance_class(model: ScriptModel, name: str, at: cst.CSTNode) -> str | None:
    """The class of this file that made ``name`` (`call_graph` answers)."""
    return model.call_graph.instance_class(name, at)


def bound_arguments(
    function: cst.FunctionDef,
    call: cst.Call,
    implicit: int = 0,
    forwarded: Sequence[cst.Arg] | None = None,
) -> list[tuple[str, cst.Arg]]:
    """(parameter, argument) pairs of one call, by position or keyword; ``*args`` skipped,
    unless ``forwarded`` says what it holds (`star_forwarded`); the first ``implicit``
    parameters (``self``) are bound by the call itself."""
    positional = [p.name.value for p in function.params.params][implicit:]
    pairs = []
    arguments = list(call.args)
    if forwarded is not None:
        at = next(i for i, a in enumerate(arguments) if a.star == "*")
        arguments[at : at + 1] = forwarded
    for index, argument in enumerate(arguments):
        if argument.star:
            continue
        if argument.keyword is not None:
            pairs.append((argument.keyword.value, argument))
        elif index < len(positional):
            pairs.append((positional[index], argument))
    return pairs


def star_forwarded(script: ScriptModel, call: cst.Call) -> list[list[cst.Arg]]:
    """What the ``*args`` of ``call`` holds when it hands on the ``*args`` of the function
    around it, one list per call of that function: ``getattr(cb, hook)(self, *args)`` in
    ``def _run_callbacks(self, hook, *args)`` hands each callback ``epoch, logs`` of
    ``self._run_callbacks("on_epoch_end", epoch, logs)``. Empty when ``call`` hands on no such
    ``*args``, or where a caller's arguments cannot be told one by one (its own ``*x`` or
    ``**x``), which that caller's list then leaves out."""
    function = script.index.enclosing_function(call)
    star = function.params.star_arg if function is not None else None
    stars = [a for a in call.args if a.star]
    if (
        function is None
        or not isinstance(star, cst.Param)
        or len(stars) != 1
        or stars[0].star != "*"
        or dotted(stars[0].value) != star.name.value
    ):
        return []
    found = []
    for outer, implicit in script.call_graph.calls_of(function):
        if any(a.star for a in outer.args):
            continue
        given = [a for a in outer.args if a.keyword is None]
        width = len(function.params.params) - implicit
        found.append(given[width:])
    return found


def unpacked_arguments_for(
    function: cst.FunctionDef, call: cst.Call, parameter: str, implicit: int = 0
) -> list[cst.Arg]:
    """The unpacked arguments of ``call`` that may fill ``parameter`` of ``function`` when no
    argument names it or stands at its place (`bound_arguments`): ``*batch`` of ``score(model,
    *batch)`` hands ``x`` and ``y`` elements of ``batch``, ``**options`` hands any parameter
    not positional-only an entry of ``options``."""
    if any(name == parameter for name, _ in bound_arguments(function, call, implicit)):
        return []
    positional = [p.name.value for p in function.params.params][implicit:]
    keyword_only = {p.name.value for p in function.params.kwonly_params}
    fills = {
        "*": parameter in positional,
        "**": parameter in positional or parameter in keyword_only,
    }
    return [argument for argument in call.args if fills.get(argument.star, False)]


def add_object_bindings(model: ScriptModel, classify: Classify) -> None:
    """Bind what constructors and methods receive into attributes, and what factories return
    into their callers' names, until nothing new is found. ``classify`` is the analysis's own
    test of what a value makes (the collector's)."""
    parameters: dict[cst.FunctionDef, dict[str, Kind]] = {
        function: {
            name: g.kind
            for name, g in given.items()
            if g.kind is not None and g.kind is not Kind.ACCELERATOR
        }
        for function, given in model.given_parameters.items()
    }
    known = {(b.name, id(b.scope)) for b in model.bindings}
    for _ in range(ROUNDS):
        added = _receive(model, parameters, known, classify) + _factories(model, classify, known)
        added += _receive_tuples(model, parameters, known, classify)
        added += _keep_locals(model, known)
        if not added:
            break
    _record_sources(model)
    model.bindings.sort(key=lambda b: model.order(b.assign))
    model.received_parameters = {  # a dict's entries (``train_cfg['model']``) are no names
        function: {name: kind for name, kind in received.items() if name.isidentifier()}
        for function, received in parameters.items()
    }


def _record_sources(model: ScriptModel) -> None:
    """For each received attribute, the callers' names for what it received: ``self.loader``
    of ``Trainer(train_loader)`` came from ``train_loader`` (so it is prepared when that is)."""
    received = [b for b in model.bindings if b.received and isinstance(b.scope, cst.FunctionDef)]
    if not received:
        return
    calls = model.call_graph.calls_by_callee()
    for binding in received:
        parameter = received_name(binding.scope, binding.value)  # type: ignore[arg-type]
        early: dict[str, bool] = {}  # per source: every call hands it on before prepare
        for call, implicit in calls.get(binding.scope, ()):  # type: ignore[call-overload]
            for name, argument in _arguments(model, binding.scope, call, implicit):  # type: ignore[arg-type]
                source = dotted(argument.value)
                if name != parameter or source is None:
                    continue
                if source not in binding.sources:
                    binding.sources.append(source)
                before = handed_before_prepare(model, call, source, _made_as_a_loader(model))
                early[source] = early.get(source, True) and before
        binding.unprepared_sources = [source for source, before in early.items() if before]


def _made_as_a_loader(model: ScriptModel) -> Callable[[cst.BaseExpression], bool]:
    """``DataLoader(...)``: an object no prepare call made."""
    return lambda value: (
        isinstance(value, cst.Call) and bool(model.qualified(value.func) & DATALOADERS)
    )


def received_classes(model: ScriptModel, binding: Binding) -> set[str]:
    """The classes of this file whose instances the callers hand a received attribute:
    ``TwoHeads`` for ``self.model`` of ``Trainer(TwoHeads(), ...)`` or of ``net = TwoHeads()``,
    ``Trainer(net)``. Empty when the binding is not received or a caller's argument is of no
    class this file knows."""
    if not (binding.received and isinstance(binding.scope, cst.FunctionDef)):
        return set()
    parameter = received_name(binding.scope, binding.value)
    graph = model.call_graph
    found: set[str] = set()
    for call, implicit in graph.calls_by_callee().get(binding.scope, ()):
        if _in_a_function_never_called(model, call):
            continue  # an old factory left beside the code that runs: it builds nothing
        for name, argument in _arguments(model, binding.scope, call, implicit):
            if name != parameter:
                continue
            made = _classes_handed(model, argument.value, call)
            if not made:
                return set()
            found |= made
    return found


def _classes_handed(
    model: ScriptModel, value: cst.BaseExpression, call: cst.Call, depth: int = 1
) -> set[str]:
    """The classes of this file ``value`` holds where ``call`` hands it on: what made it there,
    or, for a parameter of the function around ``call`` (a factory's ``model`` of
    ``build_trainer(kind, model, args)``), what every call of that function hands it. Empty
    when one of them is not known."""
    graph = model.call_graph
    source = dotted(value)
    made = graph.instance_class(source, call) if source is not None else graph.made_by(value)
    if made is not None:
        return {made}
    function = model.index.enclosing_function(call)
    if depth == 0 or not isinstance(value, cst.Name) or function is None:
        return set()
    if not has_parameter(function, value.value) or model.index.assigned_under(function).get(
        value.value
    ):
        return set()
    found: set[str] = set()
    for outer, implicit in graph.calls_by_callee().get(function, ()):
        bound = bound_arguments(function, outer, implicit)
        handed = [a.value for p, a in bound if p == value.value]
        classes = set()
        if len(handed) == 1:
            classes = _classes_handed(model, handed[0], outer, depth - 1)
        if not classes:
            return set()
        found |= classes
    return found


def _in_a_function_never_called(model: ScriptModel, node: cst.CSTNode) -> bool:
    """``node`` is in a top-level function nothing in the file names, nor the project's other
    modules hand arguments to (`Placement.never_called`)."""
    function = model.index.enclosing_function(node)
    if function is None or model.parent(function) is not model.module:
        return False
    if function in model.given_parameters:
        return False
    name = function.name
    return not any(n is not name for n in model.index.names_spelled(name.value))


def received_name(function: cst.FunctionDef, value: cst.BaseExpression) -> str | None:
    """The parameter an attribute is set from: ``model`` of ``self.model = model.to(device)``,
    and of ``self.model = kwargs['model']`` in ``def __init__(self, **kwargs)`` (the keyword
    the callers pass, ``SimCLR(model=model, ...)``)."""
    value = strip_self_methods(value)
    if isinstance(value, cst.Name):
        return value.value
    key = _string_key(value)
    if key is None:
        return None
    subscripted = value.value.value  # type: ignore[attr-defined]
    star = function.params.star_kwarg
    if star is not None and subscripted == star.name.value:
        return key
    if any(p.name.value == subscripted for p in function.params.params):
        return config_entry(subscripted, key)  # ``self.model = train_cfg['model']``
    return None


def attributes_kept(model: ScriptModel, function: cst.FunctionDef) -> dict[str, str]:
    """``self.data_loader = data_loader`` in the method that receives ``data_loader``: the
    parameter -> the attribute the class's other methods read (one object under two names).
    Only an attribute bound once in the method, to the parameter itself (or through
    ``.to(device)``-like self-returning calls)."""
    parameters = {p.name.value for p in function.params.params}
    found: dict[str, list[str]] = {}
    for assign in model.index.own_assignments(function):
        parameter = received_name(function, assign.value)
        if parameter not in parameters:
            continue
        for target in assigned_targets(assign):
            attribute = dotted(target)
            if attribute and attribute.startswith("self.") and attribute.count(".") == 1:
                found.setdefault(parameter, []).append(attribute)  # type: ignore[arg-type]
    return {name: attributes[0] for name, attributes in found.items() if len(attributes) == 1}


def config_entry(parameter: str, key: str) -> str:
    """How the object flow names the entry ``key`` of a dict handed to ``parameter``."""
    return f"{parameter}[{key!r}]"


def _entry_key(value: cst.BaseExpression) -> str | None:
    """``'val'`` of ``objs['val']`` and of ``self.objs['val']``."""
    if not (
        isinstance(value, cst.Subscript)
        and isinstance(value.value, (cst.Name, cst.Attribute))
        and len(value.slice) == 1
        and isinstance(value.slice[0].slice, cst.Index)
        and isinstance(value.slice[0].slice.value, cst.SimpleString)
    ):
        return None
    return value.slice[0].slice.value.evaluated_value  # type: ignore[return-value]


def _string_key(value: cst.BaseExpression) -> str | None:
    """``'model'`` of ``name['model']`` (a plain name's entry only)."""
    if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name):
        return _entry_key(value)
    return None


def returned_entry(
    model: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode
) -> tuple[str, cst.CSTNode] | None:
    """``objs["val_loader"]`` where ``objs = build_everything(cfg)`` is assigned once in the
    scope of ``at`` and every ``return`` of that factory is a dict (written there, or a name
    assigned once to one) whose entry ``"val_loader"`` is the factory's own ``val_loader``: that
    name, and a ``return`` to read it at. An entry of a returned dict is the object the factory
    made, prepared or not as it was there."""
    key = _entry_key(value)
    container = dotted(value.value) if key is not None else None  # type: ignore[attr-defined]
    made = _made_by_a_factory(model, container, at) if container is not None else None
    if made is None and container is not None:
        return held_entry(model, container, key, at)  # type: ignore[arg-type]
    if made is None or isinstance(assigned_targets(made[0])[0], (cst.Tuple, cst.List)):
        return None
    if any(b.assign is made[0] and is_loader_dict(model, b) for b in model.bindings):
        # ``loaders = build_dataloaders(cfg)`` returning ``{"train": train, ...}``: a dict of
        # loaders the caller prepares entry by entry, so its entries are the caller's
        return None
    returns = model.index.own_returns(made[1])
    names = {_dict_entry(model, made[1], r.value, key) for r in returns}  # type: ignore[arg-type]
    if len(names) != 1 or None in names:
        return None
    return names.pop(), returns[0]  # type: ignore[return-value]


def held_entry(
    model: ScriptModel, container: str, key: str, at: cst.CSTNode, depth: int = 0
) -> tuple[str, cst.CSTNode] | None:
    """``state["val_loader"]`` where ``state`` is a plain name bound once in the scope of ``at``
    to a dict written out (``{"val_loader": val_loader, ...}`` or ``dict(val_loader=...)``), or
    a parameter of the function there that every call of the file hands such a name: the
    name the entry was built from, and a place to read it at (the dict holds that very object,
    prepared or not as it was there). None when the entry is stored into anywhere in the file
    (``state["val_loader"] = ...``: no longer what the dict was built with) or anything else
    is handed."""
    if "." in container or depth > 3 or _entry_stored(model, key):
        return None
    scope = model.scope_of(at)
    bound = [a for a, _ in model.index.values_bound_to(container) if model.scope_of(a) is scope]
    if len(bound) == 1 and is_assignment(bound[0]) and len(assigned_targets(bound[0])) == 1:
        entry = _written_entry(model, bound[0].value, key)  # type: ignore[union-attr]
        return (entry, bound[0]) if entry is not None else None
    if bound or not isinstance(scope, cst.FunctionDef):
        return None
    if container not in {p.name.value for p in (*scope.params.params, *scope.params.kwonly_params)}:
        return None
    graph = model.call_graph
    calls = graph.calls_of(scope)
    if not calls or graph.uncertain_callers(scope) or graph.references(scope):
        return None
    found: set[str] = set()
    place: cst.CSTNode | None = None
    for call, implicit in calls:
        passed = [a for n, a in bound_arguments(scope, call, implicit) if n == container]
        held = _handed_entry(model, passed[0].value, key, call, depth) if len(passed) == 1 else None
        if held is None:
            return None
        found.add(held[0])
        place = held[1]
    if len(found) != 1 or place is None:
        return None
    return found.pop(), place


def _handed_entry(
    model: ScriptModel, value: cst.BaseExpression, key: str, call: cst.Call, depth: int
) -> tuple[str, cst.CSTNode] | None:
    """`held_entry` of what ``call`` hands the container parameter: a name (followed in the
    caller), or a dict written in the call itself (``run(model, {"train": tl, "val": vl})``),
    whose entry is the caller's object as it is at the call, prepared or not as it is there."""
    if isinstance(value, (cst.Dict, cst.Call)):
        entry = _written_entry(model, value, key)
        return (entry, call) if entry is not None else None
    name = dotted(value)
    return held_entry(model, name, key, call, depth + 1) if name is not None else None


def _written_entry(model: ScriptModel, value: cst.BaseExpression, key: str) -> str | None:
    """The name at ``key`` of a dict written out: ``{"k": name}`` or ``dict(k=name)``."""
    if isinstance(value, cst.Dict):
        return _entry_of(value, key)
    if isinstance(value, cst.Call) and model.qualified(value.func) & {"builtins.dict", "dict"}:
        if any(a.star or a.keyword is None for a in value.args):
            return None
        for argument in value.args:
            if argument.keyword is not None and argument.keyword.value == key:
                return dotted(argument.value)
    return None


def _entry_stored(model: ScriptModel, key: str) -> bool:
    """Some ``x["key"] = ...`` (or ``x["key"] += ...``) of the file."""
    for node in model.assignments:
        for target in assigned_targets(node):
            if isinstance(target, cst.Subscript) and _entry_key(target) == key:
                return True
    return False


def returned_local(
    model: ScriptModel, name: str, at: cst.CSTNode
) -> tuple[str, cst.CSTNode] | None:
    """``train_dl`` of ``model, opt, train_dl = setup(cfg)`` (also nested: ``(model, opt),
    (train_dl, val_dl) = setup(cfg)``, assigned once in the scope of
    ``at``) where every ``return`` of ``setup`` hands back its own ``train_loader`` at that
    position (or ``loader = make_loader()`` returning ``loader``): that name, and a ``return``
    to read it at. The object the caller holds is the one the factory made, prepared or not as
    it was there."""
    made = _made_by_a_factory(model, name, at) if "." not in name else None
    if made is None:
        return None
    path = _path_in(assigned_targets(made[0])[0], name)
    if path is None:
        return None
    return _returned_at(model, made[1], path, frozenset())


def _returned_at(
    model: ScriptModel, function: cst.FunctionDef, path: Path, seen: frozenset[int]
) -> tuple[str, cst.CSTNode] | None:
    """The local ``function`` returns at ``path``, with a ``return`` that hands it back; through
    a factory that only returns another's call (``def get_all(cfg): return build(cfg)``), the
    local of the function it calls."""
    returns = model.index.own_returns(function)
    if len(returns) == 1 and isinstance(returns[0].value, cst.Call):
        target = callee(model, returns[0].value)
        if target is not None and target[0].name.value != "__init__":
            if id(target[0]) in seen | {id(function)}:
                return None
            return _returned_at(model, target[0], path, seen | {id(function)})
    names = set()
    for result in returns:
        value = element_at(result.value, path)
        names.add(value.value if isinstance(value, cst.Name) else None)
    if len(names) != 1 or None in names:
        return None
    return names.pop(), returns[0]  # type: ignore[return-value]


def _made_by_a_factory(
    model: ScriptModel, name: str, at: cst.CSTNode
) -> tuple[cst.Assign, cst.FunctionDef] | None:
    """The one assignment of ``name`` in the scope of ``at`` (of ``self.name`` in its class),
    when it calls a function of this file (not a constructor), and that function."""
    if name.startswith("self.") and name.count(".") == 1:
        owner = _enclosing_class(model, at)
        bound: list[cst.CSTNode] = [
            a for a in model.index.assignments_to(name) if _enclosing_class(model, a) == owner
        ]
    else:
        scope = model.scope_of(at)
        bound = [s for s, _ in model.index.values_bound_to(name) if model.scope_of(s) is scope]
    assign = bound[0] if len(bound) == 1 else None
    if not is_assignment(assign) or len(assigned_targets(assign)) != 1:
        return None
    target = callee(model, assign.value) if isinstance(assign.value, cst.Call) else None
    if target is None or target[0].name.value == "__init__":
        return None
    return assign, target[0]


def _dict_entry(
    model: ScriptModel, function: cst.FunctionDef, result: cst.BaseExpression, key: str
) -> str | None:
    """The name at ``key`` of the dict ``result`` (or of the one dict a name there is assigned)."""
    result = _held(model, function, result)
    return _entry_of(result, key) if isinstance(result, cst.Dict) else None


def _entry_of(written: cst.Dict, key: str) -> str | None:
    """The name a dict display holds at the string ``key``."""
    for element in written.elements:
        if (
            isinstance(element, cst.DictElement)
            and isinstance(element.key, cst.SimpleString)
            and element.key.evaluated_value == key
        ):
            return dotted(element.value)
    return None


def _config_entries(
    model: ScriptModel, pairs: list[tuple[str, cst.Arg]], call: cst.Call
) -> list[tuple[str, cst.Arg]]:
    """``Trainer(train_cfg)`` where ``train_cfg = {'model': model, 'optimizer': ...}`` is
    assigned once in the caller's scope (or the dict is written in the call): each entry with
    a string key reaches ``train_cfg['model']`` of the callee, as the object it holds."""
    found: list[tuple[str, cst.Arg]] = []
    for parameter, argument in pairs:
        value = argument.value
        if isinstance(value, cst.Name):
            scope = model.scope_of(call)
            assigned = [
                a for a in model.index.assignments_to(value.value) if model.scope_of(a) is scope
            ]
            value = assigned[0].value if len(assigned) == 1 else value
        if not isinstance(value, cst.Dict):
            continue
        for element in value.elements:
            if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
                key = element.key.evaluated_value
                entry = cst.Arg(value=element.value)
                found.append((config_entry(parameter, key), entry))  # type: ignore[arg-type]
    return found


def _arguments(
    model: ScriptModel, function: cst.FunctionDef, call: cst.Call, implicit: int
) -> list[tuple[str, cst.Arg]]:
    """What ``call`` binds to ``function``'s parameters, and what reaches them through a
    forwarded ``**kwargs`` (``super().__init__(**kwargs)`` of ``Sub(model=model, ...)``): the
    object a base class keeps is the one its subclass's caller made."""
    pairs = bound_arguments(function, call, implicit) + model.call_graph.forwarded_arguments(
        function, call, implicit
    )
    return pairs + _config_entries(model, pairs, call)


def _kind_at(
    model: ScriptModel,
    name: str | None,
    at: cst.CSTNode,
    parameters: dict[cst.FunctionDef, dict[str, Kind]],
) -> Kind | None:
    if name is None:
        return None
    scope = model.scope_of(at)
    for binding in model.bindings:
        if binding.name != name:
            continue
        if binding.scope is scope or isinstance(binding.scope, cst.Module):
            return binding.kind
        if name.startswith("self.") and _enclosing_class(model, binding.assign) == (
            _enclosing_class(model, at)
        ):
            return binding.kind
    if isinstance(scope, cst.FunctionDef):
        return parameters.get(scope, {}).get(name)
    return None


def _receive(
    model: ScriptModel,
    parameters: dict[cst.FunctionDef, dict[str, Kind]],
    known: set[tuple[str, int]],
    classify: Classify,
) -> int:
    added = 0
    for call in model.calls:
        for function, implicit in model.call_graph.callees(call):
            for parameter, argument in _arguments(model, function, call, implicit):
                value = argument.value
                if isinstance(value, (cst.Name, cst.Attribute)):
                    kind = _kind_at(model, dotted(value), value, parameters)
                elif _enclosing_class(model, function) and _names_loaders(model, value, parameters):
                    kind = Kind.DATALOADER  # kept on the instance: `is_loader_dict`
                else:  # ``Trainer(DataLoader(...))``, ``Trainer(make_loader(...))``
                    kind = classify(value, "") or _made_by_factory(model, value, classify)
                if kind is not None and parameter not in parameters.get(function, {}):
                    parameters.setdefault(function, {})[parameter] = kind
                    added += 1
    for function, received in parameters.items():
        if _enclosing_class(model, function) is None:
            continue
        for assign in model.index.own_assignments(function):
            for target, value in _received_pairs(assign):
                parameter = received_name(function, value)
                kind = received.get(parameter) if parameter is not None else None
                name = dotted(target)
                if kind is None or not name or not name.startswith("self."):
                    continue
                if (name, id(function)) not in known or _only_wrapped(model, name, function):
                    added += bind(
                        model, name, kind, function, assign, known, received=True, value=value
                    )
    return added


def _names_loaders(
    model: ScriptModel,
    value: cst.BaseExpression,
    parameters: dict[cst.FunctionDef, dict[str, Kind]],
) -> bool:
    """``{"train": train_loader, "val": val_loader}`` written in a call (a subclass's
    ``super().__init__(model, loaders={"train": tl, "val": vl})``): a dict display whose every
    value is a DataLoader by name, here or as a parameter that receives one. A method keeps a
    dict of loaders, each the caller's own object (a plain function's parameter is left to
    the call site's dict display: `Flow.keyed_loaders`)."""
    return (
        isinstance(value, cst.Dict)
        and bool(value.elements)
        and all(
            isinstance(element, cst.DictElement)
            and isinstance(element.value, (cst.Name, cst.Attribute))
            and _kind_at(model, dotted(element.value), element.value, parameters) is Kind.DATALOADER
            for element in value.elements
        )
    )


def _only_wrapped(model: ScriptModel, name: str, function: cst.FunctionDef) -> bool:
    """``self.model = model`` then ``self.model = nn.DataParallel(self.model)`` (under a
    condition) in one constructor: the attribute is known by its wrapper alone, while it holds
    the model it received wherever the wrapping did not run (and, once the conversion removes
    the wrapping, everywhere). A model binding of its own keeps its reads models."""
    kinds = {b.kind for b in model.bindings if b.name == name and b.scope is function}
    return kinds == {Kind.WRAPPER}


def _keep_locals(model: ScriptModel, known: set[tuple[str, int]]) -> int:
    """``model = build_model(cfg)`` then ``self.model = model`` in one method: the attribute is
    the same object as the local (bound once each), so the class's other methods that train
    and evaluate ``self.model`` read the object the analysis knows. Bound as received from the
    local (``value`` is the local's name), so the prepare step prepares the attribute in its
    place: preparing the local alone would leave ``self.model`` the bare module."""
    added = 0
    for binding in list(model.bindings):
        function = binding.scope
        if binding.received or "." in binding.name or not isinstance(function, cst.FunctionDef):
            continue
        if _enclosing_class(model, function) is None:
            continue
        if any(p.name.value == binding.name for p in function.params.params):
            continue
        assigned = model.index.assigned_under(function)
        if len(assigned.get(binding.name, [])) != 1:
            continue
        for assign in model.index.own_assignments(function):
            targets = assigned_targets(assign)
            value = strip_self_methods(assign.value)
            if len(targets) != 1 or not isinstance(value, cst.Name) or value.value != binding.name:
                continue
            name = dotted(targets[0])
            if not name or not name.startswith("self.") or name.count(".") != 1:
                continue
            rebound = [
                a
                for a in model.index.own_assignments(function)
                if any(dotted(t) == name for t in assigned_targets(a))
            ]
            if len(rebound) != 1 or (name, id(function)) in known:
                continue
            added += bind(model, name, binding.kind, function, assign, known, received=True)
    return added


def _received_pairs(assign: cst.Assign) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """Each target of ``assign`` with the value it receives: ``self.model = model``, also
    unpacked side by side (``self.model, self.loader = model, loader``)."""
    pairs: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []
    for target in assigned_targets(assign):
        pairs += unpacked_pairs(target, assign.value) or [(target, assign.value)]
    return pairs


def _receive_tuples(
    model: ScriptModel,
    parameters: dict[cst.FunctionDef, dict[str, Kind]],
    known: set[tuple[str, int]],
    classify: Classify,
) -> int:
    """``Trainer(dataloader=(train_loader, val_loader))`` and, in its constructor,
    ``self.train_loader, self.val_loader = dataloader``: each attribute receives the element of
    the tuple at its position, at every call (the same kind at each). Its sources are the
    callers' names for that element. A factory's tuple is handed as surely
    (``Trainer(make_loaders(cfg))``, or ``loaders = make_loaders(cfg)`` then
    ``Trainer(loaders)``): each attribute receives what the factory returns at its position,
    made there, so no caller's name is its source. The constructor may read the tuple under
    another name (``self.loaders = loaders``), by place (``self.val_loader = loaders[1]``) or
    through locals it unpacks it into (``train, val = loaders`` then ``self.train = train``):
    one object under each (`_places_read`)."""
    added = 0
    calls = model.call_graph.calls_by_callee()
    for function in {f for f, _ in calls.items() if isinstance(f, cst.FunctionDef)}:
        if _enclosing_class(model, function) is None:
            continue
        for parameter in [p.name.value for p in function.params.params]:
            places = _places_read(model, function, parameter)
            if not places:
                continue
            elements = _tuple_arguments(
                model, function, parameter, calls.get(function, ()), parameters, classify
            )
            if elements is None:
                continue
            for name, index, assign in places:
                if index >= len(elements) or (name, id(function)) in known:
                    continue
                kinds = {element[index][0] for _, element in elements.calls}
                if len(kinds) != 1 or None in kinds:
                    continue
                added += bind(model, name, kinds.pop(), function, assign, known, received=True)
                model.bindings[-1].sources.extend(
                    source for _, element in elements.calls if (source := element[index][1])
                )
    return added


def _places_read(
    model: ScriptModel, function: cst.FunctionDef, parameter: str
) -> list[tuple[str, int, cst.Assign]]:
    """The attributes ``function`` binds to one element of the tuple ``parameter`` holds, each
    with the element's place and the assignment: unpacked (``self.a, self.b = loaders``), by a
    constant index (``self.a = loaders[0]``), through a name bound once to the parameter
    (``self.loaders = loaders``), or through a local it unpacked it into (``a, b = loaders``
    then ``self.a = a``). None of it when the parameter or a name is bound more than once
    in ``function``: which object it holds would depend on the order they run in."""
    if parameter in model.index.assigned_under(function):
        return []  # ``if not loaders: loaders = make_loaders()``: two objects by turns
    assignments = model.index.own_assignments(function)
    counts: dict[str, int] = {}
    for assign in assignments:
        for target in assigned_targets(assign):
            for name in _target_names(target) or [dotted(target)]:
                if name is not None:
                    counts[name] = counts.get(name, 0) + 1
    aliases, locals_at, found = {parameter}, {}, []
    for assign in assignments:
        targets = assigned_targets(assign)
        if not isinstance(assign, cst.Assign) or len(targets) != 1:
            continue
        value, target = dotted(assign.value), targets[0]
        names = _target_names(target)
        if names is None or any(counts.get(n, 0) != 1 for n in names):
            continue
        if value in aliases and len(names) == 1 and not isinstance(target, (cst.Tuple, cst.List)):
            aliases.add(names[0])
            continue
        if value in aliases and len(names) >= 2:
            places = list(enumerate(names))
        elif value in locals_at and len(names) == 1:
            places = [(locals_at[value], names[0])]
        elif (index := _constant_index(assign.value, aliases)) is not None and len(names) == 1:
            places = [(index, names[0])]
        else:
            continue
        for index, name in places:
            if name.startswith("self.") and name.count(".") == 1:
                found.append((name, index, assign))
            elif "." not in name:
                locals_at[name] = index
    return found


def handed_loader_tuple(
    model: ScriptModel, call: cst.Call
) -> list[tuple[cst.Arg, list[Binding]]] | None:
    """The arguments of ``call`` that are a call of a factory of the file returning a flat
    tuple of DataLoaders, each with the attributes the constructor binds its elements to
    (``Trainer(model, make_loaders(cfg))`` of ``self.train_loader, self.val_loader =
    loaders``): made in the caller's argument, where no name holds them. None when there is
    none."""
    found = []
    classify = value_classifier(model)
    for function, implicit in model.call_graph.callees(call):
        for parameter, argument in bound_arguments(function, call, implicit):
            value = argument.value
            if not isinstance(value, cst.Call) or callee(model, value) is None:
                continue
            if not _loader_tuple(dict(_call_returns(model, value, classify))):
                continue
            held = _tuple_held(model, function, parameter)
            if held and all(b.kind is Kind.DATALOADER for b in held):
                found.append((argument, held))
    return found or None


def tuple_handed_to(model: ScriptModel, binding: Binding) -> list[Binding]:
    """The attributes that hold the elements of a tuple of loaders bound whole (``loaders =
    make_loaders(cfg)``) once a call of its scope hands it to a constructor that reads it by
    place (``Trainer(model, loaders)``): the same loaders under the instance's names."""
    held = []
    for call in model.calls:
        if model.scope_of(call) is not binding.scope:
            continue
        for function, implicit in model.call_graph.callees(call):
            for parameter, argument in bound_arguments(function, call, implicit):
                if dotted(argument.value) == binding.name:
                    held += _tuple_held(model, function, parameter)
    return held


def _tuple_held(
    model: ScriptModel, function: cst.FunctionDef, parameter: str, depth: int = 0
) -> list[Binding]:
    """The received bindings of the elements of the tuple ``parameter`` holds: where
    ``function`` reads it by place, or where a function it hands the parameter on to does
    (``super().__init__(model, loaders)``)."""
    places = {id(a) for _, _, a in _places_read(model, function, parameter)}
    held = [
        b for b in model.bindings if b.received and b.scope is function and id(b.assign) in places
    ]
    if depth >= ROUNDS or parameter in model.index.assigned_under(function):
        return held
    for call in model.index.calls_directly_in(function):
        for target, implicit in model.call_graph.callees(call):
            for name, argument in bound_arguments(target, call, implicit):
                if isinstance(argument.value, cst.Name) and argument.value.value == parameter:
                    held += _tuple_held(model, target, name, depth + 1)
    return held


def _constant_index(value: cst.BaseExpression, aliases: set[str]) -> int | None:
    """``1`` of ``loaders[1]`` when ``loaders`` is one of ``aliases``."""
    if not isinstance(value, cst.Subscript) or dotted(value.value) not in aliases:
        return None
    if len(value.slice) != 1 or not isinstance(value.slice[0].slice, cst.Index):
        return None
    index = value.slice[0].slice.value
    return int(index.value) if isinstance(index, cst.Integer) else None


#: One element of a handed tuple: its kind, and the caller's name for it (None when a factory
#: made it).
_Element = tuple[Kind | None, str | None]


@dataclass
class _TupleArguments:
    calls: list[tuple[cst.Call, list[_Element]]]

    def __len__(self) -> int:
        return len(self.calls[0][1])


def _tuple_arguments(
    model: ScriptModel,
    function: cst.FunctionDef,
    parameter: str,
    calls: Iterable[tuple[cst.Call, int]],
    parameters: dict[cst.FunctionDef, dict[str, Kind]],
    classify: Classify,
    depth: int = 0,
) -> _TupleArguments | None:
    """The elements each call passes for ``parameter``, when every call passes a tuple of one
    length: of names, or the flat tuple a factory of the file returns, or a parameter of the
    calling function that its own callers hand such a tuple (a subclass's
    ``super().__init__(model, loaders)``)."""
    found = []
    for call, implicit in calls:
        argument = dict(bound_arguments(function, call, implicit)).get(parameter)
        value = argument.value if argument is not None else None
        handed_on = _handed_on(model, call, value, parameters, classify, depth)
        if handed_on is not None:
            found.extend(handed_on.calls)
            continue
        if isinstance(value, cst.Tuple):
            names = [dotted(e.value) for e in value.elements if isinstance(e, cst.Element)]
            if not names or None in names:
                return None
            found.append((call, [(_kind_at(model, n, call, parameters), n) for n in names]))
            continue
        returned = _handed_factory_tuple(model, call, value, classify)
        if returned is None:
            return None
        found.append((call, returned))
    if not found or len({len(e) for _, e in found}) != 1:
        return None
    return _TupleArguments(found)


def _handed_on(
    model: ScriptModel,
    call: cst.Call,
    value: cst.BaseExpression | None,
    parameters: dict[cst.FunctionDef, dict[str, Kind]],
    classify: Classify,
    depth: int,
) -> _TupleArguments | None:
    """What the callers of the function around ``call`` hand its parameter ``value``, when
    ``call`` hands that parameter on unchanged (never rebound there)."""
    caller = model.index.enclosing_function(call)
    if not isinstance(value, cst.Name) or caller is None or depth >= ROUNDS:
        return None
    if value.value not in {p.name.value for p in caller.params.params}:
        return None
    if value.value in model.index.assigned_under(caller):
        return None
    outer = model.call_graph.calls_by_callee().get(caller, ())
    return _tuple_arguments(model, caller, value.value, outer, parameters, classify, depth + 1)


def _handed_factory_tuple(
    model: ScriptModel,
    call: cst.Call,
    value: cst.BaseExpression | None,
    classify: Classify,
) -> list[_Element] | None:
    """The kinds, by position, of the flat tuple a factory of the file returns when ``value``
    is its call, or a name the caller's scope binds once, to its call, and never rebinds."""
    if isinstance(value, cst.Name):
        scope = model.scope_of(call)
        bound = [
            a
            for a in (
                model.index.own_assignments(scope) if isinstance(scope, cst.FunctionDef) else []
            )
            if any(dotted(t) == value.value for t in assigned_targets(a))
        ]
        if len(bound) != 1 or len(assigned_targets(bound[0])) != 1:
            return None
        if dotted(assigned_targets(bound[0])[0]) != value.value:
            return None
        value = bound[0].value
    if not isinstance(value, cst.Call):
        return None
    returned = _call_returns(model, value, classify)
    if not returned or any(len(path) != 1 for path, _ in returned):
        return None
    if [path for path, _ in returned] != [(i,) for i in range(len(returned))]:
        return None
    return [(kind, None) for _, kind in returned]


def _factories(model: ScriptModel, classify: Classify, known: set[tuple[str, int]]) -> int:
    added = 0
    for assign in model.assignments:
        value = strip_self_methods(assign.value)
        if not isinstance(value, cst.Call) or len(assigned_targets(assign)) != 1:
            continue
        kinds = dict(_call_returns(model, value, classify))
        targets = tuple_leaves(assigned_targets(assign)[0], (cst.Tuple, cst.List))
        scope = model.scope_of(assign)
        whole = dotted(assigned_targets(assign)[0])
        if whole is not None and "." not in whole and _loader_tuple(kinds):
            # ``data = build_data(cfg)`` of ``return train_loader, val_loader``: read as
            # ``data[0]``, each element the factory's loader (`is_loader_tuple`)
            if (whole, id(scope)) not in known:
                added += bind(model, whole, Kind.DATALOADER, scope, assign, known)
            continue
        if not kinds or targets is None or {path for path, _ in targets} != set(kinds):
            continue  # ``models, loaders = build()`` of ``return (m, o), (tr, va)``: tuples
        for path, target in targets:
            name, kind = dotted(target), kinds[path]
            if name is not None and kind is not None and (name, id(scope)) not in known:
                added += bind(model, name, kind, scope, assign, known, received=False)
    return added


def _loader_tuple(kinds: dict[Path, Kind | None]) -> bool:
    """Returns, by position, that are a flat tuple of two or more DataLoaders."""
    return len(kinds) > 1 and all(
        len(path) == 1 and kind is Kind.DATALOADER for path, kind in kinds.items()
    )


def is_loader_tuple(model: ScriptModel, binding: Binding) -> bool:
    """``data = build_data(cfg)`` whose factory returns a tuple of DataLoaders (``return
    train_loader, val_loader``), bound whole and read as ``data[0]``: ``prepare`` hands a
    tuple back untouched, so its loaders are prepared together, ``data =
    accelerator.prepare(*data)`` (a tuple again, element by element)."""
    value = binding.value
    if binding.kind is not Kind.DATALOADER or binding.received or not isinstance(value, cst.Call):
        return False
    if not isinstance(assigned_targets(binding.assign)[0], cst.Name):
        return False
    return _loader_tuple(dict(_call_returns(model, value, value_classifier(model))))


def _made_by_factory(
    model: ScriptModel, value: cst.BaseExpression, classify: Classify
) -> Kind | None:
    """The kind a call of one of this file's functions returns, when it returns one object
    (``Trainer(make_loader(...))`` receives a loader as surely as ``Trainer(train_loader)``)."""
    kinds = _call_returns(model, value, classify) if isinstance(value, cst.Call) else []
    return kinds[0][1] if len(kinds) == 1 and kinds[0][0] == () else None


def _call_returns(
    model: ScriptModel, call: cst.Call, classify: Classify
) -> list[tuple[Path, Kind | None]]:
    """What a call of one of this file's functions (not a constructor) returns, by position
    (`returned_kinds`); a function written as a lambda (``make_loader = lambda ds:
    DataLoader(ds, ...)``) returns what its body makes; a function of another module of the
    project, what it returns there (`imported_returns.returned_by_project`: found beforehand by
    the conversion, `ScriptModel.imported_returns`, or asked of the linter's project view)."""
    target = callee(model, call)
    if target is not None:
        if target[0].name.value == "__init__":
            return []
        return returned_kinds(model, target[0], classify)
    body = _lambda_body(model, call)
    if body is None:  # the linter asks the project's modules here
        return list(_imported_call_returns(model, call))
    return _kinds_of([body], None, model, classify)


def _lambda_body(model: ScriptModel, call: cst.Call) -> cst.BaseExpression | None:
    """The body of the lambda a plain name called here is bound to, once in the whole file."""
    if not isinstance(call.func, cst.Name):
        return None
    bound = model.index.values_bound_to(call.func.value)
    if len(bound) != 1 or not isinstance(bound[0][1], cst.Lambda):
        return None
    return bound[0][1].body


def returned_kinds(
    model: ScriptModel, function: cst.FunctionDef, classify: Classify
) -> list[tuple[Path, Kind | None]]:
    """What ``function`` returns, one kind per element of a returned tuple (nested tuples
    followed: ``return (model, opt), (train_dl, val_dl)``), each with where it sits; empty when
    its ``return`` statements disagree or return nothing the analysis tracks. A choice between
    two objects of one kind (``return Net(16) if wide else Net(8)``) is that kind."""
    values = [node.value for node in model.index.own_returns(function) if node.value is not None]
    return _kinds_of(values, function, model, classify)


def _kinds_of(
    values: list[cst.BaseExpression],
    function: cst.FunctionDef | None,
    model: ScriptModel,
    classify: Classify,
) -> list[tuple[Path, Kind | None]]:
    answers: list[list[tuple[Path, Kind | None]]] = []
    for value in values:
        passed_on = _returned_call(model, function, value, classify)
        if passed_on is not None:  # ``return build(cfg)``: what ``build`` returns
            answers.append(passed_on)
            continue
        leaves = tuple_leaves(_tuple_named(model, function, value)) or [((), value)]
        answers.append([(p, _value_kind(model, function, e, classify)) for p, e in leaves])
    if not answers or any(answer != answers[0] for answer in answers):
        return []
    return answers[0] if any(kind is not None for _, kind in answers[0]) else []


def _tuple_named(
    model: ScriptModel, function: cst.FunctionDef | None, value: cst.BaseExpression
) -> cst.BaseExpression:
    """The tuple display a returned name is bound to, once, in the function (``loaders =
    (train, val, test)`` then ``return loaders``): returned as if written in the return."""
    if function is None or not isinstance(value, cst.Name):
        return value
    bound = [
        a
        for a in model.index.own_assignments(function)
        if any(dotted(t) == value.value for t in assigned_targets(a))
    ]
    if len(bound) != 1 or len(model.index.assigned_under(function).get(value.value, [])) != 1:
        return value
    return bound[0].value if isinstance(bound[0].value, cst.Tuple) else value


#: Functions whose returned calls are being followed: ``def a(): return b()`` with ``def b():
#: return a()`` stops instead of recursing forever.
_FOLLOWING: set[int] = set()


def _returned_call(
    model: ScriptModel,
    function: cst.FunctionDef | None,
    value: cst.BaseExpression,
    classify: Classify,
) -> list[tuple[Path, Kind | None]] | None:
    """What a factory that returns another factory's call returns (``def get_all(cfg): return
    build(cfg)``): the called function's returned kinds, by position. None when ``value`` is no
    call of a function of this file (a constructor's call is classified as made here)."""
    if function is None or not isinstance(value, cst.Call):
        return None
    target = callee(model, value)
    if target is None or target[0].name.value == "__init__" or id(target[0]) in _FOLLOWING:
        return None
    _FOLLOWING.add(id(target[0]))
    try:
        kinds = returned_kinds(model, target[0], classify)
    finally:
        _FOLLOWING.discard(id(target[0]))
    return kinds or None


def _value_kind(
    model: ScriptModel,
    function: cst.FunctionDef | None,
    value: cst.BaseExpression,
    classify: Classify,
) -> Kind | None:
    if isinstance(value, cst.IfExp):
        kinds = {_value_kind(model, function, b, classify) for b in (value.body, value.orelse)}
        return kinds.pop() if len(kinds) == 1 else None
    name = dotted(value)
    if name is not None:
        if function is None:  # a lambda's body: its names are its parameters
            return None
        for binding in model.bindings:
            if binding.name == name and binding.scope is function:
                return binding.kind
        for assign in model.index.own_assignments(function):
            if any(dotted(t) == name for t in assigned_targets(assign)):
                return classify(assign.value, name)
        return _instance_kind(model, function, name)
    if isinstance(value, cst.Dict) and value.elements:
        # ``return {"train": train, "val": val}`` of loaders the factory made under those names
        kinds = {
            _value_kind(model, function, e.value, classify)
            if isinstance(e, cst.DictElement)
            else None
            for e in value.elements
        }
        if kinds == {Kind.DATALOADER}:
            return Kind.DATALOADER
    kind = classify(value, "")
    if kind is None and isinstance(value, cst.Call):
        # ``return make(train_set, True), make(val_set, False)`` with ``make = lambda ds,
        # shuffle: DataLoader(ds, ...)`` (or a function of the file): what that call makes
        kind = _made_by_a_call(model, value, classify)
    return kind


def _instance_kind(model: ScriptModel, function: cst.FunctionDef, name: str) -> Kind | None:
    """What ``self._train`` holds in a method that returns it (``def loaders(self): return
    self._train, self._val``) when other methods of its class bind it: the kind every one of
    those bindings agrees on (the constructor's ``self._train = DataLoader(...)``). Only for a
    class that holds data and trains nothing (no model, optimizer or backward of its own): a
    trainer that prepares its loaders hands back the prepared ones, which its callers must
    not take for loaders to prepare."""
    owner = _enclosing_class(model, function)
    if owner is None or not name.startswith("self.") or name.count(".") != 1:
        return None
    if _trains_in(model, owner):
        return None
    kinds = {
        b.kind
        for b in model.bindings
        if b.name == name and _enclosing_class(model, b.assign) == owner
    }
    return kinds.pop() if len(kinds) == 1 else None


def _trains_in(model: ScriptModel, owner: str) -> bool:
    """The class ``owner``, or a class of the file derived from it (whose instances run its
    methods), holds a model or an optimizer, or runs a backward."""
    family = {owner}
    grown = True
    while grown:
        derived = {
            name
            for name, definition in model.classes.items()
            if any(dotted(base.value) in family for base in definition.bases)
        }
        grown = not derived <= family
        family |= derived
    held = (Kind.MODEL, Kind.OPTIMIZER)
    if any(_enclosing_class(model, b.assign) in family for b in model.of_kind(*held)):
        return True
    return any(_enclosing_class(model, call) in family for call in model.backward_calls)


def _made_by_a_call(model: ScriptModel, call: cst.Call, classify: Classify) -> Kind | None:
    """`_made_by_factory`, followed once per function: two factories returning each other's
    calls stop instead of recursing forever."""
    target = callee(model, call)
    key = id(target[0]) if target is not None else id(call.func)
    if key in _FOLLOWING:
        return None
    _FOLLOWING.add(key)
    try:
        return _made_by_factory(model, call, classify)
    finally:
        _FOLLOWING.discard(key)


def bind(
    model: ScriptModel,
    name: str,
    kind: Kind,
    scope: cst.FunctionDef | cst.Module,
    assign: cst.Assign,
    known: set[tuple[str, int]],
    *,
    received: bool = False,
    value: cst.BaseExpression | None = None,
) -> int:
    """``name = value`` holds an object of ``kind`` in ``scope``, when the assignment is a
    statement of its own: 1 binding added (``known`` told), else 0."""
    statement = model.parent(assign)
    if not isinstance(statement, cst.SimpleStatementLine):
        return 0
    bound = assign.value if value is None else value
    model.bindings.append(
        Binding(name, kind, scope, statement, assign, bound, model, received=received)
    )
    known.add((name, id(scope)))
    return 1


def _target_names(target: cst.BaseExpression) -> list[str] | None:
    if isinstance(target, (cst.Tuple, cst.List)):
        names = [dotted(e.value) for e in target.elements if isinstance(e, cst.Element)]
        if len(names) != len(target.elements) or None in names:
            return None
        return names  # type: ignore[return-value]
    name = dotted(target)
    return [name] if name is not None else None


#: Decorators that make a method read as an attribute: ``self.train_loader``.
_PROPERTIES = frozenset({"property", "cached_property", "functools.cached_property"})


def _property_of(model: ScriptModel, name: str | None, at: cst.CSTNode) -> cst.FunctionDef | None:
    """The ``@property`` (or ``@cached_property``) method behind ``self.<attr>`` read at
    ``at``, of the class around ``at`` or a base of it in this file."""
    if name is None or not name.startswith("self.") or name.count(".") != 1:
        return None
    owner = model.index.enclosing_class(at)
    if owner is None:
        return None
    method = model.call_graph.lookup(owner, name.split(".", 1)[1])
    if method is None or not {dotted(d.decorator) for d in method.decorators} & _PROPERTIES:
        return None
    return method


def property_alias(model: ScriptModel, name: str | None, at: cst.CSTNode) -> str | None:
    """``self._model`` for ``self.model`` read at ``at``, when the class around ``at`` (or a
    base of it in this file) makes ``model`` a ``@property`` whose whole body is ``return
    self._model``: an accessor, so what is said of the attribute it hands back (a model, and
    prepared) is said of it."""
    method = _property_of(model, name, at)
    if method is None:
        return None
    body = method.body.body if isinstance(method.body, cst.IndentedBlock) else []
    lines = [line for line in body if not is_docstring(line)]
    if len(lines) != 1 or not isinstance(lines[0], cst.SimpleStatementLine):
        return None
    returned = lines[0].body[0]
    value = dotted(returned.value) if isinstance(returned, cst.Return) and returned.value else None
    if value is None or not value.startswith("self.") or value.count(".") != 1 or value == name:
        return None
    return value


def loader_property(
    model: ScriptModel, name: str | None, at: cst.CSTNode
) -> cst.FunctionDef | None:
    """The method behind ``self.train_loader`` at ``at`` when the class around ``at`` (or a base
    of it in this file) makes it a ``@property`` or ``@cached_property`` that returns a
    DataLoader it builds: the loader is made on each read (or the first), where no binding of
    the analysis holds it, so nothing prepares it."""
    from accelify.analysis.script_model import value_classifier

    method = _property_of(model, name, at)
    if method is None:
        return None
    kinds = returned_kinds(model, method, value_classifier(model))
    return method if kinds == [((), Kind.DATALOADER)] else None


def _enclosing_class(model: ScriptModel, node: cst.CSTNode) -> str | None:
    return model.index.enclosing_class_name(node)


def is_plateau_scheduler(model: ScriptModel, name: str, depth: int = 0) -> bool:
    """The scheduler bound to ``name`` is a ``ReduceLROnPlateau``, made here or by a function of
    the file, or handed in by callers that made one (``self.lr_scheduler = lr_scheduler`` of
    ``Trainer(model, loader, optimizer, scheduler)``): it steps on a metric (each repeated step
    counts one more bad epoch), where any other scheduler handed an argument is handed its
    epoch (``scheduler.step(epoch)``). A name ``prepare`` bound from another (``plateau`` of
    ``..., plateau = accelerator.prepare(..., scheduler)``) is what that one was made as."""
    names = same_object_names(model, name)
    for binding in model.of_kind(Kind.SCHEDULER):
        if binding.name not in names:
            continue
        if any(
            "ReduceLROnPlateau" in model.module.code_for_node(made)
            for made in _made_by(model, binding.value)
        ):
            return True
        if (
            binding.received
            and depth < 3
            and binding.sources
            and all(is_plateau_scheduler(model, s, depth + 1) for s in binding.sources)
        ):
            return True
    return False


def _made_by(model: ScriptModel, value: cst.BaseExpression) -> list[cst.CSTNode]:
    """The expression, and the function of the file it calls (``make_scheduler(optimizer)``)."""
    target = callee(model, value) if isinstance(value, cst.Call) else None
    return [value] if target is None else [value, target[0]]
