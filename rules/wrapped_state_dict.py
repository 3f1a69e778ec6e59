from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.collectives import DDP, backends_in_view
from accelify.analysis.construction import (
    constructed_accelerator,
    holds_constructed_wrapper,
    prepared_in_construction,
)
from accelify.analysis.device_moves import is_save_call
from accelify.analysis.facts import facts_of
from accelify.analysis.objects import bound_arguments
from accelify.analysis.saved_values import saved_values, saved_whole_objects
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import assigned_targets, children_of, dotted, has_parameter, walk
from accelify.analysis.wrapper_tests import in_unwrapped_branch
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_argument,
    accelerator_at,
    calls,
    in_file_words,
    prepared,
)

_PREPARED = HEADER + "import torch\nmodel = accelerator.prepare(torch.nn.Linear(2, 2))\n"
_TRAINER = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n"
    "    def write(self, state, path):\n"
    "        torch.save({{'state': state, 'step': 1}}, path)\n\n"
    "    def save(self):\n"
    "        sd = {state}\n"
    "        self.write(sd, 'm.pt')\n"
)
#: a torch.compile'd model's checkpoint: every key behind ``_orig_mod.``
_ORIG_MOD_CHECKPOINT = (
    "torch.save({'_orig_mod.weight': torch.zeros(2, 2), '_orig_mod.bias': torch.zeros(2)}, "
    "'m.pt')\n"
)
#: A trainer that prepares ``self.model`` in ``__init__``, and whose training method binds it
#: again to itself moved (``.to()`` hands the same wrapper back).
_MOVING_TRAINER = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n"
    "    def train(self, x):\n"
    "        self.model = {moved}\n"
    "        self.accelerator.backward(self.model(x).sum())\n\n"
    "    def resume(self, path):\n"
    "        {model}.load_state_dict(torch.load(path))\n"
)
#: A trainer that prepares its model while constructed, driven from ``main``.
_DRIVEN_TRAINER = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n    def __init__(self, model):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model = self.accelerator.prepare(model)\n\n"
    "    def train(self, x):\n"
    "        self.accelerator.backward(self.model(x).sum())\n\n\n"
    "def resume(trainer, path):\n    {model}.load_state_dict(torch.load(path))\n\n\n"
    "def main():\n    trainer = Trainer(torch.nn.Linear(2, 2))\n    resume(trainer, 'm.pt')\n"
)
#: The same, its checkpoint loaded the right way (the save side is left to each example).
_LOADED = _DRIVEN_TRAINER.format(model="trainer.accelerator.unwrap_model(trainer.model)")
_SAVES_GLOBAL = "def save():\n    torch.save(model.state_dict(), 'm.pt')\n"
#: A trainer handed what ``main`` prepared: ``self.model`` is the wrapper, as ``model`` is.
_HANDED_TRAINER = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n    def __init__(self, accelerator, model):\n"
    "        self.accelerator = accelerator\n        self.model = model\n\n"
    "    def save(self):\n        self.accelerator.save({state}, 't.pt')\n\n\n"
    "def main():\n    accelerator = Accelerator()\n    model = torch.nn.Linear(4, 2)\n"
    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    model, opt = accelerator.prepare(model, opt)\n"
    "{between}    Trainer(accelerator, model).save()\n"
)

#: A saving helper handed the prepared model by its one call, under the main-process test.
_SAVED_BY_A_HELPER = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "def save(model, path):\n    torch.save(model.state_dict(), path)\n\n\n"
    "def main(model, optimizer, loader):\n"
    "    accelerator = Accelerator()\n"
    "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "    for x in loader:\n"
    "        accelerator.backward(model(x).mean())\n"
    "        optimizer.step()\n"
    "    if accelerator.is_main_process:\n"
    '        save(model, "m.pt")\n'
)

#: A runner's local bound to its prepared attribute, saved on the main process (review11b).
_ALIASED = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Runner:\n"
    "    def __init__(self, net, optimizer, loader):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.net, self.optimizer, self.loader = self.accelerator.prepare(\n"
    "            net, optimizer, loader\n"
    "        )\n"
    "\n"
    "    def save(self, path):\n"
    "        sample_net = {bound}\n"
    "        if self.accelerator.is_main_process:\n"
    "            torch.save({saved}.state_dict(), path)\n"
)


#: xnguyen's AcceleratorTrainer: a resume helper loads each checkpoint entry into the object
#: handed by that keyword, with strict=True; the model is handed as prepare returned it.
_RESTART = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "def restart_from_checkpoint(path, **kwargs):\n"
    "    checkpoint = torch.load(path, map_location='cpu')\n"
    "    for key, value in kwargs.items():\n"
    "        if key in checkpoint and value is not None:\n"
    "            value.load_state_dict(checkpoint[key], strict=True)\n\n\n"
    "accelerator = Accelerator()\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "restart_from_checkpoint('last.pth', model={model}, optimizer=optimizer)\n"
    "for x, y in loader:\n"
    "    accelerator.backward(model(x).sum())\n"
    "    optimizer.step()\n"
)
#: The same load through a dict of the objects made where it is loaded.
_RESTART_FROM_A_DICT = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "def main(model, optimizer, loader):\n"
    "    accelerator = Accelerator()\n"
    "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "    checkpoint = torch.load('last.pth', map_location='cpu')\n"
    "    held = {{'model': {model}, 'optimizer': optimizer}}\n"
    "    for key, value in held.items():\n"
    "        value.load_state_dict(checkpoint[key])\n"
)


