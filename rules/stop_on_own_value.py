from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import (
    BROADCASTING_METHODS,
    agreed_in_place,
    agrees_across_ranks,
    backends_in_view,
    collective_backends,
    read_outside_agreement,
)
from accelify.analysis.dataflow import variables_in
from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.loss_sources import Backward, backwards, last_binding, runs_before
from accelify.analysis.own_stops import Decided, agrees, decided_on_own_shard
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.structure_tests import model_outputs, structure_only_names
from accelify.analysis.syntax import dotted, statement_lines, target_names, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name

#: How many bindings one trace follows before it gives up (and reports nothing).
_MAX_BINDINGS = 60

_LOOP = (
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "for x, y in loader:\n"
    "    loss = (model(x) - y).pow(2).mean()\n"
)

#: Each epoch trains, then sums this rank's validation loss over its shard of a prepared loader.
_EARLY_STOP = (
    HEADER
    + "import torch\n"
    + "model, optimizer, loader, val_loader = accelerator.prepare(\n"
    + "    model, optimizer, loader, val_loader\n)\n"
    + "best, bad, last_save = float('inf'), 0, 0\n"
    + "for epoch in range(100):\n"
    + "    for x, y in loader:\n"
    + "        accelerator.backward(loss_fn(model(x), y))\n"
    + "        optimizer.step()\n"
    + "        optimizer.zero_grad()\n"
    + "    val_loss = 0.0\n"
    + "    with torch.no_grad():\n"
    + "        for x, y in val_loader:\n"
    + "            val_loss += loss_fn(model(x), y).item()\n"
    + "    val_loss /= len(val_loader)\n"
    + "    if val_loss < best:\n"
    + "        best, bad, last_save = val_loss, 0, epoch\n"
    + "    else:\n"
    + "        bad += 1\n"
)

#: The early-stopping object of most scripts: it counts epochs without improvement of the value
#: it is handed and sets its flag once the patience runs out.
_STOPPER = (
    "\n\nclass EarlyStopping:\n"
    "    def __init__(self, patience=3, delta=0.0):\n"
    "        self.patience, self.delta = patience, delta\n"
    "        self.best, self.counter, self.early_stop = float('inf'), 0, False\n\n"
    "    def __call__(self, val_loss):\n"
    "        if val_loss < self.best - self.delta:\n"
    "            self.best, self.counter = val_loss, 0\n"
    "        else:\n"
    "            self.counter += 1\n"
    "            if self.counter >= self.patience:\n"
    "                self.early_stop = True\n\n\n"
)

#: Each epoch hands the object this rank's validation loss over its shard, then stops on its flag.
_OBJECT_STOP = (
    HEADER
    + "import torch\n"
    + _STOPPER
    + "model, optimizer, loader, val_loader = accelerator.prepare(\n"
    + "    model, optimizer, loader, val_loader\n)\n"
    + "stopper = EarlyStopping(patience=5)\n"
    + "for epoch in range(100):\n"
    + "    for x, y in loader:\n"
    + "        accelerator.backward(loss_fn(model(x), y))\n"
    + "        optimizer.step()\n"
    + "        optimizer.zero_grad()\n"
    + "    val_loss = 0.0\n"
    + "    with torch.no_grad():\n"
    + "        for x, y in val_loader:\n"
    + "            val_loss += loss_fn(model(x), y).item()\n"
    + "    stopper(val_loss / len(val_loader))\n"
    + "    if stopper.early_stop:\n"
    + "        break\n"
)


#: The stopper handed to the training helper by its caller: the parameter is the object made in
#: ``main``; each epoch hands it this rank's validation loss over its shard.
_HANDED_STOPPER = (
    HEADER
    + "import torch\n"
    + _STOPPER
    + "def evaluate(model, val_loader):\n"
    + "    total = 0.0\n"
    + "    with torch.no_grad():\n"
    + "        for x, y in val_loader:\n"
    + "            total += loss_fn(model(x), y).item()\n"
    + "    return total / len(val_loader)\n\n\n"
    + "def train(model, optimizer, loader, val_loader, epochs, early_stopper=None):\n"
    + "    for epoch in range(epochs):\n"
    + "        for x, y in loader:\n"
    + "            accelerator.backward(loss_fn(model(x), y))\n"
    + "            optimizer.step()\n"
    + "        val_loss = evaluate(model, val_loader)\n"
    + "        if early_stopper is not None:\n"
    + "            early_stopper(val_loss)\n"
    + "            if early_stopper.early_stop:\n"
    + "                break\n\n\n"
    + "def main():\n"
    + "    model, optimizer, loader, val_loader = accelerator.prepare(\n"
    + "        model, optimizer, loader, val_loader\n    )\n"
    + "    train(model, optimizer, loader, val_loader, 10, early_stopper=EarlyStopping())\n"
)


#: A trainer that saves its best checkpoint (a barrier, then the weights) when this rank's own
#: validation loss improves: the ranks where it did wait in the barrier for the others.
_BEST_SAVE = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer, loader, val_loader):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer, self.loader, self.val_loader = self.accelerator.prepare(\n"
    "            model, optimizer, loader, val_loader\n"
    "        )\n"
    "        self.best = float('inf')\n\n"
    "    def _save_checkpoint(self):\n"
    "        self.accelerator.wait_for_everyone()\n"
    "        self.accelerator.save(self.accelerator.get_state_dict(self.model), 'best.pt')\n\n"
    "    def fit(self, epochs):\n"
    "        for epoch in range(epochs):\n"
    "            for x, y in self.loader:\n"
    "                self.accelerator.backward(torch.nn.functional.mse_loss(self.model(x), y))\n"
    "                self.optimizer.step()\n"
    "                self.optimizer.zero_grad()\n"
    "            eval_loss = 0.0\n"
    "            with torch.no_grad():\n"
    "                for x, y in self.val_loader:\n"
    "                    eval_loss += torch.nn.functional.mse_loss(self.model(x), y).item()\n"
    "            eval_loss /= len(self.val_loader)\n"
    "            if eval_loss < self.best:\n"
    "                self.best = eval_loss\n"
    "                self._save_checkpoint()\n"
)


#: A trainer hands itself and the epoch's logs to each callback of its list; the early-stopping
#: callback sets ``trainer.should_stop`` on this rank's own training loss, and ``fit`` stops on
#: it. ``{fold}`` ends the epoch's loop over batches.
_CALLBACK_STOP = (
    HEADER
    + "import torch\n\n\nclass EarlyStopping:\n"
    + "    def __init__(self, patience=2, monitor='train_loss'):\n"
    + "        self.patience, self.monitor = patience, monitor\n"
    + "        self.best, self.wait = float('inf'), 0\n\n"
    + "    def on_epoch_end(self, trainer, epoch, logs):\n"
    + "        if logs[self.monitor] < self.best:\n"
    + "            self.best, self.wait = logs[self.monitor], 0\n"
    + "        else:\n"
    + "            self.wait += 1\n"
    + "            if self.wait >= self.patience:\n"
    + "                trainer.should_stop = True\n\n\n"
    + "class Trainer:\n"
    + "    def __init__(self, model, optimizer, loader, callbacks=None):\n"
    + "        self.model, self.optimizer, self.loader = accelerator.prepare(\n"
    + "            model, optimizer, loader\n"
    + "        )\n"
    + "        self.callbacks = callbacks or []\n"
    + "        self.should_stop = False\n\n"
    + "    def on_epoch_end(self, epoch, logs):\n"
    + "        for cb in self.callbacks:\n"
    + "            cb.on_epoch_end(self, epoch, logs)\n\n"
    + "    def fit(self, epochs):\n"
    + "        for epoch in range(epochs):\n"
    + "            total, n = 0.0, 0\n"
    + "            for x, y in self.loader:\n"
    + "                loss = loss_fn(self.model(x), y)\n"
    + "                accelerator.backward(loss)\n"
    + "                self.optimizer.step()\n"
    + "                total += loss.item() * len(x)\n"
    + "                n += len(x)\n"
    + "{fold}"
    + "            logs = {{'train_loss': total / n}}\n"
    + "            self.on_epoch_end(epoch, logs)\n"
    + "            if self.should_stop:\n"
    + "                break\n\n\n"
    + "Trainer(model, optimizer, loader, callbacks=[EarlyStopping()]).fit(10)\n"
)


#: Each sample cut to a clip at its own random start, every clip ``{{cut}}`` long, where ``clip``
#: is ``{{shortest}}``'s length; then clips too short for the encoder are skipped (StyleTTS2's
#: ``train_first.py``, whose clip length is the shortest sample over the ranks, gathered).
_CLIPS = (
    HEADER
    + "import numpy as np\nimport torch\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for mels, lengths in loader:\n"
    + "    shortest = {shortest}.min().item()\n"
    + "    clip = min(int(shortest / 2 - 1), 100)\n"
    + "    clips = []\n"
    + "    for i in range(len(lengths)):\n"
    + "        start = np.random.randint(0, int(lengths[i].item() / 2) - clip)\n"
    + "        clips.append(mels[i, :, {cut}])\n"
    + "    clips = torch.stack(clips).detach()\n"
    + "    if clips.shape[-1] < 80:\n"
    + "        continue\n"
    + "    accelerator.backward(model(clips).mean())\n"
    + "    optimizer.step()\n"
    + "    optimizer.zero_grad()\n"
)


