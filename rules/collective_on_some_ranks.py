from collections.abc import Iterator

import libcst as cst

from accelify.analysis.buffered_models import forward_syncs_buffers
from accelify.analysis.collective_reach import CollectiveUse, LoaderPass
from accelify.analysis.collectives import FSDP, backends_in_view, named
from accelify.analysis.facts import facts_of
from accelify.analysis.loader_passes import iterator_made
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name, in_file_words

_HF = "from accelerate import Accelerator, DistributedType\naccelerator = Accelerator()\n"

#: A prepared DataLoader that shuffles (``{shuffle}``), read on the main process alone
#: (``{probe}``: a loop, or a helper's call that makes it).
_MAIN_ONLY_PASS = (
    "from accelerate import Accelerator\nfrom torch.utils.data import DataLoader\n\n\n"
    "def count_all(batches):\n"
    "    n = 0\n"
    "    for x, y in batches:\n"
    "        n += len(x)\n"
    "    return n\n\n\n"
    "accelerator = Accelerator()\n"
    "loader = DataLoader(data, batch_size=8, {shuffle})\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "for x, y in loader:\n"
    "    accelerator.backward(model(x).sum())\n"
    "if accelerator.is_main_process:\n"
    "    {probe}\n"
)

#: A model with a BatchNorm, trained under DDP (`_EVALUATE` and `_MAIN_ONLY` follow it).
_BUFFERED = (
    "import torch\n"
    "from accelerate import Accelerator, DistributedDataParallelKwargs\n\n\n"
    "class Net(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))\n"
    "        self.head = torch.nn.Linear(8, 1)\n\n"
    "    def forward(self, x):\n"
    "        return self.head(self.body(x))\n\n\n"
    "accelerator = Accelerator()\n"
)
#: `_BUFFERED`'s model with its buffer registered by a base class (``{register}`` in its
#: ``__init__``): the subclass holds it all the same.
_BASE_BUFFERED = (
    "import torch\n"
    "from accelerate import Accelerator\n\n\n"
    "class Normalised(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        {register}\n\n\n"
    "class Net(Normalised):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.head = torch.nn.Linear(4, 1)\n\n"
    "    def forward(self, x):\n"
    "        return self.head(x - self.mean)\n\n\n"
    "accelerator = Accelerator()\n"
)
_EVALUATE = (
    "def evaluate(model, loader):\n"
    "    model.eval()\n"
    "    with torch.no_grad():\n"
    "        total = sum(model(x).sub(y).abs().sum().item() for x, y in loader)\n"
    "    model.train()\n"
    "    return total\n"
)
_MAIN_ONLY = (
    "model, optimizer, loader = accelerator.prepare(Net(), optimizer, loader)\n"
    "for x, y in loader:\n"
    "    accelerator.backward(model(x).sub(y).pow(2).mean())\n"
    "    optimizer.step()\n"
    "if accelerator.is_main_process:\n"
    "    print(evaluate({model}, test_loader))\n"
)

#: A CLIP reward model (its embeddings register ``position_ids`` buffers) trained under DDP and
#: validated each epoch on the main process in train mode, gradients on; ``{model}`` is what
#: the validation runs.
_CLIP_MAIN_ONLY = (
    "import torch\nfrom accelerate import Accelerator\n"
    "from transformers import CLIPModel\n\n\n"
    "def main(config):\n"
    "    accelerator = Accelerator()\n"
    "    model = CLIPModel.from_pretrained('openai/clip-vit-base-patch32')\n"
    "    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)\n"
    "    model, optimizer, train_loader, val_loader = accelerator.prepare(\n"
    "        model, optimizer, train_loader, val_loader\n"
    "    )\n"
    "    for epoch in range(config.epochs):\n"
    "        for batch in train_loader:\n"
    "            accelerator.backward(model(**batch, return_loss=True).loss)\n"
    "            optimizer.step()\n"
    "            optimizer.zero_grad()\n"
    "        if accelerator.is_main_process:\n"
    "            accelerator.save_model({model}, config.output_dir)\n"
    "            val_loss = 0.0\n"
    "            for batch in val_loader:\n"
    "                val_loss += {model}(**batch, return_loss=True).loss.item()\n"
    "            print(epoch, val_loss)\n"
)


_FSDP_PLUGIN = (
    "from accelerate.utils import FullyShardedDataParallelPlugin\n"
    "plugin = FullyShardedDataParallelPlugin()\n"
)

_TRAINER_VALIDATES = (
    "import torch\nfrom accelerate import Accelerator\n{plugin}\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer, loader):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.is_main = self.accelerator.is_main_process\n"
    "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
    "            model, optimizer, loader)\n\n"
    "    def validate(self, n):\n"
    "        losses = []\n"
    "        with torch.no_grad():\n"
    "            for i, batch in zip(range(n), self.loader):\n"
    "                losses.append(self.model(**batch).loss.item())\n"
    "        return sum(losses) / len(losses)\n\n"
    "    def train(self):\n"
    "        for batch in self.loader:\n"
    "            self.accelerator.backward(self.model(**batch).loss)\n"
    "            self.optimizer.step()\n"
    "        {guard}print(self.validate(4))\n"
)


def _validated_beside_a_finish(rebinding: str) -> str:
    """The FSDP trainer validating on the main process alone, beside a ``finish`` method whose
    one statement ``rebinding`` binds ``self.model`` anew."""
    return _TRAINER_VALIDATES.format(
        plugin=_FSDP_PLUGIN, guard="if self.is_main:\n            "
    ).replace(
        "    def train(self):",
        f"    def finish(self):\n        {rebinding}\n\n    def train(self):",
    )


_BEST_CHECKPOINT = (
    "import torch\nfrom accelerate import Accelerator{imports}\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer):\n"
    "        self.accelerator = Accelerator({plugin})\n"
    "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n"
    "        self.best_acc = 0.0\n\n"
    "    def save_checkpoint(self, name):\n"
    "        state = {{'model': self.accelerator.get_state_dict(self.model)}}\n"
    "        self.accelerator.save(state, name)\n\n"
    "    def fit(self, acc):\n"
    "        if acc > self.best_acc and self.accelerator.is_main_process:\n"
    "            self.best_acc = acc\n"
    "            self.save_checkpoint('best.pt')\n"
)