class WrappedStateDict(Rule):
    """The state dict of a prepared model is the wrapper's: under DDP every key starts with
    ``module.``, so the file does not load into the plain model later.

    The fix is convert's: ``accelerator.get_state_dict(model)`` (the whole unwrapped model, also
    under FSDP and ZeRO-3) where the state dict is built in an ``accelerator.save(...)`` every
    rank reaches (it is a collective under those engines); elsewhere (under a rank test, in a
    ``torch.save`` every rank runs, through a name or a helper)
    ``accelerator.unwrap_model(model).state_dict()``, and the message says where to write
    ``get_state_dict`` for FSDP and ZeRO-3.

    The reverse too: a checkpoint of the plain model loaded into what prepare returned
    (missing ``module.`` keys on several processes), also through a resume helper's loop over
    its ``**kwargs`` or a dict of the objects (``for key, value in kwargs.items():
    value.load_state_dict(checkpoint[key], strict=True)``, xnguyen's trainer): reported where
    the prepared model is handed in, the place to unwrap it."""

    code = "ACC503"
    name = "wrapped-state-dict"
    message = (
        "Save accelerator.unwrap_model(model).state_dict() (or accelerator.get_state_dict(model))"
    )
    why = "DDP prefixes every key with `module.`; FSDP and DeepSpeed hold only a shard."
    bad = (
        # a helper's parameter that its every call fills with the prepared model (review11b)
        Example(_SAVED_BY_A_HELPER, 6, 16),
        # a local bound to the prepared attribute alone (review11b)
        Example(
            _ALIASED.format(bound="self.net", saved="sample_net"),
            15,
            24,
            _ALIASED.format(bound="self.net", saved="self.accelerator.unwrap_model(sample_net)"),
        ),
        Example(  # a ClipCap fine-tuning: the checkpoint's keys renamed, loaded after prepare
            _PREPARED + _ORIG_MOD_CHECKPOINT + "weights = torch.load('m.pt', map_location='cpu')\n"
            "weights = {k.split('_orig_mod.')[1]: v for k, v in weights.items()}\n"
            "model.load_state_dict(weights)\n",
            8,
            1,
            _PREPARED + _ORIG_MOD_CHECKPOINT + "weights = torch.load('m.pt', map_location='cpu')\n"
            "weights = {k.split('_orig_mod.')[1]: v for k, v in weights.items()}\n"
            "accelerator.unwrap_model(model).load_state_dict(weights)\n",
        ),
        Example(  # the state dict kept in a checkpoint dict first, then saved by name
            _PREPARED + "ckpt = {'model': model.state_dict(), 'epoch': 3}\n"
            "accelerator.save(ckpt, 'm.pt')\n",
            5,
            18,
            _PREPARED
            + "ckpt = {'model': accelerator.unwrap_model(model).state_dict(), 'epoch': 3}\n"
            "accelerator.save(ckpt, 'm.pt')\n",
        ),
        Example(  # qiuqiangkong/audio_understanding: an empty dict filled by key, then saved
            _PREPARED + "ckpt = {}\nif model.training:\n    ckpt['model'] = model.state_dict()\n"
            "torch.save(ckpt, 'm.pt')\n",
            7,
            21,
            _PREPARED + "ckpt = {}\nif model.training:\n"
            "    ckpt['model'] = accelerator.unwrap_model(model).state_dict()\n"
            "torch.save(ckpt, 'm.pt')\n",
        ),
        # every rank reaches the save: convert's get_state_dict (the whole model on any engine)
        Example(
            _PREPARED + "accelerator.save(model.state_dict(), 'm.pt')\n",
            5,
            18,
            _PREPARED + "accelerator.save(accelerator.get_state_dict(model), 'm.pt')\n",
        ),
        # under the main-process test get_state_dict would hang FSDP's other ranks: unwrapped
        Example(
            _PREPARED
            + "if accelerator.is_main_process:\n"
            + "    accelerator.save(model.state_dict(), 'm.pt')\n",
            6,
            22,
            _PREPARED
            + "if accelerator.is_main_process:\n"
            + "    accelerator.save(accelerator.unwrap_model(model).state_dict(), 'm.pt')\n",
        ),
        # the same function called once before the unwrapping as well: that save is wrapped
        Example(
            _PREPARED + _SAVES_GLOBAL + "save()\nmodel = accelerator.unwrap_model(model)\nsave()\n",
            6,
            16,
            _PREPARED
            + _SAVES_GLOBAL.replace(
                "model.state_dict()", "accelerator.unwrap_model(model).state_dict()"
            )
            + "save()\nmodel = accelerator.unwrap_model(model)\nsave()\n",
        ),
        # the state dict handed to a method that saves what it receives (a DPO trainer's
        # ``save`` calls ``write_state_dict(step, policy_state_dict, ...)``)
        Example(
            _TRAINER.format(state="self.model.state_dict()"),
            14,
            14,
            _TRAINER.format(state="self.accelerator.unwrap_model(self.model).state_dict()"),
        ),
        # a diffusion trainer's checkpoint dict handed to a save helper of another module (the
        # project's ``utils.save_checkpoint``; here one that runs where the fix is executed)
        Example(
            _PREPARED
            + "from torch import save as save_checkpoint\n"
            + "save_checkpoint({'model': model.state_dict(), 'loss': 0.1}, 'run.pt')\n",
            6,
            27,
            _PREPARED
            + "from torch import save as save_checkpoint\n"
            + "save_checkpoint({'model': accelerator.unwrap_model(model).state_dict(), "
            + "'loss': 0.1}, 'run.pt')\n",
        ),
        # the same, through the project's own module (its fix is the same unwrap)
        Example(
            _PREPARED
            + "from utils import save_checkpoint\n"
            + "save_checkpoint({'model': model.state_dict(), 'loss': 0.1}, 'run', 'out')\n",
            6,
            27,
        ),
        # mixup-cifar10's checkpoint: the model kept whole in the dict it saves
        Example(
            _PREPARED + "state = {'net': model, 'acc': 0.5}\naccelerator.save(state, 'ckpt.pt')\n",
            5,
            17,
            _PREPARED + "state = {'net': accelerator.unwrap_model(model), 'acc': 0.5}\n"
            "accelerator.save(state, 'ckpt.pt')\n",
        ),
        # pytorch/text's text classification example pickles the model moved to the CPU
        Example(
            _PREPARED + "accelerator.save(model.to('cpu'), 'model.pt')\n",
            5,
            18,
            _PREPARED + "accelerator.save(accelerator.unwrap_model(model).to('cpu'), 'model.pt')\n",
        ),
        # a trainer method loads into self.model, which another method binds again to
        # ``self.model.to(device)``: the same prepared wrapper, still expecting ``module.``
        Example(
            _MOVING_TRAINER.format(
                moved="self.model.to(self.accelerator.device).train()", model="self.model"
            ),
            15,
            9,
            _MOVING_TRAINER.format(
                moved="self.model.to(self.accelerator.device).train()",
                model="self.accelerator.unwrap_model(self.model)",
            ),
        ),
        # the trainer's model loaded from outside the class, by a helper handed the trainer
        Example(
            _DRIVEN_TRAINER.format(model="trainer.model"),
            15,
            5,
            _DRIVEN_TRAINER.format(model="trainer.accelerator.unwrap_model(trainer.model)"),
        ),
        # the save side from outside the class: main saves the trainer's model, whole or its
        # state dict (its keys start with 'module.' on several processes)
        Example(
            _LOADED + "    torch.save(trainer.model.state_dict(), 'm.pt')\n",
            21,
            16,
            _LOADED
            + "    torch.save(trainer.accelerator.unwrap_model(trainer.model).state_dict(), "
            "'m.pt')\n",
        ),
        Example(
            _LOADED + "    model = trainer.model\n"
            "    torch.save({'model': model, 'epoch': 1}, 'm.pt')\n",
            22,
            26,
            _LOADED + "    model = trainer.model\n"
            "    torch.save({'model': trainer.accelerator.unwrap_model(model), 'epoch': 1}, "
            "'m.pt')\n",
        ),
        # a runner's self.trainer, the runner made by another module of the project (nothing in
        # this file names it)
        Example(
            _LOADED + "\n\nclass Runner:\n    def __init__(self):\n"
            "        self.trainer = Trainer(torch.nn.Linear(2, 2))\n\n"
            "    def save(self, path):\n"
            "        torch.save(self.trainer.model.state_dict(), path)\n",
            28,
            20,
            _LOADED + "\n\nclass Runner:\n    def __init__(self):\n"
            "        self.trainer = Trainer(torch.nn.Linear(2, 2))\n\n"
            "    def save(self, path):\n"
            "        torch.save(self.trainer.accelerator.unwrap_model(self.trainer.model)"
            ".state_dict(), path)\n",
        ),
        # the state dict kept in a local, the local in the checkpoint dict
        Example(
            _PREPARED + "sd = model.state_dict()\ntorch.save({'model': sd, 'epoch': 1}, 'm.pt')\n",
            5,
            6,
            _PREPARED + "sd = accelerator.unwrap_model(model).state_dict()\n"
            "torch.save({'model': sd, 'epoch': 1}, 'm.pt')\n",
        ),
        # the same from outside the trainer's class
        Example(
            _LOADED + "    sd = trainer.model.state_dict()\n"
            "    torch.save({'model': sd, 'step': 1}, 'm.pt')\n",
            21,
            10,
            _LOADED + "    sd = trainer.accelerator.unwrap_model(trainer.model).state_dict()\n"
            "    torch.save({'model': sd, 'step': 1}, 'm.pt')\n",
        ),
        # a trainer handed the prepared model (a fresh user's Trainer(accelerator, model, ...)
        # saving self.model's state dict): the attribute is the wrapper the local is
        Example(
            _HANDED_TRAINER.format(state="self.model.state_dict()", between=""),
            11,
            31,
            _HANDED_TRAINER.format(
                state="self.accelerator.unwrap_model(self.model).state_dict()", between=""
            ),
        ),
        # the same trainer resuming: the plain checkpoint's keys into the wrapper
        Example(
            _HANDED_TRAINER.replace(
                "self.accelerator.save({state}, 't.pt')",
                "self.model.load_state_dict(torch.load('t.pt'))",
            ).format(between=""),
            11,
            9,
            _HANDED_TRAINER.replace(
                "self.accelerator.save({state}, 't.pt')",
                "self.accelerator.unwrap_model(self.model).load_state_dict(torch.load('t.pt'))",
            ).format(between=""),
        ),
        # a resume helper's loop over **kwargs loads into the prepared model (xnguyen)
        Example(_RESTART.format(model="model"), 14, 43),
        # ... over a dict of the objects
        Example(_RESTART_FROM_A_DICT.format(model="model"), 9, 22),
    )
    good = (
        # the model handed unwrapped
        _RESTART.format(model="accelerator.unwrap_model(model)"),
        _RESTART_FROM_A_DICT.format(model="accelerator.unwrap_model(model)"),
        # the call hands the helper the unwrapped model; a helper also called with a model of
        # its own (not the wrapper)
        _SAVED_BY_A_HELPER.replace(
            'save(model, "m.pt")', 'save(accelerator.unwrap_model(model), "m.pt")'
        ),
        _SAVED_BY_A_HELPER + "\n\ndef export(path):\n    save(torch.nn.Linear(2, 2), path)\n",
        # the local is the unwrapped model
        _ALIASED.format(bound="self.accelerator.unwrap_model(self.net)", saved="sample_net"),
        # lintreal41 (a Schrödinger-bridge runner): ``sample_net`` prepared in one method is
        # that method's local; another method's ``sample_net``, an EMA copy the helper builds
        # unwrapped, is its own object (its save under the same test was reported)
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "class Runner:\n"
        + "    def __init__(self, net, ema, optimizer, loader):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.net, self.optimizer, self.loader = self.accelerator.prepare(\n"
        + "            net, optimizer, loader\n"
        + "        )\n"
        + "        self.ema = ema\n\n"
        + "    def cache(self):\n"
        + "        sample_net = self.ema.copy()\n"
        + "        sample_net = self.accelerator.prepare(sample_net)\n"
        + "        return [sample_net(x) for x in self.loader]\n\n"
        + "    def save(self, path):\n"
        + "        if self.accelerator.is_main_process:\n"
        + "            if self.ema is not None:\n"
        + "                sample_net = self.ema.copy_of(self.net)\n"
        + "            else:\n"
        + "                sample_net = self.accelerator.unwrap_model(self.net)\n"
        + "            torch.save(sample_net.state_dict(), path)\n",
        # the wrapper tested for: its module's state dict under DDP, the model's own on one
        # process (a trainer's checkpoint written on the local main process)
        "import torch\nfrom accelerate import Accelerator\n"
        + "accelerator = Accelerator()\n"
        + "net = torch.nn.Linear(2, 2)\n"
        + "optimizer = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        + "net, optimizer = accelerator.prepare(net, optimizer)\n"
        + "if accelerator.is_local_main_process:\n"
        + "    sd = net.module.state_dict() if hasattr(net, 'module') else net.state_dict()\n"
        + "    torch.save({'model': sd}, 'latest.pt')\n",
        # a motion-field diffusion trainer: its optimizer ``self.opt`` (``Adam`` from a star
        # import, stepped and zeroed) saved beside the full model state
        "from accelerate import Accelerator\nfrom torch.optim import *\nimport torch\n\n\n"
        "class Trainer:\n    def __init__(self, model, loader):\n"
        "        self.accelerator = Accelerator()\n"
        "        self.opt = Adam(model.parameters(), lr=1e-4)\n"
        "        self.model, self.opt = self.accelerator.prepare(model, self.opt)\n"
        "        self.dl = self.accelerator.prepare(loader)\n\n"
        "    def save(self, path):\n        if not self.accelerator.is_main_process:\n"
        "            return\n"
        "        data = {'model': self.accelerator.get_state_dict(self.model),\n"
        "                'opt': self.opt.state_dict()}\n"
        "        torch.save(data, path)\n\n"
        "    def train(self):\n        for batch in self.dl:\n"
        "            self.opt.zero_grad()\n"
        "            self.accelerator.backward(self.model(batch))\n"
        "            self.opt.step()\n",
        # the same trainer handed the model unwrapped again, or saving it unwrapped
        _HANDED_TRAINER.format(
            state="self.model.state_dict()",
            between="    model = accelerator.unwrap_model(model)\n",
        ),
        _HANDED_TRAINER.format(state="self.accelerator.get_state_dict(self.model)", between=""),
        # one construction handed the plain model: which one a save meets is not certain
        _HANDED_TRAINER.format(
            state="self.model.state_dict()",
            between="    Trainer(accelerator, torch.nn.Linear(4, 2)).save()\n",
        ),
        # a VAE trainer's checkpoint helper: its only call hands it the unwrapped model
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "def train(acc, model, optimizer, data):\n"
        + "    model, optimizer, data = acc.prepare(model, optimizer, data)\n"
        + "    for x in data:\n"
        + "        acc.backward(model(x).sum())\n"
        + "        optimizer.step()\n"
        + "    if acc.is_main_process:\n"
        + "        save_model('m.pt', acc.unwrap_model(model))\n\n\n"
        + "def save_model(path, model):\n"
        + "    model_sd = model.state_dict()\n"
        + "    torch.save({'state_dict': model_sd}, path)\n\n\n"
        + "def run():\n"
        + "    train(Accelerator(), make_model(), make_optimizer(), make_data())\n",
        # the file reads its checkpoints back with the wrapper's ``module.`` stripped (a T5
        # dialogue trainer, a ResNet script's --load-model): the prefix loses nothing
        _PREPARED + "torch.save({'model_state_dict': model.state_dict()}, 'best.ckpt')\n"
        "def load(net, path):\n"
        "    sd = torch.load(path)['model_state_dict']\n"
        "    net.load_state_dict({k.replace('module.', ''): v for k, v in sd.items()})\n",
        # the unwrapped state dict kept in a local, the local in the checkpoint dict
        _PREPARED + "sd = accelerator.unwrap_model(model).state_dict()\n"
        "torch.save({'model': sd, 'epoch': 1}, 'm.pt')\n",
        # main saves the trainer's model unwrapped, or after binding trainer.model to the plain
        # model; a holder whose construction prepared nothing
        _LOADED
        + "    torch.save(trainer.accelerator.unwrap_model(trainer.model).state_dict(), 'a.pt')\n"
        + "    torch.save(trainer.accelerator.get_state_dict(trainer.model), 'b.pt')\n"
        + "    torch.save(trainer.model.module.state_dict(), 'c.pt')\n"
        + "    holder = Holder()\n    torch.save(holder.model.state_dict(), 'd.pt')\n"
        + "    trainer.model = trainer.accelerator.unwrap_model(trainer.model)\n"
        + "    torch.save(trainer.model.state_dict(), 'e.pt')\n\n\n"
        + "class Holder:\n    def __init__(self):\n        self.model = torch.nn.Linear(2, 2)\n",
        # the same helper loading into the unwrapped model; one handed an unprepared holder
        _DRIVEN_TRAINER.format(model="trainer.accelerator.unwrap_model(trainer.model)"),
        _DRIVEN_TRAINER.format(model="trainer.model")
        + "    resume(Holder(), 'm.pt')\n\n\n"
        + "class Holder:\n    def __init__(self):\n        self.model = torch.nn.Linear(2, 2)\n",
        # a trainer's own save method unwraps what it is handed and pushes it to the hub
        "from accelerate import Accelerator\n\n\nclass Trainer:\n"
        + "    def __init__(self, model, optimizer):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n"
        + "    def train(self, x):\n"
        + "        self.accelerator.backward(self.model(x))\n        self.save(self.model)\n\n"
        + "    def save(self, model):\n"
        + "        if self.accelerator.is_main_process:\n"
        + "            self.accelerator.unwrap_model(model).push_to_hub('repo')\n",
        # Prismer's sharding flags: the Accelerator that prepares the model has an FSDP plugin,
        # whose module loads the plain keys (its unwrapped module holds flattened shards)
        "import torch\nfrom accelerate import Accelerator, FullyShardedDataParallelPlugin\n"
        + "if args.full_shard:\n"
        + "    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())\n"
        + "    model = accelerator.prepare(model)\n"
        + "else:\n    accelerator = Accelerator()\n"
        + "model.load_state_dict(torch.load('pretrain.bin', map_location='cpu'))\n",
        # the same trainer binding self.model to the plain model after construction: which
        # one the load meets depends on the order the methods run
        _MOVING_TRAINER.format(
            moved="self.accelerator.unwrap_model(self.model)", model="self.model"
        ),
        # a checkpoint loaded into the unwrapped model, and one loaded before prepare
        _PREPARED.replace(
            "model = accelerator", "model.load_state_dict(torch.load('a.pt'))\nmodel = accelerator"
        )
        + "accelerator.unwrap_model(model).load_state_dict(torch.load('m.pt'))\n",
        # a D2C trainer: __init__ loads the checkpoint on --resume, then prepares
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "class Trainer:\n"
        + "    def __init__(self, net, resume):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.net = net\n"
        + "        if resume:\n"
        + "            self.load('model-last.pt')\n"
        + "        self.net = self.accelerator.prepare(self.net)\n\n"
        + "    def load(self, path):\n"
        + "        data = torch.load(path, map_location='cpu')\n"
        + "        self.net.load_state_dict(data['net'])\n\n"
        + "    def step(self, x):\n"
        + "        self.accelerator.backward(self.net(x))\n",
        # the model saved whole, unwrapped, beside the epoch
        _PREPARED
        + "accelerator.save({'net': accelerator.unwrap_model(model), 'epoch': 1}, 'c.pt')\n",
        # a project helper handed the unwrapped model's state dict
        _PREPARED
        + "from utils import save_checkpoint\n"
        + "save_checkpoint({'model': accelerator.unwrap_model(model).state_dict()}, 'run')\n",
        # the same method handed the unwrapped model's state dict, and the optimizer's
        _TRAINER.format(state="self.accelerator.unwrap_model(self.model).state_dict()")
        + "        self.write(self.optimizer.state_dict(), 'o.pt')\n",
        # a D2C trainer's spectral-norm calculator: a helper object (not a module) prepared
        # beside the models; prepare hands it back unchanged, so its state dict has no prefix
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "class Trainer:\n"
        + "    def __init__(self, net, opt, sn):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.net, self.opt = self.accelerator.prepare(net, opt)\n"
        + "        self.sn = self.accelerator.prepare(sn)\n\n"
        + "    def step(self, x):\n"
        + "        loss = self.net(x) + self.sn.spectral_norm_parallel()\n"
        + "        self.accelerator.backward(loss)\n\n"
        + "    def save(self):\n"
        + "        data = {'net': self.accelerator.get_state_dict(self.net),\n"
        + "                'sn': self.sn.state_dict()}\n"
        + "        torch.save(data, 'model-3.pt')\n"
        + "        torch.save(data, 'model-last.pt')\n",
        # an EMA copy, prepared but without trainable parameters: never wrapped, no prefix
        HEADER
        + "import torch\nema_model, model = accelerator.prepare(ema_model, model)\n"
        + "ckpt = {'model': accelerator.unwrap_model(model).state_dict(),\n"
        + "        'ema': ema_model.state_dict()}\naccelerator.save(ckpt, 'm.pt')\n",
        # the checkpoint dict saved by name was last built from the unwrapped model
        _PREPARED + "ckpt = {'model': model.state_dict()}\n"
        "ckpt = {'model': accelerator.unwrap_model(model).state_dict()}\n"
        "accelerator.save(ckpt, 'm.pt')\n",
        # HF Trainer: an optimizer handed in, prepared with the model; its state has no prefix
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "class Trainer:\n"
        + "    def __init__(self, model, optimizer):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n"
        + "    def save(self, output_dir):\n"
        + "        torch.save(self.optimizer.state_dict(), output_dir + '/optimizer.pt')\n",
        _PREPARED + "accelerator.save(accelerator.unwrap_model(model).state_dict(), 'm.pt')\n",
        _PREPARED
        + "model = accelerator.unwrap_model(model)\naccelerator.save(model.state_dict(), 'm.pt')\n",
        # a function reading the global, called only after the file unwraps it (parameter
        # diffusion trains its VAE, unwraps it at the bottom of the file, then trains on it)
        _PREPARED + _SAVES_GLOBAL + "model = accelerator.unwrap_model(model)\nsave()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        reported: set[int] = set()  # one finding per state dict, however many saves write it
        read_back = _strips_the_wrapper_prefix(script) and backends_in_view(script) == {DDP}
        for call in calls(script):
            if not (is_save_call(script, call) or _saving_helper(script, call)) or not call.args:
                continue
            for node, at in (
                () if read_back else _saved_state_dicts(script, call.args[0].value, call)
            ):
                owner = node.func.value  # type: ignore[union-attr]
                not_models = script.names_of(Kind.OPTIMIZER, Kind.SCHEDULER, Kind.DATALOADER)
                name = dotted(owner) or script.module.code_for_node(owner)
                if _not_a_model(name) or id(node) in reported:
                    continue
                # prepared here, or a trainer's model read from outside the class
                # (``torch.save(trainer.model.state_dict(), p)``, `holds_constructed_wrapper`)
                constructed = name not in prepared(script, at) and holds_constructed_wrapper(
                    script, owner, at
                )
                # a helper's parameter every call of which hands it a prepared model
                handed = (
                    None
                    if constructed or name in prepared(script, at)
                    else _handed_prepared_model(script, name, at)
                )
                if handed is not None and id(node) not in reported:
                    reported.add(id(node))
                    yield self.finding(
                        script, node, message=_handed_message(script, name, handed, at)
                    )
                    continue
                alias = None if constructed else _alias_of_prepared(script, name, at, not_models)
                if alias is not None:
                    reported.add(id(node))
                    yield self._aliased(script, node, owner, name, alias, at)
                    continue
                if not constructed and (
                    name not in prepared(script, at) - not_models
                    or not _treated_as_module(script, name)
                ):
                    continue
                if _unwrapped_since_prepare(script, name, at):
                    continue
                if isinstance(node.func, cst.Attribute) and in_unwrapped_branch(script, node.func):
                    continue  # ``m.module.state_dict() if hasattr(m, "module") else ...``
                reported.add(id(node))
                acc = accelerator_at(script, at)
                if acc is None and constructed:
                    acc = constructed_accelerator(script, owner, at)
                from accelify.edits import rewrites  # a fix's edits: imported for a fix only
                from accelify.edits.plan import Plan

                fix = Plan.of(rewrites.unwrap(owner, acc)) if acc is not None else None
                message = self.message.replace("(model)", f"({name})")  # ``self.model``
                if acc is not None and not constructed and _every_rank_saves_it(script, node, at):
                    # convert's edit: the whole model's state under every engine
                    fix = Plan.of(rewrites.full_state(node, acc))
                    message = (
                        f"Save accelerator.get_state_dict({name}): {name}.state_dict() is the "
                        "wrapper's (every key prefixed 'module.' under DDP, one rank's shard "
                        "under FSDP or ZeRO-3); get_state_dict is the whole unwrapped model, and "
                        "every rank runs it here (a collective under those engines)"
                    )
                elif acc is not None and not constructed:
                    message = (
                        f"Save accelerator.unwrap_model({name}).state_dict(): {name}.state_dict() "
                        "is the wrapper's, every key prefixed 'module.' under DDP (under FSDP or "
                        f"ZeRO-3 write accelerator.get_state_dict({name}) where every rank runs "
                        "it, before any rank test, and save that)"
                    )
                if acc is None and constructed:
                    message = (
                        f"Save the state dict of {name} unwrapped by the Accelerator that "
                        f"prepared it (its unwrap_model({name}).state_dict(), or "
                        f"get_state_dict({name}))"
                    )
                yield self.finding(script, node, fix, message=in_file_words(message, acc))
            if is_save_call(script, call) and script.call_graph.callee(call) is None:
                # not a helper: ``save_model`` unwraps what it is handed, and a trainer's own
                # ``self.save(model)`` does what its body does (checked where it is)
                yield from self._pickled_whole(script, call)

        yield from self._loads(script)

    def _aliased(
        self,
        script: ScriptModel,
        node: cst.Call,
        owner: cst.BaseExpression,
        name: str,
        alias: cst.Assign,
        at: cst.Call,
    ) -> Finding:
        """``sample_net = self.net`` then ``torch.save(sample_net.state_dict(), path)``."""
        acc = accelerator_at(script, at)
        held = script.module.code_for_node(alias.value)
        unwrapped = f"{acc or 'accelerator'}.unwrap_model({name})"
        message = (
            f"Save {unwrapped}.state_dict(): {name} is {held} (line {script.line(alias)}), the "
            f"wrapper prepare returned, so {name}.state_dict() has every key prefixed 'module.' "
            f"under DDP (under FSDP or ZeRO-3 write {acc or 'accelerator'}.get_state_dict({held}) "
            "where every rank runs it, before any rank test, and save that)"
        )
        from accelify.edits import rewrites  # a fix's edits: imported for a fix only
        from accelify.edits.plan import Plan

        fix = Plan.of(rewrites.unwrap(owner, acc)) if acc is not None else None
        return self.finding(script, node, fix, message=message)

    def _loads(self, script: ScriptModel) -> Iterator[Finding]:
        """The reverse: ``model.load_state_dict(torch.load(path))`` on what prepare returned. A
        checkpoint file holds the plain model's keys; the DDP wrapper expects ``module.`` on
        each, so the load fails with missing keys on several processes (or, with ``strict=False``,
        loads nothing), while a one-process run, with no wrapper, hides it."""
        not_models = script.names_of(Kind.OPTIMIZER, Kind.SCHEDULER, Kind.DATALOADER)
        handed: set[int] = set()
        for call in calls(script):
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "load_state_dict"):
                continue
            name = dotted(func.value) or script.module.code_for_node(func.value)
            if _not_a_model(name):
                continue
            if not call.args or not _read_from_a_file(script, call.args[0].value, call):
                continue
            for held, entry in _iterated_holders(script, func.value, call):
                if id(entry) not in handed:  # one finding per model, however many loads
                    handed.add(id(entry))
                    yield self._loaded_through(script, call, held, entry)
            # prepared here, or a trainer's model read from outside the class
            # (``trainer.model.load_state_dict(...)``, `holds_constructed_wrapper`)
            constructed = name not in prepared(script, call) and holds_constructed_wrapper(
                script, func.value, call
            )
            if not constructed:
                if name not in prepared(script, call) - not_models:
                    continue
                if not _holds_the_wrapper(script, func.value, call):
                    continue
                if not _treated_as_module(script, name):
                    continue
            if _unwrapped_since_prepare(script, name, call):
                continue
            acc = accelerator_at(script, call)
            if acc is None and constructed:
                acc = constructed_accelerator(script, func.value, call)
            from accelify.edits import rewrites  # a fix's edits: imported for a fix only
            from accelify.edits.plan import Plan

            fix = Plan.of(rewrites.unwrap(func.value, acc)) if acc is not None else None
            unwrapped = (
                f"{acc}.unwrap_model({name})"
                if acc is not None or not constructed
                else f"the Accelerator's unwrap_model({name})"
            )
            message = (
                f"Load into {unwrapped}: the checkpoint holds the plain model's keys, and on "
                f"several processes {name} is the DistributedDataParallel wrapper, whose keys "
                "start with 'module.' (missing keys); a one-process run has no wrapper and hides it"
            )
            yield self.finding(script, call, fix, message=message)

    def _loaded_through(
        self, script: ScriptModel, load: cst.Call, held: str, entry: cst.BaseExpression
    ) -> Finding:
        """A prepared model handed, among other objects, to a loop that loads a checkpoint's
        entries into each (`_iterated_holders`): reported where it is handed, the fix's place."""
        acc = accelerator_at(script, entry) or "accelerator"
        message = (
            f"Hand {acc}.unwrap_model({held}) here: line {script.line(load)} loads a checkpoint "
            f"entry into each object handed in, and {held} is the wrapper prepare returned, "
            "whose keys start with 'module.' on several processes (missing keys: every "
            "multi-GPU resume fails); the checkpoint holds the plain model's keys, and a "
            "one-process run has no wrapper and hides it"
        )
        return self.finding(script, entry, message=message)

    def _pickled_whole(self, script: ScriptModel, call: cst.Call) -> Iterator[Finding]:
        """A prepared model saved whole (``accelerator.save(model, p)``, ``{'net': net, ...}``
        as mixup-cifar10's checkpoint keeps it): the file holds the DDP wrapper, whose hooks
        may not pickle and which a resumed run loads in place of the model."""
        not_models = script.names_of(Kind.OPTIMIZER, Kind.SCHEDULER, Kind.DATALOADER)
        for model in saved_whole_objects(script, call):
            name = dotted(model)
            if _not_a_model(name):
                continue
            constructed = name not in prepared(script, call) and holds_constructed_wrapper(
                script, model, call
            )
            if not constructed and name not in prepared(script, call) - not_models:
                continue
            if _unwrapped_since_prepare(script, name, call):
                continue
            acc = accelerator_at(script, call)
            if acc is None and constructed:
                acc = constructed_accelerator(script, model, call)
            from accelify.edits import rewrites  # a fix's edits: imported for a fix only
            from accelify.edits.plan import Plan

            fix = Plan.of(rewrites.unwrap(model, acc)) if acc is not None else None
            message = _WHOLE.replace("(model)", f"({name})")
            if acc is None and constructed:
                message = message.replace(
                    f"accelerator.unwrap_model({name})",
                    f"{name} unwrapped by the Accelerator that prepared it",
                )
            yield self.finding(script, model, fix, message=in_file_words(message, acc))