#: A loop class whose per-batch step returns before the backward when ``{{nan}}`` says the loss
#: is NaN (gravitorch's ``AccelerateTrainingLoop._train_one_batch``; its loop over the prepared
#: loader is a base class's, out of sight).
_NAN_STEP = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Loop:\n"
    "    def __init__(self):\n"
    "        self.accelerator = Accelerator()\n\n"
    "    def train_one_batch(self, model, optimizer, batch):\n"
    "        optimizer.zero_grad()\n"
    "        loss = model(batch)['loss']\n"
    "        if {nan}:\n"
    "            return None\n"
    "        self.accelerator.backward(loss)\n"
    "        optimizer.step()\n"
    "        return loss\n"
)


#: A training loss folded on the main process alone, then tested by every rank; ``{use}``
#: below the loop over batches.
_FOLDED_ON_MAIN = (
    HEADER
    + "import torch\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "best = float('inf')\n"
    + "for epoch in range(10):\n"
    + "    running = 0.0\n"
    + "    for x, y in loader:\n"
    + "        loss = (model(x) - y).pow(2).mean()\n"
    + "        accelerator.backward(loss)\n"
    + "        optimizer.step()\n"
    + "{fold}"
    + "{use}"
)
_ON_MAIN = "        if accelerator.is_main_process:\n            running += loss.item()\n"
_STOP_ON_RUNNING = "    if running >= best:\n        break\n    best = running\n"
_SAVE_ON_RUNNING = (
    "    if running < best:\n        best = running\n        accelerator.wait_for_everyone()\n"
)


#: lucidrains' trainers: batches drawn by hand (``next(dl_iter)`` in a helper handed the
#: iterator) from a generator the file defines over the prepared loader, the epoch's mean loss
#: tested against a threshold; ``{fold}`` before the test.
_DRAWN_STOP = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "def cycle(dl):\n"
    "    while True:\n"
    "        for data in dl:\n"
    "            yield data\n\n\n"
    "class Trainer(torch.nn.Module):\n"
    "    def __init__(self, model, optimizer, loader):\n"
    "        super().__init__()\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
    "            model, optimizer, loader\n"
    "        )\n\n"
    "    def next_batch(self, dl_iter):\n"
    "        x, y = next(dl_iter)\n"
    "        return x, y\n\n"
    "    def train(self, epochs, stop_at_loss):\n"
    "        dl_iter = cycle(self.loader)\n"
    "        for epoch in range(epochs):\n"
    "            total, n = 0.0, 0\n"
    "            while n < len(self.loader):\n"
    "                x, y = self.next_batch(dl_iter)\n"
    "                loss = torch.nn.functional.mse_loss(self.model(x), y)\n"
    "                self.accelerator.backward(loss)\n"
    "                self.optimizer.step()\n"
    "                self.optimizer.zero_grad()\n"
    "                total += loss.item()\n"
    "                n += 1\n"
    "{fold}"
    "            if total / n < stop_at_loss:\n"
    "                break\n"
)


#: A model that trains itself on some configurations returns no ``loss`` key; ``{test}`` tests
#: the output before the backward.
_STRUCTURE = (
    HEADER
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for batch in loader:\n"
    + "    with accelerator.accumulate(model):\n"
    + "        out = model(**batch)\n"
    + "        if {test}:\n"
    + "            continue\n"
    + "        accelerator.backward(out['loss'])\n"
    + "        optimizer.step()\n"
    + "        optimizer.zero_grad()\n"
)


#: A QA trainer's early stop on the exact match its evaluate() returns first, computed from
#: gathered answers, beside a hit rate it returns second from this rank's own retrievals
#: (EMAT's trainer): the stop reads the agreed slot of the returned tuple, or the own one.
_UNPACKED_STOP = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "\n"
    "\n"
    "class QATrainer:\n"
    "    def __init__(self, model, optimizer, loader, dev_loader):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer, self.loader, self.dev_loader = self.accelerator.prepare(\n"
    "            model, optimizer, loader, dev_loader\n"
    "        )\n"
    "\n"
    "    @torch.no_grad()\n"
    "    def evaluate(self):\n"
    "        hits, answers = [], []\n"
    "        for batch in self.dev_loader:\n"
    "            out = self.model(batch)\n"
    "            hits += out.hits.tolist()\n"
    "            answers += self.accelerator.gather_for_metrics(out.answers).tolist()\n"
    "        return sum(answers) / len(answers), sum(hits) / len(hits)\n"
    "\n"
    "    def train(self, epochs, patience):\n"
    "        best = None\n"
    "        for epoch in range(epochs):\n"
    "            for batch in self.loader:\n"
    "                self.accelerator.backward(self.model(batch).loss)\n"
    "                self.optimizer.step()\n"
    "                self.optimizer.zero_grad()\n"
    "            em, hit_rate = self.evaluate()\n"
    "            if best is None or {tested} > best:\n"
    "                best = {tested}\n"
    "                patience = 3\n"
    "            else:\n"
    "                patience -= 1\n"
    "                if patience <= 0:\n"
    "                    break\n"
)


#: A trainer whose patience counter is kept on an object it holds (``self.state.wait``, a class
#: attribute of ``State``), stepped under a test of this rank's validation loss.
_HELD_COUNTER = (
    HEADER
    + "import torch\n\n\nclass State:\n    wait = 0\n\n\nclass Trainer:\n"
    + "    def __init__(self, model, optimizer, loader, val_loader):\n"
    + "        self.model, self.optimizer, self.loader, self.val_loader = (\n"
    + "            accelerator.prepare(model, optimizer, loader, val_loader)\n"
    + "        )\n"
    + "        self.best, self.state, self.patience = float('inf'), State(), 3\n\n"
    + "    def evaluate(self):\n"
    + "        total = 0.0\n"
    + "        with torch.no_grad():\n"
    + "            for x, y in self.val_loader:\n"
    + "                total += loss_fn(self.model(x), y).item()\n"
    + "{fold}"
    + "        return total / len(self.val_loader)\n\n"
    + "    def fit(self, epochs):\n"
    + "        for epoch in range(epochs):\n"
    + "            for x, y in self.loader:\n"
    + "                accelerator.backward(loss_fn(self.model(x), y))\n"
    + "                self.optimizer.step()\n"
    + "            val_loss = self.evaluate()\n"
    + "            if val_loss < self.best:\n"
    + "                self.best, self.state.wait = val_loss, 0\n"
    + "            else:\n"
    + "                self.state.wait += 1\n"
    + "            if self.state.wait >= self.patience:\n"
    + "                break\n"
)


#: A training loop that stops when a flag file appears, tested by every rank (``{probe}``).
_STOP_FILE = (
    HEADER
    + "import os\nfrom pathlib import Path\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for epoch in range(100):\n"
    + "    for batch in loader:\n"
    + "        accelerator.backward(model(batch).mean())\n"
    + "        optimizer.step()\n"
    + "        optimizer.zero_grad()\n"
    + "    if {probe}:\n"
    + "        break\n"
    + "{after}"
)


#: A ``while`` loop that draws its batches by hand from a prepared loader (``next(batches,
#: None)``) and skips one on its own content before the backward (a multi-task trainer,
#: lintreal41): {skip} is the skip.
_WHILE_DRAWN = (
    "from accelerate import Accelerator\n"
    "\n"
    "accelerator = Accelerator()\n"
    "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    "batches = iter(loader)\n"
    "while True:\n"
    "    batch = next(batches, None)\n"
    "    if batch is None:\n"
    "        break\n"
    "{skip}    loss = model(**batch).loss\n"
    "    accelerator.backward(loss)\n"
    "    optimizer.step()\n"
    "    optimizer.zero_grad()\n"
)


