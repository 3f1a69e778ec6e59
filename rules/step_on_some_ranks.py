from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, unwrapped_argument, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, prepared

_EPOCHS = (
    "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "for epoch in range(10):\n"
    "    for x, y in loader:\n"
    "        accelerator.backward((model(x) - y).pow(2).mean())\n"
    "        optimizer.step()\n"
)

_TRAIN = (
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "for x, y in loader:\n"
    "    accelerator.backward((model(x) - y).pow(2).mean())\n"
    "    optimizer.step()\n"
)


class StepOnSomeRanks(Rule):
    """An optimizer or LR scheduler stepped under ``if accelerator.is_main_process:`` (or any
    test of the rank). Every rank holds a replica of the model and its own copy of the
    optimizer and scheduler; DDP averages the gradients, but each rank applies them with its own
    optimizer. Stepped on the main process alone, the scheduler moves only that rank's learning
    rate (the others keep the first one), or only that rank updates its weights: the replicas
    drift apart from the first step on, silently. Under DeepSpeed and FSDP the step itself is
    collective, and the run hangs there. The same holds for a prepared model's weights loaded
    (``model.module.load_state_dict(...)``) or an optimizer's learning rate rewritten
    (``group["lr"] *= 0.5`` over its ``param_groups``) under a rank test inside a loop that
    goes on training: DDP never re-syncs weights or learning rates."""

    code = "ACC307"
    name = "step-on-some-ranks"
    message = (
        "Step this on every rank, outside the rank test: each rank steps its own copy, and "
        "stepped on one rank only, the replicas' learning rates and weights drift apart"
    )
    why = "Every rank must apply the same update with the same learning rate."
    bad = (
        Example(
            HEADER
            + "import torch\nscheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n"
            + _TRAIN
            + "    if accelerator.is_main_process:\n        scheduler.step()\n",
            10,
            9,
        ),
        Example(
            HEADER
            + "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for x, y in loader:\n"
            + "    accelerator.backward((model(x) - y).pow(2).mean())\n"
            + "    if accelerator.is_main_process:\n        optimizer.step()\n",
            9,
            9,
        ),
        # a T5 trainer falls back to its best checkpoint on the main process only, and halves
        # that rank's learning rate: the other replicas keep training their own weights
        Example(
            HEADER
            + _EPOCHS
            + "    if accelerator.is_main_process and worse:\n"
            + "        model.module.load_state_dict(torch.load('best.pt'))\n",
            11,
            9,
        ),
        Example(
            HEADER
            + _EPOCHS
            + "    if accelerator.is_main_process and worse:\n"
            + "        for group in optimizer.param_groups:\n"
            + "            group['lr'] = group['lr'] * 0.5\n",
            12,
            13,
        ),
    )
    good = (
        # every rank falls back to the best checkpoint and halves its learning rate
        HEADER
        + _EPOCHS
        + "    if worse:\n"
        + "        accelerator.unwrap_model(model).load_state_dict(torch.load('best.pt'))\n"
        + "        for group in optimizer.param_groups:\n"
        + "            group['lr'] *= 0.5\n",
        # the best weights loaded on the main process once training is over, to evaluate them
        HEADER
        + _EPOCHS
        + "if accelerator.is_main_process:\n"
        + "    accelerator.unwrap_model(model).load_state_dict(torch.load('best.pt'))\n",
        HEADER
        + "import torch\nscheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n"
        + _TRAIN
        + "    scheduler.step()\n"
        + "    if accelerator.is_main_process:\n        print(scheduler.get_last_lr())\n",
        # stepped when gradients synchronise: the same on every rank
        HEADER
        + "import torch\nscheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n"
        + _TRAIN
        + "    if accelerator.sync_gradients:\n        scheduler.step()\n",
        # a rank that raises ends the whole run (the launcher stops the others): the step below
        # the test is not taken by some ranks while the others go on
        HEADER
        + "import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "def update(x, y):\n"
        + "    if accelerator.process_index == 1 and not torch.isfinite(x).all():\n"
        + "        raise RuntimeError('non-finite batch on rank 1')\n"
        + "    accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "    optimizer.step()\n"
        + "for x, y in loader:\n"
        + "    update(x, y)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        stepped = facts.flow.names_of(Kind.OPTIMIZER) | facts.flow.names_of(Kind.SCHEDULER)
        for call in calls(script):
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "step"
                and dotted(func.value) in stepped
                and facts.ranks.under_rank_guard(call)
            ):
                yield self.finding(script, call)
        yield from self._changed_on_one_rank(script)

    def _changed_on_one_rank(self, script: ScriptModel) -> Iterator[Finding]:
        """The weights of a prepared model loaded (``model.module.load_state_dict(torch.load(
        best))``, a code-merging T5 trainer's fallback to its best checkpoint) or an optimizer's
        learning rate rewritten (``g['lr'] *= 0.5`` over its ``param_groups``) under a rank
        test, in a loop that goes on training: only that rank's replica changes, and DDP, which
        averages gradients and never the weights or the learning rates, keeps them apart from
        then on."""
        facts = facts_of(script)
        optimizers = facts.flow.names_of(Kind.OPTIMIZER)
        for node in script.index.of_type((cst.Call, cst.Assign, cst.AugAssign)):
            what = None
            if type(node) is cst.Call:
                what = _weights_loaded(script, node)  # type: ignore[arg-type]
            else:
                what = _learning_rate_written(script, node, optimizers)  # type: ignore[arg-type]
            if what is None or not facts.ranks.under_rank_guard(node):
                continue
            loop = _training_loop_around(script, node)
            if loop is None:
                continue
            message = (
                f"Do this on every rank, outside the rank test: it changes {what} on this rank "
                f"only, while the loop at line {script.line(loop)} goes on training every "
                "replica, and DDP averages gradients, never weights or learning rates: the "
                "replicas drift apart from here on, silently"
            )
            yield self.finding(script, node, message=message)


