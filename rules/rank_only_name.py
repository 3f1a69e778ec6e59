from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.rank_only_entries import rank_only_entries
from accelify.analysis.rank_only_fills import rank_only_fills
from accelify.analysis.rank_only_names import rank_only_attributes, rank_only_reads
from accelify.analysis.rank_only_settings import rank_only_settings
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name

_VALIDATION = (
    HEADER
    + "import torch\n"
    + "model, val_loader = accelerator.prepare(model, val_loader)\n"
    + "vals = []\n"
    + "with torch.no_grad():\n"
    + "    for x, y in val_loader:\n"
    + "        loss = model(x, y)\n"
    + "        if accelerator.is_main_process:\n"
    + "            vals.append(loss.item())\n"
    + "{read}"
)


#: The best epoch kept in a dict made on every rank, written on the main process only
#: (``{write}``), then handed to the prepared scheduler by every rank (``{read}``).
_BEST_ENTRY = (
    HEADER
    + "model, optimizer, loader, scheduler = accelerator.prepare(\n"
    + "    model, optimizer, loader, scheduler\n)\n"
    + "best = {{'epoch': 0, 'loss': float('inf')}}\n"
    + "for epoch in range(10):\n"
    + "    for batch in loader:\n"
    + "        accelerator.backward(model(batch).loss)\n"
    + "        optimizer.step()\n"
    + "{write}"
    + "{read}"
)
_MAIN_WRITES = "    if accelerator.is_main_process:\n        best['epoch'] = epoch\n"
_STEPS_ON_IT = "    scheduler.step(best['epoch'])\n"

#: equitrain: the main process hands the dict to a helper that writes the entry.
_HELPER_ENTRY = (
    HEADER
    + "def update_best(best, loss, epoch):\n"
    + "    if loss < best['loss']:\n"
    + "        best['loss'] = loss\n"
    + "        best['epoch'] = epoch\n"
    + "        return True\n"
    + "    return False\n\n\n"
    + "def main():\n"
    + "    model, optimizer, loader, scheduler = accelerator.prepare(\n"
    + "        model, optimizer, loader, scheduler\n    )\n"
    + "    best = {'epoch': 0, 'loss': float('inf')}\n"
    + "    for epoch in range(10):\n"
    + "        scheduler.step(best['epoch'], epoch)\n"
    + "        for batch in loader:\n"
    + "            accelerator.backward(model(batch).loss)\n"
    + "            optimizer.step()\n"
    + "        if accelerator.process_index == 0:\n"
    + "            update_best(best, evaluate(model), epoch)\n"
)


#: tango's train.py: the run's folder named on the main process only (a time stamp), then
#: every rank saves its part of the checkpoint under ``args.output_dir``.
_RUN_FOLDER = (
    "import os\nimport time\n"
    + HEADER
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "if accelerator.is_main_process:\n"
    + "    if args.output_dir is None:\n"
    + "        args.output_dir = 'saved/' + str(int(time.time()))\n"
    + "        os.makedirs(args.output_dir, exist_ok=True)\n"
    + "{shared}"
    + "for step, (x, y) in enumerate(loader):\n"
    + "    accelerator.backward(model(x).sum())\n"
    + "    optimizer.step()\n"
    + "    if step % 100 == 0:\n"
    + "        output_dir = f'step_{{step}}'\n"
    + "        if args.output_dir is not None:\n"
    + "            output_dir = os.path.join(args.output_dir, output_dir)\n"
    + "        {save}\n"
)