class StopOnOwnValue(Rule):
    """``break`` or ``continue`` in a training loop under a test of a value this rank computed
    from its own batch, before the loop's next ``backward`` or collective: a PPO trainer's early
    stop on its minibatch's KL (``if approx_kl > 1.5 * target_kl: break``), a skipped non-finite
    loss (``if torch.isnan(loss): continue``), an early stop on the validation loss of this
    rank's shard of a prepared DataLoader, never reduced, tested itself or through the counter
    the epoch loop steps under a test of it (``if val_loss < best: ... bad = 0`` / ``else: bad
    += 1``, then ``if bad >= patience: break``), or through an early-stopping object of the file
    handed that loss (``stopper(val_loss)``, then ``if stopper.early_stop: break``, or ``if
    stopper.step(val_loss): break``: the method the call runs is followed to the test of the value
    it is handed, through the attribute it sets or the value it returns, also into another
    method of its class it hands the value to, ``self._check(val_loss)``; an object handed to
    the training helper, ``train(..., early_stopper=es)``, is the one its caller made). Each
    rank sees its own
    shard, so the test comes out differently on different ranks: the rank that stops (or skips)
    leaves the others in the backward's gradient all-reduce (or the barrier, the gather) waiting
    for it; they hang, or pair that reduce with the stopped rank's next collective and average
    gradients of different steps. The decision has to be made by every rank together:
    ``accelerator.set_trigger()`` under the test and ``if accelerator.check_trigger(): break`` on
    every rank after it (the trigger is reduced over ranks), or the value reduced first
    (``accelerator.reduce``; for an object, before the call that hands it the value). Where
    the call (or the counter's test) runs under ``if accelerator.is_main_process:``, a reduce
    there would run on one rank and hang: the advice is the trigger, or the reduce on every
    rank with the call moved out of the guard.

    The same decision guarding a collective instead of a stop (``if eval_loss < best:
    self._save_checkpoint()``, the method waiting for everyone): only the ranks where the test
    holds enter it, and they wait there for the others (hang); reported at the ``if``, with the
    value reduced before the test (or decided on the main process and broadcast) as the fix.

    A value reduced on some passes only (``if step % 10 == 0: loss = accelerator.reduce(loss)``
    in an ``if`` without ``else`` that does not hold the test) is this rank's own on the others,
    and is reported. Logging such a value on every pass is no bug (the log shows the main
    process's own loss between reductions, as most scripts' logs do), nor is a value reduced on
    every pass and logged on some.

    The same with a stop-flag file polled by every rank (``if os.path.exists("STOP"):
    break``, ``Path(...).exists()``, ``(Path(out) / "STOP").exists()``): each rank asks the
    file system when it gets there, so a
    file made between two ranks' questions stops one of them a pass before the others (and a
    machine without the shared folder never sees it); the trigger makes it one decision. Not a
    probe gathered or broadcast before the test, nor one of a file named by the loop's own
    target (``if os.path.exists(f"ckpt_{epoch}"): continue``: an epoch an earlier run ended).

    A test of a counter, a setting, or of a value gathered or reduced over the ranks before the
    test (every rank holds it alike), a test under a rank guard (ACC210's), a ``continue`` with
    no collective after it in the loop, and a loop over a DataLoader the file never prepares
    (every rank sees the same batches) are left alone."""

    code = "ACC420"
    # a decision made under a rank test on this rank's own value: ACC210 sees the rank test
    # alone (its trigger would stop every rank on the main process's shard value); this
    # finding's advice reduces the value as well
    covers = ("ACC210",)
    name = "stop-on-own-value"
    message = (
        "Stop on every rank together: this test reads a value this rank computed from its own "
        "batch, so this rank alone leaves while the others wait in the next collective (hang); "
        "call accelerator.set_trigger() under the test and `if accelerator.check_trigger(): "
        "break` on every rank"
    )
    why = (
        "A rank that breaks or skips on its own loss leaves the others waiting in the "
        "backward's all-reduce."
    )
    bad = (
        # a rank-local ``continue`` before the backward of a ``while`` loop over ``next()``
        Example(
            _WHILE_DRAWN.format(skip='    if batch["labels"].sum() == 0:\n        continue\n'),
            11,
            9,
        ),
        # a stop-flag file polled by every rank: each asks at its own moment (lintfix24)
        Example(_STOP_FILE.format(probe="os.path.exists('STOP')", after=""), 12, 9),
        # ... a path joined onto a Path (review11b)
        Example(
            _STOP_FILE.format(probe="(Path(args.output_dir) / 'STOP').exists()", after=""), 12, 9
        ),
        Example(
            _STOP_FILE.format(probe="stop", after="").replace(
                "    if stop:", "    stop = Path('STOP').exists()\n    if stop:"
            ),
            13,
            9,
        ),
        # a step that returns before the backward on this rank's own NaN loss
        Example(_NAN_STEP.format(nan="torch.isnan(loss)"), 13, 13),
        # clips cut to the length of this rank's shortest sample: each rank skips on its own
        Example(_CLIPS.format(shortest="lengths", cut="start * 2:(start + clip) * 2"), 15, 9),
        # ... or to the agreed length, but grown with the rank's own random start
        Example(
            _CLIPS.format(shortest="accelerator.gather(lengths)", cut="start:start * 2 + clip"),
            15,
            9,
        ),
        # a training loss folded on the main process alone and tested by every rank: the
        # others keep 0.0 and break at the second epoch, the main process goes on
        Example(
            _FOLDED_ON_MAIN.format(fold=_ON_MAIN, use=_STOP_ON_RUNNING),
            15,
            9,
        ),
        # ... and a barrier under a test of it: only the ranks where it holds get there
        Example(
            _FOLDED_ON_MAIN.format(fold=_ON_MAIN, use=_SAVE_ON_RUNNING),
            14,
            5,
        ),
        # a batch drawn by hand from the prepared loader, through an iterator made in place
        # (``next(iter(loader))``) or by ``cycle`` imported from itertools: this rank's loss
        Example(
            HEADER
            + "import torch\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for step in range(100):\n"
            + "    x, y = next(iter(loader))\n"
            + "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n"
            + "    if loss.item() < 0.01:\n"
            + "        break\n",
            11,
            9,
        ),
        Example(
            HEADER
            + "import torch\n"
            + "from itertools import cycle\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "batches = cycle(loader)\n"
            + "for step in range(100):\n"
            + "    x, y = next(batches)\n"
            + "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n"
            + "    if loss.item() < 0.01:\n"
            + "        break\n",
            13,
            9,
        ),
        # the loaders come from a helper that loads and prepares them: the validation loss is
        # still this rank's shard's, and the patience ends this rank's epochs alone
        Example(
            HEADER
            + "import torch\n"
            + "def load_split(name):\n"
            + "    loader = torch.load(f'data/{name}.pt').loader(512)\n"
            + "    loader = accelerator.prepare(loader)\n"
            + "    return loader\n"
            + "train_loader = load_split('train')\n"
            + "valid_loader = load_split('valid')\n"
            + "model, optimizer = accelerator.prepare(model, optimizer)\n"
            + "best, count = float('inf'), 0\n"
            + "for epoch in range(100):\n"
            + "    for x, y in train_loader:\n"
            + "        accelerator.backward(loss_fn(model(x), y))\n"
            + "        optimizer.step()\n"
            + "    total = sum(loss_fn(model(x), y).item() for x, y in valid_loader)\n"
            + "    if total < best:\n"
            + "        best, count = total, 0\n"
            + "    else:\n"
            + "        count += 1\n"
            + "        if count == 3:\n"
            + "            break\n",
            22,
            13,
        ),
        # tril's PPO: the early stop on the minibatch's approximate KL ends this rank's epochs
        Example(
            HEADER
            + "import torch\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for epoch in range(n_epochs):\n"
            + "    for batch in loader:\n"
            + "        log_ratio = model(batch.obs) - batch.old_log_prob\n"
            + "        ratio = torch.exp(log_ratio)\n"
            + "        with torch.no_grad():\n"
            + "            approx_kl = torch.mean((ratio - 1) - log_ratio).cpu()\n"
            + "        loss = -(batch.advantages * ratio).mean()\n"
            + "        if target_kl is not None and approx_kl > 1.5 * target_kl:\n"
            + "            break\n"
            + "        accelerator.backward(loss)\n"
            + "        optimizer.step()\n",
            13,
            13,
        ),
        # the loss reduced only every tenth step: on the other steps the test reads this
        # rank's own loss
        Example(
            HEADER
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for step, (x, y) in enumerate(loader):\n"
            + "    loss = (model(x) - y).pow(2).mean()\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n"
            + "    if step % 10 == 0:\n"
            + "        loss = accelerator.reduce(loss.detach(), 'mean')\n"
            + "    if loss.item() < 1e-3:\n"
            + "        break\n",
            11,
            9,
        ),
        # the same test, but what it reads is bound again between the reduce and the test:
        # the passes differ
        Example(
            HEADER
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for step, (x, y) in enumerate(loader):\n"
            + "    loss = (model(x) - y).pow(2).mean()\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n"
            + "    if step % 10 == 0:\n"
            + "        loss = accelerator.reduce(loss.detach(), 'mean')\n"
            + "    step += 1\n"
            + "    if step % 10 == 0 and loss.item() < 1e-3:\n"
            + "        break\n",
            12,
            9,
        ),
        # a non-finite loss skipped on this rank alone, before its backward
        Example(
            HEADER
            + "import torch\n"
            + _LOOP
            + "    if torch.isnan(loss):\n"
            + "        continue\n"
            + "    accelerator.backward(loss)\n"
            + "    optimizer.step()\n",
            8,
            9,
        ),
        # the key's presence is the same on every rank, the loss inside it is not
        Example(_STRUCTURE.format(test="'loss' not in out or out['loss'].isnan()"), 8, 13),
        # through the trainer's attributes and its own step
        Example(
            HEADER
            + "import math\n\n\n"
            + "class Trainer:\n"
            + "    def step(self, loss):\n"
            + "        accelerator.backward(loss)\n"
            + "        self.optimizer.step()\n\n"
            + "    def fit(self):\n"
            + "        for batch in self.loader:\n"
            + "            loss = self.model(**batch).loss\n"
            + "            value = loss.item()\n"
            + "            if not math.isfinite(value):\n"
            + "                continue\n"
            + "            self.step(loss)\n\n\n"
            + "trainer = Trainer()\n"
            + "trainer.model, trainer.optimizer, trainer.loader = accelerator.prepare(\n"
            + "    trainer.model, trainer.optimizer, trainer.loader\n)\n",
            16,
            17,
        ),
        # an early stop on this rank's validation loss, through the patience counter
        Example(_EARLY_STOP + "    if bad >= patience:\n        break\n", 23, 9),
        # the same in a trainer: the counter on self, the loss from a method
        Example(
            HEADER
            + "import torch\n\n\nclass Trainer:\n"
            + "    def __init__(self, model, optimizer, loader, val_loader):\n"
            + "        self.model, self.optimizer, self.loader, self.val_loader = (\n"
            + "            accelerator.prepare(model, optimizer, loader, val_loader)\n"
            + "        )\n"
            + "        self.best, self.wait, self.patience = float('inf'), 0, 3\n\n"
            + "    def evaluate(self):\n"
            + "        total = 0.0\n"
            + "        with torch.no_grad():\n"
            + "            for x, y in self.val_loader:\n"
            + "                total += loss_fn(self.model(x), y).item()\n"
            + "        return total / len(self.val_loader)\n\n"
            + "    def fit(self, epochs):\n"
            + "        for epoch in range(epochs):\n"
            + "            for x, y in self.loader:\n"
            + "                accelerator.backward(loss_fn(self.model(x), y))\n"
            + "                self.optimizer.step()\n"
            + "            val_loss = self.evaluate()\n"
            + "            if val_loss < self.best:\n"
            + "                self.best, self.wait = val_loss, 0\n"
            + "            else:\n"
            + "                self.wait += 1\n"
            + "            if self.wait >= self.patience:\n"
            + "                break\n",
            31,
            17,
        ),
        # ... or on an object the trainer holds (``self.state.wait``)
        Example(_HELD_COUNTER.format(fold=""), 35, 17),
        # an early-stopping object handed this rank's validation loss: its flag stops the loop
        Example(_OBJECT_STOP, 35, 9),
        # ... its __call__ handing the decision to another method of its class
        Example(
            _OBJECT_STOP.replace(
                "    def __call__(self, val_loss):\n",
                "    def __call__(self, val_loss):\n        self._check(val_loss)\n\n"
                "    def _check(self, val_loss):\n",
            ),
            38,
            9,
        ),
        # ... or handed to the training helper as a parameter
        Example(_HANDED_STOPPER, 37, 17),
        # the same object in a trainer, its method returning the decision
        Example(
            HEADER
            + "import torch\n\n\nclass Stopper:\n"
            + "    def __init__(self, patience):\n"
            + "        self.patience, self.best, self.bad = patience, float('inf'), 0\n\n"
            + "    def step(self, metric):\n"
            + "        if metric < self.best:\n"
            + "            self.best, self.bad = metric, 0\n"
            + "            return False\n"
            + "        self.bad += 1\n"
            + "        return self.bad >= self.patience\n\n\n"
            + "class Trainer:\n"
            + "    def __init__(self, model, optimizer, loader, val_loader):\n"
            + "        self.model, self.optimizer, self.loader, self.val_loader = (\n"
            + "            accelerator.prepare(model, optimizer, loader, val_loader)\n"
            + "        )\n"
            + "        self.stopper = Stopper(patience=3)\n\n"
            + "    def evaluate(self):\n"
            + "        total = 0.0\n"
            + "        with torch.no_grad():\n"
            + "            for x, y in self.val_loader:\n"
            + "                total += loss_fn(self.model(x), y).item()\n"
            + "        return total / len(self.val_loader)\n\n"
            + "    def fit(self, epochs):\n"
            + "        for epoch in range(epochs):\n"
            + "            for x, y in self.loader:\n"
            + "                accelerator.backward(loss_fn(self.model(x), y))\n"
            + "                self.optimizer.step()\n"
            + "            if self.stopper.step(self.evaluate()):\n"
            + "                break\n",
            38,
            17,
        ),
        # the best checkpoint saved (a barrier in the method) when this rank's own shard's
        # validation loss improved: reported at the test
        Example(_BEST_SAVE, 28, 13),
        # a callback of the trainer's list sets the trainer's flag on this rank's own training
        # loss, handed in the logs dict: fit() stops on it alone
        Example(_CALLBACK_STOP.format(fold=""), 44, 17),
        # the same callbacks run by hook name, the logs reaching them through ``*args``
        Example(
            _CALLBACK_STOP.format(fold="")
            .replace("def on_epoch_end(self, epoch, logs)", "def _run_callbacks(self, hook, *args)")
            .replace("cb.on_epoch_end(self, epoch, logs)", "getattr(cb, hook)(self, *args)")
            .replace(
                "self.on_epoch_end(epoch, logs)", "self._run_callbacks('on_epoch_end', epoch, logs)"
            ),
            44,
            17,
        ),
        # batches drawn by hand from a generator over the prepared loader, through a helper:
        # the epoch's mean loss is still this rank's shard's
        Example(_DRAWN_STOP.format(fold=""), 36, 17),
        # the early stop reads the hit rate evaluate() returns second: this rank's shard's
        Example(_UNPACKED_STOP.format(tested="hit_rate"), 35, 21),
        # the validation loss from a loss method the base trainer leaves to its subclasses
        # (``raise NotImplementedError``): the override computes it from this rank's batch
        # (lintreal44, read_file id 29176862081)
        Example(
            _BEST_SAVE.replace(
                "torch.nn.functional.mse_loss(self.model(x), y).item()",
                "self.cal_loss(x, y).item()",
            ).replace(
                "    def fit(self, epochs):\n",
                "    def cal_loss(self, x, y):\n        raise NotImplementedError\n\n"
                "    def fit(self, epochs):\n",
            ),
            31,
            13,
        ),
    )
    good = (
        # the loader ran out: a prepared loader's shards run out on the same pass
        _WHILE_DRAWN.format(skip=""),
        # the advice: every rank skips the batch together
        _WHILE_DRAWN.format(
            skip='    if batch["labels"].sum() == 0:\n        accelerator.set_trigger()\n'
            "    if accelerator.check_trigger():\n        continue\n"
        ),
        # ... the flag file's answer made every rank's through the trigger
        _STOP_FILE.format(
            probe="os.path.exists('STOP')",
            after="    if accelerator.check_trigger():\n        break\n",
        ).replace(
            "        break\n    if accelerator",
            "        accelerator.set_trigger()\n    if accelerator",
        ),
        # ... or gathered in the test itself, or rank 0's answer handed to every rank
        # (review11b): every rank decides alike
        _STOP_FILE.format(
            probe="accelerator.gather(torch.tensor([os.path.exists('STOP')])).any()", after=""
        ),
        _STOP_FILE.format(
            probe="accelerator.gather(\n"
            "        torch.tensor([(Path(args.output_dir) / 'STOP').exists()])\n    ).any()",
            after="",
        ),
        _STOP_FILE.format(probe="stop[0]", after="")
        .replace(
            "    if stop[0]:",
            "    stop = [os.path.exists('STOP')]\n    broadcast_object_list(stop)\n    if stop[0]:",
        )
        .replace(
            "import os\n",
            "import os\nimport torch\nfrom accelerate.utils import broadcast_object_list\n",
        ),
        # an epoch an earlier run finished, skipped by its own checkpoint's name: a file there
        # before the run, the same answer on every rank (review11b)
        HEADER
        + "import os\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for epoch in range(100):\n"
        + "    if os.path.exists(f'ckpt_{epoch}'):\n"
        + "        continue\n"
        + "    for batch in loader:\n"
        + "        accelerator.backward(model(batch).mean())\n"
        + "        optimizer.step()\n"
        + "        optimizer.zero_grad()\n"
        + "    accelerator.save_state(f'ckpt_{epoch}')\n",
        # a loop of plain work that skips what is done already: no collective waits after it
        HEADER
        + "import os\nimport torch\n"
        + "for name in names:\n"
        + "    if os.path.exists(name + '.pt'):\n"
        + "        continue\n"
        + "    torch.save(make(name), name + '.pt')\n",
        # ... the NaN flag gathered first: every rank returns, or none does
        _NAN_STEP.format(nan="self.accelerator.gather(torch.isnan(loss)).any()"),
        # ... or a test of the output's structure, the same on every rank
        _NAN_STEP.format(nan="loss is None"),
        # clips of the shortest sample's length over every rank (gathered), each cut at its own
        # random start: their length is the same on every rank, and so is the skip
        _CLIPS.format(shortest="accelerator.gather(lengths)", cut="start * 2:(start + clip) * 2"),
        # the counter held on ``self.state`` stepped on the validation loss reduced over ranks
        _HELD_COUNTER.format(
            fold="        total = accelerator.reduce(torch.tensor(total), 'mean').item()\n"
        ),
        # ... the exact match it returns first: decoded from gathered answers, agreed
        _UNPACKED_STOP.format(tested="em"),
        # the same epoch loss summed over the ranks before the test
        _DRAWN_STOP.format(
            fold="            total = self.accelerator.reduce(torch.tensor(total), 'mean').item()\n"
        ),
        # the callback's training loss reduced over the ranks before the logs hold it
        _CALLBACK_STOP.format(
            fold="            total = accelerator.reduce(torch.tensor(total), 'sum').item()\n"
            "            n = accelerator.reduce(torch.tensor(n), 'sum').item()\n"
        ),
        # the same training loss folded on every rank, reduced before the test, and the
        # barrier under it: every rank decides on one number
        _FOLDED_ON_MAIN.format(
            fold="        running += loss.item()\n",
            use="    running = accelerator.reduce(torch.tensor(running), 'mean').item()\n"
            + _SAVE_ON_RUNNING,
        ),
        # the fold and its test under the same rank test, with nothing every rank must reach
        _FOLDED_ON_MAIN.format(
            fold=_ON_MAIN,
            use="    if accelerator.is_main_process and running < best:\n"
            "        best = running\n        print('best', best)\n",
        ),
        # a tri-modal retrieval trainer: the step count of a loop under a progress bar
        # (``tqdm(enumerate(loader))``) is the same on every rank, and so is what a test on it
        # decides (the gathered validation loss)
        HEADER
        + "from tqdm import tqdm\n"
        + _LOOP.replace("for x, y in loader", "for i, (x, y) in tqdm(enumerate(loader))")
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n"
        + "    if (i + 1) % 100 == 0:\n"
        + "        dev_loss = accelerator.gather(loss).mean().item()\n"
        + "        if dev_loss < 0.1:\n"
        + "            accelerator.wait_for_everyone()\n",
        # the best checkpoint saved on the validation loss reduced over the ranks first
        _BEST_SAVE.replace(
            "            if eval_loss < self.best:\n",
            "            eval_loss = self.accelerator.reduce(\n"
            "                torch.tensor(eval_loss, device=self.accelerator.device), 'mean'\n"
            "            ).item()\n"
            "            if eval_loss < self.best:\n",
        ),
        # the early stop on the validation loss reduced over the ranks: they stop together
        _EARLY_STOP.replace(
            "    if val_loss < best:\n",
            '    val_loss = accelerator.reduce(torch.tensor(val_loss), "mean").item()\n'
            + "    if val_loss < best:\n",
        )
        + "    if bad >= patience:\n        break\n",
        # the per-sample losses gathered: every rank sums the whole set
        _EARLY_STOP.replace(
            "val_loss += loss_fn(model(x), y).item()",
            "val_loss += accelerator.gather_for_metrics(loss_fn(model(x), y)).sum().item()",
        )
        + "    if bad >= patience:\n        break\n",
        # the early-stopping object handed the validation loss reduced over the ranks first
        _OBJECT_STOP.replace(
            "    stopper(val_loss / len(val_loader))\n",
            "    val_loss = accelerator.reduce(torch.tensor(val_loss), 'mean').item()\n"
            + "    stopper(val_loss / len(val_loader))\n",
        ),
        # ... or the per-sample losses gathered: every rank hands it the whole set's mean
        _OBJECT_STOP.replace(
            "val_loss += loss_fn(model(x), y).item()",
            "val_loss += accelerator.gather_for_metrics(loss_fn(model(x), y)).mean().item()",
        ),
        # ... or a validation loader the file never prepares: every rank reads the whole set
        _OBJECT_STOP.replace(", val_loader = accelerator", " = accelerator").replace(
            "    model, optimizer, loader, val_loader\n)", "    model, optimizer, loader\n)"
        ),
        # ... or, handed to the helper, the validation loss reduced before the call
        _HANDED_STOPPER.replace(
            "            early_stopper(val_loss)\n",
            "            val_loss = accelerator.reduce(torch.tensor(val_loss), 'mean').item()\n"
            "            early_stopper(val_loss)\n",
        ),
        # ... or a value every rank holds alike: the epoch's learning rate, a setting
        _OBJECT_STOP.replace(
            "stopper(val_loss / len(val_loader))", "stopper(scheduler.get_last_lr()[0])"
        ),
        # a counter stepped under a test of settings: the same on every rank
        _EARLY_STOP.replace("    if val_loss < best:\n", "    if epoch % args.eval_every == 0:\n")
        + "    if bad >= patience:\n        break\n",
        # the stop decided together: the trigger is reduced over the ranks
        HEADER
        + "import torch\n"
        + _LOOP
        + "    if torch.isnan(loss):\n"
        + "        accelerator.set_trigger()\n"
        + "    if accelerator.check_trigger():\n"
        + "        continue\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n",
        # reduced on every step, on either branch of the test; or reduced and tested on the
        # same passes only
        HEADER
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for step, (x, y) in enumerate(loader):\n"
        + "    loss = (model(x) - y).pow(2).mean()\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n"
        + "    if step % 10 == 0:\n"
        + "        loss = accelerator.reduce(loss.detach(), 'mean')\n"
        + "    else:\n"
        + "        loss = accelerator.reduce(loss.detach(), 'sum')\n"
        + "    if loss.item() < 1e-3:\n"
        + "        break\n"
        + "    if step % 5 == 0:\n"
        + "        avg = accelerator.reduce(loss.detach(), 'mean')\n"
        + "        if avg.item() < 1e-3:\n"
        + "            break\n",
        # reduced on some passes and tested under the same condition (after it, or right of
        # it in an ``and``): every pass that reaches the test ran the reduce
        HEADER
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for step, (x, y) in enumerate(loader):\n"
        + "    loss = (model(x) - y).pow(2).mean()\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n"
        + "    if step % log_every == 0:\n"
        + "        loss = accelerator.reduce(loss.detach(), 'mean')\n"
        + "    if step % log_every == 0 and loss.item() < 1e-3:\n"
        + "        break\n",
        HEADER
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for step, (x, y) in enumerate(loader):\n"
        + "    loss = (model(x) - y).pow(2).mean()\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n"
        + "    if step % log_every == 0:\n"
        + "        loss = accelerator.reduce(loss.detach(), 'mean')\n"
        + "    if step % log_every == 0:\n"
        + "        if loss.item() < 1e-3:\n"
        + "            break\n",
        # a value reduced over the ranks before the test: every rank decides alike
        HEADER
        + _LOOP
        + "    mean_loss = accelerator.reduce(loss.detach(), 'mean')\n"
        + "    if mean_loss.isnan():\n"
        + "        break\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n",
        # ... or in the test itself: every rank tests the same sum (ACC416's good example)
        HEADER
        + _LOOP
        + "    if accelerator.reduce(loss.detach()).isnan():\n"
        + "        continue\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n",
        # TRL's early stop: the KL reduced in place over the ranks before the test
        HEADER
        + "import torch.distributed as dist\n"
        + _LOOP
        + "    kl = (loss.detach() - baseline).mean()\n"
        + "    dist.all_reduce(kl)\n"
        + "    if kl > target:\n"
        + "        break\n"
        + "    accelerator.backward(loss)\n",
        # counters and settings: the same on every rank
        HEADER
        + _LOOP.replace("for x, y in loader", "for step, (x, y) in enumerate(loader)")
        + "    if step >= args.max_steps:\n"
        + "        break\n"
        + "    accelerator.backward(loss * args.scale)\n"
        + "    optimizer.step()\n",
        # after the last collective of the loop: nothing waits for this rank
        HEADER
        + _LOOP
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n"
        + "    if loss.item() > 10.0:\n"
        + "        continue\n"
        + "    history.append(loss.item())\n",
        # a loader every rank reads whole: the same batches, the same losses
        HEADER
        + "import torch\n"
        + "loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
        + "model, optimizer = accelerator.prepare(model, optimizer)\n"
        + "for x, y in loader:\n"
        + "    loss = (model(x) - y).pow(2).mean()\n"
        + "    if torch.isnan(loss):\n"
        + "        continue\n"
        + "    accelerator.backward(loss)\n",
        # a rank guard: ACC210's
        HEADER
        + _LOOP
        + "    accelerator.backward(loss)\n"
        + "    if accelerator.is_main_process and loss.item() < 0.01:\n"
        + "        break\n",
        # vilmedic: a test of the output's structure (a key the model returns, its type, an
        # optional head, how many outputs it has) decides alike on every rank
        _STRUCTURE.format(test="'loss' not in out"),
        _STRUCTURE.format(test="not isinstance(out, dict)"),
        _STRUCTURE.format(test="out.get('aux') is None and not hasattr(out, 'keys')"),
        _STRUCTURE.format(test="len(out) < 2"),
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        losses = backwards(script)
        if not losses:
            return
        unprepared = script.names_of(Kind.DATALOADER) - script.prepared_names
        for node in script.index.of_type(cst.Break) + script.index.of_type(cst.Continue):
            loop = script.index.enclosing_loop(node)
            if not isinstance(loop, cst.For | cst.While) or script.under_rank_guard(node):
                continue
            test = _test_around(script, node, loop)
            if test is None or facts.ranks.is_rank_test(test.test):
                continue
            if isinstance(loop, cst.While) and _exhausted_test(script, test):
                continue  # ``if batch is None: break``: a prepared loader's, the same count
            if (
                isinstance(loop, cst.For)
                and (variables_in(script, loop.iter) & unprepared)
                and not (variables_in(script, loop.iter) & script.prepared_names)
            ):
                continue  # every rank reads the same batches: the same values
            waiting = facts.collective_reach.where_the_others_wait(
                loop, after=test if isinstance(node, cst.Continue) else None
            )
            if waiting is None:
                continue
            leaves = "break" if isinstance(node, cst.Break) else "continue"
            accelerator = accelerator_name(script, node)
            # a ``while`` loop has no target: its batches are drawn by hand (``next(batches)``),
            # which `decided_on_own_shard` follows
            own = _own_value(script, test, loop, losses) if isinstance(loop, cst.For) else None
            if own is None:
                decided = decided_on_own_shard(facts, test, loop)  # type: ignore[arg-type]
                if decided is not None:
                    yield self.finding(
                        script,
                        node,
                        message=_shard_message(script, decided, test, leaves, waiting, accelerator),
                    )
                    continue
                probe = _polled_file(script, test, loop)
                if probe is not None:
                    asked = script.module.code_for_node(probe.func)
                    yield self.finding(
                        script,
                        node,
                        message=(
                            f"Stop on every rank together: the test at line {script.line(test)} "
                            f"asks the file system ({asked}, line "
                            f"{script.line(probe)}), and each rank asks at its own moment (a "
                            "machine that does not share the folder never sees the file), so "
                            f"this rank alone may take this {leaves} while the others go on to "
                            f"the collective at line {script.line(waiting)} and wait there for "
                            f"it (hang); call {accelerator}.set_trigger() under the test "
                            f"instead, and after it, on every rank, "
                            f"`if {accelerator}.check_trigger(): {leaves}`"
                        ),
                    )
                continue
            value, origin = own
            computed = f"this rank computed from its own batch (line {script.line(origin)})"
            agreed = last_binding(script, value, test)
            if (
                agreed is not None
                and agreed is not origin
                and getattr(agreed, "value", None) is not None
                and agrees(script, agreed.value)
            ):
                computed += (
                    f" and reduces only on the passes that take line {script.line(agreed)} (the "
                    "others test this rank's own value)"
                )
            yield self.finding(
                script,
                node,
                message=(
                    f"Stop on every rank together: the test at line {script.line(test)} reads "
                    f"{value}, which {computed}, so "
                    f"this rank alone takes this {leaves} while the others go on to the "
                    f"collective at line {script.line(waiting)} and wait there for it (hang, or "
                    f"gradients of different steps averaged); call {accelerator}.set_trigger() "
                    f"under the test instead, and after it, on every rank, "
                    f"`if {accelerator}.check_trigger(): {leaves}`"
                ),
            )
        yield from self._collective_on_own_value(script, facts, losses)
        yield from self._return_before_backward(script, facts, losses)

    def _return_before_backward(
        self, script: ScriptModel, facts: Facts, losses: list[Backward]
    ) -> Iterator[Finding]:
        """``if torch.isnan(loss): return output`` above ``accelerator.backward(loss)`` in the
        step that trains one batch (gravitorch's ``AccelerateTrainingLoop._train_one_batch``):
        the loss is this rank's own, so a rank whose batch gives NaN returns alone while the
        others wait in the backward's all-reduce (hang). Reported at the ``return``; a test of
        what every rank agrees on (a gathered flag) decides alike."""
        for backward in losses:
            function = facts.placement.enclosing_function(backward.call)
            if function is None:
                continue
            loss_names = variables_in(script, backward.loss)
            for node in script.index.of_type(cst.Return):
                if (
                    facts.placement.enclosing_function(node) is not function
                    or script.order(node) >= script.order(backward.call)
                    or script.under_rank_guard(node)
                    or _loop_between(script, node, function)
                ):
                    continue
                test = _test_around(script, node, function)
                if test is None or facts.ranks.is_rank_test(test.test):
                    continue
                if _inside(script, backward.call, test):
                    continue  # the backward is in the test's own branches
                read = read_outside_agreement(script, test.test)
                read -= structure_only_names(test.test, model_outputs(script, read, test))
                own = sorted(n for n in read & loss_names if not _agreed_before(script, n, test))
                if not own:
                    continue
                accelerator = accelerator_name(script, backward.call)
                flag = _agreed_flag(test.test, accelerator)
                yield self.finding(
                    script,
                    node,
                    message=(
                        f"Skip the backward on every rank together: the test at line "
                        f"{script.line(test)} reads {own[0]}, this rank's own loss, so this "
                        f"rank alone returns here while the others go on to the backward at "
                        f"line {script.line(backward.call)} and wait in its all-reduce for it "
                        f"(hang); test what every rank agrees on instead (`if {flag}:`), so "
                        "all of them return"
                    ),
                )

    def _collective_on_own_value(
        self, script: ScriptModel, facts: Facts, losses: list[Backward]
    ) -> Iterator[Finding]:
        """``if eval_loss < best: self._save_checkpoint()`` in the epoch loop, where the
        method waits for everyone or gathers the weights and ``eval_loss`` is this rank's own
        shard's: the ranks where the test holds enter the collective, the others never do
        (hang). The same decision as a stop's, reported at the test's line."""
        for test in script.index.of_type(cst.If):
            loop = script.index.enclosing_loop(test)
            if not isinstance(loop, cst.For) or script.under_rank_guard(test):
                continue
            if facts.ranks.is_rank_test(test.test) or facts.agreed.branch_agreed(test):
                continue  # a gathered evaluation's metric: every rank decides alike
            collective = _collective_under(script, facts, test, losses)
            if collective is None:
                continue
            decided = decided_on_own_shard(facts, test, loop)
            if decided is None:
                continue
            # a training loss folded on the main process alone (``if is_main_process:
            # running += loss.item()``): the other ranks keep its first value, so the ranks
            # disagree whatever the shards hold
            folded = _rank_guard_around(script, decided.origin)
            if folded is None and _in_training_pass(script, decided.origin, losses):
                continue
            accelerator = accelerator_name(script, test)
            read = decided.read
            if decided.condition is not None:
                read += f" (stepped under the test at line {script.line(decided.condition)})"
            computed = f"computed from its own shard (line {script.line(decided.origin)})"
            reduce = "reduce what it reads over the ranks before the test"
            if folded is not None:
                computed = (
                    f"folds from its own shard at line {script.line(decided.origin)} only under "
                    f"the rank test at line {script.line(folded)} (the other ranks keep the "
                    "value it started with)"
                )
                reduce = (
                    f"fold it on every rank (line {script.line(decided.origin)} out of the rank "
                    f"test at line {script.line(folded)}) and reduce it over the ranks before "
                    "the test"
                )
            yield self.finding(
                script,
                test,
                message=(
                    f"Decide on every rank together: this test reads {read}, which this rank "
                    f"{computed}, so only "
                    f"the ranks where it holds reach the collective at line "
                    f"{script.line(collective)}, and they wait there for the others (hang); "
                    f"{reduce} "
                    f"({accelerator}.reduce(torch.tensor(value, device={accelerator}.device), "
                    f"'mean').item(), or gather_for_metrics the per-batch values), or decide on "
                    f"the main process and broadcast the decision"
                ),
            )


def _in_training_pass(script: ScriptModel, origin: cst.CSTNode, losses: list[Backward]) -> bool:
    """``origin`` is folded in a loop that runs ``backward`` (the last training batch's loss):
    left out for now, the conversion names that branch at another line (`dataset_download`);
    an evaluation pass's metric is what this check reports."""
    loop = script.index.enclosing_loop(origin)
    return loop is not None and any(script.inside(b.call, loop) for b in losses)


def _collective_under(
    script: ScriptModel, facts: Facts, test: cst.If, losses: list[Backward]
) -> cst.Call | None:
    """A call in ``test``'s body (not its test) that is a collective on a backend this script
    runs on (DDP always: a barrier, a gather, a backward), or a call of the file's functions that
    runs one on every backend (``self._save_checkpoint()`` around ``wait_for_everyone``)."""
    reach = facts.collective_reach
    in_view = backends_in_view(script)
    backwards = {id(b.call) for b in losses}
    for call in walk(test.body):
        if not isinstance(call, cst.Call):
            continue
        if id(call) in backwards:
            return call
        if collective_backends(script, call, reach.accelerators) & in_view:
            return call
        callee = script.call_graph.callee(call)
        if callee is not None and reach.synchronising_call(callee[0], everywhere=True):
            return call
    return None


def _shard_message(
    script: ScriptModel,
    decided: Decided,
    test: cst.If,
    leaves: str,
    waiting: cst.CSTNode,
    accelerator: str,
) -> str:
    if decided.call is not None and decided.stepped is not None:
        return _object_message(script, decided, test, leaves, waiting, accelerator)
    if decided.condition is None or decided.stepped is None:
        reads = f"{decided.read}, this rank's own value"
        decide = test
    else:
        condition = script.module.code_for_node(decided.condition.test)
        reads = (
            f"{decided.read}, which line {script.line(decided.stepped)} sets under `if "
            f"{condition}` (line {script.line(decided.condition)}), a test of this rank's own "
            "value"
        )
        decide = decided.condition
    guard = _rank_guard_around(script, decide) if script.under_rank_guard(decide) else None
    if guard is not None:
        # a reduce there would run on the guarded ranks alone: a hang of its own
        return (
            f"Stop on every rank together: the test at line {script.line(test)} reads {reads} "
            f"(computed at line {script.line(decided.origin)} from its shard of a prepared "
            f"DataLoader, never reduced), and line {script.line(decide)} runs only under the "
            f"rank test at line {script.line(guard)}, so the ranks disagree and some take this "
            f"{leaves} alone while the others go on to the collective at line "
            f"{script.line(waiting)} and wait there for them (hang); call "
            f"{accelerator}.set_trigger() under the test at line {script.line(test)} and, after "
            f"it, on every rank, `if {accelerator}.check_trigger(): {leaves}` (or reduce the "
            f"value on every rank before the rank test at line {script.line(guard)} and decide "
            "outside it)"
        )
    folded = _rank_guard_around(script, decided.origin)
    if folded is not None:
        # folded on the guarded ranks alone: the others keep its first value, and a reduce
        # of it would mix those in; the fold goes out of the test first
        origin = script.line(decided.origin)
        return (
            f"Stop on every rank together: the test at line {script.line(test)} reads {reads}, "
            f"folded at line {origin} from this rank's shard of a prepared DataLoader only "
            f"under the rank test at line {script.line(folded)} (the other ranks keep the value "
            f"it started with) and never reduced, so the ranks disagree and some take this "
            f"{leaves} alone while the others go on to the collective at line "
            f"{script.line(waiting)} and wait there for them (hang); fold it on every rank "
            f"(line {origin} out of the rank test at line {script.line(folded)}) and reduce it "
            f"over the ranks before the test at line {script.line(decide)} "
            f'({accelerator}.reduce(torch.tensor(value, device={accelerator}.device), "mean")'
            f".item()), or call {accelerator}.set_trigger() under the test at line "
            f"{script.line(test)} and, after it, on every rank, "
            f"`if {accelerator}.check_trigger(): {leaves}`"
        )
    return (
        f"Stop on every rank together: the test at line {script.line(test)} reads {reads} "
        f"(computed at line {script.line(decided.origin)} from its shard of a prepared "
        f"DataLoader, never reduced), so this rank alone takes this {leaves} while the others "
        f"go on to the collective at line {script.line(waiting)} and wait there for it (hang); "
        f"reduce the value over the ranks before the test at line {script.line(decide)} "
        f'({accelerator}.reduce(torch.tensor(value, device={accelerator}.device), "mean")'
        f".item()), or call {accelerator}.set_trigger() under the test at line "
        f"{script.line(test)} and, after it, on every rank, "
        f"`if {accelerator}.check_trigger(): {leaves}`"
    )


def _object_message(
    script: ScriptModel,
    decided: Decided,
    test: cst.If,
    leaves: str,
    waiting: cst.CSTNode,
    accelerator: str,
) -> str:
    """The message for a stop an object decides: the early-stopping object's method, handed this
    rank's own value by the loop's call; the fix is at that call."""
    assert decided.call is not None and decided.stepped is not None
    owner = script.call_graph.owner(decided.method) if decided.method is not None else None
    method = (
        f"{owner.name.value}.{decided.method.name.value}"
        if owner is not None and decided.method is not None
        else "the method"
    )
    does = "returns" if isinstance(decided.stepped, cst.Return) else "sets"
    handed = (
        script.module.code_for_node(decided.argument)
        if decided.argument is not None
        else "the value"
    )
    how = f"{method} {does} at line {script.line(decided.stepped)}"
    if decided.condition is not None:
        condition = script.module.code_for_node(decided.condition.test)
        how += f" under `if {condition}` (line {script.line(decided.condition)}), a test of"
    else:
        how += " from"
    at = script.line(decided.call)
    reduced = f'{accelerator}.reduce(torch.tensor({handed}, device={accelerator}.device), "mean")'
    if isinstance(decided.argument, cst.Name):
        reduced = f"{handed} = {reduced}.item()"
    reduced = f"`{reduced}`"
    reduce_it = f"reduce it over the ranks before the call at line {at} ({reduced})"
    if decided.argument is not None and _a_dict(script, decided.argument, decided.call):
        # ``logs`` of ``cb.on_epoch_end(self, epoch, logs)``: no tensor of a dict; the entry
        # is reduced where the rank folds it
        reduced = (
            f"reduce the entries of {handed} folded from this rank's shard (line "
            f"{script.line(decided.origin)}) over the ranks "
            f'({accelerator}.reduce(torch.tensor(value, device={accelerator}.device), "sum")'
            ".item()) before they go into it"
        )
        reduce_it = reduced
    if script.under_rank_guard(decided.call):
        # a reduce before the call would run on the guarded ranks alone: a hang of its own
        guard = _rank_guard_around(script, decided.call)
        where = f"the rank test at line {script.line(guard)}" if guard else "a rank test"
        return (
            f"Stop on every rank together: the test at line {script.line(test)} reads "
            f"{decided.read}, which {how} {handed}, the value the call at line {at} hands it; "
            f"that call runs only under {where}, so only those ranks' object ever decides (and "
            f"this rank computed the value at line {script.line(decided.origin)} from its shard "
            f"of a prepared DataLoader, never reduced): they take this {leaves} while the others "
            f"go on to the collective at line {script.line(waiting)} and wait there for them "
            f"(hang); call {accelerator}.set_trigger() under the test at line "
            f"{script.line(test)} and, after it, on every rank, "
            f"`if {accelerator}.check_trigger(): {leaves}` (or reduce the value on every rank, "
            f"outside {where}, and move the call at line {at} out of it: {reduced})"
        )
    return (
        f"Stop on every rank together: the test at line {script.line(test)} reads "
        f"{decided.read}, which {how} {handed}, the value the call at line {at} hands it; "
        f"this rank computed that value at line {script.line(decided.origin)} from its shard of "
        f"a prepared DataLoader and never reduced it, so this rank alone takes this {leaves} "
        f"while the others go on to the collective at line {script.line(waiting)} and wait "
        f"there for it (hang); {reduce_it}, or call {accelerator}.set_trigger() under the "
        f"test at line {script.line(test)} and, after it, on every rank, "
        f"`if {accelerator}.check_trigger(): {leaves}`"
    )


def _a_dict(
    script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode, depth: int = 2
) -> bool:
    """``value`` holds a dict display: written here, bound to one above ``at``, or a parameter
    every call of its function fills with one (``logs`` handed down from ``fit``)."""
    if isinstance(value, cst.Dict):
        return True
    if not isinstance(value, cst.Name):
        return False
    binding = last_binding(script, value.value, at)
    if binding is not None:
        bound = getattr(binding, "value", None)
        return (
            isinstance(binding, cst.Assign)
            and bound is not None
            and _a_dict(script, bound, binding, depth)
        )
    arguments = facts_of(script).flow.call_site_arguments(value.value, at) if depth else []
    return bool(arguments) and all(_a_dict(script, a.value, a, depth - 1) for a in arguments)


def _rank_guard_around(script: ScriptModel, node: cst.CSTNode) -> cst.If | None:
    """The innermost ``if accelerator.is_main_process:`` (a rank test) whose body holds
    ``node``, in its function."""
    ranks = facts_of(script).ranks
    child: cst.CSTNode = node
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef):
            return None
        if (
            isinstance(ancestor, cst.If)
            and child is not ancestor.test
            and ranks.is_rank_test(ancestor.test)
        ):
            return ancestor
        child = ancestor
    return None


