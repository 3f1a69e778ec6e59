"""5c. Tensors a CPU-only script makes inside its training loop and feeds to the model or
mixes with its outputs: a GAN's ``noise = torch.randn(b, z)`` and ``ones = torch.ones(b, 1)``,
a mask or a target built per step. Converted, the batches and the model are on
``accelerator.device`` and these stay on the CPU (on a GPU: a device mismatch at the first
step). Each such factory call is made on the device: ``torch.randn(b, z,
device=accelerator.device)``. A tensor made once before the loop and fed to a prepared model
inside it (DCGAN's ``fixed_noise = torch.randn(64, nz)`` for ``netG(fixed_noise)``) goes there
too, when every use of its name is an input of a prepared model or meets the device in the
loop: made as written and moved (``torch.randn(64, nz).to(accelerator.device)``), so its
values and the RNG stream after it are the original's, and a ``generator=`` made for the CPU
still draws it (given ``device="cuda"`` it raises). So is any factory drawn from a
``generator=``. One also used where the CPU is expected stays, with a review line.

Only a factory whose tensor meets the device in the same call is changed: it is an input of a
prepared model, or an argument beside a batch, a model output or something computed from them
(``bce(D(real), ones)``), directly or through the name it is assigned to. A tensor made for
bookkeeping on the host (an index into a CPU array, a running total) is left where it is."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.dataflow import is_attribute_name, is_binding, variables_in
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Kind, Loop
from accelify.analysis.syntax import (
    all_params,
    children_of,
    dotted,
    has_parameter,
    self_parameter,
    target_names,
    walk,
)
from accelify.convert.steps.context import Context
from accelify.convert.steps.host_inputs import (
    JOINED,
    SAME_DEVICE_METHODS,
    assigned_values,
    batches_sent_at_the_head,
    cpu_only,
    device_given,
    prepared_model_called,
    torch_factory,
)
from accelify.edits import rewrites


def run(ctx: Context) -> None:
    if not cpu_only(ctx):
        return
    done: set[int] = set()
    loops = _training_loops(ctx)
    for loop in loops:
        on_device = _on_device_names(ctx, loop)
        for node in walk(loop.node.body):
            if not _is_factory(node) or id(node) in done:
                continue
            if _like_on_the_device(ctx, node, on_device):
                continue
            join = _joined_in(ctx, node)
            if join is not None and not _reads_the_device(ctx, join, on_device):
                done |= {id(n) for n in walk(join)}
                if _meets_the_device(ctx, join, loop, on_device, models=False):
                    _move_joined(ctx, join, "the batches and the model it meets are there")
                continue
            # joined with a tensor on the device (``torch.cat([real, torch.zeros(n, 1)])``)
            # or meeting one: made there
            if join is not None or _meets_the_device(ctx, node, loop, on_device):
                done.add(id(node))
                _place(ctx, node, "the batches and the model it meets are there", drawn=False)
    if loops:
        _made_before_the_loops(ctx, loops, done)
    _made_in_forward(ctx)


#: factories whose values do not depend on the device they are made on (no RNG stream)
_FIXED = frozenset({"zeros", "ones", "full", "empty", "eye", "arange"})


def _made_in_forward(ctx: Context) -> None:
    """``h0 = torch.zeros(1, x.size(0), self.hidden)`` in the ``forward`` of a model class the
    conversion prepares, handed to one of its layers (``self.rnn(packed, h0)``): prepare puts
    the layers on the device and this stays on the CPU (on a GPU: a device mismatch at the
    first step). Made where the module's parameters are, whatever device that is."""
    for forward in _prepared_forwards(ctx):
        owner = self_parameter(forward)
        if owner is None:
            continue
        device = f"next({owner}.parameters()).device"
        for node in walk(forward.body):
            if (
                _is_factory(node)
                and torch_factory(node) in _FIXED  # type: ignore[arg-type]
                and _handed_to_a_layer(ctx, node, forward, owner)  # type: ignore[arg-type]
            ):
                ctx.plan.add(
                    rewrites.made_on_device(node, device),  # type: ignore[arg-type]
                    line=ctx.line(node),
                    text=f"{ctx.code(node)}: made on {device} (a layer of the prepared model "
                    "takes it, on the device)",
                )


