"""Parameters a model holds and its forward pass never computes with.

``self.dummy_param = nn.Parameter(torch.empty(0))`` read only for its ``.device``, or a layer
built in ``__init__`` that ``forward`` never calls: in every step such parameters get no
gradient, and DDP stops at the second forward with "Expected to have finished reduction in the
prior iteration" unless it was told to expect them (``find_unused_parameters=True``).

Only what can be read from the class's own code counts: a forward that reaches its members in a
way the analysis does not follow (``getattr(self, name)``, ``self.children()``, ``self`` handed
to a function) has none idle. A member the forward computes with only under ``torch.no_grad()``
(a frozen backbone: ``with torch.no_grad(): features = self.resnet(images)``) gets no gradient
either, so it counts as idle. Members without parameters (activations, dropout, pooling,
losses) never matter to DDP and are not looked at.

A member the forward computes with only in some calls is idle in the others: one reached only
under a branch (``if with_aux: aux = self.aux_head(h)``, ``self.head(h) if flag else None``)
or after an early ``return`` (``if not with_aux: return logits``). Only ``if self.training:``
is taken in every training step. Such members count as idle too: DDP must be told to expect
them (the option costs some speed, never a result).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst

from accelify.analysis import names
from accelify.analysis.objects import bound_arguments
from accelify.analysis.reached_returns import reached_return
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, holds_own, self_parameter, target_names, walk

#: torch.nn layers without parameters of their own.
_PARAMETERLESS = re.compile(
    r"(Identity|Flatten|Unflatten|Dropout\w*|AlphaDropout|\w*Pool\w*|\w*Loss|\w*Pad\w*|"
    r"Upsample\w*|PixelShuffle|PixelUnshuffle|ChannelShuffle|ReLU6?|LeakyReLU|R?ReLU|C?ELU|"
    r"SELU|GELU|SiLU|Mish|GLU|Sigmoid|LogSigmoid|Hard\w+|Tanh\w*|Soft\w+|LogSoftmax|"
    r"Threshold|CosineSimilarity|PairwiseDistance)"
)
#: ``self.<member>.<attribute>`` reads that compute nothing with the member's values.
_METADATA = {"device", "dtype", "shape", "is_cuda", "requires_grad", "ndim"}
#: methods of the module itself that reach every member at once.
_WHOLE_MODULE = {
    "children", "modules", "named_children", "named_modules", "parameters", "named_parameters",
    "state_dict", "apply", "_modules", "_parameters", "__dict__",
}  # fmt: skip


def idle_members(model: ScriptModel, class_name: str) -> list[tuple[str, cst.CSTNode]]:
    """The members of ``class_name`` (with their assignments in ``__init__``) that hold
    parameters and that its forward pass never computes with."""
    methods = class_methods(model, class_name)
    init, forward = methods.get("__init__"), methods.get("forward")
    if init is None or forward is None:
        return []
    members = _parameter_members(model, init)
    if not members:
        return []
    used = _used_in(model, forward, methods)
    if used is None:
        return []
    idle = [(name, node) for name, node in members.items() if name not in used]
    return idle + _idle_parts(model, init, forward, methods, set(used))


def _idle_parts(
    model: ScriptModel,
    init: cst.FunctionDef,
    forward: cst.FunctionDef,
    methods: dict[str, cst.FunctionDef],
    used: set[str],
) -> list[tuple[str, cst.CSTNode]]:
    """``encoder.dec`` for ``self.head(self.encoder.enc(x))``, where ``self.encoder`` holds an
    ``Encoder`` of this file with members ``enc`` and ``dec``: a member the forward reaches only
    through some of its own members (never calls, hands on or reads whole) leaves the rest of
    that module without a gradient, as an idle member of its own would. Only a member whose
    class this file defines (made in ``__init__``, or handed to it by every construction), and
    only its parameter members, one level down."""
    values = member_values(init)
    found: list[tuple[str, cst.CSTNode]] = []
    for member in sorted(used):
        if member in methods or len(values.get(member, [])) != 1:
            continue
        reached = _parts_reached(model, forward, methods, member)
        classes = _classes_held(model, init, values[member][0]) if reached else set()
        idle: dict[str, cst.CSTNode] = {}
        for held in sorted(classes):
            held_methods = class_methods(model, held)
            if reached & set(held_methods) or "__init__" not in held_methods:
                idle = {}  # a method of the part runs: what it computes with is not followed
                break
            parts = _parameter_members(model, held_methods["__init__"])
            idle.update((part, node) for part, node in parts.items() if part not in reached)
        found.extend((f"{member}.{part}", node) for part, node in idle.items())
    return found


def _parts_reached(
    model: ScriptModel, forward: cst.FunctionDef, methods: dict[str, cst.FunctionDef], member: str
) -> set[str]:
    """The attributes of ``self.<member>`` the forward (and the methods it calls on ``self``)
    reads: ``{"enc"}`` for ``self.encoder.enc(x)``. Empty when it also uses the member whole
    (calls it, hands it on) or only reads its metadata."""
    reached: set[str] = set()
    pending, seen = [forward], set()
    while pending:
        function = pending.pop()
        if function in seen:
            continue
        seen.add(function)
        me = self_parameter(function)
        for node in walk(function.body):
            if not (isinstance(node, cst.Attribute) and node.attr.value == member):
                continue
            if dotted(node.value) != me:
                continue
            outer = model.parent(node)
            if not (isinstance(outer, cst.Attribute) and outer.value is node):
                return set()  # ``self.encoder(x)``: the whole member runs
            if outer.attr.value not in _METADATA:
                reached.add(outer.attr.value)
        for node in walk(function.body):
            if (
                isinstance(node, cst.Attribute)
                and dotted(node.value) == me
                and node.attr.value in methods
            ):
                pending.append(methods[node.attr.value])
    return reached


def _classes_held(model: ScriptModel, init: cst.FunctionDef, value: cst.BaseExpression) -> set[str]:
    """The classes of this file a member holds: ``Encoder`` for ``self.encoder = Encoder()``,
    and for ``self.encoder = encoder`` where every construction hands ``encoder`` an instance
    of it (``Classifier(Encoder())``, ``Classifier(enc)`` after ``enc = Encoder()``). Empty
    when some construction hands something else, or none is seen."""
    graph = model.call_graph
    made = graph.made_by(value)
    if made is not None:
        return {made}
    if not isinstance(value, cst.Name):
        return set()
    found: set[str] = set()
    constructions = graph.calls_by_callee().get(init, [])
    for call, implicit in constructions:
        handed = [a.value for p, a in bound_arguments(init, call, implicit) if p == value.value]
        if len(handed) != 1:
            return set()
        source = dotted(handed[0])
        held = graph.made_by(handed[0]) if source is None else graph.instance_class(source, call)
        if held is None:
            return set()
        found.add(held)
    return found


def sometimes_idle_members(model: ScriptModel, class_name: str) -> list[tuple[str, cst.CSTNode]]:
    """The members of ``class_name`` that hold parameters and that its forward pass computes
    with only in some calls (under a branch, or after an early ``return``), each with the line
    of its first such use."""
    methods = class_methods(model, class_name)
    init, forward = methods.get("__init__"), methods.get("forward")
    if init is None or forward is None:
        return []
    members = _parameter_members(model, init)
    every_call = _used_in(model, forward, methods, every_call=True)
    some_calls = _used_in(model, forward, methods)
    if every_call is None or some_calls is None:
        return []
    return [
        (name, some_calls[name])
        for name in members
        if name in some_calls and name not in every_call
    ]


def class_methods(model: ScriptModel, class_name: str) -> dict[str, cst.FunctionDef]:
    """The class's methods and those it inherits from classes of this file, each the one an
    instance finds (`CallGraph.lookup`: its own first)."""
    owner = model.classes.get(class_name)
    if owner is None:
        return {}
    graph = model.call_graph
    ancestors = [c for c in graph.classes.values() if graph.is_or_derives(owner, c)]
    found = {name: graph.lookup(owner, name) for c in ancestors for name in graph.methods(c)}
    return {name: method for name, method in found.items() if method is not None}


def _parameter_members(model: ScriptModel, init: cst.FunctionDef) -> dict[str, cst.CSTNode]:
    """``self.fc = nn.Linear(...)``, ``self.scale = nn.Parameter(...)``: members that hold
    parameters, by name. A name assigned twice, or anything else, is left out."""
    me = self_parameter(init)
    found: dict[str, cst.CSTNode] = {}
    assigned: dict[str, int] = {}
    for node in walk(init.body):
        if not isinstance(node, cst.Assign):
            continue
        for target in node.targets:
            member = target.target
            if not (isinstance(member, cst.Attribute) and dotted(member.value) == me):
                continue
            name = member.attr.value
            assigned[name] = assigned.get(name, 0) + 1
            if holds_parameters(model, node.value):
                found[name] = node
    return {name: node for name, node in found.items() if assigned[name] == 1}


def holds_no_parameters(model: ScriptModel, value: cst.BaseExpression) -> bool:
    """A value known to hold no parameters: a torch.nn layer without any
    (``nn.Dropout(0.1)``), a loss (``nn.CrossEntropyLoss()``), a torch function
    (``F.cross_entropy``). A received module (``self.backbone = backbone``) is not known."""
    if isinstance(value, cst.Call):
        made = dotted(value.func) or ""
        if made.endswith("Loss"):
            return True
        return any(
            q.startswith(names.NN_PREFIX) and _PARAMETERLESS.fullmatch(q.rsplit(".", 1)[-1])
            for q in model.qualified(value.func)
        )
    if isinstance(value, (cst.Name, cst.Attribute)):
        return any(
            q.startswith("torch.")
            and (not q.startswith(names.NN_PREFIX) or q.startswith(names.NN_NOT_MODELS))
            for q in model.qualified(value)
        )
    return isinstance(value, (cst.Integer, cst.Float, cst.SimpleString, cst.Lambda))


def member_values(init: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """What ``__init__`` assigns to each ``self.<member>``, every assignment."""
    me = self_parameter(init)
    found: dict[str, list[cst.BaseExpression]] = {}
    for node in walk(init.body):
        if not isinstance(node, cst.Assign):
            continue
        for target in node.targets:
            member = target.target
            if isinstance(member, cst.Attribute) and dotted(member.value) == me:
                found.setdefault(member.attr.value, []).append(node.value)
    return found


def holds_parameters(model: ScriptModel, value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        return False
    if dotted(value.func) in model.module_classes:
        return True
    for qualified in model.qualified(value.func):
        if not qualified.startswith(names.NN_PREFIX) or qualified.startswith(names.NN_NOT_MODELS):
            continue
        layer = qualified.rsplit(".", 1)[-1]
        if layer == "Parameter" or not _PARAMETERLESS.fullmatch(layer):
            return True
    return False


def _used_in(
    model: ScriptModel,
    forward: cst.FunctionDef,
    methods: dict[str, cst.FunctionDef],
    every_call: bool = False,
) -> dict[str, cst.CSTNode] | None:
    """The members that ``forward`` (and the methods it calls on ``self``) compute with, each
    with its first such read; with ``every_call``, only those it computes with whatever the
    call's arguments and data (`_in_every_call`). None when it reaches its members in a way
    this does not follow."""
    used: dict[str, cst.CSTNode] = {}
    pending, seen = [forward], set()
    while pending:
        function = pending.pop()
        if function in seen:
            continue
        seen.add(function)
        me = self_parameter(function)
        for node in walk(function.body):
            if isinstance(node, cst.Name) and node.value == me:
                parent = model.parent(node)
                if not (isinstance(parent, cst.Attribute) and parent.value is node):
                    return None  # ``self`` handed on, or ``getattr(self, name)``
                member = parent.attr.value
                if member in _WHOLE_MODULE:
                    return None
                if every_call and not _in_every_call(model, node, function):
                    continue
                if member in methods:
                    pending.append(methods[member])
                    continue
                outer = model.parent(parent)
                if isinstance(outer, cst.Attribute) and outer.attr.value in _METADATA:
                    continue
                if without_gradients(model, node, function):
                    continue
                used.setdefault(member, parent)
    return used


def _in_every_call(model: ScriptModel, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
    """``node`` runs at every call of ``function`` in training: under no branch other than
    ``if self.training:``'s body, no ``and``/``or`` right side, and after no statement of
    its blocks that may ``return``."""
    child = node
    for ancestor in model.ancestors(node):
        if ancestor is function:
            return True
        if _branches(ancestor, child) or _after_a_return(ancestor, child):
            return False
        child = ancestor
    return True


def _branches(ancestor: cst.CSTNode, child: cst.CSTNode) -> bool:
    """``child`` is a part of ``ancestor`` that runs only in some cases."""
    if isinstance(ancestor, cst.If) and child is not ancestor.test:
        return not (child is ancestor.body and _is_training_flag(ancestor.test))
    if isinstance(ancestor, cst.IfExp):
        return child is not ancestor.test
    return isinstance(ancestor, cst.BooleanOperation) and child is ancestor.right


def _after_a_return(ancestor: cst.CSTNode, child: cst.CSTNode) -> bool:
    """``child`` is a statement of ``ancestor``'s block after one that may ``return``."""
    body = getattr(ancestor, "body", None)
    if not (isinstance(body, (list, tuple)) and child in body):
        return False
    return any(holds_own(statement, cst.Return) for statement in body[: body.index(child)])


