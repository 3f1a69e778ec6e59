"""What the script's own mixed precision means, and whether ``Accelerator(mixed_precision=...)``
can say the same.

Every argument counts: ``torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16)`` is
bf16 only when ``args.bf16`` is set (``"bf16" if args.bf16 else "no"``); a ``"cuda"`` autocast
does nothing on a CPU run (``... and torch.cuda.is_available()``); a scaler's ``enabled=`` must
agree with the autocast's. When the autocasts disagree, or a precision or a condition cannot be
read (a dtype in a variable, a condition over another function's locals), nothing is carried:
the script's AMP stays as written and `reason` says why. A dtype chosen by a setting from a
table of the file (``DTYPES[cfg.precision]`` with ``DTYPES = {"bf16": torch.bfloat16, "fp32":
torch.float32}``, also through a name bound once to it) is carried as the same table of
precisions (``{"bf16": "bf16", "fp32": "no"}[cfg.precision]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.analysis import names
from accelify.analysis.dataflow import variables_in
from accelify.analysis.handed_accelerators import (
    constructed_by,
    construction_precision,
    handed_accelerators,
)
from accelify.analysis.objects import attributes_kept
from accelify.analysis.script_model import Binding, Kind, ScriptModel
from accelify.analysis.syntax import argument_value, assigned_targets, dotted

#: positional order of each autocast's parameters
_AUTOCAST_POSITIONS = {
    "torch.cuda.amp.autocast": ("enabled", "dtype", "cache_enabled"),
    "torch.cpu.amp.autocast": ("enabled", "dtype", "cache_enabled"),
}
_DEFAULT_POSITIONS = ("device_type", "dtype", "enabled", "cache_enabled")
_DEVICE_OF = {"torch.cuda.amp.autocast": "cuda", "torch.cpu.amp.autocast": "cpu"}
_DEFAULT_DTYPE = {"cuda": "fp16", "cpu": "bf16"}
_DTYPES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
}


@dataclass
class Autocast:
    call: cst.Call
    #: ``"fp16"``/``"bf16"``, or None when the dtype cannot be read
    precision: str | None
    #: ``"cuda"``/``"cpu"``, or None when the device type is not a literal
    device: str | None
    #: the ``enabled=`` condition as written; None when always on
    enabled: cst.BaseExpression | None
    #: the dtype is picked from a table of the file by a setting (``precision`` is None then)
    table: DtypeTable | None = None


@dataclass(frozen=True)
class DtypeTable:
    """``DTYPES[cfg.precision]``: each key of the table with the precision of its dtype
    (``"no"`` for float32, which autocast does not cast to), and the key read."""

    choices: tuple[tuple[str, str], ...]
    key: cst.BaseExpression
    key_code: str

    @property
    def code(self) -> str:
        entries = ", ".join(f'{key}: "{precision}"' for key, precision in self.choices)
        return f"{{{entries}}}[{self.key_code}]"


@dataclass
class Scaler:
    binding: Binding
    enabled: cst.BaseExpression | None


@dataclass
class Precision:
    autocasts: list[Autocast] = field(default_factory=list)
    scalers: list[Scaler] = field(default_factory=list)
    #: ``Accelerator(mixed_precision=...)`` that means what the script does; None: not carried
    mixed_precision: str | None = None
    #: why the script's AMP cannot be carried over (then it stays as written)
    reason: str | None = None
    #: ``GradScaler()`` made where no name the analysis follows holds it
    #: (``self.scaler = GradScaler() if cuda else None``): its calls cannot be removed
    unfollowed_scalers: list[cst.Call] = field(default_factory=list)
    #: an ``if`` over an autocast or scaler whose test cannot stand for its ``enabled=``
    unclear_guard: cst.If | None = None

    @property
    def used(self) -> bool:
        return bool(self.autocasts or self.scalers)

    @property
    def carried(self) -> bool:
        return self.used and self.reason is None


def precision_of(model: ScriptModel, prepare_scope: cst.CSTNode | None) -> Precision:
    """The script's autocasts (as ``with`` items) and gradient scalers, and their meaning as one
    ``mixed_precision`` value, valid where the Accelerator is created (``prepare_scope``)."""
    found = Precision()
    for node in model.orders:
        if isinstance(node, cst.WithItem) and isinstance(node.item, cst.Call):
            qualified = model.call_names(node.item) & names.AUTOCASTS
            if qualified:
                autocast = _autocast(model, node.item, min(qualified))
                autocast.enabled, unclear = _switched_on(model, node, autocast.enabled)
                found.unclear_guard = found.unclear_guard or unclear
                found.autocasts.append(autocast)
    for binding in model.of_kind(Kind.SCALER):
        value = binding.value
        enabled = _argument(value, "enabled", ()) if isinstance(value, cst.Call) else None
        enabled, unclear = _switched_on(model, binding.assign, _unless_true(enabled))
        found.unclear_guard = found.unclear_guard or unclear
        found.scalers.append(Scaler(binding, enabled))
    followed = {id(scaler.binding.value) for scaler in found.scalers}
    found.unfollowed_scalers = [
        call
        for call in model.calls
        if model.call_names(call) & names.GRAD_SCALERS and id(call) not in followed
    ]
    if found.used and found.unclear_guard is not None:
        found.reason = (
            f"the mixed precision is switched on under the `if` at line "
            f"{model.line(found.unclear_guard)}, which no one enabled= condition says"
        )
    elif found.used:
        found.mixed_precision, found.reason = _carried(model, found, prepare_scope)
        read = _read_otherwise(model, found.scalers)
        if found.reason is None and read is not None:
            found.mixed_precision = None
            found.reason = (
                f"the GradScaler {dotted(read)} is read at line {model.line(read)} other than "
                "through scale(...).backward(), step(), update() and unscale_(): removed, that "
                "read would fail (the Accelerator's own scaler is not that object)"
            )
        if found.reason is None and found.unfollowed_scalers:
            found.mixed_precision = None
            found.reason = (
                "a GradScaler is made where no name the conversion follows holds it (in a "
                "conditional expression): its scale() and step() would stay beside the "
                "Accelerator's own scaling"
            )
    return found


def device_type_of_the_run(model: ScriptModel, call: cst.Call) -> bool:
    """``torch.autocast(device_type=self.device.split(":")[0])``, ``autocast(device.type)``: the
    autocast's device type is read from the device the script runs on, not written as a
    literal (nor a name bound once to one, ``DEVICE = "cuda"``). It casts on whichever device
    this rank runs on, so it is never a CUDA autocast left idle on a CPU rank; and since its
    dtype follows that device (float16 on CUDA, bfloat16 on the CPU, unscaled), no one
    ``Accelerator(mixed_precision=...)`` means the same: the conversion keeps it as written
    (`_carried`'s reason), and lint does not tell the user to replace it."""
    qualified = model.call_names(call) & names.AUTOCASTS
    if not qualified or min(qualified) in _DEVICE_OF:
        return False
    device = _argument(call, "device_type", _DEFAULT_POSITIONS)
    if device is None or isinstance(device, (cst.SimpleString, cst.ConcatenatedString)):
        return False
    read = dotted(device)
    if read is not None and "." not in read:
        bound = _bound_once(model, read)
        if bound is None or isinstance(bound, (cst.SimpleString, cst.FormattedString)):
            return False  # ``DEVICE = "cuda"``, or a name set more than once
    return True


def cpu_autocast(model: ScriptModel, call: cst.Call) -> bool:
    """``torch.autocast("cpu", ...)``, ``torch.cpu.amp.autocast()``: it casts on the CPU only,
    whatever dtype it asks for. It is a no-op on a GPU rank and runs as written on a CPU one,
    before the conversion as after it; no ``Accelerator(mixed_precision=...)`` casts float16
    on the CPU, so none can replace it (the conversion keeps it, with a review line)."""
    qualified = model.call_names(call) & names.AUTOCASTS
    if not qualified:
        return False
    name = min(qualified)
    if name in _DEVICE_OF:
        return _DEVICE_OF[name] == "cpu"
    device = _argument(call, "device_type", _AUTOCAST_POSITIONS.get(name, _DEFAULT_POSITIONS))
    return isinstance(device, cst.SimpleString) and device.evaluated_value == "cpu"


def _autocast(model: ScriptModel, call: cst.Call, qualified: str) -> Autocast:
    positions = _AUTOCAST_POSITIONS.get(qualified, _DEFAULT_POSITIONS)
    device = _DEVICE_OF.get(qualified)
    device_arg = _argument(call, "device_type", positions)
    if device_arg is not None:
        text = device_arg.evaluated_value if isinstance(device_arg, cst.SimpleString) else None
        device = text if text in _DEFAULT_DTYPE else None
    dtype_arg = _argument(call, "dtype", positions)
    table = None
    if dtype_arg is None:
        precision = _DEFAULT_DTYPE.get(device or "")
    else:
        precision = _literal_dtype(dtype_arg, _DTYPES)
        if precision is None:
            table = _dtype_table(model, dtype_arg, 0)
    enabled = _unless_true(_argument(call, "enabled", positions))
    return Autocast(call, precision, device, enabled, table)


#: what autocast does with each dtype a table may hold: float32 is no cast at all
_TABLE_DTYPES = {**_DTYPES, "float32": "no", "float": "no"}


def _literal_dtype(value: cst.BaseExpression, dtypes: dict[str, str]) -> str | None:
    name = dotted(value) or ""
    return dtypes.get(name.rsplit(".", 1)[-1]) if name.startswith("torch.") else None


def _dtype_table(model: ScriptModel, value: cst.BaseExpression, depth: int) -> DtypeTable | None:
    """``DTYPES[cfg.precision]`` (or a name bound once to it, ``ptdtype = {...}[dtype]``): a
    dict literal of torch dtypes with string keys, itself or a name bound once to it and never
    changed, read at one key."""
    if depth > 2:
        return None
    if isinstance(value, cst.Name):
        bound = _bound_once(model, value.value)
        return None if bound is None else _dtype_table(model, bound, depth + 1)
    if not isinstance(value, cst.Subscript) or len(value.slice) != 1:
        return None
    index = value.slice[0].slice
    if not isinstance(index, cst.Index):
        return None
    table = value.value
    if isinstance(table, cst.Name):
        table = _bound_once(model, table.value)  # type: ignore[assignment]
    if not isinstance(table, cst.Dict) or not table.elements:
        return None
    choices = []
    for element in table.elements:
        if not isinstance(element, cst.DictElement) or not isinstance(
            element.key, cst.SimpleString
        ):
            return None
        precision = _literal_dtype(element.value, _TABLE_DTYPES)
        if precision is None:
            return None
        choices.append((model.module.code_for_node(element.key), precision))
    code = model.module.code_for_node(index.value)
    return DtypeTable(tuple(choices), index.value, code)


#: methods that change a dict in place
_MUTATORS = ("update", "pop", "popitem", "setdefault", "clear", "__setitem__")


def _bound_once(model: ScriptModel, name: str) -> cst.BaseExpression | None:
    """The value of the file's only assignment to ``name`` (its only target), when nothing
    changes it in place (``name[k] = ...``, ``name.update(...)``, ``del name[k]``)."""
    assigned = model.index.assignments_to(name)
    if len(assigned) != 1 or len(assigned_targets(assigned[0])) != 1:
        return None
    for node in model.orders:
        if isinstance(node, cst.Subscript) and dotted(node.value) == name:
            parent = model.parent(node)
            if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.Del)):
                return None
        if (
            isinstance(node, cst.Attribute)
            and dotted(node.value) == name
            and node.attr.value in _MUTATORS
        ):
            return None
    return assigned[0].value