#: A base trainer's fit evaluating on the main process through ``self.evaluate()``, which a
#: subclass overrides (``{evaluate}``: how the override ends).
#: A shuffled prepared DataLoader whose iterator is kept (``batches = iter(loader)``) and drawn
#: from in a loop (``{draw}``): its pass starts at the first ``next``, not at ``iter``.
_KEPT_ITERATOR = (
    "from accelerate import Accelerator\nfrom torch.utils.data import DataLoader\n"
    "accelerator = Accelerator()\n"
    "loader = DataLoader(data, batch_size=8, {shuffle})\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "batches = iter(loader)\n"
    "for step in range(100):\n"
    "{draw}"
)
#: A trainer that keeps its prepared loader's iterator and draws a preview batch (``{draw}``).
_TRAINER_ITERATOR = (
    "from accelerate import Accelerator\nfrom torch.utils.data import DataLoader\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer, data):\n"
    "        self.accelerator = Accelerator()\n"
    "        loader = DataLoader(data, batch_size=8, shuffle=True)\n"
    "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
    "            model, optimizer, loader\n"
    "        )\n"
    "        self._batches = iter(self.loader)\n\n"
    "    def preview(self):\n"
    "{draw}"
)
_MAIN_DRAWS = "    if accelerator.is_main_process:\n        print(next(batches))\n"
_EVERY_RANK_DRAWS = (
    "    batch = next(batches)\n    if accelerator.is_main_process:\n        print(batch)\n"
)


_SUBCLASS_EVALUATES = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "\n"
    "\n"
    "class Base:\n"
    "    def __init__(self, model, optimizer, loader):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer, self.loader = self.accelerator.prepare("
    "model, optimizer, loader)\n"
    "\n"
    "    def evaluate(self):\n"
    "        return 0.0\n"
    "\n"
    "    def fit(self):\n"
    "        for x in self.loader:\n"
    "            self.accelerator.backward(self.model(x).sum())\n"
    "            self.optimizer.step()\n"
    "        if self.accelerator.is_main_process:\n"
    "            print(self.evaluate())\n"
    "\n"
    "\n"
    "class Trainer(Base):\n"
    "    def evaluate(self):\n"
    "        total = torch.zeros(1, device=self.accelerator.device)\n"
    "        for x in self.loader:\n"
    "            total += self.model(x).sum()\n"
    "{evaluate}\n"
    "\n"
    "Trainer(model, optimizer, loader).fit()\n"
)


#: A trainer whose flag is set with setattr (``{flag}``) and tested around a barrier.
_FLAG_SET_BY_SETATTR = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "\n"
    "\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer, loader):\n"
    "        self.accelerator = Accelerator()\n"
    "{flag}"
    "        self.model, self.optimizer, self.loader = self.accelerator.prepare("
    "model, optimizer, loader)\n"
    "\n"
    "    def fit(self):\n"
    "        for x in self.loader:\n"
    "            self.accelerator.backward(self.model(x).sum())\n"
    "            self.optimizer.step()\n"
    "        if self.is_main:\n"
    "            self.accelerator.wait_for_everyone()\n"
    '            print("done")\n'
    "\n"
    "\n"
    "Trainer(model, optimizer, loader).fit()\n"
)


#: A DeepSpeed config spelt in the script and handed to the plugin; the main process alone
#: asks for the model's state dict.
_SPELLED_DS_CONFIG = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "from accelerate.utils import DeepSpeedPlugin\n\n"
    'ds_config = {{"zero_optimization": {{"stage": {stage}}}}}\n'
    "plugin = DeepSpeedPlugin(hf_ds_config=ds_config)\n"
    "accelerator = Accelerator(deepspeed_plugin=plugin)\n"
    "model, optimizer = accelerator.prepare(model, optimizer)\n"
    "accelerator.backward(model(x).mean())\n"
    "optimizer.step()\n"
    "if accelerator.is_main_process:\n"
    "    state = accelerator.get_state_dict(model)\n"
    "    torch.save(state, 'model.pt')\n"
)

_CALLED_BY_ANOTHER_NAME = (
    "from accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model = self.accelerator.prepare(model)\n"
    "{alias}"
    "\n    def sync(self):\n"
    "{sync}"
    "\n    def fit(self):\n"
    "        if self.accelerator.is_main_process:\n"
    "            {call}\n"
)


