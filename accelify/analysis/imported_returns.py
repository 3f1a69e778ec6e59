"""What a factory of another module of the project returns, for the call of it here: the
DataLoaders ``get_dataloader(train=True)`` of ``dataset.py`` makes (or a method of an instance
of a class imported from there: ``TinyImageNetDataLoader(32).get_loaders()``), and an optimizer
made beside them. One answer for the conversion (which prepares them as it prepares what a
factory of the file returns: `convert.project`) and the linter (which then knows the loader a
script trains over is unprepared when its prepare got a copy of it: x-flux's
``accelerator.prepare(..., deepcopy(train_dataloader))`` of ``loader(...)`` of
``image_datasets/dataset.py``). The module is read and analysed, never imported."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import libcst as cst

from accelify.analysis.project_modules import module_file
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted

#: How a module of the project is analysed (None: it cannot be read or parsed)
Load = Callable[[Path], "ScriptModel | None"]


class Returned(list[tuple[tuple[int, ...], "Kind | None"]]):
    """What a call returns, by position in the returned tuple (``()``: the one object
    returned), each with its kind; ``dicts``: the positions where every ``return`` of the
    function hands back a dict (``{"train": DataLoader(...), "val": DataLoader(...)}``), each
    with whether that dict holds dicts. A dict of loaders is a loader to the kinds (what it
    holds) and a dict to ``dicts``: ``prepare`` hands a dict back untouched, so the caller
    prepares each loader in it, as it does a dict of loaders a factory of its own returns
    (`objects.is_loader_dict`)."""

    def __init__(
        self,
        kinds: Iterable[tuple[tuple[int, ...], Kind | None]] = (),
        dicts: Mapping[tuple[int, ...], bool] | None = None,
    ) -> None:
        super().__init__(kinds)
        self.dicts: dict[tuple[int, ...], bool] = dict(dicts or {})

    @classmethod
    def of(cls, kinds: Iterable[tuple[tuple[int, ...], Kind | None]]) -> Returned:
        """``kinds`` as a `Returned` (itself when it is one: its ``dicts`` kept)."""
        return kinds if isinstance(kinds, Returned) else cls(kinds)


#: What a call of another module's factory is taken to return: the loaders, and an optimizer
#: made beside them (``train_loader, valid_loader, optimizer, loss = init_config(model, ...)``)
_FOLLOWED = (Kind.DATALOADER, Kind.OPTIMIZER)


def returned_by_project(
    script: Path,
    model: ScriptModel,
    call: cst.Call,
    load: Load,
    worth: Callable[[Path, str, bool], bool] | None = None,
) -> tuple[Returned, Path | None]:
    """What ``call`` (of ``model``, the file ``script``) returns by position, when it runs a
    function of a module of the project that returns at least one DataLoader (every kind but
    the loaders and an optimizer left out: `_FOLLOWED`), with that module's file (read for the
    answer, whatever it is). Empty when it runs no such function. ``worth``: whether a module's
    file may define the function (or the class, when its third argument says a method of it is
    called) of that name so that it makes a DataLoader (a test of its text before it is
    analysed); every module is analysed without it."""
    located = defined_beside(script, model, call, load, worth)
    if located is None:
        return Returned(), None
    function, other, file = located
    from accelify.analysis.objects import returned_kinds, returned_loader_dicts
    from accelify.analysis.script_model import value_classifier

    kinds = [
        (path, kind if kind in _FOLLOWED else None)
        for path, kind in returned_kinds(other, function, value_classifier(other))
    ]
    if not any(kind is Kind.DATALOADER for _, kind in kinds):
        return Returned(), file
    loaders = {path for path, kind in kinds if kind is Kind.DATALOADER}
    dicts = {
        path: nested
        for path, nested in returned_loader_dicts(other, function).items()
        if path in loaders
    }
    return Returned(kinds, dicts), file


def defined_beside(
    script: Path,
    model: ScriptModel,
    call: cst.Call,
    load: Load,
    worth: Callable[[Path, str, bool], bool] | None = None,
) -> tuple[cst.FunctionDef, ScriptModel, Path] | None:
    """The function of a module of the project that ``call`` runs, with that module's analysis
    and file: a top-level function imported from it, or a method of a class imported from it
    called on the one instance the file binds to that name."""
    name = dotted(call.func)
    imported = model.imports.resolve(name) if name else None
    member = None
    if imported is None and isinstance(call.func, cst.Attribute):
        owner = call.func.value
        bound = model.index.values_bound_to(owner.value) if isinstance(owner, cst.Name) else []
        made = bound[0][1] if len(bound) == 1 else None
        maker = dotted(made.func) if isinstance(made, cst.Call) else None
        if maker is None and not bound and isinstance(owner, cst.Name):
            maker = _annotated_class(model, call, owner.value)
        imported = model.imports.resolve(maker) if maker else None
        member = call.func.attr.value
    if imported is None or "." not in imported.lstrip("."):
        return None
    module_name, _, defined = imported.rpartition(".")
    file = module_file(script, module_name)
    if file is None or (worth is not None and not worth(file, defined, member is not None)):
        return None
    other = load(file)
    if other is None:
        return None
    top = {
        s.name.value: s for s in other.module.body if isinstance(s, (cst.FunctionDef, cst.ClassDef))
    }
    definition = top.get(defined)
    if member is not None and isinstance(definition, cst.ClassDef):
        definition = other.index.methods_of(defined).get(member)
    elif member is not None:
        return None  # a method of something that is not a class there
    return (definition, other, file) if isinstance(definition, cst.FunctionDef) else None


def _annotated_class(model: ScriptModel, call: cst.Call, name: str) -> str | None:
    """The class a parameter ``name`` of the function around ``call`` is annotated with
    (``def train(self, trainset: OurDataset, ...)``, then ``trainset.get_dataloader(...)``),
    as its dotted name: the instance a method of a class of another module is called on when
    the file never binds that name itself (a binding of its own: not the parameter's class)."""
    function = model.index.enclosing_function(call)
    if function is None:
        return None
    parameters = function.params
    for parameter in (*parameters.posonly_params, *parameters.params, *parameters.kwonly_params):
        if parameter.name.value == name and parameter.annotation is not None:
            return dotted(parameter.annotation.annotation)
    return None
