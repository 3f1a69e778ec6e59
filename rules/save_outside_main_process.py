from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.agreed_values import dumps_agreed
from accelify.analysis.collectives import (
    EVERY_BACKEND,
    FULL_WEIGHTS_GATHERED,
    backends_in_view,
    named,
)
from accelify.analysis.facts import facts_of
from accelify.analysis.repeated_effects import RepeatedEffect
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, walk
from accelify.lint.rule import (
    HEADER,
    WRITE_ATOMIC_PER_PROCESS,
    Example,
    Finding,
    Rule,
    accelerator_at,
    accelerator_name,
)

if TYPE_CHECKING:
    from accelify.edits.plan import Plan

_HF = "from accelerate import Accelerator, DistributedType\naccelerator = Accelerator()\n"


class SaveOutsideMainProcess(Rule):
    """A file written on every rank (``torch.save``, ``save_pretrained``, safetensors'
    ``save_file``, ``np.save``, ``json.dump``, ``save_image``, ``savefig``, ``torchaudio.save``...,
    or through a handle opened for writing: ``log.write(...)``, ``print(..., file=log)``,
    ``csv.writer(log).writerow(...)``, reported once per opened file): N processes write the same
    path at once, the writes race, and a reader can see a truncated file. A path made per
    process (a temporary directory, a pid) is a file of each rank's own. A write in a
    function counts when every rank calls the function; it is reported at the write, where a
    guard fixes it (or ``is_main_process=`` for ``save_pretrained``), and at a call site only
    when other call sites of the same function run it on the main process alone (never for a
    function that reaches ``prepare``, ``backward`` or a collective: that must run everywhere).
    ``accelerator.save`` writes on the main process only, to a temporary name that is then
    renamed. In a loop over a prepared DataLoader, one file per batch named by the loop's
    counter (``f"{i}.pt"``) collides across ranks (each counts its shard from 0): the advice is
    a global index, not a guard; named by the batch itself, each rank's files are its own.
    Small files every rank writes with the same bytes (a tokenizer's or a config's
    ``save_pretrained``, the settings dumped to JSON, and the metrics of an evaluation the
    script gathers, dumped to JSON or YAML: ``json.dump({"accuracy": acc}, f)`` where ``acc``
    was folded from ``gather_for_metrics``' output, or computed by an ``evaluate`` metric fed
    it, `agreed_values`) before a barrier, or with nothing reading them after, are whole when
    read: not reported. Measured (ext4, 4 processes
    dumping one 40 kB JSON to one path at once, 300 rounds): after every writer has closed, the
    file was whole in every round (each open truncates, then writes the same bytes at the same
    offsets); a process that read it right after its own write, with no barrier, saw it torn in
    28 rounds. So the race is the read, which a barrier (or no read at all) removes; a value of
    this rank's own (``loss.item()`` of its batch) differs between the writers and is
    reported."""

    code = "ACC201"
    # a save outside the rank test of a name bound only under it (a diffusion trainer's
    # ``pipeline = DDPMPipeline(...)`` under ``is_main_process``, ``pipeline.save_pretrained``
    # after it): ACC209 sees the unbound read; the guard this finding advises fixes both
    covers = ("ACC209",)
    name = "save-outside-main-process"
    message = (
        "Save on the main process only: accelerator.save(...) "
        "or guard with accelerator.is_main_process"
    )
    why = "N processes writing one path race; the file can be truncated or mixed."
    bad = (
        # a motion-field diffusion trainer: each rank's own losses, logged to one spreadsheet
        # by every rank after each epoch
        Example(
            HEADER
            + "import pandas as pd\n"
            + "model, loader = accelerator.prepare(model, loader)\n"
            + "log = []\n"
            + "for epoch in range(10):\n"
            + "    for x in loader:\n"
            + "        loss = model(x).mean()\n"
            + "        accelerator.backward(loss)\n"
            + "    log.append([epoch, loss.item()])\n"
            + "    pd.DataFrame(log).to_excel('training_log.xlsx', index=False)\n",
            11,
            5,
        ),
        # /dev/shm is a folder every process of the machine shares, not a process's own file
        Example(
            HEADER + "with open('/dev/shm/status.txt', 'w') as f:\n    f.write('done')\n",
            4,
            5,
        ),
        # this rank's own loss, dumped by every rank: different bytes into one file
        Example(
            HEADER
            + "import json\n\n\n"
            + "def main(model, loader):\n"
            + "    model, loader = accelerator.prepare(model, loader)\n"
            + "    for x, y in loader:\n"
            + "        loss = model(x).sum()\n"
            + "    with open('results.json', 'w') as f:\n"
            + "        json.dump({'loss': loss.item()}, f)\n",
            11,
            9,
        ),
        Example(
            HEADER + "import torch\ntorch.save(state, 'ckpt.pt')\n",
            4,
            1,
            HEADER
            + "import torch\naccelerator.wait_for_everyone()\naccelerator.save(state, 'ckpt.pt')\n",
        ),
        Example(
            HEADER + "import json\nwith open('m.json', 'w') as f:\n    json.dump(m, f)\n", 5, 5
        ),
        Example(HEADER + "model.save_pretrained('out')\n", 3, 1),
        # a vocoder's sample written by every rank: audio writers are file writers too
        Example(
            HEADER + "import torchaudio\ntorchaudio.save('sample.wav', wav, sample_rate=22050)\n",
            4,
            1,
        ),
        # a GAN trainer's CSV log: opened on every rank, a row written through its csv writer
        # per epoch; the advice names the open
        Example(
            HEADER + "import csv\nlog = open('log.csv', 'w', newline='')\n"
            "writer = csv.writer(log)\nfor epoch in range(3):\n"
            "    writer.writerow([epoch, train(epoch)])\nlog.close()\n",
            7,
            5,
        ),
        # a data-influence script saving its scored dataset: each rank's shard of scores, one path
        Example(HEADER + "scored.save_to_disk(args.scores_path)\n", 3, 1),
        Example(  # at the write: the function is called by every rank
            HEADER + "import torch\n\n\ndef save(path):\n    torch.save(state, path)\n\n\n"
            "save('a.pt')\n",
            7,
            5,
        ),
        Example(  # main() prepares: never "call main() on the main process only"
            "import json\nfrom accelerate import Accelerator\n\n\ndef main():\n"
            "    accelerator = Accelerator()\n"
            "    model = accelerator.prepare(model)\n"
            "    with open('metrics.json', 'w') as f:\n"
            "        json.dump(metrics, f)\n\n\nmain()\n",
            9,
            9,
        ),
        Example(  # called guarded once and unguarded once: the unguarded call is the bug
            HEADER + "import json\n\n\ndef dump(path):\n"
            "    with open(path, 'w') as f:\n        json.dump(metrics, f)\n\n\n"
            "if accelerator.is_main_process:\n    dump('a.json')\ndump('b.json')\n",
            13,
            1,
        ),
        Example(
            _HF + "import numpy as np\n"
            "if accelerator.is_main_process or "
            "accelerator.distributed_type == DistributedType.DEEPSPEED:\n"
            "    np.save('preds.npy', preds)\n",
            5,
            5,
        ),
        Example(  # get_state_dict gathers under FSDP: no guard around it, accelerator.save
            HEADER + "import torch\ntorch.save(accelerator.get_state_dict(model), 'm.pt')\n",
            4,
            1,
            HEADER + "import torch\naccelerator.wait_for_everyone()\n"
            "accelerator.save(accelerator.get_state_dict(model), 'm.pt')\n",
        ),
        Example(  # under FSDP the advice is is_main_process=, never a guard (it would hang)
            HEADER + "fsdp = accelerator.state.fsdp_plugin is not None\n"
            "model = accelerator.prepare(model)\nmodel.save_pretrained('out')\n",
            5,
            1,
        ),
        Example(  # a Trainer's model under an FSDP plugin (Tower SFT): is_main_process=, no `if`
            "from accelerate import Accelerator, FullyShardedDataParallelPlugin\n"
            "accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())\n"
            "trainer = SFTTrainer(model=accelerator.prepare_model(model))\ntrainer.train()\n"
            "trainer.model.save_pretrained('out')\n",
            5,
            1,
        ),
        Example(  # one file per batch of a prepared loader, named by the loop's counter: the
            # ranks' shards collide under the same names (no guard: it would keep one shard)
            HEADER + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
            "for i, batch in enumerate(loader):\n    with torch.no_grad():\n"
            "        feats = model(batch)\n    torch.save(feats, f'cache/{i}.pt')\n",
            8,
            5,
        ),
        # a test of a value merely named like a rank (a LoRA setting, a retrieval metric, a
        # loop's count) keeps no rank from the write: every rank passes it together
        Example(
            HEADER + "import torch\nif args.lora_rank > 0:\n    torch.save(lora, 'l.pt')\n", 5, 5
        ),
        Example(
            HEADER + "import torch\nreciprocal_rank = (1.0 / ranks).mean().item()\n"
            "if reciprocal_rank > best:\n    torch.save(state, 'best.pt')\n",
            6,
            5,
        ),
        Example(  # a loop's count, beside a worker whose parameter is the rank
            HEADER + "import torch\n\n\ndef worker(rank):\n    return rank\n\n\n"
            "for rank in range(4):\n    if rank == 0:\n        torch.save(state, 'e.pt')\n",
            12,
            9,
        ),
        Example(  # a tokenizer written by every rank and read back with nothing waiting
            HEADER + "tokenizer.save_pretrained('out')\n"
            "tokenizer = AutoTokenizer.from_pretrained('out')\n",
            3,
            1,
        ),
        # the checkpoint main saved, copied by every rank: not a fixed file of the repository
        # (the file names it twice), each rank may copy it while main still writes it
        Example(
            HEADER + "import shutil\nimport torch\n"
            "if accelerator.is_main_process:\n"
            '    torch.save(model.state_dict(), "last.pt")\n'
            "shutil.copy('last.pt', 'best.pt')\n",
            7,
            1,
        ),
        # lintreal42 (a DDPM trainer held in an nn.Module): the pipeline is built under the
        # rank test and saved after it, by every rank; one finding, this rule's (not ACC209's)
        Example(
            HEADER + "model = accelerator.prepare(model)\n"
            "accelerator.wait_for_everyone()\n"
            "if accelerator.is_main_process:\n"
            "    pipeline = Pipeline(unet=accelerator.unwrap_model(model))\n"
            "pipeline.save_pretrained('progress')\n",
            7,
            1,
        ),
        # a checkpoint named by the clock on every rank and read back: the path is the bug (no
        # fix: a main-process save would leave the others loading a file nobody wrote)
        Example(
            HEADER + "import time\nimport torch\n\n"
            "path = time.strftime('ckpt-%H%M%S.pt')\n"
            "torch.save(model.state_dict(), path)\n"
            "model.load_state_dict(torch.load(path))\n",
            7,
            1,
        ),
        # lintfix30: a run's memory report written through its handle by every rank, named by
        # this rank's measured speed (the clock) and memory: ranks that measure alike collide
        Example(
            HEADER + "import time\nimport torch\n"
            "model, loader = accelerator.prepare(model, loader)\n"
            "start = time.time()\n"
            "for x in loader:\n    accelerator.backward(model(x).sum())\n"
            "speed = (time.time() - start) / len(loader)\n"
            "used = torch.cuda.memory_allocated()\n"
            "name = f'memory_{round(used / 2**30, 1)}_{round(speed * 1000, 2)}.txt'\n"
            "with open(name, 'w') as f:\n"
            "    f.write(torch.cuda.memory_summary())\n",
            13,
            5,
        ),
    )
    good = (
        # review10b: a file per rank named from the launcher's variable (each rank's RNG state,
        # f"rng_{os.environ['RANK']}.pt"): N files, none racing another; guarded (the old fix)
        # only rank 0's was saved
        HEADER
        + "import os, torch\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "accelerator.backward(model(x).sum())\n"
        + "torch.save(torch.get_rng_state(), f\"rng_{os.environ['RANK']}.pt\")\n"
        + "torch.save(torch.get_rng_state(), f\"rng_{os.getenv('LOCAL_RANK', '0')}.pt\")\n"
        + "torch.save(torch.get_rng_state(), f\"rng_{os.environ.get('RANK')}.pt\")\n",
        # fixed source folders snapshotted into the run folder by every rank, nothing read
        # back (the second copy reads ./config, which no one writes): the same bytes on every
        # rank (a trainer copying its models/ and config/)
        HEADER
        + "import os, shutil\n"
        + "run_dir = f'./cache/{args.name}'\n"
        + "os.makedirs(run_dir, exist_ok=True)\n"
        + "shutil.copytree('./models', f'{run_dir}/models', dirs_exist_ok=True)\n"
        + "shutil.copytree('./config', f'{run_dir}/config', dirs_exist_ok=True)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "accelerator.backward(model(x).sum())\n",
        # a log of each rank's own, and one written by the main process alone
        HEADER + "log = open(f'log_{accelerator.process_index}.txt', 'w')\nlog.write('start')\n",
        HEADER + "if accelerator.is_main_process:\n"
        "    with open('result.txt', 'a') as f:\n        f.write(summary)\n",
        WRITE_ATOMIC_PER_PROCESS,
        # a file the kernel keeps per process: no rank's write reaches another's
        HEADER + "with open('/proc/self/clear_refs', 'w') as refs:\n    refs.write('5')\n",
        # the process's rank through the names it is held in: dist.get_rank(), the launcher's
        # variable, a worker's parameter, an accelerator's member copied to a local
        HEADER + "import torch\nimport torch.distributed as dist\nr = dist.get_rank()\n"
        "if r == 0:\n    torch.save(state, 'a.pt')\n",
        HEADER + "import os\nimport torch\nenv_rank = int(os.environ['LOCAL_RANK'])\n"
        "if env_rank == 0:\n    torch.save(state, 'b.pt')\n",
        HEADER + "import torch\n\n\ndef worker(rank, world_size):\n    if rank == 0:\n"
        "        torch.save(state, 'c.pt')\n",
        HEADER + "import torch\nindex = accelerator.process_index\nif index == 0:\n"
        "    torch.save(state, 'd.pt')\n",
        HEADER + "import torch\nrank, world_size = setup()\nif rank == 0:\n"
        "    torch.save(state, 'e.pt')\n",
        # HF Trainer: a one-process run saves its RNG state, a larger run one file per rank;
        # the optimizer is saved by the process TrainingArguments says saves
        HEADER
        + "import torch\n"
        + "if args.world_size <= 1:\n    torch.save(rng_states, 'rng_state.pth')\n"
        + "else:\n    torch.save(rng_states, f'rng_state_{args.process_index}.pth')\n"
        + "if args.should_save:\n    torch.save(optimizer.state_dict(), 'optimizer.pt')\n",
        # pytorch-accelerated: the trainer's run config says which process is the main one
        HEADER
        + "import torch\n"
        + "if run_config.is_world_process_zero:\n    torch.save(metadata, 'meta.pt')\n",
        HEADER + "accelerator.save(state, 'ckpt.pt')\n",
        # a learner that trains with or without Accelerate: the plain branch is one process
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        "class Learner:\n"
        "    def __init__(self, model, accelerate):\n"
        "        self.accelerator = Accelerator() if accelerate else None\n"
        "        self.model = model\n\n"
        "    def _write(self, path):\n"
        "        torch.save(self.model.state_dict(), path)\n\n"
        "    def checkpoint(self, path):\n"
        "        if self.accelerator is not None:\n"
        "            self.accelerator.wait_for_everyone()\n"
        "            self.accelerator.save_state(path)\n"
        "        else:\n"
        "            torch.save(self.model.state_dict(), path)\n"
        "            self._write(path + '.bak')\n",
        HEADER
        + "import torch\nif accelerator.is_main_process:\n    torch.save(state, 'ckpt.pt')\n",
        HEADER
        + "import torch\n\n\ndef save(path):\n    torch.save(state, path)\n\n\n"
        + "if accelerator.is_main_process:\n    save('a.pt')\n",
        HEADER + "import torch\n\n\ndef save_hook(models, weights, path):\n"
        "    torch.save(weights, path)\n",
        HEADER
        + "model.save_pretrained('out', is_main_process=accelerator.is_main_process, "
        + "save_function=accelerator.save)\n",
        HEADER + "import numpy as np\nnp.save(f'preds_{accelerator.process_index}.npy', p)\n",
        # diff_from_scratch: the rank copied into a local names each rank's plot
        HEADER
        + "import matplotlib.pyplot as plt\n"
        + "for ij in range(4):\n"
        + "    process_idx = accelerator.process_index\n"
        + "    plt.savefig(f'audio/image_{ij}_{process_idx}.png')\n",
        # a path made per process: each rank writes (and reads back) a file of its own
        HEADER
        + "import os, tempfile, torch\nwith tempfile.TemporaryDirectory() as tmp:\n"
        + "    path = os.path.join(tmp, 'best.pt')\n    torch.save(state, path)\n"
        + "    state = torch.load(path)\n",
        HEADER
        + "import torch\n\n\ndef save(path):\n    if not accelerator.is_main_process:\n"
        + "        return\n    torch.save(state, path)\n\n\nsave('a.pt')\n",
        HEADER
        + "import torch\n\n\nclass Trainer:\n    def save(self, path):\n"
        + "        torch.save(state, path)\n\n    def fit(self):\n"
        + "        if accelerator.is_main_process:\n            self.save('x.pt')\n\n\n"
        + "accelerator.save(state, 'y.pt')\n",
        HEADER
        + "with accelerator.main_process_first():\n"
        + "    tokenizer.save_pretrained(args.output_dir)\n",
        # trlx's RL trainer: its own save_pretrained passes is_main_process= (after a barrier
        # and the state dict's gather, which every rank runs), so its calls need no guard
        "import os\nfrom accelerate import Accelerator\n\n\nclass RLTrainer:\n"
        "    def __init__(self, model):\n        self.accelerator = Accelerator()\n"
        "        self.model = self.accelerator.prepare(model)\n\n"
        "    def save_pretrained(self, directory):\n"
        "        self.accelerator.wait_for_everyone()\n"
        "        self.accelerator.unwrap_model(self.model).save_pretrained(\n"
        "            directory,\n"
        "            save_function=self.accelerator.save,\n"
        "            is_main_process=self.accelerator.is_main_process,\n"
        "            state_dict=self.accelerator.get_state_dict(self.model),\n"
        "        )\n\n"
        "    def learn(self, steps):\n"
        "        for step in range(steps):\n"
        "            self.accelerator.backward(self.model(step))\n"
        "            if step % 100 == 0:\n"
        "                self.save_pretrained(os.path.join('ckpt', str(step), 'hf_model'))\n\n\n"
        # ... and called from a subclass of the file (trlx's PPO and SFT trainers)
        "class PPOTrainer(RLTrainer):\n"
        "    def fit(self, epochs):\n"
        "        for epoch in range(epochs):\n"
        "            self.accelerator.backward(self.model(epoch))\n"
        "            self.save_pretrained(os.path.join('ckpt', f'epoch-{epoch}'))\n",
        # a trainer's own name for the rank test (a property, an attribute set from one)
        "import torch\nfrom accelerate import Accelerator\n\n\nclass Trainer:\n"
        "    def __init__(self, model):\n        self.accelerator = Accelerator()\n"
        "        self.model = self.accelerator.prepare(model)\n"
        "        self.can_save = self.is_local_main if local else self.is_main\n\n"
        "    @property\n    def is_main(self):\n"
        "        return self.accelerator.is_main_process\n\n"
        "    @property\n    def is_local_main(self):\n"
        "        return self.accelerator.is_local_main_process\n\n"
        "    def save(self, path):\n        torch.save(self.model.state_dict(), path)\n\n"
        "    def save_last(self, path):\n        if not self.can_save:\n            return\n"
        "        torch.save(self.model.state_dict(), path)\n\n"
        "    def train(self):\n        for step in range(10):\n"
        "            self.accelerator.backward(self.model(step))\n"
        "            if self.is_main and step % 5 == 0:\n                self.save('m.pt')\n"
        "        self.save_last('last.pt')\n",
        # an ``evaluate`` metric fed gathered predictions: its compute() is the whole set's on
        # every rank, and every rank dumps the same bytes (Accelerate's no_trainer examples)
        HEADER
        + "import json\n\nimport evaluate\nimport torch\n\n\n"
        + "def main(model, eval_loader):\n"
        + "    model, eval_loader = accelerator.prepare(model, eval_loader)\n"
        + "    metric = evaluate.load('accuracy')\n"
        + "    for batch in eval_loader:\n"
        + "        with torch.no_grad():\n"
        + "            logits = model(**batch).logits\n"
        + "        preds = logits.argmax(-1)\n"
        + "        preds, refs = accelerator.gather_for_metrics((preds, batch['labels']))\n"
        + "        metric.add_batch(predictions=preds, references=refs)\n"
        + "    result = metric.compute()\n"
        + "    with open('eval_results.json', 'w') as f:\n"
        + "        json.dump(result, f)\n",
        # the metrics of a gathered evaluation: every rank dumps the same bytes, nobody reads
        HEADER
        + "import json\n\n\n"
        + "def evaluate(model, loader):\n"
        + "    correct = total = 0\n"
        + "    for x, y in loader:\n"
        + "        preds, refs = accelerator.gather_for_metrics((model(x).argmax(-1), y))\n"
        + "        correct += (preds == refs).sum().item()\n"
        + "        total += refs.numel()\n"
        + "    return correct / total\n\n\n"
        + "def main(model, loader):\n"
        + "    model, loader = accelerator.prepare(model, loader)\n"
        + "    acc = evaluate(model, loader)\n"
        + "    with open('results.json', 'w') as f:\n"
        + "        json.dump({'accuracy': acc}, f)\n",
        # one file per item of a prepared loader, named by the item: each rank writes its own
        HEADER
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
        + "for i, (images, names) in enumerate(loader):\n    with torch.no_grad():\n"
        + "        feats = model(images)\n    torch.save(feats, f'cache/{names[0]}.pt')\n",
        # the config file copied into the run's folder by every rank, before a barrier
        "import shutil\nfrom accelerate import Accelerator\n\n\ndef main(config_path, log_dir):\n"
        "    shutil.copy(config_path, log_dir)\n    accelerator = Accelerator()\n"
        "    model = accelerator.prepare(net)\n    accelerator.wait_for_everyone()\n",
        # identical small files every rank writes last, read by nothing after: whole once
        # the ranks are done (SFT trainer class saving its tokenizer at the end of fine_tune)
        HEADER
        + "import json\n\n\ndef finish(out):\n    tokenizer.save_pretrained(out)\n"
        + "    with open('args.json', 'w') as f:\n        json.dump(vars(args), f)\n"
        + "    print(f'saved to {out}')\n\n\nfinish('out')\n",
        # an HF Trainer's log history written by every rank last: the same rows everywhere
        # (Tower SFT: the losses are gathered across ranks before they are logged)
        HEADER
        + "import pandas as pd\ntrainer.train()\n"
        + "pd.DataFrame(trainer.state.log_history).to_csv('out/log.tsv', sep='\\t')\n",
        # identical small files every rank writes before a barrier: whole when read
        HEADER
        + "import json\ntokenizer.save_pretrained(args.output_dir)\n"
        + "with open('args.json', 'w') as f:\n    json.dump(vars(args), f)\n"
        + "accelerator.wait_for_everyone()\n",
        # Accelerate's decorators run the helper on one rank, whoever calls it (an image
        # restoration trainer's best-model save under PartialState's decorator)
        HEADER
        + "import torch\nfrom accelerate.state import PartialState\nstate = PartialState()\n"
        + "model = accelerator.prepare(model)\n\n\n@accelerator.on_main_process\n"
        + "def save(path):\n    torch.save(accelerator.unwrap_model(model).state_dict(), path)\n"
        + "\n\nclass Trainer:\n    @state.on_local_main_process\n    def save_best(self, path):\n"
        + "        torch.save(self.model.state_dict(), path)\n\n"
        + "    def fit(self):\n        accelerator.backward(self.model(1))\n"
        + "        self.save_best('best.pt')\n\n\nsave('m.pt')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        in_view = backends_in_view(script)
        facts = facts_of(script)
        for effect in facts.repeated_effects:
            if effect.deletes or not effect.backends & in_view:
                continue
            if effect.helper is not None:
                if not effect.through_helper and facts.synchronising_in(effect.effect) is None:
                    yield self.finding(
                        script, effect.reported, None, _helper_message(script, effect)
                    )
                continue  # (what its arguments compute may need every rank: no advice)
            if side_effects.uploads(script, effect.effect):
                continue  # ACC207
            if (
                side_effects.same_on_every_rank(script, effect.effect)
                or dumps_agreed(facts.agreed, effect.effect)
            ) and (facts.barrier_after(effect.reported) or not facts.read_after(effect.reported)):
                continue  # whole when read: after a barrier, or once every rank is done
            per_process = facts.shared_files.written_per_process(effect.effect)
            if per_process is not None:
                if per_process.clock:  # the same path on some ranks, another on others
                    message = _clock_path_message(script, effect, per_process.source)
                    yield self.finding(script, effect.reported, None, message)
                continue  # a pid, a temporary folder: each rank writes a file of its own
            per_batch = side_effects.per_batch_files(script, effect.effect)
            if per_batch is not None and not effect.through_helper:
                loop, collide = per_batch
                if collide:
                    message = _per_batch_message(script, effect, loop)
                    yield self.finding(script, effect.reported, None, message)
                continue
            yield self.finding(
                script,
                effect.reported,
                _fix(script, effect.reported),
                _message(script, effect, in_view),
            )


def _helper_message(script: ScriptModel, effect: RepeatedEffect) -> str:
    """A call of another module's function that writes (`helper_writes`): guarded here, where
    an accelerator is, as that module has none; a later read needs the barrier too."""
    assert effect.helper is not None
    accelerator = accelerator_name(script, effect.reported)
    return (
        f"Call {effect.helper.function}() under `if {accelerator}.is_main_process:`: it writes "
        f"files ({effect.helper.said()}) and every rank runs this call, racing on the same "
        f"path; call {accelerator}.wait_for_everyone() after it if any rank reads them back"
    )


def _clock_path_message(script: ScriptModel, effect: RepeatedEffect, clock: cst.Call) -> str:
    """A path made from the clock on every rank (a timestamp, a measured speed): ranks that
    read the same time write one file, the others a file each. Read back, a main-process guard
    would leave the other ranks reading a file of their own that nobody wrote, so the path is
    what to fix; not read back (a run's memory report), one rank's file may be enough."""
    accelerator = accelerator_name(script, effect.reported)
    if not facts_of(script).read_after(effect.reported):
        return (
            f"Put {accelerator}.process_index in this path, or open and write the file on the "
            f"main process only: the path is made from the clock on every rank "
            f"({dotted(clock.func)}, line {script.line(clock)}), so ranks that read the same "
            "time write the same file at once and race"
        )
    return (
        f"Make this path one for the whole run (made once before the ranks start, or on the "
        f"main process and shared with broadcast_object_list), or put "
        f"{accelerator}.process_index in it: it is made from the clock on every rank "
        f"({dotted(clock.func)}, line {script.line(clock)}), so ranks that read the same time "
        "write the same file at once, and a main-process guard alone would leave the others "
        "reading back a path nobody wrote"
    )


def _per_batch_message(script: ScriptModel, effect: RepeatedEffect, loop: cst.For) -> str:
    accelerator = accelerator_name(script, effect.reported)
    return (
        f"Name this file by the batch's global index (e.g. index * {accelerator}.num_processes "
        f"+ {accelerator}.process_index) or gather before writing: the loop at line "
        f"{script.line(loop)} reads each rank's shard of a prepared DataLoader and counts from "
        "0 on every rank, so the ranks overwrite each other's files; a main-process guard would "
        "keep one shard only"
    )


def _message(script: ScriptModel, effect: RepeatedEffect, in_view: frozenset[str]) -> str:
    where = "" if effect.backends == EVERY_BACKEND else f" under {named(effect.backends & in_view)}"
    accelerator = accelerator_name(script, effect.reported)
    if effect.through_helper:
        return (
            f"Call {dotted(effect.reported.func)}() under `if {accelerator}.is_main_process:` "
            f"here too: it writes files ({dotted(effect.effect.func)}, line "
            f"{script.line(effect.effect)}), its other calls are guarded, and every rank runs "
            f"this one{where}, racing on the same path"
        )
    if accelerator_at(script, effect.reported) is None:
        at_callers = _guard_at_callers(script, effect.reported, where)
        if at_callers is not None:
            return at_callers
        return _accelerator_to_pass(script, effect.reported) + _written(script, effect, in_view)
    return _written(script, effect, in_view)


def _written(script: ScriptModel, effect: RepeatedEffect, in_view: frozenset[str]) -> str:
    """Where the write goes, and the barrier a read below it needs."""
    where = "" if effect.backends == EVERY_BACKEND else f" under {named(effect.backends & in_view)}"
    accelerator = accelerator_name(script, effect.reported)
    read_back = facts_of(script).shared_files.read_back_below(effect.effect)
    if read_back is not None and side_effects.same_on_every_rank(script, effect.effect):
        return (
            f"Call {accelerator}.wait_for_everyone() after this write, before line "
            f"{script.line(read_back)} reads the file back (and write it on the main process "
            f"only if you like): every rank writes the same file{where} and nothing waits for "
            "the writes to finish before it is read"
        )
    advice = _advice(script, effect, in_view, accelerator, where)
    deletion = facts_of(script).shared_files.deleted_above(effect.effect)
    if deletion is not None:
        advice += (
            f"; delete the old file (line {script.line(deletion)}) under the same test: a rank "
            "deleting it after the main process has written it loses the new one"
        )
    if read_back is None:
        return advice
    return (
        f"{advice}; then call {accelerator}.wait_for_everyone() before line "
        f"{script.line(read_back)}, which reads it back on every rank (without it they read "
        "before the main process has written)"
    )


def _guard_at_callers(script: ScriptModel, write: cst.Call, where: str) -> str | None:
    """For a write in a function with no accelerator in scope (``def save_checkpoint(model,
    path)``), where ``accelerator.is_main_process`` names nothing: the guard around its calls,
    named by line, when that is safe. It is when each caller has an accelerator, neither the
    function nor its arguments reach a collective (a guard would run it on one rank: a hang),
    it returns nothing (the other ranks would miss the value) and reads nothing back."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(write)
    if function is None or _passes_something_on(script, function, write):
        return None
    callers = facts.calls.callers(function)
    in_scope = [accelerator_at(script, call) for call in callers]
    if not callers or not all(in_scope) or _synchronising_at(script, function) is not None:
        return None
    lines = ", ".join(str(script.line(call)) for call in callers)
    return (
        f"Write on the main process only: {function.name.value}() has no accelerator to test, "
        f"so call it under `if {in_scope[0]}.is_main_process:` at "
        f"line{'s' if len(callers) > 1 else ''} {lines} (or pass it the accelerator and guard "
        f"this write); every rank runs this{where} and races on the same path"
    )


def _passes_something_on(script: ScriptModel, function: cst.FunctionDef, write: cst.Call) -> bool:
    """``function`` returns a value, or reads back below the write what it wrote: every rank
    needs to run it."""
    if script.index.own_returns(function):
        return True
    return facts_of(script).shared_files.read_back_below(write) is not None


def _synchronising_at(script: ScriptModel, function: cst.FunctionDef) -> cst.Call | None:
    """A collective ``function`` reaches, or one in what a caller hands it
    (``export(accelerator.get_state_dict(model))``): a guard around its calls would skip it."""
    facts = facts_of(script)
    return facts.synchronising_call(function) or next(
        (
            found
            for call in facts.calls.callers(function)
            if (found := facts.synchronising_in(call)) is not None
        ),
        None,
    )


def _accelerator_to_pass(script: ScriptModel, write: cst.Call) -> str:
    """The first words of the advice where the write's function has no accelerator: hand it
    one, named ``accelerator`` in what follows."""
    function = facts_of(script).placement.enclosing_function(write)
    if function is None:
        return ""
    name = function.name.value
    synchronising = _synchronising_at(script, function)
    reason = (
        f"; a guard around its calls would run {dotted(synchronising.func) or 'a collective'}() "
        f"(line {script.line(synchronising)}) on one rank only, and every rank must run it"
        if synchronising is not None
        else ""
    )
    return f"Pass the accelerator to {name}() (it has none in scope{reason}). "


def _advice(
    script: ScriptModel,
    effect: RepeatedEffect,
    in_view: frozenset[str],
    accelerator: str,
    where: str,
) -> str:
    """Where the write goes so that one rank makes it, for the write's kind."""
    func = effect.effect.func
    inner = facts_of(script).synchronising_in(effect.effect)
    if inner is not None:  # a guard around the write would run this on one rank: a hang
        computed = f"{dotted(inner.func) or 'this call'}() (line {script.line(inner)})"
        if script.call_names(effect.effect) & names.TORCH_SAVE:
            return (
                f"Save with {accelerator}.save(...): it writes on the main process only, and "
                f"{computed} still runs on every rank, as it must; every rank writes this "
                f"file{where}, racing on the same path"
            )
        return (
            f"Compute {computed} on every rank into a variable, then write it under `if "
            f"{accelerator}.is_main_process:`; every rank writes this file{where}, racing on "
            "the same path"
        )
    if side_effects.same_on_every_rank(script, effect.effect):
        return (
            f"Call {accelerator}.wait_for_everyone() after this write (and write it on the "
            f"main process only if you like): every rank writes the same file{where} and "
            "nothing waits for the writes to finish before it is read"
        )
    if isinstance(func, cst.Attribute) and func.attr.value == "save_pretrained":
        gathered = FULL_WEIGHTS_GATHERED & in_view
        if gathered and _holds_weights(script, func):
            # the model's state_dict gathers the shards there: a guard would hang
            model = dotted(func.value)
            return (
                f"Save on the main process only: pass is_main_process="
                f"{accelerator}.is_main_process, save_function={accelerator}.save and "
                f"state_dict={accelerator}.get_state_dict({model}) (not an `if` around it: the "
                f"state dict gathers the weights from every rank under {named(gathered)}); "
                f"every rank writes these files{where}, racing on the same path"
            )
        return (
            f"Save on the main process only: guard with `if {accelerator}.is_main_process:`, or "
            f"pass is_main_process={accelerator}.is_main_process and "
            f"save_function={accelerator}.save to a Hugging Face save_pretrained; every rank "
            f"writes these files{where}, racing on the same path"
        )
    if script.call_names(effect.effect) & names.TORCH_SAVE:
        return (
            f"Save on the main process only: {accelerator}.save(...) or guard with "
            f"`if {accelerator}.is_main_process:`; every rank writes this file{where}, racing "
            "on the same path"
        )
    opened = _opening_with(script, effect.effect)
    inside = facts_of(script).synchronising_in(opened[0]) if opened is not None else None
    if opened is not None and inside is not None:
        # a log held open across training: the `with` must stay on every rank
        elsewhere = (
            # os.devnull exists: opened "x" it fails as the file does
            "open the file before the block on the main process only and None on the others"
            if opened[1] == "exclusive"
            else "open os.devnull on the other ranks"
        )
        return (
            f"Write on the main process only: guard the writes to this file with `if "
            f"{accelerator}.is_main_process:` and open it there only (the `with` at line "
            f"{script.line(opened[0])} also runs {dotted(inside.func) or 'a collective'}() "
            f"(line {script.line(inside)}), which every rank must run, so it cannot go under the "
            f"test whole: {elsewhere}, or write the file after the block); every rank runs "
            f"this{where} and races on the same path"
        )
    if opened is not None:
        with_, opening = opened
        left = {
            "truncates": "every rank's open still truncates the file",
            "exclusive": "every rank's open but the first still fails: the file exists",
        }.get(opening, "every rank still runs the block's other writes to the file")
        return (
            f"Write on the main process only: put the `with` at line {script.line(with_)} "
            f"under `if {accelerator}.is_main_process:` (guarding this line alone, {left}); "
            f"every rank runs this{where} and races on the same path"
        )
    statement = _opening_statement(script, effect.effect)
    if statement is not None and facts_of(script).synchronising_in(statement) is None:
        return (
            f"Write on the main process only: open the file (line {script.line(statement)}) "
            f"under `if {accelerator}.is_main_process:` and guard its writes and close the same "
            "way (guarding this line alone, every rank still opens the file and writes the "
            f"rest); every rank runs this{where} and races on the same path"
        )
    return (
        f"Write on the main process only: guard with `if {accelerator}.is_main_process:`; every "
        f"rank runs this{where} and races on the same path"
    )


def _opening_with(script: ScriptModel, write: cst.Call) -> tuple[cst.With, str] | None:
    """``with open(path, "w") as f: json.dump(result, f)``: the ``with`` whose handle the write
    writes to, and how its open opens: ``"truncates"``, ``"exclusive"`` or ``"appends"``.
    Opening for writing truncates the file, so the guard belongs around the ``with``: one around
    the write alone leaves every other rank emptying the file the main process wrote. Opened
    ``"x"``, the open itself fails on every rank but the first. A file opened to append
    (``"a"``) whose block writes to it more than once (``json.dump(record, f)`` then
    ``f.write("\\n")``) needs the guard there too: around one write, every rank still adds the
    others."""
    opened = side_effects.opened_for_writing(script, write)
    if opened is None:
        return None
    for ancestor in script.ancestors(write):
        if not isinstance(ancestor, cst.With):
            continue
        for item in ancestor.items:
            handle = dotted(item.asname.name) if item.asname is not None else None
            if item.item is not opened or handle is None:
                continue
            if side_effects.opens_truncating(opened):
                return ancestor, "truncates"
            if side_effects.opens_exclusively(opened):
                return ancestor, "exclusive"
            if _writes_to(ancestor, handle) > 1:
                return ancestor, "appends"
    return None


def _opening_statement(script: ScriptModel, write: cst.Call) -> cst.CSTNode | None:
    """``log = open(path, "w")`` then ``log.write(...)``: the statement that opens the file the
    write goes to, where it is no ``with`` (that is `_opening_with`)."""
    opened = side_effects.opened_for_writing(script, write)
    if opened is None or any(
        isinstance(a, cst.With) and any(item.item is opened for item in a.items)
        for a in script.ancestors(opened)
    ):
        return None
    return next(
        (a for a in script.ancestors(opened) if isinstance(a, cst.SimpleStatementLine)), None
    )


def _writes_to(block: cst.With, handle: str) -> int:
    """How many calls in the ``with`` block write through ``handle``: ``handle.write(...)``,
    ``handle.writelines(...)`` or a call handed it (``json.dump(x, handle)``)."""
    count = 0
    for node in walk(block.body):
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        method = (
            isinstance(func, cst.Attribute)
            and func.attr.value in ("write", "writelines")
            and dotted(func.value) == handle
        )
        if method or any(dotted(argument.value) == handle for argument in node.args):
            count += 1
    return count


def _holds_weights(script: ScriptModel, func: cst.Attribute) -> bool:
    """The receiver of ``save_pretrained`` is a model: one the analysis tracks, or an object it
    does not whose name says so (``trainer.model`` after an HF Trainer ran, ``model_to_save``).
    Under FSDP or ZeRO-3 its state dict gathers the shards from every rank, so the advice must
    never be an ``if`` around the call (the other ranks would wait in the gather forever)."""
    receiver = dotted(func.value)
    kind = facts_of(script).flow.kind_of(receiver, func)
    if kind is Kind.MODEL:
        return True
    return kind is None and receiver is not None and "model" in receiver.rsplit(".", 1)[-1].lower()


def _fix(script: ScriptModel, call: cst.Call) -> "Plan | None":
    """``torch.save`` -> ``accelerator.save`` after the barrier `convert` puts before a save."""
    if not script.call_names(call) & names.TORCH_SAVE:
        return None
    facts = facts_of(script)
    accelerator = accelerator_at(script, call)
    if accelerator is None or facts.ranks.under_rank_guard(call):
        return None
    line = script.parent(script.parent(call))
    from accelify.edits import rewrites  # a fix's edits: imported for a fix only
    from accelify.edits.plan import Plan

    return Plan.of(*rewrites.save(call, accelerator, facts.ranks.barrier_places(line)))