def _prepared_forwards(ctx: Context) -> list[cst.FunctionDef]:
    """The ``forward`` of each model class of the file an instance of which is prepared."""
    prepared = set(ctx.plan.prepared)
    classes = {
        dotted(binding.value.func)
        for binding in ctx.model.bindings
        if binding.kind is Kind.MODEL
        and binding.name in prepared
        and isinstance(binding.value, cst.Call)
    }
    found = []
    for name in sorted(c for c in classes if c in ctx.model.module_classes):
        forward = ctx.model.index.methods_of(name).get("forward")
        if forward is not None:
            found.append(forward)
    return found


def _handed_to_a_layer(
    ctx: Context, factory: cst.Call, forward: cst.FunctionDef, owner: str
) -> bool:
    """``factory`` is an argument of a call of one of the module's layers (``self.rnn(x,
    torch.zeros(...))``), or assigned to a name, in ``forward`` only, that one takes."""
    handed: list[cst.BaseExpression] = [factory]
    parent = ctx.model.parent(factory)
    if (
        isinstance(parent, cst.Assign)
        and len(parent.targets) == 1
        and isinstance(parent.targets[0].target, cst.Name)
    ):
        name = parent.targets[0].target.value
        handed = [n for n in walk(forward.body) if isinstance(n, cst.Name) and n.value == name]
    for call in walk(forward.body):
        if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
            continue
        if dotted(call.func.value) != owner:
            continue
        arguments = [a.value for a in call.args]
        if any(value is argument for value in handed for argument in arguments):
            return True
    return False


def _training_loops(ctx: Context) -> list[Loop]:
    """The loops that draw prepared batches, or whose batches are sent to the device at their
    head (one loop for a prepared loader and one left whole): inside them the batches are on
    the device."""
    return [
        loop
        for loop in ctx.model.loops
        if ctx.facts.flow.reads_loader(loop)
        and (not ctx.unprepared_loaders(loop) or batches_sent_at_the_head(ctx, loop))
    ]


def _made_before_the_loops(ctx: Context, loops: list[Loop], done: set[int]) -> None:
    """A tensor made outside the training loops that meets the device in them: DCGAN's
    ``fixed_noise`` handed to ``netG``, a ``mask`` or class ``weights`` multiplied with the
    model's output or the loss, a ``weight=`` handed to ``nn.CrossEntropyLoss`` that is called
    on the batches. Followed through the names, attributes, parameters and returns that carry
    it; moved when every use meets the device, a review line when some use expects the CPU."""
    for factory in walk(ctx.model.module):
        if not _is_factory(factory) or id(factory) in done:
            continue
        if any(ctx.facts.placement.inside(factory, loop.node) for loop in loops):
            continue
        on_device = _device_names_at(ctx, factory, loops) or set()
        if _like_on_the_device(ctx, factory, on_device):
            continue
        value: cst.BaseExpression = factory
        join = _joined_in(ctx, factory)
        models = True
        if join is not None and not _reads_the_device(ctx, join, on_device):
            # a join of host tensors moves as one, where the original made it
            done |= {id(n) for n in walk(join)}
            value, models = join, False
        uses = _uses_of_the_value(ctx, value)
        if uses is None:
            continue
        met = [
            (use, where)
            for use in uses
            if (where := _meets_at(ctx, use, loops, models=models)) is not None
        ]
        if not met and join is not None and value is factory:
            met = [(factory, join)]  # joined with a tensor on the device
        if not met:
            continue
        done.add(id(factory))
        use, where = met[0]
        name = dotted(use) or ctx.code(use)
        called = _called(ctx, value, name)
        off = next((u for u in uses if _meets_at(ctx, u, loops, models=models) is None), None)
        if off is not None:
            ctx.plan.review(
                ctx.line(value),
                f"{ctx.code(value)}: {_meeting(ctx, called, where)}, on {ctx.a('device')}, "
                f"and is also read at line {ctx.line(off)}, where the original had it on the "
                f"CPU; left as it is: send it to the device where {_taker(ctx, where)} "
                f"(send_to_device({name}, {ctx.a('device')}))",
            )
            continue
        if value is factory:
            _place(ctx, factory, _meeting(ctx, called, where), drawn=True)
        else:
            _move_joined(ctx, value, _meeting(ctx, called, where))