def _iterated_holders(
    script: ScriptModel, receiver: cst.BaseExpression, load: cst.Call
) -> list[tuple[str, cst.BaseExpression]]:
    """The prepared models ``receiver`` stands for when it is the value of a loop over a dict's
    items: ``for key, value in kwargs.items(): value.load_state_dict(checkpoint[key])``, the
    dict the function's ``**kwargs`` (what its calls hand by keyword: xnguyen's
    ``restart_from_checkpoint(path, model=self.model, optimizer=self.optimizer)``) or one
    made in the function (``{"model": model, "optimizer": optimizer}``). Each with the
    expression that hands it."""
    if not isinstance(receiver, cst.Name):
        return []
    loop = next(
        (
            a
            for a in script.ancestors(load)
            if isinstance(a, cst.For) and _items_value(a) == receiver.value
        ),
        None,
    )
    function = script.index.enclosing_function(load)
    if (
        loop is None
        or function is None
        or any(script.inside(a, loop) for a in script.index.assignments_to(receiver.value))
    ):
        return []
    iterated = loop.iter.func.value  # type: ignore[attr-defined]
    if not isinstance(iterated, cst.Name):
        return []
    handed: list[cst.BaseExpression] = []
    star = function.params.star_kwarg
    if star is not None and star.name.value == iterated.value:
        named = {p.name.value for p in (*function.params.params, *function.params.kwonly_params)}
        handed = [
            argument.value
            for site, _ in script.call_graph.calls_of(function)
            for argument in site.args
            if argument.keyword is not None and argument.keyword.value not in named
        ]
    else:
        made = [
            a for a in script.index.assignments_to(iterated.value) if script.scope_of(a) is function
        ]
        if len(made) == 1 and isinstance(made[0].value, cst.Dict):
            handed = [e.value for e in made[0].value.elements if isinstance(e, cst.DictElement)]
    not_models = script.names_of(Kind.OPTIMIZER, Kind.SCHEDULER, Kind.DATALOADER)
    found = []
    for value in handed:
        held = dotted(value)
        site = next(a for a in script.ancestors(value) if isinstance(a, cst.Call | cst.Assign))
        if (
            held is not None
            and held in prepared(script, site) - not_models
            and not _not_a_model(held)
            and _treated_as_module(script, held)
            and not _unwrapped_since_prepare(script, held, site)  # type: ignore[arg-type]
        ):
            found.append((held, value))
    return found


