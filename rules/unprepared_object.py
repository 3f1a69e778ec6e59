from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.collectives import DEEPSPEED, backends_in_view
from accelify.analysis.dataflow import bound_by, local_alias, variables_in
from accelify.analysis.facts import facts_of
from accelify.analysis.flow import SchedulerStep, accumulate_context, once_per_optimizer_step
from accelify.analysis.loops import entry_read
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.objects import is_loader_dict, is_loader_tuple
from accelify.analysis.prepare_outputs import made_like_a_prepared_input
from accelify.analysis.process_count import process_count
from accelify.analysis.scheduler_preparation import PROCESS_COUNT, stepped_per_fixed_iteration
from accelify.analysis.script_model import Binding, Kind, Loop, PrepareCall, ScriptModel
from accelify.analysis.sharded_loaders import epoch_set_through, sharded_by_its_sampler
from accelify.analysis.single_device import single_device_twin
from accelify.analysis.step_loaders import over_step_data
from accelify.analysis.syntax import (
    assigned_targets,
    dotted,
    is_accelerator_call,
    keyword_argument,
    walk,
)
from accelify.analysis.wrapped_loaders import handed_wrapped, wrapped_at
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_argument,
    accelerator_name,
    calls,
    calls_in,
    optimizer_models,
)

_OBJECTS = (
    "import torch\n"
    "model = torch.nn.Linear(4, 1)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
)
_LOOP = (
    "for x, y in loader:\n"
    "    loss = (model(x) - y).pow(2).mean()\n"
    "    accelerator.backward(loss)\n"
    "    optimizer.step()\n"
)

#: An evaluation loader over a Subset of ``full`` picked by ``indices``, gathered per batch.
_SHARD_EVAL = (
    HEADER
    + "import torch\n"
    + "indices = {indices}\n"
    + "part = torch.utils.data.Subset(full, indices)\n"
    + "eval_loader = torch.utils.data.DataLoader(part, batch_size=8)\n"
    + "train_loader = torch.utils.data.DataLoader(full, batch_size=8)\n"
    + "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)\n"
    + "for x, y in train_loader:\n"
    + "    accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
    + "    optimizer.step()\n"
    + "correct = []\n"
    + "for x, y in eval_loader:\n"
    + "    with torch.no_grad():\n"
    + "        correct.append(accelerator.gather(model(x).argmax(-1) == y))\n"
)

#: An evaluation over ``eval_loader`` whose running total (``total += loss.item()``) is reduced
#: inside the loop, each pass; ``{prepared}`` are the objects prepared.
_RUNNING_TOTAL = (
    HEADER
    + _OBJECTS
    + "eval_loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
    + "{prepared} = accelerator.prepare({prepared})\n"
    + _LOOP
    + "total = 0.0\n"
    + "with torch.no_grad():\n"
    + "    for x, y in eval_loader:\n"
    + "        total += (model(x) - y).pow(2).mean().item()\n"
    + "        seen = accelerator.reduce(torch.tensor(total), reduction='sum')\n"
    + "print(seen.item())\n"
)

#: A time-series Exp (lintreal42): its loaders come from a data factory of another module;
#: train() prepares the training one, test() gathers outputs over the test one, unprepared.
_FACTORY_LOADERS = (
    "import numpy as np\n"
    "import torch\n"
    "from accelerate import Accelerator\n"
    "\n"
    "from data_provider.data_factory import data_provider\n"
    "\n"
    "\n"
    "class Exp:\n"
    "    def __init__(self, args, model):\n"
    "        self.args = args\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model = model\n"
    "\n"
    "    def _get_data(self, flag):\n"
    "        data_set, data_loader = data_provider(self.args, flag)\n"
    "        return data_set, data_loader\n"
    "\n"
    "    def train(self):\n"
    '        train_data, train_loader = self._get_data(flag="train")\n'
    "        optimizer = torch.optim.Adam(self.model.parameters())\n"
    "        self.model, train_loader, optimizer = self.accelerator.prepare(\n"
    "            self.model, train_loader, optimizer\n"
    "        )\n"
    "        for batch_x, batch_y in train_loader:\n"
    "            loss = ((self.model(batch_x) - batch_y) ** 2).mean()\n"
    "            self.accelerator.backward(loss)\n"
    "            optimizer.step()\n"
    "            optimizer.zero_grad()\n"
    "\n"
    "    def test(self):\n"
    '        test_data, test_loader = self._get_data(flag="test")\n'
    "        preds, trues = [], []\n"
    "        self.model.eval()\n"
    "        with torch.no_grad():\n"
    "            for batch_x, batch_y in test_loader:\n"
    "                outputs = self.model(batch_x)\n"
    "                outputs = self.accelerator.gather_for_metrics(outputs)\n"
    "                preds.append(outputs.cpu().numpy())\n"
    "                trues.append(batch_y.cpu().numpy())\n"
    "        preds = np.concatenate(preds)\n"
    "        trues = np.concatenate(trues)\n"
    "        return float(((preds - trues) ** 2).mean())\n"
)
#: An evaluation whose loader is never prepared, ``no_grad`` opened inside the loop (HF's
#: examples): every rank iterates the whole set and the gather joins N copies of it.
_GATHERED_EVALUATION = (
    HEADER
    + _OBJECTS
    + "eval_loader = torch.utils.data.DataLoader({data}, batch_size=8)\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + _LOOP
    + "model.eval()\n"
    + "preds = []\n"
    + "for x, y in eval_loader:\n"
    + "    with torch.no_grad():\n"
    + "        out = model(x.to(accelerator.device))\n"
    + "    preds.append(accelerator.gather_for_metrics(out))\n"
    + "assert len(torch.cat(preds)) == len(eval_set)\n"
)

#: A speech trainer's epoch: the training loop gathers each batch's lengths to cut every rank's
#: batch alike, then an evaluation over an unprepared loader scores the whole set on every rank,
#: ``{score}``: the gather above it reads none of its results.
_GATHER_ABOVE_EVALUATION = (
    HEADER
    + "import torch\n"
    + "eval_loader = torch.utils.data.DataLoader(eval_set, batch_size=8)\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for epoch in range(3):\n"
    + "    for x, y in loader:\n"
    + "        shortest = accelerator.gather(torch.tensor([len(x)])).min()\n"
    + "        accelerator.backward((model(x[:shortest]) - y[:shortest]).pow(2).mean())\n"
    + "        optimizer.step()\n"
    + "    preds = []\n"
    + "    for ex, ey in eval_loader:\n"
    + "        with torch.no_grad():\n"
    + "            preds.append(model(ex))\n"
    + "    accelerator.print({score})\n"
)

#: A wav2vec2 CTC fine-tuning loop: the scheduler, built after prepare and left out of it, sized
#: with the number of batches the run stops at and stepped on every batch inside accumulate();
#: ``{count}`` counts the batches (or, under a sync test, the optimizer steps).
_STOPPED_AT_THE_SCHEDULE_LENGTH = (
    "from accelify import Accelerator\n"
    + "from transformers import get_scheduler\n"
    + "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "lr_scheduler = get_scheduler(\n"
    + "    'linear', optimizer, num_warmup_steps=500, num_training_steps=args.train_steps\n"
    + ")\n\n\n"
    + "def train():\n"
    + "    global_step = 0\n"
    + "    while True:\n"
    + "        for step, batch in enumerate(loader):\n"
    + "            with accelerator.accumulate(model):\n"
    + "                accelerator.backward(model(**batch).loss)\n"
    + "                optimizer.step()\n"
    + "                lr_scheduler.step()\n"
    + "                optimizer.zero_grad()\n"
    + "{count}"
    + "            if global_step >= args.train_steps:\n"
    + "                return\n"
)

#: nanoGPT's fixed count of iterations, accumulated with accumulate(): the scheduler, made
#: before prepare and left out of it, stepped once per optimizer step (what the conversion of
#: a manual accumulation makes of its ``if (it + 1) % accum == 0:``)
_FIXED_ACCUMULATED = (
    "from accelify import Accelerator\n"
    "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
    "import torch\n"
    "optimizer = torch.optim.AdamW(model.parameters())\n"
    "scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)\n"
    "model, optimizer = accelerator.prepare(model, optimizer)\n"
    "for it in range(4000):\n"
    "    with accelerator.accumulate(model):\n"
    "        accelerator.backward(model(*get_batch('train')))\n"
    "        if accelerator.sync_gradients:\n"
    "            optimizer.step()\n"
    "            scheduler.step()\n"
    "            optimizer.zero_grad()\n"
)

#: a loop over an endless loader stopped at a fixed count of batches, its scheduler built after
#: prepare and stepped on every batch inside accumulate()
_CAPPED_BATCHES = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from transformers import get_scheduler\n"
    "accelerator = Accelerator(gradient_accumulation_steps=8)\n"
    "optimizer = torch.optim.AdamW(model.parameters(), lr=7e-6)\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "{total}"
    "lr_scheduler = get_scheduler(\n"
    "    'linear', optimizer=optimizer, num_warmup_steps=10,\n"
    "    num_training_steps=num_training_steps,\n)\n"
    "for step, batch in enumerate(loader):\n"
    "    if step >= 10000:\n"
    "        break\n"
    "    with accelerator.accumulate(model):\n"
    "        accelerator.backward(model(batch).mean())\n"
    "        optimizer.step()\n"
    "        lr_scheduler.step()\n"
    "        optimizer.zero_grad()\n"
)

#: a dict of two DataLoaders, each entry to be prepared on its own
_TWO_LOADERS = (
    "loaders = {'train': torch.utils.data.DataLoader(data), "
    "'test': torch.utils.data.DataLoader(data)}\n"
)


_HELPER = (
    "def train(net, batches):\n"
    "    for x, y in batches:\n"
    "        loss = (net(x) - y).pow(2).mean()\n"
    "        accelerator.backward(loss)\n"
    "        optimizer.step()\n"
)


_PREPARE_ALL = "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
#: a scheduler chosen by a flag, stepped per batch (cosine) or per epoch (step), left out of
#: prepare (no one step_scheduler_with_optimizer fits both); {size} sizes the cosine
_MIXED_PACE = (
    HEADER
    + _OBJECTS
    + "{before}"
    + "if args.sched == 'cosine':\n"
    + "    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max={size})\n"
    + "else:\n"
    + "    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 30)\n"
    + _PREPARE_ALL
    + "for epoch in range(args.epochs):\n"
    + "    for x, y in loader:\n"
    + "        accelerator.backward(model(x).sum())\n"
    + "        optimizer.step()\n"
    + "        if args.sched == 'cosine':\n"
    + "{step}"
    + "    if args.sched == 'step':\n"
    + "        scheduler.step()\n"
)


#: A trainer whose methods build the model, then its optimizer, then prepare what it names.
_SPLIT_TRAINER = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def setup_models(self):\n"
    "        self.unet = UNet()\n\n"
    "    def setup_optimizer(self):\n"
    "        self.opt = torch.optim.AdamW(self.unet.parameters(), lr=1e-4)\n\n"
    "    def setup(self):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.setup_models()\n"
    "        self.setup_optimizer()\n"
    "        {prepared} = self.accelerator.prepare({prepared})\n\n"
    "    def step(self, batch):\n"
    "        self.accelerator.backward(self.unet(batch).loss)\n"
    "        self.opt.step()\n\n"
    "    def fit(self):\n"
    "        self.setup()\n"
    "        for batch in self.loader:\n"
    "            self.step(batch)\n"
)


_BUCKET = (
    HEADER
    + "import torch\n"
    + "from torch.utils.data import DataLoader, Sampler\n\n\n"
    + "class BucketSampler(Sampler):\n"
    + "    def __init__(self, lengths, batch_size{params}):\n"
    + "        self.lengths, self.batch_size, self.epoch = lengths, batch_size, 0\n"
    + "{init}"
    + "\n    def set_epoch(self, epoch):\n"
    + "        self.epoch = epoch\n\n"
    + "    def __iter__(self):\n"
    + "        order = torch.randperm(len(self.lengths)).tolist(){shard}\n"
    + "        return iter([order[i : i + 8] for i in range(0, len(order), 8)])\n\n\n"
    + "model, optimizer = accelerator.prepare(model, optimizer)\n"
    + "loader = DataLoader(data, batch_sampler=BucketSampler(lengths, 8{arguments}))\n"
    + "for epoch in range(3):\n"
    + "    loader.batch_sampler.set_epoch(epoch)\n"
    + "    for x, y in loader:\n"
    + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
    + "        optimizer.step()\n"
)


_NOTHING_PREPARED = (
    "import torch\n"
    + HEADER.replace("Accelerator()", "Accelerator({settings})")
    + "model = Net().to(accelerator.device)\n"
    + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    + "loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)\n"
    + "for x, y in loader:\n"
    + "    x, y = x.to(accelerator.device), y.to(accelerator.device)\n"
    + "    accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
    + "    optimizer.step()\n"
    + "    optimizer.zero_grad()\n"
)


#: a script's ``main()`` that makes its Accelerator and sizes a per-batch OneCycleLR from the
#: loader it then prepares ({before}/{after}: the scheduler built before or after the prepare,
#: {prepared}: what the prepare returns)
_MAIN_ONE_CYCLE = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "def main(args):\n"
    "    accelerator = Accelerator()\n"
    "    train_loader = torch.utils.data.DataLoader(train_set, batch_size=32, shuffle=True)\n"
    "    model = Net()\n"
    "    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)\n"
    "{before}"
    "    {prepared} = accelerator.prepare({prepared})\n"
    "{after}"
    "    for epoch in range(args.epochs):\n"
    "        for x, y in train_loader:\n"
    "            loss = torch.nn.functional.cross_entropy(model(x), y)\n"
    "            accelerator.backward(loss)\n"
    "            optimizer.step()\n"
    "            scheduler.step()\n"
    "            optimizer.zero_grad()\n\n\n"
    "main(parse_args())\n"
)

#: A OneCycleLR sized per epoch from the loader before prepare, stepped on every batch inside
#: accumulate(); {size} is its steps_per_epoch, {prepared} what the prepare returns.
_ACCUMULATED_ONE_CYCLE = (
    "import torch\nfrom accelerate import Accelerator\n"
    "accelerator = Accelerator(gradient_accumulation_steps=2)\n"
    "loader = torch.utils.data.DataLoader(train_set, batch_size=32, shuffle=True)\n"
    "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    "scheduler = torch.optim.lr_scheduler.OneCycleLR(\n"
    "    optimizer, max_lr=1e-3, epochs=10, steps_per_epoch={size}\n"
    ")\n"
    "{prepared} = accelerator.prepare({prepared})\n"
    "for epoch in range(10):\n"
    "    for x, y in loader:\n"
    "        with accelerator.accumulate(model):\n"
    "            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
    "            optimizer.step()\n"
    "            scheduler.step()\n"
    "            optimizer.zero_grad()\n"
)

_ONE_CYCLE = (
    "    scheduler = torch.optim.lr_scheduler.OneCycleLR(\n"
    "        optimizer, max_lr=args.lr, total_steps=args.epochs * len(train_loader)\n"
    "    )\n"
)


#: the Jovian notebooks' loaders: wrapped in a class of the file that moves each batch to the
#: device, then handed to a fit function that prepares the model and the optimizer and steps a
#: OneCycleLR over the whole training loader ({prepared}: the line above the wrap)
_DEVICE_WRAPPED_FIT = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from torch.utils.data import DataLoader, TensorDataset\n\n"
    "accelerator = Accelerator()\n\n\n"
    "class DeviceDataLoader:\n"
    "    def __init__(self, dl, device):\n"
    "        self.dl, self.device = dl, device\n\n"
    "    def __iter__(self):\n"
    "        for x, y in self.dl:\n"
    "            yield x.to(self.device), y.to(self.device)\n\n"
    "    def __len__(self):\n"
    "        return len(self.dl)\n\n\n"
    "def fit_one_cycle(epochs, model, train_loader):\n"
    "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    model, optimizer = accelerator.prepare(model, optimizer)\n"
    "    sched = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, epochs=epochs, "
    "steps_per_epoch=len(train_loader))\n"
    "    for epoch in range(epochs):\n"
    "        for x, y in train_loader:\n"
    "            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))\n"
    "            optimizer.step()\n"
    "            optimizer.zero_grad()\n"
    "            sched.step()\n\n\n"
    "train_dl = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)\n"
    "{prepared}"
    "train_dl = DeviceDataLoader(train_dl, accelerator.device)\n"
    "fit_one_cycle(2, torch.nn.Linear(4, 1), train_dl)\n"
)