def _called(ctx: Context, factory: cst.Call, used_as: str) -> str:
    """How the message names the tensor: the name it is bound to, and the name it is read by
    where it meets the device when that differs (``W (scale there)``: a parameter)."""
    held = _carried(ctx, factory)
    parent = ctx.model.parent(held)
    bound = None
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        bound = dotted(parent.targets[0].target)
    return used_as if bound in (None, used_as) else f"{bound} ({used_as} there)"


def _taker(ctx: Context, where: cst.CSTNode) -> str:
    """Who needs it on the device, for the advice: the prepared model, or the batches."""
    model = isinstance(where, cst.Call) and prepared_model_called(ctx, where) is not None
    return "the model takes it" if model else "it meets the batches"


def _meeting(ctx: Context, name: str, where: cst.CSTNode) -> str:
    """Why ``name`` must be on the device: the use at ``where``, in words."""
    if isinstance(where, cst.Call) and prepared_model_called(ctx, where) is not None:
        return f"{name} is an input of the prepared model at line {ctx.line(where)}"
    return f"{name} meets the batches or the model's output at line {ctx.line(where)}"


#: How far `_uses_of_the_value` follows one tensor through names, parameters and returns.
_DEPTH = 6


def _uses_of_the_value(ctx: Context, factory: cst.Call) -> list[cst.CSTNode] | None:
    """Each read of the tensor ``factory`` makes, through the name or attribute it is bound to,
    the parameters it is handed to and the returns that hand it back; None when where it goes
    is not followed (an unpacking, a container, a name bound more than once)."""
    uses: list[cst.CSTNode] = []
    return uses if _follow_value(ctx, _carried(ctx, factory), uses, 0) else None


def _carried(ctx: Context, node: cst.CSTNode) -> cst.CSTNode:
    """``node`` through what keeps its device: same-device methods (``.float()``), a
    comparison or arithmetic with constants (``torch.rand(d) > 0.2``, ``-x``)."""
    child = node
    for parent in ctx.model.ancestors(node):
        if isinstance(parent, cst.Attribute) and parent.value is child:
            if not isinstance(ctx.model.parent(parent), cst.Call):
                return child
            continue
        if isinstance(parent, cst.Call) and isinstance(parent.func, cst.Attribute):
            if parent.func.value is not child or parent.func.attr.value not in SAME_DEVICE_METHODS:
                return child
            child = parent
            continue
        if isinstance(parent, cst.ComparisonTarget):
            continue
        if isinstance(parent, (cst.BinaryOperation, cst.Comparison, cst.UnaryOperation)):
            if any(
                isinstance(n, cst.Call) and n is not node for n in _operands_beside(parent, child)
            ):
                return child
            child = parent
            continue
        return child
    return child


