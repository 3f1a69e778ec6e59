from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from accelify.analysis.collectives import DEEPSPEED, FSDP, ZERO3, backends_in_view
from accelify.analysis.facts import facts_of
from accelify.analysis.idle_members import (
    class_methods,
    idle_members,
    members_behind_outputs,
    members_only_dropped,
    requires_grad_writes,
    skipping_test,
    sometimes_idle_members,
)
from accelify.analysis.objects import bound_arguments, instance_class, received_classes
from accelify.analysis.script_model import Binding, Kind, ScriptModel
from accelify.analysis.syntax import dotted, self_parameter, strip_self_methods, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule

_HANDLER = "kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)]"

_TWO_HEADS = (
    "import torch\nfrom torch import nn\n"
    + HEADER
    + "\n\nclass Net(nn.Module):\n"
    + "    def __init__(self):\n"
    + "        super().__init__()\n"
    + "        self.body = nn.Linear(4, 4)\n"
    + "        self.aux = nn.Linear(4, 2)\n"
    + "\n"
    + "    def forward(self, x, with_aux=False):\n"
    + "        h = self.body(x)\n"
    + "        if with_aux:\n"
    + "            return h, self.aux(h)\n"
    + "        return h\n"
    + "\n\n"
    + "model = Net()\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for step, (x, y) in enumerate(loader):\n"
)


#: ``_TWO_HEADS`` with a forward that returns ``h`` alone when no ``targets`` are passed: the
#: training call that passes them reaches ``return h, self.aux(h)``.
_TARGETS_HEAD = _TWO_HEADS.replace("with_aux=False", "targets=None").replace(
    "        if with_aux:\n            return h, self.aux(h)\n        return h\n",
    "        if targets is None:\n            return h\n        return h, self.aux(h)\n",
)


_ACGAN = (
    "from torch import nn\n"
    + HEADER
    + "\n\nclass Discriminator(nn.Module):\n"
    + "    def __init__(self):\n"
    + "        super().__init__()\n"
    + "        self.conv = nn.Conv2d(1, 8, 3)\n"
    + "        self.adv_layer = nn.Linear(8, 1)\n"
    + "        self.aux_layer = nn.Linear(8, 10)\n"
    + "\n"
    + "    def forward(self, img):\n"
    + "        out = self.conv(img).flatten(1)\n"
    + "        validity = self.adv_layer(out)\n"
    + "        label = self.aux_layer(out)\n"
    + "        return validity, label\n"
    + "\n\n"
    + "discriminator = Discriminator()\n"
    + "discriminator, opt_d, loader = accelerator.prepare(discriminator, opt_d, loader)\n"
    + "for imgs, labels in loader:\n"
)


_DETACHED = (
    "from torch import nn\n"
    + HEADER
    + "\n\nclass Net(nn.Module):\n"
    + "    def __init__(self):\n"
    + "        super().__init__()\n"
    + "        self.body = nn.Linear(4, 4)\n"
    + "        self.head = nn.Linear(4, 2)\n"
    + "\n"
    + "    def forward(self, x):\n"
    + "        h = self.body(x)\n"
    + "        return self.head({kept}), h\n"
    + "\n\n"
    + "model = Net()\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for x, y in loader:\n"
    + "    out, _ = model(x)\n"
    + "    accelerator.backward(loss_fn(out, y))\n"
)


#: A classifier over an encoder another class of the file builds, handed to its constructor:
#: ``{forward}`` is what the classifier's forward returns.
_NESTED = (
    "from torch import nn\n"
    + HEADER
    + "\n\nclass Encoder(nn.Module):\n"
    + "    def __init__(self):\n"
    + "        super().__init__()\n"
    + "        self.enc = nn.Linear(4, 8)\n"
    + "        self.dec = nn.Linear(8, 4)\n"
    + "\n"
    + "    def forward(self, x):\n"
    + "        return self.dec(self.enc(x))\n"
    + "\n\nclass Classifier(nn.Module):\n"
    + "    def __init__(self, encoder):\n"
    + "        super().__init__()\n"
    + "        self.encoder = encoder\n"
    + "        self.head = nn.Linear(8, 2)\n"
    + "\n"
    + "    def forward(self, x):\n"
    + "        return {forward}\n"
    + "\n\n"
    + "model = accelerator.prepare(Classifier(Encoder()))\n"
)