class CollectiveOnSomeRanks(Rule):
    """A collective (``wait_for_everyone``, ``gather``, ``reduce``, ``main_process_first``,
    ``save_state`` under DeepSpeed/FSDP or accelify's runtime, ``get_state_dict`` under FSDP
    and ZeRO-3, the forward or ``generate`` of a prepared model under FSDP, and under DDP too
    when the model holds buffers (a BatchNorm, a transformers CLIP's or BERT's position ids:
    DDP's forward broadcasts them from rank 0, in train and eval mode alike and under
    ``no_grad`` as well; measured on 2 ranks, `analysis.buffered_models`),
    where the advice is to run that forward through ``accelerator.unwrap_model(model)``...;
    a model bound to ``accelerator.unwrap_model(model)``, also moved after it (``.to("cpu")``),
    is the bare module, unless that binding sits in a branch a run may skip, ``if
    args.export:``)
    inside a block only some ranks enter, directly or through a function of the script. A
    backend counts when the script names it, also through its own flag (``--deepspeed``,
    ``args.use_fsdp``). Those ranks wait for the others, who never arrive: the job hangs until
    the timeout, 30 minutes later. A guard that lets every rank in where the call is a collective
    (``is_main_process or distributed_type == DistributedType.DEEPSPEED``) is right. A pass
    over a prepared DataLoader is one too where it starts with a collective
    (`analysis.loader_passes`: a loader that shuffles broadcasts rank 0's seed, dispatched
    batches are broadcast), reported at the loop (a comprehension, a generator read,
    ``list(loader)`` and ``next(iter(loader))`` start a pass too), or at the call of the file's
    function that iterates it; one that reads its data in order meets nobody (measured on 2 CPU
    ranks, HF Accelerate and accelify)."""

    code = "ACC202"
    name = "collective-on-some-ranks"
    message = (
        "Call this on every rank: it is a collective, and the other ranks never reach it (hang)"
    )
    why = "Collectives complete only when every rank calls them."
    bad = (
        # a shuffled prepared loader read on the main process alone: its pass starts with a
        # broadcast of rank 0's seed (hangs on 2 ranks, HF Accelerate 1.15 and accelify)
        Example(
            _MAIN_ONLY_PASS.format(
                shuffle="shuffle=True", probe="for x, y in loader:\n        print(x.shape)"
            ),
            18,
            5,
        ),
        # ... through a helper handed the loader, called on the main process alone
        Example(
            _MAIN_ONLY_PASS.format(shuffle="shuffle=True", probe="print(count_all(loader))"),
            18,
            11,
        ),
        # ... its first batch, a comprehension, a generator, or list(): each starts a pass
        Example(
            _MAIN_ONLY_PASS.format(shuffle="shuffle=True", probe="first = next(iter(loader))"),
            18,
            13,
        ),
        Example(
            _MAIN_ONLY_PASS.format(
                shuffle="shuffle=True", probe="sizes = [len(x) for x, y in loader]"
            ),
            18,
            13,
        ),
        Example(
            _MAIN_ONLY_PASS.format(
                shuffle="shuffle=True", probe="print(sum(len(x) for x, y in loader))"
            ),
            18,
            15,
        ),
        Example(
            _MAIN_ONLY_PASS.format(shuffle="shuffle=True", probe="batches = list(loader)"),
            18,
            15,
        ),
        # ... its iterator kept, the first batch drawn on the main process alone: the pass
        # starts at that next() (a loop's, or a trainer's own iterator)
        Example(_KEPT_ITERATOR.format(shuffle="shuffle=True", draw=_MAIN_DRAWS), 9, 15),
        # ... itertools.cycle's first draw iterates the loader; a for over the kept iterator
        Example(
            "import itertools\n"
            + _KEPT_ITERATOR.format(shuffle="shuffle=True", draw=_MAIN_DRAWS).replace(
                "batches = iter(loader)", "batches = itertools.cycle(loader)"
            ),
            10,
            15,
        ),
        Example(
            _KEPT_ITERATOR.format(
                shuffle="shuffle=True",
                draw="    if accelerator.is_main_process:\n"
                "        for batch in batches:\n            print(batch)\n",
            ),
            9,
            9,
        ),
        Example(
            _TRAINER_ITERATOR.format(
                draw="        if self.accelerator.is_main_process:\n"
                "            print(next(self._batches))\n"
            ),
            16,
            19,
        ),
        # the subclass's override reduces: a Trainer's fit runs it on the main process only
        Example(
            _SUBCLASS_EVALUATES.format(
                evaluate="        return self.accelerator.reduce(total).item()\n"
            ),
            18,
            19,
        ),
        # the main-process flag set through setattr is a rank test all the same
        Example(
            _FLAG_SET_BY_SETATTR.format(
                flag='        setattr(self, "is_main", self.accelerator.is_main_process)\n'
            ),
            16,
            13,
        ),
        # a DDP model with a BatchNorm evaluated on the main process only: DDP's forward
        # broadcasts the buffers from rank 0 (eval mode and no_grad too), the others never join
        Example(_BUFFERED + _EVALUATE + _MAIN_ONLY.format(model="model"), 27, 11),
        # broadcast_buffers named, but on (the default): DDP's forward still broadcasts
        Example(
            _BUFFERED.replace(
                "Accelerator()",
                "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=True)])",
            )
            + _EVALUATE
            + _MAIN_ONLY.format(model="model"),
            27,
            11,
        ),
        # the buffer registered by the model's base class: the subclass's DDP forward
        # broadcasts it all the same
        Example(
            _BASE_BUFFERED.format(register="self.register_buffer('mean', torch.zeros(4))")
            + _EVALUATE
            + _MAIN_ONLY.format(model="model"),
            32,
            11,
        ),
        # a transformers CLIP (position_ids buffers) validated on the main process alone,
        # in train mode with gradients on: each forward broadcasts the buffers from rank 0
        Example(_CLIP_MAIN_ONLY.format(model="model"), 22, 29),
        # a torchvision ResNet (BatchNorm throughout), run directly under the guard
        Example(
            "import torch\nimport torchvision\nfrom accelerate import Accelerator\n"
            "accelerator = Accelerator()\n"
            "model = torchvision.models.resnet18(num_classes=10)\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model, optimizer = accelerator.prepare(model, optimizer)\n"
            "if accelerator.is_main_process:\n"
            "    with torch.no_grad():\n"
            "        preview = model(torch.zeros(1, 3, 32, 32))\n",
            10,
            19,
        ),
        # an evaluator callback handed the trainer: its accelerator is the trainer's, and a
        # gather under the main-process test is reached by one rank only
        Example(
            "import torch\n\n\nclass Evaluator:\n"
            + "    def on_test_batch(self, batch, predictions, trainer):\n"
            + "        metrics = self.compute(batch, predictions)\n"
            + "        if trainer.accelerator.is_main_process:\n"
            + "            gathered = trainer.accelerator.gather_for_metrics(metrics)\n"
            + "            self.metrics_list.append(gathered)\n",
            8,
            24,
        ),
        Example(
            HEADER + "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n", 4, 5
        ),
        # HF Accelerate's save_state on the main process only, launched with a DeepSpeed config
        # (its usage line): a collective there, the other ranks never reach it (hang)
        Example(
            '"""Run: accelerate launch --config_file configs/deepspeed_zero2.yaml train.py"""\n'
            + "from accelerate import Accelerator\naccelerator = Accelerator()\n"
            + "if accelerator.is_main_process:\n    accelerator.save_state('ckpt')\n",
            5,
            5,
        ),
        # Accelerate's decorators are rank guards around the whole body
        Example(
            HEADER + "@accelerator.on_local_main_process\ndef finish():\n"
            "    accelerator.wait_for_everyone()\n",
            5,
            5,
        ),
        Example(
            HEADER + "@accelerator.on_process(0)\ndef report(total):\n"
            "    return accelerator.gather(total)\n",
            5,
            12,
        ),
        Example(HEADER + "if accelerator.process_index == 0:\n    accelerator.reduce(t)\n", 4, 5),
        Example(HEADER + "if rank == 0:\n    accelerator.save_state('ckpt')\n", 4, 5),
        # Megatron's parallel state: tensor-parallel rank 0 only, the other ranks never arrive
        Example(
            HEADER + "from megatron.core import parallel_state as mpu\n"
            "if mpu.get_tensor_model_parallel_rank() == 0:\n    accelerator.wait_for_everyone()\n",
            5,
            5,
        ),
        # the rank handed to a helper under its own fused name
        Example(
            HEADER + "import torch\n\n\ndef evaluate(model, myrank, acc):\n"
            "    if myrank == 0:\n        return acc.gather(torch.ones(1))\n\n\n"
            "evaluate(model, accelerator.process_index, accelerator)\n",
            8,
            16,
        ),
        Example(  # the launcher's variable, read into a local
            HEADER + "import os\nlocal_rank = int(os.environ.get('LOCAL_RANK', 0))\n"
            "if local_rank == 0:\n    accelerator.wait_for_everyone()\n",
            6,
            5,
        ),
        Example(
            HEADER
            + "def finish():\n    accelerator.wait_for_everyone()\n\n\n"
            + "if accelerator.is_main_process:\n    finish()\n",
            8,
            5,
        ),
        Example(  # the barrier in save() behind a trainer's own name for the rank test
            "from accelerate import Accelerator\n\n\nclass Trainer:\n"
            "    def __init__(self):\n        self.accelerator = Accelerator()\n"
            "        self.can_checkpoint = self.accelerator.is_main_process\n\n"
            "    def save(self, path):\n        self.accelerator.wait_for_everyone()\n"
            "        if not self.can_checkpoint:\n            return\n"
            "        self.accelerator.save(self.state, path)\n\n"
            "    def checkpoint(self):\n        self.accelerator.wait_for_everyone()\n"
            "        if not self.can_checkpoint:\n            return\n"
            "        self.save('ckpt.pt')\n",
            19,
            9,
        ),
        Example(
            HEADER + "def finish():\n    if not accelerator.is_main_process:\n        return\n"
            "    accelerator.wait_for_everyone()\n",
            6,
            5,
        ),
        # a PPO trainer's rollout answers None on the other ranks, and its caller branches on
        # the answer around the collectives: only the main process enters
        Example(
            HEADER
            + "import torch\n\n\n"
            + "def collect_rollouts(policy, n):\n"
            + "    if not accelerator.is_main_process:\n        return None\n"
            + "    return [policy(torch.randn(4)) for _ in range(n)]\n\n\n"
            + "for epoch in range(3):\n"
            + "    rollouts = collect_rollouts(model, 8)\n"
            + "    if rollouts is not None:\n"
            + "        stats = accelerator.gather(torch.tensor(len(rollouts)))\n",
            15,
            17,
        ),
        # the same answer read through a method of a trainer, tested in place
        Example(
            "from accelerate import Accelerator\n\n\nclass PPOTrainer:\n"
            + "    def __init__(self):\n        self.accelerator = Accelerator()\n\n"
            + "    def rollout(self):\n"
            + "        if self.accelerator.is_main_process:\n"
            + "            return self.sample()\n"
            + "        return None\n\n"
            + "    def step(self):\n"
            + "        if self.rollout():\n"
            + "            self.accelerator.wait_for_everyone()\n",
            15,
            13,
        ),
        Example(
            _HF + "if accelerator.distributed_type == DistributedType.DEEPSPEED:\n    pass\n"
            "if accelerator.is_main_process:\n    accelerator.save_state('ckpt')\n",
            6,
            5,
        ),
        # SimpleTuner's rolling checkpoint: the guard lets DeepSpeed's ranks in, not FSDP's
        Example(
            _HF
            + "if config.fsdp_enable:\n    plugin = make_fsdp_plugin(config)\n"
            + "if accelerator.is_main_process or config.use_deepspeed_optimizer:\n"
            + "    accelerator.save_state('rolling')\n",
            6,
            5,
        ),
        # DeepSpeed turned on through the script's own flag: the first checkpoint hangs
        Example(
            _HF
            + "import argparse\nparser = argparse.ArgumentParser()\n"
            + "parser.add_argument('--use_deepspeed', action='store_true')\n"
            + "args = parser.parse_args()\n"
            + "if accelerator.is_main_process:\n    accelerator.save_state('ckpt')\n",
            8,
            5,
        ),
        Example(
            _HF
            + "from accelerate import FullyShardedDataParallelPlugin\n"
            + "plugin = FullyShardedDataParallelPlugin(sharding_strategy=args.sharding)\n"
            + "if accelerator.is_main_process:\n"
            + "    state = accelerator.get_state_dict(model)\n",
            6,
            13,
        ),
        # accelify's get_state_dict of an optimizer gathers its state under every ZeRO stage
        Example(
            HEADER
            + "import torch\nimport argparse\nparser = argparse.ArgumentParser()\n"
            + "parser.add_argument('--use_deepspeed', action='store_true')\n"
            + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            + "model, optimizer = accelerator.prepare(model, optimizer)\n"
            + "if accelerator.is_main_process:\n"
            + "    state = accelerator.get_state_dict(optimizer)\n",
            10,
            13,
        ),
        # evaluation on the main process only, through a model FSDP shards
        Example(
            _HF
            + "import torch\nfrom accelerate import FullyShardedDataParallelPlugin\n"
            + "plugin = FullyShardedDataParallelPlugin()\n"
            + "model, loader = accelerator.prepare(model, loader)\n\n\n"
            + "def evaluate(model, batches):\n    with torch.no_grad():\n"
            + "        return [model(x) for x, y in batches]\n\n\n"
            + "if accelerator.is_main_process:\n    outputs = evaluate(model, loader)\n",
            15,
            15,
        ),
        Example(
            _HF
            + "import torch\nparser.add_argument('--fsdp', action='store_true')\n"
            + "model = accelerator.prepare(model)\n"
            + "if accelerator.is_main_process:\n    with torch.no_grad():\n"
            + "        samples = model.generate(prompt)\n",
            8,
            19,
        ),
        # a DiLoCo/FSDP trainer: the model prepared in __init__, its validation method run on
        # the main process only from another method (lintreal38: a real trainer hung so)
        Example(
            _TRAINER_VALIDATES.format(plugin=_FSDP_PLUGIN, guard="if self.is_main:\n            "),
            26,
            19,
        ),
        # an evaluation helper whose forward (a collective under FSDP only) comes before the
        # gather of its losses (one on every backend), nested in main() as Hugging Face's
        # no_trainer scripts write it, and run once more on the main process for the results
        # file (a GSM8K LoRA fine-tuning): the gather waits for the other ranks
        Example(
            _HF
            + "import torch\n\n\ndef main(model, eval_loader):\n"
            + "    model, eval_loader = accelerator.prepare(model, eval_loader)\n\n"
            + "    def evaluate_loss():\n        losses = []\n"
            + "        for batch in eval_loader:\n"
            + "            with torch.no_grad():\n                outputs = model(**batch)\n"
            + "            losses.append(accelerator.gather(outputs.loss))\n"
            + "        return torch.cat(losses).mean().item()\n\n"
            + "    if accelerator.is_main_process:\n        results = evaluate_loss()\n",
            18,
            19,
        ),
        Example(
            "from accelerate import Accelerator, DeepSpeedPlugin\n"
            "plugin = DeepSpeedPlugin(gradient_accumulation_steps=4, zero_stage=3)\n"
            "accelerator = Accelerator(deepspeed_plugin=plugin)\n"
            "model = accelerator.prepare(model)\n"
            "if accelerator.is_main_process:\n    accelerator.save_model(model, 'out')\n",
            6,
            5,
        ),
        # unwrapped only when a setting says so: without it the forward is DDP's, on one rank
        Example(
            _BUFFERED
            + _EVALUATE
            + _MAIN_ONLY.format(model="model").replace(
                "if accelerator",
                "if args.export:\n    model = accelerator.unwrap_model(model)\nif accelerator",
            ),
            29,
            11,
        ),
        # a trainer's best-checkpoint method, reached through self under the main-process
        # test, gathers the FSDP-sharded weights: the other ranks never join it
        Example(
            _BEST_CHECKPOINT.format(
                imports=", FullyShardedDataParallelPlugin",
                plugin="fsdp_plugin=FullyShardedDataParallelPlugin()",
            ),
            18,
            13,
        ),
        # the method reached by another name: set with setattr, or got by getattr (lintfix24)
        Example(
            _CALLED_BY_ANOTHER_NAME.format(
                alias='        setattr(self, "m", self.sync)\n',
                sync="        self.accelerator.wait_for_everyone()\n",
                call="self.m()",
            ),
            15,
            13,
        ),
        Example(
            _CALLED_BY_ANOTHER_NAME.format(
                alias="",
                sync="        self.accelerator.wait_for_everyone()\n",
                call='getattr(self, "sync")()',
            ),
            14,
            13,
        ),
        # the DeepSpeed config the script spells asks for ZeRO-3: get_state_dict gathers
        Example(_SPELLED_DS_CONFIG.format(stage=3), 12, 13),
        # ... stage 2 spelled, then set from a flag: the stage is the run's, ZeRO-3 perhaps
        # (review11b)
        Example(
            _SPELLED_DS_CONFIG.format(stage=2).replace(
                "plugin =", 'ds_config["zero_optimization"]["stage"] = args.zero_stage\nplugin ='
            ),
            13,
            13,
        ),
    )
    good = (
        # a prepared loader that reads in order meets nobody as its pass starts (ACC403 says
        # what the main process's total misses); and a shuffled one iterated unprepared
        _MAIN_ONLY_PASS.format(
            shuffle="shuffle=False", probe="for x, y in loader:\n        print(x.shape)"
        ),
        _MAIN_ONLY_PASS.format(shuffle="shuffle=False", probe="print(count_all(loader))"),
        _MAIN_ONLY_PASS.format(shuffle="shuffle=False", probe="first = next(iter(loader))"),
        _MAIN_ONLY_PASS.format(
            shuffle="shuffle=False", probe="sizes = [len(x) for x, y in loader]"
        ),
        # ... a shuffled one's iterator made, no batch read: its pass has not started
        _MAIN_ONLY_PASS.format(shuffle="shuffle=True", probe="batches = iter(loader)"),
        # ... a kept iterator's batch drawn on every rank, the main process printing it; or
        # its pass started by every rank before the main process draws more; or in order
        _KEPT_ITERATOR.format(shuffle="shuffle=True", draw=_EVERY_RANK_DRAWS),
        _KEPT_ITERATOR.format(
            shuffle="shuffle=True", draw="    first = next(batches)\n" + _MAIN_DRAWS
        ),
        _KEPT_ITERATOR.format(shuffle="shuffle=False", draw=_MAIN_DRAWS),
        _KEPT_ITERATOR.format(
            shuffle="shuffle=True",
            draw="    for batch in batches:\n"
            "        if accelerator.is_main_process:\n            print(batch)\n",
        ),
        _TRAINER_ITERATOR.format(
            draw="        batch = next(self._batches)\n"
            "        if self.accelerator.is_main_process:\n"
            "            print(batch)\n"
        ),
        _MAIN_ONLY_PASS.format(
            shuffle="shuffle=True", probe="for x, y in loader:\n        print(x.shape)"
        ).replace("model, optimizer, loader =", "model, optimizer, train_dl ="),
        # ... stage 2: every rank holds the whole weights, no gather (lintfix24)
        _SPELLED_DS_CONFIG.format(stage=2),
        # ... and set to another literal stage under 3 later, or another setting changed:
        # still no gather
        _SPELLED_DS_CONFIG.format(stage=2).replace(
            "plugin =", 'ds_config["zero_optimization"]["stage"] = 1\nplugin ='
        ),
        _SPELLED_DS_CONFIG.format(stage=2).replace(
            "plugin =", 'ds_config["train_micro_batch_size_per_gpu"] = args.batch_size\nplugin ='
        ),
        # ... a method that waits for nobody, by either name
        _CALLED_BY_ANOTHER_NAME.format(
            alias='        setattr(self, "m", self.sync)\n',
            sync="        print('synced')\n",
            call="self.m()",
        ),
        _CALLED_BY_ANOTHER_NAME.format(
            alias="", sync="        print('synced')\n", call='getattr(self, "sync")()'
        ),
        # the override sums this rank's batches and combines nothing: no collective
        _SUBCLASS_EVALUATES.format(evaluate="        return total.item()\n"),
        # a flag setattr sets to a setting, the same on every rank
        _FLAG_SET_BY_SETATTR.format(flag='        setattr(self, "is_main", args.sync_at_end)\n'),
        # the same trainer where the script names no sharding engine: under DDP every rank
        # holds the whole model, and get_state_dict is no collective
        _BEST_CHECKPOINT.format(imports="", plugin=""),
        # unwrapped and moved to the CPU after training: the bare module's forward
        _BUFFERED
        + _EVALUATE
        + _MAIN_ONLY.format(model="model").replace(
            "if accelerator", "model = accelerator.unwrap_model(model).to('cpu')\nif accelerator"
        ),
        # a base class holding a frozen parameter, no buffer: the forward broadcasts nothing
        _BASE_BUFFERED.format(
            register="self.mean = torch.nn.Parameter(torch.zeros(4), requires_grad=False)"
        )
        + _EVALUATE
        + _MAIN_ONLY.format(model="model"),
        # the unwrapped model's forward is this rank's own
        _BUFFERED + _EVALUATE + _MAIN_ONLY.format(model="accelerator.unwrap_model(model)"),
        _CLIP_MAIN_ONLY.format(model="accelerator.unwrap_model(model)"),
        # unwrapped once after training (or DDP's ``.module``): every later forward is the
        # bare module's, directly and through the helper
        _BUFFERED
        + _EVALUATE
        + _MAIN_ONLY.format(model="model").replace(
            "if accelerator", "model = accelerator.unwrap_model(model)\nif accelerator"
        )
        + "    print(model(torch.zeros(2, 4)))\n",
        _BUFFERED
        + _EVALUATE
        + _MAIN_ONLY.format(model="model").replace(
            "if accelerator", "model = model.module\nif accelerator"
        ),
        # ... under a test every wrapped model passes: DDP always takes the branch
        _BUFFERED
        + _EVALUATE
        + _MAIN_ONLY.format(model="model").replace(
            "if accelerator",
            "if hasattr(model, 'module'):\n    model = model.module\nif accelerator",
            1,
        ),
        # the same trainer under DDP (no sharding engine named, no buffers): the main process
        # alone may run the forward; and under FSDP with every rank validating
        _TRAINER_VALIDATES.format(plugin="", guard="if self.is_main:\n            "),
        _TRAINER_VALIDATES.format(plugin=_FSDP_PLUGIN, guard=""),
        # ... and where a method binds self.model anew (unwrapped), in any spelling: which
        # model a later method runs depends on the order of the calls, not reported
        *(
            _validated_beside_a_finish(rebinding)
            for rebinding in (
                "self.model = self.accelerator.unwrap_model(self.model)",
                "self.model, self.optimizer = self.accelerator.unwrap_model(self.model), None",
                "self.model: torch.nn.Module = self.accelerator.unwrap_model(self.model)",
            )
        ),
        # no buffers: DDP's forward broadcasts nothing
        _BUFFERED.replace("torch.nn.BatchNorm1d(8)", "torch.nn.Dropout(0.1)")
        + _EVALUATE
        + _MAIN_ONLY.format(model="model"),
        # buffers not broadcast
        _BUFFERED.replace(
            "Accelerator()",
            "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])",
        )
        + _EVALUATE
        + _MAIN_ONLY.format(model="model"),
        # a LoRA adapter's rank and a retrieval metric's are no process ranks: every rank runs it
        HEADER
        + "if lora_rank == 0 or reciprocal_rank == 0:\n    accelerator.wait_for_everyone()\n",
        HEADER + "if torch.linalg.matrix_rank(w) == 0:\n    accelerator.wait_for_everyone()\n",
        # launched or not is the same on every rank: no rank test, though it names RANK
        HEADER + "import os\nif 'RANK' in os.environ:\n    accelerator.wait_for_everyone()\n",
        # the same on DDP: no collective there (the RNG states it misses are opt-in ACC206's)
        '"""Run: accelerate launch --config_file configs/multi_gpu.yaml train.py"""\n'
        + "from accelerate import Accelerator\naccelerator = Accelerator()\n"
        + "if accelerator.is_main_process:\n    accelerator.save_state('ckpt')\n",
        # main_process_first written out by hand: each rank waits once, in one of the two ifs
        _HF
        + "if not accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n"
        + "dataset = build_cache(args)\n"
        + "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n"
        + "if accelerator.process_index != 0:\n    torch.distributed.barrier()\n"
        + "tokenized = tokenize(dataset)\n"
        + "if accelerator.process_index == 0:\n    torch.distributed.barrier()\n",
        # the same idiom with the test kept by a walrus: the name below is that test
        _HF
        + "if not (is_main := accelerator.is_main_process):\n    accelerator.wait_for_everyone()\n"
        + "dataset = build_cache(args)\n"
        + "if is_main:\n    accelerator.wait_for_everyone()\n",
        # open-instruct's weight sync to vLLM: rank 0 broadcasts in a group of itself and the
        # engines; the other training ranks are no members of it
        "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "model = accelerator.prepare(model)\n"
        "for name, param in model.named_parameters():\n"
        "    if torch.distributed.get_rank() == 0:\n"
        "        torch.distributed.broadcast(param.data, 0, group=model_update_group)\n"
        "        torch.distributed.barrier(vllm_group)\n",
        # MiniMind's DPO script pins ZeRO-2 on its plugin: the weights are whole on every rank,
        # so save_model gathers nothing and the main process may save alone
        "from accelerate import Accelerator, DeepSpeedPlugin\n"
        "plugin = DeepSpeedPlugin(gradient_accumulation_steps=4, zero_stage=2)\n"
        "accelerator = Accelerator(deepspeed_plugin=plugin)\n"
        "model = accelerator.prepare(model)\n"
        "if accelerator.is_main_process:\n    accelerator.save_model(model, 'out')\n",
        # an EMA copy the script never prepares (a DDPM trainer's EMAModel): DeepSpeed never
        # sharded it, so save_model gathers nothing from the other ranks
        "from accelerate import Accelerator, DeepSpeedPlugin\n"
        "from diffusers.training_utils import EMAModel\n"
        "accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))\n"
        "ema_model = EMAModel(model.parameters(), model_cls=UNet2DModel)\n"
        "model = accelerator.prepare(model)\n"
        "if accelerator.is_main_process:\n    accelerator.save_model(ema_model, 'ema')\n",
        # instructlab: LoRA under FSDP is saved elsewhere; this branch never runs under FSDP
        _HF
        + "is_fsdp_lora = is_lora and accelerator.distributed_type == DistributedType.FSDP\n"
        + "if not is_fsdp_lora and accelerator.is_main_process:\n"
        + "    if is_lora:\n"
        + "        accelerator.save_model(model, 'out')\n",
        # axolotl's GRPO trainer: rank0_only is a mode every rank shares, not a rank test
        _HF
        + "from accelerate.utils import gather_object\n\n\n"
        + "def generate(inputs, rank0_only=False):\n"
        + "    if rank0_only:\n        return generate_on_main(inputs)\n"
        + "    return gather_object(inputs)\n\n\n"
        + "generate(batch)\n",
        HEADER + "accelerator.wait_for_everyone()\nif accelerator.is_main_process:\n    print(1)\n",
        # instructlab: the main process saves only on the engines the first branch leaves out
        _HF
        + "is_fsdp = accelerator.distributed_type == DistributedType.FSDP\n"
        + "if is_fsdp:\n    save_sharded(accelerator, model)\n"
        + "elif accelerator.is_main_process:\n"
        + "    accelerator.save_model(model, 'out')\n",
        # SimpleTuner: the guard lets every rank in on the engines the script's flags turn on
        _HF
        + "if config.fsdp_enable:\n    plugin = make_fsdp_plugin(config)\n"
        + "if accelerator.is_main_process or config.use_deepspeed or config.fsdp_enable:\n"
        + "    accelerator.save_state('ckpt')\n",
        # FSDP named only to refuse it: get_state_dict gathers nothing on the backends left
        _HF
        + "assert accelerator.distributed_type != DistributedType.FSDP, 'not supported'\n"
        + "model = accelerator.prepare(model)\nif accelerator.is_main_process:\n"
        + "    state = accelerator.get_state_dict(model)\n",
        # a model loaded for evaluation on the main process, not the prepared one
        _HF
        + "import torch\nfrom accelerate import FullyShardedDataParallelPlugin\n\n\n"
        + "def train():\n    model = accelerator.prepare(Net())\n\n\n"
        + "def export():\n    model = Net.from_pretrained('out')\n"
        + "    if accelerator.is_main_process:\n        print(model(sample))\n",
        # the helper's parameter shadows the prepared model: a teacher never prepared
        _HF
        + "import torch\nfrom accelerate import FullyShardedDataParallelPlugin\n"
        + "model = accelerator.prepare(model)\n\n\n"
        + "def score(model, x):\n    return model(x)\n\n\n"
        + "if accelerator.is_main_process:\n    print(score(teacher, sample))\n",
        # the same evaluation on DDP: every rank holds the whole model
        _HF
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
        + "if accelerator.is_main_process:\n    with torch.no_grad():\n"
        + "        outputs = [model(x) for x, y in loader]\n",
        # ... where FSDP is a word of a comment or a docstring only: prose, no FSDP run
        # (lintreal43: reported as an FSDP hang)
        _HF
        + "import torch\n# TODO: try FSDP later\nmodel = accelerator.prepare(model)\n"
        + "if accelerator.is_main_process:\n    with torch.no_grad():\n"
        + "        out = model(sample)\n",
        _HF
        + "import torch\nmodel = accelerator.prepare(model)\n\n\n"
        + 'def evaluate():\n    """Not sharded: no FullyShardedDataParallel or fsdp_plugin."""\n'
        + "    with torch.no_grad():\n        return model(sample)\n\n\n"
        + "if accelerator.is_main_process:\n    out = evaluate()\n",
        # ... and DeepSpeed named in a comment: get_state_dict gathers nothing on DDP
        _HF
        + "model = accelerator.prepare(model)  # DeepSpeed: see ds_config in the README\n"
        + "if accelerator.is_main_process:\n"
        + "    state = accelerator.get_state_dict(model)\n",
        _HF
        + "if accelerator.is_main_process or "
        + "accelerator.distributed_type == DistributedType.DEEPSPEED:\n"
        + "    accelerator.save_state('ckpt')\n",
        _HF
        + "save_everywhere = accelerator.state.deepspeed_plugin is not None\n"
        + "if accelerator.is_main_process or save_everywhere:\n"
        + "    accelerator.save_state('ckpt')\n",
        _HF
        + 'is_fsdp = getattr(accelerator.state, "fsdp_plugin", None) is not None\n'
        + "if accelerator.is_main_process or is_fsdp:\n"
        + "    accelerator.save_state('ckpt')\n",
        _HF + "if accelerator.is_main_process:\n    sd = accelerator.get_state_dict(model)\n",
        # HF's get_state_dict of an optimizer gathers nothing (it fails on every rank alike)
        _HF
        + "import torch\nimport argparse\nparser = argparse.ArgumentParser()\n"
        + "parser.add_argument('--use_deepspeed', action='store_true')\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "if accelerator.is_main_process:\n"
        + "    state = accelerator.get_state_dict(optimizer)\n",
        # the rollout logs on the main process but answers alike on every rank
        HEADER
        + "import torch\n\n\n"
        + "def collect_rollouts(policy, n):\n"
        + "    rollouts = [policy(torch.randn(4)) for _ in range(n)]\n"
        + "    if accelerator.is_main_process:\n        print(len(rollouts))\n"
        + "        return rollouts\n"
        + "    return rollouts\n\n\n"
        + "rollouts = collect_rollouts(model, 8)\n"
        + "if rollouts is not None:\n"
        + "    stats = accelerator.gather(torch.tensor(len(rollouts)))\n",
        # a helper run on the main process by its decorator answers None everywhere
        HEADER
        + "@accelerator.on_main_process\ndef report(stats):\n    print(stats)\n\n\n"
        + "if report(1) is None:\n    accelerator.wait_for_everyone()\n",
        HEADER
        + "def finish():\n    if accelerator.is_main_process:\n        print('done')\n\n\n"
        + "if accelerator.is_main_process:\n    finish()\n",
        HEADER
        + "if accelerator.is_main_process:\n    download()\n    accelerator.wait_for_everyone()\n"
        + "else:\n    accelerator.wait_for_everyone()\n",
        # flow_factory's pivot-advantage rollout: a consistency check on this rank's own
        # samples raises (the launcher then stops every rank), it lets no rank skip the reduce
        HEADER
        + "def rollout(prompts):\n"
        + "    mine = prompts[accelerator.process_index :: accelerator.num_processes]\n"
        + "    if len(mine) != expected:\n        raise RuntimeError('wrong count')\n"
        + "    return accelerator.reduce(torch.tensor(len(mine)), reduction='sum')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        in_view = backends_in_view(script)
        for use in facts_of(script).collective_uses:
            hang_on = use.skipped_on & in_view
            if not hang_on:
                continue
            name = _called(use.collective)
            forward = facts_of(script).flow.forward_of_prepared(use.collective)
            where = f"under {named(hang_on)}" if hang_on != in_view else ""
            if forward and FSDP not in hang_on and forward_syncs_buffers(script, use.collective):
                text = _unwrap_advice(script, use)
            elif use.through_helper and forward:
                text = (
                    f"Call {_called(use.call)}() on every rank: it runs {name}() (line "
                    f"{script.line(use.collective)}), the forward of a model sharded under FSDP, "
                    "which waits for the other ranks' parameters (hang)"
                )
            elif use.through_helper:
                helper = _called(use.call)
                line = script.line(use.collective)
                text = (
                    f"Call {helper}() on every rank: it reaches {name}() (line {line}), a "
                    f"collective{' ' + where if where else ''}, and the other ranks never do (hang)"
                )
            elif forward:
                text = (
                    f"Run {name}() on every rank (gather the results for the main process): the "
                    "model is sharded under FSDP, and its forward waits for the "
                    "other ranks' parameters (hang)"
                )
            else:
                text = (
                    f"Call {name}() on every rank: it is a collective{' ' + where if where else ''}"
                    ", and the other ranks never reach it (hang)"
                )
            yield self.finding(script, use.call, message=text + _guard_note(script, use.call))
        for loader_pass in facts_of(script).loader_passes:
            yield self.finding(script, loader_pass.node, message=_pass_advice(script, loader_pass))


def _pass_advice(script: ScriptModel, loader_pass: LoaderPass) -> str:
    """A pass over a prepared DataLoader made on some ranks: every rank makes it (the main
    process's share gathered), or these ranks iterate the DataLoader from before prepare."""
    loader = loader_pass.loader
    instead = "hand it" if loader_pass.handed else "have it iterate"
    if loader_pass.node is not loader_pass.loop:  # the call of a helper that makes the pass
        assert isinstance(loader_pass.node, cst.Call)
        text = (
            f"Call {_called(loader_pass.node)}() on every rank (gather what the main process "
            f"needs with accelerator.gather_for_metrics), or {instead} the DataLoader from "
            f"before prepare: it iterates the prepared {loader} (line "
            f"{script.line(loader_pass.loop)}); "
            f"{loader_pass.why}, a collective the other ranks never join (hang)"
        )
    elif (made := iterator_made(script, loader_pass.loop)) is not None:
        iterator = script.module.code_for_node(made)
        text = (
            f"Draw this first batch of {iterator} (line {script.line(made)}) on every rank "
            "(gather what the main process needs with accelerator.gather_for_metrics), or make "
            f"the iterator from the DataLoader from before prepare: {loader} is prepared, its "
            f"pass starts at the first next(); {loader_pass.why}, a collective the other ranks "
            "never join (hang)"
        )
    else:
        text = (
            f"Iterate {loader} on every rank (gather what the main process needs with "
            "accelerator.gather_for_metrics), or iterate the DataLoader from before prepare "
            f"here: {loader} is prepared; {loader_pass.why}, a collective the other ranks never "
            "join (hang)"
        )
    node = loader_pass.node
    return in_file_words(text, accelerator_name(script, node)) + _guard_note(script, node)


def _unwrap_advice(script: ScriptModel, use: CollectiveUse) -> str:
    """A DDP model with buffers run on some ranks: its forward broadcasts them (a collective);
    the unwrapped module's forward is this rank's own."""
    called = _called(use.collective)
    model = facts_of(script).flow.outer_name(called, use.collective) or called
    reason = (
        f"{model} holds buffers (a BatchNorm's running statistics, a transformer's position "
        "ids), and DDP's forward broadcasts them from rank 0, a collective the other ranks "
        "never reach (hang); the unwrapped model's forward is this rank's own"
    )
    if use.through_helper:
        text = (
            f"Run {called}() (line {script.line(use.collective)}) through "
            f"accelerator.unwrap_model({model}) for this call of {_called(use.call)}() on some "
            f"ranks, or call it on every rank: {reason}"
        )
    else:
        text = (
            f"Run this forward through accelerator.unwrap_model({model}), or run it on every "
            f"rank: {reason}"
        )
    return in_file_words(text, accelerator_name(script, use.call))


def _guard_note(script: ScriptModel, call: cst.CSTNode) -> str:
    """Where the other ranks part from ``call`` when the guard is not an ``if`` around it:
    an early ``return`` above it on some ranks (a PPO trainer's ``if not
    accelerator.is_main_process: return 0``), or a test that names no rank but reads what a
    function of the file answers differently by rank."""
    guard = script.rank_guard_of(call)
    if not isinstance(guard, cst.If):
        return ""
    if not script.inside(call, guard):
        return (
            f"; the other ranks return at line {script.line(guard)}, above it: make the "
            "collective before that return, or let every rank go on to it"
        )
    answer = script.rank_answer_read(guard.test)
    found = script.call_graph.callee(answer) if answer is not None else None
    if answer is None or found is None:
        return ""
    returns = [
        node
        for node in script.index.own_nodes(found[0])
        if isinstance(node, cst.Return) and script.rank_guard_of(node) is not None
    ]
    where = f", line {script.line(returns[0])}" if returns else ""
    return (
        f"; the test at line {script.line(guard)} reads what {_called(answer)}() returns, "
        f"which differs between ranks (it answers under a rank test{where}): make the "
        "collective outside that test, or have every rank return the same value"
    )


def _called(call: cst.Call) -> str:
    """The called name: ``self.sync`` also for ``getattr(self, "sync")(...)``."""
    func = call.func
    if (
        isinstance(func, cst.Call)
        and dotted(func.func) == "getattr"
        and len(func.args) >= 2
        and isinstance(func.args[1].value, cst.SimpleString)
        and dotted(func.args[0].value) is not None
    ):
        return f"{dotted(func.args[0].value)}.{func.args[1].value.evaluated_value}"
    return dotted(func) or "this"
