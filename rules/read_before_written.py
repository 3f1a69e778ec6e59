from collections.abc import Iterator

import libcst as cst

from accelify.analysis.alike_tests import alike_by_its_callers
from accelify.analysis.dataflow import is_attribute_name, variables_in
from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.name_scopes import binding_spellings
from accelify.analysis.process_count import several_processes
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.shared_files import SharedFile
from accelify.analysis.syntax import assigned_targets, dotted, target_names, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name

_TRAINER = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model = self.accelerator.prepare(model)\n\n"
    "    def save(self, path):\n"
    "        if self.accelerator.is_main_process:\n"
    "            torch.save(self.accelerator.unwrap_model(self.model).state_dict(), path)\n"
    "{after_save}\n"
    "    def load(self, path):\n"
    "{before_load}"
    "        state = torch.load(path)\n"
    "        self.accelerator.unwrap_model(self.model).load_state_dict(state)\n\n"
    "    def finish(self, path):\n"
    "        self.save(path)\n"
    "{between}"
    "        self.load(path)\n"
)

#: train() saves the best weights through a helper on the main process; main() reads them back.
_WRITTEN_IN_TRAIN = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "def save_best(accelerator, model, path):\n"
    "    if accelerator.is_main_process:\n"
    "        torch.save(accelerator.unwrap_model(model).state_dict(), path)\n\n\n"
    "def train(accelerator, model, path):\n"
    "    save_best(accelerator, model, path)\n\n\n"
    "def main(accelerator, model):\n"
    "    model = accelerator.prepare(model)\n"
    "    train(accelerator, model, 'best.pt')\n"
    "{barrier}"
    "    model.load_state_dict(torch.load('best.pt'))\n"
)

#: A helper object (a pytorchtools-style early stopping) saves the best weights on the main
#: process to the path its constructor was handed (``path=self.best_path``, set twice to one
#: value from the settings the trainer is handed); the script reads ``trainer.best_path`` (or
#: the path the settings spell, ``{read}``) back on every rank once training is done.
_SAVED_BY_A_HELPER_OBJECT = (
    HEADER + "import os\nimport torch\n\nCFG = {{'ckpt_dir': 'checkpoints'}}\n\n\n"
    "class EarlyStopping:\n"
    "    def __init__(self, patience=3, path='checkpoint.pt'):\n"
    "        self.patience = patience\n"
    "        self.path = path\n\n"
    "    def __call__(self, model):\n"
    "        if accelerator.is_main_process:\n"
    "            torch.save(model.state_dict(), self.path)\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, cfg):\n"
    "        self.model = accelerator.prepare(model)\n"
    "        self.best_path = os.path.join(cfg['ckpt_dir'], 'best.pt')\n"
    "        self.early_stopping = EarlyStopping(patience=2, path=self.best_path)\n"
    "        os.makedirs(cfg['ckpt_dir'], exist_ok=True)\n"
    "        self.best_path = os.path.join(cfg['ckpt_dir'], 'best.pt')\n\n"
    "    def fit(self):\n"
    "        self.early_stopping(accelerator.unwrap_model(self.model))\n\n\n"
    "trainer = Trainer(model, CFG)\n"
    "trainer.fit()\n"
    "{barrier}"
    "model.load_state_dict(torch.load({read}))\n"
)


#: A checkpoint saved each epoch on the main process and loaded back by every rank, with a
#: barrier between them (``{barrier}``, indented into the epoch loop's body).
_EVERY_EPOCH = (
    HEADER
    + "import torch\n"
    + "for epoch in range(epochs):\n"
    + "    if accelerator.is_main_process:\n"
    + "        torch.save(accelerator.unwrap_model(model).state_dict(), 'ckpt.pt')\n"
    + "{barrier}"
    + "    state = torch.load('ckpt.pt')\n"
)


#: A trainer's step tested twice, a barrier under the first and the read under the second;
#: ``{between}`` runs between the two tests.
_STEP_TESTED_TWICE = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model = self.accelerator.prepare(model)\n"
    "        self.global_step = 0\n\n"
    "    def train(self, loader):\n"
    "        for batch in loader:\n"
    "            if self.accelerator.is_main_process:\n"
    "                torch.save(self.accelerator.unwrap_model(self.model).state_dict(), 'c.pt')\n"
    "            if self.global_step % 5 == 0:\n"
    "                self.accelerator.wait_for_everyone()\n"
    "{between}"
    "            if self.global_step % 5 == 0:\n"
    "                state = torch.load('c.pt')\n"
)


#: The form the conversion writes: the state dict gathered (a collective under FSDP and
#: DeepSpeed) in the arguments of ``accelerator.save``, which writes it on the main process
#: only; ``{before}`` runs above the save, ``{between}`` between it and the read, ``{read}`` is
#: the read's line.
_GATHERED_SAVE = (
    HEADER
    + "import torch\n"
    + "{before}"
    + "accelerator.save(accelerator.get_state_dict(model), 'best.pt')\n"
    + "{between}"
    + "{read}"
)

#: A trainer saves its best weights in ``fit()`` and loads them in ``test()``; the script
#: calls one, then the other, on every rank. ``{between}``: between the calls.
_FIT_THEN_TEST = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model = self.accelerator.prepare(model)\n"
    "        self.best_path = 'best.pt'\n\n"
    "    def fit(self):\n"
    "        self.accelerator.wait_for_everyone()\n"
    "        self.accelerator.save(\n"
    "            self.accelerator.get_state_dict(self.model), self.best_path\n"
    "        )\n\n"
    "    def test(self):\n"
    "        state = torch.load(self.best_path)\n"
    "        self.accelerator.unwrap_model(self.model).load_state_dict(state)\n\n\n"
    "trainer = Trainer(torch.nn.Linear(2, 2))\n"
    "trainer.fit()\n"
    "{between}"
    "trainer.test()\n"
)

#: The Accelerator's model save, its weights written into a folder on the main process only;
#: ``{between}`` runs between the save and the reads.
_MODEL_SAVED = (
    HEADER
    + "import os\n"
    + "from safetensors.torch import load_file\n"
    + "from transformers import AutoModel\n"
    + "accelerator.save_model(model, 'out')\n"
    + "{between}"
    + "state = load_file(os.path.join('out', 'model.safetensors'))\n"
)