def _items_value(loop: cst.For) -> str | None:
    """``value`` of ``for key, value in d.items():``."""
    target, iterated = loop.target, loop.iter
    if not (
        isinstance(iterated, cst.Call)
        and isinstance(iterated.func, cst.Attribute)
        and iterated.func.attr.value == "items"
        and not iterated.args
        and isinstance(target, cst.Tuple)
        and len(target.elements) == 2
        and isinstance(target.elements[1].value, cst.Name)
    ):
        return None
    return target.elements[1].value.value


#: String methods a key is renamed with: ``k.replace("module.", "")``, ``removeprefix``, or
#: tested first (``k.startswith("module.")``, then cut).
_KEY_RENAMES = frozenset({"replace", "removeprefix", "startswith", "split", "lstrip"})


def _strips_the_wrapper_prefix(script: ScriptModel) -> bool:
    """The file renames the keys it loads from ``module.x`` to ``x`` (a T5 trainer's resume, a
    ResNet script's ``--load-model``): the checkpoints it writes from the DDP wrapper are read
    back by that code, so their ``module.`` keys lose nothing. Under FSDP or DeepSpeed the
    wrapper's state dict is a shard, which no renaming mends: there the finding stays."""
    for call in script.calls:
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in _KEY_RENAMES):
            continue
        first = call.args[0].value if call.args else None
        if isinstance(first, cst.SimpleString) and first.evaluated_value in ("module.", "module"):
            return True
    return False


