from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.process_count import process_count
from accelify.analysis.scheduler_preparation import (
    PROCESS_COUNT,
    prepared_schedulers,
    preparing_call,
    sized_by_a_prepared_loader,
    steps_once_per_call,
    steps_once_per_process,
)
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, root_name, walk
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


_BEFORE_PREPARE = (
    "import math\n"
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from transformers import get_scheduler\n"
    "accelerator = Accelerator()\n"
    "optimizer = torch.optim.AdamW(model.parameters())\n"
    "total_steps = len(loader) * 3\n"
    "scheduler = get_scheduler('cosine', optimizer, num_warmup_steps=100,\n"
    "                          num_training_steps={steps})\n"
    "model, optimizer, loader, scheduler = accelerator.prepare(\n"
    "    model, optimizer, loader, scheduler\n"
    ")\n" + _LOOP
)


#: A trainer that sizes its schedule in ``self.num_train_steps`` from the DataLoader it is
#: handed, then prepares both, with an Accelerator that steps a prepared scheduler once per call
#: (a Kaggle "Trainer inspired from HF Trainer and Tez", lintreal45).
_ONCE_PER_CALL_TRAINER = (
    "import math\n"
    "from accelerate import Accelerator\n"
    "from transformers import get_cosine_schedule_with_warmup\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer, loader, args):\n"
    "        self.accelerator = Accelerator(step_scheduler_with_optimizer=False)\n"
    "        self.model, self.optimizer, self.loader = model, optimizer, loader\n"
    "        per_epoch = math.ceil(len(self.loader) / args.accumulation)\n"
    "        self.num_train_steps = per_epoch * args.epochs\n"
    "        self.scheduler = get_cosine_schedule_with_warmup(\n"
    "            self.optimizer, num_warmup_steps=0, num_training_steps={steps}\n"
    "        )\n"
    "        self.model, self.optimizer, self.loader, self.scheduler = self.accelerator.prepare(\n"
    "            self.model, self.optimizer, self.loader, self.scheduler\n"
    "        )\n\n"
    "    def fit(self, epochs):\n"
    "        for epoch in range(epochs):\n"
    "            for batch in self.loader:\n"
    "                self.accelerator.backward(self.model(**batch).loss)\n"
    "                self.optimizer.step()\n"
    "                self.scheduler.step()\n"
    "                self.optimizer.zero_grad()\n"
)
_ONCE = "Accelerator(step_scheduler_with_optimizer=False)"


#: A multi-task trainer's shape (lintreal41): a factory sizes the scheduler in one rank's
#: steps, prepares it and returns it in a ``@dataclass`` record; a ``while`` loop over
#: ``next(batches)`` steps it as ``run.scheduler``.
_RECORD_RUN = (
    "from dataclasses import dataclass\n"
    "\n"
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from transformers import get_linear_schedule_with_warmup\n"
    "\n"
    "\n"
    "@dataclass\n"
    "class PreparedRun:\n"
    "    model: torch.nn.Module\n"
    "    optimizer: torch.optim.Optimizer\n"
    "    scheduler: object\n"
    "    dataloader: object\n"
    "    total_steps: int\n"
    "\n"
    "\n"
    "def prepare_run(accelerator, model, dataloader):\n"
    "    steps_per_epoch = len(dataloader) // accelerator.num_processes\n"
    "    total_steps = 3 * steps_per_epoch\n"
    "    optimizer = torch.optim.AdamW(model.parameters())\n"
    "    scheduler = get_linear_schedule_with_warmup(optimizer, 10, total_steps)\n"
    "    dataloader = accelerator.prepare(dataloader)\n"
    "    model, scheduler, optimizer = accelerator.prepare(model, scheduler, optimizer)\n"
    "    return PreparedRun(model, optimizer, scheduler, dataloader, total_steps)\n"
    "\n"
    "\n"
    "def train(accelerator, run: PreparedRun):\n"
    "    batches = iter(run.dataloader)\n"
    "    while True:\n"
    "        batch = next(batches, None)\n"
    "        if batch is None:\n"
    "            break\n"
    "        accelerator.backward(run.model(**batch).loss)\n"
    "        run.optimizer.step()\n"
    "        run.scheduler.step()\n"
    "        run.optimizer.zero_grad()\n"
    "\n"
    "\n"
    "accelerator = Accelerator()\n"
    "train(accelerator, prepare_run(accelerator, model, dataloader))\n"
)