class ReadBeforeWritten(Rule):
    """A file written on the main process only (under ``if accelerator.is_main_process:`` or
    ``is_local_main_process``, by ``accelerator.save`` or ``accelerator.save_model``, which
    write there whoever calls them, or by ``save_pretrained(..., is_main_process=...)``, also
    of ``accelerator.unwrap_model(model)``) and read below it, in the same function, by every
    rank (the file, or for a model saved into a folder, a file in it), with no barrier or
    other collective in between: the other ranks reach the read while the main process is
    still writing, and load nothing (``OSError`` on a first run) or a half-written file. A
    ``wait_for_everyone()``, a ``prepare`` or any collective between the two (also
    ``main_process_first()`` around the read) orders them, and is not reported; one in the
    save's own arguments (``accelerator.save(accelerator.get_state_dict(model), path)``, the
    form the conversion writes) runs before the write, and one above the save orders nothing
    after it.
    The write and the read may be in two functions that a third calls one after the other (a
    trainer's ``save()``, guarded inside or at its call, then its ``load()``): a barrier after
    the write in its function, between the two calls or before the read orders them there.
    A write and a read no run does both of are not reported: two arms of one ``if``/``elif``
    chain, or two ``if``s comparing the same setting with different constants (``if args.mode
    == "train":`` ... ``elif args.mode == "eval":``), their tests the same on every rank, and
    both run at most once per run (no loop around them, functions called once) with a setting
    bound once (not ``self.mode`` of a class built per mode: ``Runner("train").run()`` then
    ``Runner("eval").run()`` does both). The same race in one call: a dataset built by every
    rank with ``download=accelerator.is_main_process``. The same race between the arms of a
    rank test: the main process saves in ``if accelerator.is_main_process:`` while the others
    load the file in its ``else:`` (or under an ``if not accelerator.is_main_process:`` below it); a
    barrier in the readers' arm before the read (matched by one after the write), or between
    the two ``if``s, orders them, and so does a ``main_process_first()`` around both (the others
    enter it once the main process has left), and so is a read in ``if not
    accelerator.is_main_process:`` below an ``accelerator.save`` every rank calls. A folder's
    file counts as the folder writer's only when it is one such a writer makes (weights,
    configs, a tokenizer's files), ``train_args.json`` in it is not. A barrier inside a loop
    taken on the loop's first pass (``if step % 2 == 0:`` over ``range``) orders every later
    pass's read of a file written once above the loop. A file every rank writes itself
    (``torch.save`` unguarded) is ACC201's."""

    code = "ACC212"
    name = "read-before-written"
    message = (
        "Call accelerator.wait_for_everyone() before this read: the file is written on the main "
        "process only, and the other ranks read it here without waiting for the write"
    )
    why = "Without a barrier the other ranks read a file the main process has not written yet."
    bad = (
        # each machine's first process goes first: on a second machine the read comes before
        # the global main process has written the file
        Example(
            HEADER
            + "import torch\n"
            + "with accelerator.local_main_process_first():\n"
            + "    if accelerator.is_main_process:\n"
            + "        torch.save(state, 'cache.pt')\n"
            + "    else:\n"
            + "        cache = torch.load('cache.pt')\n",
            8,
            17,
        ),
        Example(  # tatami-galaxy/speech-processing's whisper fine-tuning
            HEADER
            + "from transformers import AutoProcessor\n"
            + "if accelerator.is_local_main_process:\n"
            + "    tokenizer.save_pretrained(args.output_dir)\n"
            + "processor = AutoProcessor.from_pretrained(args.output_dir)\n",
            6,
            13,
        ),
        Example(  # a LoftQ ResNet sweep: CIFAR-10 downloaded by the main process only
            HEADER
            + "from torchvision import datasets\n"
            + "download = accelerator.is_main_process\n"
            + "train_set = datasets.CIFAR10(root='data/', train=True, download=download)\n"
            + "accelerator.wait_for_everyone()\n",
            5,
            13,
        ),
        # the barrier runs every fifth epoch only: on the others the read races the write
        Example(
            _EVERY_EPOCH.format(
                barrier="    if epoch % 5 == 0:\n        accelerator.wait_for_everyone()\n"
            ),
            9,
            13,
        ),
        # the barrier in one arm of an `if`, the read in its `else`: the passes that read are
        # those that skipped it (lf22_212)
        Example(
            _EVERY_EPOCH.format(
                barrier="    if epoch % 5 == 0:\n        accelerator.wait_for_everyone()\n"
                "    else:\n    "
            ),
            10,
            17,
        ),
        # the read under a test spelt as the barrier's, but what it reads changes between
        # them: a pass may skip the barrier and take the read
        Example(
            HEADER
            + "import torch\n"
            + "every = 5\n"
            + "for epoch in range(epochs):\n"
            + "    if accelerator.is_main_process:\n"
            + "        torch.save(accelerator.unwrap_model(model).state_dict(), 'ckpt.pt')\n"
            + "    if epoch % every == 0:\n"
            + "        accelerator.wait_for_everyone()\n"
            + "    every += 1\n"
            + "    if epoch % every == 0:\n"
            + "        state = torch.load('ckpt.pt')\n",
            12,
            17,
        ),
        # ... or the test reads a counter the code between steps (self.global_step += 1)
        Example(_STEP_TESTED_TWICE.format(between="            self.global_step += 1\n"), 19, 25),
        # ... or a name that a function called between may rebind (``global every``)
        Example(
            HEADER
            + "import torch\n"
            + "every = 5\n"
            + "def bump():\n"
            + "    global every\n"
            + "    every += 1\n"
            + "for epoch in range(epochs):\n"
            + "    if accelerator.is_main_process:\n"
            + "        torch.save(accelerator.unwrap_model(model).state_dict(), 'ckpt.pt')\n"
            + "    if epoch % every == 0:\n"
            + "        accelerator.wait_for_everyone()\n"
            + "    bump()\n"
            + "    if epoch % every == 0:\n"
            + "        state = torch.load('ckpt.pt')\n",
            15,
            17,
        ),
        # a barrier in one case of a match: the other epochs read without waiting
        Example(
            _EVERY_EPOCH.format(
                barrier="    match epoch % 5:\n        case 0:\n"
                + "            accelerator.wait_for_everyone()\n"
            ),
            10,
            13,
        ),
        # torchrun passes no --local_rank: the flag keeps its -1 and every rank skips the barrier
        Example(
            _EVERY_EPOCH.format(
                barrier="    if args.local_rank != -1:\n        accelerator.wait_for_everyone()\n"
            ),
            9,
            13,
        ),
        Example(  # accelerator.save writes on the main process only, called by every rank
            HEADER
            + "import torch\n"
            + "accelerator.save(accelerator.unwrap_model(model).state_dict(), 'best.pt')\n"
            + "model.load_state_dict(torch.load('best.pt'))\n",
            5,
            23,
        ),
        # a trainer's save() writes on the main process, and the method that calls it calls
        # load() next, on every rank
        Example(_TRAINER.format(after_save="", before_load="", between=""), 15, 17),
        # the write in a helper of train(), the read in main() itself after it: the prepare
        # above the call is no barrier after the write
        Example(_WRITTEN_IN_TRAIN.format(barrier=""), 17, 27),
        # saved by a helper object to the path its constructor was handed, read back through
        # the attribute that path came from
        Example(_SAVED_BY_A_HELPER_OBJECT.format(barrier="", read="trainer.best_path"), 33, 23),
        Example(_SAVED_BY_A_HELPER_OBJECT.format(barrier="", read="'checkpoints/best.pt'"), 33, 23),
        Example(  # helpers: the save called under the guard, the load by every rank
            HEADER
            + "import torch\n\n\ndef save(model, path):\n    torch.save(model.state_dict(), path)\n"
            + "\n\ndef load(model, path):\n    model.load_state_dict(torch.load(path))\n\n\n"
            + "def main():\n"
            + "    if accelerator.is_main_process:\n"
            + "        save(model, 'best.pt')\n"
            + "    load(model, 'best.pt')\n",
            11,
            27,
        ),
        Example(  # the helper's parameter hides the script's own ``model_path = 'ckpt'``
            HEADER
            + "import torch\n\n\ndef train(model, model_path):\n"
            + "    accelerator.save(model.state_dict(), f'{model_path}/model.bin')\n"
            + "\n\ndef test(model, model_path):\n"
            + "    model.load_state_dict(torch.load(model_path))\n"
            + "\n\nmodel_path = 'ckpt'\ntrain(model, model_path)\n"
            + "test(model, f'{model_path}/model.bin')\n",
            11,
            27,
        ),
        Example(  # the same through a closure: ``inner`` reads ``outer``'s parameter
            HEADER
            + "import torch\n\n\ndef train(model, model_path):\n"
            + "    accelerator.save(model.state_dict(), f'{model_path}/model.bin')\n"
            + "\n\ndef outer(model, model_path):\n"
            + "    def inner():\n"
            + "        model.load_state_dict(torch.load(model_path))\n\n"
            + "    inner()\n"
            + "\n\nmodel_path = 'ckpt'\ntrain(model, model_path)\n"
            + "outer(model, f'{model_path}/model.bin')\n",
            12,
            31,
        ),
        Example(  # the same through a lambda's parameter, at the lambda's call
            HEADER
            + "import torch\n\n\ndef train(model, model_path):\n"
            + "    accelerator.save(model.state_dict(), f'{model_path}/model.bin')\n"
            + "\n\nload = lambda model, model_path: model.load_state_dict(torch.load(model_path))\n"
            + "model_path = 'ckpt'\ntrain(model, model_path)\n"
            + "load(model, f'{model_path}/model.bin')\n",
            10,
            56,
        ),
        # the state dict gathered in the save's arguments: a collective that runs before the
        # write, not between it and the read
        Example(
            _GATHERED_SAVE.format(before="", between="", read="state = torch.load('best.pt')\n"),
            5,
            9,
        ),
        # ... and a barrier above the save, as the conversion puts one there, orders nothing
        # after it
        Example(
            _GATHERED_SAVE.format(
                before="accelerator.wait_for_everyone()\n",
                between="",
                read="state = torch.load('best.pt')\n",
            ),
            6,
            9,
        ),
        # the save in one method of a trainer, the read in another, called one after the other
        Example(_FIT_THEN_TEST.format(between=""), 18, 17),
        # the model saved into a folder on the main process, its weights file read by every rank
        Example(_MODEL_SAVED.format(between=""), 7, 9),
        Example(  # a model unwrapped and told to save on the main process only, read back
            HEADER
            + "from transformers import AutoModel\n"
            + "accelerator.unwrap_model(model).save_pretrained(\n"
            + "    'out', is_main_process=accelerator.is_main_process,\n"
            + "    save_function=accelerator.save,\n"
            + ")\n"
            + "model = AutoModel.from_pretrained('out')\n",
            8,
            9,
        ),
        Example(  # told to write on the main process only, read back by every rank
            HEADER
            + "from transformers import AutoModel\n"
            + "unwrapped = accelerator.unwrap_model(model)\n"
            + "unwrapped.save_pretrained('out', is_main_process=accelerator.is_main_process)\n"
            + "model = AutoModel.from_pretrained('out')\n",
            6,
            9,
        ),
        Example(  # exclusive branches, but the method runs twice: once per mode
            HEADER
            + "import torch\n\n\nclass Runner:\n"
            + "    def __init__(self, mode):\n        self.mode = mode\n\n"
            + "    def run(self):\n"
            + "        if self.mode == 'train':\n"
            + "            accelerator.save(model.state_dict(), 'best.pt')\n"
            + "        elif self.mode == 'eval':\n"
            + "            model.load_state_dict(torch.load('best.pt'))\n\n\n"
            + "Runner('train').run()\nRunner('eval').run()\n",
            14,
            35,
        ),
        Example(  # saved on the main process, loaded in the else: by the others at once
            HEADER
            + "import torch\n"
            + "if accelerator.is_main_process:\n"
            + "    torch.save(accelerator.unwrap_model(model).state_dict(), 'init.pt')\n"
            + "else:\n"
            + "    accelerator.unwrap_model(model).load_state_dict(torch.load('init.pt'))\n",
            7,
            53,
        ),
        Example(  # ... or under the negated test below it
            HEADER
            + "import torch\n"
            + "if accelerator.is_main_process:\n"
            + "    torch.save(state, 'init.pt')\n"
            + "if not accelerator.is_main_process:\n"
            + "    state = torch.load('init.pt')\n",
            7,
            13,
        ),
        # accelerator.save called by every rank, the others read it in their own arm (lintfix24)
        Example(
            HEADER
            + "import torch\n"
            + "accelerator.save(accelerator.get_state_dict(model), 'best.pt')\n"
            + "if not accelerator.is_main_process:\n"
            + "    state = torch.load('best.pt')\n",
            6,
            13,
        ),
        # ... called by every rank and by the main process alone: the wait belongs outside it
        # (review11b; a barrier inside would wait alone in the main-only call)
        Example(
            HEADER
            + "import torch\n\n\ndef save_and_reload(model, path):\n"
            + "    accelerator.save_model(model, path)\n"
            + "    return torch.load(path + '/pytorch_model.bin')\n\n\n"
            + "state = save_and_reload(model, 'last')\n"
            + "if accelerator.is_main_process:\n"
            + "    best = save_and_reload(model, 'best')\n",
            8,
            12,
        ),
        # a helper saves the model into a folder and reads its weights file back at once
        Example(
            HEADER
            + "import torch\n\n\ndef save_and_reload(model, path):\n"
            + "    accelerator.save_model(model, path)\n"
            + "    return torch.load(path + '/pytorch_model.bin')\n",
            8,
            12,
        ),
        # Accelerate's loader of the folder save_model just wrote
        Example(
            HEADER
            + "from accelerate.utils import load_checkpoint_in_model\n"
            + "accelerator.save_model(model, 'out')\n"
            + "load_checkpoint_in_model(accelerator.unwrap_model(model), 'out')\n",
            5,
            1,
        ),
        # the main process writes through open(..., 'w'); every rank opens the file next
        Example(
            HEADER
            + "import json\n"
            + "if accelerator.is_main_process:\n"
            + "    with open('stats.json', 'w') as f:\n"
            + "        json.dump(stats, f)\n"
            + "with open('stats.json') as f:\n"
            + "    stats = json.load(f)\n",
            7,
            6,
        ),
        # a barrier on odd steps only, the write made once above the loop: step 0 reads first
        Example(
            HEADER
            + "import torch\n"
            + "if accelerator.is_main_process:\n"
            + "    torch.save(state, 'init.pt')\n"
            + "for step in range(3):\n"
            + "    if step % 2 == 1:\n"
            + "        accelerator.wait_for_everyone()\n"
            + "        continue\n"
            + "    state = torch.load('init.pt')\n",
            10,
            13,
        ),
    )
    good = (
        # ``path`` bound to another file between the write and the read (review11b)
        HEADER
        + "import torch\n"
        + "path = 'stats.pt'\n"
        + "if accelerator.is_main_process:\n"
        + "    torch.save(stats, path)\n"
        + "path = 'config.pt'\n"
        + "config = torch.load(path)\n",
        # ... on even steps: step 0 waits, after the write and before any pass reads
        HEADER
        + "import torch\n"
        + "if accelerator.is_main_process:\n"
        + "    torch.save(state, 'init.pt')\n"
        + "for step in range(3):\n"
        + "    if step % 2 == 0:\n"
        + "        accelerator.wait_for_everyone()\n"
        + "        continue\n"
        + "    state = torch.load('init.pt')\n",
        # save_pretrained writes the model's own files; another file in the folder (written
        # before, or by someone else) is not its write
        HEADER
        + "import json\nimport os\n"
        + "accelerator.unwrap_model(model).save_pretrained(\n"
        + "    out, is_main_process=accelerator.is_main_process, save_function=accelerator.save\n"
        + ")\n"
        + "with open(os.path.join(out, 'train_args.json')) as f:\n"
        + "    settings = json.load(f)\n",
        # the others read in their own arm after a barrier every rank reached
        HEADER
        + "import torch\n"
        + "accelerator.save(accelerator.get_state_dict(model), 'best.pt')\n"
        + "accelerator.wait_for_everyone()\n"
        + "if not accelerator.is_main_process:\n"
        + "    state = torch.load('best.pt')\n",
        # a barrier between the save and the call of the lambda that loads
        HEADER
        + "import torch\n\n\ndef train(model, model_path):\n"
        + "    accelerator.save(model.state_dict(), f'{model_path}/model.bin')\n"
        + "\n\nload = lambda model, model_path: model.load_state_dict(torch.load(model_path))\n"
        + "model_path = 'ckpt'\ntrain(model, model_path)\naccelerator.wait_for_everyone()\n"
        + "load(model, f'{model_path}/model.bin')\n",
        # the loading helper waits for the save first, wherever its callers saved
        HEADER
        + "import torch\n\n\ndef train(model, model_path):\n"
        + "    accelerator.save(model.state_dict(), f'{model_path}/model.bin')\n"
        + "\n\ndef test(model, model_path):\n    accelerator.wait_for_everyone()\n"
        + "    model.load_state_dict(torch.load(model_path))\n"
        + "\n\nmodel_path = 'ckpt'\ntrain(model, model_path)\n"
        + "test(model, f'{model_path}/model.bin')\n",
        # the readers wait in their own arm for the writer's barrier after its write
        HEADER
        + "import torch\n"
        + "if not accelerator.is_main_process:\n"
        + "    accelerator.wait_for_everyone()\n"
        + "    state = torch.load('init.pt')\n"
        + "else:\n"
        + "    torch.save(state, 'init.pt')\n"
        + "    accelerator.wait_for_everyone()\n",
        # the main process's turn comes first: the others enter once it has written
        HEADER
        + "import torch\n"
        + "with accelerator.main_process_first():\n"
        + "    if accelerator.is_main_process:\n"
        + "        torch.save(torch.randn(10, 4), 'features.pt')\n"
        + "    else:\n"
        + "        features = torch.load('features.pt')\n",
        HEADER
        + "import torch\n"
        + "with accelerator.main_process_first():\n"
        + "    if accelerator.is_main_process:\n"
        + "        torch.save(torch.randn(10, 4), 'features.pt')\n"
        + "    features = torch.load('features.pt')\n",
        # ... or at a barrier between the write's test and the read's
        HEADER
        + "import torch\n"
        + "if accelerator.is_main_process:\n"
        + "    torch.save(state, 'init.pt')\n"
        + "accelerator.wait_for_everyone()\n"
        + "if not accelerator.is_main_process:\n"
        + "    state = torch.load('init.pt')\n",
        # a write and a read in exclusive branches: no run does both
        HEADER
        + "import torch\n"
        + "model = accelerator.prepare(model)\n"
        + "if args.mode == 'train':\n"
        + "    if accelerator.is_main_process:\n"
        + "        torch.save(accelerator.unwrap_model(model).state_dict(), 'model.pt')\n"
        + "elif args.mode == 'eval':\n"
        + "    accelerator.unwrap_model(model).load_state_dict(torch.load('model.pt'))\n",
        # ... also as two ifs comparing the same setting with different constants
        HEADER
        + "import torch\n"
        + "model = accelerator.prepare(model)\n"
        + "if args.mode == 'train':\n"
        + "    accelerator.save(accelerator.unwrap_model(model).state_dict(), 'model.pt')\n"
        + "if args.mode == 'eval':\n"
        + "    accelerator.unwrap_model(model).load_state_dict(torch.load('model.pt'))\n",
        # ... also in a function the run calls once
        HEADER
        + "import torch\n\n\ndef main(mode):\n"
        + "    if mode == 'train':\n"
        + "        accelerator.save(model.state_dict(), 'model.pt')\n"
        + "    if mode == 'eval':\n"
        + "        model.load_state_dict(torch.load('model.pt'))\n\n\n"
        + "main(args.mode)\n",
        # ... or handed once to a command-line runner
        HEADER
        + "import fire\nimport torch\n\n\ndef main():\n"
        + "    if args.mode == 'train':\n"
        + "        accelerator.save(model.state_dict(), 'model.pt')\n"
        + "    elif args.mode == 'eval':\n"
        + "        model.load_state_dict(torch.load('model.pt'))\n\n\n"
        + "fire.Fire(main)\n",
        # the barrier on every epoch; or the write, the barrier and the read all under one
        # test every rank takes alike (every fifth epoch)
        _EVERY_EPOCH.format(barrier="    accelerator.wait_for_everyone()\n"),
        HEADER
        + "import torch\n"
        + "for epoch in range(epochs):\n"
        + "    if epoch % 5 == 0:\n"
        + "        if accelerator.is_main_process:\n"
        + "            torch.save(accelerator.unwrap_model(model).state_dict(), 'ckpt.pt')\n"
        + "        accelerator.wait_for_everyone()\n"
        + "        state = torch.load('ckpt.pt')\n",
        # ... or a barrier in each arm of an `if`, each before its read
        _EVERY_EPOCH.format(
            barrier="    if epoch % 5 == 0:\n        accelerator.wait_for_everyone()\n"
            "        state = torch.load('ckpt.pt')\n"
            "    else:\n        accelerator.wait_for_everyone()\n    "
        ),
        # ... or the barrier and the read each under its own `if` of that same test, nothing
        # it reads bound between them: a pass that reads has waited
        HEADER
        + "import torch\n"
        + "for epoch in range(epochs):\n"
        + "    if accelerator.is_main_process:\n"
        + "        torch.save(accelerator.unwrap_model(model).state_dict(), 'ckpt.pt')\n"
        + "    if epoch % 5 == 0:\n"
        + "        accelerator.wait_for_everyone()\n"
        + "    if epoch % 5 == 0:\n"
        + "        state = torch.load('ckpt.pt')\n",
        # ... also where the test reads a member nothing between changes
        _STEP_TESTED_TWICE.format(between=""),
        # the same with a barrier between train() and the read
        _WRITTEN_IN_TRAIN.format(barrier="    accelerator.wait_for_everyone()\n"),
        _SAVED_BY_A_HELPER_OBJECT.format(
            barrier="accelerator.wait_for_everyone()\n", read="trainer.best_path"
        ),
        # the trainer's methods, ordered by a barrier: before the read, between the calls, or
        # at the end of the save every rank calls
        _TRAINER.format(
            after_save="", before_load="        self.accelerator.wait_for_everyone()\n", between=""
        ),
        _TRAINER.format(
            after_save="", before_load="", between="        self.accelerator.wait_for_everyone()\n"
        ),
        _TRAINER.format(
            after_save="        self.accelerator.wait_for_everyone()\n", before_load="", between=""
        ),
        # accelerator.save writes on the main process only; the barrier orders the read
        HEADER
        + "import torch\n"
        + "accelerator.save(accelerator.unwrap_model(model).state_dict(), 'best.pt')\n"
        + "accelerator.wait_for_everyone()\n"
        + "state = torch.load('best.pt')\n",
        # the conversion's form, a barrier after the save (also one above it), or the read
        # after the main process's turn
        _GATHERED_SAVE.format(
            before="accelerator.wait_for_everyone()\n",
            between="accelerator.wait_for_everyone()\n",
            read="state = torch.load('best.pt')\n",
        ),
        _GATHERED_SAVE.format(
            before="",
            between="",
            read="with accelerator.main_process_first():\n    state = torch.load('best.pt')\n",
        ),
        _FIT_THEN_TEST.format(between="trainer.accelerator.wait_for_everyone()\n"),
        _MODEL_SAVED.format(between="accelerator.wait_for_everyone()\n"),
        HEADER
        + "from transformers import AutoModel\n"
        + "accelerator.unwrap_model(model).save_pretrained(\n"
        + "    'out', is_main_process=accelerator.is_main_process,\n"
        + "    save_function=accelerator.save,\n"
        + ")\n"
        + "with accelerator.main_process_first():\n"
        + "    model = AutoModel.from_pretrained('out')\n",
        # every rank writes the file itself before it reads it (a race among the writes: ACC201)
        HEADER + "import torch\ntorch.save(state, 'last.pt')\nstate = torch.load('last.pt')\n",
        HEADER
        + "from torchvision import datasets\n"
        + "with accelerator.main_process_first():\n"
        + "    train_set = datasets.CIFAR10(root='data/', train=True, download=True)\n"
        + "if accelerator.is_main_process:\n"
        + "    datasets.MNIST('data/', download=accelerator.is_main_process)\n",
        # main-first by hand: the other ranks wait before they build it
        HEADER
        + "from torchvision import datasets\n"
        + "if not accelerator.is_main_process:\n"
        + "    accelerator.wait_for_everyone()\n"
        + "train_set = datasets.CIFAR10('data/', download=accelerator.is_main_process)\n"
        + "if accelerator.is_main_process:\n"
        + "    accelerator.wait_for_everyone()\n",
        HEADER
        + "from transformers import AutoProcessor\n"
        + "if accelerator.is_local_main_process:\n"
        + "    tokenizer.save_pretrained(args.output_dir)\n"
        + "accelerator.wait_for_everyone()\n"
        + "processor = AutoProcessor.from_pretrained(args.output_dir)\n",
        HEADER
        + "import torch\n"
        + "if accelerator.is_main_process:\n"
        + "    torch.save(state, 'best.pt')\n"
        + "with accelerator.main_process_first():\n"
        + "    state = torch.load('best.pt')\n",
        # a barrier on a state object the analysis does not follow (the convert goldens)
        HEADER
        + "import torch\n"
        + "from accelerate import PartialState\n"
        + "if PartialState().is_main_process:\n"
        + "    torch.save(state, 'final.pt')\n"
        + "PartialState().wait_for_everyone()\n"
        + "state = torch.load('final.pt')\n",
        # read on the main process only
        HEADER
        + "import torch\n"
        + "if accelerator.is_main_process:\n"
        + "    torch.save(state, 'best.pt')\n"
        + "    state = torch.load('best.pt')\n",
        # a barrier skipped only by a run of one process, where nobody else reads (review8a)
        _EVERY_EPOCH.format(
            barrier="    if accelerator.num_processes > 1:\n"
            + "        accelerator.wait_for_everyone()\n"
        ),
        _EVERY_EPOCH.format(
            barrier="    if accelerator.state.num_processes >= 2:\n"
            + "        accelerator.wait_for_everyone()\n"
        ),
        HEADER
        + "import torch\n"
        + "from accelerate import DistributedType\n"
        + "world_size = accelerator.num_processes\n"
        + "if accelerator.is_main_process:\n"
        + "    torch.save(state, 'best.pt')\n"
        + "if world_size > 1:\n"
        + "    accelerator.wait_for_everyone()\n"
        + "if accelerator.distributed_type != DistributedType.NO:\n"
        + "    accelerator.wait_for_everyone()\n"
        + "state = torch.load('best.pt')\n",
        # main process first by hand: the others wait above the write, the main process below
        # it; every rank reaches one barrier (moving one out of its test hangs)
        HEADER
        + "import torch\n"
        + "if not accelerator.is_main_process:\n"
        + "    accelerator.wait_for_everyone()\n"
        + "if accelerator.is_main_process:\n"
        + "    torch.save(state, 'cache.pt')\n"
        + "if accelerator.is_main_process:\n"
        + "    accelerator.wait_for_everyone()\n"
        + "state = torch.load('cache.pt')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        yield from self._download_on_one_rank(script)
        facts = facts_of(script)
        for shared, guard in facts.shared_files.read_by_the_other_ranks:
            if _path_rebound_between(script, shared):
                continue
            arm = None  # the readers' own arm of the test that parts them from the writer
            if script.inside(shared.write, guard):
                arm = guard.body if script.inside(shared.read, guard.body) else guard.orelse
            if _ordered_by_a_collective(script, shared.write, shared.read, within=arm):
                continue
            if _taking_turns(script, shared.write, shared.read):
                continue
            accelerator = accelerator_name(script, shared.read)
            barrier = f"{accelerator}.wait_for_everyone()"
            where = (
                f"take this read out of the `if` at line {script.line(guard)}, call {barrier} "
                "below that `if` on every rank, then read the file there (under `if not "
                f"{accelerator}.is_main_process:` if only the other ranks need it)"
                if arm is not None
                else f"call {barrier} above the `if` at line {script.line(guard)}, on every rank"
            )
            yield self.finding(
                script,
                shared.read,
                message=(
                    f"Read this after a barrier every rank reaches: {where}. The ranks that "
                    f"read it here do so while the main process is still writing it at line "
                    f"{script.line(shared.write)}, and find nothing there yet (a first run) "
                    "or half of it"
                ),
            )
        for shared in facts.shared_files.written_by_one_rank_read_by_all:
            if _path_rebound_between(script, shared):
                continue
            if shared.through is not None:
                if not _ordered_across_calls(script, shared):
                    yield self._across_calls(script, shared)
                continue
            if _ordered_by_a_collective(script, shared.write, shared.read):
                continue
            if _taking_turns(script, shared.write, shared.read):
                continue
            if _exclusive(script, shared.write, shared.read):
                continue  # ``if mode == "train": ... save`` / ``elif mode == "eval": ... load``
            accelerator = accelerator_name(script, shared.read)
            branch = _divergent_branch(script, shared.read, shared.write)
            if branch is not None:
                values = _per_rank_values(script, branch)
                message = (
                    f"Make every rank take the branch at line {script.line(branch)} alike, "
                    f"then call {accelerator}.wait_for_everyone() before this read: the file is "
                    f"written at line {script.line(shared.write)} on the main process only and "
                    "read here by every rank that gets here without waiting for the write, and "
                    f"the branch tests {values}, computed by each rank on its own, so the "
                    "ranks may disagree on it and, as it is, a barrier inside it would hang; "
                    f"reduce or gather {values} across the ranks before the test (as a tensor "
                    f"on {accelerator}.device: {accelerator}.reduce(...), "
                    f"{accelerator}.gather(...))"
                )
            elif (split := _called_on_some_ranks_too(script, shared)) is not None:
                message = split
            else:
                message = (
                    f"Call {accelerator}.wait_for_everyone() before this read: the file is "
                    f"written at line {script.line(shared.write)} on the main process only, "
                    "and the other ranks read it here without waiting for the write (nothing "
                    "there yet on a first run, or half of it)"
                )
                skipped = _barriers_between(script, shared.write, shared.read)[1]
                if skipped:
                    call, branch = skipped[-1]  # the one nearest the read
                    kind = "`if`" if isinstance(branch, cst.If) else "`case`"
                    if script.inside(shared.read, branch):
                        message += (
                            f"; the barrier at line {script.line(call)} is in the other arm "
                            f"of the `if` at line {script.line(branch)}, which every pass "
                            "that reads here skips: call it on every pass, above that `if`"
                        )
                    else:
                        message += (
                            f"; the barrier at line {script.line(call)} runs only when "
                            f"{_condition(script, branch)}, so the runs that skip it read "
                            f"without waiting: call it on every pass, outside that {kind}"
                        )
            yield self.finding(script, shared.read, message=message)

    def _across_calls(self, script: ScriptModel, shared: SharedFile) -> Finding:
        """The write and the read in two functions (a trainer's ``save()`` and ``load()``),
        run one after the other by a function of the file: reported at the read, naming the
        write and both calls."""
        assert shared.through is not None
        writing, reading = shared.through
        accelerator = accelerator_name(script, shared.read)
        function = script.index.enclosing_function(shared.read)
        some_ranks = function is not None and any(
            script.under_rank_guard(site) for site, _ in script.call_graph.calls_of(function)
        )
        where = (
            # a barrier in the function would hang its calls on one rank: between the calls
            f"between the calls at lines {script.line(writing)} and {script.line(reading)}"
            if some_ranks or _in_a_lambda(script, shared.read)  # no statement in a lambda
            else f"before this read (or between the calls at lines {script.line(writing)} and "
            f"{script.line(reading)})"
        )
        by_the_read = f", by the call at line {script.line(reading)},"
        if reading is shared.read:  # the function that calls the writer reads it itself
            where = f"before this read (after the call at line {script.line(writing)})"
            by_the_read = ""
        return self.finding(
            script,
            shared.read,
            message=(
                f"Call {accelerator}.wait_for_everyone() {where}: the file is "
                f"written at line {script.line(shared.write)} on the main process only, by the "
                f"call at line {script.line(writing)}, and every rank reads it here{by_the_read} "
                f"without waiting for the write (nothing there "
                "yet on a first run, or half of it)"
            ),
        )

    def _download_on_one_rank(self, script: ScriptModel) -> Iterator[Finding]:
        """``datasets.CIFAR10(root, download=accelerator.is_main_process)`` run by every rank:
        the main process downloads while the others, told not to, load the same folder at once
        and find nothing there on a first run (torchvision's "Dataset not found or corrupted").
        A barrier after the call comes too late; ``main_process_first()`` around it orders the
        download before the other ranks' loads, and there ``download=True`` finds the files."""
        ranks = facts_of(script).ranks
        for call in script.calls:
            flag = next(
                (a.value for a in call.args if a.keyword and a.keyword.value == "download"), None
            )
            if flag is None or not script.reads_rank(flag):
                continue
            if ranks.under_rank_guard(call) or _in_main_process_first(script, call):
                continue
            if _other_ranks_wait_before(script, call):
                continue
            accelerator = accelerator_name(script, call)
            yield self.finding(
                script,
                call,
                message=(
                    f"Build this under `with {accelerator}.main_process_first():` with "
                    "download=True: with the download on the main process only, the other ranks "
                    "load the same folder while it is still downloading (dataset not found on a "
                    "first run)"
                ),
            )


def _divergent_branch(script: ScriptModel, read: cst.Call, write: cst.Call) -> cst.CSTNode | None:
    """The branch the ranks may disagree on (``if total < best:`` on a per-rank total) that the
    read runs under, where a barrier before it would be reached by some ranks only: the
    outermost one around both the write and the read, or one around the read alone."""
    facts = facts_of(script)
    statement = next(
        (a for a in script.ancestors(read) if isinstance(a, cst.SimpleStatementLine)), read
    )
    places = facts.ranks.barrier_places(statement)
    found = next((place for place in places if facts.placement.inside(write, place)), None)
    if found is None:
        found = next(
            (b for b in map(facts.shared_files.divergent_around, places) if b is not None), None
        )
    if not (isinstance(found, cst.If) and alike_by_its_callers(script, found.test)):
        return found
    # ``def run(stage): if stage == "fit":`` run as ``run("fit")``: every rank takes it alike;
    # the read's other branches may still be the ranks' own
    ranks = facts.ranks
    function = facts.placement.enclosing_function(read)
    return next(
        (
            branch
            for branch in reversed(list(script.ancestors(read)))
            if isinstance(branch, cst.If)
            and facts.placement.enclosing_function(branch) is function
            and not ranks.uniform(branch.test)
            and not alike_by_its_callers(script, branch.test)
        ),
        None,
    )


def _per_rank_values(script: ScriptModel, branch: cst.CSTNode) -> str:
    """The values the branch's test reads that the ranks may not share (``total`` of ``if
    total < best:``), as code: a name set only from another of them (``best = total``) or from
    a constant (``best = float("inf")``) follows it and is left out."""
    test = branch.test if isinstance(branch, cst.If) else branch
    if not isinstance(test, cst.BaseExpression):
        return "a value"
    ranks = facts_of(script).ranks
    read = [
        n.value
        for n in walk(test)
        if isinstance(n, cst.Name) and not is_attribute_name(script, n) and not ranks.uniform(n)
    ]
    read = list(dict.fromkeys(read))
    own = [
        name
        for name in read
        if not all(
            _reads(script, value) <= set(read) - {name} for value in _values_of(script, name)
        )
        or not _values_of(script, name)
    ]
    chosen = own or read
    if not chosen:
        return f"`{script.module.code_for_node(test)}`"
    return " and ".join(f"`{name}`" for name in chosen)


def _reads(script: ScriptModel, value: cst.BaseExpression) -> set[str]:
    """The variables ``value`` reads, not the functions it calls (``float`` of ``float("inf")``)."""
    called = {id(n.func) for n in walk(value) if isinstance(n, cst.Call)}
    return variables_in(script, value) - {
        n.value for n in walk(value) if isinstance(n, cst.Name) and id(n) in called
    }


def _values_of(script: ScriptModel, name: str) -> list[cst.BaseExpression]:
    return [
        assign.value
        for assign in script.assignments
        if any(name in target_names(t) for t in assigned_targets(assign))
    ] + [
        node.value
        for node in script.index.of_type(cst.AugAssign)
        if name in target_names(node.target)
    ]


def _other_ranks_wait_before(script: ScriptModel, call: cst.Call) -> bool:
    """A barrier under a rank test above ``call`` in its function (``if not
    accelerator.is_main_process: accelerator.wait_for_everyone()``): main-first by hand, the
    other ranks build the dataset only once the main process has downloaded it."""
    ranks = facts_of(script).ranks
    function = script.index.enclosing_function(call)
    return any(
        isinstance(barrier.func, cst.Attribute)
        and barrier.func.attr.value in ("wait_for_everyone", "barrier")
        and script.order(barrier) < script.order(call)
        and script.index.enclosing_function(barrier) is function
        and ranks.under_rank_guard(barrier)
        for barrier in script.calls
    )


def _in_main_process_first(script: ScriptModel, node: cst.CSTNode) -> bool:
    return any(_takes_turns(ancestor) for ancestor in script.ancestors(node))


def _taking_turns(script: ScriptModel, write: cst.CSTNode, read: cst.CSTNode) -> bool:
    """The read sits in a ``with accelerator.main_process_first():`` (or the local one) that
    holds the write too, or that comes after it: the other ranks wait at its entry until the
    main process has left it, so whatever the main process wrote before leaving is there when
    they read (``with main_process_first(): if is_main: torch.save(...) else: torch.load(...)``)."""
    for ancestor in script.ancestors(read):
        turns = _turns_taken(ancestor)
        if turns and (
            script.inside(write, ancestor) or script.order(write) < script.order(ancestor)
        ):
            if "local_main_process_first" in turns and not _written_per_machine(script, write):
                continue  # each machine's first process goes first: not rank 0 alone
            return True
    return False


def _written_per_machine(script: ScriptModel, write: cst.CSTNode) -> bool:
    """The write's rank test is the machine's own (``is_local_main_process``, the local rank)."""
    code = script.module.code_for_node
    return any(
        isinstance(ancestor, cst.If) and "local" in code(ancestor.test)
        for ancestor in script.ancestors(write)
    )


def _takes_turns(node: cst.CSTNode) -> bool:
    return bool(_turns_taken(node))


def _turns_taken(node: cst.CSTNode) -> set[str]:
    """The ``main_process_first()`` kinds a ``with`` enters: the global one lets rank 0 go
    first; the local one, each machine's first process (on several machines a file the global
    main process writes is read before it is there)."""
    if not isinstance(node, cst.With):
        return set()
    return {
        item.item.func.attr.value
        for item in node.items
        if isinstance(item.item, cst.Call)
        and isinstance(item.item.func, cst.Attribute)
        and item.item.func.attr.value in ("main_process_first", "local_main_process_first")
    }


def _ordered_across_calls(script: ScriptModel, shared: SharedFile) -> bool:
    """`_ordered_by_a_collective` for a write and a read in two functions: a barrier every rank
    reaches after the write in its function, between the two calls in the function that makes
    them, or before the read in its own."""
    assert shared.through is not None
    writing, reading = shared.through
    index = script.index
    never = len(script.orders) + 1
    read_order = script.order(shared.read)
    # where the function that makes the calls reads (or writes) itself, a barrier there counts
    # only between its call and the read (``train(...)`` writes inside, then ``torch.load``):
    # the ``prepare`` above the call is no barrier after the write
    since = script.order(writing) if reading is shared.read else -1
    until = script.order(reading) if writing is shared.write else never
    return (
        _collective_between(
            script,
            index.enclosing_function(writing),
            script.order(writing),
            script.order(reading),
            writing,
        )
        or (
            # a lambda's body holds no barrier: the code around where it is written is not
            # what runs before its read (its calls are, `reading`)
            not _in_a_lambda(script, shared.read)
            and _collective_between(
                script, index.enclosing_function(shared.read), since, read_order, writing
            )
        )
        or _collective_between(
            script,
            index.enclosing_function(shared.write),
            script.order(shared.write),
            until,
            shared.write,
        )
        or _in_main_process_first(script, shared.read)
    )


def _in_a_lambda(script: ScriptModel, node: cst.CSTNode) -> bool:
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, cst.Lambda):
            return True
        if isinstance(ancestor, cst.FunctionDef):
            return False
    return False