class UnpreparedObject(Rule):
    """A DataLoader, a trained model, its optimizer or a per-step LR scheduler that the training
    loop uses without it having gone through ``accelerator.prepare`` (or under its old name after
    ``new = accelerator.prepare(old)``). An unprepared DataLoader feeds every rank the whole
    dataset; an unprepared model's gradients are never averaged across ranks, so the copies
    drift apart; an unprepared optimizer skips the accumulation and mixed-precision handling.
    Models outside every optimizer (a frozen encoder, a teacher), schedulers stepped once per
    epoch, a scheduler built after ``prepare`` (sized in per-process steps) and stepped
    beside the optimizer outside ``accumulate()``, a scheduler sized in batches (``max_steps *
    gradient_accumulation_steps``) and stepped on every batch inside it, a scheduler stepped
    in a loop of a fixed count every rank runs whole (``for it in range(max_iters)``) once per
    optimizer step (inside ``accumulate()``, under ``if accelerator.sync_gradients:``), a
    scheduler sized from the dataset's length in a file that splits a global batch over the
    processes by hand (``batch_size=cfg.batch_size // world_size``) and stepped once per
    optimizer step, a scheduler sized with a loader's ``len()`` divided by the process count
    (each rank's own steps) and stepped once per optimizer step, and a DataLoader rebuilt
    every step over the rollouts this rank just made (``DataLoader(TensorDataset(*rollouts))``
    in a helper the training loop calls) are left
    alone: not preparing them is correct. A loader whose sampler's epoch the script sets
    (``loader.sampler.set_epoch(epoch)``) is taken as sharded by a DistributedSampler made
    where it is (a plain sampler has no ``set_epoch``), unless the file shows the sampler: one
    of its classes that neither subclasses DistributedSampler nor reads a rank or a replica
    count, itself or through the file's classes it subclasses (a bucket sampler whose
    ``set_epoch`` seeds its shuffle), or a torch sampler that does
    not shard; such a loader is reported, and the message says to call ``set_epoch`` on the
    sampler object itself (the prepared loader's sampler is the Accelerator's shard wrapper).
    A file that prepares nothing at all is data-parallel in nothing (each rank trains its own
    copy on all the data: correct, N times the work), and is reported only where its own
    Accelerator sets ``mixed_precision="fp16"`` or ``gradient_accumulation_steps`` and trains
    through ``accelerator.backward``: the unprepared optimizer's ``step()`` then steps the
    scaled (or divided, every batch) gradients. With accumulation, a ``step()`` under a ``%``
    or ``sync_gradients`` test or inside ``accumulate()`` steps once per cycle, on the mean
    the divided losses add up to: not reported. A prepare indented into one branch of an
    ``if``/``elif`` chain whose other branches build the same objects (a scheduler chosen by
    name) is reported at the prepare: on those branches the training after the chain uses
    everything unprepared.

    An evaluation loop over an unprepared DataLoader that gathers what it computes from its
    batches (``accelerator.gather_for_metrics(out)`` in the loop; ``no_grad`` around the loop or
    opened inside it) is reported at the loader: every rank iterates the whole set, so the
    gather hands back num_processes copies of each sample (counts and sums N times too large,
    ``len(preds) == len(dataset)`` fails). Not where the data set is cut by the rank itself
    (``dataset.shard(num_processes, process_index)``): each rank gathers its own part. One that
    gathers nothing computes the whole set's numbers on every rank, which is right.

    A scheduler stepped both per batch and per epoch (chosen by a flag) is rightly left out of
    ``prepare`` (its per-epoch steps would count N times); its per-batch step is reported where
    it is sized in the whole loader's batches (``len(loader)`` before prepare) and stepped once
    per batch of a rank's shard, not ``num_processes`` times: the schedule ends N times late."""

    code = "ACC401"
    name = "unprepared-object"
    message = "Pass this to accelerator.prepare and use what it returns"
    why = "Unprepared loaders are not sharded and unprepared models are not synchronised."
    bad = (
        # a loader a class of the file wraps: prepared before the wrap, or not at all (its
        # scheduler, stepped over the whole loader, rightly left out)
        Example(_DEVICE_WRAPPED_FIT.format(prepared=""), 34, 41),
        # sized with the count the run stops at, but that count is of optimizer steps: stepped
        # on every batch, the schedule ends gradient_accumulation_steps times too early
        Example(
            _STOPPED_AT_THE_SCHEDULE_LENGTH.format(
                count="            if accelerator.sync_gradients:\n"
                + "                global_step += 1\n"
            ),
            17,
            17,
        ),
        # a runner collecting its evaluation into a member, gathered after the loop
        Example(
            "import torch\n"
            "from accelerate import Accelerator\n"
            "from torch.utils.data import DataLoader\n"
            "\n"
            "\n"
            "class Runner:\n"
            "    def __init__(self, model, optimizer, train_set, eval_set):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.eval_loader = DataLoader(eval_set, batch_size=8)\n"
            "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
            "            model, optimizer, DataLoader(train_set, batch_size=8)\n"
            "        )\n"
            "        self.preds = []\n"
            "\n"
            "    def evaluate(self):\n"
            "        self.model.eval()\n"
            "        for x, y in self.eval_loader:\n"
            "            with torch.no_grad():\n"
            "                self.preds.append(self.model(x))\n"
            "        return self.accelerator.gather_for_metrics(torch.cat(self.preds))\n",
            17,
            21,
        ),
        # the gather of an evaluation over an unprepared loader: N copies of every sample
        Example(_GATHERED_EVALUATION.format(data="eval_set"), 15, 13),
        # the same results gathered after the evaluation, below a training loop's own gather
        Example(
            _GATHER_ABOVE_EVALUATION.format(
                score="score(accelerator.gather_for_metrics(torch.cat(preds)))"
            ),
            12,
            19,
        ),
        # the test loader made by the call that made the prepared training loader
        Example(_FACTORY_LOADERS, 35, 37),
        # a trainer whose constructor sizes the scheduler (in a method written below it) from
        # the loader before preparing the loader: the whole dataset's steps, stepped per rank;
        # a plateau scheduler of another configuration steps once per epoch
        Example(
            "import torch\n"
            "from torch.optim.lr_scheduler import ReduceLROnPlateau\n"
            "from accelerate import Accelerator\n"
            "from transformers import get_scheduler\n"
            "class Trainer:\n"
            "    def __init__(self, cfg):\n"
            "        self.accelerator = Accelerator(gradient_accumulation_steps=2)\n"
            "        self.model = torch.nn.Linear(4, 1)\n"
            "        self.loader = torch.utils.data.DataLoader(cfg.data, batch_size=8)\n"
            "        self.optimizer = torch.optim.AdamW(self.model.parameters())\n"
            "        self.setup_scheduler(cfg)\n"
            "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
            "            self.model, self.optimizer, self.loader\n"
            "        )\n"
            "    def setup_scheduler(self, cfg):\n"
            "        if cfg.plateau:\n"
            "            self.scheduler = ReduceLROnPlateau(self.optimizer)\n"
            "            return\n"
            "        per_epoch = len(self.loader) // 2\n"
            "        total = per_epoch * cfg.epochs\n"
            "        self.scheduler = get_scheduler('linear', self.optimizer, 0, total)\n"
            "    def train(self, cfg):\n"
            "        for epoch in range(cfg.epochs):\n"
            "            for x, y in self.loader:\n"
            "                with self.accelerator.accumulate(self.model):\n"
            "                    self.accelerator.backward((self.model(x) - y).pow(2).mean())\n"
            "                    self.optimizer.step()\n"
            "                    if self.accelerator.sync_gradients and not isinstance(\n"
            "                        self.scheduler, ReduceLROnPlateau\n"
            "                    ):\n"
            "                        self.scheduler.step()\n"
            "            if isinstance(self.scheduler, ReduceLROnPlateau):\n"
            "                self.scheduler.step(self.validate())\n",
            31,
            25,
        ),
        # stepped per batch and per epoch, sized in the whole loader's batches, and stepped
        # once per rank's batch: on N ranks the cosine ends N times late
        Example(
            _MIXED_PACE.format(
                before="total_steps = len(loader) * args.epochs\n",
                size="total_steps",
                step="            scheduler.step()\n",
            ),
            18,
            13,
        ),
        # a diffusion trainer: each trainable model prepared into the loop variable, dropped
        Example(
            HEADER + "import torch\n"
            "class Trainer:\n"
            "    def setup(self):\n"
            "        self.models = [self.vae, self.unet]\n"
            "        for model in self.models:\n"
            "            if model.trainable:\n"
            "                model = accelerator.prepare(model)\n"
            "            else:\n"
            "                model.requires_grad_(False)\n",
            9,
            25,
        ),
        Example(  # a pool that grows over the run (never emptied): a dataset, not this step's data
            HEADER
            + "from torch.utils.data import DataLoader\n"
            + "model, optimizer = accelerator.prepare(model, optimizer)\n"
            + "pool = []\n"
            + "for shard in shards:\n"
            + "    pool.extend(load(shard))\n"
            + "    loader = DataLoader(pool, batch_size=8)\n"
            + "    for x, y in loader:\n"
            + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
            + "        optimizer.step()\n",
            9,
            17,
        ),
        # the same evaluation over a Subset that keeps every index: the rank is read
        # elsewhere, not in what picks the samples
        Example(
            _SHARD_EVAL.format(indices="list(range(len(full)))\nseed = accelerator.process_index"),
            14,
            13,
        ),
        Example(  # a loader made once, in a helper, over the whole data: not sharded
            HEADER
            + "from torch.utils.data import DataLoader, TensorDataset\n"
            + "model, optimizer = accelerator.prepare(model, optimizer)\n\n\n"
            + "def learn(x, y):\n"
            + "    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)\n"
            + "    for xb, yb in loader:\n        loss = (model(xb) - yb).pow(2).mean()\n"
            + "        accelerator.backward(loss)\n        optimizer.step()\n\n\n"
            + "learn(features, labels)\n",
            9,
            19,
        ),
        Example(
            HEADER
            + _OBJECTS
            + "model, optimizer = accelerator.prepare(model, optimizer)\n"
            + _LOOP,
            8,
            13,
        ),
        Example(
            HEADER
            + _OBJECTS
            + "ddp_model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + _LOOP,
            9,
            13,
        ),
        # the optimizer from a project's helper that returns it beside its scheduler, the model
        # prepared under another name and trained under its old one (a music-LLM trainer)
        Example(
            HEADER
            + "model = get_model(configs)\n"
            + "optimizer, scheduler = get_optimizer_and_scheduler(params=model.parameters())\n"
            + "llm, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + _LOOP,
            7,
            13,
        ),
        Example(
            HEADER
            + _OBJECTS
            + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + _LOOP
            + "    scheduler.step()\n",
            13,
            5,
        ),
        # built after prepare, but sized by the loader that was never prepared (total steps)
        Example(
            HEADER
            + _OBJECTS
            + "model, optimizer, train_loader = accelerator.prepare(model, optimizer, loader)\n"
            + "scheduler = torch.optim.lr_scheduler.OneCycleLR(\n"
            + "    optimizer, max_lr=0.1, total_steps=len(loader) * 3\n)\n"
            + _LOOP.replace("in loader", "in train_loader")
            + "    scheduler.step()\n",
            15,
            5,
        ),
        # built after prepare but stepped on every batch inside accumulate(): the prepared
        # optimizer skips the steps that only accumulate, the scheduler does not
        Example(
            HEADER
            + _OBJECTS
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "scheduler = torch.optim.lr_scheduler.OneCycleLR(\n"
            + "    optimizer, max_lr=0.1, total_steps=len(loader) * 3\n)\n"
            + "for x, y in loader:\n"
            + "    with accelerator.accumulate(model):\n"
            + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
            + "        optimizer.step()\n"
            + "        scheduler.step()\n",
            15,
            9,
        ),
        # gathered over an unprepared loader: every rank brings the whole set, counted N times
        Example(
            HEADER
            + _OBJECTS
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "test_loader = torch.utils.data.DataLoader(test, batch_size=8)\n"
            + "seen = 0\nwith torch.no_grad():\n    for x, y in test_loader:\n"
            + "        seen += len(accelerator.gather_for_metrics(model(x)))\n",
            11,
            17,
        ),
        Example(
            HEADER
            + _OBJECTS
            + "model, optimizer = accelerator.prepare(model, optimizer)\n"
            + _HELPER
            + "train(model, loader)\n",
            13,
            14,
        ),
        # a trainer's prepare indented into the last branch of its scheduler choice: with
        # the default "cosine" nothing is prepared (a Tez-style boilerplate Trainer)
        Example(
            HEADER
            + _OBJECTS
            + "if kind == 'cosine':\n"
            + "    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 10)\n"
            + "elif kind == 'linear':\n"
            + "    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer)\n"
            + "    model, optimizer, loader, scheduler = accelerator.prepare(\n"
            + "        model, optimizer, loader, scheduler\n    )\n"
            + _LOOP
            + "    scheduler.step()\n",
            11,
            43,
        ),
        # the prepare in the else of an optimizer choice: the SGD branch trains unprepared
        Example(
            HEADER
            + _OBJECTS
            + "if args.optim == 'sgd':\n"
            + "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "else:\n"
            + "    optimizer = torch.optim.AdamW(model.parameters())\n"
            + "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + _LOOP,
            11,
            32,
        ),
        # one entry of a dict prepared back into its place, the loop reading another entry
        Example(
            HEADER
            + _OBJECTS
            + _TWO_LOADERS
            + "loaders['train'], model, optimizer = accelerator.prepare(\n"
            + "    loaders['train'], model, optimizer\n)\n"
            + _LOOP.replace("in loader", "in loaders['test']"),
            11,
            13,
        ),
        # a dict of loaders handed to prepare whole: it comes back untouched
        Example(
            HEADER
            + _OBJECTS
            + 'loaders = {"train": torch.utils.data.DataLoader(data, batch_size=8)}\n'
            + "model, optimizer, loaders = accelerator.prepare(model, optimizer, loaders)\n"
            + _LOOP.replace("in loader", 'in loaders["train"]'),
            9,
            13,
        ),
        # a fixed count of iterations, but stepped on every batch inside accumulate(): four
        # times per optimizer step (prepared it would step once per rank instead: ACC410)
        Example(
            _FIXED_ACCUMULATED.replace("            scheduler.step()\n", "").replace(
                "            optimizer.zero_grad()\n",
                "            optimizer.zero_grad()\n        scheduler.step()\n",
            ),
            13,
            9,
        ),
        # a trainer builds its optimizer in one method over the models another sets, prepares
        # the models in a third, and steps in the step its training loop calls
        Example(_SPLIT_TRAINER.format(prepared="self.unet, self.loader"), 20, 9),
        # a project's bucket sampler with its own set_epoch (the shuffle's seed): it does not
        # shard, so every rank reads the whole data set
        Example(_BUCKET.format(params="", init="", shard="", arguments=""), 23, 17),
        # nothing prepared, fp16 on: the Accelerator's backward scales the loss, and the
        # optimizer steps the scaled gradients
        Example(_NOTHING_PREPARED.format(settings='mixed_precision="fp16"'), 10, 5),
        # main() makes the Accelerator and prepares its own locals: its loop is the distributed
        # one (no single-device twin), and the OneCycleLR sized from len(train_loader) before
        # prepare, left out of it, gets 1/N of the way on N processes
        Example(
            _MAIN_ONE_CYCLE.format(
                before=_ONE_CYCLE, prepared="model, optimizer, train_loader", after=""
            ),
            19,
            13,
        ),
        # ... inside accumulate(): stepping it with the optimizer alone would leave it 1/N
        # of the way too; prepared and sized in optimizer steps it fits
        Example(
            _ACCUMULATED_ONE_CYCLE.format(size="len(loader)", prepared="model, optimizer, loader"),
            15,
            13,
        ),
        # a running total kept with ``+=`` and reduced inside the loop (the mean so far, each
        # pass): the total follows the batches, so over the unprepared loader every rank brings
        # the whole set and the sum counts it N times
        Example(_RUNNING_TOTAL.format(prepared="model, optimizer, loader"), 15, 17),
        # ... sized below the loop's 10000 batches: in optimizer steps, and stepped per batch
        # it reaches its end after 1/gradient_accumulation_steps of the run
        Example(_CAPPED_BATCHES.format(total="num_training_steps = 1250\n"), 18, 9),
    )
    good = (
        # sized with the count of batches the run stops at, stepped on every batch: as meant
        _STOPPED_AT_THE_SCHEDULE_LENGTH.format(count="            global_step += 1\n"),
        # the whole set scored on every rank: the training loop's gather reads none of it
        _GATHER_ABOVE_EVALUATION.format(score="score(torch.cat(preds))"),
        # ... prepared before the wrap: sharded, the scheduler sized by its shard's length
        _DEVICE_WRAPPED_FIT.format(prepared="train_dl = accelerator.prepare(train_dl)\n"),
        # ... prepared before the evaluation gathers over it, the labels gathered beside
        _FACTORY_LOADERS.replace(
            "        preds, trues = [], []\n",
            "        test_loader = self.accelerator.prepare(test_loader)\n"
            "        preds, trues = [], []\n",
        ).replace(
            "outputs = self.accelerator.gather_for_metrics(outputs)",
            "outputs, batch_y = self.accelerator.gather_for_metrics((outputs, batch_y))",
        ),
        # ... none of the factory's loaders prepared: nothing says it makes loaders
        _FACTORY_LOADERS.replace(
            "self.model, train_loader, optimizer = self.accelerator.prepare(",
            "self.model, optimizer = self.accelerator.prepare(",
        ).replace(
            "            self.model, train_loader, optimizer\n",
            "            self.model, optimizer\n",
        ),
        # the running total reduced in the loop over a prepared loader: each rank's shard once
        _RUNNING_TOTAL.format(prepared="model, optimizer, loader, eval_loader"),
        # a base trainer's constructor reads its loader whole before the subclass prepares it
        # (label statistics, a batch count): the raw loader is the whole set on every rank, so
        # every rank computes the same numbers, and prepare builds its own loader from it
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        "class BaseTrainer:\n"
        "    def __init__(self, model, optimizer, loader):\n"
        "        self.model, self.optimizer, self.loader = model, optimizer, loader\n"
        "        total, count = 0.0, 0\n"
        "        for x, y in self.loader:\n"
        "            total += y.float().sum().item()\n"
        "            count += len(y)\n"
        "        self.label_mean = total / count\n\n\n"
        "class Trainer(BaseTrainer):\n"
        "    def __init__(self, model, optimizer, loader):\n"
        "        super().__init__(model, optimizer, loader)\n"
        "        self.accelerator = Accelerator()\n"
        "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
        "            self.model, self.optimizer, self.loader\n"
        "        )\n\n"
        "    def fit(self, epochs):\n"
        "        for _ in range(epochs):\n"
        "            for x, y in self.loader:\n"
        "                loss = (self.model(x).squeeze(-1) - (y - self.label_mean)).pow(2).mean()\n"
        "                self.accelerator.backward(loss)\n"
        "                self.optimizer.step()\n",
        # the evaluation set cut by the rank itself: each rank gathers its own part
        _GATHERED_EVALUATION.format(
            data="eval_set.shard(accelerator.num_processes, accelerator.process_index)"
        ),
        # nothing prepared, nothing the backward changes: each rank trains its own copy on all
        # the data (correct, not data-parallel: convert leaves such a file so, with a review)
        _NOTHING_PREPARED.format(settings=""),
        # ... or accumulation stepped once per cycle, by hand or on the synced batches: the
        # backward's division by the steps makes the accumulated gradient their mean
        _NOTHING_PREPARED.format(settings="gradient_accumulation_steps=4")
        .replace("for x, y in loader:", "for i, (x, y) in enumerate(loader):")
        .replace(
            "    optimizer.step()\n    optimizer.zero_grad()\n",
            "    if (i + 1) % 4 == 0:\n        optimizer.step()\n        optimizer.zero_grad()\n",
        ),
        _NOTHING_PREPARED.format(settings="gradient_accumulation_steps=4").split("for x")[0]
        + "for x, y in loader:\n"
        + "    with accelerator.accumulate(model):\n"
        + "        accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
        + "        if accelerator.sync_gradients:\n"
        + "            optimizer.step()\n"
        + "            optimizer.zero_grad()\n",
        # ... that one shards itself: it reads its rank and the replica count
        _BUCKET.format(
            params=", rank, num_replicas",
            init="        self.rank, self.num_replicas = rank, num_replicas\n",
            shard="[self.rank :: self.num_replicas]",
            arguments=", accelerator.process_index, accelerator.num_processes",
        ),
        # ... or through a class of the file that subclasses DistributedSampler
        _BUCKET.format(params="", init="", shard="", arguments="")
        .replace(
            "DataLoader, Sampler\n\n\n",
            "DataLoader, DistributedSampler\n\n\nclass ShardSampler(DistributedSampler):\n"
            "    pass\n\n\n",
        )
        .replace("BucketSampler(Sampler)", "BucketSampler(ShardSampler)"),
        # a classifier trainer handed a dataset object whose loaders it never prepares: every
        # rank steps the scheduler once per batch of the whole set, as its len() sized it;
        # prepared, it would step num_processes times per call
        "import torch\nfrom accelerate import Accelerator\n"
        "from transformers import get_scheduler\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, model, dataset, epochs):\n"
        "        self.dataset = dataset\n"
        "        self.optimizer = torch.optim.AdamW(model.parameters())\n"
        "        self.lr_scheduler = get_scheduler(\n"
        "            'linear', self.optimizer, 0, epochs * len(dataset.train_dataloader))\n"
        "        self.accelerator = Accelerator()\n"
        "        self.model, self.optimizer = self.accelerator.prepare(model, self.optimizer)\n\n"
        "    def train_epoch(self):\n"
        "        for batch in self.dataset.train_dataloader:\n"
        "            self.accelerator.backward(self.model(**batch).loss)\n"
        "            self.optimizer.step()\n"
        "            self.lr_scheduler.step()\n"
        "            self.optimizer.zero_grad()\n",
        # a loader sharded by its own DistributedSampler: prepared, it would be sharded twice
        HEADER
        + "import torch\n"
        + "from torch.utils.data.distributed import DistributedSampler\n"
        + "model = torch.nn.Linear(4, 1)\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "sampler = DistributedSampler(data, shuffle=True)\n"
        + "loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)\n"
        + "for epoch in range(3):\n"
        + "    sampler.set_epoch(epoch)\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n",
        # a batch sampler over a DistributedSampler (by name or in place): its batches hold
        # this rank's indices only, so the loader is sharded already
        HEADER
        + "import torch\n"
        + "from torch.utils.data import BatchSampler, DataLoader\n"
        + "from torch.utils.data.distributed import DistributedSampler\n"
        + "model = torch.nn.Linear(4, 1)\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "batches = BatchSampler(DistributedSampler(data, shuffle=True), 8, drop_last=False)\n"
        + "loader = DataLoader(data, batch_sampler=batches)\n"
        + "eval_loader = DataLoader(\n"
        + "    data, batch_sampler=BatchSampler(DistributedSampler(data), 8, False)\n"
        + ")\n"
        + "for epoch in range(3):\n"
        + "    loader.batch_sampler.sampler.set_epoch(epoch)\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n"
        + "    for x, y in eval_loader:\n"
        + "        print(model(x).sum())\n",
        # an evaluation set cut by the rank through two names (indices, then a Subset): each
        # rank gathers its own part
        _SHARD_EVAL.format(
            indices="list(range(accelerator.process_index, len(full), accelerator.num_processes))"
        ),
        # a loader over what split_between_processes hands this rank
        HEADER
        + "import torch\n"
        + "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)\n"
        + "for x in train_loader:\n"
        + "    accelerator.backward(model(x).sum())\n"
        + "    optimizer.step()\n"
        + "outputs = []\n"
        + "with accelerator.split_between_processes(eval_rows) as rows:\n"
        + "    eval_loader = torch.utils.data.DataLoader(rows, batch_size=8)\n"
        + "    for batch in eval_loader:\n"
        + "        with torch.no_grad():\n"
        + "            outputs.append(accelerator.gather(model(batch).argmax(-1)))\n",
        # every rank times the whole probe set and gathers its timings, not the batches
        HEADER
        + "import time\nimport torch\n"
        + "probe_loader = torch.utils.data.DataLoader(data, batch_size=64)\n"
        + "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)\n"
        + "for x, y in train_loader:\n"
        + "    accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
        + "    optimizer.step()\n"
        + "times = []\n"
        + "for x, y in probe_loader:\n"
        + "    start = time.time()\n"
        + "    with torch.no_grad():\n"
        + "        model(x)\n"
        + "    elapsed = torch.tensor([time.time() - start])\n"
        + "    times.append(accelerator.gather(elapsed))\n",
        # the same with gradients off around the loop
        HEADER
        + "import time\nimport torch\n"
        + "probe_loader = torch.utils.data.DataLoader(data, batch_size=64)\n"
        + "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)\n"
        + "for x, y in train_loader:\n"
        + "    accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
        + "    optimizer.step()\n"
        + "times = []\n"
        + "with torch.no_grad():\n"
        + "    for x, y in probe_loader:\n"
        + "        start = time.time()\n"
        + "        model(x)\n"
        + "        elapsed = torch.tensor([time.time() - start])\n"
        + "        times.append(accelerator.gather(elapsed))\n",
        # ... or a member of the evaluator that the loop's batch name also spells (``self.x``)
        HEADER
        + "import torch\n"
        + "class Evaluator:\n"
        + "    def __init__(self, accelerator, model, data):\n"
        + "        self.accelerator, self.model, self.x = accelerator, model, torch.zeros(1)\n"
        + "        self.probe_loader = torch.utils.data.DataLoader(data, batch_size=64)\n"
        + "    def run(self):\n"
        + "        for x, y in self.probe_loader:\n"
        + "            with torch.no_grad():\n"
        + "                self.model(x)\n"
        + "            self.x = self.accelerator.gather(self.x)\n"
        + "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)\n"
        + "for x, y in train_loader:\n"
        + "    accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
        + "    optimizer.step()\n"
        + "Evaluator(accelerator, model, data).run()\n",
        # a project helper's loader whose sampler takes the epoch: a DistributedSampler made
        # where the loader is (a plain sampler has no set_epoch), so each rank reads its part
        "from accelerate import Accelerator\n"
        "from torch.utils.data import DataLoader\n"
        "from project.data import get_local_dataloader, ShardDataset\n"
        "def train(accelerator, model, optimizer, args):\n"
        "    model, optimizer = accelerator.prepare(model, optimizer)\n"
        "    per_rank = args.batch_size // accelerator.num_processes\n"
        "    if args.streaming:\n"
        "        loader = DataLoader(ShardDataset(args.shards), batch_size=1)\n"
        "    else:\n"
        "        loader = get_local_dataloader(args.shards, per_rank)\n"
        "    for epoch in range(args.epochs):\n"
        "        if not args.streaming:\n"
        "            loader.sampler.set_epoch(epoch)\n"
        "        for batch in loader:\n"
        "            accelerator.backward(model(**batch).loss)\n"
        "            optimizer.step()\n"
        "train(Accelerator(), model, optimizer, args)\n",
        # a trainer that prepares a data module's loaders in place and keeps them: the loop
        # reads what prepare returned (another class's ``self.train_loader`` is the raw one)
        "import torch\n"
        "from accelerate import Accelerator\n"
        "class Data:\n"
        "    def setup(self):\n"
        "        self.train_loader = torch.utils.data.DataLoader(self.ds, batch_size=8)\n"
        "class Trainer:\n"
        "    def __init__(self, model, optimizer):\n"
        "        self.accelerator = Accelerator()\n"
        "        self.model, self.optimizer = model, optimizer\n"
        "    def prepare(self, data):\n"
        "        self.model, self.optimizer, data.train_loader = self.accelerator.prepare(\n"
        "            self.model, self.optimizer, data.train_loader\n"
        "        )\n"
        "        self.train_loader = data.train_loader\n"
        "    def train_one_epoch(self):\n"
        "        for x, y in self.train_loader:\n"
        "            self.accelerator.backward(self.model(x, y))\n"
        "            self.optimizer.step()\n",
        # the same trainer with its optimizer prepared beside the models
        _SPLIT_TRAINER.format(prepared="self.unet, self.opt, self.loader"),
        # the prepared object is kept by the loop's body
        HEADER
        + "prepared = []\n"
        + "for model in models:\n"
        + "    model = accelerator.prepare(model)\n"
        + "    prepared.append(model)\n",
        # a wav2vec2-BERT CTC fine-tune: the loaders live in a dict and prepare assigns each one
        # back into its entry, which the loop then reads
        HEADER
        + _OBJECTS
        + _TWO_LOADERS
        + "loaders['train'], loaders['test'], model, optimizer = accelerator.prepare(\n"
        + "    loaders['train'], loaders['test'], model, optimizer\n)\n"
        + "for step, (x, y) in enumerate(loaders['train'], start=1):\n"
        + "    loss = (model(x) - y).pow(2).mean()\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n",
        # each branch builds its own scheduler and prepares: every path is prepared
        HEADER
        + _OBJECTS
        + "if kind == 'cosine':\n"
        + "    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 10)\n"
        + "    model, optimizer, loader, scheduler = accelerator.prepare(\n"
        + "        model, optimizer, loader, scheduler\n    )\n"
        + "else:\n"
        + "    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer)\n"
        + "    model, optimizer, loader, scheduler = accelerator.prepare(\n"
        + "        model, optimizer, loader, scheduler\n    )\n"
        + _LOOP
        + "    scheduler.step()\n",
        # an auxiliary projection only the "mel" branch has (diff_from_scratch): the training
        # objects are prepared above, on every path
        HEADER
        + _OBJECTS
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "if train_type == 'mel':\n"
        + "    projection = accelerator.prepare(projection)\n"
        + "else:\n"
        + "    projection = Projection(16, 256)\n"
        + _LOOP,
        # each branch runs its own job: the evaluation branch never trains
        HEADER
        + _OBJECTS
        + "def train(model, optimizer, loader):\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n"
        + "if args.mode == 'eval':\n"
        + "    model = load_checkpoint(args.path)\n"
        + "    evaluate(model)\n"
        + "elif args.mode == 'train':\n"
        + "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "    train(model, optimizer, loader)\n",
        # the branch that prepares also trains; the other one only evaluates a checkpoint
        HEADER
        + _OBJECTS
        + "if args.eval_only:\n"
        + "    model = load(model)\n"
        + "else:\n"
        + "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n",
        # a starred target takes the rest of what prepare returns (BigVGAN's validation loaders):
        # valid Python the analysis must read, not crash on
        HEADER
        + _OBJECTS
        + "(model, optimizer, loader, *val_loaders) = accelerator.prepare(\n"
        + "    model, optimizer, loader, *val_loaders\n)\n"
        + _LOOP,
        # a helper's parameter named like the unprepared loader, called with the prepared one:
        # what the callers pass is judged at the call, not the name inside the helper
        HEADER
        + _OBJECTS
        + "model, optimizer, train_loader = accelerator.prepare(model, optimizer, loader)\n"
        + _HELPER.replace("batches", "loader")
        + "train(model, train_loader)\n",
        # trl's IterativeSFTTrainer.step(input_ids=...): its user hands it each step's data
        "from datasets import Dataset\n"
        + "from torch.utils.data import DataLoader\n"
        + "class IterativeTrainer:\n"
        + "    def __init__(self, accelerator, model):\n"
        + "        self.accelerator = accelerator\n"
        + "        self.model = accelerator.prepare(model)\n"
        + "    def step(self, input_ids, labels):\n"
        + "        batch_dict = {'input_ids': input_ids, 'labels': labels}\n"
        + "        batch_data = Dataset.from_dict(batch_dict)\n"
        + "        loader = DataLoader(batch_data, batch_size=8, shuffle=True)\n"
        + "        for batch in loader:\n"
        + "            self.accelerator.backward(self.model(**batch).loss)\n",
        # a method's local alias of the prepared attribute (``model = self.model.train()``) is
        # not the module-level ``model`` the trainer was built from
        HEADER
        + _OBJECTS
        + "class Trainer:\n"
        + "    def __init__(self, model, optimizer, loader):\n"
        + "        self.model, self.optimizer, self.loader = model, optimizer, loader\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
        + "            self.model, self.optimizer, self.loader\n"
        + "        )\n"
        + "    def train_epoch(self):\n"
        + "        model = self.model.train()\n"
        + "        for x, y in self.loader:\n"
        + "            self.accelerator.backward(loss_fn(model(x), y))\n"
        + "            self.optimizer.step()\n"
        + "Trainer(model, optimizer, loader).train_epoch()\n",
        # a method that prepares the loader it receives before its loop: the caller's loader
        # is prepared there, not at the call
        HEADER
        + _OBJECTS
        + "class Trainer:\n"
        + "    def __init__(self, model, optimizer):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n"
        + "    def train(self, training_data):\n"
        + "        training_data = self.accelerator.prepare(training_data)\n"
        + "        for x, y in training_data:\n"
        + "            self.accelerator.backward(loss_fn(self.model(x), y))\n"
        + "            self.optimizer.step()\n"
        + "Trainer(model, optimizer).train(loader)\n",
        # rollouts made this step on this rank, batched for the update: already this rank's data
        HEADER
        + "from torch.utils.data import DataLoader, TensorDataset\n"
        + "model, optimizer, prompts = accelerator.prepare(model, optimizer, prompts)\n\n\n"
        + "def learn(rollouts):\n"
        + "    loader = DataLoader(TensorDataset(*rollouts), batch_size=8, shuffle=True)\n"
        + "    for x, y in loader:\n        loss = (model(x) - y).pow(2).mean()\n"
        + "        accelerator.backward(loss)\n        optimizer.step()\n\n\n"
        + "for batch in prompts:\n    learn(generate(model, batch))\n",
        # moe-distributed-training: FSDP2 applied by hand (accelerate could not wrap it yet),
        # the Accelerator prepares the loader and the optimizer only
        HEADER
        + "from torch.distributed._composable.fsdp import fully_shard\n"
        + "from torch.optim import AdamW\n"
        + "from transformers import AutoModelForCausalLM\n"
        + "model = AutoModelForCausalLM.from_pretrained(name)\n"
        + "def shard(m):\n"
        + "    for block in m.layers:\n"
        + "        fully_shard(block)\n"
        + "    fully_shard(m)\n"
        + "    return m\n"
        + "model = shard(model)\n"
        + "optimizer = AdamW(model.parameters(), lr=1e-5)\n"
        + "loader, optimizer = accelerator.prepare(loader, optimizer)\n"
        + "for batch in loader:\n"
        + "    accelerator.backward(model(batch['input_ids'], labels=batch['labels']).loss)\n"
        + "    optimizer.step()\n",
        # a linear probe (a perception benchmark's): the prepared backbone extracts features on
        # every rank, then the main process alone trains a plain linear model on them
        "import torch\nfrom accelerate import Accelerator\n"
        + "from torch.utils.data import DataLoader, TensorDataset\n\n\n"
        + "def extract(model, loader, accelerator):\n    feats = []\n"
        + "    for x, y in loader:\n        with torch.no_grad():\n"
        + "            feats.append(accelerator.gather_for_metrics(model(x)))\n"
        + "    return torch.cat(feats)\n\n\n"
        + "def train_probe(probe, loader, optimizer, device):\n"
        + "    for x, y in loader:\n        optimizer.zero_grad()\n"
        + "        loss = torch.nn.functional.cross_entropy(probe(x.to(device)), y.to(device))\n"
        + "        loss.backward()\n        optimizer.step()\n\n\n"
        + "def main(backbone, loader, labels):\n    accelerator = Accelerator()\n"
        + "    backbone, loader = accelerator.prepare(backbone, loader)\n"
        + "    features = extract(backbone, loader, accelerator)\n"
        + "    if not accelerator.is_main_process:\n        return\n"
        + "    device = accelerator.device\n"
        + "    probe = torch.nn.Linear(features.shape[-1], 2).to(device)\n"
        + "    optimizer = torch.optim.AdamW(probe.parameters())\n"
        + "    train_probe(\n"
        + "        probe, DataLoader(TensorDataset(features, labels)), optimizer, device\n    )\n",
        # an RLHF PPO trainer (PaLM-rlhf style): learn(memories) stacks this rank's rollouts and
        # batches them through a helper that also takes a batch size and a device
        HEADER
        + "import torch\nfrom torch.nn.utils.rnn import pad_sequence\n"
        + "from torch.utils.data import DataLoader, Dataset\n\n\n"
        + "class ExperienceDataset(Dataset):\n"
        + "    def __init__(self, data, device=None):\n"
        + "        self.data, self.device = data, device\n\n\n"
        + "def create_dataloader(data, batch_size, shuffle=True, device=None):\n"
        + "    ds = ExperienceDataset(data, device=device)\n"
        + "    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle)\n\n\n"
        + "class RLHFTrainer:\n    def __init__(self, actor, optimizer):\n"
        + "        self.actor, self.optimizer = accelerator.prepare(actor, optimizer)\n"
        + "        self.minibatch_size = 16\n\n"
        + "    def learn(self, memories):\n"
        + "        stacked = [pad_sequence(m, batch_first=True) for m in zip(*memories)]\n"
        + "        loader = create_dataloader(\n"
        + "            stacked, self.minibatch_size, device=accelerator.device)\n"
        + "        for sequences, rewards in loader:\n"
        + "            loss = (self.actor(sequences) - rewards).pow(2).mean()\n"
        + "            accelerator.backward(loss)\n"
        + "            self.optimizer.step()\n",
        # re-grpo: a replay buffer emptied and refilled with this rank's rollouts on each pass,
        # then batched for the update in the same pass
        HEADER
        + "from torch.utils.data import DataLoader\n"
        + "model, optimizer, prompts = accelerator.prepare(model, optimizer, prompts)\n"
        + "replay_buffer = ReplayBuffer()\n"
        + "for batch in prompts:\n"
        + "    replay_buffer.clear()\n"
        + "    for q in batch:\n"
        + "        replay_buffer.append(rollout(model, q))\n"
        + "    sampler = DataLoader(replay_buffer, batch_size=8, shuffle=True)\n"
        + "    for exp in sampler:\n"
        + "        accelerator.backward(objective(model(exp.sequences), exp))\n"
        + "        optimizer.step()\n",
        HEADER
        + _OBJECTS
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + _LOOP,
        HEADER
        + _OBJECTS
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + _HELPER
        + "train(model, loader)\n",
        # a frozen model outside every optimizer, and a per-epoch scheduler
        HEADER
        + _OBJECTS
        + "teacher = torch.nn.Linear(4, 1)\n"
        + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for epoch in range(3):\n"
        + "    for x, y in loader:\n"
        + "        loss = (model(x) - teacher(x)).pow(2).mean()\n"
        + "        accelerator.backward(loss)\n"
        + "        optimizer.step()\n"
        + "    scheduler.step()\n",
        # the same stepped num_processes times per batch: the whole loader's pace
        _MIXED_PACE.format(
            before="total_steps = len(loader) * args.epochs\n",
            size="total_steps",
            step="            for _ in range(accelerator.num_processes):\n"
            "                scheduler.step()\n",
        ),
        # sized after prepare, from the shard's length: once per rank's batch is its pace
        _MIXED_PACE.replace(_PREPARE_ALL, "")
        .replace("{before}", _PREPARE_ALL)
        .format(size="len(loader) * args.epochs", step="            scheduler.step()\n"),
        # a scheduler stepped per batch and per epoch (convert's output): prepared, its
        # per-epoch steps would count num_processes times; per batch it steps once per rank
        HEADER
        + _OBJECTS
        + "cosine = True\n"
        + "scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for epoch in range(3):\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward(model(x).sum())\n"
        + "        optimizer.step()\n"
        + "        if cosine:\n"
        + "            for _ in range(accelerator.num_processes):\n"
        + "                scheduler.step()\n"
        + "    if not cosine:\n"
        + "        scheduler.step()\n",
        # nanoGPT's fixed count of iterations: every rank steps it once per optimizer step, as
        # one process does; prepared, it would step num_processes times (ACC410)
        HEADER
        + "import torch\n"
        + "optimizer = torch.optim.AdamW(model.parameters())\n"
        + "max_iters = 5000\n"
        + "scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_iters)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "for it in range(max_iters):\n"
        + "    xb, yb = get_batch('train')\n"
        + "    accelerator.backward(model(xb, yb))\n"
        + "    optimizer.step()\n"
        + "    optimizer.zero_grad()\n"
        + "    scheduler.step()\n",
        # the same inside accumulate(), stepped under sync_gradients: once per optimizer step
        _FIXED_ACCUMULATED,
        # a scheduler left unprepared on purpose: built after prepare from the prepared
        # optimizer, sized in per-process steps, stepped beside the optimizer
        HEADER
        + _OBJECTS
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "scheduler = torch.optim.lr_scheduler.OneCycleLR(\n"
        + "    optimizer, max_lr=0.1, total_steps=len(loader) * 3\n)\n"
        + _LOOP
        + "    scheduler.step()\n",
        # the same in a QA trainer's method: the optimizer prepared under a new name (the
        # analysis knows self.optimizer only), the schedule sized from the prepared loader's
        # length, stepped beside that optimizer once per hand-written accumulation cycle
        "import math\nimport torch\nfrom accelerate import Accelerator\n"
        "from transformers import get_scheduler\n\n\n"
        "class QATrainer:\n"
        "    def __init__(self, args, model, dataset):\n"
        "        self.accelerator = Accelerator()\n"
        "        self.args = args\n"
        "        self.dataset = dataset\n"
        "        self.model = self.accelerator.prepare(model)\n"
        "        self.optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)\n\n"
        "    def train(self):\n"
        "        args = self.args\n"
        "        loader = torch.utils.data.DataLoader(self.dataset, batch_size=8)\n"
        "        optimizer, loader = self.accelerator.prepare(self.optimizer, loader)\n"
        "        per_epoch = math.ceil(len(loader) / args.gradient_accumulation_steps)\n"
        "        if args.max_train_steps is None:\n"
        "            args.max_train_steps = args.num_train_epochs * per_epoch\n"
        "        lr_scheduler = get_scheduler(\n"
        "            name='linear', optimizer=optimizer, num_warmup_steps=0,\n"
        "            num_training_steps=args.max_train_steps,\n"
        "        )\n"
        "        for epoch in range(args.num_train_epochs):\n"
        "            for step, batch in enumerate(loader):\n"
        "                loss = self.model(**batch).loss / args.gradient_accumulation_steps\n"
        "                self.accelerator.backward(loss)\n"
        "                if step % args.gradient_accumulation_steps == 0:\n"
        "                    optimizer.step()\n"
        "                    lr_scheduler.step()\n"
        "                    optimizer.zero_grad()\n",
        # a Whisper fine-tune: sized after prepare from the prepared loader's length, stepped
        # once per hand-written accumulation cycle where the fp16 scaler did not skip the
        # optimizer's step (prepared, it would advance num_processes times per call)
        HEADER
        + _OBJECTS
        + "import math\n"
        + "from transformers import get_scheduler\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "per_epoch = math.ceil(len(loader) / args.accumulation)\n"
        + "if args.max_train_steps is None:\n"
        + "    args.max_train_steps = args.epochs * per_epoch\n"
        + "lr_scheduler = get_scheduler(\n"
        + "    'linear', optimizer=optimizer, num_warmup_steps=500,\n"
        + "    num_training_steps=args.max_train_steps,\n)\n"
        + "for epoch in range(args.epochs):\n"
        + "    for step, (x, y) in enumerate(loader):\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean() / args.accumulation)\n"
        + "        if (step + 1) % args.accumulation == 0:\n"
        + "            optimizer.step()\n"
        + "            optimizer.zero_grad()\n"
        + "            if not accelerator.optimizer_step_was_skipped:\n"
        + "                lr_scheduler.step()\n",
        # sized before prepare with the loader's length divided by the process count, left
        # out of prepare and stepped with the optimizer: each rank's own steps (review11b)
        HEADER
        + "import torch\n"
        + "from transformers import get_scheduler\n"
        + "optimizer = torch.optim.AdamW(model.parameters())\n"
        + "per_rank = len(loader) // accelerator.num_processes\n"
        + "lr_scheduler = get_scheduler(\n"
        + "    'cosine', optimizer, num_warmup_steps=10, num_training_steps=per_rank * 3\n)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for epoch in range(3):\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n"
        + "        lr_scheduler.step()\n"
        + "        optimizer.zero_grad()\n",
        # a global batch split by hand over the processes, the schedule sized in global
        # optimizer steps from the dataset's length and stepped once per accumulation cycle: an
        # RLHF reward-model trainer's, per-process steps by construction
        HEADER
        + "import torch\n"
        + "from transformers import get_scheduler\n"
        + "world_size = accelerator.num_processes\n"
        + "loader = torch.utils.data.DataLoader(\n"
        + "    train_set, batch_size=cfg.batch_size // world_size\n)\n"
        + "optimizer = torch.optim.AdamW(model.parameters())\n"
        + "lr_scheduler = get_scheduler(\n"
        + "    'cosine', optimizer, num_warmup_steps=10,\n"
        + "    num_training_steps=len(train_set) // (cfg.batch_size * cfg.accumulation),\n)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "accumulated = 0\n"
        + "for x, y in loader:\n"
        + "    with accelerator.accumulate(model):\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n"
        + "        optimizer.zero_grad()\n"
        + "        accumulated += 1\n"
        + "    if accumulated >= cfg.accumulation:\n"
        + "        lr_scheduler.step()\n"
        + "        accumulated = 0\n",
        # built before prepare and left out of it, sized by the very bound that stops the loop
        # stepping it (while steps < cfg.max_steps), stepped beside the optimizer in a helper: a
        # VLA trainer's cosine schedule, per-process steps by construction
        HEADER
        + _OBJECTS
        + "from transformers import get_scheduler\n"
        + "lr_scheduler = get_scheduler(\n"
        + "    'cosine', optimizer=optimizer, num_warmup_steps=10,\n"
        + "    num_training_steps=cfg.max_steps,\n)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "def trainer(model, loader, optimizer, lr_scheduler, cfg):\n"
        + "    steps = 0\n"
        + "    while steps < cfg.max_steps:\n"
        + "        for x, y in loader:\n"
        + "            accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "            optimizer.step()\n"
        + "            lr_scheduler.step()\n"
        + "            steps += 1\n"
        + "            if steps >= cfg.max_steps:\n"
        + "                break\n"
        + "trainer(model, loader, optimizer, lr_scheduler, cfg)\n",
        # sized in batches (the optimizer's steps times the accumulation) and stepped on every
        # batch inside accumulate(): what the schedule's author meant (a TrOCR fine-tuning script)
        HEADER
        + _OBJECTS
        + "from transformers import get_scheduler\n"
        + "lr_scheduler = get_scheduler(\n"
        + "    'linear', optimizer=optimizer, num_warmup_steps=0,\n"
        + "    num_training_steps=args.max_train_steps * args.gradient_accumulation_steps,\n)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for x, y in loader:\n"
        + "    with accelerator.accumulate(model):\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n"
        + "        lr_scheduler.step()\n",
        # built after prepare, sized with a number of steps past the loop's fixed count of
        # batches (a break at step 10000), stepped per batch inside accumulate() like every
        # counter of the script: the schedule is counted in batches (a Mamba decision
        # transformer, lintreal43)
        _CAPPED_BATCHES.format(total="num_training_steps = 12000\n"),
        # the same with transformers' AdamW (an optimizer, not a model) and get_scheduler sized
        # through a name (the Hugging Face course's loop, kept by a GLUE fine-tuning script)
        HEADER
        + "import torch\n"
        + "from transformers import AdamW, get_scheduler\n"
        + "model = torch.nn.Linear(4, 1)\n"
        + "optimizer = AdamW(model.parameters(), lr=3e-5)\n"
        + "loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
        + "loader, model, optimizer = accelerator.prepare(loader, model, optimizer)\n"
        + "num_training_steps = 3 * len(loader)\n"
        + "lr_scheduler = get_scheduler(\n"
        + "    'linear', optimizer=optimizer, num_warmup_steps=0,\n"
        + "    num_training_steps=num_training_steps,\n)\n"
        + _LOOP
        + "    lr_scheduler.step()\n",
        # every rank evaluates the whole test set and combines nothing: the numbers are right
        HEADER
        + _OBJECTS
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "test_loader = torch.utils.data.DataLoader(test, batch_size=8)\n"
        + "correct = 0\nwith torch.no_grad():\n    for x, y in test_loader:\n"
        + "        correct += (model(x).argmax(1) == y).sum().item()\n"
        + "accuracy = correct / len(test_loader.dataset)\n",
        # validation goes through the training helper with training off: no gather fits that
        # loop, so the loader is left whole and every rank evaluates all of it
        HEADER
        + _OBJECTS
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "val_loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
        + "def run_epoch(model, loader, optimizer, train=True):\n"
        + "    total = 0.0\n"
        + "    for x, y in loader:\n"
        + "        loss = (model(x) - y).pow(2).mean()\n"
        + "        if train:\n"
        + "            accelerator.backward(loss)\n"
        + "            optimizer.step()\n"
        + "        total += loss.item()\n"
        + "    return total\n"
        + "run_epoch(model, loader, optimizer)\n"
        + "print(run_epoch(model, val_loader, optimizer, train=False))\n",
        # a loop over loaders[phase] that trains in the "train" phase only: that loader is
        # prepared, the one it only evaluates is whole on every rank
        HEADER
        + _OBJECTS
        + "loaders = {'train': loader, 'val': torch.utils.data.DataLoader(data, batch_size=8)}\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "loaders['train'] = accelerator.prepare(loaders['train'])\n"
        + "for phase in ['train', 'val']:\n"
        + "    total = 0.0\n"
        + "    for x, y in loaders[phase]:\n"
        + "        loss = (model(x) - y).pow(2).mean()\n"
        + "        if phase == 'train':\n"
        + "            accelerator.backward(loss)\n"
        + "            optimizer.step()\n"
        + "        total += loss.item()\n"
        + "    print(phase, total)\n",
        # the main process alone evaluates on the whole set
        HEADER
        + _OBJECTS
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "full = torch.utils.data.DataLoader(data, batch_size=8)\n"
        + "if accelerator.is_main_process:\n"
        + "    with torch.no_grad():\n"
        + "        for x, y in full:\n"
        + "            print(model(x))\n",
        # a schedule sized in the loop's own bound, stepped under ``if sync_gradients:`` after
        # the optimizer's step (an LM trainer checks optimizer_step_was_skipped first): once per
        # optimizer step on each rank; prepared, it would step num_processes times
        "from accelerate import Accelerator\n"
        + "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
        + "import torch\nfrom transformers import get_cosine_schedule_with_warmup\n"
        + "optimizer = torch.optim.AdamW(model.parameters())\n"
        + "scheduler = get_cosine_schedule_with_warmup(optimizer, 10, horizon)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "step = 0\nfor batch in loader:\n    if step >= horizon:\n        break\n"
        + "    with accelerator.accumulate(model):\n"
        + "        accelerator.backward(model(**batch).loss)\n        optimizer.step()\n"
        + "        if accelerator.sync_gradients:\n"
        + "            if accelerator.optimizer_step_was_skipped:\n"
        + "                raise FloatingPointError('skipped')\n"
        + "            scheduler.step()\n        optimizer.zero_grad()\n"
        + "    if accelerator.sync_gradients:\n        step += 1\n",
        # main()'s OneCycleLR sized before prepare and prepared with the loader: it steps
        # num_processes times per call, all ranks' batches in all
        _MAIN_ONE_CYCLE.format(
            before=_ONE_CYCLE,
            prepared="model, optimizer, train_loader, scheduler",
            after="",
        ),
        _ACCUMULATED_ONE_CYCLE.format(
            size="len(loader) // 2", prepared="model, optimizer, loader, scheduler"
        ),
        # ... or sized after prepare, from the prepared loader's per-process length
        _MAIN_ONE_CYCLE.format(
            before="", prepared="model, optimizer, train_loader", after=_ONE_CYCLE
        ),
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if not script.prepare_calls:
            # nothing is prepared: every rank trains its own copy on all the data (correct, not
            # data-parallel, as convert leaves it), but an optimizer stepped after the
            # Accelerator's backward misses what that backward did to the gradients
            yield from self._optimizers_without_prepare(script)
            return
        yield from self._prepared_in_one_branch(script)
        yield from self._prepared_into_loop_variable(script)
        prepared = _prepared_names(script)
        dataloaders = script.names_of(Kind.DATALOADER)
        training = [loop for loop in script.loops if loop.trains]
        for loop in script.loops:
            gather = None if loop.trains else _gather_of_its_batches(script, loop)
            if not (loop.trains or loop.evaluates or gather is not None):
                continue
            if script.under_rank_guard(loop.node):
                continue
            if not loop.trains and not _combines_ranks(script, loop):
                continue  # every rank evaluates the whole set: right, if N times the work
            source = loop.iterable
            if _trained_phases_prepared(script, loop, prepared):
                continue  # the phases it only evaluates are whole on every rank: right
            passed_in = bool(facts_of(script).flow.call_site_arguments(source, loop.node))
            if (
                (source in dataloaders or _gathered_like_a_prepared_loader(script, loop, gather))
                and source not in prepared
                and entry_read(script.module, loop.node.iter) not in prepared
                and not passed_in  # its callers' arguments are judged at the call
                and not _prepared_inline(loop)
                and not over_step_data(facts_of(script), loop)
                and not sharded_by_its_sampler(script, source)
                and not _split_by_rank(script, source)
            ):
                message = _loader_message(script, source, loop.node)
                whole = _dict_prepared_whole(script, source)
                if whole is not None:
                    message = _dict_message(script, whole, source, loop)
                    if gather is not None:
                        message += (
                            f" (then {script.module.code_for_node(gather.func)} at line "
                            f"{script.line(gather)} hands back one copy of every sample per "
                            "rank: counts and sums num_processes times too large)"
                        )
                elif gather is not None:
                    name = script.module.code_for_node(gather.func)
                    message = (
                        f"Pass DataLoader `{source}` to accelerator.prepare and use what it "
                        f"returns: unprepared, every rank iterates all of it, so {name} at line "
                        f"{script.line(gather)} hands back num_processes copies of every sample "
                        "(counts and sums num_processes times too large, len() of the results "
                        "no longer the data set's)"
                    )
                if _a_loader_tuple(script, source):  # prepare hands a tuple back as it is
                    message = message.replace(
                        f"Pass DataLoader `{source}` to accelerator.prepare and use what it "
                        "returns",
                        f"Prepare the loaders of the tuple `{source}`, `{source} = "
                        f"accelerator.prepare(*{source})` (prepare hands a tuple back as it is)",
                    )
                epoch = epoch_set_through(script, source) if source else None
                if epoch is not None:  # a project's own sampler (bucketing), set through it
                    message += (
                        f"; its sampler does not shard (the set_epoch at line "
                        f"{script.line(epoch)} is its own shuffle's seed); prepared, "
                        f"`{source}` reads a copy of it (HF's: its shard wrapper's), so call "
                        f"`{source}.set_epoch(epoch)` instead, which the prepared loader hands "
                        "to the sampler it reads"
                    )
                yield self.finding(script, loop.node.iter, message=message)
            yield from self._unprepared_arguments(script, loop, dataloaders, prepared)
        trained_models = set().union(*optimizer_models(script).values())
        optimizers = script.names_of(Kind.OPTIMIZER)
        schedulers = script.names_of(Kind.SCHEDULER)
        flow = facts_of(script).flow
        inside = {id(call) for loop in training for call in calls_in(script, loop.node)}
        through = _called_from_loops(script, script.loops)
        by_hand = _wrapped_by_hand(script)
        reached = inside | through
        for call in calls(script):
            if id(call) not in reached or script.under_rank_guard(call):
                continue
            if single_device_twin(facts_of(script), call):
                continue  # a plain step no prepared object reaches (a main-process probe)
            func = call.func
            called = dotted(func)
            # ``model = self.model.train()`` in a method: the prepared attribute, not the
            # module-level ``model`` of the same name
            alias = local_alias(script, called, call) if called is not None else None
            if id(call) not in inside:
                # in a method the training loop calls (``self.step(batch)``): its optimizer's
                # step, which the method's own loop-less body hides from the loop
                owner = dotted(func.value) if isinstance(func, cst.Attribute) else None
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value == "step"
                    and owner in optimizers
                    and owner not in prepared
                    and _in_a_training_step(script, call)
                ):
                    reason = "aware of fp16 loss scaling, accumulation or sharding"
                    yield self.finding(script, call, message=_message("optimizer", owner, reason))
                continue
            if (
                called in trained_models
                and called not in prepared | by_hand
                and alias not in prepared
            ):
                yield self.finding(
                    script, call, message=_message("model", called, "synchronised across ranks")
                )
            if not (isinstance(func, cst.Attribute) and func.attr.value == "step"):
                continue
            owner = dotted(func.value)
            if owner in optimizers and owner not in prepared:
                # unprepared, an optimizer steps gradients the Accelerator scaled (fp16),
                # accumulated or sharded as if they were plain ones
                reason = "aware of fp16 loss scaling, accumulation or sharding"
                yield self.finding(script, call, message=_message("optimizer", owner, reason))
            elif owner in schedulers and owner not in prepared:
                mixed = flow.mixed_pace_schedulers({owner}).get(owner or "")
                if mixed is not None:
                    # stepped per batch and per epoch: prepared, the per-epoch steps would
                    # count N times, so it is left out on purpose; its per-batch step then
                    # needs num_processes steps per call (as convert writes it)
                    late = _per_batch_step_ends_late(script, call, owner, mixed)
                    if late is not None:
                        yield self.finding(script, call, message=late)
                elif (
                    not flow.sized_per_process_and_stepped_with_optimizer(call)
                    and not _sized_per_batch_inside_accumulate(script, call, owner)
                    and not _sized_past_the_batch_cap(script, call, owner)
                    and not _sized_as_the_batch_counter_ends(script, call, owner)
                    and not _stepped_per_fixed_iteration_with_optimizer(script, call)
                    and not _stepped_over_whole_data(script, call)
                    and not _sized_in_global_batches(script, call, owner)
                    and not _sized_per_process_by_division(script, call, owner)
                ):
                    yield self.finding(
                        script, call, message=_scheduler_message(script, call, owner)
                    )

    def _optimizers_without_prepare(self, script: ScriptModel) -> Iterator[Finding]:
        """A file that prepares nothing, trains through its own Accelerator's backward and sets
        fp16 or accumulation on it: each optimizer's ``step()`` in a training loop."""
        setting = _backward_changes_gradients(script)
        if setting is None:
            return
        optimizers = script.names_of(Kind.OPTIMIZER)
        training = [loop for loop in script.loops if loop.trains]
        inside = {id(call) for loop in training for call in calls_in(script, loop.node)}
        for call in calls(script):
            func = call.func
            if not (
                id(call) in inside
                and isinstance(func, cst.Attribute)
                and func.attr.value == "step"
                and dotted(func.value) in optimizers
                and not script.under_rank_guard(call)
            ):
                continue
            if setting.startswith("gradient_accumulation_steps") and _stepped_per_cycle(
                script, call
            ):
                continue  # the backward's division is the mean over the steps it accumulates
            name = dotted(func.value)
            yield self.finding(
                script,
                call,
                message=(
                    f"Pass `{name}` to accelerator.prepare, with the model and the DataLoader "
                    f"it trains on, and use what it returns: nothing in this file is prepared, "
                    f"and with {setting}"
                ),
            )

    def _prepared_into_loop_variable(self, script: ScriptModel) -> Iterator[Finding]:
        """``for model in self.models: model = accelerator.prepare(model)`` and nothing in the
        loop reads ``model`` again: what prepare returns is dropped when the next pass rebinds
        the loop variable, the collection (and the attributes it was built from, such as
        ``self.unet``) keeps the unprepared objects, and training through them never averages
        gradients across ranks (a DataLoader is never sharded). Reported at the prepare."""
        for prepare in script.prepare_calls:
            loop = _loop_rebinding(script, prepare)
            if loop is None:
                continue
            target = dotted(loop.target)
            accelerator = dotted(prepare.call.func.value)  # type: ignore[attr-defined]
            yield self.finding(
                script,
                prepare.call,
                message=(
                    f"Keep what {accelerator}.prepare returns where training reads the object "
                    f"(the attribute or the `{dotted(loop.iter) or 'list'}` entry it came "
                    f"from): here it goes to the loop variable `{target}`, which the next pass "
                    "rebinds, so training keeps using the unprepared objects (a model's "
                    "gradients are never averaged across ranks, a DataLoader is not sharded)"
                ),
            )

    def _prepared_in_one_branch(self, script: ScriptModel) -> Iterator[Finding]:
        """``if kind == "cosine": scheduler = ...`` / ``elif kind == "linear": scheduler = ...;
        model, optimizer, loader, scheduler = accelerator.prepare(...)``: the prepare indented
        into the last branch of a chain whose other branches build the same objects. On those
        branches nothing is prepared and the training after the chain runs unsharded and
        unsynchronised. Reported at the prepare, the line to move."""
        training_objects = (
            set().union(*optimizer_models(script).values())
            | script.names_of(Kind.OPTIMIZER)
            | script.names_of(Kind.DATALOADER)
        )
        for prepare in script.prepare_calls:
            chain = _branch_chain(script, prepare.call)
            if chain is None:
                continue
            top, others = chain
            if script.under_rank_guard(top) or any(
                script.reads_rank(test) for test in _chain_tests(top)
            ):
                continue
            rebuilt = sorted(set(prepare.inputs) & set().union(*(_built_in(b) for b in others)))
            if not rebuilt or any(_prepares_in(script, branch) for branch in others):
                continue
            if not set(prepare.inputs) & training_objects:
                continue  # an auxiliary module only this branch uses (``else: proj = None``)
            if not any(not _inside(script, call, top) for call in _backward_calls(script)):
                continue  # the training lives in the branch too
            if not _used_after(script, top, set(prepare.outputs)):
                continue  # each branch runs its own job (``if mode == "eval": ... elif``)
            yield self.finding(
                script,
                prepare.call,
                message=(
                    f"Prepare after the if/elif chain at line {script.line(top)}, not in one of "
                    f"its branches: the others build `{rebuilt[0]}` and skip this prepare, so "
                    "the training after it runs unsharded and unsynchronised"
                ),
            )

    def _unprepared_arguments(
        self, script: ScriptModel, loop: Loop, dataloaders: set[str], prepared: set[str]
    ) -> Iterator[Finding]:
        """``def train(model, loader): for batch in loader`` called as ``train(net, raw_loader)``
        with a DataLoader that was never prepared: reported at the argument."""
        facts = facts_of(script)
        shared = facts.shared_loop_evaluations
        scope = script.scope_of(loop.node)
        if any(
            loop.iterable in prepare.outputs and script.scope_of(prepare.call) is scope
            for prepare in script.prepare_calls
        ):
            return  # ``loader = self.accelerator.prepare(loader)`` first: what the loop reads
        for argument in facts.flow.call_site_arguments(loop.iterable, loop.node):
            name = dotted(argument.value)
            if name in shared and shared[name].loop is loop:
                continue  # evaluated with training off: prepared, its totals would be one shard's
            if (
                name in dataloaders
                and name not in prepared
                and not script.under_rank_guard(argument)
                and not sharded_by_its_sampler(script, name)
            ):
                yield self.finding(
                    script,
                    argument.value,
                    message=_loader_message(script, name, argument)
                    + f" (the loop at line {script.line(loop.node)} reads it)",
                )


