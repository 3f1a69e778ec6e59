from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.flow import SchedulerStep
from accelify.analysis.objects import is_plateau_scheduler
from accelify.analysis.own_values import OwnValues
from accelify.analysis.prepare_outputs import renamed_from
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import argument_value, dotted, has_parameter
from accelify.lint.rule import Example, Finding, Rule, accelerator_name, in_file_words

_SCRIPT = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "accelerator = Accelerator()\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=2)\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "for epoch in range(10):\n"
    "    total = 0.0\n"
    "    for x, y in loader:\n"
    "        loss = loss_fn(model(x), y)\n"
    "        accelerator.backward(loss)\n"
    "        optimizer.step()\n"
    "        optimizer.zero_grad()\n"
    "        total += loss.item()\n"
)
#: A metric object of the file whose ``update`` sums each batch's ``.item()``: one instance per
#: split, the training one updated per batch of this rank's shard; ``{step}`` ends each epoch.
_METRIC_OBJECTS = (
    "import torch\n"
    "from accelerate import Accelerator\n\n\n"
    "class MSEMetric:\n"
    "    def __init__(self):\n"
    "        self.sse, self.count = 0.0, 0\n\n"
    "    def update(self, pred, target):\n"
    "        self.sse += ((pred - target) ** 2).sum().item()\n"
    "        self.count += target.numel()\n\n"
    "    def compute(self):\n"
    "        return self.sse / max(self.count, 1)\n\n\n"
    "accelerator = Accelerator()\n"
    "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)\n"
    "model, optimizer, loader, val_loader = accelerator.prepare(\n"
    "    model, optimizer, loader, val_loader\n"
    ")\n"
    "train_metric, val_metric = MSEMetric(), MSEMetric()\n"
    "for epoch in range(10):\n"
    "    for x, y in loader:\n"
    "        pred = model(x)\n"
    "        accelerator.backward(torch.nn.functional.mse_loss(pred, y))\n"
    "        optimizer.step()\n"
    "        train_metric.update(pred.detach(), y)\n"
    "    with torch.no_grad():\n"
    "        for x, y in val_loader:\n"
    "            val_metric.update(*accelerator.gather_for_metrics((model(x), y)))\n"
    "{step}"
)
#: A validation loss summed over this rank's shard of a prepared loader, before it is reduced.
_VALIDATED = (
    _SCRIPT.replace("model, optimizer, loader =", "model, optimizer, loader, val_loader =")
    .replace("(model, optimizer, loader)\n", "(model, optimizer, loader, val_loader)\n")
    .replace("import torch\n", "import torch\nimport torch.distributed as dist\n")
    + "    val_loss = torch.zeros(1, device=accelerator.device)\n"
    + "    with torch.no_grad():\n"
    + "        for x, y in val_loader:\n"
    + "            val_loss += loss_fn(model(x), y)\n"
)
_TRAINER = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "class Trainer:\n"
    "    def __init__(self, model, train_loader, val_loader):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.optimizer = torch.optim.AdamW(model.parameters())\n"
    "        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer)\n"
    "        self.model, self.optimizer, self.train_loader, self.val_loader = (\n"
    "            self.accelerator.prepare(model, self.optimizer, train_loader, val_loader)\n"
    "        )\n"
    "    def evaluate(self):\n"
    "        total = 0.0\n"
    "        with torch.no_grad():\n"
    "            for x, y in self.val_loader:\n"
    "                total += loss_fn(self.model(x), y).item()\n"
)

#: Helpers return (loss, accuracy) per epoch, zipped with their names into one dict: the
#: training loss is this rank's own, the validation loss is reduced over the ranks.
_ZIPPED = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "def train_epoch(accelerator, model, optimizer, loader):\n"
    "    total = 0.0\n"
    "    for x, y in loader:\n"
    "        loss = loss_fn(model(x), y)\n"
    "        accelerator.backward(loss)\n"
    "        optimizer.step()\n"
    "        total += loss.item()\n"
    "    return total / len(loader), 0.0\n"
    "def valid_epoch(accelerator, model, loader):\n"
    "    total = torch.zeros(1, device=accelerator.device)\n"
    "    with torch.no_grad():\n"
    "        for x, y in loader:\n"
    "            total += loss_fn(model(x), y)\n"
    '    total = accelerator.reduce(total, "mean")\n'
    "    return total.item() / len(loader), 0.0\n"
    "accelerator = Accelerator()\n"
    "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)\n"
    "model, optimizer, loader, val_loader = accelerator.prepare(\n"
    "    model, optimizer, loader, val_loader\n)\n"
    "keys = ['train_loss', 'train_acc', 'val_loss', 'val_acc']\n"
    "for epoch in range(10):\n"
    "    metrics = dict(zip(keys, [\n"
    "        *train_epoch(accelerator, model, optimizer, loader),\n"
    "        *valid_epoch(accelerator, model, val_loader),\n"
    "    ]))\n"
)


