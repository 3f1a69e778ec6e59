from collections.abc import Iterator

import libcst as cst

from accelify.analysis.evaluation import (
    Evaluation,
    evaluates_each_batch,
    first_forward,
    gather_counts_padding,
    gathers_batch_loss,
    predicts_through_the_model,
    totals_combined_after,
)
from accelify.analysis.facts import facts_of
from accelify.analysis.loops import entry_read
from accelify.analysis.returned_values import held_by_callers
from accelify.analysis.script_model import Kind, Loop, ScriptModel
from accelify.analysis.syntax import (
    all_params,
    assigned_targets,
    dotted,
    is_accelerator_call,
    keyword_value,
    root_name,
    target_names,
    walk,
)
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_name,
    calls,
    calls_accelerator,
    loop_of,
)

_EVAL = (
    HEADER
    + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
    + "with torch.no_grad():\n    for x, y in loader:\n"
)


_TOTALS = (
    HEADER
    + "import torch\nmodel, loader = accelerator.prepare(model, loader)\ncorrect, total = 0, 0\n"
    + "with torch.no_grad():\n    for x, y in loader:\n"
    + "        pred = model(x).argmax(-1)\n"
    + "        correct += (pred == y).sum()\n"
    + "        total += y.size(0)\n"
)


_HELPER = (
    "import torch\nimport torch.distributed as dist\nfrom torch.utils.data import DataLoader\n"
    "from accelerate import Accelerator\n\n\n"
    "def evaluate(model, loader, accelerator):\n"
    "    correct, total = 0, 0\n"
    "    with torch.no_grad():\n"
    "        for x, y in loader:\n"
    "            pred = model(x).argmax(-1)\n"
    "            correct += (pred == y).sum().item()\n"
    "            total += y.size(0)\n"
    "{combine}"
    "\n\ndef main():\n"
    "    accelerator = Accelerator()\n"
    "    test_loader = DataLoader(test_set, batch_size=64{drop})\n"
    "    model, test_loader = accelerator.prepare(model, test_loader)\n"
    "    print(evaluate(model, test_loader, accelerator))\n"
)
_ALL_REDUCED = (
    "    counts = torch.tensor([correct, total], device=accelerator.device)\n"
    "    dist.all_reduce(counts)\n"
    "    return counts[0].item() / counts[1].item()\n"
)


#: A trainer's evaluation that counts on its own members; ``{after}`` follows the loop.
_TRAINER_COUNTS = (
    "import torch\n"
    + "from accelify import Accelerator\n\n\n"
    + "class Trainer:\n"
    + "    def __init__(self, model, loader):\n"
    + "        self.accelerator = Accelerator()\n"
    + "        self.model, self.loader = self.accelerator.prepare(model, loader)\n\n"
    + "    def evaluate(self):\n"
    + "        self.correct, self.total = 0, 0\n"
    + "        with torch.no_grad():\n"
    + "            for x, y in self.loader:\n"
    + "                pred = self.model(x).argmax(-1)\n"
    + "                self.correct += (pred == y).sum()\n"
    + "                self.total += y.size(0)\n"
    + "{after}"
)

_HANDED_LOADER = (  # a trainer handed what main prepared (a fresh user's two-module project)
    "import torch\nfrom accelerate import Accelerator\n\n\nclass Trainer:\n"
    "    def __init__(self, accelerator, model, val_loader):\n"
    "        self.accelerator, self.model = accelerator, model\n"
    "        self.val_loader = val_loader\n\n"
    "    @torch.no_grad()\n    def evaluate(self):\n        n = 0\n"
    "        for x, y in self.val_loader:\n"
    "            pred = self.accelerator.{gather}(self.model(x).argmax(dim=1))\n"
    "            n += pred.numel()\n        return n\n\n\n"
    "def main():\n    accelerator = Accelerator()\n    model = torch.nn.Linear(4, 2)\n"
    "    val_loader = torch.utils.data.DataLoader(data, batch_size=16)\n"
    "    {prepared} = accelerator.prepare({prepared})\n"
    "    print(Trainer(accelerator, model, val_loader).evaluate())\n"
)


#: Predictions collected per batch over a prepared loader, gathered once after the loop.
_COLLECTED = (
    HEADER
    + "import torch\nmodel, loader = accelerator.prepare(model, loader)\npredictions = []\n"
    + "with torch.no_grad():\n"
    + "    for x, y in loader:\n"
    + "        predictions.extend(model(x))\n"
    + "gathered = accelerator.gather(torch.cat(predictions))\n"
    + "if accelerator.is_main_process:\n"
    + "    torch.save(gathered, 'predictions.pt')\n"
)

#: An embedding extractor: a helper collects one record per sample over the prepared loader
#: with a model the file builds by a factory, and returns the list; ``{gather}`` is how the
#: helper keeps each batch's records, ``{after}`` what ``main`` does with the list.
_EXTRACTED = (
    "import pickle\nfrom accelerate import Accelerator\n"
    "from torch.utils.data import DataLoader\n\n\n"
    "def extract(loader, model, accelerator):\n"
    "    records, seen = [], 0\n"
    "    for batch in loader:\n"
    "        out = model(batch['image'])\n"
    "        seen += len(out)\n"
    "        kept = [{{'embedding': out[i], 'name': batch['name'][i]}} for i in range(len(out))]\n"
    "        records.extend({gather})\n"
    "    return records\n\n\n"
    "def main():\n"
    "    accelerator = Accelerator()\n"
    "    loader = accelerator.prepare(DataLoader(images, batch_size=64))\n"
    "    model = get_model(args.model).to(accelerator.device)\n"
    "    records = extract(loader, model, accelerator)\n"
    "{after}"
)


#: PickScore's evaluation: each rank's per-sample answers collected in a list, gathered as
#: Python objects after the loop ({gather}: the call over the ranks), the accuracy taken over
#: all of them
_OBJECTS_GATHERED = (
    "import torch\nimport torch.distributed as dist\n"
    + HEADER.replace("Accelerator()", "Accelerator({settings})")
    + "model, loader = accelerator.prepare(model, loader)\n"
    + "eval_dict = {{'is_correct': []}}\n"
    + "with torch.no_grad():\n"
    + "    for x, y in loader:\n"
    + "        preds = model(x).argmax(-1)\n"
    + "        eval_dict['is_correct'] += (preds == y).tolist()\n"
    + "{gather}"
    + "accelerator.print(sum(is_correct) / len(is_correct))\n"
)
_GATHER_OBJECT = "is_correct = accelerator.gather_object(eval_dict['is_correct'])\n"
_ALL_GATHER_OBJECT = (
    "parts = [None] * accelerator.num_processes\n"
    "dist.all_gather_object(parts, eval_dict['is_correct'])\n"
    "is_correct = [v for part in parts for v in part]\n"
)