def _holds_the_wrapper(script: ScriptModel, owner: cst.BaseExpression, at: cst.Call) -> bool:
    """Where ``at`` runs, ``owner`` certainly holds what prepare returned: prepared above it in
    the same function (or module), or a trainer's ``self.model`` prepared while the trainer was
    constructed, read in a method construction does not run (a D2C trainer's ``load``, called
    from ``__init__`` on ``--resume`` before its prepare, loads into the plain model)."""
    if (dotted(owner) or "").startswith("self."):
        return prepared_in_construction(script, owner, at)
    here, scope = script.order(at), script.scope_of(at)
    return any(
        dotted(owner) in prepare.outputs
        and script.scope_of(prepare.call) is scope
        and script.order(prepare.call) < here
        and not _sharded_by_its_plugin(script, prepare.call)
        for prepare in script.prepare_calls
    )


def _sharded_by_its_plugin(script: ScriptModel, prepare: cst.Call) -> bool:
    """The Accelerator that makes this ``prepare`` was built with ``fsdp_plugin=`` (a
    Prismer-style trainer builds one per sharding flag): what it returns is an FSDP module,
    whose ``load_state_dict`` takes the plain model's keys (FSDP's state-dict hooks strip its
    own prefixes), and whose unwrapped module holds flattened shards a plain checkpoint does
    not fit. No DDP ``module.`` prefix to advise about."""
    if not isinstance(prepare.func, cst.Attribute):
        return False
    name, at = dotted(prepare.func.value), script.order(prepare)
    built = [
        binding
        for binding in script.of_kind(Kind.ACCELERATOR)
        if binding.name == name
        and binding.scope is script.scope_of(prepare)
        and script.order(binding.assign) < at
    ]
    if not built:
        return False
    value = max(built, key=lambda binding: script.order(binding.assign)).value
    plugin = accelerator_argument(value, "fsdp_plugin")
    return plugin is not None and dotted(plugin.value) != "None"