def _operands_beside(operation: cst.CSTNode, child: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node of ``operation``'s other operands (not under ``child``)."""
    inside = {id(n) for n in walk(child)}
    return [n for n in walk(operation) if id(n) not in inside and n is not operation]


def _follow_value(ctx: Context, value: cst.CSTNode, uses: list[cst.CSTNode], depth: int) -> bool:
    """Adds to ``uses`` where ``value`` (an expression) is read; False when it is lost."""
    if depth > _DEPTH:
        return False
    parent = ctx.model.parent(value)
    if isinstance(parent, cst.Assign) and parent.value is value:
        if len(parent.targets) != 1:
            return False
        name = dotted(parent.targets[0].target)
        if name is None or len(assigned_values(ctx, name, parent)) != 1:
            return False
        return _follow_name(ctx, name, parent, uses, depth)
    if isinstance(parent, cst.Return):
        function = ctx.facts.placement.enclosing_function(parent)
        if function is None:
            return False
        calls = [call for call, _ in ctx.facts.flow.calls_of(function)]
        return bool(calls) and all(_follow_value(ctx, c, uses, depth + 1) for c in calls)
    uses.append(value)
    return True


def _follow_name(
    ctx: Context, name: str, binding: cst.CSTNode, uses: list[cst.CSTNode], depth: int
) -> bool:
    """Adds the reads of ``name``, bound at ``binding``, in the scope that binds it (the class
    for ``self.x``); a read handed to a parameter of a function of this file is followed into
    it, one assigned to another name is followed there."""
    for read in _reads(ctx, name, binding):
        parent = ctx.model.parent(read)
        if isinstance(parent, cst.Arg) and parent.value is read and not parent.star:
            parameter = _parameter_taking(ctx, parent)
            if parameter is not None:
                function, bound = parameter
                if not _follow_name(ctx, bound, function, uses, depth + 1):
                    return False
                continue
        if not _follow_value(ctx, read, uses, depth + 1):
            return False
    return True


def _parameter_taking(ctx: Context, argument: cst.Arg) -> tuple[cst.FunctionDef, str] | None:
    """The function of this file and its parameter that ``argument`` is passed for, when the
    function never rebinds it."""
    call = ctx.model.parent(argument)
    target = ctx.facts.calls.callee(call) if isinstance(call, cst.Call) else None
    if target is None:
        return None
    function, implicit = target
    for parameter, passed in bound_arguments(function, call, implicit):
        if passed is argument and has_parameter(function, parameter):
            if any(is_binding(ctx.model, n) for n in _named(function.body, parameter)):
                return None
            return function, parameter
    return None


def _reads(ctx: Context, name: str, binding: cst.CSTNode) -> list[cst.CSTNode]:
    """The reads of ``name`` where ``binding`` binds it: the class for ``self.x``, else the
    function (or, for a global, the module), less the functions in it that bind it themselves."""
    if name.startswith("self."):
        scope: cst.CSTNode | None = ctx.facts.placement.class_of(binding)
    elif isinstance(binding, cst.FunctionDef):
        scope = binding
    else:
        scope = ctx.facts.placement.enclosing_function(binding) or ctx.model.module
    if scope is None or ("." in name and not name.startswith("self.")):
        return []
    found = []
    for node in _named(scope, name):
        if (
            isinstance(ctx.model.parent(node), cst.Param)
            or is_binding(ctx.model, node)
            or (isinstance(node, cst.Name) and is_attribute_name(ctx.model, node))
        ):
            continue
        function = ctx.facts.placement.enclosing_function(node)
        # a function nested in the scope (``def step(x, y)`` in ``main()``) with its own name
        if function is not None and function is not scope and _binds_itself(function, name):
            continue
        found.append(node)
    return found


def _named(scope: cst.CSTNode, name: str) -> list[cst.CSTNode]:
    return [
        n for n in walk(scope) if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) == name
    ]


def _binds_itself(function: cst.FunctionDef, name: str) -> bool:
    """``function`` has its own ``name`` (a parameter or a local it assigns)."""
    if has_parameter(function, name):
        return True
    return any(
        isinstance(n, cst.AssignTarget) and name in target_names(n.target)
        for n in walk(function.body)
    )