class GatherInEvaluation(Rule):
    """``accelerator.gather`` in an evaluation loop keeps the samples repeated to give every rank
    a full last batch, so they are counted twice and the metric is off. ``gather_for_metrics``
    drops exactly those repeats. Not reported where the loop runs no forward pass, drops the
    repeats by hand (slicing the gathered tensors to the dataset's length) or gathers the batch's
    mean loss (the repeats are inside each mean, which ``gather_for_metrics`` does not undo).
    The same padding counted another way: counts of samples kept per rank over the loop
    (``correct += (pred == y).sum()``, ``total += y.size(0)``) and combined after it with
    ``gather`` or ``reduce``; there the per-sample values are to be gathered for metrics in the
    loop (not reported with ``even_batches`` turned off or a ``drop_last=True`` loader). The
    same again for per-sample values collected in a list over the loop (``preds.extend(...)``,
    ``eval_dict["is_correct"] += ok.tolist()``) and gathered once after it, as tensors or as
    Python objects (``gather_object``, ``torch.distributed.all_gather_object``), unless the
    gathered records are keyed by a field of each (``{r["id"]: r for r in records}``): the
    repeats then land on their own key again."""

    code = "ACC404"
    name = "gather-in-evaluation"
    message = (
        "Use accelerator.gather_for_metrics in evaluation: gather counts the padding samples twice"
    )
    why = "The last round is evened out with repeated samples; only gather_for_metrics drops them."
    bad = (
        # a BERT regression script's predictions file: collected per rank, gathered after
        Example(_COLLECTED, 9, 12),
        # collected in a helper that returns the list, gathered by its caller: the same list
        Example(
            _EXTRACTED.format(
                gather="kept",
                after="    records = accelerator.gather_for_metrics(records)\n"
                "    if accelerator.is_main_process:\n"
                "        with open('embeddings.pkl', 'wb') as f:\n"
                "            pickle.dump(records, f)\n",
            ),
            21,
            15,
        ),
        # per-sample answers gathered as Python objects after the loop: the padding stays in
        # the accuracy's numerator and denominator
        Example(_OBJECTS_GATHERED.format(settings="", gather=_GATHER_OBJECT), 11, 14),
        Example(_OBJECTS_GATHERED.format(settings="", gather=_ALL_GATHER_OBJECT), 12, 1),
        # ... and with accelerate.utils' gather_object function, the method's own (an agent
        # safety runner's answer records, duplicated in its answers file: lintreal41)
        Example(
            "from accelerate.utils import gather_object\n"
            + _OBJECTS_GATHERED.format(
                settings="", gather="is_correct = gather_object(eval_dict['is_correct'])\n"
            ),
            12,
            14,
        ),
        # ... and cut to the set's size: the cut neither puts the values back in the loader's
        # order nor, with more than two ranks, drops the repeats (not all at the tail)
        Example(
            _COLLECTED.replace(
                "accelerator.gather(torch.cat(predictions))\n",
                "accelerator.gather(torch.cat(predictions))[: len(loader.dataset)]\n",
            ),
            9,
            12,
        ),
        Example(
            _EVAL + "        preds = accelerator.gather(model(x))\n",
            7,
            17,
            _EVAL + "        preds = accelerator.gather_for_metrics(model(x))\n",
        ),
        # gradients turned off inside the loop; the padding makes the count wrong
        Example(
            HEADER
            + "import torch\nmodel, loader = accelerator.prepare(model, loader)\npreds = []\n"
            + "for x, y in loader:\n    with torch.no_grad():\n        logits = model(x)\n"
            + "    preds.append(accelerator.gather(logits.argmax(-1)))\n"
            + "preds = torch.cat(preds)\nassert len(preds) == len(data)\n",
            9,
            18,
            HEADER
            + "import torch\nmodel, loader = accelerator.prepare(model, loader)\npreds = []\n"
            + "for x, y in loader:\n    with torch.no_grad():\n        logits = model(x)\n"
            + "    preds.append(accelerator.gather_for_metrics(logits.argmax(-1)))\n"
            + "preds = torch.cat(preds)\nassert len(preds) == len(data)\n",
        ),
        Example(  # the prediction runs through the model itself (OmniGenBench's evaluate)
            HEADER
            + "import torch\n\n\nclass Net(torch.nn.Linear):\n"
            + "    def predict(self, x):\n        return {'predictions': self(x).argmax(-1)}\n\n\n"
            + "model, loader = accelerator.prepare(Net(4, 2), loader)\n"
            + "with torch.no_grad():\n    for x, y in loader:\n"
            + "        out = accelerator.unwrap_model(model).predict(x)\n"
            + "        preds = accelerator.gather(out['predictions'])\n",
            15,
            17,
            HEADER
            + "import torch\n\n\nclass Net(torch.nn.Linear):\n"
            + "    def predict(self, x):\n        return {'predictions': self(x).argmax(-1)}\n\n\n"
            + "model, loader = accelerator.prepare(Net(4, 2), loader)\n"
            + "with torch.no_grad():\n    for x, y in loader:\n"
            + "        out = accelerator.unwrap_model(model).predict(x)\n"
            + "        preds = accelerator.gather_for_metrics(out['predictions'])\n",
        ),
        Example(  # what the loop collects is cut after it, but not to a length: still padded
            _EVAL.replace("    for x, y", "    predictions = []\n    for x, y")
            + "        tokens = accelerator.gather(model(x)).cpu().numpy()\n"
            + "        predictions += tokenizer.batch_decode(tokens)\n"
            + "predictions = predictions[1:]\n",
            8,
            18,
        ),
        Example(  # no_grad per batch, over a loader taken from a dict of prepared loaders
            HEADER
            + "import torch\n\n\ndef evaluate(model, loader):\n    preds = []\n"
            + "    for batch in loader:\n        with torch.no_grad():\n"
            + "            logits = model(**batch).logits\n"
            + "            preds.extend(accelerator.gather(logits.argmax(-1)).tolist())\n"
            + "    return preds\n\n\nmodel = accelerator.prepare(model)\n"
            + "loaders = {k: accelerator.prepare(v) for k, v in splits.items()}\n"
            + "evaluate(model, loaders['validation'])\n",
            11,
            26,
        ),
        # per-rank counts over the set, gathered after the loop: the padding is in the counts
        Example(
            _TOTALS
            + "correct = accelerator.gather(correct).sum()\n"
            + "total = accelerator.gather(total).sum()\n"
            + "accelerator.print(correct / total)\n",
            11,
            11,
        ),
        Example(  # even_batches named, left on: the last batches are still padded
            _TOTALS.replace("Accelerator()", "Accelerator(even_batches=True)")
            + "correct = accelerator.gather(correct).sum()\n",
            11,
            11,
        ),
        Example(  # a loader that keeps its last batch
            HEADER
            + "import torch\n"
            + "loader = torch.utils.data.DataLoader(data, batch_size=8, drop_last=False)\n"
            + _TOTALS.removeprefix(HEADER)
            + "correct = accelerator.gather(correct).sum()\n",
            13,
            11,
        ),
        # an evaluation helper handed the prepared loader, its counts summed by hand with
        # dist.all_reduce of a tensor made from them
        Example(_HELPER.format(combine=_ALL_REDUCED, drop=""), 15, 5),
        Example(  # each count reduced as a tensor made in place
            _HELPER.format(
                combine="    n = accelerator.reduce(torch.tensor(total, device='cuda'))\n"
                "    return correct / n.item()\n",
                drop="",
            ),
            14,
            9,
        ),
        Example(  # the same summed by reduce
            _TOTALS + "accuracy = accelerator.reduce(correct, 'sum') / accelerator.reduce(total)\n",
            11,
            12,
        ),
        # the validation loader handed to a trainer that keeps it (``self.val_loader``)
        Example(
            _HANDED_LOADER.format(prepared="model, val_loader", gather="gather"),
            14,
            20,
            _HANDED_LOADER.format(prepared="model, val_loader", gather="gather_for_metrics"),
        ),
        # per-sample counters raised in a loop over the batch, then summed over the ranks
        Example(
            HEADER
            + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
            + "correct, total = 0, 0\n"
            + "with torch.no_grad():\n"
            + "    for x, y in loader:\n"
            + "        preds = model(x).argmax(-1)\n"
            + "        for p, t in zip(preds, y):\n"
            + "            total += 1\n"
            + "            if p == t:\n"
            + "                correct += 1\n"
            + "counts = torch.tensor([correct, total], device=accelerator.device)\n"
            + "counts = accelerator.reduce(counts)\n",
            14,
            10,
        ),
        # a trainer's counters on ``self``, summed over the ranks in its evaluate method: the
        # message names them whole
        Example(
            _TRAINER_COUNTS.format(
                after="        correct = self.accelerator.reduce(self.correct)\n"
                "        total = self.accelerator.reduce(torch.tensor(self.total))\n"
                "        self.accelerator.print(correct.item() / total.item())\n"
            ),
            17,
            19,
        ),
        # the same, counted over the batch's indices
        Example(
            HEADER
            + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
            + "correct, total = 0, 0\n"
            + "with torch.no_grad():\n"
            + "    for x, y in loader:\n"
            + "        logits = model(x)\n"
            + "        for i in range(len(y)):\n"
            + "            total += 1\n"
            + "            correct += int(logits[i].argmax() == y[i])\n"
            + "counts = torch.tensor([correct, total], device=accelerator.device)\n"
            + "counts = accelerator.reduce(counts)\n",
            13,
            10,
        ),
    )
    good = (
        # ... each batch's records gathered for metrics in the helper's loop: the padding dropped
        _EXTRACTED.format(
            gather="accelerator.gather_for_metrics(kept)",
            after="    if accelerator.is_main_process:\n"
            "        with open('embeddings.pkl', 'wb') as f:\n"
            "            pickle.dump(records, f)\n",
        ),
        # uneven last batches left uneven: nothing is repeated, gathering all of it is right
        _OBJECTS_GATHERED.format(settings="even_batches=False", gather=_GATHER_OBJECT),
        # answer records gathered after the loop and keyed by their id: the repeated samples
        # land on their own id again, and the answers are read by id (review11b)
        "import json\nimport torch\nfrom accelerate.utils import gather_object\n"
        + HEADER
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "records = []\n"
        + "with torch.no_grad():\n"
        + "    for batch in loader:\n"
        + "        for i, out in zip(batch['id'], model.generate(batch['input_ids'])):\n"
        + "            records.append({'id': i, 'answer': tokenizer.decode(out)})\n"
        + "records = gather_object(records)\n"
        + "answers = {r['id']: r for r in records}\n"
        + "if accelerator.is_main_process:\n"
        + "    json.dump(list(answers.values()), open('answers.json', 'w'))\n",
        # accelerate.utils' gather_object function where no batch is padded
        "from accelerate.utils import gather_object\n"
        + _OBJECTS_GATHERED.format(
            settings="even_batches=False",
            gather="is_correct = gather_object(eval_dict['is_correct'])\n",
        ),
        # a trainer's counters on ``self`` (ACC403's, never combined), and another member
        # reduced after the loop: ``self.accelerator`` reads ``self``, not the counts
        _TRAINER_COUNTS.format(
            after="        slowest = self.accelerator.reduce(self.elapsed, 'max')\n"
            "        self.accelerator.print(slowest)\n"
        ),
        # each batch's mean loss collected and gathered after the loop: the padding is inside
        # each mean, and a mean of them has no order
        HEADER
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\nlosses = []\n"
        + "with torch.no_grad():\n"
        + "    for x, y in loader:\n"
        + "        loss = loss_fn(model(x), y)\n"
        + "        losses.append(loss.item())\n"
        + "losses = torch.tensor(losses, device=accelerator.device)\n"
        + "print(accelerator.gather(losses).mean().item())\n",
        # the same predictions gathered batch by batch in the loop: the padding dropped, the
        # loader's order kept
        _COLLECTED.replace(
            "        predictions.extend(model(x))\n",
            "        predictions.extend(accelerator.gather_for_metrics(model(x)))\n",
        ).replace(
            "gathered = accelerator.gather(torch.cat(predictions))\n",
            "gathered = torch.cat(predictions)\n",
        ),
        # a helper handed only an unprepared loader: ACC403 advises preparing it (and
        # gather_for_metrics); over the unprepared loader there is no padding to drop
        HEADER
        + "import torch\n\n\ndef evaluate(model, loader):\n    correct = 0\n"
        + "    for x, y in loader:\n        preds = model(x).argmax(-1)\n"
        + "        correct += accelerator.gather(preds == y).sum().item()\n"
        + "    return correct / len(loader.dataset)\n\n\n"
        + "val_loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
        + "model = accelerator.prepare(model)\n"
        + "accelerator.print(evaluate(model, val_loader))\n",
        # a counter raised once per augmented pass (a fixed tuple of scales, not the batch's
        # samples), summed over the ranks: padded samples change no pass count
        HEADER
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
        + "total_loss, passes = 0.0, 0\n"
        + "with torch.no_grad():\n"
        + "    for x in loader:\n"
        + "        for scale in (0.9, 1.0, 1.1):\n"
        + "            total_loss += model(x * scale).pow(2).mean().item()\n"
        + "            passes += 1\n"
        + "sums = torch.tensor([total_loss, passes], device=accelerator.device)\n"
        + "sums = accelerator.reduce(sums)\n"
        + "accelerator.print(sums[0] / sums[1])\n",
        # the same counters over what gather_for_metrics returned, nothing combined after
        HEADER
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
        + "correct, total = 0, 0\n"
        + "with torch.no_grad():\n"
        + "    for x, y in loader:\n"
        + "        preds, y = accelerator.gather_for_metrics((model(x).argmax(-1), y))\n"
        + "        for p, t in zip(preds, y):\n"
        + "            total += 1\n"
        + "            if p == t:\n"
        + "                correct += 1\n"
        + "accelerator.print(correct / total)\n",
        # a count of batches, summed: the padding adds samples, not batches
        HEADER
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
        + "total_loss, batches = 0.0, 0\n"
        + "with torch.no_grad():\n"
        + "    for x, y in loader:\n"
        + "        total_loss += torch.nn.functional.cross_entropy(model(x), y).item()\n"
        + "        batches += 1\n"
        + "sums = torch.tensor([total_loss, batches], device=accelerator.device)\n"
        + "sums = accelerator.reduce(sums)\n"
        + "accelerator.print(sums[0] / sums[1])\n",
        # a Ray Train worker's evaluation over its own dataset shard: no prepared DataLoader,
        # no padded batch for gather_for_metrics to drop
        "import torch\nfrom accelerate import Accelerator\nfrom ray import train\n\n\n"
        "def evaluate(accelerator, model, batch_size):\n"
        "    losses = []\n"
        "    batches = train.get_dataset_shard('valid').iter_torch_batches(batch_size=batch_size)\n"
        "    for batch in batches:\n"
        "        with torch.no_grad():\n"
        "            loss = model(batch['x'], batch['y'])['loss']\n"
        "        losses.append(accelerator.gather(loss[None]))\n"
        "    return torch.stack(losses).mean().item()\n",
        _EVAL + "        preds = accelerator.gather_for_metrics(model(x))\n",
        # the helper's callers hand it a loader that drops its last batch: nothing padded
        _HELPER.format(combine=_ALL_REDUCED, drop=", drop_last=True"),
        # the counts taken from values gathered for metrics in the loop
        _TOTALS.replace(
            "(pred == y).sum()", "accelerator.gather_for_metrics(pred == y).sum()"
        ).replace("y.size(0)", "accelerator.gather_for_metrics(y).size(0)")
        + "accelerator.print(correct / total)\n",
        # no padded batch: even_batches turned off, or the loader drops its last batch
        _TOTALS.replace("Accelerator()", "Accelerator(even_batches=False)")
        + "correct = accelerator.gather(correct).sum()\n",
        HEADER
        + "import torch\nloader = torch.utils.data.DataLoader(data, batch_size=8, drop_last=True)\n"
        + _TOTALS.removeprefix(HEADER)
        + "correct = accelerator.gather(correct).sum()\n",
        _TOTALS.replace(
            "Accelerator()",
            "Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))",
        )
        + "correct = accelerator.gather(correct).sum()\n",
        # a sum of batch losses combined for a log, no count of samples
        _EVAL.replace("    for x, y", "    val = 0.0\n    for x, y")
        + "        val += model(x).mean().item()\n"
        + "val = accelerator.reduce(torch.tensor(val), 'mean')\n",
        # a gather whose result nothing keeps counts nothing (the one kept is gathered for
        # metrics)
        _EVAL
        + "        preds = model(x)\n        accelerator.gather(preds)\n"
        + "        metric.add_batch(predictions=accelerator.gather_for_metrics(preds))\n",
        # an epoch (or step) loop that trains in an inner loop and gathers a total under no_grad:
        # one value per rank, no batch padded
        HEADER
        + "import torch\nmodel, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for epoch in range(3):\n    for x in loader:\n        loss = model(x).mean()\n"
        + "        accelerator.backward(loss)\n    with torch.no_grad():\n"
        + "        total = accelerator.gather(loss).mean()\n",
        # the duplicates dropped by hand, as before gather_for_metrics existed
        _EVAL
        + "        preds, refs = accelerator.gather((model(x), y))\n"
        + "        if step == len(loader) - 1:\n"
        + "            preds = preds[: len(loader.dataset) - seen]\n",
        # what the loop collects cut to the dataset's length after it (a T5 generator's "hack
        # to deal with the auto-filling of the last incomplete batch"): the repeats come last
        _EVAL.replace("    for x, y", "    predictions = []\n    for x, y")
        + "        tokens = accelerator.gather(model(x)).cpu().numpy()\n"
        + "        decoded = tokenizer.batch_decode(tokens)\n"
        + "        predictions += [p.strip() for p in decoded]\n"
        + "predictions = list(chunks(predictions, k))[: len(test_dataset)]\n",
        # the batch's mean loss, one per rank (a vocoder's test mel loss): gather_for_metrics
        # trims rows, not the repeated samples inside a mean, so it would not fix the count
        _EVAL
        + "        loss_mel = F.l1_loss(model(x), y) * 45\n"
        + "        losses += accelerator.gather(loss_mel).tolist()\n",
        # the same as one row each, a sum of two losses, and the batch's size beside them (a
        # HiFi-GAN pre-training's validate): still one value per rank
        _EVAL
        + "        loss_mel = F.l1_loss(model(x), y) * 45\n"
        + "        mel = accelerator.gather(loss_mel.unsqueeze(0))\n"
        + "        fm = accelerator.gather((loss_fm_s + loss_fm_f).unsqueeze(0))\n"
        + "        n = accelerator.gather(torch.tensor(x.size(0), device=accelerator.device))\n",
        # a per-batch metric made a one-element tensor (a tabular ranker's Kendall tau and
        # MAE): one number per rank, whose repeats gather_for_metrics cannot drop either
        _EVAL
        + "        batch_mae = (model(x) - y).abs().mean().item()\n"
        + "        maes.append(accelerator.gather(torch.tensor([batch_mae], device=d)))\n",
        # Hugging Face's no_trainer idiom in a trainer's evaluate: each batch's loss repeated
        # per sample, appended gathered, and the list cut to the dataset after the loop (the
        # repeats come last); also cut where it is concatenated
        "import torch\nfrom accelerate import Accelerator\n\n\nclass Trainer:\n"
        + "    def __init__(self, model, loader):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.loader = self.accelerator.prepare(model, loader)\n\n"
        + "    def evaluate(self):\n        losses = []\n"
        + "        for batch in self.loader:\n"
        + "            with torch.no_grad():\n                loss = self.model(**batch).loss\n"
        + "            bs = batch['input_ids'].shape[0]\n"
        + "            losses.append(self.accelerator.gather(loss.repeat(bs)))\n"
        + "        losses = torch.cat(losses)\n"
        + "        losses = losses[: len(self.loader.dataset)]\n"
        + "        return torch.mean(losses).item()\n",
        _EVAL.replace("    for x, y", "    losses = []\n    for x, y")
        + "        loss = model(x, y)\n"
        + "        losses.append(accelerator.gather(loss.repeat(len(x))))\n"
        + "perplexity = torch.cat(losses)[: len(loader.dataset)].mean()\n",
        # a trainer handed a validation loader main never prepared: every rank reads the whole
        # set, unpadded (ACC401 reports the loader; gather_for_metrics would not mend it)
        _HANDED_LOADER.format(prepared="model", gather="gather"),
        # a training loop gathers its losses for logging: no evaluation, no padding to drop
        HEADER
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for x, y in loader:\n    loss = model(x).mean()\n    accelerator.backward(loss)\n"
        + "    logged = accelerator.gather(loss).mean()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        evaluating = {
            id(loop.node): loop for loop in script.loops if evaluates_each_batch(loop, script)
        } | {id(evaluation.loop.node): evaluation.loop for evaluation in facts.evaluations}
        for call in calls(script):
            if not calls_accelerator(script, call, ("gather",)):
                continue
            loop = loop_of(script, call)
            if (
                loop is not None
                and id(loop) in evaluating
                and gather_counts_padding(evaluating[id(loop)], call, facts)
                and not gathers_batch_loss(call)
                and not _result_dropped(script, call)
                and not _iterates_unprepared_local(script, evaluating[id(loop)])
                and not _over_an_unprepared_loader(script, evaluating[id(loop)])
            ):
                from accelify.edits import rewrites  # a fix's edits: imported for a fix only
                from accelify.edits.plan import Plan

                yield self.finding(script, call, Plan.of(rewrites.use_gather_for_metrics(call)))
        yield from self._gathered_totals(script)
        yield from self._gathered_collections(script)

    def _gathered_collections(self, script: ScriptModel) -> Iterator[Finding]:
        """Per-batch values collected into a list in an evaluation loop over a padded prepared
        DataLoader (``predictions.extend(model(x))``) and gathered once after it
        (``accelerator.gather(torch.tensor(predictions))``, a BERT regression script's
        predictions file): the samples repeated to even out the ranks' last batches stay in
        (``gather_for_metrics`` drops them only while the loader runs, so not after the loop
        either), and the values come out rank by rank, not in the loader's order. The fix is a
        ``gather_for_metrics`` of each batch in the loop."""
        for evaluation in _padded_collecting_evaluations(script):
            loop = evaluation.loop
            collected = {name for sink in evaluation.sinks if (name := _collection(sink))}
            gathers = _gathered_after(script, loop, collected)
            if not gathers:
                continue
            gathers = [call for call in gathers if not _keyed_by_sample(script, call)]
            if not gathers:
                continue
            call = gathers[0]  # one finding per loop: the fix is in the loop
            accelerator = accelerator_name(script, call)
            stays = (
                "the samples repeated to even out the ranks' last batches stay in "
                "(gather_for_metrics drops them only while the loader runs)"
            )
            if isinstance(script.parent(call), cst.Subscript):
                stays = (  # ``gather(...)[: len(dataset)]``: the cut keeps the wrong samples
                    "a cut to the set's size drops the last values, which with more than two "
                    "ranks are not the samples repeated to even out the ranks' last batches "
                    "(those end each padded rank's share)"
                )
            yield self.finding(
                script,
                call,
                message=(
                    f"Gather each batch's values with {accelerator}.gather_for_metrics in the "
                    f"loop at line {script.line(loop.node)} and collect what it returns: "
                    f"gathered after the loop, {stays}, and the values come out rank by rank, "
                    "not in the loader's order"
                ),
            )

    def _gathered_totals(self, script: ScriptModel) -> Iterator[Finding]:
        """Totals counted per rank in an evaluation loop over a prepared DataLoader (``correct
        += (pred == y).sum()``, ``total += y.size(0)``) and combined after it with
        ``accelerator.gather`` or ``accelerator.reduce``: each rank's last batch holds the
        samples repeated to even out the batches, so the combined counts include them. Neither
        ``gather_for_metrics`` of the totals (a sum has no rows to drop) nor a reduce undoes
        that: the per-sample values are gathered for metrics in the loop. Not reported where
        no batch is padded (``even_batches=False``, ``drop_last``)."""
        for evaluation in _padded_forward_evaluations(script):
            loop = evaluation.loop
            counted = _sample_counts(script, evaluation)
            if not counted:
                continue
            combining = [
                (call, combined)
                for call in totals_combined_after(evaluation, facts_of(script))
                if call.args and (combined := _counts_combined(script, call, counted))
            ]
            if not combining:
                continue
            call = combining[0][0]  # one finding per loop: the fix is in the loop
            totals = " and ".join(sorted({name for _, names in combining for name in names}))
            how = call.func.attr.value  # type: ignore[attr-defined]
            yield self.finding(
                script,
                call,
                message=(
                    f"Gather the per-sample values with {accelerator_name(script, call)}"
                    f".gather_for_metrics in the loop at line {script.line(loop.node)} and "
                    f"count {totals} on what it returns: each rank counts its own batches, "
                    "whose last one holds samples repeated to even out the ranks' batches, so "
                    f"the combined totals count them twice ({_article(how)} {how} of the "
                    "totals cannot drop them)"
                ),
            )