#: A trainer handed its ReduceLROnPlateau as a constructor parameter, keeping and preparing it
#: (realconv37's word2vec-style Trainer), stepping it on the mean of its epoch's losses.
_HANDED_TRAINER = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "\n"
    "\n"
    "class Trainer:\n"
    "    def __init__(self, model, loader, optimizer, lr_scheduler):\n"
    "        self.lr_scheduler = lr_scheduler\n"
    "        self.accelerator = Accelerator(step_scheduler_with_optimizer=False)\n"
    "        self.model, self.optimizer, self.loader, self.lr_scheduler = "
    "self.accelerator.prepare(\n"
    "            model, optimizer, loader, self.lr_scheduler\n"
    "        )\n"
    "\n"
    "    def train(self, epochs):\n"
    "        for _ in range(epochs):\n"
    "            epoch_loss = self._train_epoch()\n"
    "            self.lr_scheduler.step(epoch_loss)\n"
    "\n"
    "    def _train_epoch(self):\n"
    "        total = 0.0\n"
    "        for x, y in self.loader:\n"
    "            self.optimizer.zero_grad()\n"
    "            loss = torch.nn.functional.cross_entropy(self.model(x), y)\n"
    "            self.accelerator.backward(loss)\n"
    "            self.optimizer.step()\n"
    "            total += loss.item()\n"
    "        return total / len(self.loader)\n"
    "\n"
    "\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.5)\n"
    "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=1)\n"
    "Trainer(model, loader, optimizer, scheduler).train(3)\n"
)

#: The same trainer preparing straight from its constructor's parameter: ``self.lr_scheduler``
#: is bound only by the prepare, from the ``lr_scheduler`` every construction hands it.
_PREPARED_FROM_PARAMETERS = _HANDED_TRAINER.replace(
    "        self.lr_scheduler = lr_scheduler\n", ""
).replace(
    "model, optimizer, loader, self.lr_scheduler\n", "model, optimizer, loader, lr_scheduler\n"
)
#: The script's scheduler prepared under another name, stepped by that name.
_RENAMED = _SCRIPT.replace(
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n",
    "model, optimizer, loader, plateau = accelerator.prepare(\n"
    "    model, optimizer, loader, scheduler\n)\n",
)


