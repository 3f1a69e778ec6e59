"""Which binding a name means where it is read, by Python's own scoping rules (libcst's
`ScopeProvider`): a parameter of the function around it, of an enclosing function (a closure),
of a lambda or a comprehension, a walrus, an ``except ... as``, a ``match`` capture, a local
import, a ``global`` declaration. Hand-walking parameters misses the nested ones: the analysis
then takes a function's own name for the module's (shared files, ACC104). Resolved once per
file, on the first question (most files never ask)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.syntax import walk

if TYPE_CHECKING:
    from accelify.analysis.script_model import ScriptModel

#: the node that owns a binding: the module, a function, a lambda, a comprehension or a class
Owner = cst.CSTNode


def binding_owners(model: ScriptModel, name: str, at: cst.CSTNode) -> list[Owner] | None:
    """The nodes whose scope binds ``name`` as read at ``at`` (a node inside the code that
    reads it): the module for a module-level name (or a builtin, an undefined name), the
    function (or lambda, comprehension) whose local it is. None when ``at`` is in no scope
    libcst resolves (a node the analysis built)."""
    top = _top_statement(model, at)
    if top is None:
        return None  # a node the analysis built, in no statement of the file
    if not _maybe_bound(model, name, top):
        return [model.module]  # no code of its statement binds it: no scopes to resolve
    plain = _plain_answer(model, name, at, top)
    if plain is not None:
        return [plain]
    scope = _scopes(model, top).get(at)
    if scope is None:
        return None
    owners: list[Owner] = []
    captured = _capturing_function(model, name, at)
    if captured is not None:  # libcst's scopes do not see ``match`` captures
        owners.append(captured)
    for assignment in scope[name]:
        owner = _owner_of(model, assignment.scope)
        if owner is not None and all(o is not owner for o in owners):
            owners.append(owner)
    # bound by no code of its own statement: the file's (its module-level code elsewhere, or
    # nothing but a builtin)
    return owners or [model.module]


def _capturing_function(model: ScriptModel, name: str, at: cst.CSTNode) -> Owner | None:
    """The function around ``at`` whose own ``case`` pattern captures ``name`` (``case {"m":
    model}:``, ``case [*model]``, ``case {**model}``), binding it as a local."""
    function = model.index.enclosing_function(at)
    if function is None:
        return None
    for node in walk(function.body):
        if model.index.enclosing_function(node) is not function:
            continue
        if isinstance(node, cst.MatchAs | cst.MatchStar):
            bound = node.name
        elif isinstance(node, cst.MatchMapping):
            bound = node.rest
        else:
            continue
        if isinstance(bound, cst.Name) and bound.value == name:
            return function
    return None


def means_module_binding(model: ScriptModel, name: str, at: cst.CSTNode) -> bool:
    """``name`` read at ``at`` is the module's own ``name`` (or nothing in the file binds it),
    not a local, a parameter or a closure's variable of a function around ``at``."""
    owners = binding_owners(model, name, at)
    if owners is None:
        return False
    return all(isinstance(owner, cst.Module) for owner in owners)


def local_owner(model: ScriptModel, name: str, at: cst.CSTNode) -> Owner | None:
    """The innermost function, lambda or comprehension whose own binding ``name`` read at
    ``at`` is; None where it is the module's (or unbound)."""
    owners = binding_owners(model, name, at) or []
    local = [owner for owner in owners if not isinstance(owner, cst.Module)]
    return local[0] if local else None


def _owner_of(model: ScriptModel, scope: object) -> Owner | None:
    from libcst.metadata import GlobalScope

    if isinstance(scope, GlobalScope):
        return model.module
    return getattr(scope, "node", None)


#: Parents of a name that may bind it (a target, a parameter, an ``as``, a capture, a
#: ``global``, a definition); a name under none of them only reads.
_BINDING_PARENTS = (
    cst.Param,
    cst.AsName,
    cst.NamedExpr,
    cst.MatchAs,
    cst.MatchStar,
    cst.MatchMapping,
    cst.NameItem,
    cst.AssignTarget,
    cst.AnnAssign,
    cst.AugAssign,
    cst.For,
    cst.CompFor,
    cst.Element,
    cst.StarredElement,
    cst.Del,
    cst.FunctionDef,
    cst.ClassDef,
    cst.ImportAlias,
)


def _maybe_bound(model: ScriptModel, name: str, top: cst.CSTNode) -> bool:
    """Some ``name`` in ``top`` stands where it may be bound: only then are its scopes worth
    resolving (libcst's pass costs several times the parse of what it covers)."""
    return bool(_bindings_in(model, name, top)[0])


def _bindings_in(
    model: ScriptModel, name: str, top: cst.CSTNode
) -> tuple[list[tuple[cst.Name, cst.CSTNode]], frozenset[int] | None]:
    """Where the top-level statement ``top`` may bind ``name``, found once per model (each
    read of a name asks again: a rule asks of every ``model`` in a file): every ``Name`` of
    ``top`` that spells it under one of `_BINDING_PARENTS`, with that parent; and the scopes
    (by id: the innermost function, lambda, class or comprehension) that those which bind it
    bind it in, or None where one of them only the scopes tell (`_binds`)."""
    key = (name, id(top))
    found = model.name_bindings.get(key)
    if found is None:
        spellings = [
            (spelled, parent)
            for spelled in model.index.names_spelled(name)
            if isinstance(parent := model.parent(spelled), _BINDING_PARENTS)
            and model.inside(spelled, top)
        ]
        scopes: set[int] | None = set()
        for spelled, parent in spellings:
            binds = _binds(model, spelled, parent)
            if binds is None:
                scopes = None
                break
            if binds:
                # a nested ``def model():`` binds its name in the code around it
                binder = parent if isinstance(parent, cst.FunctionDef | cst.ClassDef) else spelled
                scope = _innermost_scope(model, binder)
                if scope is not None:
                    scopes.add(id(scope))
        found = model.name_bindings[key] = (
            spellings,
            frozenset(scopes) if scopes is not None else None,
        )
    return found