def _gathered_after(script: ScriptModel, loop: Loop, collected: set[str]) -> list[cst.Call]:
    """The ``gather``/``gather_for_metrics`` calls after ``loop`` (in its function, else the
    module) of a value read from ``collected`` (``torch.cat(predictions)``), or from a name
    assigned from them there first (``preds = torch.cat(predictions)``)."""
    if not collected:
        return []
    facts = facts_of(script)
    scope = facts.placement.enclosing_function(loop.node)
    return _gathered_below(script, scope, loop.node, set(collected), depth=2)


def _gathered_below(
    script: ScriptModel,
    scope: cst.FunctionDef | None,
    start: cst.CSTNode,
    collected: set[str],
    depth: int,
) -> list[cst.Call]:
    """`_gathered_after` in ``scope`` below ``start``; where ``scope`` returns what it collected
    (``return embeddings``), also in each caller below the call, through the name the caller
    binds the result to (``embeddings = extract(loader, model)``, then
    ``accelerator.gather_for_metrics(embeddings)``): the returned list is the same object."""
    facts = facts_of(script)
    body = scope.body if scope is not None else script.module
    after = script.order(start)
    made_from, found = set(collected), []
    for node in walk(body):
        if script.order(node) <= after or facts.placement.inside(node, start):
            continue
        if scope is not None and facts.placement.enclosing_function(node) is not scope:
            continue  # a nested function's own statements
        if isinstance(node, cst.Assign):
            if {n.value for n in walk(node.value) if isinstance(n, cst.Name)} & made_from:
                made_from |= {n for t in assigned_targets(node) for n in target_names(t)}
        elif (
            isinstance(node, cst.Call)
            and (gathered := _gathered_value(script, node)) is not None
            and {n.value for n in walk(gathered) if isinstance(n, cst.Name)} & made_from
        ):
            found.append(node)
    if found or scope is None or depth == 0:
        return found
    for statement, name in held_by_callers(facts, scope, made_from):
        caller = facts.placement.enclosing_function(statement)
        found += _gathered_below(script, caller, statement, {name}, depth - 1)
    return found