def _agreed_flag(test: cst.BaseExpression, accelerator: str) -> str:
    """The test every rank agrees on that takes the place of ``test``: its own value gathered
    over the ranks and any of them taken. ``torch.isnan(loss)`` (a tensor) is gathered as it
    is; another test (``loss.item() > 100.0``, a bool) is made a tensor first: the advice
    keeps the user's own test, not a NaN test it never made."""
    code = cst.Module([]).code_for_node(test)
    if (
        isinstance(test, cst.Call)
        and (dotted(test.func) or "").endswith("isnan")
        and (dotted(test.func) == "torch.isnan" or not test.args)
    ):
        return f"{accelerator}.gather({code}).any()"
    return f"{accelerator}.gather(torch.tensor({code}, device={accelerator}.device)).any()"


def _loop_between(script: ScriptModel, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
    """A loop of ``function`` holds ``node``: its ``return`` leaves that loop too, but the test
    around it may be the loop's own (each rank's items), judged by the loop's stops."""
    for ancestor in script.ancestors(node):
        if ancestor is function:
            return False
        if isinstance(ancestor, cst.For | cst.While):
            return True
    return False


def _agreed_before(script: ScriptModel, name: str, test: cst.If) -> bool:
    """``name``'s last binding above the test holds what a collective made alike."""
    binding = last_binding(script, name, test)
    return getattr(binding, "value", None) is not None and agrees(script, binding.value)


#: Calls that ask the file system whether a file is there (a stop-flag file polled by a loop).
_FILE_PROBES = frozenset(
    {"os.path.exists", "os.path.isfile", "os.path.isdir", "os.path.lexists", "os.listdir"}
)
_PROBING_METHODS = frozenset({"exists", "is_file"})


def _polled_file(script: ScriptModel, test: cst.If, loop: cst.For | cst.While) -> cst.Call | None:
    """The call in ``test``'s condition, or in the value of a name it reads as last bound above
    it (``stop = os.path.exists("STOP")``), that asks the file system whether a file is there
    (``os.path.exists``, ``Path("STOP").exists()``): each rank asks when it gets there, so a
    file made between two ranks' questions is seen by one of them only. Not when a collective
    made the answer every rank's first (``accelerator.gather(...)`` around it in the test, or
    ``broadcast_object_list(stop)`` in the loop): the ranks then decide alike."""
    if agrees(script, test.test):
        return None
    places: list[cst.CSTNode] = [test.test]
    for name in {n.value for n in walk(test.test) if isinstance(n, cst.Name)}:
        binding = last_binding(script, name, test)
        value = getattr(binding, "value", None)
        if isinstance(binding, cst.Assign) and value is not None:
            if agrees(script, value) or _handed_to_a_broadcast(script, name, loop):
                continue
            places.append(value)
    for place in places:
        for node in walk(place):
            if not isinstance(node, cst.Call):
                continue
            func = node.func
            probes = bool(script.call_names(node) & _FILE_PROBES) or (
                isinstance(func, cst.Attribute)
                and func.attr.value in _PROBING_METHODS
                and _a_path(script, func.value)
            )
            if probes and not _names_a_file_per_pass(script, node, test):
                return node
    return None


def _a_path(script: ScriptModel, value: cst.BaseExpression) -> bool:
    """``value`` builds a ``pathlib.Path``: ``Path("STOP")``, or a path joined onto one
    (``Path(args.output_dir) / "STOP"``, ``.joinpath("STOP")``)."""
    while True:
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide):
            value = value.left
        elif (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "joinpath"
        ):
            value = value.func.value
        else:
            break
    return isinstance(value, cst.Call) and bool(script.call_names(value) & {"pathlib.Path"})