def _collective_between(
    script: ScriptModel, function: cst.FunctionDef | None, low: int, high: int, write: cst.Call
) -> bool:
    """A barrier or other collective in ``function`` (the module's own code for None) between
    the two source orders, not under a rank test, nor among the arguments of ``write`` (the
    write, or the call that runs it): those run before it writes (`_before_the_write`)."""
    reach = facts_of(script).collective_reach
    for call in script.calls:
        if not low < script.order(call) < high or _before_the_write(script, call, write):
            continue
        if script.index.enclosing_function(call) is not function:
            continue
        if script.under_rank_guard(call):
            continue
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _BARRIERS:
            return True
        parent = script.parent(call)
        if parent is not None and reach.synchronising_in(parent) is not None:
            return True
    return False


def _ordered_by_a_collective(
    script: ScriptModel, write: cst.Call, read: cst.Call, within: cst.CSTNode | None = None
) -> bool:
    """A barrier, ``prepare`` or other collective between ``write`` and ``read`` (or around the
    read, ``main_process_first()``): every rank waits there for the main process. ``within``:
    only one in it before the read counts (the reading ranks' own arm of the rank test that
    parts them from the writer: a barrier after the write in the writer's arm is one the
    readers never reach)."""
    return bool(_barriers_between(script, write, read, within)[0])