def _keyed_by_sample(script: ScriptModel, call: cst.Call) -> bool:
    """What ``call`` gathered is bound to a name (``records = gather_object(records)``) that a
    dict comprehension below it, in the same function, keys by a field of each item (``{r["id"]:
    r for r in records}``): the samples repeated to even out the last batches land on their
    own key once more, and the rank-by-rank order is read back by key, not position
    (review11b: an evaluation that writes its answers deduplicated by id)."""
    statement = script.parent(call)
    if not (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
    ):
        return False
    name = statement.targets[0].target.value
    scope = facts_of(script).placement.enclosing_function(call)
    body = scope.body if scope is not None else script.module
    after = script.order(statement)
    for node in walk(body):
        if not isinstance(node, cst.DictComp) or script.order(node) <= after:
            continue
        loop = node.for_in
        if (
            loop.inner_for_in is None
            and isinstance(loop.iter, cst.Name)
            and loop.iter.value == name
            and isinstance(loop.target, cst.Name)
            and not isinstance(node.key, cst.Name)  # ``{r: ...}``: the item itself, no field
            and loop.target.value in {n.value for n in walk(node.key) if isinstance(n, cst.Name)}
        ):
            return True
    return False


#: accelerate's own function behind ``accelerator.gather_object``.
_GATHER_OBJECT_FUNCTIONS = frozenset(
    {"accelerate.utils.gather_object", "accelerate.utils.operations.gather_object"}
)