def _names_a_file_per_pass(script: ScriptModel, probe: cst.Call, test: cst.If) -> bool:
    """The path ``probe`` asks about reads the target of a loop around ``test``, itself or
    through the name it was bound to (``os.path.exists(f"ckpt_{epoch}.pt")``: ``continue`` past
    an epoch an earlier run finished): a file of that pass, there before the run, not a flag
    file made while it runs that the ranks may see at different moments (review11b)."""
    targets = {
        name
        for ancestor in script.ancestors(test)
        if isinstance(ancestor, cst.For)
        for name in variables_in(script, ancestor.target)
    }
    read = variables_in(script, probe)
    for name in list(read):
        binding = last_binding(script, name, test)
        value = getattr(binding, "value", None)
        if isinstance(binding, cst.Assign) and value is not None:
            read |= variables_in(script, value)
    return bool(read & targets)


def _handed_to_a_broadcast(script: ScriptModel, name: str, loop: cst.For | cst.While) -> bool:
    """``name`` (or an item of it) is the first argument of a call in ``loop`` that writes every
    rank's agreed value into it: ``dist.all_reduce(flag)``, ``broadcast_object_list(stop)``
    (the list every rank passes gets rank 0's items)."""
    if _agreed_in_place(script, name, loop):
        return True
    for call in walk(loop.body):
        if not isinstance(call, cst.Call) or not agrees_across_ranks(script, call):
            continue
        called = dotted(call.func) or ""
        if called.rsplit(".", 1)[-1] not in BROADCASTING_METHODS:
            continue  # ``accelerator.gather(flag)`` hands back a new value, ``flag`` stays
        first = next((a for a in call.args if a.keyword is None and not a.star), None)
        if first is not None and isinstance(first.value, cst.Name) and first.value.value == name:
            return True
    return False