def _argument(call: cst.Call, name: str, positions: tuple[str, ...]) -> cst.BaseExpression | None:
    """What ``call`` passes as ``name``, by keyword or at its place among ``positions``."""
    return argument_value(call, name, positions.index(name) if name in positions else None)


def _switched_on(
    model: ScriptModel, node: cst.CSTNode, enabled: cst.BaseExpression | None
) -> tuple[cst.BaseExpression | None, cst.If | None]:
    """``if self.args.use_amp: scaler = GradScaler()`` and ``if self.args.use_amp: with
    autocast(): ...``: an ``if`` of the function around the autocast (the scaler) switches it
    as ``enabled=`` does, so its test is the condition the Accelerator's precision must keep
    (else fp16 would be on for every GPU run of a script that casts only when asked). One
    ``if`` over a call without ``enabled=`` is carried as its test; an ``else`` branch, nested
    ``if``s or an ``if`` beside ``enabled=`` come back as the ``if`` that cannot be said (the
    second value), and the script's AMP then stays as written."""
    guards: list[cst.If] = []
    for ancestor in model.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            break
        if isinstance(ancestor, cst.If) and not _is_main_guard(ancestor.test):
            guards.append(ancestor)
    if not guards:
        return enabled, None
    guard = guards[0]
    in_body = any(ancestor is guard.body for ancestor in model.ancestors(node))
    if len(guards) > 1 or enabled is not None or not in_body:
        return enabled, guard
    return guard.test, None


