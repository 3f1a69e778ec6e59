"""Device moves: ``.to(device)``, ``.cuda()``, ``.to("cuda")``, and the assignments that do
nothing but move a batch. Only pure moves count: ``.to(torch.float16)`` changes a dtype and stays.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import (
    Visitor,
    argument_value,
    assigned_targets,
    dotted,
    root_name,
    visit_code,
    walk,
)


def strip_moves(node: cst.CSTNode) -> cst.CSTNode:
    """``Net().to(device).train()`` -> ``Net().train()``: only the device moves go."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        inner = strip_moves(node.func.value)
        if node.func.attr.value in names.DEVICE_MOVES and is_pure_move(node):
            return inner
        if inner is not node.func.value:
            return node.with_changes(func=node.func.with_changes(value=inner))
    return node


def model_chain_moves(call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """``model.eval().cpu()`` / ``model.to(device).train()``: a statement that only switches a
    model's mode and device. Its root (``model``) and the chain without the device moves
    (``model.eval()``, ``model.train()``, or ``model`` alone); None for anything else."""
    links: list[cst.Call] = []
    node: cst.BaseExpression = call
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if node.func.attr.value not in names.MODULE_SELF_METHODS:
            return None
        links.append(node)
        node = node.func.value
    if not isinstance(node, (cst.Name, cst.Attribute)) or not any(map(_moves, links)):
        return None
    kept: cst.BaseExpression = node
    for link in reversed(links):
        if not _moves(link):
            kept = link.with_changes(func=link.func.with_changes(value=kept))  # type: ignore[union-attr]
    return node, kept


def module_chain_root(node: cst.BaseExpression) -> cst.Name | cst.Attribute | None:
    """``model`` of ``model``, ``model.cpu()``, ``model.to("cpu").eval()``: the object a chain of
    nn.Module methods that each return the module itself is called on; None for anything
    else (``model.state_dict()``, ``make()``)."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if node.func.attr.value not in names.MODULE_SELF_METHODS:
            return None
        node = node.func.value
    return node if isinstance(node, (cst.Name, cst.Attribute)) else None


def saved_whole(script: ScriptModel, node: cst.CSTNode) -> bool:
    """``node`` is (a link of) the chain a save pickles as its object:
    ``torch.save(model.to("cpu"), path)``. Unwrapped there, its moves move the model itself."""
    current = node
    parent = script.parent(current)
    while isinstance(parent, (cst.Attribute, cst.Call)) and (
        getattr(parent, "value", None) is current or getattr(parent, "func", None) is current
    ):
        current, parent = parent, script.parent(parent)
    save = script.parent(parent) if isinstance(parent, cst.Arg) else None
    return (
        isinstance(save, cst.Call)
        and bool(save.args)
        and save.args[0] is parent
        and is_save_call(script, save)
        and module_chain_root(current) is not None  # type: ignore[arg-type]
    )


def is_save_call(script: ScriptModel, call: cst.Call) -> bool:
    """``torch.save(...)``, or a ``save`` method (``accelerator.save(obj, path)``)."""
    func = call.func
    return bool(script.call_names(call) & names.TORCH_SAVE) or (
        isinstance(func, cst.Attribute) and func.attr.value == "save"
    )


def _moves(call: cst.Call) -> bool:
    method = call.func.attr.value  # type: ignore[union-attr]
    if method == "cpu":
        return not call.args
    return method in names.DEVICE_MOVES and is_pure_move(call)


def is_pure_move(call: cst.Call) -> bool:
    if call.func.attr.value == "cuda":  # type: ignore[union-attr]
        return (
            all(a.keyword is not None and a.keyword.value == "non_blocking" for a in call.args)
            or len(call.args) <= 1
        )
    positional = [a for a in call.args if a.keyword is None]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    if keywords - {"device", "non_blocking"}:
        return False
    if len(positional) + ("device" in keywords) != 1:
        return False
    value = (
        positional[0].value
        if positional
        else next(a.value for a in call.args if a.keyword and a.keyword.value == "device")
    )
    return looks_like_device(value)


def looks_like_device(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.SimpleString):
        return str(node.evaluated_value).split(":")[0] in ("cuda", "cpu", "mps")
    name = dotted(node) or ""
    last = name.split(".")[-1]
    if last in ("device", "dev", "rank", "local_rank", "gpu") or names.is_gpu_index_name(last):
        return True
    if isinstance(node, cst.Call):
        func = dotted(node.func) or ""
        return func.endswith("device")
    return isinstance(node, cst.Integer)


def move_receiver(call: cst.Call) -> cst.BaseExpression | None:
    if (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value in names.DEVICE_MOVES
        and is_pure_move(call)
    ):
        return call.func.value
    return None


def batch_moves_in(node: cst.CSTNode, batch: set[str]) -> list[cst.Call]:
    found: list[cst.Call] = []

    class Moves(Visitor):
        def visit_Call(self, call: cst.Call) -> None:
            receiver = move_receiver(call)
            if receiver is not None and root_name(receiver) in batch:
                found.append(call)

    visit_code(node, Moves())
    comps = identity_comprehension_moves(node, batch)
    return found + comps


def identity_comprehension_moves(node: cst.CSTNode, batch: set[str]) -> list[cst.Call]:
    """Moves inside ``{k: v.to(device) for k, v in batch.items()}``, whose variable is local."""
    found: list[cst.Call] = []
    if isinstance(node, cst.DictComp) and isinstance(node.value, cst.Call):
        receiver = move_receiver(node.value)
        source = node.for_in.iter
        if (
            receiver is not None
            and isinstance(source, cst.Call)
            and isinstance(source.func, cst.Attribute)
            and root_name(source.func.value) in batch
        ):
            found.append(node.value)
    return found


def is_identity_assignment(assign: cst.Assign, batch: set[str]) -> bool:
    """``x = x.to(device)``, ``a, b = a.to(d), b.to(d)``,
    ``batch = {k: v.to(d) for k, v in batch.items()}``: the statement does nothing else."""
    if len(assigned_targets(assign)) != 1:
        return False
    target, value = assigned_targets(assign)[0], assign.value
    if isinstance(value, cst.DictComp):
        source = value.for_in.iter
        return (
            bool(identity_comprehension_moves(value, batch))
            and isinstance(source, cst.Call)
            and dotted(source.func.value) == dotted(target)
        )  # type: ignore[union-attr]
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        if len(target.elements) != len(value.elements):
            return False
        return all(
            move_receiver(v.value) is not None and dotted(move_receiver(v.value)) == dotted(t.value)  # type: ignore[arg-type]
            if isinstance(v.value, cst.Call)
            else dotted(v.value) == dotted(t.value)
            for t, v in zip(target.elements, value.elements, strict=True)
        )
    if isinstance(value, cst.Call):
        receiver = move_receiver(value)
        return receiver is not None and dotted(receiver) == dotted(target)
    return False


def is_cuda_literal(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.SimpleString) and str(node.evaluated_value).split(":")[0] == "cuda"


def hard_coded_cuda(model: ScriptModel, node: cst.BaseExpression | None) -> bool:
    """``"cuda"``, ``torch.device("cuda")`` or a name only ever bound to one of them (``device
    = torch.device("cuda")``): a device that exists only where CUDA does."""
    if node is None:
        return False
    if isinstance(node, cst.SimpleString):
        return str(node.evaluated_value) == "cuda"
    if isinstance(node, cst.Call):
        return (
            "torch.device" in model.call_names(node)
            and len(node.args) == 1
            and hard_coded_cuda(model, node.args[0].value)
        )
    name = dotted(node)
    if name is None:
        return False
    values = [b.value for b in model.of_kind(Kind.DEVICE) if b.name == name]
    bound = [a for a in model.assignments if any(dotted(t) == name for t in assigned_targets(a))]
    return (
        bool(values)
        and len(values) == len(bound)
        and all(not isinstance(v, cst.Name) and hard_coded_cuda(model, v) for v in values)
    )


def moved_to(call: cst.Call) -> cst.BaseExpression | None:
    """The device a ``.to(...)`` names (positional or ``device=``); None for ``.cuda()``."""
    if not isinstance(call.func, cst.Attribute) or call.func.attr.value != "to":
        return None
    return argument_value(call, "device")


#: ``device.startswith("cuda")``: methods of a string, not of a torch.device
_STRING_METHODS = {"startswith", "endswith", "split", "replace", "lower", "upper", "strip"}


#: The nodes `read_as_string` looks at.
_READ_AS_STRING = (cst.Call, cst.ComparisonTarget, cst.Attribute)


def read_as_string(model: ScriptModel, name: str) -> bool:
    """``device = "cuda"`` read as the string it is: ``"cuda" in device``, ``device.split(":")``,
    or a configurator that overrides globals by type (``exec(...)``, ``globals()``). Such a name
    must stay a string (``str(accelerator.device)``), not become a torch.device."""
    for node in model.index.of_type(_READ_AS_STRING):
        if isinstance(node, cst.Call) and dotted(node.func) in ("exec", "globals"):
            return True
        if (
            isinstance(node, cst.ComparisonTarget)
            and isinstance(node.operator, (cst.In, cst.NotIn))
            and dotted(node.comparator) == name
        ):
            return True
        if (
            isinstance(node, cst.Attribute)
            and node.attr.value in _STRING_METHODS
            and dotted(node.value) == name
        ):
            return True
    return False


def chosen_beside_accelerator_device(model: ScriptModel, node: cst.CSTNode) -> bool:
    """``if not model.is_sequential_parallel: device = accelerator.device`` ``else: device =
    torch.device("cuda:0")``: the script takes the accelerator's device where it can and names a
    GPU on purpose in the branch that cannot (a model split over the GPUs by ``device_map``
    starts on GPU 0). A device in one arm of an ``if`` whose other arm uses
    ``accelerator.device`` is that choice, not an oversight."""
    accelerators = model.names_of(Kind.ACCELERATOR)
    child: cst.CSTNode = node
    for ancestor in model.ancestors(node):
        kind = type(ancestor)  # exact types (none has subclasses): no ABC check per ancestor
        if kind is cst.FunctionDef or kind is cst.ClassDef:
            return False
        if kind is cst.If and child is not ancestor.test:  # type: ignore[attr-defined]
            other = ancestor.orelse if child is ancestor.body else ancestor.body
            if other is not None and _reads_accelerator_device(other, accelerators):
                return True
        child = ancestor
    return False


def _reads_accelerator_device(node: cst.CSTNode, accelerators: set[str]) -> bool:
    for sub in walk(node):
        if isinstance(sub, cst.Attribute) and sub.attr.value == "device":
            receiver = dotted(sub.value) or ""
            if receiver in accelerators or receiver.rsplit(".", 1)[-1].endswith("accelerator"):
                return True
    return False


def fixed_device(call: cst.Call) -> bool:
    """The same device on every rank: ``.cuda(N)``, ``.to("cuda:N")``, ``.to("cpu")``,
    ``.to(torch.device("cuda", N))``."""
    func = call.func
    if func.attr.value == "cuda":  # type: ignore[union-attr]
        return bool(call.args) and isinstance(call.args[0].value, cst.Integer)
    device = argument_value(call, "device")
    if isinstance(device, cst.SimpleString):
        return _fixed_literal(device)
    if isinstance(device, cst.Call) and dotted(device.func) == "torch.device" and device.args:
        first = device.args[0].value
        if len(device.args) > 1:
            return isinstance(device.args[1].value, cst.Integer)
        return isinstance(first, cst.SimpleString) and _fixed_literal(first)
    return False


def moves_to_cpu(call: cst.Call) -> bool:
    """``.to("cpu")``, ``.to(torch.device("cpu"))``: off the accelerator, to host memory, which
    each process has of its own (a tensor taken there for logging or metrics)."""
    device = moved_to(call)
    if isinstance(device, cst.Call) and dotted(device.func) == "torch.device" and device.args:
        device = device.args[0].value if len(device.args) == 1 else None
    return isinstance(device, cst.SimpleString) and str(device.evaluated_value) == "cpu"


def _fixed_literal(node: cst.SimpleString) -> bool:
    text = str(node.evaluated_value)
    return text == "cpu" or (text.startswith("cuda:") and text[5:].isdigit())


def device_choosers(
    model: ScriptModel, assign: cst.CSTNode, value: cst.BaseExpression
) -> list[str]:
    """What the script's own choice of device reads besides CUDA's availability: ``args.device``
    of ``torch.device(args.device)``, ``args.no_cuda`` of ``"cuda" if use_cuda else "cpu"``
    after ``use_cuda = not args.no_cuda and torch.cuda.is_available()``, or of an
    ``if use_cuda:`` around the assignment. The conversion makes the device this rank's, so a
    flag like that no longer chooses it. Names assigned once in the scope read as their
    values; an f-string or a device index (``torch.device("cuda", local_rank)``) is a rank's
    place, not a choice between CPU and GPU, and is not counted."""
    chosen: list[cst.BaseExpression] = []
    inner = value
    if isinstance(inner, cst.Call) and (dotted(inner.func) or "").endswith("device"):
        inner = inner.args[0].value if len(inner.args) == 1 else cst.SimpleString('""')
    scope = model.scope_of(assign)
    if isinstance(inner, cst.Attribute) or (
        isinstance(inner, cst.Name) and inner.value not in _parameters(scope)
    ):
        chosen.append(inner)  # a device handed in as a parameter is the caller's choice
    elif isinstance(inner, cst.IfExp):
        chosen.append(inner.test)
    chosen += [
        a.test
        for a in model.ancestors(assign)
        if isinstance(a, cst.If) and model.scope_of(a) is scope and not _is_main_guard(a.test)
    ]
    found: list[str] = []
    for expression in chosen:
        for read in _reads(model, expression, scope, depth=3):
            if read not in found:
                found.append(read)
    return found


def _reads(
    model: ScriptModel, expression: cst.BaseExpression, scope: cst.CSTNode, depth: int
) -> list[str]:
    """The outermost names and attributes ``expression`` reads that are not imports (``torch``)
    nor constants, each name assigned once in ``scope`` replaced by what its value reads."""
    found: list[str] = []
    for node in walk(expression):
        if not isinstance(node, (cst.Name, cst.Attribute)):
            continue
        parent = model.parent(node)
        if isinstance(parent, cst.Attribute) and (parent.value is node or parent.attr is node):
            continue  # part of a longer dotted name
        root = root_name(node)
        if root is None or root in model.imports.bound or root in ("True", "False", "None"):
            continue
        text = dotted(node) or root
        values = [
            a.value
            for a in model.assignments
            if model.scope_of(a) is scope
            and len(assigned_targets(a)) == 1
            and isinstance(assigned_targets(a)[0], cst.Name)
            and assigned_targets(a)[0].value == text
        ]
        if isinstance(node, cst.Name) and len(values) == 1 and depth > 0:
            found += _reads(model, values[0], scope, depth - 1)
        else:
            found.append(text)
    return found


def _parameters(scope: cst.CSTNode) -> set[str]:
    if not isinstance(scope, cst.FunctionDef):
        return set()
    params = scope.params
    return {p.name.value for p in [*params.posonly_params, *params.params, *params.kwonly_params]}


def _is_main_guard(test: cst.BaseExpression) -> bool:
    """``if __name__ == "__main__":``"""
    return isinstance(test, cst.Comparison) and dotted(test.left) == "__name__"