def _exhausted_test(script: ScriptModel, test: cst.If) -> bool:
    """``if batch is None:`` (or ``if not batch:``) of ``batch = next(batches, None)``: the
    iterator ran out, which a prepared DataLoader makes happen on the same pass on every rank
    (each rank's shard has as many batches)."""
    condition = test.test
    if isinstance(condition, cst.UnaryOperation) and isinstance(condition.operator, cst.Not):
        name = dotted(condition.expression)
    elif (
        isinstance(condition, cst.Comparison)
        and len(condition.comparisons) == 1
        and isinstance(condition.comparisons[0].operator, cst.Is | cst.IsNot)
        and dotted(condition.comparisons[0].comparator) == "None"
    ):
        name = dotted(condition.left)
    else:
        return False
    binding = last_binding(script, name, test) if name is not None else None
    value = getattr(binding, "value", None)
    return (
        isinstance(value, cst.Call)
        and dotted(value.func) == "next"
        and len(value.args) == 2
        and dotted(value.args[1].value) == "None"
    )


def _test_around(
    script: ScriptModel, node: cst.CSTNode, loop: cst.For | cst.While
) -> cst.If | None:
    """The innermost ``if`` between ``loop`` and ``node`` whose body (not its test) holds
    ``node``."""
    child: cst.CSTNode = node
    for ancestor in script.ancestors(node):
        if ancestor is loop:
            return None
        if isinstance(ancestor, cst.If) and child is not ancestor.test:
            return ancestor
        child = ancestor
    return None