def _is_main_guard(test: cst.BaseExpression) -> bool:
    """``__name__ == "__main__"``: the script runs, not a precision switch."""
    return isinstance(test, cst.Comparison) and dotted(test.left) == "__name__"


def _unless_true(expression: cst.BaseExpression | None) -> cst.BaseExpression | None:
    if isinstance(expression, cst.Name) and expression.value == "True":
        return None
    return expression


def _carried(
    model: ScriptModel, found: Precision, prepare_scope: cst.CSTNode | None
) -> tuple[str | None, str | None]:
    code = model.module.code_for_node

    def text(expression: cst.BaseExpression | None) -> str | None:
        return None if expression is None else _kept_spelling(model, expression)

    settings = {
        (a.precision, a.device, text(a.enabled), a.table and a.table.code) for a in found.autocasts
    }
    if len(settings) > 1:
        return None, "the autocasts differ in dtype, device or enabled="
    if found.autocasts:
        precision, device, enabled, _ = settings.pop()
        table = found.autocasts[0].table
        if precision is None and table is not None:
            return _chosen_by_table(model, found, table, device, prepare_scope)
        if precision is None:
            return None, "the autocast's dtype or device type is not a literal torch dtype/device"
        if precision == "fp16" and device is None:
            # ``torch.autocast(device_type=self.device_type, dtype=torch.float16)``: on a CPU
            # run it casts to float16 on the CPU, which no Accelerator precision does (fp16 is
            # CUDA only); "fp16" would refuse to start there and "no" would change the numbers
            return None, (
                "the float16 autocast's device type is not a literal: on a CPU run it casts on "
                "the CPU, which Accelerator(mixed_precision=...) cannot do"
            )
        if precision == "fp16" and device == "cpu":
            # ``torch.autocast("cpu", dtype=torch.float16)``: "fp16" refuses to start on the CPU
            return None, (
                "the autocast casts to float16 on the CPU, which Accelerator(mixed_precision="
                "...) cannot do (fp16 is CUDA only: the Accelerator would refuse to start)"
            )
        condition = found.autocasts[0].enabled
    else:  # a scaler alone: fp16 on CUDA
        precision, device, enabled, condition = "fp16", "cuda", None, None
    for scaler in found.scalers:
        scaler_enabled = text(scaler.enabled)
        if scaler_enabled is not None and scaler_enabled != enabled:
            if found.autocasts:
                return None, "the GradScaler's enabled= differs from the autocast's"
            enabled, condition = scaler_enabled, scaler.enabled
    respelled = None
    if condition is not None and not _readable_from(model, condition, prepare_scope):
        respelled = _through_parameters(model, condition, prepare_scope)
        if respelled is None:
            return None, f"enabled={enabled} reads names the Accelerator's scope does not have"
        condition, enabled = respelled, code(respelled)
    if condition is not None and respelled is None:
        condition, enabled = _inlined(model, condition)
    tests = [] if enabled is None else [enabled if _simple(condition) else f"({enabled})"]
    if device == "cuda" and "torch.cuda.is_available()" not in tests:
        tests.append("torch.cuda.is_available()")
    if not tests:
        return f'"{precision}"', None
    return f'"{precision}" if {" and ".join(tests)} else "no"', None