#: What combines the ranks' evaluation results: over an unprepared loader, N copies of the set.
_COMBINING = {"gather", "gather_for_metrics", "reduce", "all_gather", "all_reduce", "gather_object"}


def _wrapped_by_hand(script: ScriptModel) -> set[str]:
    """Models the script shards or replicates itself: ``fully_shard(model)``, ``model =
    FSDP(model)``, or ``model = prepare_model(model)`` where that function of the file calls
    one of them (FSDP2 set up by hand beside an Accelerator that prepares only the loader and
    the optimizer). Passing such a model to ``prepare`` would wrap it a second time."""
    wrapping_functions = {
        function.name.value
        for function in script.index.of_type(cst.FunctionDef)
        if isinstance(function, cst.FunctionDef)
        and any(
            script.call_names(call) & names.MANUAL_MODEL_WRAPPERS
            for call in script.index.calls_directly_in(function)
        )
    }
    found: set[str] = set()
    for call in script.calls:
        wraps = script.call_names(call) & names.MANUAL_MODEL_WRAPPERS
        local = isinstance(call.func, cst.Name) and call.func.value in wrapping_functions
        if not (wraps or local) or not call.args:
            continue
        argument = dotted(call.args[0].value)
        if argument is not None:
            found.add(argument)
        parent = script.parent(call)
        if isinstance(parent, cst.Assign):
            found.update(n for t in parent.targets if (n := dotted(t.target)) is not None)
    return found


