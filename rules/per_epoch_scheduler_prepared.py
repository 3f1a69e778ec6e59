from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.flow import SchedulerStep
from accelify.analysis.objects import is_plateau_scheduler
from accelify.analysis.repeated_effects import callers_of
from accelify.analysis.scheduler_preparation import (
    prepared_schedulers,
    sized_by_process_count,
    steps_once_per_process,
)
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import walk
from accelify.lint.rule import Example, Finding, Rule, accelerator_name, in_file_words

_SCRIPT = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "accelerator = Accelerator()\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
)
_PREPARE = (
    "model, optimizer, loader, scheduler = accelerator.prepare(\n"
    "    model, optimizer, loader, scheduler\n)\n"
)
_EPOCHS = (
    "for epoch in range(90):\n"
    "    for x, y in loader:\n"
    "        accelerator.backward(loss_fn(model(x), y))\n"
    "        optimizer.step()\n"
    "        optimizer.zero_grad()\n"
)

_TRAINER = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from torch import optim\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer, loader, scheduler: optim.lr_scheduler.LRScheduler):\n"
    "        self.accelerator = Accelerator()\n"
    "        model, optimizer, loader, scheduler = self.accelerator.prepare(model, optimizer, "
    "loader, scheduler)\n"
    "        self.model, self.optimizer, self.loader, self.scheduler = model, optimizer, loader, "
    "scheduler\n\n"
    "    def epoch(self):\n"
    "        for batch in self.loader:\n"
    "            self.optimizer.zero_grad()\n"
    "            self.accelerator.backward(self.model(batch).sum())\n"
    "            self.optimizer.step()\n"
    "        self.scheduler.step()\n"
)