class PlateauMetricPerRank(Rule):
    """``ReduceLROnPlateau.step(metric)`` lowers the learning rate when ``metric`` stops
    improving. Every rank steps its own scheduler; fed a value each rank computed alone (the
    training loss summed from its ``loss.item()``, a validation loss over its shard of a prepared
    DataLoader, never gathered or reduced), each rank sees a different curve and lowers its
    learning rate at a different epoch. From then on the ranks' optimizers apply different
    steps to the gradients DDP still averages, and the replicas drift apart: a silently wrong
    run, on our runtime and on Hugging Face Accelerate, with or without preparing the
    scheduler. One process hides it.

    Fix: step with the mean over ranks, ``accelerator.reduce(torch.tensor(metric,
    device=accelerator.device), "mean").item()``, or gather the per-sample losses with
    ``accelerator.gather_for_metrics`` before averaging. Not reported: a metric reduced,
    gathered or broadcast before the step (also in place: ``dist.all_reduce(val_loss)``); one
    computed over a loader that was not prepared (every rank sees all of it: another rule's
    business); any scheduler other than ``ReduceLROnPlateau`` (handed its epoch, not a
    metric)."""

    code = "ACC409"
    name = "plateau-metric-per-rank"
    message = (
        "Step ReduceLROnPlateau with the metric reduced over ranks "
        '(accelerator.reduce(metric, "mean")): with this rank\'s own value each rank lowers its '
        "learning rate at a different epoch, and the replicas train apart"
    )
    why = "Each rank's plateau scheduler sees its own shard's metric and decays on its own."
    bad = (
        # the scheduler is a constructor parameter of the trainer: the caller made it
        Example(_HANDED_TRAINER, 16, 13),
        # ... prepared straight from the parameter, or renamed by prepare (lintfix25's misses)
        Example(_PREPARED_FROM_PARAMETERS, 15, 13),
        Example(_RENAMED + "    plateau.step(total / len(loader))\n", 17, 5),
        Example(_SCRIPT + "    scheduler.step(total / len(loader))\n", 15, 5),
        Example(  # the metric object's training instance: its update sums this rank's batches
            _METRIC_OBJECTS.format(step="    scheduler.step(train_metric.compute())\n"), 32, 5
        ),
        Example(  # stepped per batch with this rank's loss
            _SCRIPT.replace("        total += loss.item()\n", "        scheduler.step(loss)\n"),
            14,
            9,
        ),
        Example(  # a trainer: the validation loss of this rank's shard, from a method
            _TRAINER
            + "        return total / len(self.val_loader)\n"
            + "    def fit(self, epochs):\n"
            + "        for epoch in range(epochs):\n"
            + "            val_loss = self.evaluate()\n"
            + "            self.scheduler.step(val_loss)\n",
            20,
            13,
        ),
        Example(  # a factory makes it; a helper gets the accelerator and the scheduler
            "import torch\n"
            "from accelerate import Accelerator\n"
            "def build_scheduler(optimizer):\n"
            "    return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5)\n"
            "def train_epoch(accelerator, model, optimizer, loader):\n"
            "    losses = []\n"
            "    for x, y in loader:\n"
            "        loss = model(x, y)\n"
            "        accelerator.backward(loss)\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n"
            "        losses.append(loss.item())\n"
            "    return sum(losses) / len(losses)\n"
            "def fit(accelerator, model, optimizer, loader, scheduler, epochs):\n"
            "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            "    for epoch in range(epochs):\n"
            "        train_loss = train_epoch(accelerator, model, optimizer, loader)\n"
            "        scheduler.step(train_loss)\n"
            "def main():\n"
            "    accelerator = Accelerator()\n"
            "    model = torch.nn.Linear(4, 1)\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    scheduler = build_scheduler(optimizer)\n"
            "    fit(accelerator, model, optimizer, make_loader(), scheduler, 5)\n",
            18,
            9,
        ),
        Example(  # reduced, but the reduced copy is dropped: accelerator.reduce is not in place
            _VALIDATED
            + '    accelerator.reduce(val_loss, "mean")\n'
            + "    scheduler.step(val_loss.item())\n",
            21,
            5,
        ),
        Example(  # logits.gather(1, y) picks each sample's logit: an index, not a collective
            _VALIDATED.replace(
                "val_loss += loss_fn(model(x), y)",
                "val_loss -= model(x).log_softmax(-1).gather(1, y[:, None]).sum()",
            )
            + "    scheduler.step(val_loss.item())\n",
            20,
            5,
        ),
        Example(  # the entry zipped with "train_loss": the training loss of this rank alone
            _ZIPPED + "    scheduler.step(metrics['train_loss'])\n", 29, 5
        ),
    )
    good = (
        # the trainer prepared straight from its parameter, its epoch loss reduced; a StepLR
        # handed in the same way; the renamed scheduler stepped with the reduced value
        _PREPARED_FROM_PARAMETERS.replace(
            "        return total / len(self.loader)\n",
            "        total = self.accelerator.reduce(\n"
            "            torch.tensor(total, device=self.accelerator.device), 'mean'\n"
            "        ).item()\n"
            "        return total / len(self.loader)\n",
        ),
        _PREPARED_FROM_PARAMETERS.replace(
            "ReduceLROnPlateau(optimizer, patience=1)", "StepLR(optimizer, 1)"
        ).replace("self.lr_scheduler.step(epoch_loss)", "self.lr_scheduler.step()"),
        _RENAMED
        + "    mean = accelerator.reduce(torch.tensor(total, device=accelerator.device), 'mean')\n"
        + "    plateau.step(mean.item())\n",
        # the trainer's epoch loss reduced over the ranks before it is returned
        _HANDED_TRAINER.replace(
            "        return total / len(self.loader)\n",
            "        total = self.accelerator.reduce(\n"
            "            torch.tensor(total, device=self.accelerator.device), 'mean'\n"
            "        ).item()\n"
            "        return total / len(self.loader)\n",
        ),
        # a StepLR handed in the same way steps on its epoch count, not a metric
        _HANDED_TRAINER.replace(
            "ReduceLROnPlateau(optimizer, patience=1)", "StepLR(optimizer, 1)"
        ).replace("self.lr_scheduler.step(epoch_loss)", "self.lr_scheduler.step()"),
        # the validation instance of the same class, updated with gathered outputs
        _METRIC_OBJECTS.format(step="    scheduler.step(val_metric.compute())\n"),
        # the entry zipped with "val_loss" is the validation loss reduced in its helper (the
        # training loss beside it in the dict is no part of it)
        _ZIPPED + "    scheduler.step(metrics['val_loss'])\n",
        _ZIPPED.replace("dict(zip(keys, [", "{k: v for k, v in zip(keys, [").replace(
            "    ]))\n", "    ])}\n"
        )
        + "    scheduler.step(metrics['val_loss'])\n",
        # reduced in place over ranks first (torch.distributed writes into its argument)
        _VALIDATED + "    dist.all_reduce(val_loss)\n    scheduler.step(val_loss.item())\n",
        # reduced, and the reduced value assigned back to the metric's name
        _VALIDATED
        + '    val_loss = accelerator.reduce(val_loss, "mean")\n'
        + "    scheduler.step(val_loss.item())\n",
        # reduced over ranks first
        _SCRIPT
        + "    mean = accelerator.reduce(torch.tensor(total / len(loader)), 'mean')\n"
        + "    scheduler.step(mean.item())\n",
        # reduced in the step's argument
        _SCRIPT + "    scheduler.step(accelerator.reduce(torch.tensor(total), 'mean').item())\n",
        # per-sample losses gathered before averaging
        _TRAINER.replace(
            "                total += loss_fn(self.model(x), y).item()\n",
            "                losses = loss_fn(self.model(x), y, reduction='none')\n"
            "                total += self.accelerator.gather_for_metrics(losses).sum().item()\n",
        )
        + "        return total / len(self.val_loader.dataset)\n"
        + "    def fit(self, epochs):\n"
        + "        for epoch in range(epochs):\n"
        + "            self.scheduler.step(self.evaluate())\n",
        # computed on the main process over the whole set, then broadcast
        "import torch\n"
        "from accelerate import Accelerator\n"
        "from accelerate.utils import broadcast\n"
        "accelerator = Accelerator()\n"
        "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "for epoch in range(10):\n"
        "    train_one_epoch(model, optimizer, loader)\n"
        "    metric = torch.zeros(1, device=accelerator.device)\n"
        "    if accelerator.is_main_process:\n"
        "        metric += evaluate(accelerator.unwrap_model(model), full_val_loader)\n"
        "    metric = broadcast(metric)\n"
        "    scheduler.step(metric.item())\n",
        # a loader that was never prepared: every rank sees all of it, the same metric
        "import torch\n"
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "for epoch in range(10):\n"
        "    train_one_epoch(model, optimizer, loader)\n"
        "    total = 0.0\n"
        "    with torch.no_grad():\n"
        "        for x, y in val_loader:\n"
        "            total += loss_fn(model(x), y).item()\n"
        "    scheduler.step(total)\n",
        # predictions and labels gathered in the loop, then summed: every rank sums them all
        "import torch\n"
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)\n"
        "model, optimizer, loader, val_loader = accelerator.prepare(\n"
        "    model, optimizer, loader, val_loader\n)\n"
        "for epoch in range(10):\n"
        "    train_one_epoch(model, optimizer, loader)\n"
        "    val_loss = 0.0\n"
        "    with torch.no_grad():\n"
        "        for x, y in val_loader:\n"
        "            outputs = model(x)\n"
        "            outputs, y = accelerator.gather_for_metrics((outputs, y))\n"
        "            val_loss += loss_fn(outputs, y, reduction='sum').item()\n"
        "    scheduler.step(val_loss / len(val_loader.dataset))\n",
        # one helper trains on the prepared loader and evaluates the unprepared one: the step
        # reads what it returns for the unprepared one
        "import torch\n"
        "from accelerate import Accelerator\n"
        "def run_epoch(accelerator, model, loader, optimizer=None):\n"
        "    total, count = 0.0, 0\n"
        "    for x, y in loader:\n"
        "        loss = loss_fn(model(x), y)\n"
        "        if optimizer is not None:\n"
        "            accelerator.backward(loss)\n"
        "            optimizer.step()\n"
        "        total += loss.item() * y.size(0)\n"
        "        count += y.size(0)\n"
        "    return total / count\n"
        "accelerator = Accelerator()\n"
        "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)\n"
        "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)\n"
        "for epoch in range(10):\n"
        "    run_epoch(accelerator, model, train_loader, optimizer)\n"
        "    scheduler.step(run_epoch(accelerator, model, val_loader))\n",
        # not a plateau scheduler: handed its epoch
        _SCRIPT.replace("ReduceLROnPlateau(optimizer, patience=2)", "StepLR(optimizer, 3)")
        + "    scheduler.step(epoch + 1)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        flow = facts.flow
        schedulers = flow.names_of(Kind.SCHEDULER)
        stepped = [
            step.call
            for step in flow.scheduler_steps(schedulers)
            if step.scheduler is not None and _plateau(script, step)
        ]
        for call in stepped:
            metric = _metric(call)
            if metric is None:
                continue
            origin = OwnValues(facts).origin(metric, call, {})
            if origin is None:
                continue
            yield self.finding(script, call, message=_message(self, script, call, origin))


