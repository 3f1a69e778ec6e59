from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import Kind, PrepareCall, ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule, optimizer_models


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
    )
    good = (
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
        # FSDP's documented order: the optimizer built from the prepared (sharded) parameters
        HEADER
        + "import torch\nmodel = accelerator.prepare(model)\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "optimizer, loader = accelerator.prepare(optimizer, loader)\n",
        HEADER
        + "model = accelerator.prepare(model)\n"
        + "optimizer = build_optimizer(model, cfg.optimizer)\n"
        + "optimizer = accelerator.prepare(optimizer)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        owners = optimizer_models(script)
        built = {b.name: script.order(b.assign) for b in script.of_kind(Kind.OPTIMIZER)}
        for call in script.prepare_calls:
            for optimizer, models in owners.items():
                if not _built_where_prepared(script, optimizer, call.call):
                    continue  # another function's optimizer that happens to share the name
                apart = optimizer in call.inputs and not models & set(call.inputs)
                if not apart:
                    continue
                model_prepares = [o for o in script.prepare_calls if models & set(o.inputs)]
                if model_prepares and not _built_from_prepared(
                    script, built.get(optimizer), models, model_prepares
                ):
                    yield self.finding(script, call.call)


def _built_from_prepared(
    script: ScriptModel, built: int | None, models: set[str], prepares: list[PrepareCall]
) -> bool:
    """The optimizer was created after ``model = accelerator.prepare(model)``, from the prepared
    model's parameters: the order FSDP documents, bound to the sharded parameters."""
    return built is not None and all(
        script.order(prepare.call) < built and models & set(prepare.outputs) for prepare in prepares
    )


def _built_where_prepared(script: ScriptModel, optimizer: str, prepare: cst.Call) -> bool:
    """An optimizer of that name is built where ``prepare`` can see it: in its function or at
    module level, or (``self.optimizer``) in its class. A file with several trainers reuses
    the name ``optimizer`` for optimizers of different models."""
    placement = facts_of(script).placement
    bindings = [b for b in script.of_kind(Kind.OPTIMIZER) if b.name == optimizer]
    if not bindings:
        return True  # received, not built here: the owners' table is all there is
    scope = script.scope_of(prepare)
    return any(
        b.scope is scope
        or isinstance(b.scope, cst.Module)
        or (
            optimizer.startswith("self.")
            and placement.class_of(b.scope) is not None
            and placement.class_of(b.scope) is placement.class_of(prepare)
        )
        for b in bindings
    )