_SCOPE_NODES = (
    cst.FunctionDef,
    cst.Lambda,
    cst.ClassDef,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
)


def _plain_answer(model: ScriptModel, name: str, at: cst.CSTNode, top: cst.CSTNode) -> Owner | None:
    """The common case without resolving scopes: ``at`` in the body of a function that no
    other function, lambda or comprehension encloses (a module-level function, a method of a
    module-level class), and no ``global``/``nonlocal``/walrus of ``name`` in ``top``. Then
    ``name`` there is that function's own exactly when some binding of it (a parameter, a
    target, an ``as``, a capture, an import) has that function as its innermost scope;
    else the module's. None where this does not apply (the scopes answer)."""
    if _innermost_scope(model, at) is None:
        return model.module  # the module's own code: its names are the module's
    function = _innermost_scope(model, at, in_body=True)
    if not isinstance(function, cst.FunctionDef) or _innermost_scope(model, function) not in (
        None,
        *[c for c in model.ancestors(function) if isinstance(c, cst.ClassDef)],
    ):
        return None
    if any(isinstance(a, cst.FunctionDef | cst.Lambda) for a in model.ancestors(function)):
        return None
    scopes = _bindings_in(model, name, top)[1]
    if scopes is None:
        return None
    return function if id(function) in scopes else model.module


def binding_spellings(model: ScriptModel, name: str) -> list[cst.Name]:
    """Every ``Name`` of the file, in any scope, that binds ``name`` or may (a target of any
    kind, a parameter, an ``as``, an import, a capture, a ``global``, a walrus, a ``del``, a
    definition): a caller that wants a name bound once to one value counts them all, so that a
    ``for``, an import or a rebinding through ``global`` the assignments do not show is seen."""
    return [
        spelled
        for spelled in model.index.names_spelled(name)
        if isinstance(parent := model.parent(spelled), _BINDING_PARENTS)
        and _binds(model, spelled, parent) is not False
    ]


def _binds(model: ScriptModel, spelled: cst.Name, parent: cst.CSTNode) -> bool | None:
    """``spelled`` (under one of `_BINDING_PARENTS`) is a binding of its name, not a read
    beside one (``for batch in loader``'s ``loader``, a default value); None where only the
    scopes tell (``global``, a walrus, which binds outside a comprehension)."""
    if isinstance(parent, cst.NameItem | cst.NamedExpr):
        return None
    if isinstance(parent, cst.Param | cst.FunctionDef | cst.ClassDef):
        return parent.name is spelled
    if isinstance(parent, cst.AnnAssign | cst.AugAssign | cst.AssignTarget):
        return parent.target is spelled
    if isinstance(parent, cst.For | cst.CompFor):
        return model.inside(spelled, parent.target)
    if isinstance(parent, cst.Element | cst.StarredElement):
        outer: cst.CSTNode = parent
        for ancestor in model.ancestors(parent):
            if not isinstance(ancestor, cst.Tuple | cst.List | cst.Element | cst.StarredElement):
                if isinstance(ancestor, cst.AssignTarget | cst.AsName | cst.Del):
                    return True
                if isinstance(ancestor, cst.For | cst.CompFor):
                    return ancestor.target is outer
                return False
            outer = ancestor
        return False
    return True  # ``as`` names, captures, imports, ``del``


def _innermost_scope(
    model: ScriptModel, node: cst.CSTNode, in_body: bool = False
) -> cst.CSTNode | None:
    """The closest function, lambda, class or comprehension around ``node``; a parameter's
    name belongs to its function. ``in_body``: None where ``node`` is in a function's
    signature or decorators (they run in the code around the ``def``)."""
    child: cst.CSTNode = node
    for ancestor in model.ancestors(node):
        if isinstance(ancestor, _SCOPE_NODES):
            if in_body and isinstance(ancestor, cst.FunctionDef) and child is not ancestor.body:
                return None
            return ancestor
        child = ancestor
    return None


def _top_statement(model: ScriptModel, at: cst.CSTNode) -> cst.CSTNode | None:
    """The module's top-level statement that holds ``at``; None for a node of no statement
    of the file."""
    top = at
    for ancestor in model.ancestors(at):
        if ancestor is model.module:
            break
        top = ancestor
    return top if model.parent(top) is model.module else None


def _scopes(model: ScriptModel, top: cst.CSTNode) -> Mapping[cst.CSTNode, object]:
    """The scopes of the module's top-level statement ``top``, resolved over that statement
    alone (a module of it): a function's names mean what they mean in the file, the names it
    does not bind resolve to that module's global scope, which stands for the file's
    (`_owner_of`). Cached per statement."""
    found = model.name_scopes.get(id(top))
    if found is None:
        from libcst.metadata import MetadataWrapper, ScopeProvider

        alone = cst.Module(body=[top])  # type: ignore[list-item]
        wrapper = MetadataWrapper(alone, unsafe_skip_copy=True)
        found = model.name_scopes[id(top)] = wrapper.resolve(ScopeProvider)
    return found