class RankOnlyName(Rule):
    """A local bound only under ``if accelerator.is_main_process:`` (or another rank test) and
    read outside it: ``result = {...}`` in the guarded block, ``accelerator.log(result)`` after
    it. The other ranks never bind the name and stop with a ``NameError`` when they reach the
    read; the main process then waits for them at its next collective. A name also bound
    before the test or in its ``else``, and a read made under a rank test of its own
    (``if accelerator.is_main_process and save:``), are not reported. Also a collection made
    empty on every rank and filled only under a rank test (``if accelerator.is_main_process:
    vals.append(loss.item())``, a trainer's ``self.losses`` filled so in one method), then read
    by every rank in a way that fails when it is empty: ``sum(vals) / len(vals)``
    (ZeroDivisionError), ``statistics.mean``, ``max``, ``vals[-1]``, ``torch.stack``; reported
    at that read, with advice to fill it on every rank where the values are every rank's, else
    to read it under the same test or gather it first. Not where the collection is tested for
    emptiness first, bound from a gather, or handed to a helper.

    Also a dict entry written only under a rank test (``best["epoch"] = epoch``, or by a helper
    of the file the guarded block hands the dict: equitrain's ``update_best_results``) and
    handed by every rank to a method of a prepared object (``lr_scheduler.step(best["epoch"])``):
    no rank fails, but the others step with the entry's first value, and their learning rates
    and weights drift away from the main process's (`rank_only_entries`).

    Also an attribute set only under a rank test (``args.output_dir = "saved/" +
    str(int(time.time()))`` on the main process, tango) and read by every rank into the folder
    of ``save_state``/``load_state``: the other ranks write (or read) their part of the
    checkpoint in the old folder (`rank_only_settings`)."""

    code = "ACC209"
    name = "rank-only-name"
    message = (
        "Bind this name on every rank: it is assigned only under a rank test, and the other "
        "ranks reach this read with it unbound (NameError)"
    )
    why = "A name bound on the main process only does not exist on the other ranks."
    bad = (
        Example(
            HEADER
            + "if accelerator.is_main_process:\n    result = {'loss': loss.item()}\n"
            + "accelerator.log(result)\n",
            5,
            17,
        ),
        Example(  # vits-accelerate: rebound on every rank by the very call that reads it first
            HEADER
            + "if accelerator.is_main_process:\n    eval_set = load('val')\n"
            + "model, eval_set = accelerator.prepare(model, eval_set)\n",
            5,
            46,
        ),
        Example(  # a speech GAN trainer: the writer made on the main process, used by all
            HEADER + "class Trainer:\n"
            "    def __init__(self, model):\n"
            "        self.model = accelerator.prepare(model)\n"
            "        if accelerator.is_main_process:\n"
            "            self.writer = make_writer()\n"
            "    def log(self, step, loss):\n"
            "        self.writer.add_scalar('loss', loss, step)\n"
            "    def fit(self, loader):\n"
            "        for step, x in enumerate(loader):\n"
            "            self.log(step, self.model(x).item())\n"
            "Trainer(model).fit(loader)\n",
            9,
            9,
        ),
        Example(  # a cardiac motion-field diffusion trainer: the EMA made on the main process,
            # its checkpoint entry named "ema", updated by train() (called from the entry script)
            HEADER + "class Trainer:\n"
            "    def __init__(self, model, opt, loader):\n"
            "        if accelerator.is_main_process:\n"
            "            self.ema = EMA(model, beta=0.95)\n"
            "        self.model, self.opt, self.dl = accelerator.prepare(model, opt, loader)\n"
            "    def save(self, path):\n"
            "        if accelerator.is_main_process:\n"
            "            torch.save({'ema': self.ema.state_dict()}, path)\n"
            "    def train(self):\n"
            "        for batch in self.dl:\n"
            "            accelerator.backward(self.model(batch))\n"
            "            self.opt.step()\n"
            "        self.ema.update()\n",
            15,
            9,
        ),
        # a dict entry written on the main process only, handed to the prepared scheduler by
        # every rank: the other ranks step with the entry's first value
        Example(_BEST_ENTRY.format(write=_MAIN_WRITES, read=_STEPS_ON_IT), 13, 20),
        # ... written by a helper the main process hands the dict to; read by the next epoch
        Example(_HELPER_ENTRY, 17, 24),
        # the run's folder set on the main process only, read into every rank's save_state
        Example(_RUN_FOLDER.format(shared="", save="accelerator.save_state(output_dir)"), 16, 39),
        # a list filled on the main process only, averaged on every rank: ZeroDivisionError
        Example(_VALIDATION.format(read="avg = sum(vals) / len(vals)\n"), 11, 7),
        # a trainer's list, filled under the test in one method, read in another that every
        # rank runs (``fit`` trains: each rank calls it)
        Example(
            "import statistics\nfrom accelify import Accelerator\n\n\n"
            + "class Trainer:\n"
            + "    def __init__(self, model, optimizer):\n"
            + "        self.accelerator = Accelerator()\n"
            + "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n"
            + "        self.losses = []\n\n"
            + "    def step(self, x, y):\n"
            + "        loss = self.model(x, y)\n"
            + "        self.accelerator.backward(loss)\n"
            + "        self.optimizer.step()\n"
            + "        if self.accelerator.is_main_process:\n"
            + "            self.losses.append(loss.item())\n\n"
            + "    def end_epoch(self):\n"
            + "        mean, self.losses = statistics.mean(self.losses), []\n"
            + "        return mean\n\n"
            + "    def fit(self, loader):\n"
            + "        for x, y in loader:\n"
            + "            self.step(x, y)\n"
            + "        return self.end_epoch()\n",
            19,
            29,
        ),
    )
    good = (
        # the entry written on every rank, or broadcast from the main process before the read,
        # or read under the rank test that wrote it
        _BEST_ENTRY.format(write="    best['epoch'] = epoch\n", read=_STEPS_ON_IT),
        _BEST_ENTRY.format(
            write=_MAIN_WRITES + "    best = accelerate.utils.broadcast_object_list([best])[0]\n",
            read=_STEPS_ON_IT,
        ),
        _BEST_ENTRY.format(
            write=_MAIN_WRITES,
            read="    if accelerator.is_main_process:\n        print(best['epoch'])\n",
        ),
        # ... or read for a log line every rank prints: nothing every rank does depends on it
        _BEST_ENTRY.format(write=_MAIN_WRITES, read="    print(best['epoch'])\n"),
        # the run's folder given to every rank after the test, or saved on the main process
        # only (ACC211's business), or read only where no checkpoint is named by it
        _RUN_FOLDER.format(
            shared="args.output_dir = accelerate.utils.broadcast_object_list("
            "[args.output_dir])[0]\n",
            save="accelerator.save_state(output_dir)",
        ),
        _RUN_FOLDER.format(
            shared="", save="if accelerator.is_main_process: accelerator.save_state(output_dir)"
        ),
        _RUN_FOLDER.format(shared="", save="accelerator.save_state(f'step_{step}')"),
        # the other ranks set it in the test's else
        _RUN_FOLDER.format(
            shared="else:\n    args.output_dir = args.output_dir or 'saved/latest'\n",
            save="accelerator.save_state(output_dir)",
        ),
        # the helper called on every rank
        _HELPER_ENTRY.replace(
            "        if accelerator.process_index == 0:\n            update_best",
            "        if True:\n            update_best",
        ),
        # filled on every rank
        _VALIDATION.format(read="avg = sum(vals) / len(vals)\n").replace(
            "        if accelerator.is_main_process:\n            vals.append",
            "        vals.append",
        ),
        # tested for emptiness, or read under the test that fills it
        _VALIDATION.format(read="avg = sum(vals) / len(vals) if vals else 0.0\n"),
        _VALIDATION.format(
            read="if accelerator.is_main_process:\n    print(sum(vals) / len(vals))\n"
        ),
        # given to every rank by a gather first
        _VALIDATION.format(
            read="vals = accelerator.gather_object(vals)\nprint(sum(vals) / len(vals))\n"
        ),
        # a trainer that unwraps into a local `model` for a main-process checkpoint, then
        # passes `self.model` (an attribute, not that local) on every rank
        "from accelerate import Accelerator\n\n\nclass Trainer:\n"
        "    def __init__(self, accelerator, model):\n"
        "        self.accelerator, self.model = accelerator, model\n\n"
        "    def fit(self, epochs):\n"
        "        for epoch in range(epochs):\n"
        "            if self.accelerator.is_local_main_process:\n"
        "                model = self.accelerator.unwrap_model(self.model)\n"
        "                save_checkpoint(model, epoch)\n"
        "        final = self.accelerator.unwrap_model(self.model)\n"
        "        save_final_model(final)\n",
        # lerobot: the main process builds the dataset first, the others after the barrier
        HEADER
        + "if accelerator.is_main_process:\n    dataset = make_dataset(cfg)\n"
        + "accelerator.wait_for_everyone()\n"
        + "if not accelerator.is_main_process:\n    dataset = make_dataset(cfg)\n"
        + "policy = make_policy(dataset.meta)\n",
        HEADER
        + "result = {}\nif accelerator.is_main_process:\n    result = {'loss': loss.item()}\n"
        + "accelerator.log(result)\n",
        # a code-generation PPO trainer: the read is made only where the name is bound
        HEADER
        + "def evaluate(rewards):\n"
        + "    if accelerator.is_main_process:\n"
        + "        mean = sum(rewards) / len(rewards)\n"
        + "    return {'reward': mean if 'mean' in locals() else 0}\n",
        HEADER
        + "if accelerator.is_main_process:\n    best = loss.item()\n"
        + "try:\n    print(best)\nexcept NameError:\n    pass\n",
        HEADER
        + "if accelerator.is_main_process:\n    best = True\nelse:\n    best = False\n"
        + "print(best)\n",
        HEADER
        + "if accelerator.is_main_process:\n    tracker = make_tracker()\n"
        + "log = tracker.log if accelerator.is_main_process else print\n",
        HEADER
        + "if accelerator.is_main_process:\n    save = loss < best\n"
        + "if accelerator.is_main_process and save:\n    accelerator.save_state('best')\n",
        # the same trainer, its writer used under the test that made it
        HEADER + "class Trainer:\n"
        "    def __init__(self, model):\n"
        "        self.model = accelerator.prepare(model)\n"
        "        if accelerator.is_main_process:\n"
        "            self.writer = make_writer()\n"
        "    def log(self, step, loss):\n"
        "        if accelerator.is_main_process:\n"
        "            self.writer.add_scalar('loss', loss, step)\n"
        "    def fit(self, loader):\n"
        "        for step, x in enumerate(loader):\n"
        "            self.log(step, self.model(x).item())\n"
        "Trainer(model).fit(loader)\n",
        # the method returns early on the other ranks; a default the class sets for every rank
        HEADER + "class Trainer:\n"
        "    writer = None\n"
        "    def __init__(self, model):\n"
        "        if accelerator.is_main_process:\n"
        "            self.writer = make_writer()\n"
        "        self.tb = None\n"
        "        if accelerator.is_main_process:\n"
        "            self.tb = make_writer()\n"
        "    def log(self, loss):\n"
        "        if not accelerator.is_main_process:\n"
        "            return\n"
        "        self.tb.add_scalar('loss', loss)\n"
        "    def fit(self, loss):\n"
        "        self.writer.add_scalar('loss', loss)\n"
        "        self.log(loss)\n"
        "Trainer(model).fit(1.0)\n",
        # only ever called under the rank test
        HEADER + "class Trainer:\n"
        "    def __init__(self):\n"
        "        if accelerator.is_main_process:\n"
        "            self.writer = make_writer()\n"
        "    def log(self, loss):\n"
        "        self.writer.add_scalar('loss', loss)\n"
        "trainer = Trainer()\n"
        "if accelerator.is_main_process:\n"
        "    trainer.log(1.0)\n",
        # a method nothing in the file calls that runs no backward nor collective: its callers
        # (another module) may well call it under their own rank test
        HEADER + "class Trainer:\n"
        "    def __init__(self):\n"
        "        if accelerator.is_main_process:\n"
        "            self.writer = make_writer()\n"
        "    def log(self, loss):\n"
        "        self.writer.add_scalar('loss', loss)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for found in rank_only_reads(facts_of(script)):
            accelerator = accelerator_name(script, found.read)
            message = (
                f"Bind `{found.read.value}` on every rank: it is assigned only under the rank "
                f"test at line {script.line(found.guard)}, and the other ranks reach this read "
                f"with it unbound (NameError); assign it before `if {accelerator}."
                "is_main_process:` or read it under the same test"
            )
            yield self.finding(script, found.read, message=message)
        for attribute in rank_only_attributes(facts_of(script)):
            code = script.module.code_for_node(attribute.read)
            how = (
                f"it runs `{script.module.code_for_node(attribute.call.func)}` at line "
                f"{script.line(attribute.call)}, which every rank must reach"
                if attribute.synchronising
                else f"called at line {script.line(attribute.call)}"
            )
            message = (
                f"Bind `{code}` on every rank: the constructor sets it only under the rank test "
                f"at line {script.line(attribute.guard)}, and this method runs on every rank "
                f"({how}), where it raises "
                f"AttributeError; use it under the same test, or set it on every rank (`{code} "
                "= None` before the test) and check it here"
            )
            yield self.finding(script, attribute.read, message=message)
        for fill in rank_only_fills(facts_of(script)):
            accelerator = accelerator_name(script, fill.read)
            test = (
                f"the rank test at line {script.line(fill.guard)}"
                if isinstance(fill.guard, cst.If)
                else f"{fill.guard.name.value}(), which only some ranks run"  # type: ignore[attr-defined]
            )
            if fill.movable:
                advice = (
                    f"fill it on every rank: move line {script.line(fill.fill)} out of the "
                    "test (each rank then reads its own values; the main process's are "
                    "unchanged)"
                )
            else:
                guarded = (
                    f"`if {script.module.code_for_node(fill.guard.test)}:`"
                    if isinstance(fill.guard, cst.If)
                    else "that rank test"
                )
                advice = (
                    f"compute it, and what reads the result, under {guarded} too, or, where "
                    f"every rank needs the number, give every rank the values first: "
                    f"`{fill.name} = {accelerator}.gather_object({fill.name})` on every rank "
                    "before this line"
                )
            message = (
                f"`{fill.name}` is filled only under {test} (line "
                f"{script.line(fill.fill)}), so on the other ranks it is empty when this line "
                f"reads it and they stop with {fill.error}; {advice}"
            )
            yield self.finding(script, fill.read, message=message)
        for entry in rank_only_entries(facts_of(script)):
            read = script.module.code_for_node(entry.read)
            receiver = script.module.code_for_node(entry.call.func)
            where = f"line {script.line(entry.written)}"
            if entry.written is not entry.write:
                where += f", in the helper called at line {script.line(entry.write)}"
            message = (
                f"`{read}` is written only under the rank test at line "
                f"{script.line(entry.guard)} ({where}), so the other ranks still hold the value "
                f"it started with when every rank hands it to `{receiver}` here: the ranks "
                "step with different values and drift apart silently; give every rank the "
                f"main process's dict before this line (`{entry.name} = "
                f"accelerate.utils.broadcast_object_list([{entry.name}])[0]` on every rank), "
                "or write the entry on every rank where its value is the same on all of them"
            )
            yield self.finding(script, entry.read, message=message)
        for setting in rank_only_settings(facts_of(script)):
            method = setting.call.func.attr.value  # type: ignore[attr-defined]
            writes = "writes their part of the checkpoint (RNG states; FSDP or ZeRO shards)"
            if method == "load_state":
                writes = "reads their part of the checkpoint"
            message = (
                f"`{setting.name}` is set only under the rank test at line "
                f"{script.line(setting.guard)} (line {script.line(setting.write)}), so the "
                f"other ranks still hold its old value here, and the {method} at line "
                f"{script.line(setting.call)} {writes} in another folder: give every "
                f"rank the main process's value after the test (`{setting.name} = "
                f"accelerate.utils.broadcast_object_list([{setting.name}])[0]` on every rank), "
                "or set it on every rank before the test where every rank computes the same "
                "value (a time stamp does not)"
            )
            yield self.finding(script, setting.read, message=message)