def _weights_loaded(script: ScriptModel, call: cst.Call) -> str | None:
    """``model.load_state_dict(...)``, ``model.module.load_state_dict(...)`` or
    ``accelerator.unwrap_model(model).load_state_dict(...)`` of a prepared model."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "load_state_dict"):
        return None
    owner = func.value
    if isinstance(owner, cst.Attribute) and owner.attr.value == "module":
        owner = owner.value
    else:
        owner = unwrapped_argument(owner) or owner
    name = dotted(owner)
    not_models = script.names_of(Kind.OPTIMIZER, Kind.SCHEDULER, Kind.DATALOADER)
    if name is None or name in not_models or name not in prepared(script, call):
        return None
    return f"the weights of {name}"


def _learning_rate_written(
    script: ScriptModel, node: cst.Assign | cst.AugAssign, optimizers: set[str]
) -> str | None:
    """``g['lr'] = ...`` (or ``*=``) where ``g`` walks ``optimizer.param_groups``."""
    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
    for target in targets:
        if not (
            isinstance(target, cst.Subscript)
            and len(target.slice) == 1
            and isinstance(target.slice[0].slice, cst.Index)
            and isinstance(target.slice[0].slice.value, cst.SimpleString)
            and target.slice[0].slice.value.evaluated_value == "lr"
        ):
            continue
        group = dotted(target.value)
        for ancestor in script.ancestors(node):
            if (
                isinstance(ancestor, cst.For)
                and dotted(ancestor.target) == group
                and (dotted(ancestor.iter) or "").endswith(".param_groups")
                and (dotted(ancestor.iter) or "").rsplit(".", 1)[0] in optimizers
            ):
                return f"the learning rate of {dotted(ancestor.iter).rsplit('.', 1)[0]}"
    return None


def _training_loop_around(script: ScriptModel, node: cst.CSTNode) -> cst.For | cst.While | None:
    """The innermost loop around ``node``, in its function, that trains: a backward in it or in
    a function of the file it calls (two calls deep)."""
    facts = facts_of(script)
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return None
        if isinstance(ancestor, (cst.For, cst.While)) and facts.flow.reaches(
            ancestor, 2, _has_backward
        ):
            return ancestor
    return None


def _has_backward(node: cst.CSTNode) -> bool:
    return any(
        isinstance(n, cst.Call)
        and isinstance(n.func, cst.Attribute)
        and n.func.attr.value == "backward"
        for n in walk(node)
    )
