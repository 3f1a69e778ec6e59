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
    reads it): the module for a module-level name, the function (or lambda, comprehension)
    whose local it is. Empty when nothing in the file binds it (a builtin, an undefined name);
    None when ``at`` is in no scope libcst resolves."""
    scope = _scopes(model).get(at)
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
    return owners


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


def _scopes(model: ScriptModel) -> Mapping[cst.CSTNode, object]:
    return model.name_scopes
