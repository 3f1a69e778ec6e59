from collections.abc import Iterator

import libcst as cst

from accelify.analysis import summed_means as sums
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.summed_means import summed_means
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name, in_file_words

_HEADER = "import torch\n" + HEADER
_EVAL = (
    _HEADER
    + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
    + "total_loss = 0.0\n"
    + "for batch in eval_loader:\n"
    + "    total_loss += model(**batch).loss.detach().float()\n"
)


#: A training epoch whose per-rank total of batch losses is summed over the ranks and shown
#: over a count this rank keeps of its own batches.
_EPOCH = (
    _HEADER
    + "from tqdm import tqdm\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for epoch in range(3):\n"
    + "    epoch_loss, steps = 0.0, 0\n"
    + "    for batch in tqdm(loader):\n"
    + "        with accelerator.accumulate(model):\n"
    + "            loss = model(**batch).loss\n"
    + "            accelerator.backward(loss)\n"
    + "            optimizer.step()\n"
    + "            epoch_loss += loss.item()\n"
    + "            steps += 1\n"
    + "    total = accelerator.reduce(torch.tensor(epoch_loss, device=accelerator.device))\n"
    + "    accelerator.print(f'epoch {{epoch}} loss {{total.item() / {count}:.4f}}')\n"
)


class SummedMean(Rule):
    """A per-rank mean summed over the ranks and shown as a mean: ``Accelerator.reduce`` sums
    by default (HF Accelerate's ``reduction="sum"``, and accelify's runtime alike; only
    Accelerate's ``reduce`` utility function averages), so ``accelerator.reduce(loss)`` of a
    batch's mean loss, printed or logged, is the sum of N means: N times the mean (twice the
    loss on 2 processes, right on one). Nothing fails; the curves shift with the process count.
    The same for a running total of batch means summed over the ranks and divided by ``len()``
    of the prepared DataLoader, which counts one rank's batches.

    Any sum over the ranks, a summing ``reduce`` or ``accelerator.gather(total).sum()``,
    divided on its way to the show by ``len()`` of a prepared DataLoader (``len(val_loader)``,
    ``len(self.val_loader)``, or a counter raised by ``n_batches += 1`` once per batch of it:
    one rank's count of batches) is likewise N times what one process shows, whatever it
    summed; the fix divides by ``len(val_loader) *
    accelerator.num_processes``.

    A per-rank mean: ``x.mean()``, ``torch.mean(x)``, a quotient by this rank's own count
    (``len()`` of its DataLoader or batch, ``x.size(0)``, a counter it increments; not
    ``len(loader.dataset)`` nor a reduced count), a model's ``.loss``, a loss
    function or module without ``reduction="sum"``, followed through names and ``.detach()``,
    ``.item()``. Shown: the value reaches a print, ``accelerator.print``, a logger's, a
    tracker's ``log`` or a progress bar's arguments (through names, dicts, running totals, and
    a helper's return), with no division by the process count on the way. Not reported: a
    ``reduction="mean"``, a sum of sums (``F.cross_entropy(..., reduction="sum")``, counts),
    a sum divided by ``accelerator.num_processes``, a value never shown. Reported at the
    ``reduce`` call, naming the line that shows it."""

    code = "ACC416"
    name = "summed-mean"
    message = (
        'Reduce this mean with reduction="mean": Accelerator.reduce sums by default, so the '
        "value shown is the sum of every rank's mean, num_processes times the mean"
    )
    why = "A sum over ranks of per-rank means is N times the mean: the logged number is wrong."
    bad = (
        Example(
            _HEADER
            + "for batch in loader:\n"
            + "    loss = model(**batch).loss\n"
            + "    accelerator.backward(loss)\n"
            + "    logged = accelerator.reduce(loss.detach())\n"
            + '    accelerator.log({"train_loss": logged.item()})\n',
            7,
            14,
        ),
        # run_clm_no_trainer-like: a step's loss summed, then a running total of it printed
        Example(
            _HEADER
            + "criterion = torch.nn.CrossEntropyLoss()\n"
            + "total = 0.0\n"
            + "for step, batch in enumerate(loader):\n"
            + "    loss = criterion(model(batch[0]), batch[1])\n"
            + "    accelerator.backward(loss)\n"
            + "    step_loss = accelerator.reduce(loss.clone()).item()\n"
            + "    total += step_loss\n"
            + "print(f'mean loss {total / (step + 1):.4f}')\n",
            9,
            17,
        ),
        # a running total of batch means, summed, over one rank's count of batches
        Example(
            _EVAL
            + "total_loss = accelerator.reduce(total_loss)\n"
            + 'accelerator.print(f"eval loss: {total_loss.item() / len(eval_loader)}")\n',
            8,
            14,
        ),
        # a loss module whose reduction="mean" is spelled out, and a quotient by the batch's
        # own size: per-rank means both
        Example(
            _HEADER
            + "criterion = torch.nn.CrossEntropyLoss(reduction='mean')\n"
            + "for x, y in loader:\n"
            + "    loss = criterion(model(x), y)\n"
            + "    accelerator.backward(loss)\n"
            + "    print(accelerator.reduce(loss.detach()).item())\n",
            8,
            11,
        ),
        Example(
            _HEADER
            + "for x, y in loader:\n"
            + "    errors = (model(x).argmax(-1) != y).sum()\n"
            + "    rate = errors.float() / y.size(0)\n"
            + "    print(accelerator.reduce(rate).item())\n",
            7,
            11,
        ),
        # an evaluation helper's per-rank mean, summed, returned and printed by its caller
        Example(
            _HEADER
            + "def evaluate(model, loader):\n"
            + "    total = 0.0\n"
            + "    for batch in loader:\n"
            + "        total += model(**batch).loss.item()\n"
            + "    mean = torch.tensor(total / len(loader), device=accelerator.device)\n"
            + '    return accelerator.reduce(mean, reduction="sum").item()\n'
            + "model, loader = accelerator.prepare(model, loader)\n"
            + "print('eval loss', evaluate(model, loader))\n",
            9,
            12,
        ),
        # the validation totals gathered and summed over one rank's batch count (a trainer's)
        Example(
            _HEADER
            + "class Trainer:\n"
            + "    def __init__(self, model, val_loader):\n"
            + "        self.model, self.val_loader = accelerator.prepare(model, val_loader)\n\n"
            + "    def validate(self):\n"
            + "        total = torch.zeros(1, device=accelerator.device)\n"
            + "        for x, y in self.val_loader:\n"
            + "            total += torch.nn.functional.cross_entropy(self.model(x), y)\n"
            + "        loss = accelerator.gather(total).sum() / len(self.val_loader)\n"
            + "        print(f'val loss {loss.item():.4f}')\n",
            12,
            16,
        ),
        # every rank's batch means summed into one total, over a counter of this rank's
        # batches
        Example(
            _HEADER
            + "model, val_loader = accelerator.prepare(model, val_loader)\n"
            + "total, n_batches = 0.0, 0\n"
            + "for batch in val_loader:\n"
            + "    loss = model(**batch).loss\n"
            + "    total += accelerator.gather(loss).sum().item()\n"
            + "    n_batches += 1\n"
            + "accelerator.print(total / n_batches)\n",
            8,
            14,
        ),
        Example(  # an MLP trainer's evaluate(): the accelerator and the prepared loader handed
            # in, divided by the largest rank's batch count
            "import torch\nfrom accelerate import Accelerator\n\n\n"
            "def evaluate(accelerator, model, loader):\n"
            "    total = 0.0\n"
            "    for xb, yb in loader:\n"
            "        loss = torch.nn.functional.cross_entropy(model(xb), yb)\n"
            "        total += accelerator.gather_for_metrics(loss.detach()).sum().item()\n"
            "    n = torch.tensor(len(loader), device=accelerator.device)\n"
            "    num_batches = accelerator.gather_for_metrics(n).max().item()\n"
            "    return total / max(num_batches, 1)\n\n\n"
            "def main(model, loader):\n"
            "    accelerator = Accelerator()\n"
            "    model, val_loader = accelerator.prepare(model, loader)\n"
            "    accelerator.print(evaluate(accelerator, model, val_loader))\n",
            9,
            18,
        ),
        # a per-epoch total over a counter raised inside accumulate(), in a loop over a bar
        # around the prepared loader
        Example(_EPOCH.format(count="steps"), 15, 13),
        # ... over the enumerate index of the loader's loop
        Example(
            _EPOCH.format(count="(step + 1)").replace(
                "for batch in tqdm(loader)", "for step, batch in enumerate(loader)"
            ),
            15,
            13,
        ),
        # every rank's batch mean gathered and added up, logged as the loss
        Example(
            _HEADER
            + "for batch in loader:\n"
            + "    loss = model(**batch).loss\n"
            + "    accelerator.backward(loss)\n"
            + '    accelerator.log({"loss": accelerator.gather(loss.detach()).sum().item()})\n',
            7,
            30,
        ),
        # a helper that reduces what it is handed, handed a batch's mean loss; the sum kept in
        # a dict entry that is logged
        Example(
            _HEADER
            + "def all_reduce(value):\n"
            + "    return accelerator.reduce(value)\n"
            + "logs = {}\n"
            + "for batch in loader:\n"
            + "    loss = model(**batch).loss\n"
            + "    accelerator.backward(loss)\n"
            + '    logs["loss"] = all_reduce(loss.detach()).item()\n'
            + "    accelerator.log(logs)\n",
            5,
            12,
        ),
    )
    good = (
        # the epoch's total and its count of batches both summed over the ranks
        _EPOCH.format(count="count.item()").replace(
            "    accelerator.print(",
            "    count = accelerator.reduce(torch.tensor(steps, device=accelerator.device))\n"
            + "    accelerator.print(",
        ),
        # the helper also handed a count: it sums what it is handed, which is right there
        _HEADER
        + "def all_reduce(value):\n"
        + "    return accelerator.reduce(value)\n"
        + "for x, y in loader:\n"
        + "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        + "    accelerator.backward(loss)\n"
        + "    print(all_reduce(loss.detach()).item())\n"
        + "    print(all_reduce((model(x).argmax(-1) == y).sum()).item())\n",
        # the same divided by every rank's batches
        _HEADER
        + "model, val_loader = accelerator.prepare(model, val_loader)\n"
        + "total, n_batches = 0.0, 0\n"
        + "for batch in val_loader:\n"
        + "    loss = model(**batch).loss\n"
        + "    total += accelerator.gather(loss).sum().item()\n"
        + "    n_batches += 1\n"
        + "accelerator.print(total / (n_batches * accelerator.num_processes))\n",
        # the gathered totals over every rank's batches
        _EVAL
        + "batches = len(eval_loader) * accelerator.num_processes\n"
        + "print((accelerator.gather(total_loss).sum() / batches).item())\n",
        # ... or over the whole data set's count of samples
        _EVAL + "print((accelerator.gather(total_loss).sum() / len(eval_loader.dataset)).item())\n",
        # averaged over the ranks
        _HEADER
        + "for batch in loader:\n"
        + "    loss = model(**batch).loss\n"
        + "    accelerator.backward(loss)\n"
        + '    logged = accelerator.reduce(loss.detach(), "mean")\n'
        + '    accelerator.log({"train_loss": logged.item()})\n',
        # the sum divided by the number of processes
        _HEADER
        + "for batch in loader:\n"
        + "    loss = model(**batch).loss\n"
        + "    accelerator.backward(loss)\n"
        + "    logged = accelerator.reduce(loss.detach()) / accelerator.num_processes\n"
        + '    accelerator.log({"train_loss": logged.item()})\n',
        # sums of sums over the count of every rank's tokens: a true mean
        _HEADER
        + "import torch.nn.functional as F\n"
        + "loss_sum = 0.0\n"
        + "count = 0\n"
        + "for x, y in loader:\n"
        + "    loss_sum += F.cross_entropy(model(x), y, reduction='sum')\n"
        + "    count += y.numel()\n"
        + "loss_sum = accelerator.reduce(loss_sum)\n"
        + "count = accelerator.reduce(torch.tensor(count, device=accelerator.device))\n"
        + "print((loss_sum / count).item())\n",
        # a running total summed, divided by every rank's batches
        _EVAL
        + "total_loss = accelerator.reduce(total_loss)\n"
        + "batches = len(eval_loader) * accelerator.num_processes\n"
        + 'accelerator.print(f"eval loss: {total_loss.item() / batches}")\n',
        # summed and never shown (a stopping test on the total)
        _HEADER
        + "for batch in loader:\n"
        + "    loss = model(**batch).loss\n"
        + "    accelerator.backward(loss)\n"
        + "    if accelerator.reduce(loss.detach()).isnan():\n"
        + "        break\n",
        # a quotient by the whole data's count: each rank's share, and their sum is the mean
        _HEADER
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "correct = 0\n"
        + "for x, y in loader:\n"
        + "    correct += (model(x).argmax(-1) == y).sum().item()\n"
        + "acc = torch.tensor(correct / len(loader.dataset), device=accelerator.device)\n"
        + "print(accelerator.reduce(acc).item())\n",
        # a quotient by every rank's count (reduced first): again a share of the mean
        _HEADER
        + "import torch.nn.functional as F\n"
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "loss_sum, count = 0.0, 0\n"
        + "for x, y in loader:\n"
        + "    loss_sum += F.cross_entropy(model(x), y, reduction='sum').item()\n"
        + "    count += y.size(0)\n"
        + "count = accelerator.reduce(torch.tensor(count, device=accelerator.device)).item()\n"
        + "share = torch.tensor(loss_sum / count, device=accelerator.device)\n"
        + "print(accelerator.reduce(share).item())\n",
        # a count summed over the ranks
        _HEADER
        + "correct = (model(x).argmax(-1) == y).sum()\n"
        + "print(accelerator.reduce(correct).item())\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for found in summed_means(script):
            mean = script.module.code_for_node(found.mean)
            sums = "this reduce sums" if found.said_sum else "Accelerator.reduce sums by default"
            text = (
                f'Reduce {mean} with reduction="mean": it is a mean over this rank\'s values, '
                f"and {sums}, so the value shown at line "
                f"{script.line(found.shown)} is the sum of every rank's mean, num_processes "
                "times the mean (or divide the sum by accelerator.num_processes)"
            )
            if found.handed is not None:
                text = text.replace(
                    "this rank's values,",
                    f"this rank's values (what the call at line {script.line(found.handed)} "
                    "hands it),",
                )
            if found.over is not None:
                text = _over_one_ranks_batches(script, found, found.over)
            elif not _is_reduce(found.reduce):
                gathered = f"{accelerator_name(script, found.reduce)}.gather"
                text = (
                    f"Take the mean of what {gathered} returns (.mean() in place of the sum): "
                    f"it holds every rank's {mean}, each a mean over that rank's values, so the "
                    f"sum shown at line {script.line(found.shown)} is num_processes times the "
                    "mean"
                )
            yield self.finding(
                script,
                found.reduce,
                message=in_file_words(text, accelerator_name(script, found.reduce)),
            )


def _is_reduce(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "reduce"


def _over_one_ranks_batches(
    script: ScriptModel, found: sums.SummedMean, over: cst.BaseExpression
) -> str:
    """The message for a sum over the ranks divided by one rank's count of batches."""
    count = script.module.code_for_node(over)
    summed = script.module.code_for_node(found.reduce)
    total = script.module.code_for_node(found.mean)
    return (
        f"Divide {summed} by every rank's batches: it sums {total} over the ranks, but {count} "
        f"counts this rank's batches only, so the value shown at line {script.line(found.shown)} "
        f"is num_processes times what one process shows; divide by ({count} * "
        "accelerator.num_processes)"
    )