def _chosen_by_table(
    model: ScriptModel,
    found: Precision,
    table: DtypeTable,
    device: str | None,
    prepare_scope: cst.CSTNode | None,
) -> tuple[str | None, str | None]:
    """``{"bf16": "bf16", "fp32": "no"}[cfg.precision]``: the autocast's table of dtypes as a
    table of precisions, read at the same key, when that means the same everywhere."""
    precisions = {precision for _, precision in table.choices}
    if device is None:
        return None, "the autocast's device type is not a literal"
    if found.autocasts[0].enabled is not None or found.scalers:
        return None, (
            "the autocast's dtype is picked from a table and it is also switched by enabled= "
            "or paired with a GradScaler; one mixed_precision table cannot say both"
        )
    if device != "cuda" and "fp16" in precisions:
        return None, (
            f"the autocast's table picks float16 on the {device}, which "
            "Accelerator(mixed_precision=...) cannot do (fp16 is CUDA only)"
        )
    if not _readable_from(model, table.key, prepare_scope):
        return None, (
            f"the autocast's dtype is picked from a table by {table.key_code}, which the "
            "Accelerator's scope does not have"
        )
    if device == "cuda":
        return f'{table.code} if torch.cuda.is_available() else "no"', None
    return table.code, None


def _kept_spelling(model: ScriptModel, expression: cst.BaseExpression) -> str:
    """``expression`` as the class's other methods spell it: in an ``__init__`` that keeps a
    parameter (``self.args = args``), ``args.fp16`` reads ``self.args.fp16``, the flag the
    ``autocast(enabled=self.args.fp16)`` of a training method reads (one object under two
    names)."""
    code = model.module.code_for_node(expression)
    function = model.index.enclosing_function(expression)
    if function is None or function.name.value != "__init__":
        return code
    root = code.split(".", 1)[0]
    kept = attributes_kept(model, function).get(root) if root.isidentifier() else None
    return code if kept is None else kept + code[len(root) :]


