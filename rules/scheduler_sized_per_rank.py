from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.scheduler_preparation import (
    prepared_schedulers,
    preparing_call,
    sized_by_a_prepared_loader,
    steps_once_per_process,
)
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import root_name
from accelify.lint.rule import Example, Finding, Rule, accelerator_name, in_file_words

_HEAD = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from transformers import get_scheduler\n"
    "accelerator = Accelerator()\n"
    "optimizer = torch.optim.AdamW(model.parameters())\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
)
_LOOP = (
    "for epoch in range(3):\n"
    "    for x, y in loader:\n"
    "        accelerator.backward(model(x, y))\n"
    "        optimizer.step()\n"
    "        scheduler.step()\n"
    "        optimizer.zero_grad()\n"
)
_SIZED = (
    "scheduler = get_scheduler('cosine', optimizer, num_warmup_steps=100,\n"
    "                          num_training_steps={steps})\n"
    "scheduler = accelerator.prepare(scheduler)\n"
)


class SchedulerSizedPerRank(Rule):
    """A scheduler sized with ``len()`` of a DataLoader that ``prepare`` already sharded, then
    passed to ``prepare`` itself. The prepared loader yields each rank's share of the batches,
    1/N of them, while a prepared scheduler advances ``num_processes`` times at each ``step()``
    (Accelerate's ``step_scheduler_with_optimizer``, on by default; accelify's runtime does the
    same): the schedule is sized in one rank's steps and stepped in all ranks' steps, so on N
    processes it ends after 1/N of the training, the warmup N times shorter, then the learning
    rate sits at its floor (or a cosine climbs back up). Nothing fails; one process hides it.
    Accelerate's examples size the scheduler with the DataLoader before ``prepare``; diffusers'
    scripts multiply the prepared counts by ``accelerator.num_processes``.

    Followed through names and the file's functions (a ``setup_scheduler(optimizer, opt,
    loader)`` factory handed the prepared loader), and through a dict of loaders: an entry
    prepared in place (``loaders["train"]``) or a dict prepared entry by entry, also read under
    a name of its own (``train_loader = loaders["train"]``). Not reported: a length taken before the
    loader was prepared, a sizing that names ``num_processes`` (or ``world_size``), a scheduler
    left out of ``prepare``, an Accelerator with ``split_batches=True`` or
    ``step_scheduler_with_optimizer`` set, or made elsewhere (its settings are not in the
    file), and a scheduler stepped once per epoch (ACC408's)."""

    code = "ACC415"
    name = "scheduler-sized-per-rank"
    message = (
        "Size this scheduler in all ranks' steps: it was sized with len() of the prepared "
        "DataLoader (one rank's batches), and prepared, each step() advances it num_processes "
        "times, so on N processes its schedule ends N times too soon"
    )
    why = (
        "A prepared DataLoader has 1/N of the batches on each rank, and a prepared scheduler "
        "steps N times per call: sized with the one and stepped as the other, it ends N times "
        "too soon."
    )
    bad = (
        Example(_HEAD + _SIZED.format(steps="len(loader) * 3") + _LOOP, 9, 33),
        # a talking-head trainer: a factory sizes it with the prepared loader it is handed
        Example(
            "import torch\n"
            "from accelerate import Accelerator\n\n\n"
            "def setup_scheduler(optimizer, opt, dataloader_train):\n"
            "    total_steps = len(dataloader_train) * opt.epochs\n"
            "    warmup_steps = int(0.1 * total_steps)\n"
            "    return WarmupCosineScheduler(optimizer, warmup_steps, total_steps)\n\n\n"
            "def main(opt):\n"
            "    accelerator = Accelerator(gradient_accumulation_steps=opt.accumulation)\n"
            "    model, optimizer, dataloader_train = accelerator.prepare(\n"
            "        model, optimizer, dataloader_train\n"
            "    )\n"
            "    scheduler = setup_scheduler(optimizer, opt, dataloader_train)\n"
            "    scheduler = accelerator.prepare(scheduler)\n"
            "    for epoch in range(opt.epochs):\n"
            "        for batch in dataloader_train:\n"
            "            with accelerator.accumulate(model):\n"
            "                accelerator.backward(model(**batch))\n"
            "                optimizer.step()\n"
            "                optimizer.zero_grad()\n"
            "            if accelerator.sync_gradients:\n"
            "                scheduler.step()\n",
            17,
            37,
        ),
        # the loaders kept in a dict, its entries prepared in place
        Example(
            _HEAD.replace(
                "loader = accelerator.prepare(model, optimizer, loader)",
                'loaders["train"] = accelerator.prepare(\n'
                '    model, optimizer, loaders["train"]\n)',
            )
            + _SIZED.format(steps='len(loaders["train"]) * 3')
            + _LOOP.replace("in loader:", 'in loaders["train"]:'),
            11,
            33,
        ),
        # the dict prepared entry by entry, one of its entries read under a name of its own
        Example(
            _HEAD.replace(
                ", loader = accelerator.prepare(model, optimizer, loader)",
                " = accelerator.prepare(model, optimizer)",
            )
            + "loaders = {split: accelerator.prepare(dl) for split, dl in loaders.items()}\n"
            + 'train_loader = loaders["train"]\n'
            + _SIZED.format(steps="len(train_loader) * 3")
            + _LOOP.replace("in loader:", "in train_loader:"),
            11,
            33,
        ),
    )
    good = (
        # the dict's entry sized before it is prepared
        "import torch\n"
        "from accelerate import Accelerator\n"
        "from transformers import get_scheduler\n"
        "accelerator = Accelerator()\n"
        + _SIZED.format(steps='len(loaders["train"]) * 3').replace(
            "scheduler = accelerator.prepare(scheduler)\n",
            'model, optimizer, loaders["train"], scheduler = accelerator.prepare(\n'
            '    model, optimizer, loaders["train"], scheduler\n)\n',
        )
        + _LOOP.replace("in loader:", 'in loaders["train"]:'),
        # sized with the DataLoader before prepare, as Accelerate's examples do
        "import torch\n"
        "from accelerate import Accelerator\n"
        "from transformers import get_scheduler\n"
        "accelerator = Accelerator()\n"
        + _SIZED.format(steps="len(loader) * 3").replace(
            "scheduler = accelerator.prepare(scheduler)\n",
            "model, optimizer, loader, scheduler = accelerator.prepare(\n"
            "    model, optimizer, loader, scheduler\n)\n",
        )
        + _LOOP,
        # sized for the N steps per call, as diffusers' scripts do
        _HEAD + _SIZED.format(steps="len(loader) * 3 * accelerator.num_processes") + _LOOP,
        # left out of prepare: one step per call, in this rank's steps
        _HEAD
        + _SIZED.format(steps="len(loader) * 3").replace(
            "scheduler = accelerator.prepare(scheduler)\n", ""
        )
        + _LOOP,
        # batches split across processes: one step per call
        _HEAD.replace("Accelerator()", "Accelerator(split_batches=True)")
        + _SIZED.format(steps="len(loader) * 3")
        + _LOOP,
        # the length of another, unprepared loader (ACC405's business when it counts steps)
        _HEAD + _SIZED.format(steps="len(full_loader) * 3") + _LOOP,
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if not steps_once_per_process(script):
            return
        facts = facts_of(script)
        prepared = prepared_schedulers(script)
        steps = facts.flow.scheduler_steps(set(prepared))
        for name, argument in prepared.items():
            if not any(step.scheduler == name and step.per_batch for step in steps):
                continue  # stepped per epoch (ACC408), or not stepped here
            length = sized_by_a_prepared_loader(script, argument)
            if length is None:
                continue
            measured = script.module.code_for_node(length)
            given = script.module.code_for_node(argument.value)
            where = _where_prepared(script, length)
            text = (
                f"Size {given} in all ranks' steps: it was sized with {measured} (line "
                f"{script.line(length)}), the batches of one rank's shard of the prepared "
                f"DataLoader{where}, and prepared, each step() advances it num_processes "
                "times, so on N processes its schedule ends N times too soon (the warmup too); "
                "multiply its "
                "step counts by accelerator.num_processes, or size it with the DataLoader "
                "before it is prepared"
            )
            yield self.finding(
                script, argument, message=in_file_words(text, accelerator_name(script, argument))
            )


def _where_prepared(script: ScriptModel, length: cst.Call) -> str:
    """`` (prepared at line N)``, and for a dict prepared entry by entry, the line that made
    the loaders it was built from (where they can still be measured whole); or nothing."""
    prepared_at = preparing_call(script, length)
    if prepared_at is None:
        return ""
    where = f" (prepared at line {script.line(prepared_at)}"
    comprehension = script.parent(prepared_at)
    if isinstance(comprehension, cst.DictComp):
        iterated = comprehension.for_in.iter  # ``loaders.items()``
        if isinstance(iterated, cst.Call) and isinstance(iterated.func, cst.Attribute):
            iterated = iterated.func.value
        made = root_name(iterated)
        binding = last_binding(script, made, prepared_at) if made else None
        if binding is not None:
            where += f", from the loaders made at line {script.line(binding)}"
    return where + ")"