def _barriers_between(
    script: ScriptModel, write: cst.Call, read: cst.Call, within: cst.CSTNode | None = None
) -> tuple[list[cst.Call], list[tuple[cst.Call, cst.If | cst.MatchCase]]]:
    """The collectives between ``write`` and ``read`` (`_ordered_by_a_collective`) that run
    whenever both do, and those in a branch that neither the write nor the read is in (``if
    epoch % 5 == 0: accelerator.wait_for_everyone()``, then a read every epoch), each with that
    branch: on the runs that skip it the read races the write all the same."""
    reach = facts_of(script).collective_reach
    function = script.index.enclosing_function(read)
    start, end = script.order(write if within is None else within), script.order(read)
    always: list[cst.Call] = []
    sometimes: list[tuple[cst.Call, cst.If | cst.MatchCase]] = []
    for call in script.calls:
        if not start < script.order(call) < end or call is read:
            continue
        if _before_the_write(script, call, write):
            continue
        if script.index.enclosing_function(call) is not function:
            continue
        named = isinstance(call.func, cst.Attribute) and call.func.attr.value in _BARRIERS
        parent = script.parent(call)
        found = None if named or parent is None else reach.synchronising_in(parent)
        if not named and (found is None or not (found is call or script.inside(found, call))):
            # ``PartialState().wait_for_everyone()``, ``dist.barrier()`` are named; a call that
            # reaches no collective itself is none, also where its statement's block holds one
            # (``range(3)`` of a ``for`` whose body waits only on some passes)
            continue
        branch = _skipped_branch(script, call, write, read)
        if branch is None or _taken_on_the_first_pass(script, branch, write):
            always.append(call)
        else:
            sometimes.append((call, branch))
    return always, sometimes