def _read_from_a_file(script: ScriptModel, value: cst.BaseExpression, at: cst.Call) -> bool:
    """``value`` is (or its name was bound, above ``at`` in the same scope, from) a checkpoint
    read from disk: ``torch.load(path)``, ``ckpt["model"]`` of ``ckpt = torch.load(path)``, a
    comprehension renaming the keys of one."""
    if any(
        isinstance(node, cst.Call) and script.call_names(node) & names.STATE_FILE_LOADS
        for node in walk(value)
    ):
        return True
    roots = {node.value for node in walk(value) if isinstance(node, cst.Name)}
    here, scope = script.order(at), script.scope_of(at)
    return any(
        script.scope_of(assign) is scope
        and script.order(assign) < here
        and any(
            isinstance(node, cst.Call) and script.call_names(node) & names.STATE_FILE_LOADS
            for node in walk(assign.value)
        )
        for root in roots
        for assign in script.index.assignments_to(root)
    )


_WHOLE = (
    "Save accelerator.unwrap_model(model): the prepared model is the wrapper, which a resumed "
    "run would load in place of the model (and whose hooks may not pickle)"
)


def _saving_helper(script: ScriptModel, call: cst.Call) -> bool:
    """A save function from another module (``save_checkpoint({"model": self.model.state_dict(),
    ...}, name, run_dir)`` imported from the project's utils, safetensors' ``save_file``): it
    writes what it is handed, and it can no longer unwrap a state dict that already carries the
    wrapper's prefix. A function of this file is followed through its parameters instead."""
    name = (dotted(call.func) or "").rsplit(".", 1)[-1]
    return name.startswith("save") and not script.call_graph.targets(call)