def _plateau(script: ScriptModel, step: SchedulerStep) -> bool:
    """The scheduler ``step`` steps is a ``ReduceLROnPlateau``; where ``prepare`` returned it
    under another name (``model, opt, plateau = accelerator.prepare(model, opt, scheduler)``,
    or a trainer's ``self.lr_scheduler`` prepared straight from its constructor's
    ``lr_scheduler``: `prepare_outputs`), what it was handed is one."""
    if is_plateau_scheduler(script, step.scheduler):  # type: ignore[arg-type]
        return True
    owner = dotted(step.call.func.value)  # type: ignore[attr-defined]
    return any(
        _plateau_handed(script, renamed.source, renamed.prepare.call)
        for renamed in renamed_from(script, owner, step.call)
    )


def _plateau_handed(script: ScriptModel, name: str, at: cst.Call) -> bool:
    """``name``, handed to the ``prepare`` at ``at``, is a ``ReduceLROnPlateau``: bound to one,
    or a parameter of the function around ``at`` (never bound in it) that every call of that
    function in the file fills with one."""
    function = script.index.enclosing_function(at)
    if function is None or not has_parameter(function, name):
        return is_plateau_scheduler(script, name)
    if any(script.scope_of(a) is function for a in script.index.assignments_to(name)):
        return False
    passed = facts_of(script).flow.call_site_arguments(name, at)
    return bool(passed) and all(
        isinstance(a.value, cst.Name) and is_plateau_scheduler(script, a.value.value)
        for a in passed
    )


def _metric(call: cst.Call) -> cst.BaseExpression | None:
    """What ``scheduler.step(metric)`` or ``step(metrics=metric)`` is handed."""
    return argument_value(call, "metrics")


def _message(rule: Rule, script: ScriptModel, step: cst.Call, origin: cst.CSTNode) -> str:
    metric = script.module.code_for_node(_metric(step) or step)
    line = script.line(origin)
    text = (
        f"{metric} is this rank's own value (computed at line {line} from its shard of a "
        "prepared DataLoader, never reduced): each rank's ReduceLROnPlateau lowers its "
        "learning rate at a different epoch, and the replicas train apart; step it with the "
        "value reduced over "
        'ranks: accelerator.reduce(torch.tensor(value, device=accelerator.device), "mean")'
        ".item(), or gather_for_metrics the per-sample losses before averaging"
    )
    return in_file_words(text, accelerator_name(script, step))