def _path_rebound_between(script: ScriptModel, shared: SharedFile) -> bool:
    """The write's path is a name (``path``) that the read also reads, and the name was bound
    to another value between them (``path = "stats.json"`` for the write, ``path =
    "config.json"`` for the read): two files, though spelled alike (review11b: a script that
    reuses ``path`` was told to wait for a write of another file)."""
    path = shared.path
    if not isinstance(path, cst.Name) or shared.through is not None:
        return False
    name = path.value
    argument = next((a.value for a in shared.read.args if a.keyword is None and not a.star), None)
    if argument is None:
        return False
    read_path = facts_of(script).shared_files.opened_path(argument)
    if name not in variables_in(script, read_path):
        return False
    at_write = last_binding(script, name, shared.write)
    at_read = last_binding(script, name, shared.read)
    return (
        isinstance(at_write, cst.Assign)
        and isinstance(at_read, cst.Assign)
        and at_write is not at_read
        and script.module.code_for_node(at_write.value).strip()
        != script.module.code_for_node(at_read.value).strip()
    )


def _called_on_some_ranks_too(script: ScriptModel, shared: SharedFile) -> str | None:
    """The advice where the function that writes and reads the file is also called under a
    rank test: a barrier inside it would wait alone in that call (hang), so the wait belongs
    at the calls every rank makes, after a call that only writes (review11b: a helper that
    saves the model and loads its weights file back, called by every rank and by the main
    process alone, was told to wait inside)."""
    function = script.index.enclosing_function(shared.read)
    if function is None or script.index.enclosing_function(shared.write) is not function:
        return None
    sites = [site for site, _ in script.call_graph.calls_of(function)]
    guarded = [site for site in sites if script.under_rank_guard(site)]
    everyone = [site for site in sites if not script.under_rank_guard(site)]
    if not guarded or not everyone:
        return None
    accelerator = accelerator_name(script, shared.read)
    name = function.name.value
    lines = ", ".join(str(script.line(site)) for site in everyone)
    return (
        f"Wait for the write before this read, outside {name}(): the file is written at line "
        f"{script.line(shared.write)} on the main process only, and the other ranks read it "
        "here without waiting (nothing there yet on a first run, or half of it); "
        f"{name}() is also called on some ranks only (line {script.line(guarded[0])}), where "
        f"{accelerator}.wait_for_everyone() inside it would wait alone (hang): have {name}() "
        f"only write, and at the calls every rank makes (line {lines}) call "
        f"{accelerator}.wait_for_everyone() after it, then read the file there"
    )