def _own_value(
    script: ScriptModel, test: cst.If, loop: cst.For, losses: list[Backward]
) -> tuple[str, cst.CSTNode] | None:
    """A value the test reads, and its binding in ``loop``, that this rank computed from the batch
    the loop handed it (the loop's target), on the way to a loss the loop differentiates: the
    loss itself, or what it is computed from (``ratio`` of a PPO step). None when the test's
    values pass a gather or reduce (every rank holds them alike), or reach no loss."""
    read_as_is = read_outside_agreement(script, test.test)  # not ``loss`` of ``reduce(loss)``
    read_as_is -= structure_only_names(test.test, model_outputs(script, read_as_is, test))
    tested = _trace(script, read_as_is, test, loop)
    if not tested:
        return None
    batch = set(target_names(loop.target))
    for names, at in _differentiated(script, loop, losses):
        differentiated = _trace(script, names, at, loop)
        if differentiated is None:
            continue
        shared = {
            name
            for name, binding in tested.items()
            if name in differentiated and _reaches(script, name, binding, batch, loop)
        }
        if not shared:
            continue
        for read in sorted(read_as_is):
            direct = _trace(script, {read}, test, loop) or {}
            if read in direct and shared & direct.keys():
                return read, direct[read]
    return None


def _differentiated(
    script: ScriptModel, loop: cst.For, losses: list[Backward]
) -> Iterator[tuple[set[str], cst.CSTNode]]:
    """What the loop hands to a backward, and where: the loss of a backward in the loop, and the
    arguments of a call in the loop that reaches one (``self.step(loss)``)."""
    inside = {id(b.call) for b in losses if _inside(script, b.call, loop)}
    for backward in losses:
        if id(backward.call) in inside:
            yield variables_in(script, backward.loss), backward.call
    reach = facts_of(script).collective_reach
    for statement in statement_lines(loop.body):
        call = reach.synchronising_in(statement)
        if call is None or id(call) in inside or not isinstance(call, cst.Call):
            continue
        handed: set[str] = set()
        for argument in call.args:
            handed |= variables_in(script, argument.value)
        if handed:
            yield handed, statement