#: What a prepared object of no known kind is, by its name: an optimizer, a scheduler or a scaler
#: keeps no wrapper's ``module.`` prefix in its state dict (HF Trainer's ``self.optimizer``, built
#: by a method the analysis does not follow). An EMA copy trains nothing, and prepare wraps only
#: a model with trainable parameters in DistributedDataParallel (lucidrains' e2-tts trainer
#: prepares its ``ema_model`` and saves ``self.ema_model.state_dict()``).
_NOT_MODEL_WORDS = ("optim", "sched", "scaler", "loader")


def _treated_as_module(script: ScriptModel, name: str | None) -> bool:
    """Something in the file shows ``name`` is a module: a model by its making, called, asked
    for nn.Module's API (``.parameters()``, ``.train()``, ``.module``...), or handed to
    ``unwrap_model``, before or after prepare. A helper object prepared beside the models (a
    spectral-norm calculator with its own ``state_dict()``, a D2C trainer's) is not one:
    ``prepare`` hands back what it does not know unchanged, and its state dict has no prefix.
    With no use at all in the file, it is taken for a model."""
    spellings = {name} | {
        source
        for prepare in script.prepare_calls
        if name in prepare.outputs
        for source, output in zip(prepare.inputs, prepare.outputs, strict=False)
        if output == name and source
    }
    if spellings & script.names_of(Kind.MODEL):
        return True
    if any(
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "step"
        and dotted(call.func.value) in spellings
        for call in script.calls
    ):
        # ``self.opt.step()``: an optimizer (an ``Adam`` from a star import, which nothing
        # classifies), whose ``zero_grad()`` reads like nn.Module's; a module has no step()
        return False
    used = False
    for attribute in script.index.of_type(cst.Attribute):
        assert isinstance(attribute, cst.Attribute)
        if dotted(attribute.value) not in spellings:
            continue
        member = attribute.attr.value
        if member in _MODULE_EVIDENCE:
            return True
        used = used or member not in _STATE_METHODS
    for call in script.calls:
        if dotted(call.func) in spellings:
            return True
        if (dotted(call.func) or "").endswith(_UNWRAPPING) and any(
            dotted(arg.value) in spellings for arg in call.args
        ):
            return True
    return not used


_STATE_METHODS = {"state_dict", "load_state_dict"}
_MODULE_EVIDENCE = (names.MODULE_API - _STATE_METHODS) | {"module"}


def _handed_prepared_model(
    script: ScriptModel, name: str, at: cst.CSTNode, depth: int = 0
) -> cst.Call | None:
    """The call that hands the function around ``at`` its parameter ``name``, where every call
    of that function in the file hands it a model ``prepare`` returned (or its own such
    parameter), not unwrapped since: ``def save(model, path): torch.save(model.state_dict(),
    path)`` called as ``save(model, "m.pt")`` below ``model, ... = accelerator.prepare(model,
    ...)`` saves the wrapper's state dict. None when a call hands anything else, the function
    binds ``name`` itself, or nothing in the file calls it."""
    function = script.index.enclosing_function(at)
    if function is None or "." in name or depth > 2 or not has_parameter(function, name):
        return None
    if any(script.scope_of(a) is function for a in script.index.assignments_to(name)):
        return None
    passed = facts_of(script).flow.call_site_arguments(name, at)
    not_models = script.names_of(Kind.OPTIMIZER, Kind.SCHEDULER, Kind.DATALOADER)
    first = None
    for argument in passed:
        site = script.parent(argument)
        if not isinstance(argument.value, cst.Name) or not isinstance(site, cst.Call):
            return None
        outer = argument.value.value
        if (
            outer in prepared(script, site) - not_models
            and not _not_a_model(outer)
            and _treated_as_module(script, outer)
            and not _unwrapped_since_prepare(script, outer, site)
        ) or _handed_prepared_model(script, outer, site, depth + 1) is not None:
            first = first or site
            continue
        return None
    return first


def _alias_of_prepared(
    script: ScriptModel, name: str, at: cst.CSTNode, not_models: set[str]
) -> cst.Assign | None:
    """``name = self.net`` (or another prepared name), the only binding of the local ``name`` in
    the function around ``at`` and above it, where that attribute holds what ``prepare``
    returned there (a model, not unwrapped since): the local is the wrapper too (a runner's
    ``sample_net = self.net`` saved in ``save``). A local bound in two places (an EMA copy in
    one branch, the prepared model in the other) is not known to be either."""
    function = script.index.enclosing_function(at)
    if function is None or "." in name or has_parameter(function, name):
        return None
    binds = [
        value
        for statement, value in script.index.values_bound_to(name)
        if script.index.enclosing_function(statement) is function
    ]
    assigns = [a for a in script.index.assignments_to(name) if script.scope_of(a) is function]
    if len(binds) != 1 or len(assigns) != 1 or not isinstance(assigns[0], cst.Assign):
        return None
    assign = assigns[0]
    if len(assigned_targets(assign)) != 1 or script.order(assign) > script.order(at):
        return None
    held = dotted(assign.value)
    if (
        held is None
        or held == name
        or held not in prepared(script, assign) - not_models
        or _not_a_model(held)
        or not _treated_as_module(script, held)
        or _unwrapped_since_prepare(script, held, at)  # type: ignore[arg-type]
    ):
        return None
    return assign


def _handed_message(script: ScriptModel, name: str, site: cst.Call, at: cst.CSTNode) -> str:
    accelerator = accelerator_at(script, site) or "accelerator"
    return (
        f"Save the unwrapped model's state dict: {name} is the wrapper prepare returned (the "
        f"call at line {script.line(site)} hands it), so {name}.state_dict() has every key "
        f"prefixed 'module.' under DDP; hand that call {accelerator}.unwrap_model(...) of the "
        f"model, or unwrap it here (under FSDP or ZeRO-3 save {accelerator}.get_state_dict(...) "
        "of it, run on every rank, before any rank test)"
    )


def _not_a_model(name: str | None) -> bool:
    last = (name or "").rsplit(".", 1)[-1].lower()
    if "ema" in last.split("_"):
        return True  # ema, ema_model, model_ema: an EMA copy
    if "opt" in last.split("_"):
        return True  # opt, opt_g, d_opt: an optimizer
    return any(word in last for word in _NOT_MODEL_WORDS)