def _taken_on_the_first_pass(
    script: ScriptModel, branch: cst.If | cst.MatchCase, write: cst.Call
) -> bool:
    """``for step in range(n): if step % 2 == 0: accelerator.wait_for_everyone()`` below a
    write made once, above the loop: the first pass (``step == 0``) takes the barrier, after
    the write and before any pass reads, so every later read is ordered. Only a test of the
    loop's own counter and constants, the loop a ``range`` with a constant start, and the write
    outside that loop (a write made again each pass needs a barrier on each)."""
    if not isinstance(branch, cst.If):
        return False
    loop = next((a for a in script.ancestors(branch) if isinstance(a, cst.For | cst.While)), None)
    if (
        not isinstance(loop, cst.For)
        or script.inside(write, loop)
        or not isinstance(loop.target, cst.Name)
        or not isinstance(loop.iter, cst.Call)
        or dotted(loop.iter.func) != "range"
        or not loop.iter.args
        or any(a.keyword is not None or a.star for a in loop.iter.args)
    ):
        return False
    start = loop.iter.args[0].value if len(loop.iter.args) > 1 else cst.Integer("0")
    if not isinstance(start, cst.Integer):
        return False
    counter = loop.target.value
    allowed = (
        cst.Comparison, cst.ComparisonTarget, cst.BinaryOperation, cst.UnaryOperation,
        cst.BooleanOperation, cst.Integer, cst.Name, cst.BaseBinaryOp, cst.BaseCompOp,
        cst.BaseUnaryOp, cst.BaseBooleanOp, cst.BaseParenthesizableWhitespace,
        cst.LeftParen, cst.RightParen,
    )  # fmt: skip
    for node in walk(branch.test):
        if (
            not isinstance(node, allowed)
            or isinstance(node, cst.Power | cst.LeftShift)  # no huge number to compute
            or (isinstance(node, cst.Name) and node.value != counter)
        ):
            return False
    code = script.module.code_for_node(branch.test)  # the counter, integers and operators only
    try:
        return bool(eval(code, {"__builtins__": {}}, {counter: start.evaluated_value}))
    except (ArithmeticError, TypeError, ValueError):
        return False