def _inlined(model: ScriptModel, condition: cst.BaseExpression) -> tuple[cst.BaseExpression, str]:
    """``use_amp`` set once by ``use_amp = torch.cuda.is_available()`` in the same function reads
    as its value, which the Accelerator can be given wherever it is created; other conditions
    stay as written."""
    if not isinstance(condition, cst.Name):
        return condition, model.module.code_for_node(condition)
    scope = model.scope_of(condition)
    assigned = [
        assign
        for assign in model.assignments
        if model.scope_of(assign) is scope
        and any(
            isinstance(t, cst.Name) and t.value == condition.value for t in assigned_targets(assign)
        )
    ]
    if len(assigned) == 1 and len(assigned_targets(assigned[0])) == 1:
        value = assigned[0].value
        roots = variables_in(model, value)
        if roots <= set(model.imports.bound) and _simple(value):
            return value, model.module.code_for_node(value)
    return condition, model.module.code_for_node(condition)


def _through_parameters(
    model: ScriptModel, condition: cst.BaseExpression, scope: cst.CSTNode | None
) -> cst.BaseExpression | None:
    """``self.args.amp`` read in ``fit()`` where the Accelerator is created in ``__init__(self,
    args)``, which keeps ``self.args = args``: the same flag spelled as the constructor reads it
    (``args.amp``), valid anywhere in it. None when a ``self.`` attribute the condition reads
    is not bound once in the class, from a parameter of that scope it never rebinds, or when
    the condition reads other names the scope does not have."""
    if not isinstance(scope, cst.FunctionDef):
        return None
    owner = model.index.enclosing_class_name(scope)
    if owner is None or model.index.enclosing_class_name(condition) != owner:
        return None
    parameters = {p.name.value for p in (*scope.params.params, *scope.params.kwonly_params)}
    rebound = {dotted(t) for a in model.index.own_assignments(scope) for t in assigned_targets(a)}
    replaced: dict[str, str] = {}
    for node in _attribute_roots(condition):
        attribute = dotted(node) or ""
        kept = [
            a
            for a in model.index.assignments_to(attribute)
            if model.index.enclosing_class_name(a) == owner
        ]
        if len(kept) != 1 or model.scope_of(kept[0]) is not scope:
            return None
        value = kept[0].value
        if (
            not isinstance(value, cst.Name)
            or value.value not in parameters
            or value.value in rebound
        ):
            return None
        replaced[attribute] = value.value
    if not replaced:
        return None

    class Respell(cst.CSTTransformer):
        def leave_Attribute(
            self, original: cst.Attribute, updated: cst.Attribute
        ) -> cst.BaseExpression:
            name = dotted(original)
            return cst.Name(replaced[name]) if name in replaced else updated

    respelled = condition.visit(Respell())
    readable = parameters | set(model.imports.bound) | {"True", "False", "None"}
    if not variables_in(model, respelled) <= readable:
        return None  # ``self.args.amp and use_amp``: a local of the method that reads it
    return respelled  # type: ignore[return-value]


def _attribute_roots(expression: cst.BaseExpression) -> list[cst.Attribute]:
    """The ``self.x`` attributes an expression reads (``self.args`` of ``self.args.amp``)."""
    found: list[cst.Attribute] = []

    class Roots(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            if isinstance(node.value, cst.Name) and node.value.value == "self":
                found.append(node)
                return False
            return True

    expression.visit(Roots())
    return found


def _simple(expression: cst.BaseExpression | None) -> bool:
    return isinstance(expression, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))