def _combines_ranks(script: ScriptModel, loop: Loop) -> bool:
    """An evaluation loop whose results are gathered or reduced (in the loop, or after it in the
    same function): over an unprepared loader every rank brings the whole set, and the totals
    count it N times. One that combines nothing computes the whole set's numbers on each rank;
    preparing its loader without adding a gather would make them one shard's. A combine counts
    where it reads what the batches gave (`_computed_from_the_batch`, and after the loop what
    the loop collected from them), not a timing of each pass, nor a gather of the training loop
    around the evaluation (``accelerator.gather(lengths)`` above it, in the same epoch loop):
    an evaluation that logs its own whole-set score is left alone (a speech trainer's)."""
    function = facts_of(script).placement.enclosing_function(loop.node)
    scope: cst.CSTNode = function if function is not None else script.module
    bound: set[str] | None = None
    results: set[str] | None = None
    for call in calls_in(script, scope):
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value in _COMBINING):
            continue
        read = {n for a in call.args for n in variables_in(script, a.value)} | {
            dotted(node)
            for a in call.args
            for node in walk(a.value)
            if isinstance(node, cst.Attribute)
        }
        if script.inside(call, loop.node):
            bound = _computed_from_the_batch(script, loop) if bound is None else bound
            if read & bound:
                return True
        elif script.order(call) > script.order(loop.node):
            results = _collected_by(script, loop, scope) if results is None else results
            if read & results:
                return True
    return False


