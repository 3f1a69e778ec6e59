from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import backwards, last_binding, loss_sources
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, root_name
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls_accelerator

#: ``accelerator.<method>`` and ``accelerate.utils`` functions that concatenate every rank's
#: tensors with a collective autograd does not see through: the result has no grad_fn.
_GATHERS = frozenset({"gather", "gather_for_metrics"})
_GATHER_FUNCTIONS = frozenset({"accelerate.utils.gather", "accelerate.utils.operations.gather"})


class GatheredLoss(Rule):
    """A loss computed from what ``accelerator.gather`` (or ``gather_for_metrics``) returned and
    then backpropagated. The gather is a collective autograd does not see through: on more than
    one process its result carries no gradient, so ``accelerator.backward(loss)`` raises
    ``RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn``
    on every rank (observed with accelify's runtime and with HF Accelerate on 2 ranks). On one
    process ``gather`` returns the tensor itself and the script trains, which is why the bug
    shows only on the cluster. Where the loss adds other terms that do carry a gradient (a
    regulariser on the weights), the backward runs and the gathered term silently trains
    nothing.

    Compute the loss on this rank's own outputs (``criterion(logits, labels)``) and gather only
    for metrics or logging; DDP already averages the gradients over ranks. A loss that needs
    every rank's values on purpose (a contrastive loss over all negatives) uses a differentiable
    gather (``torch.distributed.nn.all_gather``, a custom autograd function), or keeps this
    rank's features in it beside the gathered ones; neither is reported. Nor is a loss that a
    forward of this rank reaches outside the gather (the gathered values then weigh or compare:
    advantages over every rank's rewards, negatives), a gathered count that only divides
    (``loss_sum / accelerator.gather(n_tokens).sum()``), a value computed under ``no_grad`` (a
    momentum encoder's keys), nor inputs gathered before a forward runs on them."""

    code = "ACC308"
    name = "gathered-loss"
    message = (
        "Compute the loss on this rank's outputs, not on gathered ones: accelerator.gather "
        "carries no gradient, so backward raises 'does not require grad' on more than one "
        "process (or silently drops this term); gather only for metrics"
    )
    why = (
        "A gathered tensor has no grad_fn on N processes: the backward fails on every rank, "
        "or the gathered part of the loss trains nothing."
    )
    bad = (
        Example(
            HEADER + "import torch.nn.functional as F\n"
            "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            "for x, y in loader:\n"
            "    logits = model(x)\n"
            "    preds = accelerator.gather(logits)\n"
            "    labels_all = accelerator.gather(y)\n"
            "    loss = F.cross_entropy(preds, labels_all)\n"
            "    accelerator.backward(loss)\n"
            "    optimizer.step()\n",
            7,
            13,
        ),
        Example(  # gathered together for metrics, and the loss taken from the same tuple
            HEADER + "model, loader = accelerator.prepare(model, loader)\n"
            "for batch in loader:\n"
            "    outputs = model(**batch)\n"
            "    preds, refs = accelerator.gather_for_metrics((outputs.logits, batch['labels']))\n"
            "    loss = criterion(preds, refs)\n"
            "    loss.backward()\n",
            6,
            19,
        ),
        Example(  # a trainer whose compute_loss gathers; the step backwards what it returns
            "from accelerate import Accelerator\n"
            "class Trainer:\n"
            "    def __init__(self, model):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.model = self.accelerator.prepare(model)\n"
            "    def compute_loss(self, batch):\n"
            "        logits = self.model(batch['x'])\n"
            "        logits = self.accelerator.pad_across_processes(logits, dim=1)\n"
            "        logits = self.accelerator.gather(logits)\n"
            "        labels = self.accelerator.gather(batch['y'])\n"
            "        return self.criterion(logits, labels)\n"
            "    def step(self, batch):\n"
            "        loss = self.compute_loss(batch)\n"
            "        self.accelerator.backward(loss)\n",
            9,
            18,
        ),
        Example(  # a helper handed the accelerator; a local term keeps the backward running
            "from accelerate import Accelerator\n"
            "def train_step(accelerator, model, batch, reg):\n"
            "    x, y = batch\n"
            "    out = model(x)\n"
            "    all_out = accelerator.gather(out)\n"
            "    loss = mse(all_out, accelerator.gather(y)) + reg * model.weight.norm()\n"
            "    accelerator.backward(loss)\n"
            "def main():\n"
            "    accelerator = Accelerator()\n"
            "    model = accelerator.prepare(Net())\n"
            "    for batch in loader:\n"
            "        train_step(accelerator, model, batch, 0.01)\n",
            5,
            15,
        ),
    )
    good = (
        # the loss on local outputs; gathered only to be logged
        HEADER + "for x, y in loader:\n"
        "    logits = model(x)\n"
        "    loss = criterion(logits, y)\n"
        "    accelerator.backward(loss)\n"
        "    all_losses = accelerator.gather(loss.detach())\n"
        "    accelerator.print(all_losses.mean().item())\n",
        # evaluation: gathered predictions for the metric, no backward of them
        HEADER + "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    accelerator.backward(loss)\n"
        "with torch.no_grad():\n"
        "    for x, y in eval_loader:\n"
        "        preds, refs = accelerator.gather_for_metrics((model(x), y))\n"
        "        metric.add_batch(predictions=preds, references=refs)\n",
        # a contrastive loss with a differentiable all-gather (torch.distributed.nn)
        HEADER + "import torch.distributed.nn as dist_nn\n"
        "for x, y in loader:\n"
        "    z = model(x)\n"
        "    all_z = torch.cat(dist_nn.all_gather(z))\n"
        "    loss = info_nce(z, all_z)\n"
        "    accelerator.backward(loss)\n",
        # a custom autograd gather (SimCLR's GatherLayer)
        HEADER + "class GatherLayer(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        return x\n"
        "for x, y in loader:\n"
        "    z = model(x)\n"
        "    loss = info_nce(torch.cat(GatherLayer.apply(z)))\n"
        "    accelerator.backward(loss)\n",
        # open_clip's default: every rank's features as negatives, this rank's kept in the loss
        HEADER + "for images, texts in loader:\n"
        "    img, txt = model(images, texts)\n"
        "    all_img = accelerator.gather(img)\n"
        "    all_txt = accelerator.gather(txt)\n"
        "    loss = (ce(img @ all_txt.T, labels) + ce(txt @ all_img.T, labels)) / 2\n"
        "    accelerator.backward(loss)\n",
        # MoCo: keys from the momentum encoder, under no_grad, gathered as negatives
        HEADER + "for q_in, k_in in loader:\n"
        "    q = model(q_in)\n"
        "    with torch.no_grad():\n"
        "        k = key_encoder(k_in)\n"
        "        k_all = accelerator.gather(k)\n"
        "    loss = ce(q @ k_all.T, labels)\n"
        "    accelerator.backward(loss)\n",
        # HF Trainer's token average: the gathered count only divides
        HEADER + "for batch in loader:\n"
        "    loss_sum = model(**batch).loss_sum\n"
        "    n_tokens = accelerator.gather(batch['n']).sum()\n"
        "    loss = loss_sum / n_tokens\n"
        "    accelerator.backward(loss)\n",
        # RL: advantages normalised over every rank's rewards weigh this rank's log-probs
        HEADER + "model, reward_model, loader = accelerator.prepare(model, reward_model, loader)\n"
        "for batch in loader:\n"
        "    all_rewards = accelerator.gather(reward_model(batch['completions']))\n"
        "    advantages = (all_rewards - all_rewards.mean()) / all_rewards.std()\n"
        "    logprobs = model(batch['input_ids']).log_softmax(-1)\n"
        "    loss = -(logprobs * advantages[process_slice]).mean()\n"
        "    accelerator.backward(loss)\n",
        # Accelerate's test_sync: every rank's inputs gathered, then a forward of its own
        # reference model on them (the gradient flows through the forward after the gather)
        HEADER + "def step_model(model, inputs, target, accelerator):\n"
        "    loss = F.mse_loss(model(inputs), target)\n"
        "    accelerator.backward(loss)\n"
        "model, ddp_model, dataloader = get_training_setup(accelerator)\n"
        "ddp_input, ddp_target = next(iter(dataloader)).values()\n"
        "inputs, target = accelerator.gather((ddp_input, ddp_target))\n"
        "step_model(model, inputs, target, accelerator)\n",
        # labels gathered beside a local loss: nothing differentiable went through the gather
        HEADER + "for x, y in loader:\n"
        "    logits = model(x)\n"
        "    y_all = accelerator.gather(y)\n"
        "    loss = criterion(logits, y) + 0 * y_all.float().mean()\n"
        "    accelerator.backward(loss)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        reported: set[int] = set()
        for backward in backwards(script):
            gather = _gathered_output(script, backward.loss, backward.call)
            if gather is not None and id(gather) not in reported:
                reported.add(id(gather))
                yield self.finding(script, gather)


def _gathered_output(
    script: ScriptModel, loss: cst.BaseExpression, at: cst.CSTNode
) -> cst.Call | None:
    """The first gather on ``loss``'s path whose gathered tensor is computed with a gradient
    and reaches the loss only through the gather (this rank's copy is not in the loss too)."""
    forward = facts_of(script).flow.is_forward
    gathers = [  # a gather inside a forward's arguments gathered its inputs: the model runs after
        node
        for node in loss_sources(script, loss, at, stop_at=forward)
        if isinstance(node, cst.Call) and _is_gather(script, node)
    ]
    if not gathers:
        return None  # (most losses: the walks below are not needed)
    if _local_forward(script, loss, at):
        return None  # trained through this rank's forward: what it gathered weighs or compares
    local = _local_reads(script, loss, at)
    for gather in sorted(gathers, key=script.order):
        gathered = gather.args[0].value
        if _origins(script, gathered, gather) & local:
            continue  # this rank's copy is in the loss: it carries the gradient
        if _computed_with_gradient(script, gathered, gather):
            return gather
    return None


def _local_forward(script: ScriptModel, loss: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """A forward of this rank reaches the loss outside any gather (``logprobs`` of the policy
    weighted by gathered advantages, features scored against gathered negatives): the loss
    trains through it, and whatever it gathered is a weight, a target or a negative."""
    forward = facts_of(script).flow.is_forward
    return any(
        isinstance(node, cst.Call) and forward(node)
        for node in loss_sources(script, loss, at, stop_at=lambda c: _is_gather(script, c))
    )


def _local_reads(script: ScriptModel, loss: cst.BaseExpression, at: cst.CSTNode) -> set[int | str]:
    """What the loss reads outside any gather: the nodes on its path (by id), and the names it
    reads that no binding above explains (a helper's parameters, by name)."""
    found: set[int | str] = set()
    for node in loss_sources(script, loss, at, stop_at=lambda c: _is_gather(script, c)):
        found.add(id(node))
        if isinstance(node, cst.Name):
            found.add(node.value)
    return found


def _origins(script: ScriptModel, gathered: cst.BaseExpression, gather: cst.Call) -> set[int | str]:
    """The gathered tensor's own value: for a name (or ``outputs.logits``) what it was last
    bound to above the gather, the same node the loss reaches if it reads this rank's copy, or
    the name itself where nothing here binds it (a parameter); an element each of a tuple. An
    expression computed inside the gather's call is read nowhere else."""
    if isinstance(gathered, (cst.Tuple, cst.List)):
        return {
            origin
            for element in gathered.elements
            for origin in _origins(script, element.value, gather)
        }
    name = root_name(gathered) if isinstance(gathered, (cst.Name, cst.Attribute)) else None
    if name is None:
        return set()
    binding = last_binding(script, name, gather)
    if binding is None or binding.value is None:
        return {name}
    return {id(binding.value)}


def _is_gather(script: ScriptModel, call: cst.Call) -> bool:
    if not call.args:
        return False
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _GATHERS:
        accelerators = facts_of(script).flow.names_of(Kind.ACCELERATOR)
        return calls_accelerator(script, call, _GATHERS, accelerators)
    return bool(script.call_names(call) & _GATHER_FUNCTIONS)


def _computed_with_gradient(
    script: ScriptModel, gathered: cst.BaseExpression, gather: cst.Call
) -> bool:
    """The gathered value is a model's output (a forward, or a function of the file that runs
    one), not data read from a loader (``next(iter(loader))``, a model's input that a forward
    reads after the gather), nor a value computed under ``no_grad``."""
    if _under_no_grad(script, gather):
        return False
    facts = facts_of(script)
    for node in loss_sources(script, gathered, gather):
        if isinstance(node, cst.Name):
            binding = last_binding(script, node.value, gather)
            if binding is not None and _under_no_grad(script, binding):
                return False
            if facts.flow.kind_of(node.value, gather) is Kind.DATALOADER:
                return False
        if isinstance(node, cst.Call):
            if dotted(node.func) in ("next", "iter"):
                return False  # a batch drawn from a loader
            if facts.flow.is_forward(node) or facts.calls.targets(node):
                return not _under_no_grad(script, node)
    return False


def _under_no_grad(script: ScriptModel, node: cst.CSTNode) -> bool:
    return any(script.disables_grad(ancestor) for ancestor in script.ancestors(node))