def _meets_at(
    ctx: Context, read: cst.CSTNode, loops: list[Loop], *, models: bool = True
) -> cst.CSTNode | None:
    """Where ``read`` meets the device: the prepared model it is handed to, the call, the
    arithmetic or the index that takes it beside a batch or the model's output (``model(x) *
    mask``, ``(crit(out, y) * weights[y]).mean()``) in a training loop or in a helper those
    are handed to, or the ``nn`` module it is handed to (``nn.CrossEntropyLoss(weight=w)``)
    when that is called on the batches."""
    on_device = _device_names_at(ctx, read, loops)
    child = read
    for parent in ctx.model.ancestors(read):
        if isinstance(parent, cst.Arg):
            call = ctx.model.parent(parent)
            if not isinstance(call, cst.Call):
                return None
            if on_device is not None and _call_meets_the_device(
                ctx, call, parent, on_device, models=models
            ):
                return call
            return _module_called_on_the_device(ctx, call, loops)
        if isinstance(parent, (cst.BinaryOperation, cst.Comparison)):
            if on_device is not None and _reads_the_device(ctx, parent, on_device):
                return parent
        elif isinstance(parent, cst.Subscript) and parent.value is child:
            if on_device is not None and any(
                _reads_the_device(ctx, s, on_device) for s in parent.slice
            ):
                return parent  # ``weights[y]``: a CPU tensor indexed on the device
        elif not _keeps(parent, child):
            return None
        child = parent
    return None


def _device_names_at(ctx: Context, node: cst.CSTNode, loops: list[Loop]) -> set[str] | None:
    """The names on the device where ``node`` is: in a training loop, its batches and what is
    computed from them; in a helper, the parameters every caller hands something on the device
    from a training loop (``add_noise(x, self.scale)``: ``x``). None anywhere else."""
    loop = _loop_around(ctx, node, loops)
    if loop is not None:
        return _on_device_names(ctx, loop)
    function = ctx.facts.placement.enclosing_function(node)
    if function is None:
        return None
    found: set[str] = set()
    for parameter in all_params(function.params):
        name = parameter.name.value
        passed = ctx.facts.flow.call_site_arguments(name, node)
        if passed and all(_on_device_in_a_loop(ctx, a.value, loops) for a in passed):
            found.add(name)
    for statement in walk(function.body):
        if isinstance(statement, cst.Assign) and _reads_the_device(ctx, statement.value, found):
            for target in statement.targets:
                found |= target_names(target.target)
    return found or None


def _on_device_in_a_loop(ctx: Context, value: cst.BaseExpression, loops: list[Loop]) -> bool:
    loop = _loop_around(ctx, value, loops)
    return loop is not None and _reads_the_device(ctx, value, _on_device_names(ctx, loop))


def _keeps(parent: cst.CSTNode, child: cst.CSTNode) -> bool:
    """``parent`` carries ``child``'s tensor on: a method of it, its call, a sign, a comparison."""
    if isinstance(parent, cst.Attribute):
        return parent.value is child
    if isinstance(parent, cst.Call):
        return parent.func is child
    return isinstance(parent, (cst.ComparisonTarget, cst.UnaryOperation))


def _loop_around(ctx: Context, node: cst.CSTNode, loops: list[Loop]) -> Loop | None:
    return next((lp for lp in loops if ctx.facts.placement.inside(node, lp.node)), None)


def _module_called_on_the_device(
    ctx: Context, made: cst.Call, loops: list[Loop]
) -> cst.CSTNode | None:
    """``crit(out, y)`` in a training loop for ``crit = nn.CrossEntropyLoss(weight=w)``: the
    module keeps ``w`` as it was given, and the call meets the batches there."""
    maker = dotted(made.func) or ""
    parent = ctx.model.parent(made)
    if not maker.startswith(("nn.", "torch.nn.")) or not isinstance(parent, cst.Assign):
        return None
    if len(parent.targets) != 1 or (name := dotted(parent.targets[0].target)) is None:
        return None
    for loop in loops:
        on_device = _on_device_names(ctx, loop)
        for node in walk(loop.node.body):
            if (
                isinstance(node, cst.Call)
                and dotted(node.func) == name
                and _call_meets_the_device(ctx, node, None, on_device)
            ):
                return node
    return None