#: The list and set methods that add what they are handed to their receiver.
_COLLECTING = frozenset({"append", "extend", "add", "update", "insert"})


def _collected_by(script: ScriptModel, loop: Loop, scope: cst.CSTNode) -> set[str]:
    """The names that carry the loop's results out of it: what its body sets from the batches,
    the lists it appends them to (``preds.append(logits.argmax(-1))``, ``self.preds`` too, or
    ``self.correct += ...``), and the names set from those below the loop (``acc = correct /
    total``), followed to a fixed point."""
    found = _computed_from_the_batch(script, loop)
    for node in walk(loop.node.body):
        receiver, values = None, ()
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value in _COLLECTING:
                receiver, values = node.func.value, tuple(a.value for a in node.args)
        elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Attribute):
            receiver, values = node.target, (node.value,)
        spelled = dotted(receiver) if receiver is not None else None
        if spelled and any(variables_in(script, value) & found for value in values):
            found.add(spelled)
    after = [
        node
        for node in walk(scope)
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign))
        and node.value is not None
        and not script.inside(node, loop.node)
        and script.order(node) > script.order(loop.node)
    ]
    return _grown_through(script, after, found)


#: The collectives that join every rank's values into one longer result.
_GATHERS = frozenset({"gather", "gather_for_metrics"})