class PerEpochSchedulerPrepared(Rule):
    """A scheduler passed to ``accelerator.prepare`` is stepped ``num_processes`` times at each
    ``scheduler.step()`` (Accelerate's ``step_scheduler_with_optimizer``, on by default, with
    ``split_batches=False``; accelify's runtime does the same): prepare assumes a schedule sized
    in one-process batches and stepped with the optimizer, which each of N ranks steps 1/N as
    often. A schedule stepped once per epoch (``StepLR(step_size=30)``,
    ``CosineAnnealingLR(T_max=epochs)``, ``MultiStepLR``, ``ReduceLROnPlateau(patience=...)``
    stepped with the epoch's metric) then runs N times faster on N processes: StepLR decays
    every 30/N epochs, the cosine reaches its floor after epochs/N, the plateau's patience runs
    out N times sooner. Nothing fails; the model trains with the wrong learning rate. One
    process steps once per call and hides it.

    Fix: create the Accelerator with ``step_scheduler_with_optimizer=False`` (every prepared
    scheduler then steps once per call), or leave this scheduler out of ``prepare`` when another
    one steps per batch (``accelerator.register_for_checkpointing(scheduler)`` keeps it in
    ``save_state``). A scheduler also stepped per batch (in another branch) is reported too. Not
    reported: a scheduler stepped only per batch, one created after prepare from
    the prepared optimizer and not prepared, a schedule sized with ``num_processes``, an
    Accelerator with ``split_batches=True`` or made where the project does not show it (an
    Accelerator handed in as a parameter by the project's other modules is read where they
    make it: `scheduler_preparation.steps_once_per_process`)."""

    code = "ACC408"
    name = "per-epoch-scheduler-prepared"
    message = (
        "Leave this per-epoch scheduler out of prepare, or create the Accelerator with "
        "step_scheduler_with_optimizer=False: prepared, each step() advances it num_processes "
        "times, so on N processes its schedule runs N times faster"
    )
    why = (
        "A prepared scheduler steps once per process at each call; an epoch schedule then runs "
        "N times faster."
    )
    bad = (
        Example(  # prepared under another name, stepped by that name: the same scheduler
            _SCRIPT
            + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
            + "model, optimizer, loader, decay = accelerator.prepare(\n"
            + "    model, optimizer, loader, scheduler\n)\n"
            + _EPOCHS
            + "    decay.step()\n",
            7,
            31,
        ),
        Example(  # a foundation-model trainer's scheduler, built by the project's helper
            _SCRIPT
            + "from project.optim import get_scheduler\n"
            + "scheduler = get_scheduler(optimizer=optimizer, scheduler_config=cfg)\n"
            + "model, optimizer, loader, scheduler = accelerator.prepare(\n"
            + "    model, optimizer, loader, scheduler\n)\n"
            + _EPOCHS
            + "    scheduler.step()\n",
            8,
            31,
        ),
        Example(
            _SCRIPT
            + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
            + "model, optimizer, loader, scheduler = accelerator.prepare(\n"
            + "    model, optimizer, loader, scheduler\n)\n"
            + _EPOCHS
            + "    scheduler.step()\n",
            7,
            31,
        ),
        Example(  # a DDPM trainer samples images after each epoch on the main process: its
            # noise scheduler's step(noise_pred, t, x) denoises, it steps no optimizer
            _SCRIPT
            + "scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=400)\n"
            + "model, optimizer, loader, scheduler = accelerator.prepare(\n"
            + "    model, optimizer, loader, scheduler\n)\n\n\n"
            + "def sample(model, noise_scheduler, x):\n"
            + "    for t in noise_scheduler.timesteps:\n"
            + "        x = noise_scheduler.step(model(x, t), t, x).prev_sample\n"
            + "    return x\n\n\n"
            + _EPOCHS
            + "    scheduler.step()\n"
            + "    if accelerator.is_main_process:\n"
            + "        images = sample(model, ddpm, noise)\n",
            7,
            31,
        ),
        Example(  # one scheduler, stepped per batch in one branch and per epoch in the other
            _SCRIPT
            + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)\n"
            + _PREPARE
            + _EPOCHS
            + "        if args.sched == 'cosine':\n"
            + "            scheduler.step()\n"
            + "    if args.sched == 'step':\n"
            + "        scheduler.step()\n",
            7,
            31,
        ),
        Example(  # the plateau's patience counts each call N times (zero_grad steps nothing)
            _SCRIPT
            + "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=5)\n"
            + _PREPARE
            + _EPOCHS.replace(":\n", ":\n    optimizer.zero_grad()\n", 1)
            + "    scheduler.step(evaluate(model))\n",
            7,
            31,
        ),
        Example(  # a trainer: prepared in __init__, stepped in fit() after each epoch
            "import torch\n"
            "from accelerate import Accelerator\n"
            "class Trainer:\n"
            "    def __init__(self, model, loader, epochs):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.optimizer = torch.optim.AdamW(model.parameters())\n"
            "        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(\n"
            "            self.optimizer, T_max=epochs\n"
            "        )\n"
            "        self.model, self.optimizer, self.loader, self.scheduler = (\n"
            "            self.accelerator.prepare(model, self.optimizer, loader, self.scheduler)\n"
            "        )\n"
            "        self.epochs = epochs\n"
            "    def train_epoch(self):\n"
            "        for x, y in self.loader:\n"
            "            self.accelerator.backward(self.model(x, y))\n"
            "            self.optimizer.step()\n"
            "            self.optimizer.zero_grad()\n"
            "    def fit(self):\n"
            "        for epoch in range(self.epochs):\n"
            "            self.train_epoch()\n"
            "            self.scheduler.step()\n",
            11,
            69,
        ),
        Example(  # a factory makes the scheduler; a helper gets the accelerator and steps it
            "import torch\n"
            "from accelerate import Accelerator\n"
            "def build_scheduler(optimizer, epochs):\n"
            "    return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[epochs // 2])\n"
            "def train(accelerator, model, optimizer, loader, scheduler, epochs):\n"
            "    for epoch in range(epochs):\n"
            "        for x, y in loader:\n"
            "            accelerator.backward(model(x, y))\n"
            "            optimizer.step()\n"
            "            optimizer.zero_grad()\n"
            "        scheduler.step()\n"
            "def main():\n"
            "    accelerator = Accelerator()\n"
            "    model = torch.nn.Linear(4, 1)\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    scheduler = build_scheduler(optimizer, 10)\n"
            "    model, optimizer, loader, scheduler = accelerator.prepare(\n"
            "        model, optimizer, make_loader(), scheduler\n"
            "    )\n"
            "    train(accelerator, model, optimizer, loader, scheduler, 10)\n",
            18,
            42,
        ),
        Example(  # prepared on its own: prepare_scheduler wraps it the same way
            _SCRIPT
            + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "scheduler = accelerator.prepare_scheduler(scheduler)\n"
            + _EPOCHS
            + "    scheduler.step()\n",
            7,
            43,
        ),
        # a training function handed the scheduler, its parameter annotated as torch's
        # LRScheduler (a thesis trainer's ``scheduler: Optional[LRScheduler]``)
        Example(
            "from accelerate import Accelerator\n"
            "from torch.optim.lr_scheduler import LRScheduler\n\n\n"
            "def train(model, optimizer, loader, scheduler: LRScheduler, epochs):\n"
            "    accelerator = Accelerator()\n"
            "    model, optimizer, loader, scheduler = accelerator.prepare(\n"
            "        model, optimizer, loader, scheduler\n    )\n"
            "    for epoch in range(epochs):\n"
            "        for x, y in loader:\n"
            "            accelerator.backward(loss_fn(model(x), y))\n"
            "            optimizer.step()\n"
            "            optimizer.zero_grad()\n"
            "        scheduler.step()\n",
            8,
            35,
        ),
        # a thesis trainer (lintreal45): handed the scheduler, prepared in __init__ and kept on
        # the instance; epoch(), called once per epoch by another module, steps it after the
        # pass over the loader
        Example(
            _TRAINER,
            9,
            98,
        ),
        Example(  # the same trainer with its epoch loop in fit()
            _TRAINER.replace("        self.scheduler.step()\n", "")
            + "\n    def fit(self, epochs):\n"
            + "        for epoch in range(epochs):\n"
            + "            self.epoch()\n"
            + "            self.scheduler.step()\n",
            9,
            98,
        ),
    )
    good = (
        # the same trainer, its Accelerator stepping every prepared scheduler once per call
        _TRAINER.replace("Accelerator()", "Accelerator(step_scheduler_with_optimizer=False)"),
        # the same trainer stepping the scheduler per batch, with the optimizer
        _TRAINER.replace(
            "            self.optimizer.step()\n        self.scheduler.step()\n",
            "            self.optimizer.step()\n            self.scheduler.step()\n",
        ),
        # the trainer's own epoch loop steps the optimizer beside the batches (once per pass):
        # the scheduler steps with it
        _TRAINER.replace("        self.scheduler.step()\n", "")
        + "\n    def fit(self, epochs):\n"
        + "        for epoch in range(epochs):\n"
        + "            for batch in self.loader:\n"
        + "                self.accelerator.backward(self.model(batch).sum())\n"
        + "            self.optimizer.step()\n"
        + "            self.scheduler.step()\n",
        # ... or in a helper that runs no loop over batches
        _TRAINER.replace("        self.scheduler.step()\n", "").replace(
            "            self.optimizer.step()\n", ""
        )
        + "\n    def update(self):\n"
        + "        self.optimizer.step()\n"
        + "\n    def fit(self, epochs):\n"
        + "        for epoch in range(epochs):\n"
        + "            self.epoch()\n"
        + "            self.update()\n"
        + "            self.scheduler.step()\n",
        # a pass that may stop early: the step is not once per epoch
        _TRAINER.replace(
            "            self.optimizer.step()\n",
            "            self.optimizer.step()\n            if self.done:\n                break\n",
        ),
        # the renamed one sized for the num_processes steps each call takes
        _SCRIPT
        + "scheduler = torch.optim.lr_scheduler.StepLR(\n"
        + "    optimizer, step_size=30 * accelerator.num_processes\n)\n"
        + "model, optimizer, loader, decay = accelerator.prepare(\n"
        + "    model, optimizer, loader, scheduler\n)\n"
        + _EPOCHS
        + "    decay.step()\n",
        # every prepared scheduler steps once per call
        _SCRIPT.replace("Accelerator()", "Accelerator(step_scheduler_with_optimizer=False)")
        + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
        + _PREPARE
        + _EPOCHS
        + "    scheduler.step()\n",
        # stepped per batch only, in a branch: no per-epoch step
        _SCRIPT
        + "scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, total_steps=900)\n"
        + _PREPARE
        + _EPOCHS
        + "        if args.sched == 'onecycle':\n"
        + "            scheduler.step()\n",
        # stepped per batch, with the optimizer: what prepare is for
        _SCRIPT
        + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
        + _PREPARE
        + "for epoch in range(90):\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward(loss_fn(model(x), y))\n"
        + "        optimizer.step()\n"
        + "        scheduler.step()\n",
        # a vocoder's step helper draws its own batch and steps both: once per pass of the
        # loop, beside an evaluation loop over the prepared test loader
        _SCRIPT
        + "scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)\n"
        + "model, optimizer, loader, test_loader, scheduler = accelerator.prepare(\n"
        + "    model, optimizer, loader, test_loader, scheduler\n)\n"
        + "batches = cycle(loader)\n"
        + "def train_step():\n"
        + "    x, y = next(batches)\n"
        + "    accelerator.backward(loss_fn(model(x), y))\n"
        + "    optimizer.step()\n"
        + "    scheduler.step()\n"
        + "while steps < total_steps:\n"
        + "    train_step()\n"
        + "    steps += 1\n"
        + "    if steps % 200 == 0:\n"
        + "        for x, y in test_loader:\n"
        + "            losses += accelerator.gather(loss_fn(model(x), y)).tolist()\n",
        # per epoch, left out of prepare
        _SCRIPT
        + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + _EPOCHS
        + "    scheduler.step()\n",
        # batches split across processes: one step per call
        _SCRIPT.replace("Accelerator()", "Accelerator(split_batches=True)")
        + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
        + _PREPARE
        + _EPOCHS
        + "    scheduler.step()\n",
        _SCRIPT.replace(
            "Accelerator()",
            "Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))",
        )
        + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
        + _PREPARE
        + _EPOCHS
        + "    scheduler.step()\n",
        # sized for the N steps per call on purpose
        _SCRIPT
        + "scheduler = torch.optim.lr_scheduler.StepLR(\n"
        + "    optimizer, step_size=30 * accelerator.num_processes\n)\n"
        + _PREPARE
        + _EPOCHS
        + "    scheduler.step()\n",
        # micro-steps (nanoGPT's shape): the scheduler steps with the optimizer, after them
        _SCRIPT
        + "scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)\n"
        + _PREPARE
        + "for epoch in range(epochs):\n"
        + "    batches = iter(loader)\n"
        + "    for step in range(len(loader) // accumulation_steps):\n"
        + "        for micro_step in range(accumulation_steps):\n"
        + "            x, y = next(batches)\n"
        + "            accelerator.backward(model(x, y) / accumulation_steps)\n"
        + "        optimizer.step()\n"
        + "        scheduler.step()\n",
        # handed its epoch: stepped N times, it lands on the same epoch
        _SCRIPT
        + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
        + _PREPARE
        + _EPOCHS
        + "    scheduler.step(epoch + 1)\n",
        # an accelerator configured elsewhere: its settings are not in this file
        "import torch\n"
        "def fit(accelerator, model, optimizer, loader, epochs):\n"
        "    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
        "    model, optimizer, loader, scheduler = accelerator.prepare(\n"
        "        model, optimizer, loader, scheduler\n    )\n"
        "    for epoch in range(epochs):\n"
        "        for x, y in loader:\n"
        "            accelerator.backward(model(x, y))\n"
        "            optimizer.step()\n"
        "        scheduler.step()\n",
        # settings from a config the file does not spell out
        "import torch\nfrom accelerate import Accelerator\n"
        "accelerator = Accelerator(**config['accelerator'])\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30)\n"
        + _PREPARE
        + _EPOCHS
        + "    scheduler.step()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if not steps_once_per_process(script):
            return
        flow = facts_of(script).flow
        prepared = prepared_schedulers(script)
        steps = flow.scheduler_steps(set(prepared))
        kept = [step for step in steps if step.kept]
        per_batch = {step.scheduler for step in steps if step.per_batch}
        for name, argument in prepared.items():
            # a step per batch in one branch and per epoch in another is still a per-epoch step
            own = [step for step in steps if step.scheduler == name and not step.per_batch]
            if not own or sized_by_process_count(script, name):
                continue
            if any(
                flow.epoch_loop(step) is None
                and not (step in kept and _once_per_pass(script, step.call, kept))
                for step in own
            ):
                continue
            plateau = is_plateau_scheduler(script, name)
            repeated = [step for step in own if plateau or not step.call.args]
            if not repeated:
                continue
            yield self.finding(
                script,
                argument,
                message=_message(self, script, argument, repeated, per_batch),
            )


def _message(
    rule: Rule,
    script: ScriptModel,
    argument: cst.Arg,
    steps: list[SchedulerStep],
    per_batch: set[str | None],
) -> str:
    """Names the step's line; with another prepared scheduler stepping per batch, only leaving
    this one out of prepare keeps both right."""
    lines = ", ".join(str(n) for n in sorted({script.line(step.call) for step in steps}))
    name = script.module.code_for_node(argument.value)
    where = f"{name} is stepped once per epoch (line {lines})"
    why = (
        "prepared, each step() advances it num_processes times, so on N processes its schedule "
        "runs N times faster"
    )
    if name in per_batch:
        advice = (
            f"leave it out of prepare ({name} is also stepped per batch: no one "
            "step_scheduler_with_optimizer setting fits both calls; unprepared, step it "
            "accelerator.num_processes times at its per-batch step to keep that pace)"
        )
    elif per_batch:
        other = sorted(n for n in per_batch if n)[0] if any(per_batch) else "another scheduler"
        advice = (
            f"leave it out of prepare ({other} steps per batch and needs it; "
            f"accelerator.register_for_checkpointing({name}) keeps it in save_state)"
        )
    else:
        advice = (
            "create the Accelerator with step_scheduler_with_optimizer=False, or leave it out "
            "of prepare"
        )
    return in_file_words(f"{where}: {why}; {advice}", accelerator_name(script, argument))


def _once_per_pass(script: ScriptModel, step: cst.Call, kept: list[SchedulerStep]) -> bool:
    """A kept step (`SchedulerStep.kept`) that runs once per pass over the data: in the nearest loop
    around it that trains over batches in a loop of its own and steps nothing else beside them
    (the flow's epoch loop, for the step the flow cannot name), or after a whole pass at the
    end of a method called from another module (`_after_a_whole_pass`)."""
    function = facts_of(script).placement.enclosing_function(step)
    loop = next(
        (
            a
            for a in script.ancestors(step)
            if isinstance(a, cst.For | cst.While | cst.FunctionDef | cst.ClassDef)
        ),
        None,
    )
    if not isinstance(loop, cst.For | cst.While):
        return _after_a_whole_pass(script, step)
    if function is None or facts_of(script).placement.enclosing_function(loop) is not function:
        return False
    inner = _training_loops(script, loop)
    ours = {id(k.call) for k in kept}
    passes = bool(inner)
    for node in walk(loop.body):
        if not isinstance(node, cst.Call) or any(_within(script, node, i) for i in inner):
            continue
        helpers = facts_of(script).calls.targets(node)
        if helpers:  # ``self.train_epoch()``: a whole pass, or a step beside the batches
            if not all(_training_loops(script, helper) for helper in helpers):
                return False
            passes = True
        elif (
            isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "step"
            and id(node) not in ours
        ):
            return False  # an optimizer or engine stepped per pass: the scheduler goes with it
    return passes


def _training_loops(script: ScriptModel, node: cst.CSTNode) -> list[cst.CSTNode]:
    """The loops inside ``node`` that train over batches."""
    return [
        found.node
        for found in script.loops
        if found.trains and found.node is not node and _within(script, found.node, node)
    ]


def _within(script: ScriptModel, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    return any(a is outer for a in script.ancestors(node))


def _after_a_whole_pass(script: ScriptModel, step: cst.Call) -> bool:
    """``step`` runs once per call of a method nothing in the file calls (a trainer's
    ``epoch()``, called per epoch by another module), after the method's own complete loop over
    batches that trains: once per pass over the data. A loop that may stop early (``break``)
    or a step inside a loop or branch is not such a step."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(step)
    if function is None or callers_of(script, facts.placement, function):
        return False
    statement = next((a for a in script.ancestors(step) if script.parent(a) is function.body), None)
    if statement is None or not isinstance(statement, cst.SimpleStatementLine):
        return False
    return any(
        isinstance(loop, cst.For)
        and script.parent(loop) is function.body
        and script.order(loop) < script.order(step)
        and any(found.node is loop and found.trains for found in script.loops)
        and not any(isinstance(node, cst.Break) for node in walk(loop.body))
        for loop in function.body.body
    )