def _is_training_flag(test: cst.BaseExpression) -> bool:
    return dotted(test) is not None and dotted(test).endswith(".training")  # type: ignore[union-attr]


def without_gradients(model: ScriptModel, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
    """``node`` runs under a ``no_grad`` block of ``function``'s own body."""
    for ancestor in model.ancestors(node):
        if ancestor is function:
            return False
        if model.disables_grad(ancestor):
            return True
    return False


def requires_grad_writes(model: ScriptModel) -> list[tuple[cst.CSTNode, str, bool]]:
    """Where the script switches a module's parameters on or off, with the dotted name of the
    module and whether the write may turn them on (``True``, or a value it computes):
    ``for p in model.backbone.parameters(): p.requires_grad = flag`` and
    ``model.backbone.requires_grad_(False)`` give ``model.backbone``. A backbone frozen for the
    first epochs and unfrozen later leaves DDP, which registered every parameter when it
    wrapped the model, with parameters that get no gradient in some steps. A freeze alone
    (``= False``, before the model is wrapped) is harmless: DDP leaves those parameters out."""
    found: list[tuple[cst.CSTNode, str, bool]] = []
    for node in walk(model.module):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value != "requires_grad_":
                continue
            owner = _parameters_owner(model, node.func.value, node) or _module_name(node.func.value)
            if owner is not None:
                found.append((node, owner, not _turns_off(node.args)))
        elif isinstance(node, cst.Assign):
            for target in node.targets:
                written = target.target
                if isinstance(written, cst.Attribute) and written.attr.value == "requires_grad":
                    owner = _parameters_owner(model, written.value, node)
                    if owner is not None:
                        found.append((node, owner, not _is_false(node.value)))
    return found


def sets_every_parameter(model: ScriptModel, write: cst.CSTNode) -> bool:
    """A write of ``requires_grad_writes`` sets every parameter of its module alike:
    ``teacher.requires_grad_(flag)``, or ``p.requires_grad = flag`` straight in the body of
    ``for p in teacher.parameters()`` with a value that reads nothing the loop binds. Not
    ``model[0].requires_grad_(False)`` (a part of ``model``), nor a write under an ``if`` in the
    loop or computed per parameter (``p.requires_grad = "fc" in name``)."""
    if isinstance(write, cst.Call):
        if not isinstance(write.func, cst.Attribute) or dotted(write.func.value) is None:
            return False
        if _parameters_owner(model, write.func.value, write) is None:
            return True  # ``teacher.requires_grad_(flag)``: the module's own
        # ``p.requires_grad_(False)`` of a loop over its parameters: as ``p.requires_grad = ...``
        values = [argument.value for argument in write.args]
    elif isinstance(write, cst.Assign):
        values = [write.value]
    else:
        return False
    loop = next(
        (a for a in model.ancestors(write) if isinstance(a, cst.BaseCompoundStatement)), None
    )
    if not isinstance(loop, cst.For) or not isinstance(loop.iter, cst.Call):
        return False
    func = loop.iter.func
    if not (
        isinstance(func, cst.Attribute) and func.attr.value in ("parameters", "named_parameters")
    ):
        return False
    if dotted(func.value) is None:
        return False  # ``model[0].parameters()``
    bound = target_names(loop.target)
    return not any(
        isinstance(node, cst.Name) and node.value in bound
        for value in values
        for node in walk(value)
    )


def _parameters_owner(model: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> str | None:
    """``model.backbone`` for ``p`` bound by an enclosing ``for p in model.backbone.parameters()``
    (or ``for name, p in ....named_parameters()``)."""
    name = dotted(value)
    if name is None:
        return None
    for ancestor in model.ancestors(at):
        if not isinstance(ancestor, cst.For):
            continue
        source = ancestor.iter
        if not (isinstance(source, cst.Call) and isinstance(source.func, cst.Attribute)):
            continue
        if source.func.attr.value not in ("parameters", "named_parameters"):
            continue
        bound = ancestor.target
        if isinstance(bound, cst.Tuple) and len(bound.elements) == 2:
            bound = bound.elements[1].value
        if dotted(bound) == name:  # type: ignore[arg-type]
            return _module_name(source.func.value)
    return None


def _module_name(node: cst.BaseExpression) -> str | None:
    """``model.backbone`` for itself, ``model`` for ``model[0]`` or ``model.blocks[-1]``'s
    ``model.blocks``: the named module that holds the parameters."""
    while dotted(node) is None and isinstance(node, (cst.Subscript, cst.Attribute)):
        node = node.value
    return dotted(node)


def _turns_off(arguments: Sequence[cst.Arg]) -> bool:
    """``requires_grad_(False)``; without an argument it turns them on."""
    return bool(arguments) and _is_false(arguments[0].value)


def _is_false(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value == "False"


def skipping_test(
    model: ScriptModel, node: cst.CSTNode, function: cst.FunctionDef
) -> tuple[cst.BaseExpression, bool] | None:
    """The one test of ``function`` that decides whether ``node`` runs, and the truth ``node``
    needs of it: an ``if`` around it (true for its body, false for its ``else``), or an
    ``if <test>: return`` before it (false). None where no test, several, or another construct
    (a conditional expression, ``and``/``or``) decides: whether a call reaches ``node`` is then
    more than one test's value at the call site."""
    found: list[tuple[cst.BaseExpression, bool]] = []
    child = node
    for ancestor in model.ancestors(node):
        if ancestor is function:
            return found[0] if len(found) == 1 else None
        if isinstance(ancestor, cst.If) and child is not ancestor.test:
            if not (child is ancestor.body and _is_training_flag(ancestor.test)):
                found.append((ancestor.test, child is ancestor.body))
        elif isinstance(ancestor, (cst.IfExp, cst.BooleanOperation)) and _branches(ancestor, child):
            return None
        body = getattr(ancestor, "body", None)
        if isinstance(body, (list, tuple)) and child in body:
            for statement in body[: body.index(child)]:
                if not holds_own(statement, cst.Return):
                    continue
                if not (
                    isinstance(statement, cst.If)
                    and statement.orelse is None
                    and not holds_own(statement.test, cst.Return)
                ):
                    return None
                found.append((statement.test, False))
        child = ancestor
    return None


#: What `members_behind_outputs` tells of a forward: per returned element, the parameter members
#: a gradient of that element reaches, with the element; None where the forward cannot be read.
OutputMembers = list[tuple[frozenset[str], cst.CSTNode]] | None


def members_behind_outputs(
    model: ScriptModel, class_name: str, call: cst.Call | None = None
) -> OutputMembers:
    """For a forward that returns one tuple (``return validity, label``), the parameter members
    a gradient of each element reaches, followed through the forward's own local names
    (``label = self.aux_layer(out)``, ``out = self.conv(img)``) but not through ``.detach()``
    or ``.data`` (``self.proj(h.detach())`` sends nothing back to what made ``h``); None for
    any other forward, and for one that rebinds a local name to a value that does not read it
    (``out = self.aux(x)``, later ``out = self.main(x)``): which of the two a returned name
    holds is not read here. A caller that drops an element (``validity, _ = discriminator(x)``)
    leaves the members only that element needed without a gradient in its step
    (`members_only_dropped`). A forward with several returns is read at the one ``call``
    reaches, where an argument it passes decides which (`reached_returns`: ``_, loss =
    model(x, targets)`` of a forward that returns ``logits`` when ``targets is None``)."""
    methods = class_methods(model, class_name)
    init, forward = methods.get("__init__"), methods.get("forward")
    if init is None or forward is None:
        return None
    returns = [n for n in walk(forward.body) if isinstance(n, cst.Return)]
    reached = reached_return(forward, call) if call is not None and len(returns) > 1 else None
    if reached is not None:
        returns = [reached]
    if len(returns) != 1 or not isinstance(returns[0].value, cst.Tuple):
        return None
    elements = returns[0].value.elements
    if any(isinstance(e, cst.StarredElement) for e in elements):
        return None
    parameters = set(_parameter_members(model, init))
    me = self_parameter(forward)
    assigned: dict[str, list[cst.BaseExpression]] = {}
    rebound: set[str] = set()
    for node in walk(forward.body):
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)) and node.value is not None:
            targets = (
                [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            )
            for target in targets:
                for name in target_names(target):
                    chained = isinstance(node, cst.AugAssign) or _reads(node.value, name)
                    if name in assigned and not chained:
                        rebound.add(name)
                    assigned.setdefault(name, []).append(node.value)
    if rebound:
        return None  # ``out`` rebound to another value: which one is returned is not read

    def members(expression: cst.CSTNode, seen: set[str]) -> set[str]:
        found: set[str] = set()
        for node in _with_gradient(expression):
            if isinstance(node, cst.Attribute) and dotted(node.value) == me:
                found.add(node.attr.value)
            elif isinstance(node, cst.Name) and node.value in assigned and node.value not in seen:
                seen.add(node.value)
                for value in assigned[node.value]:
                    found |= members(value, seen)
        return found

    reached = [members(e.value, set()) for e in elements]
    if any(found & set(methods) for found in reached):
        return None  # through a method of the class: its members are not followed here
    return [
        (frozenset(found & parameters), e.value) for found, e in zip(reached, elements, strict=True)
    ]


def members_only_dropped(
    behind: OutputMembers, target: cst.BaseAssignTargetExpression
) -> tuple[list[str], int] | None:
    """The parameter members that only the outputs a call drops compute (``validity, _ =
    discriminator(x)``: the ``_`` elements), sorted, with the position of the first dropped
    output; an empty list where every member a dropped output needs is needed by a kept one
    too (``logits, _ = model(x)`` of ``return self.head(out), h``, ``out, h = self.rnn(...)``:
    the GRU gets its gradient through ``logits``). None where it cannot be told: the forward is
    not read (`members_behind_outputs`), the call unpacks into a starred target or another
    number of names. The linter reports only a non-empty answer (ACC310); the conversion tells
    DDP to expect parameters without gradients for any answer but an empty one."""
    if behind is None or not isinstance(target, (cst.Tuple, cst.List)):
        return None
    elements = target.elements
    if len(elements) != len(behind) or any(isinstance(e, cst.StarredElement) for e in elements):
        return None
    dropped = [
        i
        for i, e in enumerate(elements)
        if isinstance(e.value, cst.Name) and e.value.value.startswith("_")
    ]
    if not dropped:
        return [], -1
    kept = set().union(*(behind[i][0] for i in range(len(behind)) if i not in dropped))
    only = sorted(set().union(*(behind[i][0] for i in dropped)) - kept)
    return only, dropped[0]


def _reads(value: cst.CSTNode, name: str) -> bool:
    """``value`` reads the local ``name`` (``x = self.layer(x)``: a chain, not a rebinding)."""
    return any(isinstance(n, cst.Name) and n.value == name for n in walk(value))


def _with_gradient(expression: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes of ``expression`` a gradient of its value flows back to: all but what sits
    under ``.detach()`` or ``.data``."""
    found: list[cst.CSTNode] = []
    pending = [expression]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.Attribute) and node.attr.value in ("detach", "data"):
            continue
        found.append(node)
        pending.extend(node.children)
    return found