def _place(ctx: Context, factory: cst.Call, reason: str, *, drawn: bool) -> None:
    """The factory's tensor goes to the device. One made before the loop (``drawn``) or from a
    ``generator=`` is made as written and moved (``.to(device)``): the same values from the
    same RNG stream as the original, and no CPU generator handed a CUDA device (which raises).
    One made per step in the loop, with the global RNG, is made there
    (``device=``), with no copy per step."""
    device = ctx.a("device")
    if drawn or _takes_a_generator(factory):
        edit = rewrites.made_then_moved(factory, device)
        text = f"{ctx.code(factory)}: made as before and moved to {device} ({reason})"
    else:
        edit = rewrites.made_on_device(factory, device)
        text = f"{ctx.code(factory)}: made on {device} ({reason})"
    ctx.plan.add(edit, line=ctx.line(factory), text=text)
    ctx.need(factory)


def _takes_a_generator(factory: cst.Call) -> bool:
    """``torch.randn(n, d, generator=g)``: ``g`` draws on the device it was made for."""
    return any(a.keyword is not None and a.keyword.value == "generator" for a in factory.args)


def _on_device_names(ctx: Context, loop: Loop) -> set[str]:
    """The loop's batch, what is unpacked from it, and every name assigned from those or from
    a prepared model's output, in source order."""
    on_device = set(loop.batch_names) | ctx.facts.flow.derived_batch_names(loop)
    for node in walk(loop.node.body):
        if isinstance(node, cst.Assign) and _reads_the_device(ctx, node.value, on_device):
            for target in node.targets:
                on_device |= target_names(target.target)
    return on_device


def _reads_the_device(ctx: Context, node: cst.CSTNode, on_device: set[str]) -> bool:
    if _tensor_variables(ctx, node) & on_device:
        return True
    return any(isinstance(n, cst.Call) and _model_on_the_device(ctx, n) for n in walk(node))


def _tensor_variables(ctx: Context, node: cst.CSTNode) -> set[str]:
    """`variables_in` less the names read only for the size or range a factory makes its
    tensor with: ``n`` of ``torch.ones(n, 1)`` is read from a batch (``n = real.size(0)``),
    the tensor is on the CPU all the same."""
    if not any(_sized(n) for n in walk(node)):
        return variables_in(ctx.model, node)
    found: set[str] = set()
    pending: list[cst.CSTNode] = [node]
    while pending:
        current = pending.pop()
        if _sized(current):
            continue
        if isinstance(current, cst.Name):
            found |= variables_in(ctx.model, current)
        elif isinstance(current, (cst.Attribute, cst.Arg)):  # not a member, not ``dim=``
            pending.append(current.value)
        else:
            pending += children_of(current)
    return found


def _sized(node: cst.CSTNode) -> bool:
    """A factory made from sizes, ranges or a fill value alone, with no ``device=``: its
    tensor is on the CPU whatever its arguments were computed from (not ``torch.tensor(t)``,
    which keeps a tensor ``t`` where it is)."""
    return isinstance(node, cst.Call) and torch_factory(node) in _SIZED and not device_given(node)


#: Factories whose arguments are sizes, ranges and fill values, never a tensor whose device
#: the result keeps.
_SIZED = frozenset(
    {"randn", "rand", "randint", "randperm", "zeros", "ones", "full", "empty", "eye", "arange",
     "linspace"}
)  # fmt: skip


def _model_on_the_device(ctx: Context, call: cst.Call) -> bool:
    """``call`` runs a prepared model whose inputs and output are on the device. Not one that
    `host_inputs` sends there and back (``model(X_test)`` outside the training loop): its
    inputs stay where they are made and its output comes back to the CPU, so a tensor handed to
    it, or meeting its output, stays on the CPU too (moved, it would meet a CPU output)."""
    return prepared_model_called(ctx, call) is not None and id(call) not in ctx.host_calls