def _readable_from(
    model: ScriptModel, condition: cst.BaseExpression, scope: cst.CSTNode | None
) -> bool:
    """The condition's names are the module's, or bound where the condition is and that place is
    the scope the Accelerator is created in."""
    where = model.scope_of(condition)
    if where is scope:
        return True
    module_names = {
        n.value
        for n in model.orders
        if isinstance(n, cst.Name)
        and isinstance(model.parent(n), cst.AssignTarget)
        and model.scope_of(n) is model.module
    } | set(model.imports.bound)
    roots = variables_in(model, condition)
    return roots <= module_names | {"True", "False", "None"}


def apex_scaled_backward(model: ScriptModel, backward: cst.Call) -> bool:
    """``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()``: NVIDIA apex's own
    loss scaling (HF Trainer's ``use_apex`` branch). Its backward belongs to apex: the
    accelerator's would scale the already scaled loss a second time."""
    func = backward.func
    if not isinstance(func, cst.Attribute) or not isinstance(func.value, cst.Name):
        return False
    loss = func.value.value
    for ancestor in model.ancestors(backward):
        if not isinstance(ancestor, cst.With):
            continue
        for item in ancestor.items:
            if (
                isinstance(item.item, cst.Call)
                and (dotted(item.item.func) or "").endswith("scale_loss")
                and item.asname is not None
                and dotted(item.asname.name) == loss
            ):
                return True
    return False


def _read_otherwise(model: ScriptModel, scalers: list[Scaler]) -> cst.CSTNode | None:
    """The first read of a scaler's name other than the calls the conversion rewrites
    (``scaler.scale(loss).backward()``, and ``step``, ``update``, ``unscale_`` as statements),
    an assignment to it or a ``del`` of it: ``train(..., scaler)``, ``scaler.state_dict()``,
    ``scaler.get_scale()``. The GradScaler is removed, so such a read would raise NameError."""
    held = {scaler.binding.name for scaler in scalers}
    for node in model.orders:
        if not isinstance(node, (cst.Name, cst.Attribute)) or dotted(node) not in held:
            continue
        parent = model.parent(node)
        if isinstance(parent, (cst.AssignTarget, cst.Param)):
            continue  # a binding: ``scaler = ...``, ``def train(..., scaler)``
        if any(isinstance(a, cst.Del) for a in model.ancestors(node)):
            continue  # the del loses the name with the scaler's removal
        if not _rewritten_call(model, node):
            return node
    return None


def _rewritten_call(model: ScriptModel, receiver: cst.CSTNode) -> bool:
    method = model.parent(receiver)
    if not (isinstance(method, cst.Attribute) and method.value is receiver):
        return False
    call = model.parent(method)
    if not isinstance(call, cst.Call):
        return False
    after = model.parent(call)
    if method.attr.value == "scale":
        return isinstance(after, cst.Attribute) and after.attr.value == "backward"
    return method.attr.value in ("step", "update", "unscale_") and isinstance(after, cst.Expr)


def made_precisions(script: ScriptModel) -> set[str]:
    """The ``mixed_precision`` of each Accelerator the file makes itself (`construction_precision`,
    also through a factory of the file or of another module of the project that returns
    ``Accelerator(mixed_precision="fp16")``: `constructed_by`); where it makes none, of each one
    the project's other modules make and hand it (`handed_accelerators`: ``Trainer(accelerator,
    ...)`` of train.py). Empty where neither is known (an accelerator received from a caller
    the project does not show, or held by a base class: its precision is not known here)."""
    found = set()
    for binding in script.of_kind(Kind.ACCELERATOR):
        if isinstance(binding.value, cst.Call) and not binding.received:
            made = constructed_by(script, binding.value)
            found.add(made.precision if made else construction_precision(binding.value))
    return found or {made.precision for made in handed_accelerators(script)}


def accelerator_never_scales(script: ScriptModel) -> bool:
    """Every Accelerator the file makes runs without fp16 (``mixed_precision`` left out,
    ``"no"`` or ``"bf16"``): none scales a loss, so a GradScaler of the file's own scales it
    once (convert keeps one so, with a review line, where no single mixed_precision value
    says what the script's AMP does)."""
    made = made_precisions(script)
    return bool(made) and made <= {"no", "bf16"}


def accelerator_never_casts(script: ScriptModel) -> bool:
    """Every Accelerator the file makes runs without mixed precision (``mixed_precision``
    left out or ``"no"``): the file's own autocast is the only one."""
    made = made_precisions(script)
    return bool(made) and made <= {"no"}
