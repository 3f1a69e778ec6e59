from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.scheduler_preparation import (
    per_fixed_iteration_steps,
    prepared_schedulers,
    schedule_length,
    sized_by_process_count,
    steps_once_per_process,
)
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import Example, Finding, Rule, accelerator_name, in_file_words

_SCRIPT = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "accelerator = Accelerator()\n"
    "max_iters = 5000\n"
    "optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)\n"
    "scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_iters)\n"
    "model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)\n"
)
#: lucidrains' trainers (voicebox, e2-tts, meshgpt): the step count a constructor parameter no
#: call in the file passes, the counter a buffer raised in ``train_step``; {length} sizes the
#: schedule
_STEPS_TRAINER = (
    "import torch\n"
    "from torch.optim.lr_scheduler import CosineAnnealingLR\n"
    "from accelerate import Accelerator\n\n\n"
    "class Trainer(torch.nn.Module):\n"
    "    def __init__(self, model, optimizer, loader, num_train_steps, decay_steps):\n"
    "        super().__init__()\n"
    "        self.accelerator = Accelerator()\n"
    "        self.num_train_steps = num_train_steps\n"
    "        self.scheduler = CosineAnnealingLR(optimizer, T_max={length})\n"
    "        self.model, self.optim, self.scheduler, self.dl = self.accelerator.prepare(\n"
    "            model, optimizer, self.scheduler, loader\n"
    "        )\n"
    "        self.batches = iter(self.dl)\n"
    "        self.register_buffer('steps', torch.tensor([0]))\n\n"
    "    def train_step(self):\n"
    "        x, y = next(self.batches)\n"
    "        self.accelerator.backward(torch.nn.functional.mse_loss(self.model(x), y))\n"
    "        self.optim.step()\n"
    "        self.optim.zero_grad()\n"
    "        self.scheduler.step()\n"
    "        self.steps += 1\n\n"
    "    def train(self):\n"
    "        while self.steps < self.num_train_steps:\n"
    "            self.train_step()\n"
)
#: a DDPM trainer that subclasses ``nn.Module``, handed the accelerator by its caller: its
#: scheduler kept on the instance, prepared on its own, stepped in ``train_step()`` that a
#: ``while`` loop counting the instance's steps calls; {length} sizes the schedule
_MODULE_TRAINER = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from diffusers.optimization import get_scheduler\n\n\n"
    "class DDPM(torch.nn.Module):\n"
    "    def train(self, trainset, accelerator: Accelerator):\n"
    "        self.optimizer = torch.optim.AdamW(self.model.parameters())\n"
    "        self.lr_scheduler = get_scheduler(\n"
    "            'cosine', optimizer=self.optimizer, num_training_steps={length}\n"
    "        )\n"
    "        self.model, self.optimizer = accelerator.prepare(self.model, self.optimizer)\n"
    "        trainset = accelerator.prepare(trainset)\n"
    "        self.lr_scheduler = accelerator.prepare(self.lr_scheduler)\n"
    "        while self.global_step < self.config.train_steps:\n"
    "            self.train_step(next(iter(trainset)), accelerator=accelerator)\n"
    "            self.global_step += 1\n\n"
    "    def train_step(self, batch, accelerator):\n"
    "        accelerator.backward(self.model(batch['input']).mean())\n"
    "        self.optimizer.step()\n"
    "        self.lr_scheduler.step()\n"
    "        self.optimizer.zero_grad()\n\n\n"
    "def main(model, trainset, config):\n"
    "    DDPM(model, config).train(trainset, Accelerator())\n"
)
#: the script's scheduler prepared under another name
_RENAMED = _SCRIPT.replace(
    "model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)",
    "model, optimizer, warm = accelerator.prepare(model, optimizer, scheduler)",
)
_LOOP = (
    "for it in range(max_iters):\n"
    "    xb, yb = get_batch('train')\n"
    "    accelerator.backward(model(xb, yb))\n"
    "    optimizer.step()\n"
    "    optimizer.zero_grad()\n"
    "    scheduler.step()\n"
)