class UnusedParametersUnderDdp(Rule):
    """A prepared model whose forward leaves some of its parameters without a gradient in a
    training step: a layer ``__init__`` builds and ``forward`` never calls (or calls only under
    ``torch.no_grad()``), or one it reaches only under a branch that a training call of the
    model skips (``model(x)`` where ``forward(self, x, with_aux=False)`` calls ``self.aux``
    under ``if with_aux:``), or an output a training step drops (``validity, _ =
    discriminator(x)``) that layers no kept output needs compute (a kept output computed
    through ``.detach()`` needs none of the layers behind it; a dropped output the kept ones
    are computed from, an RNN's hidden state beside its logits, leaves none idle). DDP
    expects a gradient for every parameter that requires one; without
    ``find_unused_parameters=True`` the second step stops on every rank with
    "Expected to have finished reduction in the prior iteration before starting a new one"
    (one process, with no DDP, runs). Reported at the ``prepare`` call, naming the layer and the
    line (with its file, for a class another module of the project defines: ``from models import
    Net`` is read there, its idle layers, branches and dropped outputs alike); not where the file
    sets ``find_unused_parameters`` (a ``DistributedDataParallelKwargs`` handler), where the
    Accelerator is made elsewhere (its handlers are not in view), where the file names FSDP or
    DeepSpeed (which have no such check), nor for a layer whose parameters are frozen
    (``requires_grad_(False)``: DDP leaves them out). A branch decided by anything but a forward
    parameter given a constant at the training call (or left to its default) is not reported:
    whether the step skips it is not known; one bound in the training loop from the loop's own
    variables (``use_aux = step % 2 == 0``) changes from step to step, and is."""

    code = "ACC310"
    name = "unused-parameters-under-ddp"
    message = (
        f"Create the Accelerator with {_HANDLER}: this model's forward leaves parameters "
        "without a gradient in a training step, and DDP stops at the next step (Expected to "
        "have finished reduction in the prior iteration)"
    )
    why = "DDP fails on parameters that get no gradient unless told to expect them."
    bad = (
        # the auxiliary head is reached only when with_aux is passed: model(x) skips it
        Example(
            _TWO_HEADS
            + "    loss = loss_fn(model(x), y)\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n",
            21,
            28,
        ),
        # the call passes targets, so it reaches the return whose aux output it drops
        Example(
            _TARGETS_HEAD
            + "    out, _ = model(x, y)\n"
            + "    accelerator.backward(loss_fn(out, y))\n",
            21,
            28,
        ),
        # the flag changes from step to step
        Example(
            _TWO_HEADS
            + "    use_aux = step % 2 == 0\n"
            + "    out = model(x, with_aux=use_aux)\n"
            + "    accelerator.backward(loss_fn(out, y))\n",
            21,
            28,
        ),
        # a layer built and never called
        Example(
            "from torch import nn\n"
            + HEADER
            + "\n\nclass Net(nn.Module):\n"
            + "    def __init__(self):\n"
            + "        super().__init__()\n"
            + "        self.fc = nn.Linear(4, 2)\n"
            + "        self.unused = nn.Linear(4, 4)\n"
            + "\n"
            + "    def forward(self, x):\n"
            + "        return self.fc(x)\n"
            + "\n\n"
            + "model = accelerator.prepare(Net())\n",
            16,
            9,
        ),
        # a part of a member built by another class of the file: only its encoder runs
        Example(_NESTED.replace("{forward}", "self.head(self.encoder.enc(x))"), 26, 9),
        # an ACGAN's discriminator step that drops the class head's output
        Example(
            _ACGAN
            + "    validity, _ = discriminator(imgs)\n"
            + "    accelerator.backward(adversarial_loss(validity, ones))\n",
            21,
            32,
        ),
        # the kept output reaches the body only through .detach(): no gradient flows back
        Example(_DETACHED.replace("{kept}", "h.detach()"), 18, 28),
    )
    good = (
        # every part of the member runs, one after the other
        _NESTED.replace("{forward}", "self.head(self.encoder.dec(self.encoder.enc(x)))"),
        # the member runs whole (its own forward uses both parts)
        _NESTED.replace("{forward}", "self.head(self.encoder.enc(x)) + self.encoder(x).sum()"),
        # the dropped output (an RNN's hidden state) is made by layers the kept one needs too
        _DETACHED.replace("{kept}", "h"),
        _ACGAN
        + "    validity, pred_label = discriminator(imgs)\n"
        + "    loss = adversarial_loss(validity, ones) + aux_loss(pred_label, labels)\n"
        + "    accelerator.backward(loss)\n",
        # the call passes targets and keeps both outputs of the return it reaches
        _TARGETS_HEAD
        + "    out, aux = model(x, y)\n    accelerator.backward(loss_fn(out, y) + aux.mean())\n",
        # every training call takes the branch
        _TWO_HEADS
        + "    out, aux = model(x, with_aux=True)\n"
        + "    accelerator.backward(loss_fn(out, y) + aux.mean())\n",
        # told to expect them
        _TWO_HEADS.replace(
            "accelerator = Accelerator()",
            "from accelerate import DistributedDataParallelKwargs\n"
            + "accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
            + "find_unused_parameters=True)])",
        )
        + "    accelerator.backward(loss_fn(model(x), y))\n",
        # FSDP: no reduction check
        _TWO_HEADS.replace(
            "accelerator = Accelerator()",
            "from accelerate import FullyShardedDataParallelPlugin\n"
            + "accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())",
        )
        + "    accelerator.backward(loss_fn(model(x), y))\n",
        # the head is frozen: DDP leaves its parameters out
        _TWO_HEADS.replace("model = Net()\n", "model = Net()\nmodel.aux.requires_grad_(False)\n")
        + "    accelerator.backward(loss_fn(model(x), y))\n",
        # the call that skips it runs under no_grad: no gradient is expected there
        _TWO_HEADS
        + "    out, aux = model(x, with_aux=True)\n"
        + "    accelerator.backward(loss_fn(out, y) + aux.mean())\n"
        + "    with torch.no_grad():\n"
        + "        features = model(x)\n",
        # the idle layer runs outside the forward, through the unwrapped model
        _TWO_HEADS
        + "    h = model(x)\n"
        + "    aux = accelerator.unwrap_model(model).aux(h)\n"
        + "    accelerator.backward(loss_fn(h, y) + aux.mean())\n",
        # decided at run time: not known to be skipped
        _TWO_HEADS + "    accelerator.backward(loss_fn(model(x, with_aux=args.aux)[0], y))\n",
        # only ``if self.training:`` around it: every training step uses it
        "from torch import nn\n"
        + HEADER
        + "\n\nclass Net(nn.Module):\n"
        + "    def __init__(self):\n"
        + "        super().__init__()\n"
        + "        self.fc = nn.Linear(4, 2)\n"
        + "        self.drop_head = nn.Linear(2, 2)\n"
        + "\n"
        + "    def forward(self, x):\n"
        + "        x = self.fc(x)\n"
        + "        if self.training:\n"
        + "            x = self.drop_head(x)\n"
        + "        return x\n"
        + "\n\n"
        + "model = accelerator.prepare(Net())\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if backends_in_view(script) & {FSDP, DEEPSPEED, ZERO3}:
            return
        if not _creates_accelerator(script) or _expects_unused_parameters(script):
            return
        for prepare in script.prepare_calls:
            arguments = prepare.call.args if isinstance(prepare.call, cst.Call) else ()
            for index, argument in enumerate(arguments):
                name = dotted(argument.value) or ""
                output = prepare.outputs[index] if index < len(prepare.outputs) else ""
                names = {n for n in (name, output) if n}
                classes = _classes_of(script, argument.value, name, prepare.call)
                why = next(
                    (w for c in classes if (w := _why_idle(script, c, names)) is not None), None
                )
                if why is None and not classes:
                    why = _why_imported_idle(script, argument.value, name, names, prepare.call)
                if why is not None:
                    yield self.finding(
                        script, prepare.call, message=f"{self.message.split(':')[0]}: {why}"
                    )
                    break


def _creates_accelerator(script: ScriptModel) -> bool:
    """An Accelerator made in this file (its handlers are in view)."""
    return any(
        isinstance(b.value, cst.Call) and (dotted(b.value.func) or "").endswith("Accelerator")
        for b in script.of_kind(Kind.ACCELERATOR)
    )


def _expects_unused_parameters(script: ScriptModel) -> bool:
    """``find_unused_parameters=...`` in any call of the file (a handler, a config)."""
    return any(
        argument.keyword is not None
        and argument.keyword.value == "find_unused_parameters"
        and not (isinstance(argument.value, cst.Name) and argument.value.value == "False")
        for call in script.calls
        for argument in call.args
    )


def _classes_of(
    script: ScriptModel, value: cst.BaseExpression, name: str, at: cst.CSTNode
) -> list[str]:
    """The classes of this file a prepare argument is an instance of: made in the call itself
    (``accelerator.prepare(Net())``), bound to a model above it, or handed to the class that
    holds it (``Trainer(TwoHeads(), ...)``'s ``self.model``)."""
    if isinstance(value, cst.Call):
        made = dotted(value.func)
        return [made] if made in script.classes else []
    binding = _model_binding(script, name, at)
    if binding is None:
        return []
    made = instance_class(script, name, binding.assign)
    return [made] if made is not None else sorted(received_classes(script, binding))


def _model_binding(script: ScriptModel, name: str, at: cst.CSTNode) -> Binding | None:
    """The last binding of the model ``name`` above ``at``."""
    if not name:
        return None
    return next(
        (
            b
            for b in reversed(script.of_kind(Kind.MODEL))
            if b.name == name and script.order(b.assign) <= script.order(at)
        ),
        None,
    )


def _why_imported_idle(
    script: ScriptModel, value: cst.BaseExpression, name: str, names: set[str], at: cst.CSTNode
) -> str | None:
    """A prepare argument made by a class the file imports from another module of the project
    (``from models import Net``, ``model = Net()``), read in that module: the members its
    forward leaves without a gradient, as `_why_idle` reads them in the file, named with that
    module's file and line."""
    if script.project is None:
        return None
    if not isinstance(value, cst.Call):
        binding = _model_binding(script, name, at)
        value = binding.value if binding is not None else value
    made = strip_self_methods(value)
    called = dotted(made.func) if isinstance(made, cst.Call) else None
    if called is None or called in script.classes:
        return None
    found = script.project.class_imported_by(script, called, script.project.path)
    if found is None:
        return None
    other, defined, path = found
    return _why_idle(script, defined.name.value, names, Home(other, path.name), called)


@dataclass(frozen=True)
class Home:
    """The module that defines a prepared model's class, where it is another module of the
    project than the linted file (``from models import Net``): its analysis, and its file's
    name for the lines the advice cites there."""

    model: ScriptModel
    file: str

    def at(self, node: cst.CSTNode) -> str:
        return f"{self.file}, line {self.model.line(node)}"


def _why_idle(
    script: ScriptModel,
    made_by: str,
    names: set[str],
    home: Home | None = None,
    spelled: str | None = None,
) -> str | None:
    """Why an instance of ``made_by``, prepared under ``names``, leaves parameters without
    gradients in a training step. ``home``: the class is another module's (its members and
    lines are read there, the training calls here), and the file calls it ``spelled``."""
    defining = home.model if home is not None else script

    def at(node: cst.CSTNode) -> str:
        return home.at(node) if home is not None else f"line {script.line(node)}"

    shown = spelled or made_by
    frozen = _frozen_members(script, names) | _reached_from_outside(script)
    if home is not None:
        frozen |= _frozen_members(home.model, set())
    idle = [(m, node) for m, node in idle_members(defining, made_by) if m not in frozen]
    if idle:
        members = ", ".join(f"self.{m} ({at(node)})" for m, node in idle)
        return f"{shown}'s forward computes no gradient for {members} in any step"
    dropped = _dropped_outputs(script, defining, made_by, names, frozen)
    if dropped is not None:
        call, members, returned = dropped
        return (
            f"the training call at line {script.line(call)} drops outputs of "
            f"{shown}'s forward that only {members} compute (returned at {at(returned)}): "
            "they get no gradient in that step"
        )
    forward = class_methods(defining, made_by).get("forward")
    if forward is None:
        return None
    for member, use in sometimes_idle_members(defining, made_by):
        if member in frozen:
            continue
        skipped = _skipping_call(script, defining, forward, use, names)
        if skipped is not None:
            call, test, needed, varies = skipped
            how = (
                ", in the steps where its argument changes it, makes it" if varies else " makes it"
            )
            return (
                f"{shown}'s forward uses self.{member} ({at(use)}) only where "
                f"`{defining.module.code_for_node(test)}` ({at(test)}) is "
                f"{needed}, and the training call at line {script.line(call)}{how} "
                f"{not needed}: self.{member} gets no gradient in that step"
            )
    return None


def _dropped_outputs(
    script: ScriptModel, defining: ScriptModel, made_by: str, names: set[str], frozen: set[str]
) -> tuple[cst.Call, str, cst.CSTNode] | None:
    """``validity, _ = discriminator(x)`` in a function that runs a backward, where the dropped
    output is computed with members no kept output needs (`members_behind_outputs`, read in
    ``defining``, the class's module): the call, the members, the returned element."""
    for call in _training_calls(script, names):
        statement = script.parent(call)
        if not (isinstance(statement, cst.Assign) and statement.value is call):
            continue
        behind = members_behind_outputs(defining, made_by, call)  # the return the call reaches
        if behind is None:
            continue
        for target in statement.targets:
            found = members_only_dropped(behind, target.target)
            idle = [m for m in found[0] if m not in frozen] if found is not None else []
            if found is not None and idle:
                return call, ", ".join(f"self.{m}" for m in idle), behind[found[1]][1]
    return None


def _training_calls(script: ScriptModel, names: set[str]) -> Iterator[cst.Call]:
    """Calls of the model ``names`` in a function (or module) that runs a backward, outside
    ``no_grad`` (where DDP expects no gradient: a feature extraction beside the training)."""
    facts = facts_of(script)
    backward_scopes = {
        id(script.scope_of(c))
        for c in script.calls
        if isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"
    }  # ``loss.backward()`` and ``accelerator.backward(loss)``
    for call in script.calls:
        if dotted(call.func) not in names or id(script.scope_of(call)) not in backward_scopes:
            continue
        if any(script.disables_grad(a) for a in script.ancestors(call)):
            continue
        if facts.flow.is_forward(call):
            yield call


def _reached_from_outside(script: ScriptModel) -> set[str]:
    """Members read through something other than ``self`` (``model.classifier(h)``,
    ``accelerator.unwrap_model(model).head(h)``): a layer the step runs outside the forward gets
    its gradient there, and DDP's hooks see it."""
    return {
        node.attr.value
        for node in script.index.of_type(cst.Attribute)
        if isinstance(node, cst.Attribute) and dotted(node.value) != "self"
    }


def _frozen_members(script: ScriptModel, names: set[str]) -> set[str]:
    """Members whose parameters the file turns off and never on: ``self.head`` in the class,
    ``model.head`` outside it."""
    off: set[str] = set()
    on: set[str] = set()
    for _, owner, turns_on in requires_grad_writes(script):
        root, _, member = owner.partition(".")
        if not member or (root != "self" and root not in names):
            continue
        (on if turns_on else off).add(member.split(".")[0])
    return off - on


def _skipping_call(
    script: ScriptModel,
    defining: ScriptModel,
    forward: cst.FunctionDef,
    use: cst.CSTNode,
    names: set[str],
) -> tuple[cst.Call, cst.BaseExpression, bool, bool] | None:
    """A training call of the model (one in a function that runs a backward) that skips
    ``use`` (in ``forward`` of ``defining``, the class's module): the one test deciding it
    reads a forward parameter, and the call gives that parameter a constant (or leaves it to
    its default) under which the test goes the other way."""
    if defining.index.enclosing_function(use) is not forward:
        return None
    decided = skipping_test(defining, use, forward)
    if decided is None:
        return None
    test, needed = decided
    parameters = {p.name.value: p for p in forward.params.params}
    me = self_parameter(forward)
    for call in _training_calls(script, names):
        given = {p: a.value for p, a in bound_arguments(forward, call, implicit=1 if me else 0)}
        varying = {p for p, value in given.items() if _varies_per_step(script, value, call)}
        if varying & {n.value for n in walk(test) if isinstance(n, cst.Name)}:
            return call, test, needed, True  # both ways, in different steps
        truth = _truth(test, parameters, given)
        if truth is not None and truth is not needed:
            return call, test, needed, False
    return None


def _varies_per_step(script: ScriptModel, value: cst.BaseExpression, call: cst.Call) -> bool:
    """``use_reg`` bound, in a loop around ``call``, to a value computed from the loop's own
    variables (``use_reg = step % 2 == 0``): it changes from step to step."""
    if not isinstance(value, cst.Name):
        return False
    loops = [a for a in script.ancestors(call) if isinstance(a, cst.For)]
    for loop in loops:
        counters = {n.value for n in walk(loop.target) if isinstance(n, cst.Name)}
        for statement, bound in script.index.values_bound_to(value.value):
            if not script.inside(statement, loop) or script.order(statement) > script.order(call):
                continue
            if counters & {n.value for n in walk(bound) if isinstance(n, cst.Name)}:
                return True
    return False


def _truth(
    test: cst.BaseExpression, parameters: dict[str, cst.Param], given: dict[str, cst.BaseExpression]
) -> bool | None:
    """The test's truth at a call: ``p``, ``not p``, ``p is None``, ``p is not None`` of a
    parameter the call gives a constant or leaves to its constant default; None otherwise."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _truth(test.expression, parameters, given)
        return None if inner is None else not inner
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot))
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    ):
        value = _value(test.left, parameters, given)
        if value is None:
            return None
        is_none = isinstance(value, cst.Name) and value.value == "None"
        return is_none if isinstance(test.comparisons[0].operator, cst.Is) else not is_none
    value = _value(test, parameters, given)
    return None if value is None else _constant_truth(value)


def _value(
    node: cst.BaseExpression, parameters: dict[str, cst.Param], given: dict[str, cst.BaseExpression]
) -> cst.BaseExpression | None:
    if not (isinstance(node, cst.Name) and node.value in parameters):
        return None
    value = given.get(node.value)
    if value is None:
        value = parameters[node.value].default
    if value is None or _constant_truth(value) is None:
        return None
    return value


def _constant_truth(value: cst.BaseExpression) -> bool | None:
    if isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
        return value.value == "True"
    if isinstance(value, (cst.Integer, cst.Float)):
        return value.evaluated_value != 0
    if isinstance(value, cst.SimpleString):
        return bool(value.evaluated_value)
    return None