def _gathered_value(script: ScriptModel, call: cst.Call) -> cst.BaseExpression | None:
    """What ``call`` gathers over the ranks: the first argument of the accelerator's
    ``gather``, ``gather_for_metrics`` or ``gather_object``, the object of
    ``torch.distributed.all_gather_object(out, obj)`` (PickScore's per-rank lists of
    predictions); None for any other call."""
    if call.args and calls_accelerator(
        script, call, ("gather", "gather_for_metrics", "gather_object")
    ):
        return call.args[0].value
    name = dotted(call.func)
    qualified = script.imports.resolve(name) if name else None
    if qualified == "torch.distributed.all_gather_object" and len(call.args) >= 2:
        return call.args[1].value
    if qualified in _GATHER_OBJECT_FUNCTIONS:
        return call.args[0].value if call.args else None  # the function the method calls
    return None


def _collection(sink: cst.CSTNode) -> str | None:
    """``predictions`` of a sink ``predictions.append(...)`` / ``predictions.extend(...)``, or
    of ``predictions += preds.tolist()`` (also ``eval_dict["preds"] += ...``): a list grown
    by a list of the batch's values (a count added up is `_gathered_totals`' business)."""
    if (
        isinstance(sink, cst.AugAssign)
        and isinstance(sink.operator, cst.AddAssign)
        and _a_list(sink.value)
        and not _batch_loss(sink.value)
    ):
        return root_name(sink.target)
    for node in walk(sink):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("append", "extend")
            and isinstance(node.func.value, cst.Name)
        ):
            # a batch's mean loss per entry: its padding is inside each mean, which no gather
            # for metrics undoes (as `gathers_batch_loss` says of a gather in the loop)
            if not node.args or _batch_loss(node.args[0].value):
                return None
            return node.func.value.value
    return None