def _moved_model_called(ctx: Context, call: cst.Call) -> bool:
    """``call`` runs a model left out of prepare that the conversion moves to the device where
    it is made (a generator no optimizer trains, fed beside the batches): its weights are on
    the device, so what it is handed must be there too (on a GPU: a device mismatch)."""
    name = dotted(call.func)
    return (
        name is not None and name in ctx.moved_models and ctx.facts.flow.is_model_name(name, call)
    )


def _is_factory(node: cst.CSTNode) -> bool:
    """A torch factory with no ``device=`` (``torch.ones(n, 1)``), or a ``*_like`` of one
    (``torch.zeros_like(t)``: made where ``t`` is, on the CPU when `_like_on_the_device`
    finds ``t`` is not on the device)."""
    if not isinstance(node, cst.Call) or device_given(node):
        return False
    made = torch_factory(node)
    if made is None:
        return (dotted(node.func) or "") in _LIKE and bool(node.args)
    return made not in _FROM_DATA


#: Factories that make a tensor where their first argument is: on the CPU in a CPU-only
#: script, unless that argument is on the device (``torch.ones_like(real)`` of a batch).
_LIKE = frozenset(
    f"torch.{kind}_like" for kind in ("zeros", "ones", "full", "empty", "rand", "randn", "randint")
)


def _like_on_the_device(ctx: Context, call: cst.Call, on_device: set[str]) -> bool:
    """``call`` is a ``*_like`` of a tensor on the device already: a batch, a model's output
    or what is computed from them, a prepared model's parameter (``torch.randn_like(p)`` of
    ``p`` in ``model.parameters()`` reads a model name)."""
    if (dotted(call.func) or "") not in _LIKE:
        return False
    source = call.args[0].value
    if _reads_the_device(ctx, source, on_device):
        return True
    return any(
        ctx.facts.flow.kind_of(dotted(n), call) is Kind.MODEL
        for n in walk(source)
        if isinstance(n, (cst.Name, cst.Attribute))
    )


#: How far `_joined_in` follows a join nested in another (``torch.cat([torch.stack(...)])``).
_JOIN_DEPTH = 4


def _joined_in(ctx: Context, factory: cst.CSTNode, depth: int = 0) -> cst.Call | None:
    """The outermost ``torch.cat``/``torch.stack`` of a list or tuple that holds ``factory``'s
    tensor (through same-device methods and arithmetic with constants: ``torch.cat([torch.ones
    (n, 1) * 0.9, torch.zeros(n, 1)])``): the joined tensor is on the device its parts are."""
    if depth > _JOIN_DEPTH:
        return None
    element = ctx.model.parent(_carried(ctx, factory))
    if not isinstance(element, cst.Element):
        return None
    sequence = ctx.model.parent(element)
    argument = ctx.model.parent(sequence) if isinstance(sequence, (cst.List, cst.Tuple)) else None
    call = ctx.model.parent(argument) if isinstance(argument, cst.Arg) else None
    if not isinstance(call, cst.Call) or (dotted(call.func) or "") not in JOINED:
        return None
    if not call.args or call.args[0] is not argument or argument.keyword is not None:
        return None
    return _joined_in(ctx, call, depth + 1) or call


def _move_joined(ctx: Context, join: cst.Call, reason: str) -> None:
    """A join of tensors the original made on the CPU that meets the device: made as written
    and moved as one (``torch.cat([torch.ones(n, 1), torch.zeros(n, 1)]).to(device)``), as a
    script that runs on a GPU moves its labels."""
    device = ctx.a("device")
    ctx.plan.add(
        rewrites.made_then_moved(join, device),
        line=ctx.line(join),
        text=f"{ctx.code(join)}: made as before and moved to {device} ({reason})",
    )
    ctx.need(join)