#: the same scheduler, prepared under another name and stepped by it
_RENAMED = _SIZED.replace("scheduler = accelerator.prepare", "warm = accelerator.prepare")
_RENAMED_LOOP = _LOOP.replace("scheduler.step()", "warm.step()")


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
    file), and a scheduler stepped once per epoch (ACC408's).

    The converse is reported too: ``len()`` of the DataLoader taken before ``prepare`` (every
    rank's batches) and then multiplied by ``accelerator.num_processes`` as well, the diffusers
    factor put on a count that already holds it (a ViT ImageNet trainer: ``num_training_steps
    * accelerator.num_processes`` with ``num_training_steps = len(trainloader) * epochs``). Each
    rank then steps it ``len / N`` times, ``N`` at each call: ``len`` a pass, so the schedule
    is N times too long, its warmup N times longer and its decay never reached. Not reported
    where the sizing divides by the process count anywhere (diffusers' ``math.ceil(len(loader)
    / accelerator.num_processes)`` multiplied back is right).

    So is the case of an Accelerator made in the file with ``step_scheduler_with_optimizer=False``
    (batches not split): a prepared scheduler then advances once per ``step()``, so one stepped
    per batch and sized with ``len()`` of the DataLoader before ``prepare`` (every rank's
    batches, no division by the process count) takes 1/N of its steps on each of N processes
    and runs N times too long (a trainer that sizes ``self.num_train_steps`` from the loader it
    is handed, then prepares both)."""

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
        # prepared under another name, stepped by that name: the same scheduler
        Example(_HEAD + _RENAMED.format(steps="len(loader) * 3") + _RENAMED_LOOP, 9, 28),
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
        # the converse: the whole DataLoader's length, taken before prepare, multiplied by the
        # process count as well (a ViT ImageNet trainer, lintreal38)
        Example(_BEFORE_PREPARE.format(steps="total_steps * accelerator.num_processes"), 11, 31),
        # ... and the whole length divided by the process count (one rank's steps) with no
        # factor multiplying it back (a multi-task RoBERTa trainer's ``max_steps_per_epoch =
        # len(dataloader) // accelerator.num_processes``, lintreal41)
        Example(_BEFORE_PREPARE.format(steps="total_steps // accelerator.num_processes"), 11, 31),
        # ... the process count read from the launcher's environment (review11b)
        Example(
            _BEFORE_PREPARE.format(steps="total_steps // int(os.environ['WORLD_SIZE'])"), 11, 31
        ),
        # ... the factor put on by an augmented assignment
        Example(
            _BEFORE_PREPARE.format(steps="total_steps").replace(
                "total_steps = len(loader) * 3\n",
                "total_steps = len(loader) * 3\ntotal_steps *= accelerator.num_processes\n",
            ),
            12,
            31,
        ),
        # stepped as a field of the record the factory returns, in a ``while`` loop that trains
        Example(_RECORD_RUN, 23, 62),
        # an Accelerator that steps a prepared scheduler once per call: sized with the whole
        # DataLoader before prepare, each rank steps it once per batch of its shard, and on N
        # processes the schedule is N times too long
        Example(
            _BEFORE_PREPARE.format(steps="total_steps").replace("Accelerator()", _ONCE), 11, 31
        ),
        Example(_ONCE_PER_CALL_TRAINER.format(steps="self.num_train_steps"), 16, 54),
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
        # the renamed one sized in all ranks' steps
        _HEAD
        + _RENAMED.format(steps="len(loader) * 3 * accelerator.num_processes")
        + _RENAMED_LOOP,
        # the record's scheduler sized in all ranks' steps
        _RECORD_RUN.replace(
            "get_linear_schedule_with_warmup(optimizer, 10, total_steps)",
            "get_linear_schedule_with_warmup(\n"
            "        optimizer, 10, total_steps * accelerator.num_processes\n    )",
        ),
        # divided by the process count and multiplied back: every rank's steps again
        _BEFORE_PREPARE.format(
            steps="(total_steps // accelerator.num_processes) * accelerator.num_processes"
        ),
        # ... the environment's count both ways, or on the prepared loader's length (review11b)
        _BEFORE_PREPARE.format(
            steps="total_steps // int(os.environ['WORLD_SIZE']) * int(os.environ['WORLD_SIZE'])"
        ),
        _HEAD + _SIZED.format(steps="len(loader) * 3 * int(os.environ['WORLD_SIZE'])") + _LOOP,
        # the converse's fix: the whole length alone, or the shard's length times the count
        _BEFORE_PREPARE.format(steps="len(loader) * 3"),
        _BEFORE_PREPARE.format(
            steps="math.ceil(len(loader) / accelerator.num_processes) * 3"
            " * accelerator.num_processes"
        ),
        # the whole length alone, the factor on the warmup (diffusers' convention) or on the
        # optimizer's learning rate: nothing multiplies the length twice
        _BEFORE_PREPARE.format(steps="total_steps").replace(
            "num_warmup_steps=100", "num_warmup_steps=100 * accelerator.num_processes"
        ),
        _BEFORE_PREPARE.format(steps="total_steps").replace(
            "AdamW(model.parameters())",
            "AdamW(model.parameters(), lr=1e-4 * accelerator.num_processes)",
        ),
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
        # stepped once per call and sized in one rank's steps: the prepared loader's length,
        # or the whole length divided by the process count
        _HEAD.replace("Accelerator()", _ONCE) + _SIZED.format(steps="len(loader) * 3") + _LOOP,
        _BEFORE_PREPARE.format(steps="total_steps // accelerator.num_processes").replace(
            "Accelerator()", _ONCE
        ),
        _ONCE_PER_CALL_TRAINER.format(
            steps="self.num_train_steps // self.accelerator.num_processes"
        ),
        # ... with the batches split across processes, every rank has the whole loader's count
        _BEFORE_PREPARE.format(steps="total_steps").replace(
            "Accelerator()", "Accelerator(step_scheduler_with_optimizer=False, split_batches=True)"
        ),
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        once = steps_once_per_call(script)
        if once is not None:
            yield from self._whole_length_stepped_once(script, once)
            return
        if not steps_once_per_process(script):
            return
        for _, argument in _stepped_per_batch(script):
            length = sized_by_a_prepared_loader(script, argument)
            if length is None:
                yield from self._counted_twice(script, argument)
                yield from self._divided_per_rank(script, argument)
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
                script,
                argument,
                message=in_file_words(text, accelerator_name(script, argument)),
                covers=_same_place(script, argument),
            )

    def _whole_length_stepped_once(self, script: ScriptModel, made: cst.Call) -> Iterator[Finding]:
        """``step_scheduler_with_optimizer=False``: a prepared scheduler steps once per call,
        so sized with the whole DataLoader's length (taken before prepare shards it) it runs
        N times too long on N processes."""
        for _, argument in _stepped_per_batch(script):
            found = _whole_length_divided_per_rank(script, argument, whole_only=True)
            if found is None:
                continue
            length, _ = found
            given = script.module.code_for_node(argument.value)
            text = (
                f"Size {given} in one rank's steps: it was sized with "
                f"{script.module.code_for_node(length)} (line {script.line(length)}), the "
                "batches of the DataLoader before prepare shards it (every rank's), and the "
                f"Accelerator made at line {script.line(made)} has "
                "step_scheduler_with_optimizer=False, so each step() advances it once and each "
                "rank steps it over its 1/N shard only: on N processes it takes 1/N of the "
                "steps one process takes, and its schedule, sized the same, runs N times too "
                "long (its decay not reached; a warmup sized from that length too); size it "
                "with len() of the prepared DataLoader, or divide its step counts by "
                "accelerator.num_processes"
            )
            yield self.finding(
                script, argument, message=in_file_words(text, accelerator_name(script, argument))
            )

    def _counted_twice(self, script: ScriptModel, argument: cst.Arg) -> Iterator[Finding]:
        found = _whole_length_times_processes(script, argument)
        if found is None:
            return
        length, count = found
        given = script.module.code_for_node(argument.value)
        text = (
            f"Size {given} without the num_processes factor: it was sized with "
            f"{script.module.code_for_node(length)} (line {script.line(length)}), the batches of "
            "the DataLoader before prepare shards it (every rank's), and multiplied by "
            f"{script.module.code_for_node(count)} (line {script.line(count)}) too; prepared, "
            "each rank steps it once per batch of its 1/N shard and each step() advances it "
            "num_processes times, one pass of that length, so on N processes its schedule is N "
            "times too long (the warmup too, the decay never reached); drop the factor, or "
            "multiply len() of the prepared DataLoader by it"
        )
        yield self.finding(
            script, argument, message=in_file_words(text, accelerator_name(script, argument))
        )

    def _divided_per_rank(self, script: ScriptModel, argument: cst.Arg) -> Iterator[Finding]:
        found = _whole_length_divided_per_rank(script, argument)
        if found is None:
            return
        length, division = found
        given = script.module.code_for_node(argument.value)
        text = (
            f"Size {given} in all ranks' steps: it was sized with "
            f"{script.module.code_for_node(length)} (line {script.line(length)}) divided by the "
            f"process count (line {script.line(division)}), one rank's batches, and prepared, "
            "each step() advances it num_processes times, so on N processes its schedule ends "
            "N times too soon (the warmup too); multiply its step counts by "
            "accelerator.num_processes, or leave it out of prepare"
        )
        yield self.finding(
            script,
            argument,
            message=in_file_words(text, accelerator_name(script, argument)),
            covers=_same_place(script, argument),
        )


def _stepped_per_batch(script: ScriptModel) -> list[tuple[str, cst.Arg]]:
    """Each prepared scheduler the file steps once per batch, with the argument of ``prepare``
    that passed it: one stepped per epoch is ACC408's, one never stepped here is no one's."""
    prepared = prepared_schedulers(script)
    steps = facts_of(script).flow.scheduler_steps(set(prepared))
    return [
        (name, argument)
        for name, argument in prepared.items()
        if any(step.scheduler == name and step.per_batch for step in steps)
    ]


def _same_place(script: ScriptModel, argument: cst.Arg) -> list[tuple[int, int, str]]:
    """ACC410's finding at this argument is the same bug (a prepared scheduler sized in one
    rank's steps, stepped by a loop that runs that many steps): this finding's advice fixes it
    too, and it names the sizing that makes the schedule N times too short, so it alone is
    reported (one finding per bug and place)."""
    start = script.position(argument).start
    return [(start.line, start.column + 1, "ACC410")]


_TWICE_DEPTH = 3


def _whole_length_times_processes(
    script: ScriptModel, argument: cst.Arg
) -> tuple[cst.Call, cst.CSTNode] | None:
    """The ``len(loader)`` and the process count a prepared scheduler's sizing multiplies,
    where ``loader`` is prepared only after that ``len()`` (by the same name): the whole
    DataLoader's batches, already every rank's. None when a division by the process count
    (or a length of an already prepared loader) is on the way."""
    prepare = next((a for a in script.ancestors(argument) if isinstance(a, cst.Call)), None)
    given = dotted(argument.value)
    if prepare is None or given is None:
        return None
    binding = last_binding(script, given, prepare)
    if not isinstance(binding, cst.Assign) or not isinstance(binding.value, cst.Call):
        return None
    # argument by argument: the factor must multiply the length itself, not the warmup
    # (``num_warmup_steps=100 * accelerator.num_processes``, diffusers' convention, right) nor
    # the optimizer's learning rate (``lr=base_lr * accelerator.num_processes``)
    skipped = script.names_of(Kind.MODEL, Kind.OPTIMIZER, Kind.ACCELERATOR)
    found: tuple[cst.Call, cst.CSTNode] | None = None
    for given_argument in binding.value.args:
        lengths: list[cst.Call] = []
        counts: list[cst.CSTNode] = []
        if not _collect(
            script, given_argument.value, binding, _TWICE_DEPTH, set(), lengths, counts, skipped
        ):
            return None  # a division by the process count anywhere: sized per rank on purpose
        whole = [n for n in lengths if _prepared_after(script, n)]
        if found is None and whole and len(whole) == len(lengths) and counts:
            found = whole[0], counts[0]
    return found


def _whole_length_divided_per_rank(
    script: ScriptModel, argument: cst.Arg, whole_only: bool = False
) -> tuple[cst.Call, cst.CSTNode | None] | None:
    """The ``len(loader)`` (taken before ``loader`` is prepared) and the division by the
    process count that a prepared scheduler's length argument reads, with no process-count
    factor multiplying it back: one rank's steps (a multi-task RoBERTa trainer's
    ``max_steps_per_epoch = len(dataloader) // accelerator.num_processes``), which the prepared
    scheduler steps N times at each call."""
    prepare = next((a for a in script.ancestors(argument) if isinstance(a, cst.Call)), None)
    given = dotted(argument.value)
    if prepare is None or given is None:
        return None
    binding = last_binding(script, given, prepare)
    if not isinstance(binding, cst.Assign) or not isinstance(binding.value, cst.Call):
        return None
    skipped = script.names_of(Kind.MODEL, Kind.OPTIMIZER, Kind.ACCELERATOR)
    for given_argument in binding.value.args:
        if given_argument.keyword is not None and "warmup" in given_argument.keyword.value:
            continue  # a warmup sized apart says nothing of the schedule's length
        lengths: list[cst.Call] = []
        counts: list[cst.CSTNode] = []
        divisions: list[cst.CSTNode] = []
        _collect(
            script,
            given_argument.value,
            binding,
            _TWICE_DEPTH,
            set(),
            lengths,
            counts,
            skipped,
            divisions,
        )
        if not lengths or counts or not all(_prepared_after(script, n) for n in lengths):
            continue
        if whole_only and not divisions:
            return lengths[0], None  # every rank's batches, as they are before prepare
        if not whole_only and divisions:
            return lengths[0], divisions[0]
    return None


def _collect(
    script: ScriptModel,
    expression: cst.CSTNode,
    at: cst.CSTNode,
    depth: int,
    seen: set[int],
    lengths: list[cst.Call],
    counts: list[cst.CSTNode],
    skipped: set[str],
    divisions: list[cst.CSTNode] | None = None,
) -> bool:
    """Gather the ``len()`` calls and process-count factors ``expression`` reads, through the
    names it reads (their last binding above ``at``) other than ``skipped`` (the model, the
    optimizer, the accelerator: what built them sizes nothing); False on a division by the
    count, unless ``divisions`` is given: it then gathers each such division (and the count
    it divides by is no factor)."""
    if id(expression) in seen:
        return True
    seen.add(id(expression))
    divisors: set[int] = set()
    for node in walk(expression):
        if id(node) in divisors:
            continue
        if isinstance(node, cst.BinaryOperation):
            divisor = script.module.code_for_node(node.right)
            dividing = isinstance(node.operator, (cst.Divide, cst.FloorDivide, cst.Modulo))
            if dividing and (
                PROCESS_COUNT.search(divisor) or process_count(script, node.right, at)
            ):
                if divisions is None:
                    return False
                divisions.append(node)
                divisors.update(id(n) for n in walk(node.right))
        if isinstance(node, cst.Call) and dotted(node.func) == "len" and len(node.args) == 1:
            lengths.append(node)
            continue
        if isinstance(node, (cst.Attribute, cst.Name)) and PROCESS_COUNT.fullmatch(
            node.attr.value if isinstance(node, cst.Attribute) else node.value
        ):
            counts.append(node)
            continue
        if isinstance(node, cst.Call) and process_count(script, node, at):
            counts.append(node)  # ``int(os.environ["WORLD_SIZE"])``, ``dist.get_world_size()``
            continue
        if depth > 0 and isinstance(node, (cst.Name, cst.Attribute)):
            parent = script.parent(node)
            if isinstance(parent, cst.Attribute) or (
                isinstance(parent, cst.Call) and parent.func is node
            ):
                continue  # ``args.epochs``, ``accelerator.num_processes``, a function called
            name = dotted(node)
            if name is None or name in skipped:
                continue
            if isinstance(node, cst.Attribute) and root_name(node) != "self":
                continue  # a setting (``args.max_steps``): nothing of the file binds it
            named = last_binding(script, name, at)
            while isinstance(named, cst.AugAssign):  # ``steps *= accelerator.num_processes``
                divisor = script.module.code_for_node(named.value)
                dividing = isinstance(
                    named.operator, (cst.DivideAssign, cst.FloorDivideAssign, cst.ModuloAssign)
                )
                if dividing and PROCESS_COUNT.search(divisor):
                    if divisions is None:
                        return False
                    divisions.append(named)
                elif not _collect(
                    script, named.value, named, depth - 1, seen, lengths, counts, skipped, divisions
                ):
                    return False
                named = last_binding(script, name, named)  # what it updated
            if isinstance(named, cst.Assign) and not _collect(
                script, named.value, named, depth - 1, seen, lengths, counts, skipped, divisions
            ):
                return False
    return True


def _prepared_after(script: ScriptModel, length: cst.Call) -> bool:
    """The loader ``len()`` measures is handed to a ``prepare`` below it, under the same name,
    in the same function, and no ``prepare`` above it returned that name."""
    name = dotted(length.args[0].value)
    if name is None:
        return False
    scope = script.scope_of(length)
    at = script.order(length)
    later = False
    for prepare in script.prepare_calls:
        if name not in prepare.outputs or script.scope_of(prepare.call) is not scope:
            continue
        if script.order(prepare.call) < at:
            return False
        later = later or name in prepare.inputs
    return later


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