def _a_list(value: cst.BaseExpression) -> bool:
    """``x.tolist()``, ``list(x)``, a list display or comprehension: a list, item by item."""
    if isinstance(value, (cst.List, cst.ListComp)):
        return True
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Attribute):
        return value.func.attr.value == "tolist"
    return isinstance(value.func, cst.Name) and value.func.value == "list"


def _batch_loss(value: cst.BaseExpression) -> bool:
    """``loss``, ``loss.item()``, ``loss.detach().cpu()``: one batch's mean loss."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in ("item", "detach", "cpu", "float", "clone")
    ):
        value = value.func.value
    name = dotted(value)
    return name is not None and "loss" in name.rsplit(".", 1)[-1].lower()


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _counts_combined(script: ScriptModel, call: cst.Call, counted: set[str]) -> set[str]:
    """The sample counts a combining call (``accelerator.reduce``, ``gather``,
    ``dist.all_reduce``) sums across ranks: read in its argument (``reduce(correct)``,
    ``reduce(torch.tensor(correct))``) or in the one value its argument's name was made from
    (``counts = torch.tensor([correct, total]); dist.all_reduce(counts)``)."""
    argument = call.args[0].value
    found = _read_totals(argument) & counted
    name = root_name(argument)
    if found or name is None:
        return found
    function = script.index.enclosing_function(call)
    made = [
        assign.value
        for assign in script.assignments
        if script.index.enclosing_function(assign) is function
        and script.order(assign) < script.order(call)
        and not script.inside(call, assign)  # ``counts = accelerator.reduce(counts)`` itself
        and any(dotted(t) == name for t in assigned_targets(assign))
    ]
    if made:
        found = _read_totals(made[-1]) & counted
    return found


def _read_totals(value: cst.CSTNode) -> set[str]:
    """The totals ``value`` reads as `_total_key` spells them: ``correct``, ``self.correct``
    (never ``self`` alone, which ``self.accelerator`` reads too)."""
    return {
        key
        for node in walk(value)
        if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript))
        and (key := _total_key(node)) is not None
    }


def _total_key(target: cst.BaseExpression) -> str | None:
    """A total as the analysis keeps it: a name or an attribute chain whole (``correct``,
    ``self.correct``: each of a trainer's counters is its own), a dict's entry by the dict
    (``stats`` for ``stats["n"]``)."""
    if isinstance(target, cst.Subscript):
        return root_name(target)
    return dotted(target)


def _result_dropped(script: ScriptModel, call: cst.Call) -> bool:
    """``accelerator.gather(predictions)`` alone on its line (a GLUE LoRA script gathers twice
    and keeps the second): nothing is counted from it, padding or not."""
    return isinstance(script.parent(call), cst.Expr)


def _sample_counts(script: ScriptModel, evaluation: Evaluation) -> set[str]:
    """The totals the loop adds counts of samples to: ``correct += (pred == y).sum()``,
    ``total += y.size(0)`` (a metric over the set, which padded samples change), also under a
    branch of the loop; and a counter raised by a number once per sample, in a loop over the
    batch's samples (``for p, t in zip(preds, y): total += 1; if p == t: correct += 1``)."""
    found = set()
    for sink in evaluation.sinks:
        for small in walk(sink):
            if not (isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign)):
                continue
            if _counts_samples(small.value) or (
                isinstance(small.value, cst.Integer) and _per_sample(script, small, evaluation)
            ):
                found.add(_total_key(small.target))
    return found - {None}