#: Factories that copy data the script already has (a NumPy array, a list): where that data
#: goes is the script's business.
_FROM_DATA = frozenset({"from_numpy", "as_tensor"})


def _meets_the_device(
    ctx: Context,
    factory: cst.BaseExpression,
    loop: Loop,
    on_device: set[str],
    *,
    models: bool = True,
) -> bool:
    """``factory``'s tensor is an argument of a call that also takes something on the device,
    or of a prepared model (unless not ``models``), either directly or through the one name it
    is assigned to."""
    user, carried = _first_call_taking(ctx, factory)
    if user is not None and _call_meets_the_device(ctx, user, carried, on_device, models=models):
        return True
    name = _assigned_to(ctx, factory)
    if name is None:
        return False
    for node in walk(loop.node.body):
        if _combined_on_the_device(ctx, node, name, on_device):
            return True
        if not isinstance(node, cst.Call):
            continue
        for argument in node.args:
            if name in variables_in(ctx.model, argument.value) and _call_meets_the_device(
                ctx, node, argument, on_device, models=models
            ):
                return True
    return False


def _combined_on_the_device(
    ctx: Context, node: cst.CSTNode, name: str, on_device: set[str]
) -> bool:
    """``inputs + noise`` or ``inputs += noise``: arithmetic of ``name`` with a batch tensor or
    a model's output (a tensor on the device), which needs both on one device."""
    if isinstance(node, cst.AugAssign):
        return name in variables_in(ctx.model, node.value) and bool(
            variables_in(ctx.model, node.target) & on_device
        )
    if not isinstance(node, cst.BinaryOperation):
        return False
    sides = (node.left, node.right)
    return any(
        name in variables_in(ctx.model, side) and _reads_the_device(ctx, other, on_device - {name})
        for side, other in (sides, sides[::-1])
    )


def _first_call_taking(ctx: Context, node: cst.CSTNode) -> tuple[cst.Call | None, cst.Arg | None]:
    """The call ``node`` is an argument of, through arithmetic and same-device methods
    (``bce(out, torch.ones(b, 1).float())``), with the argument that carries it."""
    child = node
    for parent in ctx.model.ancestors(node):
        if isinstance(parent, cst.Arg):
            call = ctx.model.parent(parent)
            return (call, parent) if isinstance(call, cst.Call) else (None, None)
        if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation)):
            child = parent
            continue
        if isinstance(parent, cst.Attribute) and parent.value is child:
            child = parent
            continue
        if isinstance(parent, cst.Call) and parent.func is child:
            child = parent
            continue
        return None, None
    return None, None


def _call_meets_the_device(
    ctx: Context,
    call: cst.Call,
    carried: cst.Arg | None,
    on_device: set[str],
    *,
    models: bool = True,
) -> bool:
    """``call`` takes ``carried`` beside something on the device, or is a prepared model on
    it. Not ``models``: a prepared model's input is another step's (a join of host tensors
    handed to the model is moved where the model takes it, by `loop_host_inputs` in a
    training loop and `host_inputs` elsewhere)."""
    if prepared_model_called(ctx, call) is not None:
        if not models:
            return False
        if _model_on_the_device(ctx, call):
            return True
    if models and _moved_model_called(ctx, call):
        return True
    return any(
        argument is not carried and _reads_the_device(ctx, argument.value, on_device)
        for argument in call.args
    )


def _assigned_to(ctx: Context, factory: cst.Call) -> str | None:
    """``noise`` of ``noise = torch.randn(b, z)`` (also ``... .float()``, ``* 0.1``)."""
    child: cst.CSTNode = factory
    for parent in ctx.model.ancestors(factory):
        if isinstance(parent, cst.Assign) and parent.value is child and len(parent.targets) == 1:
            return dotted(parent.targets[0].target)
        if isinstance(parent, (cst.BinaryOperation, cst.Attribute)) or (
            isinstance(parent, cst.Call) and parent.func is child
        ):
            child = parent
            continue
        return None
    return None