def _saved_state_dicts(
    script: ScriptModel, saved: cst.BaseExpression, at: cst.Call, depth: int = 0
) -> list[tuple[cst.Call, cst.Call]]:
    """The ``.state_dict()`` calls whose result is saved, each with the call where it is read
    (the save, or the call site that hands it to the saving function): a helper's parameter
    saved in a checkpoint dict (``write_state_dict(self, step, state, ...)`` saving ``{'state':
    state}``) is what its callers pass (``policy_state_dict = self.policy.state_dict()``, as a
    DPO trainer writes its policy, optimizer and scheduler)."""
    values = saved_values(script, saved, at)
    values += _kept_locals(script, values, at)
    found = [(node, at) for value in values for node in _state_dict_calls(value)]
    function = facts_of(script).placement.enclosing_function(at)
    if function is None or depth >= 2:
        return found
    parameters = {p.name.value for p in (*function.params.params, *function.params.kwonly_params)}
    read = {
        node.value
        for value in values
        for node in walk(value)
        if isinstance(node, cst.Name) and node.value in parameters and not _member(script, node)
    }
    if not read:
        return found
    for site, implicit in script.call_graph.calls_of(function):
        for parameter, argument in bound_arguments(function, site, implicit):
            if parameter in read:
                found += _saved_state_dicts(script, argument.value, site, depth + 1)
    return found


def _kept_locals(
    script: ScriptModel, values: list[cst.CSTNode], at: cst.Call, depth: int = 0
) -> list[cst.CSTNode]:
    """What the locals an entry of a saved dict, list or tuple names were last given above the
    save (``sd = trainer.model.state_dict()``, then ``torch.save({'model': sd}, p)``): the state
    dict is kept in the checkpoint through the name, one or two names deep."""
    found: list[cst.CSTNode] = []
    for value in values:
        if not isinstance(value, (cst.Dict, cst.List, cst.Tuple)):
            continue
        for element in value.elements:
            entry = element.value
            if not isinstance(entry, cst.Name):
                continue
            held = [v for v in saved_values(script, entry, at) if v is not entry]
            found += held
            if depth < 1:
                found += _kept_locals(script, held, at, depth + 1)
    return found


def _member(script: ScriptModel, name: cst.Name) -> bool:
    """``state`` of ``ckpt.state``: a member's name, not the variable ``state``."""
    parent = script.parent(name)
    return isinstance(parent, cst.Attribute) and parent.attr is name


def _state_dict_calls(node: cst.CSTNode) -> list[cst.Call]:
    found = []
    stack = [node]
    while stack:
        current = stack.pop()
        if (
            isinstance(current, cst.Call)
            and isinstance(current.func, cst.Attribute)
            and current.func.attr.value == "state_dict"
        ):
            found.append(current)
        stack.extend(children_of(current))
    return found


_UNWRAPPING = ("unwrap_model", "get_state_dict", "extract_model_from_parallel")


def _unwrapped_since_prepare(
    script: ScriptModel, name: str | None, call: cst.Call, depth: int = 0
) -> bool:
    """``model = accelerator.unwrap_model(model)`` (or ``= model.module``) between the last
    prepare of ``name`` and ``call``: the name holds the plain model again. A function that
    reads ``name`` as a global sees it as it is when the function runs: unwrapped when every
    call of the function comes after the unwrapping (parameter diffusion's ``vae =
    accelerator.unwrap_model(vae)`` at the bottom of the file, then ``train()``, whose body
    saves ``vae.state_dict()`` above it in the file)."""
    if _unwrapped_before(script, name, call):
        return True
    function = facts_of(script).placement.enclosing_function(call)
    if function is None or depth >= 3 or name is None:
        return False
    if _bound_in(script, name, function):
        return _handed_unwrapped(script, name, function, depth)
    sites = script.call_graph.calls_of(function)
    return bool(sites) and all(
        _unwrapped_since_prepare(script, name, site, depth + 1) for site, _ in sites
    )


def _handed_unwrapped(
    script: ScriptModel, name: str, function: cst.FunctionDef, depth: int
) -> bool:
    """``name`` is a parameter of ``function`` that its body never binds again, and every call
    of the function in the file hands it the plain model: ``save_model(path,
    acc.unwrap_model(model), ...)`` (a VAE trainer's checkpoint helper), ``model.module``, or a
    name unwrapped since its prepare where the call is made. The parameter is that object."""
    parameters = (*function.params.params, *function.params.kwonly_params)
    if "." in name or not any(p.name.value == name for p in parameters):
        return False
    if any(script.scope_of(assign) is function for assign in script.index.assignments_to(name)):
        return False
    sites = script.call_graph.calls_of(function)
    if not sites:
        return False
    for site, implicit in sites:
        handed = [a for p, a in bound_arguments(function, site, implicit) if p == name]
        if len(handed) != 1:
            return False
        value = handed[0].value
        if isinstance(value, cst.Call) and (dotted(value.func) or "").endswith(_UNWRAPPING):
            continue
        if isinstance(value, cst.Attribute) and value.attr.value == "module":
            continue
        if not _unwrapped_since_prepare(script, dotted(value), site, depth + 1):
            return False
    return True


def _bound_in(script: ScriptModel, name: str, function: cst.FunctionDef) -> bool:
    """``name`` is the function's own: a parameter, or assigned in its body (not a global)."""
    if "." in name:
        return True  # ``self.model``: the instance's, not a module global
    parameters = (*function.params.params, *function.params.kwonly_params)
    if any(p.name.value == name for p in parameters):
        return True
    return any(script.scope_of(assign) is function for assign in script.index.assignments_to(name))


def _unwrapped_before(script: ScriptModel, name: str | None, call: cst.Call) -> bool:
    """An unwrapping assignment of ``name`` between its last prepare and ``call``, in order."""
    here = script.order(call)
    prepared_at = max(
        (
            script.order(p.call)
            for p in script.prepare_calls
            if script.order(p.call) <= here and name in p.outputs
        ),
        default=0,
    )
    for node in facts_of(script).placement.all_nodes():
        if not isinstance(node, cst.Assign) or len(assigned_targets(node)) != 1:
            continue
        if dotted(assigned_targets(node)[0]) != name or not prepared_at < script.order(node) < here:
            continue
        value = node.value
        if isinstance(value, cst.Call) and (dotted(value.func) or "").endswith(_UNWRAPPING):
            return True
        if isinstance(value, cst.Attribute) and value.attr.value == "module":
            return True
    return False


def _every_rank_saves_it(script: ScriptModel, state: cst.Call, save: cst.Call) -> bool:
    """``state`` (``model.state_dict()``) is built inside the arguments of ``save``, an
    ``accelerator.save`` (it writes on the main process alone: under FSDP and ZeRO-3 the other
    ranks' ``get_state_dict`` is empty, and a ``torch.save`` of it on every rank would race the
    main process's file), which every rank reaches: no rank test around it or
    around a call of its function, no ``except`` block, no stop a rank may take alone before it
    (`SharedFiles.divergent_around`, `parting_before`). There ``accelerator.get_state_dict``,
    a collective under FSDP and ZeRO-3, is safe, as convert writes it."""
    facts = facts_of(script)
    return (
        isinstance(save.func, cst.Attribute)
        and save.func.attr.value == "save"
        and dotted(save.func.value) in facts.flow.names_of(Kind.ACCELERATOR)
        and facts.placement.inside(state, save)
        and not facts.ranks.under_rank_guard(state)
        and facts.shared_files.kept_on_every_rank(save) is None
        and facts.shared_files.divergent_around(state) is None
        and facts.shared_files.parting_before(state) is None
    )