def _per_sample(script: ScriptModel, node: cst.CSTNode, evaluation: Evaluation) -> bool:
    """``node`` runs once per item of a loop inside the evaluation loop over the batch's
    samples: its iterable reads the batch or the model's output, or a name the loop derives
    from them (``zip(preds, y)``, ``range(len(y))``, ``labels.tolist()``). A loop over
    anything else (``for scale in (0.9, 1.0, 1.1)``: test-time augmentation) runs a fixed
    number of times per batch, and a counter raised in it counts passes, not samples."""
    loop = evaluation.loop.node
    samples = _sample_names(script, evaluation)
    for ancestor in script.ancestors(node):
        if ancestor is loop:
            return False
        if isinstance(ancestor, cst.For) and any(
            isinstance(n, cst.Name) and n.value in samples for n in walk(ancestor.iter)
        ):
            return True
    return False


def _sample_names(script: ScriptModel, evaluation: Evaluation) -> set[str]:
    """The batch's names, the forward's outputs, what is gathered, and every name the
    evaluation loop binds from them (``preds = logits.argmax(-1)``, ``preds, labels =
    accelerator.gather_for_metrics((preds, y))``, an inner loop's ``p, t`` over them)."""
    loop = evaluation.loop.node
    found = set(evaluation.loop.batch_names) | evaluation.batch
    found |= set(evaluation.outputs) | set(evaluation.gathered)
    bindings: list[tuple[cst.BaseExpression, set[str]]] = [
        (assign.value, {n for t in assigned_targets(assign) for n in target_names(t)})
        for assign in script.assignments
        if script.inside(assign, loop) and assign.value is not None
    ]
    bindings += [
        (inner.iter, target_names(inner.target))
        for inner in walk(loop.body)
        if isinstance(inner, cst.For)
    ]
    grown = True
    while grown:
        grown = False
        for value, targets in bindings:
            if targets - found and any(
                isinstance(n, cst.Name) and n.value in found for n in walk(value)
            ):
                found |= targets
                grown = True
    return found


def _counts_samples(value: cst.BaseExpression) -> bool:
    """A count of samples: a sum over a comparison (``(pred == y).sum()``, ``pred.eq(y).sum()``)
    or the batch's size (``y.size(0)``, ``len(y)``, ``y.numel()``, ``y.shape[0]``)."""
    for node in walk(value):
        if not isinstance(node, cst.Call):
            continue
        if dotted(node.func) == "len":
            return True
        if not isinstance(node.func, cst.Attribute):
            continue
        member = node.func.attr.value
        compared = any(
            isinstance(n, cst.Comparison)
            or (isinstance(n, cst.Attribute) and n.attr.value in ("eq", "ne"))
            for n in walk(node.func.value)
        )
        if (member == "sum" and compared) or member in ("numel", "size"):
            return True
    return any(
        isinstance(node, cst.Subscript) and (dotted(node.value) or "").endswith(".shape")
        for node in walk(value)
    )


def _over_a_padded_loader(script: ScriptModel, evaluation: Evaluation) -> bool:
    """The loop reads a prepared DataLoader whose last batches are evened out with repeated
    samples: Accelerate's default ``even_batches``, not turned off in the file, and no
    ``drop_last`` where the loader is made (followed to the callers of a helper whose parameter
    the loop reads)."""
    loop = evaluation.loop
    flow = facts_of(script).flow
    if not flow.over_prepared_loader(loop):
        return False
    if _even_batches_turned_off(script):
        return False
    # a helper's parameter (``def evaluate(model, loader, accelerator)``): the loaders its
    # callers hand it, where they are made
    read = {loop.iterable} | flow.origins(loop.iterable, loop.node)
    made = {
        given
        for prepare in script.prepare_calls
        for given, output in zip(prepare.inputs, prepare.outputs, strict=False)
        if output in read and given
    } | (read - {None})
    for binding in script.of_kind(Kind.DATALOADER):
        if (
            binding.name in made
            and isinstance(binding.value, cst.Call)
            and _not_false(keyword_value(binding.value, "drop_last"))
        ):
            return False
    return True


def _not_false(value: cst.BaseExpression | None) -> bool:
    """A keyword given a value that may be true: ``True``, or one the file does not show
    (``args.drop_last``); not ``False``, ``None`` or ``0``, nor a keyword not given."""
    if value is None:
        return False
    if isinstance(value, cst.Name):
        return value.value not in ("False", "None")
    return not (isinstance(value, cst.Integer) and value.value == "0")