def _gathered_like_a_prepared_loader(
    script: ScriptModel, loop: Loop, gather: cst.Call | None
) -> bool:
    """An evaluation gathering its batches' outputs over a loader of no known kind made by the
    same call as one the file prepares (``test_loader`` of ``self._get_data(flag="test")``,
    ``train_loader`` of ``self._get_data(flag="train")`` prepared in ``train()``): a loader,
    left unsharded."""
    if gather is None or loop.iterable is None:
        return False
    return made_like_a_prepared_input(script, loop.iterable, loop.node) is not None


def _gather_of_its_batches(script: ScriptModel, loop: Loop) -> cst.Call | None:
    """``accelerator.gather_for_metrics((preds, labels))`` in the body of a loop that does not
    train, reading a name the loop binds (its batch, or what the body computes from it): an
    evaluation loop, ``no_grad`` around it or not (HF's examples open ``no_grad`` inside)."""
    accelerators = script.names_of(Kind.ACCELERATOR)
    bound = _computed_from_the_batch(script, loop)
    for call in calls_in(script, loop.node):
        func = call.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value in _GATHERS
            and dotted(func.value) in accelerators
        ):
            continue
        read = {n for a in call.args for n in variables_in(script, a.value)}
        if read & bound:
            return call
    return None


def _computed_from_the_batch(script: ScriptModel, loop: Loop) -> set[str]:
    """The loop's batch names and the names its body sets from them, followed to a fixed
    point (``logits = model(x)``, ``preds = logits.argmax(-1)``); not a timing or a counter
    the body also sets (``elapsed = time.time() - start``), nor a member (``self.x``)."""
    found = set(loop.batch_names)
    assignments = [
        node
        for node in walk(loop.node.body)
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)) and node.value is not None
    ]
    return _grown_through(script, assignments, found)


def _grown_through(
    script: ScriptModel,
    assignments: list[cst.Assign | cst.AugAssign | cst.AnnAssign],
    found: set[str],
) -> set[str]:
    """``found`` with every name ``assignments`` set from one of its names, followed to a
    fixed point (``preds = logits.argmax(-1)`` once ``logits`` is in it)."""
    changed = True
    while changed:
        changed = False
        for node in assignments:
            targets = bound_by(node) - found
            if targets and variables_in(script, node.value) & found:  # type: ignore[arg-type]
                found |= targets
                changed = True
    return found


def _split_by_rank(script: ScriptModel, loader: str | None) -> bool:
    """The loader's data set is cut by the rank itself (``dataset.shard(num_processes,
    process_index)``, ``split_dataset_by_node(ds, rank=...)``): each rank already reads its own
    part, so gathering it is right."""
    for binding in script.of_kind(Kind.DATALOADER):
        if binding.name != loader or binding.value is None:
            continue
        if _cut_by_rank(script, binding.value, binding.assign):
            return True
    return False