def _trace(
    script: ScriptModel, names: set[str], at: cst.CSTNode, loop: cst.For
) -> dict[str, cst.CSTNode] | None:
    """The names ``names`` are computed from, with their bindings inside ``loop`` (the last one
    above ``at``), following each binding's right-hand side; None when one of them holds what a
    gather or reduce returned."""
    found: dict[str, cst.CSTNode] = {}
    pending = [(name, at) for name in names]
    steps = 0
    while pending and steps < _MAX_BINDINGS:
        name, where = pending.pop()
        steps += 1
        if name in found:
            continue
        binding = last_binding(script, name, where)
        if binding is None or not _inside(script, binding, loop):
            continue
        value = binding.value
        if value is None:
            continue
        if agrees(script, value) or _agreed_in_place(script, name, loop):
            if not agrees(script, value) or not _agreed_on_some_passes(script, binding, where):
                return None
            # ``if step % k == 0: loss = accelerator.reduce(loss)``: on the other passes the
            # test reads the binding before it, this rank's own value
            pending.append((name, binding))
            continue
        found[name] = binding
        pending.extend((read, binding) for read in variables_in(script, value))
        if isinstance(binding, cst.AugAssign):
            pending.append((name, binding))
    return found


def _agreed_on_some_passes(script: ScriptModel, binding: cst.CSTNode, at: cst.CSTNode) -> bool:
    """``binding`` (an agreed value) sits in a branch of one ``if`` without ``else`` that does
    not hold ``at``: the passes that skip the branch reach ``at`` with the binding before it."""
    if runs_before(script, binding, at):
        return False
    around = {id(ancestor) for ancestor in script.ancestors(at)}
    for ancestor in script.ancestors(binding):
        if id(ancestor) in around:
            return False  # reached the block that holds both: one plain ``if`` in between
        if isinstance(ancestor, cst.If):
            return (
                ancestor.orelse is None
                and not any(
                    isinstance(a, cst.If) and a.orelse is ancestor
                    for a in script.ancestors(ancestor)
                )
                and not _under_the_same_test(script, ancestor, at)
            )
        if not isinstance(ancestor, (cst.IndentedBlock, cst.SimpleStatementLine, cst.Assign)):
            return False
    return False


def _under_the_same_test(script: ScriptModel, branch: cst.If, at: cst.CSTNode) -> bool:
    """``at`` runs only where ``branch``'s test held, on the pass that ran ``branch``: under an
    ``if`` of the same test (``if step % k == 0: if loss.item() < eps: break``), or right of it
    in an ``and`` (``if step % k == 0 and loss.item() < eps``), with nothing the test reads bound
    again in between. Every pass that reaches ``at`` then ran the branch and its reduce."""
    test = _spelled(script, branch.test)
    child: cst.CSTNode | None = None
    if isinstance(at, cst.If):  # what its test reads: the whole test is where it is read
        at = at.test
    for node in (at, *script.ancestors(at)):
        if node is branch:
            return False
        if isinstance(node, cst.If) and child is node.body and _spelled(script, node.test) == test:
            return _test_unchanged(script, branch, at)
        if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
            guarded = _conjuncts(node.left) if child is node.right else ()
            if child is None:  # ``at`` is the whole ``and``: its first part guards the rest
                guarded = _conjuncts(node)[:1]
            if any(_spelled(script, part) == test for part in guarded):
                return _test_unchanged(script, branch, at)
        child = node
    return False


def _conjuncts(node: cst.BaseExpression) -> tuple[cst.BaseExpression, ...]:
    """The operands of a chain of ``and`` (libcst nests ``a and b and c`` to the left)."""
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
        return (*_conjuncts(node.left), *_conjuncts(node.right))
    return (node,)


def _spelled(script: ScriptModel, node: cst.CSTNode) -> str:
    return "".join(script.module.code_for_node(node).split())


def _test_unchanged(script: ScriptModel, branch: cst.If, at: cst.CSTNode) -> bool:
    """No name ``branch``'s test reads is bound between the test and ``at``."""
    return all(
        last_binding(script, name, branch) is last_binding(script, name, at)
        for name in variables_in(script, branch.test)
    )


def _reaches(
    script: ScriptModel, name: str, binding: cst.CSTNode, batch: set[str], loop: cst.For
) -> bool:
    """``name`` (bound at ``binding``) is computed from the loop's batch."""
    value = getattr(binding, "value", None)
    if value is None:
        return False
    read = variables_in(script, value)
    if read & batch:
        return True
    traced = _trace(script, read, binding, loop) or {}
    return any(
        variables_in(script, bound.value) & batch
        for bound in traced.values()
        if getattr(bound, "value", None) is not None
    )


def _agreed_in_place(script: ScriptModel, name: str, loop: cst.For | cst.While) -> bool:
    """``dist.all_reduce(name)`` in the loop: the collective writes every rank's agreed value
    into it (TRL's early stop reduces its KL this way before testing it)."""
    return any(
        isinstance(call, cst.Call)
        and (argument := agreed_in_place(script, call)) is not None
        and dotted(argument) == name
        for call in walk(loop.body)
    )


def _inside(script: ScriptModel, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    return any(ancestor is container for ancestor in script.ancestors(node))
