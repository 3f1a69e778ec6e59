from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.optimizer_models import parameter_owners
from accelify.analysis.script_model import Binding, Kind, PrepareCall, ScriptModel
from accelify.analysis.syntax import dotted, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule

_ADAMW = "optimizer = torch.optim.AdamW(model.parameters())\n"

#: A model and its EMA copy prepared in one call, the optimizer in the next; ``{built_before}``
#: and ``{built_after}`` place the optimizer's construction around the models' prepare.
_WITH_EMA = (
    HEADER
    + "import copy\nimport torch\n"
    + "{built_before}"
    + "model_ema = copy.deepcopy(model).eval()\n"
    + "model, model_ema = accelerator.prepare(model, model_ema)\n"
    + "{built_after}"
    + "optimizer, loader = accelerator.prepare(optimizer, loader)\n"
)


class SeparatePrepareCalls(Rule):
    """A model and its optimizer prepared in separate calls. FSDP and DeepSpeed shard the model
    in ``prepare``; an optimizer prepared on its own keeps the unsharded parameters, so under
    those backends it updates tensors the model no longer uses. The optimizer's model is the one
    whose ``.parameters()`` it is built from, or the one a project's helper is handed
    (``build_optimizer(model, cfg)``). An optimizer created after the
    model's ``prepare``, from the prepared model's parameters, is bound to the sharded ones (the
    order FSDP documents) and is not reported."""

    code = "ACC306"
    name = "separate-prepare-calls"
    message = "Prepare the model and its optimizer in one accelerator.prepare(...) call"
    why = "Sharding backends must bind the optimizer to the sharded parameters."
    bad = (
        Example(
            HEADER
            + "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "model = accelerator.prepare(model)\noptimizer = accelerator.prepare(optimizer)\n",
            6,
            13,
        ),
        Example(  # built by the project's helper from the model it is handed, before prepare
            HEADER
            + "optimizer = build_optimizer(model, cfg.optimizer)\n"
            + "model = accelerator.prepare(model)\n"
            + "optimizer, loader = accelerator.prepare(optimizer, loader)\n",
            5,
            21,
        ),
        # the arm that prepares separately is the bug, whatever the other arm does
        Example(
            HEADER
            + "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "if args.fsdp:\n    model = accelerator.prepare(model)\n"
            + "    optimizer = accelerator.prepare(optimizer)\n"
            + "else:\n    model, optimizer = accelerator.prepare(model, optimizer)\n",
            7,
            17,
        ),
        # PixArt-alpha: the model prepared beside its EMA copy, the optimizer made before from
        # the unprepared parameters: the advice builds it after the models' prepare
        Example(_WITH_EMA.format(built_before=_ADAMW, built_after=""), 8, 21),
    )
    good = (
        # ... the order FSDP documents for several models: the optimizer after their prepare
        _WITH_EMA.format(built_before="", built_after=_ADAMW),
        # Prismer: under its sharding flag the model is prepared first and the optimizer built
        # from the sharded parameters; the other arm prepares both in one call
        HEADER
        + "import torch\nif args.full_shard:\n    model = accelerator.prepare(model)\n"
        + "optimizer = torch.optim.AdamW(model.parameters())\n"
        + "if args.full_shard:\n"
        + "    optimizer, loader = accelerator.prepare(optimizer, loader)\n"
        + "else:\n"
        + "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n",
        # two trainers in one file: each prepares its own model with its own `optimizer`
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "class Box:\n"
        + "    def __init__(self, model, optimizer, accelerator):\n"
        + "        self.model, self.optimizer = accelerator.prepare(model, optimizer)\n\n\n"
        + "def train(policy):\n"
        + "    accelerator = Accelerator()\n"
        + "    optimizer = torch.optim.AdamW(policy.parameters())\n"
        + "    policy, optimizer = accelerator.prepare(policy, optimizer)\n",
        HEADER
        + "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n",
        # two training functions, each with its own `optimizer` for the model it is handed
        HEADER
        + "import torch\n\n\n"
        + "def train(model, loader):\n"
        + "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n\n\n"
        + "def distill(teacher, student, loader):\n"
        + "    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)\n"
        + "    student, optimizer, loader = accelerator.prepare(student, optimizer, loader)\n",
        # FSDP's documented order: the optimizer built from the prepared (sharded) parameters
        HEADER
        + "import torch\nmodel = accelerator.prepare(model)\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "optimizer, loader = accelerator.prepare(optimizer, loader)\n",
        HEADER
        + "model = accelerator.prepare(model)\n"
        + "optimizer = build_optimizer(model, cfg.optimizer)\n"
        + "optimizer = accelerator.prepare(optimizer)\n",
        # a federated trainer: train() builds the optimizer from the model it prepared; the
        # model that eval_one_loader() prepares later is that method's own local
        "import torch\n\n\nclass TaskTrainer:\n"
        + "    def train(self, model):\n"
        + "        model = self.accelerator.prepare(model)\n"
        + "        optimizer = self.create_optimizer(model, self.args.optimizer_mode)\n"
        + "        optimizer = self.accelerator.prepare(optimizer)\n"
        + "        self.accelerator.backward(model(1))\n\n"
        + "    def eval_one_loader(self, model, loader):\n"
        + "        model = self.accelerator.prepare(model)\n"
        + "        return [model(x) for x in loader]\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        placement = facts_of(script).placement
        for call in script.prepare_calls:
            for optimizer in _optimizers_reaching(script, call):
                models = parameter_owners(optimizer)
                if models & set(call.inputs):
                    continue
                model_prepares = [
                    o
                    for o in script.prepare_calls
                    if models & set(o.inputs)
                    and _same_model_object(script, o, optimizer)
                    and not placement.exclusive(o.call, call.call)
                ]
                if model_prepares and not _built_from_prepared(
                    script, script.order(optimizer.assign), models, model_prepares
                ):
                    several = next(
                        (o for o in model_prepares if len(_models_of(script, o, models)) > 1),
                        None,
                    )
                    if several is None:
                        yield self.finding(script, call.call)
                        break
                    prepared = ", ".join(_models_of(script, several, models))
                    yield self.finding(
                        script,
                        call.call,
                        message=(
                            f"Build {optimizer.name} after the prepare at line "
                            f"{script.line(several.call)}, from the prepared model's "
                            f"parameters: that call prepares several models ({prepared}), "
                            "which under FSDP must all be prepared before their optimizers "
                            "are made (one prepare of several models beside an optimizer "
                            f"raises ValueError), and {optimizer.name}, made before it and "
                            "prepared on its own, keeps updating the unsharded parameters"
                        ),
                    )
                    break


def _models_of(script: ScriptModel, prepare: PrepareCall, trained: set[str]) -> list[str]:
    """The models ``prepare`` takes: the ones the optimizer trains (``trained``), the ones the
    analysis names as models, and copies of one of them (``model_ema =
    deepcopy(model).eval()``, an EMA prepared beside its model)."""
    flow = facts_of(script).flow

    def a_model(name: str) -> bool:
        return (
            name in trained
            or flow.kind_of(name, prepare.call) is Kind.MODEL
            or flow.is_model_name(name, prepare.call)
        )

    found = []
    for name in prepare.inputs:
        if a_model(name):
            found.append(name)
            continue
        value = getattr(last_binding(script, name, prepare.call), "value", None)
        copies = [
            node.args[0].value
            for node in (walk(value) if value is not None else ())
            if isinstance(node, cst.Call)
            and dotted(node.func) in ("deepcopy", "copy.deepcopy")
            and node.args
        ]
        if any(a_model(dotted(copied) or "") for copied in copies):
            found.append(name)
    return found


def _built_from_prepared(
    script: ScriptModel, built: int | None, models: set[str], prepares: list[PrepareCall]
) -> bool:
    """The optimizer was created after ``model = accelerator.prepare(model)``, from the prepared
    model's parameters: the order FSDP documents, bound to the sharded parameters."""
    return built is not None and all(
        script.order(prepare.call) < built and models & set(prepare.outputs) for prepare in prepares
    )


def _same_model_object(script: ScriptModel, prepare: PrepareCall, optimizer: Binding) -> bool:
    """``prepare`` takes the very model ``optimizer`` was built from: it runs in the optimizer's
    function, at module level, or (``self.model``) in its class. A plain ``model`` prepared in
    another function is that function's own local (a federated trainer prepares the model it
    is handed in ``train`` and again in ``eval_one_loader``)."""
    placement = facts_of(script).placement
    scope = script.scope_of(prepare.call)
    if scope is optimizer.scope or isinstance(scope, cst.Module):
        return True
    owner = placement.class_of(prepare.call)
    return (
        owner is not None
        and owner is placement.class_of(optimizer.scope)
        and any(name.startswith("self.") for name in prepare.inputs)
    )


def _optimizers_reaching(script: ScriptModel, prepare: PrepareCall) -> list[Binding]:
    """For each optimizer name ``prepare`` takes, the binding it receives: the last one built
    before the call where the call can see it (an optimizer created again later, or another
    function's optimizer of the same name, is another object)."""
    found = []
    at = script.order(prepare.call)
    for name in prepare.inputs:
        visible = [
            b
            for b in script.of_kind(Kind.OPTIMIZER)
            if b.name == name and _built_where_prepared(script, b, prepare.call)
        ]
        before = [b for b in visible if script.order(b.assign) < at]
        if before or visible:
            found.append(max(before or visible, key=lambda b: script.order(b.assign)))
    return found


def _built_where_prepared(script: ScriptModel, optimizer: Binding, prepare: cst.Call) -> bool:
    """The optimizer is built where ``prepare`` can see it: in its function or at module
    level, or (``self.optimizer``) in its class. A file with several trainers reuses the name
    ``optimizer`` for optimizers of different models."""
    placement = facts_of(script).placement
    scope = script.scope_of(prepare)
    return (
        optimizer.scope is scope
        or isinstance(optimizer.scope, cst.Module)
        or (
            optimizer.name.startswith("self.")
            and placement.class_of(optimizer.scope) is not None
            and placement.class_of(optimizer.scope) is placement.class_of(prepare)
        )
    )