def _before_the_write(script: ScriptModel, call: cst.Call, write: cst.Call) -> bool:
    """``call`` is among ``write``'s arguments (``accelerator.save(accelerator.get_state_dict(
    model), path)``, the form the conversion writes): a collective there runs before the
    main process writes, so it orders nothing after the write, below it in source order as
    it is."""
    return call is not write and script.inside(call, write)


def _skipped_branch(
    script: ScriptModel, call: cst.Call, write: cst.CSTNode, read: cst.CSTNode
) -> cst.If | cst.MatchCase | None:
    """The innermost ``if`` (or ``case``) whose body (or ``else``) holds ``call`` and neither
    ``write`` nor ``read``: a run may take the write and the read and skip ``call``; also one
    whose other arm holds the read (``if epoch % 5 == 0: accelerator.wait_for_everyone()``
    ``else: state = torch.load(...)``: the pass that reads is the pass that skipped). Not one
    whose test holds whenever several processes run (``if accelerator.num_processes > 1:``: a
    run of one has nobody to wait for), nor a rank test (``if not accelerator.is_main_process:
    accelerator.wait_for_everyone()`` above the write and ``if accelerator.is_main_process:
    accelerator.wait_for_everyone()`` below it, main-process-first by hand: every rank reaches
    one of them, and moving one out of its test hangs). ``if args.local_rank != -1:`` is still
    one: under ``torchrun`` the flag keeps its default and the barrier is skipped."""
    child: cst.CSTNode = call
    for ancestor in script.ancestors(call):
        if isinstance(ancestor, cst.FunctionDef):
            return None
        holds = not script.inside(write, ancestor) and not script.inside(read, ancestor)
        if isinstance(ancestor, cst.MatchCase) and holds:
            return ancestor
        other_arm = (
            isinstance(ancestor, cst.If)
            and child is not ancestor.test
            and not script.inside(read, child)
            and not script.inside(write, child)
        )
        if isinstance(ancestor, cst.If) and child is not ancestor.test and (holds or other_arm):
            test = ancestor.test
            several = several_processes(script, test, ancestor)
            by_rank = script.reads_rank(test) and not _launch_test(script, test)
            if not (several or by_rank or _read_under_the_same_test(script, ancestor, call, read)):
                return ancestor
        child = ancestor
    return None


def _read_under_the_same_test(
    script: ScriptModel, branch: cst.If, barrier: cst.Call, read: cst.CSTNode
) -> bool:
    """``if epoch % 5 == 0: accelerator.wait_for_everyone()``, then ``if epoch % 5 == 0: state =
    torch.load(...)``: the read sits in the same arm of a later ``if`` of the same function
    whose test is spelt the same, calls nothing, and reads no name bound between the two: a run
    that reads has passed the barrier. (A test that differs between the ranks is excluded
    before: `_skipped_branch` leaves rank tests alone.)"""
    arm = "body" if script.inside(barrier, branch.body) else "orelse"
    if any(isinstance(node, cst.Call) for node in walk(branch.test)):
        return False
    spelled = _spelling(script, branch.test)
    function = script.index.enclosing_function(branch)
    start = script.order(branch)
    for ancestor in script.ancestors(read):
        if isinstance(ancestor, cst.FunctionDef):
            return False
        if not (
            isinstance(ancestor, cst.If)
            and script.order(ancestor) > start
            and script.index.enclosing_function(ancestor) is function
            and _spelling(script, ancestor.test) == spelled
        ):
            continue
        held = ancestor.body if arm == "body" else ancestor.orelse
        if held is None or not script.inside(read, held):
            continue
        waited = branch.body if arm == "body" else branch.orelse
        return _test_unchanged(script, branch, waited, ancestor)
    return False