class FixedCountSchedulerPrepared(Rule):
    """A scheduler passed to ``accelerator.prepare`` steps ``num_processes`` times at each
    ``scheduler.step()`` (Accelerate's ``step_scheduler_with_optimizer``, on by default;
    accelify's runtime does the same): prepare expects the loop to shrink with the shard, as a
    loop over a prepared DataLoader does (each rank steps 1/N as often). A loop that runs a fixed
    number of iterations (nanoGPT's ``for it in range(max_iters): xb, yb = get_batch()``) makes
    every rank step ``max_iters`` times, so a schedule sized in ``max_iters`` ends after
    ``max_iters / N`` iterations: the warmup is N times shorter, the cosine reaches its floor
    (and ``CosineAnnealingLR`` climbs back up) halfway through on 2 ranks. Nothing fails; the
    model trains with the wrong learning rate. One process hides it. A scheduler made by a
    function this file cannot see into (``warm = make_lr(optimizer, n)`` from the project's own
    module) is known as one by its use: built from the optimizer, stepped with no argument,
    never zeroed itself, in a file that steps the optimizer too (else it is the optimizer's
    wrapper: `analysis.scheduler_objects`). A loop bounded by the schedule's own length
    (``CosineAnnealingLR(opt, T_max=num_train_steps)`` and ``while self.steps <
    self.num_train_steps`` of a trainer that set the attribute from that parameter: lucidrains'
    trainers) is reported whatever the value is, one handed by a caller the file does not show
    included: every rank runs that many steps, so the prepared schedule ends after 1/N of them
    (not where the step runs at every micro-batch of ``accumulate()``: whether that is right
    depends on the value).

    Fix: leave the scheduler out of ``prepare``
    (``accelerator.register_for_checkpointing(scheduler)`` keeps it in ``save_state``), or
    create the Accelerator with ``step_scheduler_with_optimizer=False``; where ``step()`` runs
    at every micro-batch of ``accelerator.accumulate()`` (no ``sync_gradients`` test around
    it), both would step it ``gradient_accumulation_steps`` times per optimizer step, so the
    advice there is to size the schedule in ``num_processes`` times its steps (the warmup too),
    as diffusers' scripts do. Not reported: a loop
    over a prepared DataLoader (or one that calls a helper looping over it: an epoch loop,
    ACC408's), a ``range`` (or a ``while step < n``) bounded by ``len()`` of a DataLoader or by
    ``num_processes``, a ``while`` loop with no counter held to a bound, a schedule sized with
    ``num_processes``, a ``step(epoch)``, an Accelerator with ``split_batches=True`` or made
    where the project does not show it (one handed in as a parameter by the project's other
    modules is read where they make it)."""

    code = "ACC410"
    name = "fixed-count-scheduler-prepared"
    message = (
        "Leave this scheduler out of prepare, or create the Accelerator with "
        "step_scheduler_with_optimizer=False: prepared, each step() advances it num_processes "
        "times, and the loop stepping it runs a fixed count, so on N processes its schedule "
        "ends N times too soon"
    )
    why = (
        "A prepared scheduler steps once per process at each call; a loop whose length does not "
        "shrink with the shard then ends the schedule N times too soon."
    )
    bad = (
        Example(_SCRIPT + _LOOP, 7, 69),
        # prepared under another name, stepped by that name: the same scheduler
        Example(_RENAMED + _LOOP.replace("scheduler.step()", "warm.step()"), 7, 64),
        # the loop's bound is the schedule's own length: whatever a caller passes, every rank
        # runs that many steps and the prepared schedule counts N per step
        Example(_STEPS_TRAINER.format(length="num_train_steps"), 13, 31),
        Example(  # the same, the length read back from the attribute, counted by range()
            _STEPS_TRAINER.format(length="self.num_train_steps").replace(
                "while self.steps < self.num_train_steps:", "for _ in range(self.num_train_steps):"
            ),
            13,
            31,
        ),
        # a LoRA fine-tuning run from the command line (tyro): its step count is a setting,
        # and every rank runs all of its steps over the same in-memory images
        Example(
            "import torch\nimport tyro\nfrom accelerate import Accelerator\n"
            "from diffusers.optimization import get_scheduler\n\n\n"
            "def main(num_train_steps: int = 10000, lr_scheduler: str = 'cosine'):\n"
            "    accelerator = Accelerator()\n"
            "    optimizer = torch.optim.AdamW(unet.parameters())\n"
            "    lr_scheduler = get_scheduler(lr_scheduler, optimizer=optimizer,\n"
            "                                 num_training_steps=num_train_steps)\n"
            "    unet, optimizer, lr_scheduler = accelerator.prepare(\n"
            "        unet, optimizer, lr_scheduler)\n"
            "    for step in range(num_train_steps):\n"
            "        image = images[step % len(images)]\n"
            "        with accelerator.accumulate(unet):\n"
            "            accelerator.backward(unet(image).loss)\n"
            "            optimizer.step()\n"
            "            lr_scheduler.step()\n"
            "            optimizer.zero_grad()\n\n\n"
            "if __name__ == '__main__':\n    tyro.cli(main)\n",
            13,
            26,
        ),
        Example(  # a trainer: iterations counted in the config, the step in a method
            "import torch\n"
            "from accelerate import Accelerator\n"
            "class Trainer:\n"
            "    def __init__(self, model, cfg):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.cfg = cfg\n"
            "        self.optimizer = torch.optim.AdamW(model.parameters())\n"
            "        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(\n"
            "            self.optimizer, max_lr=1e-3, total_steps=cfg.max_steps\n"
            "        )\n"
            "        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(\n"
            "            model, self.optimizer, self.scheduler\n"
            "        )\n"
            "    def train_step(self, batch):\n"
            "        self.accelerator.backward(self.model(**batch).loss)\n"
            "        self.optimizer.step()\n"
            "        self.scheduler.step()\n"
            "        self.optimizer.zero_grad()\n"
            "    def fit(self, stream):\n"
            "        for step in range(self.cfg.max_steps):\n"
            "            self.train_step(next(stream))\n",
            12,
            36,
        ),
        Example(  # transformers' get_scheduler behind two helpers, under a name that says nothing
            "import torch\n"
            "from accelerate import Accelerator\n"
            "from transformers import get_scheduler\n"
            "def make_lr(opt, total):\n"
            "    return get_scheduler('cosine', optimizer=opt, num_training_steps=total)\n"
            "def build_scheduler(args, opt):\n"
            "    return make_lr(opt, args.max_iters)\n"
            "def main(args, model):\n"
            "    accelerator = Accelerator()\n"
            "    optimizer = torch.optim.AdamW(model.parameters())\n"
            "    warm = build_scheduler(args, optimizer)\n"
            "    model, optimizer, warm = accelerator.prepare(model, optimizer, warm)\n"
            "    for it in range(args.max_iters):\n"
            "        accelerator.backward(model(*get_batch()))\n"
            "        optimizer.step()\n"
            "        warm.step()\n",
            12,
            68,
        ),
        Example(  # made by the project's own module, under names that say nothing: built from
            # the optimizer and stepped with no argument, it is a scheduler
            "import torch\n"
            "from accelerate import Accelerator\n"
            "from .schedules import make_lr\n"
            "def main(args, model):\n"
            "    accelerator = Accelerator()\n"
            "    optimizer = torch.optim.AdamW(model.parameters())\n"
            "    warm = make_lr(optimizer, args.max_iters)\n"
            "    model, optimizer, warm = accelerator.prepare(model, optimizer, warm)\n"
            "    for it in range(args.max_iters):\n"
            "        accelerator.backward(model(*get_batch()))\n"
            "        optimizer.step()\n"
            "        warm.step()\n"
            "        optimizer.zero_grad()\n",
            8,
            68,
        ),
        Example(  # the same, the optimizer stepped in a helper through its parameter
            "import torch\n"
            "from accelerate import Accelerator\n"
            "from .schedules import make_lr\n"
            "def update(opt):\n"
            "    opt.step()\n"
            "    opt.zero_grad()\n"
            "def main(args, model):\n"
            "    accelerator = Accelerator()\n"
            "    optimizer = torch.optim.AdamW(model.parameters())\n"
            "    warm = make_lr(optimizer, args.max_iters)\n"
            "    model, optimizer, warm = accelerator.prepare(model, optimizer, warm)\n"
            "    for it in range(args.max_iters):\n"
            "        accelerator.backward(model(*get_batch()))\n"
            "        update(optimizer)\n"
            "        warm.step()\n",
            11,
            68,
        ),
        Example(  # a factory makes it; the accelerator is a parameter
            "import torch\n"
            "from accelerate import Accelerator\n"
            "def make_scheduler(optimizer, steps):\n"
            "    return torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=steps)\n"
            "def train(accelerator, model, optimizer, scheduler, steps):\n"
            "    for it in range(steps):\n"
            "        accelerator.backward(model(*sample()))\n"
            "        optimizer.step()\n"
            "        scheduler.step()\n"
            "        optimizer.zero_grad()\n"
            "def main():\n"
            "    accelerator = Accelerator()\n"
            "    model = torch.nn.Linear(4, 1)\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    scheduler = make_scheduler(optimizer, 1000)\n"
            "    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)\n"
            "    train(accelerator, model, optimizer, scheduler, 1000)\n",
            16,
            73,
        ),
        Example(  # inside accumulate(), stepped when the optimizer steps: still N per call
            _SCRIPT.replace("Accelerator()", "Accelerator(gradient_accumulation_steps=4)")
            + "for it in range(max_iters):\n"
            + "    with accelerator.accumulate(model):\n"
            + "        accelerator.backward(model(*get_batch('train')))\n"
            + "        if accelerator.sync_gradients:\n"
            + "            optimizer.step()\n"
            + "            scheduler.step()\n"
            + "            optimizer.zero_grad()\n",
            7,
            69,
        ),
        Example(  # nanoGPT's own loop: ``while True`` left when the counter reaches the bound
            _SCRIPT
            + "iter_num = 0\n"
            + "while True:\n"
            + "    accelerator.backward(model(*get_batch('train')))\n"
            + "    optimizer.step()\n"
            + "    scheduler.step()\n"
            + "    iter_num += 1\n"
            + "    if iter_num >= max_iters:\n"
            + "        break\n",
            7,
            69,
        ),
        Example(  # a counter below a bound that does not shrink with the shard
            _SCRIPT
            + "step = 0\n"
            + "while step < max_iters:\n"
            + "    accelerator.backward(model(*get_batch('train')))\n"
            + "    optimizer.step()\n"
            + "    scheduler.step()\n"
            + "    step = step + 1\n",
            7,
            69,
        ),
        Example(  # passes over the prepared loader until the optimizer steps reach the bound
            _SCRIPT.replace(
                "(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)"
            ).replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
            + "step = 0\n"
            + "while step < max_iters:\n"
            + "    for xb, yb in loader:\n"
            + "        accelerator.backward(model(xb, yb))\n"
            + "        optimizer.step()\n"
            + "        scheduler.step()\n"
            + "        step += 1\n"
            + "        if step >= max_iters:\n"
            + "            break\n",
            7,
            77,
        ),
        # the loop's count a parameter's default, the function run without it
        Example(
            "import torch\n"
            "from accelerate import Accelerator\n\n\n"
            "def main(max_steps=5000):\n"
            "    accelerator = Accelerator()\n"
            "    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)\n"
            "    scheduler = CosineAnnealingLR(optimizer, T_max=max_steps)\n"
            "    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)\n"
            "    for it in range(max_steps):\n"
            "        accelerator.backward(model(*get_batch('train')))\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad()\n"
            "        scheduler.step()\n\n\n"
            "main()\n",
            9,
            73,
        ),
        Example(  # a GPT-2 fine-tuning: ``while True`` over the loader, left by a return from
            # inside the loop over it once the optimizer steps reach the bound
            _SCRIPT.replace(
                "(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)"
            ).replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
            + "def train():\n"
            + "    step = 0\n"
            + "    while True:\n"
            + "        for xb, yb in loader:\n"
            + "            accelerator.backward(model(xb, yb))\n"
            + "            optimizer.step()\n"
            + "            scheduler.step()\n"
            + "            step += 1\n"
            + "            if step >= max_iters:\n"
            + "                accelerator.print('done')\n"
            + "                return\n"
            + "train()\n",
            7,
            77,
        ),
        # an ``nn.Module`` trainer handed the accelerator, the step in a method a fixed-count
        # ``while`` loop calls (lintreal42's DDPM: on 2 ranks the cosine is done halfway)
        Example(_MODULE_TRAINER.format(length="self.config.train_steps"), 14, 49),
    )
    good = (
        # the renamed one sized for the num_processes steps each call takes
        _RENAMED.replace("T_max=max_iters", "T_max=max_iters * accelerator.num_processes")
        + _LOOP.replace("scheduler.step()", "warm.step()"),
        # the same trainer, its schedule sized for the num_processes steps each call takes
        _MODULE_TRAINER.format(length="self.config.train_steps * accelerator.num_processes"),
        # the schedule sized with another value than the loop's bound, handed by a caller the
        # file does not show: the bound may be this rank's share and the length the whole
        _STEPS_TRAINER.format(length="decay_steps"),
        # ``while True`` over the prepared loader, returning once an epoch count is reached:
        # the loop shrinks with the shard
        _SCRIPT.replace(
            "(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)"
        ).replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
        + "def train():\n"
        + "    step = 0\n"
        + "    while True:\n"
        + "        for xb, yb in loader:\n"
        + "            accelerator.backward(model(xb, yb))\n"
        + "            optimizer.step()\n"
        + "            scheduler.step()\n"
        + "            step += 1\n"
        + "            if step >= len(loader) * epochs:\n"
        + "                return\n"
        + "train()\n",
        # an optimizer wrapper from the project, handed the optimizer and stepped too: zeroed
        # as optimizers are, it is no scheduler
        "import torch\n"
        "from accelerate import Accelerator\n"
        "from .optim import Lookahead\n"
        "def main(args, model):\n"
        "    accelerator = Accelerator()\n"
        "    base = torch.optim.AdamW(model.parameters())\n"
        "    fast = Lookahead(base, k=5)\n"
        "    model, fast = accelerator.prepare(model, fast)\n"
        "    for it in range(args.max_iters):\n"
        "        accelerator.backward(model(*get_batch()))\n"
        "        fast.step()\n"
        "        fast.zero_grad()\n",
        # the same wrapper with the grads zeroed through the model: the base optimizer is
        # never stepped itself, so what is stepped in its place is no scheduler
        "import torch\n"
        "from accelerate import Accelerator\n"
        "from .optim import Lookahead\n"
        "def main(args, model):\n"
        "    accelerator = Accelerator()\n"
        "    base = torch.optim.AdamW(model.parameters())\n"
        "    fast = Lookahead(base, k=5)\n"
        "    model, fast = accelerator.prepare(model, fast)\n"
        "    for it in range(args.max_iters):\n"
        "        model.zero_grad()\n"
        "        accelerator.backward(model(*get_batch()))\n"
        "        fast.step()\n",
        # left out of prepare: one step per call on every rank
        _SCRIPT.replace(
            "model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)",
            "model, optimizer = accelerator.prepare(model, optimizer)",
        )
        + _LOOP,
        # every prepared scheduler steps once per call
        _SCRIPT.replace("Accelerator()", "Accelerator(step_scheduler_with_optimizer=False)")
        + _LOOP,
        # a loop over the prepared DataLoader shrinks with the shard
        _SCRIPT.replace(
            "(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)"
        ).replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
        + "for xb, yb in loader:\n"
        + "    accelerator.backward(model(xb, yb))\n"
        + "    optimizer.step()\n"
        + "    scheduler.step()\n",
        # steps counted from the prepared DataLoader's length
        _SCRIPT.replace(
            "(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)"
        ).replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
        + "batches = iter(loader)\n"
        + "for it in range(len(loader)):\n"
        + "    accelerator.backward(model(*next(batches)))\n"
        + "    optimizer.step()\n"
        + "    scheduler.step()\n",
        # a while loop counting passes over the prepared loader (epochs): ACC408's business
        _SCRIPT.replace(
            "(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)"
        ).replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
        + "epoch = 0\n"
        + "while epoch < 10:\n"
        + "    for xb, yb in loader:\n"
        + "        accelerator.backward(model(xb, yb))\n"
        + "        optimizer.step()\n"
        + "        scheduler.step()\n"
        + "    epoch += 1\n",
        # a while loop counting up to the prepared DataLoader's length
        _SCRIPT.replace(
            "(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)"
        ).replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
        + "batches = iter(loader)\n"
        + "step = 0\n"
        + "while step < len(loader):\n"
        + "    accelerator.backward(model(*next(batches)))\n"
        + "    optimizer.step()\n"
        + "    scheduler.step()\n"
        + "    step += 1\n",
        # the fixed count divided among the processes
        _SCRIPT
        + _LOOP.replace("range(max_iters)", "range(max_iters // accelerator.num_processes)"),
        # sized for the N steps per call
        _SCRIPT.replace("T_max=max_iters", "T_max=max_iters * accelerator.num_processes") + _LOOP,
        # batches split across processes: one step per call
        _SCRIPT.replace("Accelerator()", "Accelerator(split_batches=True)") + _LOOP,
        # the same through today's spelling, in a `while step < max_steps` loop (a restoration
        # project's classifier trainer): one step per call
        _SCRIPT.replace("import Accelerator", "import Accelerator, DataLoaderConfiguration")
        .replace(
            "Accelerator()",
            "Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))",
        )
        .replace("max_iters = 5000\n", "max_iters = 5000\nstep = 0\n")
        .replace("(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)")
        .replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
        + "while step < max_iters:\n"
        + "    for xb, yb in loader:\n"
        + "        accelerator.backward(model(xb, yb))\n"
        + "        optimizer.step(), scheduler.step()\n"
        + "        step += 1\n"
        + "        if step == max_iters:\n"
        + "            break\n",
        # an epoch loop that calls a helper looping over the prepared loader: ACC408's business
        _SCRIPT.replace(
            "(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)"
        ).replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
        + "def train_one_epoch(model, loader, optimizer):\n"
        + "    for xb, yb in loader:\n"
        + "        accelerator.backward(model(xb, yb))\n"
        + "        optimizer.step()\n"
        + "for epoch in range(10):\n"
        + "    train_one_epoch(model, loader, optimizer)\n"
        + "    scheduler.step()\n",
        # the count is a helper's parameter its caller fills with the prepared loader's length
        "import torch\n"
        "from accelerate import Accelerator\n"
        "def train(accelerator, model, optimizer, scheduler, loader, total_steps):\n"
        "    batches = iter(loader)\n"
        "    for step in range(total_steps):\n"
        "        accelerator.backward(model(*next(batches)))\n"
        "        optimizer.step()\n"
        "        scheduler.step()\n"
        "def main(loader):\n"
        "    accelerator = Accelerator()\n"
        "    model = torch.nn.Linear(4, 1)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=len(loader))\n"
        "    model, optimizer, loader, scheduler = accelerator.prepare(\n"
        "        model, optimizer, loader, scheduler\n"
        "    )\n"
        "    train(accelerator, model, optimizer, scheduler, loader, len(loader))\n",
        # an epoch loop around a loop over the prepared loader: ACC408's business
        _SCRIPT.replace(
            "(model, optimizer, scheduler)", "(model, optimizer, scheduler, loader)"
        ).replace("model, optimizer, scheduler =", "model, optimizer, scheduler, loader =")
        + "for epoch in range(10):\n"
        + "    for xb, yb in loader:\n"
        + "        accelerator.backward(model(xb, yb))\n"
        + "        optimizer.step()\n"
        + "        scheduler.step()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if not steps_once_per_process(script):
            return
        facts = facts_of(script)
        prepared = prepared_schedulers(script)
        steps = facts.flow.scheduler_steps(set(prepared))
        for name, argument in prepared.items():
            if sized_by_process_count(script, name):
                continue
            own = [s.call for s in steps if s.scheduler == name]
            fixed = per_fixed_iteration_steps(facts, own)
            if fixed is None:
                # bounded by the schedule's own length, whatever it is; not where the step
                # runs at every micro-batch (whether that is right depends on the value)
                fixed = per_fixed_iteration_steps(facts, own, schedule_length(script, name))
                if fixed is None or any(_unsynced_accumulate(script, c) for c, _ in fixed):
                    continue
            yield self.finding(
                script,
                argument,
                message=_message(self, script, argument, fixed),  # type: ignore[arg-type]
            )


def _message(
    rule: Rule,
    script: ScriptModel,
    argument: cst.Arg,
    fixed: list[tuple[cst.Call, cst.For | cst.While]],
) -> str:
    """Names the step's line and the loop's."""
    name = script.module.code_for_node(argument.value)
    steps = ", ".join(str(n) for n in sorted({script.line(call) for call, _ in fixed}))
    loops = ", ".join(str(n) for n in sorted({script.line(loop) for _, loop in fixed}))
    text = (
        f"{name} is stepped (line {steps}) in a loop of a fixed count (line {loops}) that every "
        "rank runs whole: prepared, each step() advances it num_processes times, so on N "
        "processes its schedule ends N times too soon; "
    )
    accumulating = [a for call, _ in fixed if (a := _unsynced_accumulate(script, call))]
    if accumulating:
        text += (
            "size it for that (its step counts, the warmup's too, times "
            "accelerator.num_processes, as diffusers' scripts do): it steps inside "
            f"accelerator.accumulate() (line {script.line(accumulating[0])}) at every "
            "micro-batch, so left out of prepare, or with step_scheduler_with_optimizer=False, "
            "it would step gradient_accumulation_steps times per optimizer step instead"
        )
    else:
        text += (
            f"leave it out of prepare (accelerator.register_for_checkpointing({name}) keeps it "
            "in save_state), or create the Accelerator with step_scheduler_with_optimizer=False"
        )
    return in_file_words(text, accelerator_name(script, argument))


def _unsynced_accumulate(script: ScriptModel, step: cst.Call) -> cst.With | None:
    """The ``with accelerator.accumulate(model):`` around ``step`` when no test of
    ``sync_gradients`` stands between them: the step runs at every micro-batch, and only the
    prepared scheduler skips the ones that do not step the optimizer."""
    for ancestor in script.ancestors(step):
        if isinstance(ancestor, cst.If) and "sync_gradients" in script.module.code_for_node(
            ancestor.test
        ):
            return None
        if isinstance(ancestor, cst.With) and any(
            isinstance(item.item, cst.Call)
            and isinstance(item.item.func, cst.Attribute)
            and item.item.func.attr.value == "accumulate"
            for item in ancestor.items
        ):
            return ancestor
        if isinstance(ancestor, cst.FunctionDef):
            return None
    return None