def _cut_by_rank(script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``value`` (a loader's) reads the rank, directly or through the names it is built from,
    followed binding by binding to what each was last set to above its read (``part =
    Subset(full, indices)`` after ``indices = range(process_index, n, num_processes)``), or
    what ``split_between_processes`` hands the ``with`` around it."""
    if _read_from_a_split(script, value):
        return True
    pending = [(value, at)]
    seen: set[int] = set()
    while pending and len(seen) < _MAX_FOLLOWED:
        node, where = pending.pop()
        if script.reads_rank(node):
            return True
        for name in variables_in(script, node):
            bound = last_binding(script, name, where)
            if bound is None or id(bound) in seen:
                continue
            seen.add(id(bound))
            bound_value = getattr(bound, "value", None)
            if bound_value is not None:
                pending.append((bound_value, bound))
    return False


#: How many bindings `_cut_by_rank` follows back from a loader (a data set is built in a few)
_MAX_FOLLOWED = 16


def _read_from_a_split(script: ScriptModel, value: cst.BaseExpression) -> bool:
    """``value`` reads, directly or through names set from it, what ``with
    accelerator.split_between_processes(rows) as part:`` around it binds: this rank's part."""
    withs = [a for a in script.ancestors(value) if isinstance(a, cst.With)]
    split: set[str] = set()
    for statement in withs:
        for item in statement.items:
            call = item.item
            if (
                isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "split_between_processes"
                and item.asname is not None
            ):
                split |= {n.value for n in walk(item.asname.name) if isinstance(n, cst.Name)}
    if not split:
        return False
    pending, seen = list(variables_in(script, value)), set()
    while pending and len(seen) < 32:
        name = pending.pop()
        if name in split:
            return True
        if name in seen:
            continue
        seen.add(name)
        for assignment in script.index.assignments_to(name):
            if assignment.value is not None and any(script.inside(assignment, w) for w in withs):
                pending.extend(variables_in(script, assignment.value))
    return False


def _trained_phases_prepared(script: ScriptModel, loop: Loop, prepared: set[str]) -> bool:
    """``for x, y in loaders[phase]:`` that trains only in some phases, each of whose loaders
    is prepared (``loaders["train"] = accelerator.prepare(loaders["train"])``)."""
    phases = facts_of(script).phase_loaders.get(loop.iterable or "")
    return (
        phases is not None
        and phases.loop is loop
        and any(
            all(f'{name}["{key}"]' in prepared for key in phases.trained) for name in phases.names
        )
    )


def _sized_per_batch_inside_accumulate(script: ScriptModel, step: cst.Call, name: str) -> bool:
    """``get_scheduler(..., num_training_steps=max_train_steps * gradient_accumulation_steps)``
    stepped on every batch inside ``accumulate()``: the schedule is sized in batches, so a step
    per batch is what its author meant (Hugging Face's older no_trainer examples; a TrOCR
    fine-tuning script kept it unprepared). Whether its total counts every rank's batches is a
    question of the loader length it came from, not of where it is stepped."""
    if _accumulate_around(script, step) is None:
        return False
    for binding in script.of_kind(Kind.SCHEDULER):
        if binding.name != name:
            continue
        for node in walk(binding.value):
            if (
                isinstance(node, cst.BinaryOperation)
                and isinstance(node.operator, cst.Multiply)
                and any(
                    (dotted(side) or "").endswith("gradient_accumulation_steps")
                    for side in (node.left, node.right)
                )
            ):
                return True
    return False


#: The keywords that give a scheduler its number of steps.
_SCHEDULE_LENGTHS = ("T_max", "total_iters", "total_steps", "num_training_steps")


def _sized_past_the_batch_cap(script: ScriptModel, step: cst.Call, name: str) -> bool:
    """Stepped on every batch inside ``accumulate()``, sized with a number of steps
    (``num_training_steps=12000``) at least the fixed count of batches the loop stepping it
    runs (``for it in range(10000)``, or ``if step >= 10000: break`` over ``enumerate(loader)``):
    the schedule is counted in batches, as the loop is, so a step per batch is what its author
    meant (a Mamba decision-transformer script); stepped per optimizer step it would go through
    1/gradient_accumulation_steps of it at most. A total below the batch count is in optimizer
    steps, and stepped per batch it runs past its end: that stays reported."""
    if _accumulate_around(script, step) is None:
        return False
    made = [
        binding.value
        for binding in script.of_kind(Kind.SCHEDULER)
        if binding.name == name and isinstance(binding.value, cst.Call)
    ]
    if len(made) != 1:
        return False
    lengths = [
        argument.value
        for argument in made[0].args
        if argument.keyword is not None and argument.keyword.value in _SCHEDULE_LENGTHS
    ]
    if len(lengths) != 1:
        return False
    length = lengths[0]
    if isinstance(length, cst.Name):  # ``num_training_steps = 12000`` above it
        bound = last_binding(script, length.value, made[0])
        length = bound.value if isinstance(bound, cst.Assign) else None
    if not isinstance(length, cst.Integer):
        return False
    loop = next((a for a in script.ancestors(step) if isinstance(a, cst.For)), None)
    cap = _batch_cap(loop) if loop is not None else None
    return cap is not None and length.evaluated_value >= cap


def _sized_as_the_batch_counter_ends(script: ScriptModel, step: cst.Call, name: str) -> bool:
    """Stepped on every batch inside ``accumulate()``, sized with the very number the loop
    stepping it stops at (``num_training_steps=args.train_steps`` and ``global_step += 1`` on
    every batch, then ``if global_step >= args.train_steps: return``; a wav2vec2 CTC
    fine-tuning script): the schedule is counted in batches, as the run is, and ends with it;
    stepped per optimizer step it would go through 1/gradient_accumulation_steps of it."""
    if _accumulate_around(script, step) is None:
        return False
    made = [
        binding.value
        for binding in script.of_kind(Kind.SCHEDULER)
        if binding.name == name and isinstance(binding.value, cst.Call)
    ]
    lengths = [
        argument.value
        for call in made
        for argument in call.args
        if argument.keyword is not None and argument.keyword.value in _SCHEDULE_LENGTHS
    ]
    if len(made) != 1 or len(lengths) != 1:
        return False
    length = script.module.code_for_node(lengths[0])
    loop = next((a for a in script.ancestors(step) if isinstance(a, cst.For)), None)
    if loop is None:
        return False
    body = loop.body.body  # type: ignore[attr-defined]
    counted = _counted_once_per_pass(body)
    return any(
        counter in counted and script.module.code_for_node(bound) == length
        for counter, bound in _exit_tests(body)
    )


def _counted_once_per_pass(body) -> set[str]:
    """The names a loop body adds one to at its top level (``global_step += 1``): counters of
    its passes, not of some of them (one under ``if accelerator.sync_gradients:``)."""
    return {
        small.target.value
        for statement in body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
        if isinstance(small, cst.AugAssign)
        and isinstance(small.operator, cst.AddAssign)
        and isinstance(small.target, cst.Name)
        and isinstance(small.value, cst.Integer)
        and small.value.evaluated_value == 1
    }


def _exit_tests(body) -> Iterator[tuple[str, cst.BaseExpression]]:
    """``(counter, bound)`` of each ``if counter >= bound: break`` (or ``return``, ``>``,
    ``==``) at the top level of a loop body."""
    for statement in body:
        if not isinstance(statement, cst.If) or not isinstance(statement.test, cst.Comparison):
            continue
        test = statement.test
        inner = statement.body.body
        if (
            len(test.comparisons) == 1
            and isinstance(test.left, cst.Name)
            and isinstance(
                test.comparisons[0].operator, (cst.GreaterThanEqual, cst.GreaterThan, cst.Equal)
            )
            and len(inner) == 1
            and isinstance(inner[0], cst.SimpleStatementLine)
            and isinstance(inner[0].body[0], (cst.Break, cst.Return))
        ):
            yield test.left.value, test.comparisons[0].comparator


def _batch_cap(loop: cst.For) -> int | None:
    """The fixed count of batches ``loop`` runs: ``range(n)``, or ``if i >= n: break`` (``>``,
    ``==``) at the top of its body, ``i`` its ``enumerate`` counter."""
    iterable = loop.iter
    if (
        isinstance(iterable, cst.Call)
        and dotted(iterable.func) == "range"
        and len(iterable.args) == 1
        and isinstance(iterable.args[0].value, cst.Integer)
    ):
        return iterable.args[0].value.evaluated_value
    target = loop.target
    if not (
        isinstance(iterable, cst.Call)
        and dotted(iterable.func) == "enumerate"
        and isinstance(target, cst.Tuple)
        and target.elements
        and isinstance(target.elements[0].value, cst.Name)
    ):
        return None
    counter = target.elements[0].value.value  # type: ignore[attr-defined]
    for statement in loop.body.body:  # type: ignore[attr-defined]
        if not isinstance(statement, cst.If) or not isinstance(statement.test, cst.Comparison):
            continue
        test = statement.test
        body = statement.body.body
        if len(test.comparisons) != 1 or len(body) != 1:
            continue
        compared = test.comparisons[0]
        if (
            isinstance(test.left, cst.Name)
            and test.left.value == counter
            and isinstance(compared.operator, (cst.GreaterThanEqual, cst.GreaterThan, cst.Equal))
            and isinstance(compared.comparator, cst.Integer)
            and isinstance(body[0], cst.SimpleStatementLine)
            and isinstance(body[0].body[0], cst.Break)
        ):
            return compared.comparator.evaluated_value
    return None


def _stepped_per_fixed_iteration_with_optimizer(script: ScriptModel, step: cst.Call) -> bool:
    """Stepped in a loop of a fixed count that every rank runs whole (nanoGPT's ``for it in
    range(max_iters)``; `stepped_per_fixed_iteration`, which the conversion asks too), once per
    optimizer step: each rank steps it as on one process; prepared, it would step
    ``num_processes`` times (ACC410). Inside ``accumulate()`` only under ``if
    accelerator.sync_gradients:``; unguarded there it steps on every batch, which the finding's
    message says to fix."""
    return stepped_per_fixed_iteration(facts_of(script), step) is not None and (
        once_per_optimizer_step(script, step)
    )


def _sized_in_global_batches(script: ScriptModel, step: cst.Call, name: str | None) -> bool:
    """Sized from a dataset's ``len()`` (no loader's) in a file whose DataLoader (however
    imported) takes a share of a global batch (``batch_size=config.batch_size // world_size``),
    and stepped once per optimizer step: the script counts in global batches, so
    ``len(train_dataset) // (config.batch_size * accumulation)`` is the optimizer steps each
    rank takes (an RLHF reward-model trainer). Prepared, it would step ``num_processes`` times
    per call and end N times too soon."""
    if not once_per_optimizer_step(script, step):
        return False
    loaders = script.names_of(Kind.DATALOADER)
    sized_by_data = any(
        isinstance(node, cst.Call)
        and dotted(node.func) == "len"
        and len(node.args) == 1
        and dotted(node.args[0].value) not in loaders
        for binding in script.of_kind(Kind.SCHEDULER)
        if binding.name == name
        for node in walk(binding.value)
    )
    return sized_by_data and any(
        (dotted(call.func) or "").rsplit(".", 1)[-1] == "DataLoader"
        and any(
            argument.keyword is not None
            and argument.keyword.value == "batch_size"
            and PROCESS_COUNT.search(script.module.code_for_node(argument.value))
            for argument in call.args
        )
        for call in script.calls
    )


def _stepped_over_whole_data(script: ScriptModel, step: cst.Call) -> bool:
    """Stepped in a training loop over an object no prepare call returned, that is not a known
    DataLoader either (``for batch in self.dataset.train_dataloader`` of a dataset object the
    trainer was handed): every rank steps it once per batch of the whole set, as on one
    process, and a schedule sized in that loader's ``len()`` fits. Prepared, it would step
    ``num_processes`` times per call and end N times too soon (whatever the loader, which
    this file cannot see prepared, is)."""
    flow = facts_of(script).flow
    loop = next(
        (loop for loop in reversed(script.loops) if loop.trains and script.inside(step, loop.node)),
        None,
    )
    if loop is None or loop.iterable is None:
        return False
    if _reads_a_wrapped_loader(script, loop):
        return True
    if "." not in loop.iterable or loop.iterable in script.names_of(Kind.DATALOADER):
        return False
    return not flow.over_prepared_loader(loop)


def _reads_a_wrapped_loader(script: ScriptModel, loop: Loop) -> bool:
    """The loop reads a loader wrapped in an object of the file's own (`wrapped_loaders`), here
    or by a caller that hands it in: prepare hands such a wrapper back whole, so the convert step
    leaves the loader and the schedulers stepped over it unprepared."""
    if wrapped_at(script, loop.iterable, loop.node) is not None:
        return True
    facts = facts_of(script)
    function = facts.placement.enclosing_function(loop.node)
    if function is None or loop.iterable not in facts.flow.params.get(function, {}):
        return False
    return handed_wrapped(script, facts.flow, function, loop.iterable) is not None


def _accumulate_around(script: ScriptModel, step: cst.Call) -> str | None:
    """The accelerator of the ``with <accelerator>.accumulate(...)`` around ``step``."""
    for ancestor in script.ancestors(step):
        if isinstance(ancestor, cst.With) and (found := accumulate_context(ancestor)) is not None:
            return found
    return None


def _scheduler_message(script: ScriptModel, step: cst.Call, name: str | None) -> str:
    """Inside ``accumulate()`` (unguarded) the fix that keeps the schedule's meaning is to step
    it when the optimizer steps; ``prepare`` also does that, but steps it once per process as
    well, which a loop of a fixed count that every rank runs whole must not do (ACC410)."""
    accelerator = _accumulate_around(script, step)
    if (
        accelerator is not None
        and not once_per_optimizer_step(script, step)
        and not _never_accumulates(script)
    ):
        whole = _sized_by_a_whole_loader(script, step, name, any_binding=True)
        if whole is not None:
            # sized in all ranks' batches before prepare, stepped per batch of one rank's
            # shard: Accelerate's own examples size it in optimizer steps and prepare it
            loader = dotted(whole.args[0].value)
            return (
                f"Pass scheduler `{name}` to {accelerator}.prepare and size it in optimizer "
                f"steps (len({loader}) // gradient_accumulation_steps per epoch): it is sized "
                f"from len({loader}) at line {script.line(whole)}, before prepare, so from all "
                "of the dataset's batches, while each of N processes steps it once per batch "
                "of its 1/N shard: the schedule gets 1/N of the way (a prepared scheduler "
                "steps once per process, and inside accumulate() only when the optimizer "
                "steps)"
            )
        fixed = stepped_per_fixed_iteration(facts_of(script), step) is not None
        return (
            f"Step scheduler `{name}` only when the optimizer steps (under `if "
            f"{accelerator}.sync_gradients:`)"
            + ("" if fixed else ", or pass it to accelerator.prepare")
            + ": inside accumulate() it steps on every batch, gradient_accumulation_steps times "
            "per optimizer step"
        )
    whole = _sized_by_a_whole_loader(script, step, name, any_binding=True)
    if whole is not None:
        return _whole_loader_message(script, name, whole)
    return _message("scheduler", name, "stepped with the optimizer")


def _never_accumulates(script: ScriptModel) -> bool:
    """Every Accelerator of the file is made here, ``Accelerator(...)`` with no
    ``gradient_accumulation_steps`` (or 1), no ``gradient_accumulation_plugin``, no ``**kwargs``,
    and nothing sets its ``gradient_accumulation_steps`` later: ``accumulate()`` then syncs on
    every batch, so a step inside it is one per optimizer step (a motion-transfer GAN's
    ``accumulate`` around each of its models, on ``Accelerator()``). An accelerator handed in,
    or made by a factory, may accumulate."""
    made = [binding.value for binding in script.of_kind(Kind.ACCELERATOR)]
    if not made or not all(is_accelerator_call(value) for value in made):
        return False
    for value in made:
        assert isinstance(value, cst.Call)
        if any(arg.star for arg in value.args):
            return False
        if keyword_argument(value, "gradient_accumulation_plugin") is not None:
            return False
        steps = keyword_argument(value, "gradient_accumulation_steps")
        if steps is not None and not (
            isinstance(steps.value, cst.Integer) and steps.value.evaluated_value == 1
        ):
            return False
    return not any(
        isinstance(target, cst.Attribute) and target.attr.value == "gradient_accumulation_steps"
        for assign in script.assignments
        for target in assigned_targets(assign)
    )


def _per_batch_step_ends_late(
    script: ScriptModel, call: cst.Call, name: str | None, steps: list[SchedulerStep]
) -> str | None:
    """The advice for ``call``, the per-batch step of a scheduler also stepped per epoch (so
    rightly left unprepared), where it ends its schedule N times late: stepped once per batch
    of a rank's shard, not ``num_processes`` times, while sized in the whole loader's batches
    (``len(loader)`` before prepare). None where the pace is right or cannot be told (a size
    that is no loader's length, a schedule sized with ``num_processes``)."""
    step = next((s for s in steps if s.call is call), None)
    if step is None or not step.per_batch or call.args:
        return None
    for ancestor in script.ancestors(call):
        if isinstance(ancestor, cst.For) and PROCESS_COUNT.search(
            script.module.code_for_node(ancestor.iter)
        ):
            return None  # ``for _ in range(accelerator.num_processes): scheduler.step()``
        if isinstance(ancestor, cst.FunctionDef):
            break
    length = _sized_by_a_whole_loader(script, call, name, any_binding=True)
    if length is None:
        return None
    accelerator = accelerator_name(script, call)
    per_epoch = ", ".join(str(script.line(s.call)) for s in steps if not s.per_batch)
    return (
        f"Step `{name}` {accelerator}.num_processes times here (`for _ in "
        f"range({accelerator}.num_processes): {name}.step()`): it is sized from "
        f"len({dotted(length.args[0].value)}) at line {script.line(length)}, all of the "
        "dataset's batches, but each of N processes steps it once per batch of its 1/N shard, "
        f"so its schedule ends N times late; prepare is no fix, as it is also stepped per epoch "
        f"(line {per_epoch}), where a prepared scheduler would step N times"
    )


def _sized_per_process_by_division(script: ScriptModel, step: cst.Call, name: str | None) -> bool:
    """Sized with ``len()`` of a DataLoader divided by the process count, nothing multiplying
    it back (``len(loader) // accelerator.num_processes * epochs``), and stepped once per
    optimizer step: each rank's own steps, as many as its shard of the prepared loader has
    batches, so left out of ``prepare`` it is right (prepared, ACC415's: it would step N times
    per call). Built before or after ``prepare`` alike (review11b: one built before it was
    told to be prepared)."""
    if not once_per_optimizer_step(script, step):
        return False
    bindings = [
        b
        for b in script.of_kind(Kind.SCHEDULER)
        if b.name == name and isinstance(b.value, cst.Call)
    ]
    if len(bindings) != 1:
        return False
    binding = bindings[0]
    built = script.order(binding.assign)
    values = _values_feeding(script, binding, name, built)
    loaders = script.names_of(Kind.DATALOADER) | script.prepared_names  # a loader of the caller's
    measured = divided = False
    for value in values:
        for node in walk(value):
            if (
                isinstance(node, cst.Call)
                and dotted(node.func) == "len"
                and node.args
                and dotted(node.args[0].value) in loaders
            ):
                measured = True
            if not isinstance(node, cst.BinaryOperation):
                continue
            if isinstance(node.operator, cst.Multiply) and (
                process_count(script, node.left, binding.assign)
                or process_count(script, node.right, binding.assign)
            ):
                return False  # multiplied back: every rank's steps
            if isinstance(node.operator, (cst.Divide, cst.FloorDivide)) and process_count(
                script, node.right, binding.assign
            ):
                divided = True
    return measured and divided


def _sized_by_a_whole_loader(
    script: ScriptModel, step: cst.Call, name: str | None, any_binding: bool = False
) -> cst.Call | None:
    """``len(train_dataloader)`` in what sizes scheduler ``name`` (its arguments, or a name
    they read that its scope assigns), where ``train_dataloader`` is prepared only after the
    scheduler is built: the whole dataset's batches, while each process steps it over its
    shard. The ``len`` call, or None. ``any_binding``: in any of the scheduler's constructions
    (one chosen by a flag), not only where it has one; none sized with ``num_processes``."""
    bindings = [
        b
        for b in script.of_kind(Kind.SCHEDULER)
        if b.name == name and isinstance(b.value, cst.Call)
    ]
    bindings += [inner for b in bindings for inner in _built_by_a_method(script, b)]
    if any_binding:
        if any(PROCESS_COUNT.search(script.module.code_for_node(b.value)) for b in bindings):
            return None
        found = (_sized_by_a_whole_loader_at(script, step, name, b) for b in bindings)
        return next((length for length in found if length is not None), None)
    if len(bindings) != 1:
        return None
    return _sized_by_a_whole_loader_at(script, step, name, bindings[0])


def _built_by_a_method(script: ScriptModel, binding: Binding) -> list[Binding]:
    """``self.lr_scheduler = self.init_lr_scheduler()``: the scheduler bindings of the file's
    method it calls whose name that method returns (``lr_scheduler = get_scheduler(...)``,
    ``return lr_scheduler``), where the size is."""
    target = script.call_graph.callee(binding.value)  # type: ignore[arg-type]
    if target is None:
        return []
    method = target[0]
    returned = {
        node.value.value
        for node in script.index.own_returns(method)
        if isinstance(node.value, cst.Name)
    }
    return [
        inner
        for inner in script.of_kind(Kind.SCHEDULER)
        if inner.name in returned
        and isinstance(inner.value, cst.Call)
        and facts_of(script).placement.enclosing_function(inner.assign) is method
    ]


def _sized_by_a_whole_loader_at(
    script: ScriptModel, step: cst.Call, name: str | None, binding: Binding
) -> cst.Call | None:
    built = script.order(binding.assign)
    later = {
        output
        for call in script.prepare_calls
        if _runs_after(script, call.call, binding.assign) and _runs_after(script, step, call.call)
        for output in call.outputs
        if output
    }
    # the names its arguments read, and the names their values read (``total =
    # per_epoch * epochs`` over ``per_epoch = len(loader) // accumulation``), in its scope
    values = _values_feeding(script, binding, name, built)
    for value in values:
        for node in walk(value):
            if (
                isinstance(node, cst.Call)
                and dotted(node.func) == "len"
                and node.args
                and dotted(node.args[0].value) in later
            ):
                return node
    return None


def _runs_after(script: ScriptModel, later: cst.CSTNode, earlier: cst.CSTNode) -> bool:
    """``later`` runs after ``earlier``: below it in the same function, or below a call, in
    ``later``'s function, of the method that holds ``earlier`` (a constructor that calls
    ``self.setup_scheduler()`` and then prepares: the scheduler is sized before prepare, though
    its method is written below the constructor)."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(earlier)
    home = facts.placement.enclosing_function(later)
    if function is home:
        return script.order(later) > script.order(earlier)
    if function is not None:
        sites = [site for site, _ in facts.calls.calls_of(function)]
        if sites and all(facts.placement.enclosing_function(site) is home for site in sites):
            return all(script.order(later) > script.order(site) for site in sites)
    if home is not None:
        # ``later`` in a helper (``def train(...): scheduler.step()``) that ``earlier``'s
        # function calls below it: ``train(...)`` after the prepare in ``main``
        sites = [site for site, _ in facts.calls.calls_of(home)]
        if sites and all(facts.placement.enclosing_function(site) is function for site in sites):
            return all(script.order(site) > script.order(earlier) for site in sites)
    return script.order(later) > script.order(earlier)


def _whole_loader_message(script: ScriptModel, name: str | None, length: cst.Call) -> str:
    loader = dotted(length.args[0].value)
    per_epoch = [
        step
        for step in facts_of(script).flow.scheduler_steps({name or ""})
        if step.scheduler == name and not step.per_batch
    ]
    if per_epoch:
        # also stepped once per epoch (a ReduceLROnPlateau built in another branch): prepared,
        # that step would run num_processes times, so the fix is the size, not prepare
        return (
            f"Build scheduler `{name}` after prepare, sized from the prepared len({loader}): it "
            f"is sized from len({loader}) at line {script.line(length)}, before prepare, so from "
            "all of the dataset's batches, while each of N processes steps it through its 1/N "
            "shard only: the schedule gets 1/N of the way (preparing it is no fix, as it is also "
            f"stepped per epoch at line {script.line(per_epoch[0].call)}, where a prepared "
            "scheduler would step N times)"
        )
    message = (
        f"Pass scheduler `{name}` to accelerator.prepare and use what it returns: it is sized "
        f"from len({loader}) at line {script.line(length)}, before prepare, so from all of the "
        "dataset's batches, while each of N processes steps it through its 1/N shard only: the "
        "schedule gets 1/N of the way (a prepared scheduler steps once per process)"
    )
    if DEEPSPEED in backends_in_view(script):
        message += (
            "; under DeepSpeed, whose engine steps a prepared scheduler once per optimizer "
            f"step, build it after prepare from the prepared len({loader}) instead"
        )
    return message


def _loader_message(script: ScriptModel, name: str | None, at: cst.CSTNode) -> str:
    """A loader wrapped in an object of the file's own before ``at`` (`wrapped_at`) is prepared
    before it is wrapped: ``prepare`` would hand the wrapper back unsharded."""
    wrap = wrapped_at(script, name, at)
    if wrap is None:
        return _message("DataLoader", name, "sharded")
    return (
        f"Prepare DataLoader `{name}` before line {script.line(wrap)} wraps it in "
        f"{dotted(wrap.value.func)} (accelerator.prepare hands that wrapper back as it is) and "  # type: ignore[attr-defined]
        "use what it returns: unprepared, it is not sharded"
    )


def _message(what: str, name: str | None, effect: str) -> str:
    return (
        f"Pass {what} `{name}` to accelerator.prepare and use what it returns: "
        f"unprepared, it is not {effect}"
    )


def _a_loader_tuple(script: ScriptModel, source: str | None) -> bool:
    """``source`` is bound to a factory's tuple of loaders (``data = build_data(cfg)``, read as
    ``data[0]``: `objects.is_loader_tuple`)."""
    return any(b.name == source and is_loader_tuple(script, b) for b in script.bindings)


def _dict_prepared_whole(script: ScriptModel, source: str | None) -> PrepareCall | None:
    """The prepare call that ``source``, a dict of loaders, was handed to whole and came back
    from: ``prepare`` hands a dict back as it is, none of its loaders prepared."""
    for prepare in script.prepare_calls:
        passed = {dotted(argument.value) for argument in prepare.call.args}
        for given, returned in zip(prepare.inputs, prepare.outputs, strict=False):
            if (
                returned == source
                and given in passed
                and any(b.name == given and is_loader_dict(script, b) for b in script.bindings)
            ):
                return prepare
    return None


def _dict_message(script: ScriptModel, prepare: PrepareCall, source: str, loop: Loop) -> str:
    """ACC401's advice for a loop over an entry of a dict of loaders prepared whole: prepare
    the entries themselves, in the same call (under DeepSpeed the model's prepare reads its
    batch size from a loader prepared with it), written out with the keys the file reads."""
    code = script.module.code_for_node
    keys: list[str] = []
    scope = script.index.enclosing_function(prepare.call) or script.module
    for node in walk(scope):
        if (
            isinstance(node, cst.Subscript)
            and dotted(node.value) == source
            and len(node.slice) == 1
            and isinstance(node.slice[0].slice, cst.Index)
            and isinstance(node.slice[0].slice.value, cst.SimpleString)
        ):
            entry = code(node)
            if entry not in keys:
                keys.append(entry)
    said = (
        f"Prepare the loaders in `{source}`, not the dict: accelerator.prepare hands a dict "
        f"back as it is (line {prepare.line}), so `{code(loop.node.iter)}` is not sharded and "
        "every rank iterates all of it"
    )
    statement = script.parent(prepare.call)
    if not keys or not (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Tuple)
    ):
        return said + (
            f"; prepare each entry with the model, in the same call "
            f"(`{source}[key]` for each key among its arguments and targets)"
        )
    entries = ", ".join(keys)

    def spread(items: list[str]) -> str:
        return ", ".join(entries if item == source else item for item in items)

    targets = spread([code(e.value) for e in statement.targets[0].target.elements])
    arguments = spread([code(a.value) for a in prepare.call.args])
    return said + f": `{targets} = {code(prepare.call.func)}({arguments})`"


def _prepared_names(script: ScriptModel) -> set[str]:
    """Names that hold what a prepare call returned, including ``prepare_data_loader`` and the
    other single-object forms."""
    found = set(script.prepared_names)
    accelerators = script.names_of(Kind.ACCELERATOR)
    for prepare in script.prepare_calls:  # a dict of loaders comes back untouched
        passed = {dotted(argument.value) for argument in prepare.call.args}
        for given, returned in zip(prepare.inputs, prepare.outputs, strict=False):
            if given in passed and any(
                b.name == given and is_loader_dict(script, b) for b in script.bindings
            ):
                found.discard(returned)
    for call in calls(script):
        func = call.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value.startswith("prepare_")
            and dotted(func.value) in accelerators
        ):
            found |= {dotted(argument.value) for argument in call.args} - {None}
    return found


def _branch_chain(script: ScriptModel, call: cst.Call) -> tuple[cst.If, list[cst.CSTNode]] | None:
    """The if/elif/else chain whose branch holds ``call`` directly (not under a nested
    function): its first ``if`` and the branches other than the call's."""
    child: cst.CSTNode = call
    for ancestor in script.ancestors(call):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(ancestor, cst.If) and child is not ancestor.test:
            own = child.body if isinstance(child, cst.Else) else child
            top = ancestor
            while isinstance(parent := script.parent(top), cst.If) and parent.orelse is top:
                top = parent
            return top, [b for b in _branches(top) if b is not own]
        child = ancestor
    return None


def _backward_calls(script: ScriptModel) -> list[cst.Call]:
    """``accelerator.backward(loss)`` and ``loss.backward()``: where the script trains."""
    return [
        call
        for call in script.calls
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"
    ]


def _branches(top: cst.If) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    node: cst.If | cst.Else | None = top
    while isinstance(node, cst.If):
        found.append(node.body)
        node = node.orelse
    if isinstance(node, cst.Else):
        found.append(node.body)
    return found


def _chain_tests(top: cst.If) -> list[cst.BaseExpression]:
    tests = []
    node: cst.If | cst.Else | None = top
    while isinstance(node, cst.If):
        tests.append(node.test)
        node = node.orelse
    return tests


def _built_in(branch: cst.CSTNode) -> set[str]:
    """Names and attributes a branch binds to what a call builds (``scheduler =
    get_cosine_schedule_with_warmup(...)``), unpacked targets included; not ``x = None``."""
    found: set[str] = set()
    for node in walk(branch):
        targets: list[cst.BaseExpression] = []
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
            targets = [t.target for t in node.targets]
        elif isinstance(node, cst.AnnAssign) and isinstance(node.value, cst.Call):
            targets = [node.target]
        for target in targets:
            elements = (
                [e.value for e in target.elements]
                if isinstance(target, (cst.Tuple, cst.List))
                else [target]
            )
            found.update(name for e in elements if (name := dotted(e)) is not None)
    return found


def _used_after(script: ScriptModel, chain: cst.If, names: set[str]) -> bool:
    """A read of one of ``names`` below the chain, outside it: the code that runs on every
    path (the training loop after it, a trainer's other methods)."""
    end = max(script.order(node) for node in walk(chain))
    nodes = [*script.index.of_type(cst.Name), *script.index.of_type(cst.Attribute)]
    for node in nodes:
        if (
            dotted(node) in names
            and script.order(node) > end
            and not isinstance(script.parent(node), cst.AssignTarget)
        ):
            return True
    return False


def _prepares_in(script: ScriptModel, branch: cst.CSTNode) -> bool:
    return any(_inside(script, prepare.call, branch) for prepare in script.prepare_calls)


def _inside(script: ScriptModel, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    return any(ancestor is container for ancestor in script.ancestors(node))


def _prepared_inline(loop: Loop) -> bool:
    """``for batch in accelerator.prepare(loader)`` or ``skip_first_batches(...)``."""
    node: cst.BaseExpression = loop.node.iter
    while isinstance(node, cst.Call):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value.startswith(
            ("prepare", "skip_first_batches")
        ):
            return True
        if not node.args:
            return False
        node = node.args[0].value
    return False


def _loop_rebinding(script: ScriptModel, prepare: PrepareCall) -> cst.For | None:
    """The ``for`` whose variable alone receives what ``prepare`` returns, when nothing in the
    loop's body reads that variable after the prepare (so the prepared object is lost)."""
    if len(prepare.outputs) != 1 or not isinstance(prepare.call.func, cst.Attribute):
        return None
    output = prepare.outputs[0]
    for ancestor in script.ancestors(prepare.call):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return None
        if not isinstance(ancestor, cst.For):
            continue
        if not isinstance(ancestor.target, cst.Name) or ancestor.target.value != output:
            return None
        after = script.order(prepare.call)
        other_branches = _other_branches(script, prepare.call, ancestor)
        for node in walk(ancestor.body):
            if (
                isinstance(node, cst.Name)
                and node.value == output
                and script.order(node) > after
                and not _within(script, node, (prepare.call, *other_branches))
            ):
                return None
        return ancestor
    return None


def _other_branches(script: ScriptModel, node: cst.CSTNode, until: cst.CSTNode) -> list:
    """The ``else`` blocks of the ``if`` statements around ``node`` (up to ``until``) whose
    body holds it: code there never runs after ``node``."""
    found = []
    child = node
    for ancestor in script.ancestors(node):
        if ancestor is until:
            break
        if isinstance(ancestor, cst.If) and child is ancestor.body and ancestor.orelse is not None:
            found.append(ancestor.orelse)
        child = ancestor
    return found


def _within(script: ScriptModel, node: cst.CSTNode, containers: tuple) -> bool:
    return any(ancestor is c for ancestor in script.ancestors(node) for c in containers)


def _called_from_loops(script: ScriptModel, loops: list[Loop]) -> set[int]:
    """The calls in the file's functions (two calls deep) that a loop runs through a call of its
    own (``self.step(batch)``)."""
    found: set[int] = set()
    pending = [(call, 0) for loop in loops for call in calls_in(script, loop.node)]
    seen: set[int] = set()
    while pending:
        call, depth = pending.pop()
        target = script.call_graph.callee(call)
        if target is None or id(target[0]) in seen or depth >= 2:
            continue
        seen.add(id(target[0]))
        for inner in calls_in(script, target[0]):
            found.add(id(inner))
            pending.append((inner, depth + 1))
    return found


def _in_a_training_step(script: ScriptModel, call: cst.Call) -> bool:
    """``call`` is in a function of the file that also runs a backward: a training step."""
    function = facts_of(script).placement.enclosing_function(call)
    return function is not None and any(
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "backward"
        for node in walk(function)
    )


def _stepped_per_cycle(script: ScriptModel, step: cst.Call) -> bool:
    """``step`` may run once per accumulation cycle rather than every batch: under a test with
    a ``%`` (``if (i + 1) % accum == 0:``) or of ``sync_gradients``, or inside an
    ``accumulate()`` context. Dividing each loss by the steps is then what accumulating by
    hand does; whether the cycle matches the Accelerator's steps the file cannot always tell,
    so such a step is not reported."""
    for ancestor in script.ancestors(step):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(ancestor, cst.With) and accumulate_context(ancestor) is not None:
            return True
        if isinstance(ancestor, (cst.If, cst.While)) and any(
            (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo))
            or (isinstance(node, cst.Attribute) and node.attr.value == "sync_gradients")
            for node in walk(ancestor.test)
        ):
            return True
    return False


def _backward_changes_gradients(script: ScriptModel) -> str | None:
    """What the file's own Accelerator does to the gradients an unprepared optimizer then
    steps, in words: ``mixed_precision="fp16"`` (the backward scales the loss; the prepared
    optimizer unscales, skips steps with inf/NaN), ``gradient_accumulation_steps`` (the backward
    divides every loss; the prepared optimizer steps only on sync steps). None where it sets
    neither, hands the Accelerator to another function (which may prepare), or never runs its
    backward."""
    found = None
    made = set()
    for binding in script.of_kind(Kind.ACCELERATOR):
        value = binding.value
        if "." in binding.name or not isinstance(value, cst.Call):
            continue
        if not script.call_names(value) & names.ACCELERATORS:
            continue
        made.add(binding.name)
        precision = accelerator_argument(value, "mixed_precision")
        steps = accelerator_argument(value, "gradient_accumulation_steps")
        if (
            precision is not None
            and isinstance(precision.value, cst.SimpleString)
            and precision.value.evaluated_value == "fp16"
        ):
            found = (
                'mixed_precision="fp16" the Accelerator\'s backward scales the loss, so this '
                "unprepared optimizer steps gradients thousands of times too large (the "
                "prepared one unscales them and skips steps with inf or NaN)"
            )
        elif (
            steps is not None
            and isinstance(steps.value, cst.Integer)
            and int(steps.value.evaluated_value) > 1
        ):
            found = (
                f"gradient_accumulation_steps={steps.value.value} the Accelerator's backward "
                "divides every loss, so this unprepared optimizer steps every batch on a "
                "fraction of the gradient (the prepared one steps only when they are synced)"
            )
    if found is None or any("prepare" in (dotted(call.func) or "") for call in script.calls):
        return None
    if any(dotted(argument.value) in made for call in script.calls for argument in call.args):
        return None  # ``setup(accelerator, model)`` may prepare elsewhere
    backward = any(
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "backward"
        and dotted(call.func.value) in made
        for call in script.calls
    )
    return found if backward else None


def _values_feeding(
    script: ScriptModel, binding: Binding, name: str | None, built: int
) -> list[cst.CSTNode]:
    """``binding``'s value, and the values of the names it reads bound above it in its scope,
    and theirs (``total = per_epoch * epochs`` over ``per_epoch = len(loader) // accumulation``):
    at most 32, enough for any sizing written by hand."""
    values: list[cst.CSTNode] = [binding.value]
    seen = {name}
    for value in values:
        for node in walk(value):
            if isinstance(node, cst.Name) and node.value not in seen and len(values) < 32:
                seen.add(node.value)
                values += [
                    bound
                    for statement, bound in script.index.values_bound_to(node.value)
                    if script.scope_of(statement) is binding.scope
                    and script.order(statement) < built
                ]
            held = _held_on_self(script, node)
            if held is not None and held not in seen and len(values) < 32:
                seen.add(held)
                values += _values_held_on_self(script, held, binding.assign, built)
    return values


def _held_on_self(script: ScriptModel, node: cst.CSTNode) -> str | None:
    """The code of ``self.steps_per_epoch`` or ``self.config["max_train_steps"]`` (a trainer
    that keeps a scheduler's size on the instance), None for any other node."""
    if isinstance(node, cst.Attribute):
        name = dotted(node)
        return name if name is not None and name.startswith("self.") else None
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        base = dotted(node.value)
        if (
            isinstance(index, cst.Index)
            and isinstance(index.value, cst.SimpleString)
            and base is not None
            and base.startswith("self.")
        ):
            return script.module.code_for_node(node)
    return None


def _values_held_on_self(
    script: ScriptModel, held: str, at: cst.CSTNode, built: int
) -> list[cst.CSTNode]:
    """What the methods of ``at``'s class assign to ``held`` (`_held_on_self`) above
    ``built``: the constructor's ``self.config["max_train_steps"] = epochs * per_epoch`` for a
    scheduler a method below it builds."""
    owner = script.index.nearest(at, cst.ClassDef)
    if owner is None:
        return []
    return [
        assign.value
        for assign in script.index.of_type((cst.Assign,))
        if isinstance(assign, cst.Assign)
        and script.order(assign) < built
        and script.index.nearest(assign, cst.ClassDef) is owner
        and any(_held_on_self(script, target.target) == held for target in assign.targets)
    ]