def _test_unchanged(
    script: ScriptModel, first: cst.If, waited: cst.CSTNode, second: cst.If
) -> bool:
    """Nothing run between ``first``'s test and ``second``'s may change what the (same) test
    reads, so both give the same answer: no binding of any kind of a name it reads between
    them (`binding_spellings`: an assignment, a ``for``, an import, a ``with ... as``, a
    ``match`` capture, a ``del``), none declared ``global`` or ``nonlocal`` anywhere (a call
    between may rebind it), and where it reads a member or an item (``self.global_step``,
    ``flags[0]``), no call and no assignment at all between (``self.global_step += 1``, a
    method that counts) outside the arm that ``waited`` (a pass that ran it has waited): a
    pass may otherwise skip the barrier and take the read."""
    start, end = script.order(first), script.order(second)
    for name in _reads(script, second.test):
        for spelled in binding_spellings(script, name):
            if isinstance(script.parent(spelled), cst.NameItem):
                return False  # ``global every``: whatever a call runs may rebind it
            if start < script.order(spelled) < end:
                return False
    if not any(isinstance(n, (cst.Attribute, cst.Subscript)) for n in walk(second.test)):
        return True
    changing = (
        *script.calls,
        *script.index.of_type((cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Del)),
    )
    return not any(
        start < script.order(node) < end and not script.inside(node, waited) for node in changing
    )


def _spelling(script: ScriptModel, test: cst.BaseExpression) -> str:
    return "".join(script.module.code_for_node(test).split())


def _launch_test(script: ScriptModel, test: cst.BaseExpression) -> bool:
    """``args.local_rank != -1`` (or ``== -1``, ``>= 0``, ``> -1``): whether a launcher passed a
    rank flag, not which rank this is; ``torchrun`` passes none, so every rank skips it."""
    code = "".join(ch for ch in script.module.code_for_node(test) if not ch.isspace())
    return any(code.endswith(tail) for tail in ("!=-1", "==-1", ">-1", ">=0", "<0"))


def _condition(script: ScriptModel, branch: cst.If | cst.MatchCase) -> str:
    """How the message names what a skipped barrier waits on: `epoch % 5 == 0` (line 9),
    `case 0` of `match epoch % 5` (line 10)."""
    code = script.module.code_for_node
    if isinstance(branch, cst.If):
        return f"`{code(branch.test)}` (line {script.line(branch)})"
    match = script.parent(branch)
    subject = f" of `match {code(match.subject)}`" if isinstance(match, cst.Match) else ""
    return f"`case {code(branch.pattern)}`{subject} (line {script.line(branch)})"


#: Barriers by their own name, whatever object answers them.
_BARRIERS = {"wait_for_everyone", "barrier", "main_process_first", "local_main_process_first"}


def _exclusive(script: ScriptModel, write: cst.CSTNode, read: cst.CSTNode) -> bool:
    """No run does both: they sit in two branches of one ``if``/``elif``/``else`` chain, or
    under two ``if``s that compare the same name with different constants (``if mode ==
    "train":`` ... ``if mode == "eval":``), with no loop around either in their function (a
    loop could take one branch, then the other). Only where both run at most once per run and
    every tested name is bound once per run: ``Runner("train").run(); Runner("eval").run()``
    takes the save branch in one call and the load branch in the next."""
    if not (_runs_once(script, write) and _runs_once(script, read)):
        return False
    ranks = facts_of(script).ranks

    def alike(test: cst.BaseExpression) -> bool:  # not a rank's own test
        return ranks.uniform(test) or alike_by_its_callers(script, test)

    for branch in script.ancestors(write):
        if isinstance(branch, cst.If):
            chain = branch
            while isinstance(parent := script.parent(chain), cst.If) and parent.orelse is chain:
                chain = parent
            if (
                script.inside(read, chain)
                and not _same_arm(script, write, read, chain)
                and all(alike(test) for test in _tests(chain))
                and all(_bound_once(script, test) for test in _tests(chain))
            ):
                return True
    tested = {
        _compared_with_constant(b)
        for b in script.ancestors(write)
        if isinstance(b, cst.If) and alike(b.test)
    }
    for branch in script.ancestors(read):
        if isinstance(branch, cst.If) and alike(branch.test):
            name, constant = _compared_with_constant(branch)
            if (
                name is not None
                and _bound_once(script, branch.test)
                and any(name == other and constant != value for other, value in tested if other)
            ):
                return True
    return False


def _tests(chain: cst.If) -> list[cst.BaseExpression]:
    """The tests of an ``if``/``elif`` chain."""
    found = []
    arm: cst.BaseSuite | cst.If | cst.Else | None = chain
    while isinstance(arm, cst.If):
        found.append(arm.test)
        arm = arm.orelse
    return found


def _same_arm(script: ScriptModel, write: cst.CSTNode, read: cst.CSTNode, chain: cst.If) -> bool:
    """``write`` and ``read`` are in the same arm of the ``if``/``elif``/``else`` ``chain``."""
    arm: cst.CSTNode | None = chain
    while arm is not None:
        body = arm.body if isinstance(arm, (cst.If, cst.Else)) else None
        if body is not None and script.inside(write, body):
            return script.inside(read, body)
        arm = arm.orelse if isinstance(arm, cst.If) else None
    return True


def _compared_with_constant(branch: cst.If) -> tuple[str | None, str | None]:
    """``("args.mode", "'train'")`` for ``if args.mode == "train":``; else ``(None, None)``."""
    test = branch.test
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
    ):
        left, right = test.left, test.comparisons[0].comparator
        if isinstance(right, (cst.SimpleString, cst.Integer)) and dotted(left) is not None:
            return dotted(left), str(right.evaluated_value)
    return None, None


def _runs_once(script: ScriptModel, node: cst.CSTNode, depth: int = 0) -> bool:
    """``node`` runs at most once per run: in no loop of its function, and that function (and
    each function calling it, in turn) has one known call site in the file, itself run once,
    or is handed once to a runner (``fire.Fire(main)``). False where unsure (no call site
    seen, called through a value, recursion)."""
    if depth > 8 or _in_a_loop(script, node):
        return False
    function = script.index.enclosing_function(node)
    if function is None:
        return True
    graph = script.call_graph
    callers = graph.callers(function)
    references = graph.references(function)
    if graph.uncertain_callers(function) or len(callers) + len(references) != 1:
        return False
    if callers:
        return _runs_once(script, callers[0], depth + 1)
    # handed to a command-line runner once (``fire.Fire(main)``, ``tyro.cli(main)``)
    handed = script.parent(references[0])
    runner = script.parent(handed) if isinstance(handed, cst.Arg) else None
    return isinstance(runner, cst.Call) and _runs_once(script, runner, depth + 1)


def _bound_once(script: ScriptModel, test: cst.BaseExpression) -> bool:
    """Every name ``test`` reads keeps one value for the run: not a ``self.`` attribute (an
    instance is made per call: ``Runner("train")`` then ``Runner("eval")``) unless its class
    is instantiated once, and a plain name with one binding in its scope (a parameter counts
    once: the function runs once, `_runs_once`)."""
    for node in walk(test):
        if not isinstance(node, (cst.Name, cst.Attribute)):
            continue
        name = dotted(node)
        if name is None:
            continue
        if name.startswith("self."):
            owner = script.index.enclosing_class(test)
            if owner is None or not _instantiated_once(script, owner):
                return False
        elif isinstance(node, cst.Name):
            scope = script.scope_of(test)
            bindings = [
                value for bound, value in script.index.values_bound_to(name)
                if script.scope_of(bound) is scope
            ]  # fmt: skip
            if len(bindings) > 1:
                return False
    return True


def _instantiated_once(script: ScriptModel, owner: cst.ClassDef) -> bool:
    """``owner`` (and no subclass in the file) is built by one call in the file, run once."""
    name = owner.name.value
    built = [
        call for call in script.calls
        if isinstance(call.func, cst.Name) and call.func.value == name
    ]  # fmt: skip
    subclassed = any(
        isinstance(node, cst.ClassDef) and any(dotted(b.value) == name for b in node.bases)
        for node in walk(script.module)
    )
    return len(built) == 1 and not subclassed and _runs_once(script, built[0])


def _in_a_loop(script: ScriptModel, node: cst.CSTNode) -> bool:
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(ancestor, (cst.For, cst.While)):
            return True
    return False