def _even_batches_turned_off(script: ScriptModel) -> bool:
    """``Accelerator(even_batches=False)``, ``Accelerator(dataloader_config=
    DataLoaderConfiguration(even_batches=False))`` (also through a name),
    ``join_uneven_inputs(..., even_batches=False)`` or ``accelerator.even_batches = False``:
    a value that may be false, also one the file does not show (``args.even_batches``). A
    mention of the word, or ``even_batches=True``, turns nothing off."""
    given_to_accelerators = {
        dotted(value)
        for call in script.calls
        if is_accelerator_call(call)
        and (value := keyword_value(call, "dataloader_config")) is not None
    }
    for call in script.calls:
        value = keyword_value(call, "even_batches")
        if value is None or _literally_true(value):
            continue
        if (dotted(call.func) or "").endswith("DataLoaderConfiguration"):
            parent = script.parent(script.parent(call) or call)
            assigned = script.parent(call)
            if not (
                is_accelerator_call(parent)
                or (
                    isinstance(assigned, cst.Assign)
                    and any(dotted(t) in given_to_accelerators for t in assigned_targets(assigned))
                )
            ):
                continue  # a configuration no Accelerator in the file is given
        return True
    return any(
        isinstance(target, cst.Attribute)
        and target.attr.value == "even_batches"
        and not _literally_true(assign.value)
        for assign in script.assignments
        for target in assigned_targets(assign)
    )


def _literally_true(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"


def _over_an_unprepared_loader(script: ScriptModel, loop: Loop) -> bool:
    """The loop reads a DataLoader that no prepare call returns, under its own name or as the
    attribute a trainer keeps it in (``self.val_loader = val_loader`` of ``Trainer(accelerator,
    model, optimizer, train_loader, val_loader)`` after ``prepare(model, optimizer,
    train_loader)``), or a helper's parameter every call hands such a loader
    (`Flow.parameter_prepared` is False): every rank reads the whole set, unpadded, and
    ``gather_for_metrics`` returns every rank's copy too. ACC401 (or ACC403, at the total)
    reports the loader; prepared, its padding is this rule's again. A name counts only as its
    own function binds it (or the module, where the function does not): another function's
    ``loader = DataLoader(...)`` is another object. Prepared also means what the project's
    other modules hand the function prepared (`ScriptModel.given_prepared`)."""
    name = loop.iterable
    if name is None:
        return False
    prepared = script.prepared_names | script.given_prepared(loop.node)
    if name in prepared or entry_read(script.module, loop.node.iter) in prepared:
        return False
    function = script.index.enclosing_function(loop.node)
    if function is not None and name in {p.name.value for p in all_params(function.params)}:
        return facts_of(script).flow.parameter_prepared(function, name) is False
    if "." in name:  # an attribute: every method of the object reads the same one
        return name in script.names_of(Kind.DATALOADER)
    own = [b for b in script.of_kind(Kind.DATALOADER) if b.name == name]
    if function is not None and any(b.scope is function for b in own):
        return True
    return any(isinstance(b.scope, cst.Module) for b in own)


def _iterates_unprepared_local(script: ScriptModel, loop: Loop) -> bool:
    """The loop reads a local of its own function that no prepare call returns
    (``eval_dataloader = self.valid_dataset.iter_torch_batches(...)``, a Ray Train worker's
    dataset shard): no prepared DataLoader pads its last batch, so there is nothing
    ``gather_for_metrics`` would drop, and the padding this rule is about does not exist."""
    name = loop.iterable
    function = script.index.enclosing_function(loop.node)
    if name is None or "." in name or function is None:
        return False
    assigns = [a for a in script.index.assignments_to(name) if script.scope_of(a) is function]
    if not assigns:
        return False
    return not any(
        name in prepare.outputs and script.inside(prepare.call, function)
        for prepare in script.prepare_calls
    )


def _padded_collecting_evaluations(script: ScriptModel) -> Iterator[Evaluation]:
    """`_padded_forward_evaluations`, and the loops over such a loader that run no model the
    analysis knows (an embedding extractor's ``model = get_model(args.model)``) but collect
    values read from the batch: each padded rank's share holds the repeated samples whatever
    computes the values, so a gather of the collection after the loop keeps them."""
    facts = facts_of(script)
    for evaluation in facts.evaluations:
        if evaluation.already_gathered or not _over_a_padded_loader(script, evaluation):
            continue
        if (
            first_forward(evaluation.loop, facts) is not None
            or predicts_through_the_model(evaluation.loop)
            or any(_reads_the_batch(script, evaluation.loop, sink) for sink in evaluation.sinks)
        ):
            yield evaluation


def _reads_the_batch(script: ScriptModel, loop: Loop, sink: cst.CSTNode) -> bool:
    """``sink`` (``embeddings.append({"embedding": out[i], ...})``) reads the loop's batch or a
    name the loop binds from it (``out = model(data["image"])``, also through several
    bindings)."""
    derived = set(loop.batch_names)
    assignments = [
        node
        for node in walk(loop.node.body)
        if isinstance(node, cst.Assign | cst.AugAssign | cst.AnnAssign)
    ]
    grew = True
    while grew:
        grew = False
        for node in assignments:
            value = node.value
            if value is None or not _names_in(value) & derived:
                continue
            bound = [node.target] if isinstance(node, cst.AugAssign) else assigned_targets(node)
            targets = {n for t in bound for n in target_names(t)}
            if not targets <= derived:
                derived |= targets
                grew = True
    added = [
        argument.value
        for node in walk(sink)
        if isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in ("append", "extend")
        for argument in node.args
    ]
    return any(_names_in(value) & derived for value in added)


def _names_in(node: cst.CSTNode) -> set[str]:
    return {n.value for n in walk(node) if isinstance(n, cst.Name)}


def _padded_forward_evaluations(script: ScriptModel) -> Iterator[Evaluation]:
    """The evaluation loops, not gathered yet, over a prepared DataLoader whose last batches
    are padded, that run the model (its call, or a prediction through it): where what is
    combined after the loop holds the repeated samples."""
    facts = facts_of(script)
    for evaluation in facts.evaluations:
        if evaluation.already_gathered or not _over_a_padded_loader(script, evaluation):
            continue
        if first_forward(evaluation.loop, facts) is None and not predicts_through_the_model(
            evaluation.loop
        ):
            continue
        yield evaluation
