from collections.abc import Callable, Iterator
from pathlib import Path

import libcst as cst

from accelify.analysis import side_effects
from accelify.analysis.alike_tests import alike_by_its_callers
from accelify.analysis.collectives import combines_ranks
from accelify.analysis.evaluation import first_forward as _first_forward
from accelify.analysis.evaluation import self_syncing_metrics, written_rows
from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.objects import bound_arguments
from accelify.analysis.outside_callers import ProjectView
from accelify.analysis.project_modules import read
from accelify.analysis.repeated_effects import callers_of
from accelify.analysis.returned_values import held_by_callers, returned_tuples, unpacked_slot
from accelify.analysis.sample_counts import first_dimension_of
from accelify.analysis.script_model import Kind, Loop, ScriptModel, analyze
from accelify.analysis.shard_totals import ShardTotal, divided_by_set_size
from accelify.analysis.sharded_loaders import sharded_by_its_sampler
from accelify.analysis.syntax import (
    Visitor,
    argument_value,
    dotted,
    root_name,
    target_names,
    top_level_functions,
    visit_code,
    walk,
)
from accelify.errors import UserError
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name, calls

_EVAL = (
    HEADER
    + "import torch\n"
    + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
    + "correct = 0\n"
    + "with torch.no_grad():\n"
    + "    for x, y in eval_loader:\n"
    + "        preds = model(x).argmax(-1)\n"
)
_STEP_HELPER = (
    "import torch\n"
    + "from accelerate import Accelerator\n\n\n"
    + "class Trainer:\n"
    + "    def __init__(self, model, optimizer, val_loader):\n"
    + "        self.accelerator = Accelerator()\n"
    + "        self.model, self.optimizer, self.val_loader = self.accelerator.prepare(\n"
    + "            model, optimizer, val_loader)\n\n"
    + "    def make_step(self, batch, update_model=True):\n"
    + "        pred = self.model(batch['x'])\n"
    + "        loss = (pred - batch['y']).pow(2).mean()\n"
    + "        if update_model:\n"
    + "            self.accelerator.backward(loss)\n"
    + "            self.optimizer.step()\n"
    + "        return loss.item(), pred.detach()\n\n"
)
#: A data set split by the rank by hand, for `_WHOLE_EVAL`'s loader.
_RANK_PART = (
    "torch.utils.data.Subset(test_set, "
    + "range(accelerator.process_index, len(test_set), accelerator.num_processes))"
)
_COLLECTIVES = ("gather", "gather_for_metrics", "reduce", "gather_object", "pad_across_processes")
_ACCUMULATING_METHODS = ("append", "extend", "add_batch", "update", "add")


_WHOLE_EVAL = (
    HEADER
    + "import torch\n"
    + "from torch.utils.data import DataLoader\n"
    + "model = accelerator.prepare(model)\n"
    + "test_loader = DataLoader(test_set, batch_size=64{sampler})\n"
    + "correct = 0\n"
    + "with torch.no_grad():\n"
    + "    for x, y in test_loader:\n"
    + "        x, y = x.to(accelerator.device), y.to(accelerator.device)\n"
    + "        {preds}\n"
    + "        correct += (preds == y).sum().item()\n"
    + "accelerator.print(correct / len(test_loader.dataset))\n"
)


_HELD_EVAL = (
    HEADER
    + "from types import SimpleNamespace\n"
    + "import torch\n"
    + "model = torch.nn.Linear(4, 2)\n"
    + "val_loader = torch.utils.data.DataLoader(range(8))\n"
    + "model, val_loader = accelerator.prepare(model, val_loader)\n"
    + "\n\n"
    + "def evaluate(s):\n"
    + "    correct = 0\n"
    + "    for x, y in {read}:\n"
    + "        preds = {model}(x).argmax(-1)\n"
    + "{gather}"
    + "        correct += (preds == y).sum().item()\n"
    + "    return correct\n"
    + "\n\n"
    + "state = {held}\n"
    + "accelerator.print(evaluate(state))\n"
)
#: The prepared loader and model held in a namespace, or in a dict, that a helper is handed:
#: the field (the entry) is the object it was built with.
_IN_A_NAMESPACE = {
    "read": "s.val_loader",
    "model": "s.model",
    "held": "SimpleNamespace(model=model, val_loader=val_loader)",
}
_IN_A_DICT = {
    "read": 's["val_loader"]',
    "model": 's["model"]',
    "held": '{"model": model, "val_loader": val_loader}',
}
_GATHERED = "        preds, y = accelerator.gather_for_metrics((preds, y))\n"
_WHOLE_LISTS = (
    HEADER
    + "import torch\n"
    + "from torch.utils.data import DataLoader\n"
    + "model = accelerator.prepare(model)\n"
    + "test_loader = DataLoader(test_set, batch_size=64)\n"
    + "all_preds, all_labels = [], []\n"
    + "with torch.no_grad():\n"
    + "    for x, y in test_loader:\n"
    + "        all_preds.append(accelerator.gather(model(x).argmax(-1)))\n"
    + "        all_labels.append({labels})\n"
    + "preds, labels = torch.cat(all_preds), torch.cat(all_labels)\n"
    + "{metric}\n"
)


#: A step function that trains unless told not to, run for evaluation with gradients off
#: inside the loop's body (``{after}``: what follows the loop).
_STEP_WITH_GRADIENTS_OFF = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "def make_step(model, optimizer, batch, update_model=True):\n"
    "    loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])\n"
    "    if update_model:\n"
    "        accelerator.backward(loss)\n"
    "        optimizer.step()\n"
    "    return loss\n\n\n"
    "accelerator = Accelerator()\n"
    "model, optimizer, test_loader = accelerator.prepare(model, optimizer, test_loader)\n"
    "total = 0.0\n"
    "for batch in test_loader:\n"
    "    with torch.no_grad():\n"
    "        loss = make_step(model, optimizer, batch, update_model=False)\n"
    "    total += loss.item()\n"
    "{after}"
)

#: An evaluator object that keeps the loader its constructor is handed and counts over it in
#: ``__call__``; built with the prepared evaluation loader (``{gather}``: the gather, if any).
_EVALUATOR_OBJECT = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Evaluator:\n"
    "    def __init__(self, accelerator, loader):\n"
    "        self.accelerator = accelerator\n"
    "        self.loader = loader\n\n"
    "    def __call__(self, model):\n"
    "        correct, total = 0, 0\n"
    "        for batch, labels in self.loader:\n"
    "            with torch.no_grad():\n"
    "                predictions = model(batch).argmax(-1)\n"
    "{gather}"
    "            correct += (predictions == labels).sum().item()\n"
    "            total += len(labels)\n"
    "        return correct / total\n\n\n"
    "accelerator = Accelerator()\n"
    "model, optimizer, eval_loader = accelerator.prepare(model, optimizer, eval_loader)\n"
    "evaluator = Evaluator(accelerator, eval_loader)\n"
    "print(evaluator(model))\n"
)


#: A trainer whose training loop runs its backward two calls down (``self.update(loss)`` ->
#: ``self._backward(loss)`` -> ``accelerator.backward``): a training loop, not an evaluation,
#: beside an evaluation loop of its own (``{gather}``: the gather, if any).
_UPDATE_TWO_CALLS_DOWN = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n"
    "    def __init__(self, model, optimizer, loader, val_loader):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer, self.loader, self.val_loader = (\n"
    "            self.accelerator.prepare(model, optimizer, loader, val_loader))\n\n"
    "    def _backward(self, loss):\n"
    "        self.accelerator.backward(loss)\n\n"
    "    def update(self, loss):\n"
    "        self._backward(loss)\n"
    "        self.optimizer.step()\n"
    "        self.optimizer.zero_grad()\n\n"
    "    def fit(self):\n"
    "        epoch_loss = 0.0\n"
    "        for batch in self.loader:\n"
    "            loss = self.model(batch).mean()\n"
    "            self.update(loss)\n"
    "            epoch_loss += loss.item()\n"
    "        return epoch_loss\n\n"
    "    @torch.no_grad()\n"
    "    def evaluate(self):\n"
    "        correct = 0\n"
    "        for x, y in self.val_loader:\n"
    "            preds = self.model(x).argmax(-1)\n"
    "{gather}"
    "            correct += (preds == y).sum().item()\n"
    "        return correct\n"
)


#: A helper returning this rank's predictions and labels as a tuple, and a training loop
#: that reads one place of it each epoch (``{read}``).
_TUPLE_EVAL = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "\n"
    "\n"
    "def evaluate(model, loader):\n"
    "    model.eval()\n"
    "    preds, labels = [], []\n"
    "    with torch.no_grad():\n"
    "        for x, y in loader:\n"
    "            preds.append(model(x).argmax(-1))\n"
    "            labels.append(y)\n"
    "    return torch.cat(preds), torch.cat(labels)\n"
    "\n"
    "\n"
    "def main(model, optimizer, train_set, eval_set):\n"
    "    accelerator = Accelerator()\n"
    "    train_loader = torch.utils.data.DataLoader(train_set, batch_size=8)\n"
    "    eval_loader = torch.utils.data.DataLoader(eval_set, batch_size=8)\n"
    "    model, optimizer, train_loader, eval_loader = accelerator.prepare(\n"
    "        model, optimizer, train_loader, eval_loader\n"
    "    )\n"
    "    for epoch in range(3):\n"
    "        for x, y in train_loader:\n"
    "            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
    "            optimizer.step()\n"
    "            optimizer.zero_grad()\n"
    "{read}        accelerator.print(epoch, len(preds))\n"
)


#: A helper returning this rank's predictions, gathered by one call each epoch and, after
#: the epochs, called again (``{final}``).
_EVALUATED_TWICE = (
    "import torch\n"
    "from accelerate import Accelerator\n"
    "\n"
    "\n"
    "def evaluate(model, loader):\n"
    "    model.eval()\n"
    "    preds = []\n"
    "    with torch.no_grad():\n"
    "        for x, y in loader:\n"
    "            preds.append(model(x).argmax(-1))\n"
    "    return torch.cat(preds)\n"
    "\n"
    "\n"
    "def main(model, optimizer, train_set, eval_set):\n"
    "    accelerator = Accelerator()\n"
    "    train_loader = torch.utils.data.DataLoader(train_set, batch_size=8)\n"
    "    eval_loader = torch.utils.data.DataLoader(eval_set, batch_size=8)\n"
    "    model, optimizer, train_loader, eval_loader = accelerator.prepare(\n"
    "        model, optimizer, train_loader, eval_loader\n"
    "    )\n"
    "    for epoch in range(3):\n"
    "        for x, y in train_loader:\n"
    "            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))\n"
    "            optimizer.step()\n"
    "            optimizer.zero_grad()\n"
    "        preds = accelerator.gather_for_metrics(evaluate(model, eval_loader))\n"
    "        accelerator.print(epoch, len(preds))\n"
    "{final}    accelerator.print(len(final))\n"
)


#: A timm launcher: the forward runs in a registry-built paradigm object the file does not
#: define, handed the prepared model and the batch; ``{gather}`` is what the loop does with it.
_PARADIGM_EVAL = (
    HEADER
    + "import evaluate\nimport timm\n\n\n"
    + "def launch(args, paradigm, loader):\n"
    + "    model = timm.create_model(args.model)\n"
    + "    model, loader = accelerator.prepare(model, loader)\n"
    + "    metric = evaluate.load('accuracy')\n"
    + "    for x, label in loader:\n"
    + "        pred = paradigm.inference(model, x)\n"
    + "{gather}"
    + "        metric.add_batch(references=label, predictions=pred)\n"
    + "    accelerator.print(metric.compute())\n"
)


class UngatheredMetric(Rule):
    """An evaluation loop over a prepared DataLoader sees only this rank's shard. A metric
    accumulated there (``correct += ...``, ``preds.append(...)``, ``metric.add_batch(...)``,
    ``losses[name] += ...``; also from a helper that runs the model per batch and gathers
    nothing) without ``accelerator.gather_for_metrics`` (in the loop) or
    ``accelerator.reduce``/``gather`` (of the total, after it) is the metric of 1/N of the
    evaluation set, and each rank reports a different number."""

    code = "ACC403"
    name = "ungathered-metric"
    message = (
        "Gather before accumulating the metric: accelerator.gather_for_metrics(...) on the "
        "predictions and labels, or accelerator.reduce the total after the loop"
    )
    why = "Each rank evaluates only its shard of a prepared DataLoader."
    bad = (
        # the forward in an object the file does not define, handed the model and the batch
        Example(_PARADIGM_EVAL.format(gather=""), 13, 9),
        # the helper is right for the call that gathers: the call that leaves it is the bug
        Example(
            _EVALUATED_TWICE.format(final="    final = evaluate(model, eval_loader)\n"), 28, 13
        ),
        # one place of a helper's returned tuple read ungathered (`evaluate(...)[0]`)
        Example(
            _TUPLE_EVAL.format(read="        preds = evaluate(model, eval_loader)[0]\n"), 10, 13
        ),
        # one call of the helper is read unchanged: its predictions are this rank's alone,
        # reported at that call (the helper is right for the call that gathers)
        Example(
            "import torch\nfrom accelerate import Accelerator\n\n\n"
            "def evaluate(model, loader):\n"
            "    preds = []\n"
            "    with torch.no_grad():\n"
            "        for x, y in loader:\n"
            "            preds.append(model(x).argmax(-1))\n"
            "    return torch.cat(preds)\n\n\n"
            "accelerator = Accelerator()\n"
            "model, loader = accelerator.prepare(model, loader)\n"
            "preds = accelerator.gather_for_metrics(evaluate(model, loader))\n"
            "print(len(evaluate(model, loader)))\n",
            16,
            11,
        ),
        # gradients turned off inside the loop's body: an evaluation through the step function
        Example(_STEP_WITH_GRADIENTS_OFF.format(after="print(total / len(test_loader))\n"), 19, 5),
        # the trainer's evaluation loop: reported, and its training loop (the backward two
        # calls down) is not
        Example(_UPDATE_TWO_CALLS_DOWN.format(gather=""), 32, 13),
        # an evaluator object: the loader its constructor keeps is the prepared one
        Example(_EVALUATOR_OBJECT.format(gather=""), 15, 13),
        # built after prepare, with the loader of the file's DataLoader(...): the prepared one
        Example(
            _EVALUATOR_OBJECT.format(gather="").replace(
                "model, optimizer, eval_loader = accelerator.prepare(",
                "eval_loader = torch.utils.data.DataLoader(eval_set, batch_size=8)\n"
                "model, optimizer, eval_loader = accelerator.prepare(",
            ),
            15,
            13,
        ),
        # ... the same helper's tuple with the references left ungathered: this rank's labels
        Example(
            HEADER
            + "import evaluate\n\n\n"
            + "def predict(model, dataloader, tokenizer):\n"
            + "    predictions, references = [], []\n"
            + "    for batch in dataloader:\n"
            + "        tokens = model.generate(input_ids=batch['input_ids'])\n"
            + "        predictions += tokenizer.batch_decode(tokens)\n"
            + "        references += tokenizer.batch_decode(batch['labels'])\n"
            + "    return predictions, references\n\n\n"
            + "model, test_loader = accelerator.prepare(model, test_loader)\n"
            + "predictions, references = predict(model, test_loader, tokenizer)\n"
            + "predictions = accelerator.gather_for_metrics(predictions, use_gather_object=True)\n"
            + "accelerator.print(evaluate.load('rouge').compute(predictions=predictions, "
            + "references=references))\n",
            11,
            9,
        ),
        # a helper handed a namespace (a dict) of the prepared loader and model: its loop over
        # the field (the entry) reads this rank's shard, and nothing gathers it
        Example(_HELD_EVAL.format(gather="", **_IN_A_NAMESPACE), 14, 9),
        Example(_HELD_EVAL.format(gather="", **_IN_A_DICT), 14, 9),
        # nanoT5's predict: a summarisation helper handed the prepared model and test loader
        # decodes what generate() returns and feeds the rouge metric this rank's shard only
        Example(
            HEADER
            + "import evaluate\n\n\n"
            + "def predict(model, dataloader, tokenizer):\n"
            + "    metric = evaluate.load('rouge')\n"
            + "    for batch in dataloader:\n"
            + "        tokens = model.generate(input_ids=batch['input_ids'])\n"
            + "        predictions = tokenizer.batch_decode(tokens)\n"
            + "        references = tokenizer.batch_decode(batch['labels'])\n"
            + "        metric.add_batch(predictions=predictions, references=references)\n"
            + "    return metric.compute()\n\n\n"
            + "model, test_loader = accelerator.prepare(model, test_loader)\n"
            + "accelerator.print(predict(model, test_loader, tokenizer))\n",
            12,
            9,
        ),
        # predictions gathered over a loader every rank reads whole, compared with the
        # batch's own labels: N copies of the predictions against one of the labels
        Example(
            _WHOLE_EVAL.format(sampler="", preds="preds = accelerator.gather(model(x).argmax(-1))"),
            12,
            9,
        ),
        # ... over a loader its DistributedSampler shards: the labels are this rank's part
        Example(
            _WHOLE_EVAL.format(
                sampler=", sampler=torch.utils.data.DistributedSampler(test_set)",
                preds="preds = accelerator.gather(model(x).argmax(-1))",
            ),
            12,
            9,
        ),
        # ... over a data set each rank builds from its own rank: the labels are its part
        Example(
            _WHOLE_EVAL.format(
                sampler="", preds="preds = accelerator.gather(model(x).argmax(-1))"
            ).replace("DataLoader(test_set", "DataLoader(" + _RANK_PART),
            12,
            9,
        ),
        # predictions and labels gathered inline over a loader every rank reads whole, the
        # total divided by the set's size: N copies counted, N times the accuracy
        Example(
            _WHOLE_EVAL.format(sampler="", preds="preds = model(x).argmax(-1)").replace(
                "(preds == y)", "(accelerator.gather(preds) == accelerator.gather(y))"
            ),
            12,
            9,
        ),
        # ... gathered together into new names (gather_for_metrics drops no copy there: only
        # a prepared loader tells it the last batch's padding)
        Example(
            _WHOLE_EVAL.format(
                sampler="",
                preds="preds, y = accelerator.gather_for_metrics((model(x).argmax(-1), y))",
            ),
            12,
            9,
        ),
        # ... counted on each rank and reduced after the loop: the reduce sums N whole sets
        Example(
            _WHOLE_EVAL.format(sampler="", preds="preds = model(x).argmax(-1)").replace(
                "accelerator.print(",
                "correct = accelerator.reduce(torch.tensor(correct), 'sum')\naccelerator.print(",
            ),
            12,
            9,
        ),
        # gathered predictions kept in one list, the batch's own labels in another, compared
        # after the loop: N copies of the rows against one
        Example(
            _WHOLE_LISTS.format(
                labels="y", metric="accelerator.print((preds == labels).float().mean().item())"
            ),
            13,
            20,
        ),
        # both lists gathered, the matches divided by the set's size: N times the accuracy
        Example(
            _WHOLE_LISTS.format(
                labels="accelerator.gather(y)",
                metric="accelerator.print((preds == labels).sum().item() / len(test_set))",
            ),
            10,
            9,
        ),
        # a stock forecaster gathers its predictions and targets, then compares them with
        # prev_values from its own batch: 1/N of their rows on N processes
        Example(
            _EVAL
            + "        preds, y = accelerator.gather_for_metrics((preds, y))\n"
            + "        prev = x[:, -1]\n"
            + "        correct += ((preds > prev) == (y > prev)).sum().item()\n",
            11,
            9,
        ),
        Example(_EVAL + "        correct += (preds == y).sum().item()\n", 9, 9),
        # a chain of 40 values each computed twice from the one before: followed once per link
        # (followed once per path, it took 2**40 steps and lint never ended)
        Example(
            _EVAL
            + "        v0 = preds + preds\n"
            + "".join(f"        v{i} = v{i - 1} + v{i - 1}\n" for i in range(1, 40))
            + "        correct += v39.sum().item()\n",
            49,
            9,
        ),
        # a batch statistic counted before the forward: the metric is the line after it
        Example(
            HEADER
            + "import torch\n"
            + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
            + "seen, correct = 0, 0\n"
            + "with torch.no_grad():\n"
            + "    for x, y in eval_loader:\n"
            + "        seen += len(y)\n"
            + "        preds = model(x).argmax(-1)\n"
            + "        correct += (preds == y).sum().item()\n",
            10,
            9,
        ),
        Example(_EVAL + "        metric.add_batch(predictions=preds, references=y)\n", 9, 9),
        # the loop reads a name bound to the loader, then to a bar over it when one is asked
        # for (a Muon LM trainer's `eval_iterator`)
        Example(
            HEADER
            + "import torch\nfrom tqdm import tqdm\n"
            + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
            + "correct = 0\n"
            + "batches = eval_loader\n"
            + "if show_progress:\n"
            + "    batches = tqdm(eval_loader, desc='Evaluating')\n"
            + "for x, y in batches:\n"
            + "    with torch.no_grad():\n"
            + "        preds = model(x).argmax(-1)\n"
            + "    correct += (preds == y).sum().item()\n",
            13,
            5,
        ),
        # the forward in a helper the training loop shares, its losses collected per batch and
        # averaged (a Florence-2 fine-tuning's evaluate_model, called on every rank)
        Example(
            HEADER
            + "import torch\n\n\ndef forward_with(model, inputs, labels):\n"
            + "    return model(input_ids=inputs, labels=labels)\n\n\n"
            + "def evaluate(model, loader):\n    total = 0\n    with torch.no_grad():\n"
            + "        for batch in loader:\n            losses = []\n"
            + "            for inputs, labels in [(batch['a'], batch['b'])]:\n"
            + "                losses.append(forward_with(model, inputs, labels).loss)\n"
            + "            total += torch.stack(losses).mean().item()\n"
            + "    return total / len(loader)\n\n\n"
            + "model, val_loader = accelerator.prepare(model, val_loader)\n"
            + "accelerator.log({'val_loss': evaluate(model, val_loader)})\n",
            17,
            13,
        ),
        # the forward in a helper called per batch, its per-sample perplexities collected
        # (a LLaMA pre-training script under FSDP)
        Example(
            HEADER
            + "import numpy as np\n"
            + "import torch\n"
            + "def eval_step(model, batch):\n"
            + "    with torch.no_grad():\n"
            + "        return torch.exp(model(**batch).loss)\n"
            + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
            + "model.eval()\n"
            + "ppls = []\n"
            + "for batch in eval_loader:\n"
            + "    ppl = eval_step(model, batch)\n"
            + "    ppls += ppl.tolist()\n"
            + "accelerator.log({'eval_ppl': np.mean(ppls)})\n",
            13,
            5,
        ),
        # a dict of named losses summed per key, then logged (a multimodal pre-training script)
        Example(
            HEADER
            + "import torch\n"
            + "from collections import defaultdict\n"
            + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
            + "losses = defaultdict(float)\n"
            + "with torch.no_grad():\n"
            + "    for batch in eval_loader:\n"
            + "        outputs = model(**batch)\n"
            + "        for k, v in outputs.losses.items():\n"
            + "            losses[k] += v.item()\n"
            + "accelerator.log({k: v / len(eval_loader) for k, v in losses.items()})\n",
            11,
            13,
        ),
        # no_grad inside the loop, as Accelerate's own examples write it
        Example(
            HEADER
            + "import torch\n"
            + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
            + "for batch in eval_loader:\n"
            + "    with torch.no_grad():\n"
            + "        outputs = model(**batch)\n"
            + "    preds = outputs.logits.argmax(-1)\n"
            + "    metric.add_batch(predictions=preds, references=batch['labels'])\n",
            9,
            5,
        ),
        # a helper that receives the prepared loader
        Example(
            HEADER
            + "import torch\n"
            + "def evaluate(model, loader):\n"
            + "    correct = 0\n"
            + "    for x, y in loader:\n"
            + "        correct += (model(x).argmax(-1) == y).sum().item()\n"
            + "    return correct\n"
            + "model, test_loader = accelerator.prepare(model, test_loader)\n"
            + "print(evaluate(model, test_loader))\n",
            7,
            9,
        ),
        # a tri-modal retrieval trainer: the prepared loader handed on through two helpers
        # (train -> train_epoch -> evaluate), the per-sample distances kept per rank
        Example(
            HEADER
            + "import numpy as np\n"
            + "def evaluate(loader, model):\n"
            + "    dists = []\n"
            + "    for batch in loader:\n"
            + "        dists.extend(model(batch).tolist())\n"
            + "    return np.array(dists).mean()\n"
            + "def train_epoch(dev_loader, model):\n"
            + "    return evaluate(dev_loader, model)\n"
            + "def train(dev_loader, model):\n"
            + "    print(train_epoch(dev_loader, model))\n"
            + "model, dev_loader = accelerator.prepare(model, dev_loader)\n"
            + "train(dev_loader, model)\n",
            7,
            9,
        ),
        # the same helper called with the prepared loader too: that call scores a shard
        Example(
            "import torch\nfrom torch.utils.data import DataLoader\n"
            + "from accelerate import Accelerator\n"
            + "def accuracy(model, loader):\n"
            + "    correct = 0\n"
            + "    with torch.no_grad():\n"
            + "        for x, y in loader:\n"
            + "            correct += (model(x).argmax(-1) == y).sum().item()\n"
            + "    return correct / len(loader.dataset)\n"
            + "def main():\n"
            + "    accelerator = Accelerator()\n"
            + "    loader = DataLoader(train_set, batch_size=32, shuffle=True)\n"
            + "    val_loader = DataLoader(val_set, batch_size=64)\n"
            + "    model, optimizer, loader, val_loader = accelerator.prepare(\n"
            + "        model, optimizer, loader, val_loader)\n"
            + "    for x, y in loader:\n"
            + "        accelerator.backward(model(x).sum())\n"
            + "    print(accuracy(model, val_loader))\n"
            + "    print(accuracy(model, make_loader(test_set, train=False)))\n",
            8,
            13,
        ),
        # a library's evaluation helper: the model is known by its annotation alone, the loader
        # is prepared in the helper (an ml_utils package's ``test``, called from another module)
        Example(
            "import torch\nimport torch.nn as nn\nfrom accelerate import Accelerator\n\n\n"
            + "def test(model: nn.Module, test_loader, accelerator: Accelerator, names):\n"
            + "    test_loader = accelerator.prepare(test_loader)\n"
            + "    metrics = {k: 0 for k in names}\n"
            + "    with torch.no_grad():\n"
            + "        for batch in test_loader:\n"
            + "            outputs = model(**batch)\n"
            + "            for k in metrics:\n"
            + "                metrics[k] += outputs[k].item()\n"
            + "    accelerator.log(metrics)\n",
            13,
            17,
        ),
        # kept on the main process only, inside the loop: the advice gathers before the test
        Example(
            HEADER
            + "import torch\nmodel, loader = accelerator.prepare(model, loader)\ncorrect = 0\n"
            + "with torch.no_grad():\n    for x, y in loader:\n"
            + "        pred = model(x).argmax(-1)\n        if accelerator.is_main_process:\n"
            + "            correct += (pred == y).sum().item()\n",
            10,
            13,
        ),
        # the predictions are gathered, the loss beside them is not (peft's seq2seq example)
        Example(
            HEADER
            + "import torch\nmodel, eval_loader = accelerator.prepare(model, eval_loader)\n"
            + "eval_loss, preds = 0, []\n"
            + "for batch in eval_loader:\n"
            + "    with torch.no_grad():\n        outputs = model(**batch)\n"
            + "    eval_loss += outputs.loss.detach().float()\n"
            + "    preds.extend(accelerator.gather_for_metrics(outputs.logits.argmax(-1)))\n"
            + "accelerator.print(torch.exp(eval_loss / len(eval_loader)))\n",
            9,
            5,
        ),
        # validation run by the main process alone (a speech-watermark trainer): the metric is
        # its shard's, and the advice moves the call out of the guard before gathering
        Example(
            HEADER
            + "model, val_loader = accelerator.prepare(model, val_loader)\n"
            + "def validate():\n"
            + "    total = 0.0\n"
            + "    for batch in val_loader:\n"
            + "        total += model(**batch).loss.item()\n"
            + "    return total / len(val_loader)\n"
            + "if accelerator.is_main_process:\n"
            + "    print(validate())\n",
            7,
            9,
        ),
        # the validation loop itself under the main-process test (a CLIP reward model's
        # trainer): the loss is the main process's shard's, and the advice moves the loop out
        # of the test (a reduce added inside it would hang)
        Example(
            HEADER
            + "model, val_loader = accelerator.prepare(model, val_loader)\n"
            + "if accelerator.is_main_process:\n"
            + "    val_loss = 0.0\n"
            + "    for batch in val_loader:\n"
            + "        val_loss += model(**batch).loss.item()\n"
            + "    accelerator.log({'val_loss': val_loss / len(val_loader)})\n",
            7,
            9,
        ),
        # a validation loss over each rank's shard, logged by the main process
        Example(
            HEADER
            + "model, val_loader = accelerator.prepare(model, val_loader)\n"
            + "losses = [model(**batch).loss.item() for batch in val_loader]\n"
            + "if accelerator.is_main_process:\n"
            + "    accelerator.log({'val_loss': sum(losses) / len(losses)})\n",
            4,
            10,
        ),
        # the per-rank errors printed, then reduced on the main process only into a total no
        # one reads (a fresh user's HF-style script): the printed mean is this rank's
        Example(
            HEADER
            + "import torch\nmodel, val_dl = accelerator.prepare(model, val_dl)\nerrs = []\n"
            + "with torch.no_grad():\n    for xb, yb in val_dl:\n"
            + "        errs.append((model(xb) - yb).abs())\n"
            + "errs = torch.cat(errs)\n"
            + "print(f'mae {errs.mean().item():.4f} n {len(errs)}')\n"
            + "if accelerator.is_main_process:\n"
            + "    total = accelerator.reduce(errs.sum(), reduction='sum')\n",
            8,
            9,
        ),
        # reduced on every rank, but after the per-rank total was printed
        Example(
            _EVAL
            + "        correct += (preds == y).sum()\n"
            + "print(correct)\n"
            + "correct = accelerator.reduce(correct, reduction='sum')\n",
            9,
            9,
        ),
        # the forward's output annotated (a LoRA classifier's ``out: SequenceClassifierOutput =
        # self.model(**batch)``): the metric is the predictions' line, not the labels' below it
        Example(
            HEADER
            + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
            + "preds, golds = [], []\nwith torch.no_grad():\n    for batch in loader:\n"
            + "        out: SequenceClassifierOutput = model(**batch)\n"
            + "        preds += out.logits.argmax(-1).tolist()\n"
            + "        golds += batch['labels'].tolist()\n",
            9,
            9,
        ),
        # a dict of per-key lists (a sports-vocabulary probe's ``sports2prob[token].append``)
        Example(
            _EVAL.replace("correct = 0\n", "probs = {k: [] for k in vocab}\n")
            + "        for k, i in vocab.items():\n"
            + "            probs[k].append(preds.eq(i).float().mean())\n",
            10,
            13,
        ),
        # a prediction CSV written per batch on the main process, over the loader prepared in
        # the loop's own line: the file holds the main process's shard (half the rows on 2)
        Example(
            HEADER
            + "import csv\nimport torch\nmodel = accelerator.prepare(model)\n"
            + "with open('preds.csv', 'w') as f:\n    writer = csv.writer(f)\n"
            + "    with torch.no_grad():\n"
            + "        for x, y in accelerator.prepare(test_loader):\n"
            + "            preds = model(x).argmax(-1)\n"
            + "            if accelerator.is_main_process:\n"
            + "                writer.writerows(zip(preds.tolist(), y.tolist()))\n",
            12,
            17,
        ),
        # every rank writes, into the file on the main process and into os.devnull on the
        # others (a regression script's write_predictions): the file holds one shard
        Example(
            HEADER
            + "import csv, os\nimport torch\n"
            + "model, test_loader = accelerator.prepare(model, test_loader)\n"
            + "@torch.no_grad()\ndef write_predictions(path):\n"
            + "    with open(path if accelerator.is_main_process else os.devnull, 'w') as f:\n"
            + "        w = csv.writer(f)\n"
            + "        for x, y, ids in test_loader:\n"
            + "            pred = model(x).squeeze(1)\n"
            + "            for i, t, p in zip(ids, y.tolist(), pred.tolist()):\n"
            + "                w.writerow([i, t, p])\n"
            + "write_predictions('preds.csv')\n",
            13,
            17,
        ),
        # a tabular trainer's evaluation runs its training step with the update turned off;
        # the loss total is the finding's line, not the count of samples beside it
        Example(
            _STEP_HELPER
            + "    @torch.no_grad()\n"
            + "    def evaluate(self):\n"
            + "        total_loss, total_samples = 0.0, 0\n"
            + "        for batch in self.val_loader:\n"
            + "            loss, pred = self.make_step(batch, False)\n"
            + "            batch_len = len(pred)\n"
            + "            total_samples += batch_len\n"
            + "            total_loss += loss * batch_len\n"
            + "        return total_loss / total_samples\n",
            26,
            13,
        ),
    )
    good = (
        # the rows gathered on every rank before the main process writes them
        HEADER
        + "import csv\nimport torch\nmodel = accelerator.prepare(model)\n"
        + "with open('preds.csv', 'w') as f:\n    writer = csv.writer(f)\n"
        + "    with torch.no_grad():\n"
        + "        for x, y in accelerator.prepare(test_loader):\n"
        + "            preds, y = accelerator.gather_for_metrics((model(x).argmax(-1), y))\n"
        + "            if accelerator.is_main_process:\n"
        + "                writer.writerows(zip(preds.tolist(), y.tolist()))\n",
        # one file per rank, each its own shard's rows on purpose
        HEADER
        + "import csv\nimport torch\nmodel, test_loader = accelerator.prepare(model, test_loader)\n"
        + "with open(f'preds_{accelerator.process_index}.csv', 'w') as f:\n"
        + "    writer = csv.writer(f)\n"
        + "    with torch.no_grad():\n"
        + "        for x, y in test_loader:\n"
        + "            writer.writerows(zip(model(x).argmax(-1).tolist(), y.tolist()))\n",
        # built before prepare: the evaluator keeps the original loader, which reads the whole
        # set on every rank; its full-set metric is no shard (convfix31's evaluator_early)
        _EVALUATOR_OBJECT.format(gather="").replace(
            "model, optimizer, eval_loader = accelerator.prepare(model, optimizer, eval_loader)\n"
            "evaluator = Evaluator(accelerator, eval_loader)\n",
            "eval_loader = torch.utils.data.DataLoader(eval_set, batch_size=8)\n"
            "evaluator = Evaluator(accelerator, eval_loader)\n"
            "model, optimizer, eval_loader = accelerator.prepare(model, optimizer, eval_loader)\n",
        ),
        _EVALUATED_TWICE.format(
            final="    final = accelerator.gather_for_metrics(evaluate(model, eval_loader))\n"
        ),
        # review10b: the second call's result bound to a name, then gathered by that name
        _EVALUATED_TWICE.format(
            final="    final = evaluate(model, eval_loader)\n"
            "    final = accelerator.gather_for_metrics(final)\n"
        ),
        # review10b: a sum of the predictions reduced over the ranks (a gather of the call
        # inside the reduce would count every rank's predictions N times)
        _EVALUATED_TWICE.format(
            final="    final = accelerator.reduce(evaluate(model, eval_loader).float().sum())\n"
            "    final = [final]\n"
        ),
        # review10b: handed to a function of the file that gathers what it is handed
        _EVALUATED_TWICE.format(
            final="    final = finish(accelerator, evaluate(model, eval_loader))\n"
        ).replace(
            "def main(",
            "def finish(accelerator, preds):\n"
            "    return accelerator.gather_for_metrics(preds)\n\n\n"
            "def main(",
        ),
        # the predictions' place of a helper's returned tuple gathered at the call
        # (`gather_for_metrics(evaluate(...)[0])`); its labels, per rank, are never read
        _TUPLE_EVAL.format(
            read="        preds = accelerator.gather_for_metrics(evaluate(model, eval_loader)[0])\n"
        ),
        # the helper's predictions, joined and returned, gathered where it is called (review8a)
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        "def evaluate(model, loader):\n"
        "    preds = []\n"
        "    with torch.no_grad():\n"
        "        for x, y in loader:\n"
        "            preds.append(model(x).argmax(-1))\n"
        "    return torch.cat(preds)\n\n\n"
        "accelerator = Accelerator()\n"
        "model, loader = accelerator.prepare(model, loader)\n"
        "preds = accelerator.gather_for_metrics(evaluate(model, loader))\n",
        # a training loop: the step trains (through a helper) and the ``no_grad`` block beside
        # it updates an EMA copy; the running loss is a training log, not an evaluation
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        "def train_step(accelerator, model, optimizer, batch):\n"
        "    loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])\n"
        "    accelerator.backward(loss)\n"
        "    optimizer.step()\n"
        "    return loss\n\n\n"
        "accelerator = Accelerator()\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "running, correct = 0.0, 0\n"
        "for x, y in loader:\n"
        "    loss = train_step(accelerator, model, optimizer, (x, y))\n"
        "    with torch.no_grad():\n"
        "        ema.update(model)\n"
        "        correct += (model(x).argmax(-1) == y).sum().item()\n"
        "    running += loss.item()\n"
        "accelerator.print(running / len(loader), correct)\n",
        _STEP_WITH_GRADIENTS_OFF.format(
            after="total = accelerator.reduce(torch.tensor(total, device=accelerator.device))\n"
            "print(total.item() / accelerator.reduce(torch.tensor(len(test_loader))).item())\n"
        ),
        _EVALUATOR_OBJECT.format(
            gather="            predictions, labels = self.accelerator.gather_for_metrics(\n"
            "                (predictions, labels)\n"
            "            )\n"
        ),
        # a helper's decoded lists handed back in a tuple, each gathered by the caller before
        # the metric reads them (the object gather of Accelerate's summarisation examples)
        HEADER
        + "import evaluate\n\n\n"
        + "def predict(model, dataloader, tokenizer):\n"
        + "    predictions, references = [], []\n"
        + "    for batch in dataloader:\n"
        + "        tokens = model.generate(input_ids=batch['input_ids'])\n"
        + "        predictions += tokenizer.batch_decode(tokens)\n"
        + "        references += tokenizer.batch_decode(batch['labels'])\n"
        + "    return predictions, references\n\n\n"
        + "model, test_loader = accelerator.prepare(model, test_loader)\n"
        + "predictions, references = predict(model, test_loader, tokenizer)\n"
        + "predictions = accelerator.gather_for_metrics(predictions, use_gather_object=True)\n"
        + "references = accelerator.gather_for_metrics(references, use_gather_object=True)\n"
        + "accelerator.print(evaluate.load('rouge').compute(predictions=predictions, "
        + "references=references))\n",
        # ... gathered in the helper
        _HELD_EVAL.format(gather=_GATHERED, **_IN_A_NAMESPACE),
        _HELD_EVAL.format(gather=_GATHERED, **_IN_A_DICT),
        # gathered on the main process only: a hang, ACC202's finding at the gather, not this one
        HEADER
        + "import torch\n"
        + "from accelerate.utils import gather_object\n"
        + "model, val_dl = accelerator.prepare(model, val_dl)\n"
        + "results = []\n"
        + "with torch.no_grad():\n"
        + "    for xb in val_dl:\n"
        + "        results.append(model(xb))\n"
        + "if accelerator.is_main_process:\n"
        + "    results = gather_object(results)\n"
        + "    print(torch.stack(results).mean())\n",
        # the labels gathered inline beside the predictions, over the rank's own part
        _WHOLE_EVAL.format(sampler="", preds="preds = accelerator.gather(model(x).argmax(-1))")
        .replace("DataLoader(test_set", "DataLoader(" + _RANK_PART)
        .replace("(preds == y)", "(preds == accelerator.gather(y))")
        .replace("len(test_loader.dataset)", "len(test_set)"),
        # gathered over a whole loader and divided by a count of the gathered labels: N copies
        # over N copies, a right ratio (N times the work: ACC401's)
        _WHOLE_EVAL.format(
            sampler="", preds="preds, y = accelerator.gather((model(x).argmax(-1), y))"
        )
        .replace("correct = 0\n", "correct = total = 0\n")
        .replace(".sum().item()\n", ".sum().item()\n        total += y.size(0)\n")
        .replace("len(test_loader.dataset)", "total"),
        # counted on each rank, the correct and the seen count both reduced: a right ratio
        _WHOLE_EVAL.format(sampler="", preds="preds = model(x).argmax(-1)")
        .replace("correct = 0\n", "correct = seen = 0\n")
        .replace(".sum().item()\n", ".sum().item()\n        seen += len(y)\n")
        .replace(
            "accelerator.print(correct / len(test_loader.dataset))",
            "counts = accelerator.reduce(torch.tensor([correct, seen]), 'sum')\n"
            + "accelerator.print(counts[0] / counts[1])",
        ),
        # both lists gathered and compared: N copies against N copies, a right mean
        _WHOLE_LISTS.format(
            labels="accelerator.gather(y)",
            metric="accelerator.print((preds == labels).float().mean().item())",
        ),
        # the gathered and the own list read side by side for their sizes and shown: no metric
        _WHOLE_LISTS.format(labels="y", metric="print(len(preds), len(labels), preds, labels)"),
        # an evaluator object whose result() reduces the totals it kept across the ranks
        HEADER
        + "import torch\n\n\nclass Evaluator:\n"
        + "    def __init__(self):\n        self.correct, self.total = 0, 0\n\n"
        + "    def update(self, preds, labels):\n"
        + "        self.correct += (preds == labels).sum().item()\n"
        + "        self.total += labels.numel()\n\n"
        + "    def result(self):\n"
        + "        counts = torch.tensor([self.correct, self.total], device=accelerator.device)\n"
        + "        counts = accelerator.reduce(counts)\n"
        + "        return (counts[0] / counts[1]).item()\n\n\n"
        + "model, val_loader = accelerator.prepare(model, val_loader)\n"
        + "evaluator = Evaluator()\n"
        + "with torch.no_grad():\n    for x, y in val_loader:\n"
        + "        evaluator.update(model(x).argmax(-1), y)\n"
        + "accelerator.print(f'accuracy {evaluator.result():.4f}')\n",
        # every rank evaluates the whole set itself: nothing to gather
        _WHOLE_EVAL.format(sampler="", preds="preds = model(x).argmax(-1)"),
        # the same evaluation, its totals reduced over the ranks after the loop
        _STEP_HELPER
        + "    @torch.no_grad()\n"
        + "    def evaluate(self):\n"
        + "        total_loss, total_samples = 0.0, 0\n"
        + "        for batch in self.val_loader:\n"
        + "            loss, pred = self.make_step(batch, False)\n"
        + "            total_samples += len(pred)\n"
        + "            total_loss += loss * len(pred)\n"
        + "        totals = self.accelerator.reduce(\n"
        + "            torch.tensor([total_loss, total_samples], device=self.accelerator.device),\n"
        + "            reduction='sum')\n"
        + "        return (totals[0] / totals[1]).item()\n",
        # a helper's parameter named like the training loader main prepares, filled by every
        # call with a test loader nothing prepares: each rank scores the whole set
        "import torch\nfrom torch.utils.data import DataLoader\n"
        + "from accelerate import Accelerator\n"
        + "def accuracy(model, loader):\n"
        + "    correct = 0\n"
        + "    with torch.no_grad():\n"
        + "        for x, y in loader:\n"
        + "            correct += (model(x).argmax(-1) == y).sum().item()\n"
        + "    return correct / len(loader.dataset)\n"
        + "def main():\n"
        + "    accelerator = Accelerator()\n"
        + "    loader = DataLoader(train_set, batch_size=32, shuffle=True)\n"
        + "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward(model(x).sum())\n"
        + "    test_loader = make_loader(test_set, train=False)\n"
        + "    print(accuracy(model, test_loader))\n"
        + "    print(accuracy(model, DataLoader(val_set, batch_size=64)))\n",
        # a reward model scores each sample of its shard, prints how many it scored, then
        # gathers the (index, score) pairs as objects (a LLaMA-Factory reward-labelling script)
        HEADER
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\nchanges = []\n"
        + "with torch.no_grad():\n    for inputs, indices in loader:\n"
        + "        scores = model(**inputs).tolist()\n"
        + "        for index, score in zip(indices, scores):\n"
        + "            changes.append([index, score])\n"
        + "print(f'Rank {accelerator.local_process_index}: {len(changes)} items')\n"
        + "changes = accelerator.gather_for_metrics(changes, use_gather_object=True)\n",
        # a VAE trainer's validation: the outputs kept in a list, gathered after the loop by
        # accelerate.utils' gather_object (a function, not the accelerator's method)
        "import torch\nfrom accelerate import Accelerator\n"
        + "from accelerate.utils import gather_object\n"
        + "accelerator = Accelerator()\nmodel, loader = accelerator.prepare(model, loader)\n"
        + "results = []\nwith torch.inference_mode():\n    for x in loader:\n"
        + "        results.append(model(x))\n"
        + "results = gather_object(results)\n"
        + "if accelerator.is_main_process:\n"
        + "    print(torch.stack([r.loss for r in results]).mean().item())\n",
        # a LoftQ sweep's evaluate_model: each total wrapped in a tensor after the loop, gathered
        # and summed
        _EVAL
        + "        correct += (preds == y).sum().item()\n"
        + "correct_tensor = torch.tensor([correct], device=accelerator.device)\n"
        + "all_correct = accelerator.gather(correct_tensor).sum().item()\n",
        # the same trainer gathering in its evaluation: its training loop, whose backward
        # runs two calls down, is no evaluation either
        _UPDATE_TWO_CALLS_DOWN.format(
            gather="            preds, y = self.accelerator.gather_for_metrics((preds, y))\n"
        ),
        # a trainer's loop whose backward runs in a method of its base class
        # (``self.backward_pass(loss)`` -> ``self.accelerator.backward``): training totals
        "from accelerate import Accelerator\n"
        + "class BaseTrainer:\n"
        + "    def __init__(self, model, optimizer, loader):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
        + "            model, optimizer, loader)\n"
        + "    def backward_pass(self, loss):\n"
        + "        self.accelerator.backward(loss)\n"
        + "        self.optimizer.step()\n"
        + "class Trainer(BaseTrainer):\n"
        + "    def train_epoch(self):\n"
        + "        total = 0.0\n"
        + "        for x, y in self.loader:\n"
        + "            self.optimizer.zero_grad()\n"
        + "            loss = self.model(x, y)\n"
        + "            self.backward_pass(loss)\n"
        + "            total += loss.item()\n"
        + "        return total / len(self.loader)\n",
        # a training step in a helper (accelerator.backward, optimizer.step): training totals
        HEADER
        + "def train_step(model, batch):\n"
        + "    loss = model(**batch).loss\n"
        + "    accelerator.backward(loss)\n"
        + "    optimizer.step()\n"
        + "    return {'loss': loss.item(), 'n': len(batch)}\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "meter = AverageMeter()\n"
        + "for batch in loader:\n"
        + "    out = train_step(model, batch)\n"
        + "    meter.update(out['loss'], out['n'])\n",
        # each metric function of a list applied to the gathered outputs (pytorch-template's
        # ``for met in self.metric_ftns:``): ``met`` is the same on every rank
        HEADER
        + "import torch\n"
        + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
        + "with torch.no_grad():\n"
        + "    for x, y in eval_loader:\n"
        + "        out = model(x)\n"
        + "        out, y = accelerator.gather_for_metrics((out, y))\n"
        + "        for met in metric_ftns:\n"
        + "            tracker.update(met.__name__, met(out, y))\n",
        # the helper gathers what it returns: the totals are every rank's
        HEADER
        + "import torch\n"
        + "def eval_step(model, batch):\n"
        + "    with torch.no_grad():\n"
        + "        loss = model(**batch).loss\n"
        + "    return accelerator.gather_for_metrics(loss.repeat(len(batch['x'])))\n"
        + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
        + "model.eval()\n"
        + "losses = []\n"
        + "for batch in eval_loader:\n"
        + "    losses.append(eval_step(model, batch))\n",
        # a torchmetrics metric combines the ranks' states itself at compute()
        HEADER
        + "import torch\n"
        + "from torchmetrics.classification import MulticlassAccuracy\n"
        + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
        + "accuracy = MulticlassAccuracy(num_classes=10).to(accelerator.device)\n"
        + "with torch.no_grad():\n"
        + "    for images, labels in eval_loader:\n"
        + "        accuracy.update(model(images).argmax(1), labels)\n"
        + "accelerator.print(accuracy.compute())\n",
        # ``outputs.data`` reads the gathered outputs, not the batch named ``data``
        HEADER
        + "import torch\n"
        + "model, eval_loader = accelerator.prepare(model, eval_loader)\n"
        + "correct = 0\n"
        + "with torch.no_grad():\n"
        + "    for data in eval_loader:\n"
        + "        images, labels = data\n"
        + "        outputs = model(images)\n"
        + "        outputs, labels = accelerator.gather_for_metrics((outputs, labels))\n"
        + "        _, predicted = torch.max(outputs.data, 1)\n"
        + "        correct += (predicted == labels).sum().item()\n",
        HEADER
        + "model, val_loader = accelerator.prepare(model, val_loader)\n"
        + "losses = [accelerator.gather_for_metrics(model(**b).loss) for b in val_loader]\n",
        HEADER
        + "import torch\nmodel, val_loader = accelerator.prepare(model, val_loader)\n"
        + "losses = torch.tensor([model(**batch).loss.item() for batch in val_loader])\n"
        + "losses = accelerator.reduce(losses)\n",
        _EVAL
        + "        preds, y = accelerator.gather_for_metrics((preds, y))\n"
        + "        correct += (preds == y).sum().item()\n",
        _EVAL
        + "        correct += (preds == y).sum()\n"
        + "correct = accelerator.reduce(correct, reduction='sum')\n",
        # no_grad inside the loop, the forward inside an expression: gathered, so clean
        _EVAL.replace(
            "with torch.no_grad():\n    for x, y in eval_loader:\n",
            "for x, y in eval_loader:\n    with torch.no_grad():\n",
        )
        + "        preds, y = accelerator.gather_for_metrics((preds, y))\n"
        + "        correct += (preds == y).sum().item()\n",
        # gathered, then trimmed and counted by hand (Accelerate's older examples)
        HEADER
        + "model, eval_loader = accelerator.prepare(model, eval_loader)\nseen = 0\n"
        + "for step, batch in enumerate(eval_loader):\n"
        + "    preds = model(**batch).logits.argmax(-1)\n"
        + "    preds, refs = accelerator.gather((preds, batch['labels']))\n"
        + "    if step == len(eval_loader) - 1:\n"
        + "        refs = refs[: len(eval_loader.dataset) - seen]\n"
        + "    else:\n        seen += refs.shape[0]\n"
        + "    metric.add_batch(predictions=preds, references=refs)\n",
        # a running offset the loop turns into the indices it gathers (mDeBERTa's NLI evaluation
        # maps each gathered prediction back to its row): consumed in the loop, not reported
        HEADER
        + "import torch\nmodel, eval_loader = accelerator.prepare(model, eval_loader)\n"
        + "seen, rows = 0, []\nwith torch.no_grad():\n    for x, y in eval_loader:\n"
        + "        index = torch.arange(seen, seen + len(y))\n        seen += len(y)\n"
        + "        logits, y, index = accelerator.gather_for_metrics((model(x), y, index))\n"
        + "        rows.append(index)\n",
        # an unprepared loader seen whole by each rank is another rule's business (ACC401)
        HEADER
        + "import torch\ncorrect = 0\nwith torch.no_grad():\n    for x, y in eval_loader:\n"
        + "        correct += (model(x).argmax(-1) == y).sum().item()\n",
        # two classes each keep a ``self.data_loader``: Train's is prepared, Test's is another
        # object under the same spelling, read whole by every rank (ENet's Train/Test classes)
        HEADER
        + "import torch\n\n\nclass Train:\n    def __init__(self, model, optim, data_loader):\n"
        + "        self.model, self.optim, self.data_loader = accelerator.prepare(\n"
        + "            model, optim, data_loader\n        )\n\n\n"
        + "class Test:\n    def __init__(self, model, data_loader):\n"
        + "        self.model = model\n        self.data_loader = data_loader\n\n"
        + "    def run_epoch(self):\n        epoch_loss = 0.0\n"
        + "        for x, y in self.data_loader:\n            with torch.no_grad():\n"
        + "                loss = torch.nn.functional.cross_entropy(self.model(x), y)\n"
        + "            epoch_loss += loss.item()\n"
        + "        return epoch_loss / len(self.data_loader)\n\n\n"
        + "model = torch.nn.Linear(4, 2)\n"
        + "Train(model, torch.optim.SGD(model.parameters(), lr=0.1), train_loader)\n"
        + "print(Test(model, eval_loader).run_epoch())\n",
        # two sub-commands each make their own ``loader``: train()'s is prepared, evaluate()'s
        # is another object under the same name, read whole by every rank
        HEADER
        + "import torch\nfrom torch.utils.data import DataLoader\n\n\ndef train(model, data):\n"
        + "    loader = DataLoader(data)\n"
        + "    model, loader = accelerator.prepare(model, loader)\n"
        + "    for x, y in loader:\n        accelerator.backward(model(x).sum())\n\n\n"
        + "def evaluate(model, data):\n    loader = DataLoader(data)\n    correct = 0\n"
        + "    with torch.no_grad():\n        for x, y in loader:\n"
        + "            correct += (model(x).argmax(-1) == y).sum().item()\n"
        + "    return correct\n",
        # a trainer's helper reduces each named loss across the ranks and returns the means
        # (a hook-based segmentation trainer's ``_reduce_loss_dict``): the totals are every rank's
        "from accelerate import Accelerator\nimport torch\n"
        + "from collections import defaultdict\n\n\n"
        + "class Trainer:\n    def __init__(self, model, loader):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.model, self.loader = self.accelerator.prepare(model, loader)\n\n"
        + "    def _reduce(self, losses):\n        reduced = {}\n"
        + "        for k, v in losses.items():\n"
        + "            rv = self.accelerator.reduce(v.detach(), reduction='mean')\n"
        + "            reduced[k] = float(rv.item())\n        return reduced\n\n"
        + "    @torch.no_grad()\n    def validate(self):\n        totals = defaultdict(float)\n"
        + "        for x, y in self.loader:\n            _, losses = self.model(x, y)\n"
        + "            reduced = self._reduce(losses)\n"
        + "            for k, v in reduced.items():\n                totals[k] += float(v)\n"
        + "        return totals\n",
        # the per-batch losses stacked and gathered after the loop, when any were kept (a
        # pore-signal trainer's ``if values:``): the test reads no per-rank number
        HEADER
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\nvalues = []\n"
        + "with torch.no_grad():\n    for batch in loader:\n"
        + "        values.append(model(**batch).loss.detach())\n"
        + "if values:\n"
        + "    print(accelerator.gather_for_metrics(torch.stack(values)).mean().item())\n",
        # ... its outputs gathered with the labels on the spot
        _PARADIGM_EVAL.format(
            gather="        pred, label = accelerator.gather_for_metrics((pred, label))\n"
        ),
        # a dict of totals, another entry stored after the loop, then every entry gathered
        # and summed in a comprehension over its items (a Whisper fine-tune's val_logs)
        HEADER
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
        + "val_logs = {'val_loss': 0, 'val_batches': 0}\n"
        + "with torch.no_grad():\n    for batch in loader:\n"
        + "        val_logs['val_loss'] += model(**batch).loss\n"
        + "val_logs['val_batches'] = torch.tensor(float(len(loader)), device=accelerator.device)\n"
        + "if accelerator.num_processes > 1:\n"
        + "    val_logs = {\n"
        + "        k: accelerator.gather_for_metrics(v).sum() for k, v in val_logs.items()\n"
        + "    }\n"
        + "accelerator.print(val_logs['val_loss'] / val_logs['val_batches'])\n",
        # an RLHF PPO trainer (minitune's): the rollout phase, with the policy in eval mode,
        # keeps each sample of this rank's prompts in a member buffer, and learn() trains on
        # what it holds: this rank's own rollouts, not an evaluation's total
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        + "class PPOTrainer:\n    def __init__(self, policy, optimizer, prompts):\n"
        + "        self.accelerator = Accelerator()\n"
        + "        self.policy, self.optimizer, self.prompts = self.accelerator.prepare(\n"
        + "            policy, optimizer, prompts)\n"
        + "        self.rollout_buffer = RolloutBuffer()\n\n"
        + "    def train(self):\n        for _ in range(10):\n"
        + "            self.rollout_buffer.clear()\n            self.policy.eval()\n"
        + "            for batch in self.prompts:\n                with torch.no_grad():\n"
        + "                    responses = self.policy(batch)\n"
        + "                for i in range(len(batch)):\n"
        + "                    self.rollout_buffer.add(batch[i], responses[i])\n"
        + "            self.learn()\n\n"
        + "    def learn(self):\n        self.policy.train()\n"
        + "        for prompt, response in self.rollout_buffer:\n"
        + "            loss = self.policy(prompt, response).mean()\n"
        + "            self.accelerator.backward(loss)\n"
        + "            self.optimizer.step()\n            self.optimizer.zero_grad()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        holds_none = not (
            script.of_kind(Kind.ACCELERATOR)
            or script.accelerator_params
            or script.inherited_accelerators
        )
        for finding in self._check(script):
            if holds_none:
                # a module handed only prepared objects (``accuracy(model, eval_loader)``):
                # the advice's accelerator is the caller's
                finding.message += (
                    "; this module holds no accelerator: add an `accelerator` parameter and "
                    "have the caller hand it the one that prepared these objects"
                )
            yield finding

    def _check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        accelerators = script.names_of(Kind.ACCELERATOR)
        all_calls = calls(script)
        yield from self._left_by_this_caller(script)
        yield from self._left_where_the_helper_cannot_gather(script)
        reported_calls: set[int] = set()
        for evaluation in facts.evaluations:
            loop = evaluation.loop
            forward = _evaluation_forward(script, facts, loop)
            if forward is None:
                continue
            if not facts.flow.over_prepared_loader(loop):
                yield from self._gathered_over_a_whole_loader(script, facts, loop, accelerators)
                continue
            values = _RankValues(
                script, loop, _assigned_in(loop.node.body) | loop.batch_names, accelerators
            )
            found = []
            for target, node in _per_rank_totals(script, loop, values, all_calls):
                split = _split_callers(script, facts, loop, target)
                if split is not None:  # some calls gather it: the others are the bug
                    slot, left, gathering = split
                    for call in left:
                        if id(call) not in reported_calls:
                            reported_calls.add(id(call))
                            where = f"line {script.line(node)}"
                            function = facts.placement.enclosing_function(loop.node)
                            assert function is not None
                            yield self._left_call(
                                script, call, slot, function.name.value, gathering, where
                            )
                elif not _reduced_by_callers(script, facts, loop, target, all_calls, accelerators):
                    found.append((target, node))
            if not found:
                continue
            # the metric's line: the first total fed after the model's forward (the
            # predictions, the loss), not a batch statistic counted before it
            after = [n for _, n in found if script.order(n) > script.order(forward)]
            after = [n for n in after if not _sample_count(n, loop)] or after
            at = after[0] if after else found[0][1]
            guarded = _rank_only_call(script, facts, loop.node)
            loop_guard = script.rank_guard_of(loop.node) if guarded is None else None
            loss_total = _loss_total(at)
            inner_guard = _guard_in_loop(script, facts, loop.node, at)
            if loop_guard is not None:
                message = _guarded_loop_message(script, at, loop, loop_guard)
                yield self.finding(script, at, message=message)
            elif guarded is None and inner_guard is not None:
                kept = next(target for target, node in found if node is at)
                message = _inner_guard_message(script, at, kept, inner_guard)
                yield self.finding(script, at, message=message)
            elif guarded is None and loss_total is not None:
                message = _loss_total_message(script, loss_total)
                others = sorted(
                    {
                        target
                        for target, node in found
                        if _loss_total(node) is None and not _sample_count(node, loop)
                    }
                    - {"_"}
                )
                if others:
                    # ``predictions += logits.argmax(-1).tolist()`` beside the loss total: an
                    # accuracy from them is this rank's too, and a reduce of the loss alone
                    # leaves it so
                    accelerator = accelerator_name(script, at)
                    listed = ", ".join(f"`{name}`" for name in others)
                    verb = "holds" if len(others) == 1 else "hold"
                    message += (
                        f"; {listed} also {verb} this rank's batches only: gather what feeds "
                        f"them with {accelerator}.gather_for_metrics in the loop"
                    )
                yield self.finding(script, at, message=message)
            elif guarded is None:
                mixed = values.mixed_with_gathered(at)
                message = _mixed_message(script, at, mixed) if mixed else None
                stats = None if mixed else _stats_dict(script, loop, at)
                if stats is not None:
                    message = _stats_dict_message(script, at, stats)
                yield self.finding(script, at, message=message)
            else:
                line = script.position(guarded).start.line
                message = _guarded_message(script, at, line) + _main_only_note(script, guarded)
                yield self.finding(script, at, message=message)
        yield from self._comprehensions(script, facts, accelerators, all_calls)
        yield from self._written_shards(script, facts)

    def _written_shards(self, script: ScriptModel, facts: Facts) -> Iterator[Finding]:
        """A row an evaluation over a prepared loader writes to a file per batch
        (``writer.writerow(...)`` into a file opened before the loop, `written_rows`), of values
        nothing in the loop gathers: each rank's rows are its shard's, and nothing after the
        loop can gather a row already written, so the file holds 1/N of the set (the main
        process's, where the write is kept to it). Reported at the write. A file named per rank
        holds each rank's shard on purpose; an evaluation run on some ranks only is left to the
        totals' findings (a gather there would hang)."""
        for evaluation in facts.evaluations:
            loop = evaluation.loop
            if evaluation.already_gathered or not facts.flow.over_prepared_loader(loop):
                continue
            row = next(iter(written_rows(evaluation, script)), None)
            if row is None or _evaluation_forward(script, facts, loop) is None:
                continue
            write = row.value  # type: ignore[attr-defined]
            opened = side_effects.opened_for_writing(script, write)
            if opened is not None and side_effects.per_rank_path(script, opened):
                continue
            if script.rank_guard_of(loop.node) or _rank_only_call(script, facts, loop.node):
                continue
            yield self.finding(script, write, message=_written_shard_message(script, write))

    def _left_by_this_caller(self, script: ScriptModel) -> Iterator[Finding]:
        """A call of another project module's evaluation helper that returns this rank's
        predictions (``utils.evaluate(model, eval_loader)``, ``return torch.cat(preds)``),
        left ungathered where the same file gathers another call of it
        (``accelerator.gather_for_metrics(utils.evaluate(...))``): the helper is right, this
        call is the bug, and it is reported here, naming the helper's line (the helper's
        own analysis stays silent: `_combined_by_other_modules`)."""
        project = script.project
        if project is None:
            return
        by_member: dict[tuple[Path, str], list[cst.Call]] = {}
        for call, module, member in facts_of(script).project_calls:
            if "." not in member:  # a method: the instance's class is not followed here
                by_member.setdefault((module.resolve(), member), []).append(call)
        for (module, member), sites in by_member.items():
            if len(sites) < 2 or not any(_combined_somehow(script, call) for call in sites):
                continue  # the cheap test first: the helper is analysed only past it
            for slot, line in _helper_totals(script, module, member):
                left = [call for call in sites if not _combined_at(script, call, slot)]
                gathering = [call for call in sites if all(call is not other for other in left)]
                if not left or not gathering:
                    continue
                where = f"{_relative(module, project.path)}:{line}"
                for call in left:
                    yield self._left_call(script, call, slot, member, gathering[0], where)
                break

    def _left_where_the_helper_cannot_gather(self, script: ScriptModel) -> Iterator[Finding]:
        """A call of another project module's evaluation helper handed a prepared loader, whose
        per-rank total comes back ungathered, where another call of it in this file hands it a
        loader that is not sharded or runs on some ranks only (``evaluate(model, test_loader)``
        under ``if accelerator.is_main_process:``): the helper's own analysis stays silent (its
        loader is not always a shard), and a gather inside it would hang that other call. The
        fix goes at this call, which is reported, naming the helper's line."""
        project = script.project
        if project is None:
            return
        loaders = script.names_of(Kind.DATALOADER) | script.prepared_names
        by_member: dict[tuple[Path, str], list[tuple[cst.Call, bool]]] = {}
        for call, module, member in facts_of(script).project_calls:
            if "." in member:
                continue
            handed = {dotted(a.value) for a in call.args} & loaders
            guarded = script.under_rank_guard(call)
            if not handed and not guarded:
                continue
            # a call on some ranks only cannot reach a gather inside, whatever it hands in (a
            # trainer's ``self.test_loader`` received unprepared from an unseen caller)
            sharded = not guarded and bool(handed & script.prepared_names)
            by_member.setdefault((module.resolve(), member), []).append((call, sharded))
        for (module, member), sites in by_member.items():
            sharded = [call for call, yes in sites if yes]
            whole = [call for call, yes in sites if not yes]
            if not sharded or not whole:
                continue  # all sharded: the helper's own analysis reports it at its line
            lines = {script.line(call) for call in sharded}
            for slot, line in _helper_totals(script, module, member, lines):
                where = f"{_relative(module, project.path)}:{line}"
                for call in sharded:
                    if _combined_at(script, call, slot):
                        continue
                    accelerator = accelerator_name(script, call)
                    what = _bound_at(script, call, slot) or f"what {member}() returns"
                    yield self.finding(
                        script,
                        call,
                        message=(
                            f"Combine {what} across the ranks here: {member}() computes it from "
                            f"this rank's shard of the prepared loader only ({where} accumulates "
                            f"it per rank), and it cannot gather inside {member}(), which the "
                            f"call at line {script.line(whole[0])} runs over a loader that is "
                            f"not sharded (or on some ranks only); have {member}() return its "
                            f"counts and {accelerator}.reduce(..., reduction='sum') them at this "
                            f"call before dividing (or return its predictions and labels and "
                            f"{accelerator}.gather_for_metrics(...) them here)"
                        ),
                    )
                break

    def _left_call(
        self,
        script: ScriptModel,
        call: cst.Call,
        slot: tuple[int, int] | None,
        member: str,
        gathering: cst.Call,
        where: str,
    ) -> Finding:
        """The finding at a call of an evaluation helper that leaves its per-rank result
        ungathered, where ``gathering`` gathers another call of it; ``where`` names the
        helper's line that collects it."""
        accelerator = accelerator_name(script, call)
        what = _bound_at(script, call, slot) or f"what {member}() returns"
        return self.finding(
            script,
            call,
            message=(
                f"Gather {what} with {accelerator}.gather_for_metrics(...), as the call at "
                f"line {script.line(gathering)} does: {member}() returns this rank's batches "
                f"only ({where} collects them per rank)"
            ),
        )

    def _gathered_over_a_whole_loader(
        self, script: ScriptModel, facts: Facts, loop: Loop, accelerators: set[str]
    ) -> Iterator[Finding]:
        """An evaluation over a DataLoader left out of prepare (each rank reads the whole set)
        that gathers its predictions and compares them with its own batch's labels: the
        gathered rows are N copies of the batch's predictions, the labels one copy (a shape
        error on several processes, or a metric over rows that do not match). A loader
        sharded by its own DistributedSampler, or over a data set built from the rank
        (``Subset(full, range(accelerator.process_index, n, accelerator.num_processes))``), is
        split already: what it gathers is every rank's part, and only a total that mixes it with
        this rank's own values is reported, as for a prepared loader."""
        found = _unprepared_loader(script, facts, loop)
        if found is None or _splits_by_rank(loop):
            return
        loader, sharded = found
        sharded = sharded or _dataset_split_by_rank(script, loader)
        # a helper's parameter: the loader as its caller names it, one nothing prepares
        outer = facts.flow.outer_name(loader, loop.node)
        if outer is not None and outer not in script.prepared_names:
            loader = outer
        local = _assigned_in(loop.node.body) | loop.batch_names
        values = _RankValues(script, loop, local, accelerators)
        synced = set(self_syncing_metrics(loop, script))
        accumulated = _accumulations(loop, lambda value: True, synced)
        # the loader ACC401 reports is this bug's cause: one finding, at the total
        covers = () if sharded else _loader_findings(script, facts, loop)
        for _, node in accumulated:
            mixed = values.mixed_with_gathered(node)
            if not mixed:
                continue
            accelerator = accelerator_name(script, node)
            listed = ", ".join(f"`{name}`" for name in mixed)
            if sharded:  # each rank reads its part, as from a prepared loader
                yield self.finding(script, node, message=_mixed_message(script, node, mixed))
                return
            yield self.finding(
                script,
                node,
                message=(
                    f"Pass {loader} to {accelerator}.prepare and gather {listed} in the same "
                    f"{accelerator}.gather_for_metrics(...) as the predictions: {loader} is "
                    f"not prepared, so every rank reads the whole set, the gathered "
                    f"predictions hold N copies of each batch and {listed} one (a shape error "
                    "on several processes, or a metric over rows that do not match)"
                ),
                covers=covers,
            )
            return
        if sharded or not _made_unprepared(script, {found[0], loader}):
            return
        mixed_lists = _lists_mixed_after(script, loop, values, accumulated)
        if mixed_lists is not None:
            # gathered rows collected in one list, this rank's own in another, the two
            # combined after the loop: the metric is made there
            node, own = mixed_lists
            accelerator = accelerator_name(script, node)
            code = script.module.code_for_node
            listed = ", ".join(f"`{code(value)}`" for append in own for value in _added(append))
            lines = ", ".join(str(script.line(append)) for append in own)
            yield self.finding(
                script,
                node,
                message=(
                    f"Pass {loader} to {accelerator}.prepare and gather {listed} (line {lines}) "
                    f"in the same {accelerator}.gather_for_metrics(...) as the predictions: "
                    f"{loader} is not prepared, so every rank reads the whole set, the gathered "
                    f"predictions hold N copies of each batch and {listed} one, and the rows "
                    "compared here do not match (a shape error on several processes)"
                ),
                covers=covers,
            )
            return
        combined = _combined_whole_set_total(script, facts, loop, values, accumulated)
        if combined is not None:
            node, how, division = combined
            accelerator = accelerator_name(script, node)
            if isinstance(node, cst.AugAssign):
                total, counts = _total_name(node), "counts each sample N times"
            else:  # a list appended to
                total, counts = dotted(node.func.value), "holds each sample N times"  # type: ignore[attr-defined]
            yield self.finding(
                script,
                node,
                message=(
                    f"Pass {loader} to {accelerator}.prepare and gather the predictions and "
                    f"labels with {accelerator}.gather_for_metrics: {loader} is not "
                    f"prepared, so every rank reads the whole set and `{total}`, {how}, "
                    f"{counts}; line {script.line(division.division)} "
                    f"divides it by {script.module.code_for_node(division.divisor)}, so on N "
                    "processes it shows N times the metric"
                ),
                covers=covers,
            )

    def _comprehensions(
        self, script: ScriptModel, facts: Facts, accelerators: set[str], all_calls: list[cst.Call]
    ) -> Iterator[Finding]:
        """``losses = [model(**b).loss.item() for b in val_loader]`` over a prepared loader: the
        list holds this rank's batches only."""
        prepared = script.prepared_names
        for node in script.index.of_type((cst.ListComp, cst.GeneratorExp)):
            source = dotted(node.for_in.iter)
            if source not in prepared and facts.flow.outer_name(source, node) not in prepared:
                continue
            inside = [n for n in walk(node.elt) if isinstance(n, cst.Call)]
            if not any(facts.flow.is_forward(call) for call in inside):
                continue
            if any(_is_collective(call, accelerators) for call in inside) or any(
                isinstance(a, cst.Call) and _is_collective(a, accelerators)
                for a in script.ancestors(node)
            ):
                continue
            assign = script.parent(node)
            if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
                continue
            target = dotted(assign.targets[0].target)
            if target is None or _reduced_later(script, node, target, all_calls, accelerators):
                continue
            yield self.finding(script, node)


def _combined_whole_set_total(
    script: ScriptModel,
    facts: Facts,
    loop: Loop,
    values: "_RankValues",
    accumulated: list[tuple[str, cst.CSTNode]],
) -> tuple[cst.AugAssign | cst.Call, str, ShardTotal] | None:
    """Over a loader every rank reads whole: a total summed from gathered or reduced values
    (``correct += (accelerator.gather(preds) == accelerator.gather(y)).sum()``), or this rank's
    total reduced after the loop, then divided by the size of the whole set (``len(loader.
    dataset)``) or by a count of this rank's own samples (``seen += y.size(0)``, the whole set
    too): the ranks' N copies of the set are summed, so the metric is N times the truth (an
    accuracy of 2.0 on 2 processes). Not a total over a count gathered the same way
    (``total += labels.size(0)`` of the gathered labels: a right ratio, if N times the work).
    Also a list every append to which is gathered (``all_preds.append(accelerator.gather(
    preds))``), read after the loop in the division. The total, how it was combined, and the
    division."""
    accelerators = values.accelerators
    all_calls = calls(script)
    sums = [
        (target, node)
        for target, node in accumulated
        if (
            isinstance(node, cst.AugAssign)
            and isinstance(node.operator, cst.AddAssign)
            and isinstance(node.target, cst.Name)
        )
        or (_list_appended(node) and "." not in target)
    ]
    reduced = {
        target
        for target, _ in sums
        if _reduced_later(script, loop.node, target, all_calls, accelerators)
    }
    # what counts this rank's own samples, never combined: the whole set's size on each rank
    counted = (
        frozenset(
            target
            for target, node in sums
            if _sample_count(node, loop) and values.this_rank_only(node.value)
        )
        - reduced
    )
    for target, node in sums:
        if target in counted or _sample_count(node, loop):
            continue
        added = _added(node)
        if not any(values.this_rank_only(v) for v in added) and all(
            values.reads_gathered(v) for v in added
        ):
            how = "combined over the ranks in the loop"
        elif target in reduced:
            how = "reduced after the loop"
        else:
            continue
        carriers = _built_after(script, loop.node, target)
        divisions = divided_by_set_size(
            script, facts.placement, facts.calls, loop, carriers, counted
        )
        if divisions:
            return node, how, divisions[0]  # type: ignore[return-value]
    return None


def _list_appended(node: cst.CSTNode) -> bool:
    """``values.append(v)`` or ``values.extend(v)``: a list the loop fills."""
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in ("append", "extend")
        and bool(node.args)
    )


def _added(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """What an accumulation adds per batch: ``v`` of ``total += v``, the arguments of
    ``values.append(v)``."""
    if isinstance(node, cst.AugAssign):
        return [node.value]
    if isinstance(node, cst.Call):
        return [argument.value for argument in node.args]
    return []


def _lists_mixed_after(
    script: ScriptModel,
    loop: Loop,
    values: "_RankValues",
    accumulated: list[tuple[str, cst.CSTNode]],
) -> tuple[cst.CSTNode, list[cst.CSTNode]] | None:
    """Over a loader every rank reads whole: one list filled with gathered values
    (``all_preds.append(accelerator.gather(preds))``, N copies of each batch) and another with
    this rank's own (``all_labels.append(y)``, one), combined after the loop in its scope
    (``(torch.cat(all_preds) == torch.cat(all_labels)).float().mean()``, also through the
    names built from them): the rows do not match (a shape error on several processes). The
    innermost expression of the first that reads both, and the appends of this rank's own
    values to the lists it reads."""
    lists = [(t, n) for t, n in accumulated if _list_appended(n) and "." not in t]
    gathered = {
        target
        for target, node in lists
        if all(values.reads_gathered(v) and not values.this_rank_only(v) for v in _added(node))
    }
    own = {
        target for target, node in lists if any(values.this_rank_only(v) for v in _added(node))
    } - gathered
    if not gathered or not own:
        return None
    of_gathered = set().union(*(_built_after(script, loop.node, t) for t in gathered))
    of_own = {t: _built_after(script, loop.node, t) for t in sorted(own)}
    mixed_names = of_gathered & set().union(*of_own.values())
    after = script.order(loop.node)
    found: tuple[cst.CSTNode, list[str]] | None = None
    for node in walk(loop.scope):
        if not isinstance(node, (cst.Comparison, cst.BinaryOperation)) and not _metric_call(
            script, node
        ):
            continue
        if script.order(node) <= after or script.inside(node, loop.node):
            continue
        if script.scope_of(node) is not loop.scope:
            continue
        if found is not None and not script.inside(node, found[0]):
            break  # the innermost expression of the first that reads both
        read = _rows_read(node) - mixed_names
        if not read & of_gathered:
            continue
        listed = [t for t, built in of_own.items() if read & (built - mixed_names)]
        if listed:
            found = (node, listed)
    if found is None:
        return None
    node, listed = found
    return node, [n for t, n in lists if t in listed]


#: Libraries whose functions score predictions against labels row by row.
_METRIC_LIBRARIES = ("sklearn.metrics.", "torchmetrics.functional.", "scipy.stats.")


def _metric_call(script: ScriptModel, node: cst.CSTNode) -> bool:
    """``accuracy_score(labels, preds)``, ``f1_score(...)``: a library's metric function."""
    return isinstance(node, cst.Call) and any(
        name.startswith(_METRIC_LIBRARIES) for name in script.call_names(node)
    )


def _rows_read(node: cst.CSTNode) -> set[str]:
    """The names ``node`` reads the values of, not only the size (``len(preds)``)."""
    sizes = {
        id(inner)
        for call in walk(node)
        if isinstance(call, cst.Call) and dotted(call.func) == "len"
        for inner in walk(call)
    }
    return {n.value for n in walk(node) if isinstance(n, cst.Name) and id(n) not in sizes}


def _made_unprepared(script: ScriptModel, names: set[str]) -> bool:
    """One of ``names`` is a DataLoader the file makes (not one handed in), and none is an
    attribute spelled as one that ``prepare`` returned elsewhere (``trainer.val_loader`` of a
    trainer whose ``self.val_loader`` is prepared): the loader is known to be read whole."""
    prepared = {name.rsplit(".", 1)[-1] for name in script.prepared_names if "." in name}
    if any("." in name and name.rsplit(".", 1)[-1] in prepared for name in names):
        return False
    return any(
        binding.name in names and not binding.received
        for binding in script.of_kind(Kind.DATALOADER)
    )


def _loader_findings(
    script: ScriptModel, facts: Facts, loop: Loop
) -> tuple[tuple[int, int, str], ...]:
    """Where ACC401 reports the unprepared loader ``loop`` reads (the loop's iterable, or the
    argument a caller hands the helper the loop is in), by line and column: the same bug as a
    total this rule reports over it. Another loader on the same line (``evaluate(model,
    test_loader, val_loader)``) is another place: its ACC401 stays."""
    nodes = [loop.node.iter]
    nodes += [
        argument.value for argument in facts.flow.call_site_arguments(loop.iterable, loop.node)
    ]
    places = set()
    for node in nodes:
        start = script.position(node).start
        places.add((start.line, start.column + 1, "ACC401"))
    return tuple(sorted(places))


def _unprepared_loader(script: ScriptModel, facts: Facts, loop: Loop) -> tuple[str, bool] | None:
    """The DataLoader ``loop`` reads that no prepare call returns, one the file makes (by
    name, or the name a helper's parameter is filled with), and whether its own
    DistributedSampler shards it (else every rank reads it whole); None where the loop reads
    anything else."""
    name = loop.iterable
    if name is None or facts.flow.over_prepared_loader(loop):
        return None
    for candidate in dict.fromkeys((name, facts.flow.outer_name(name, loop.node))):
        if candidate is None or candidate in script.prepared_names:
            continue
        if facts.flow.kind_of(candidate, loop.node) is Kind.DATALOADER:
            return candidate, sharded_by_its_sampler(script, candidate)
    return None


def _dataset_split_by_rank(script: ScriptModel, loader: str) -> bool:
    """``loader`` is a ``DataLoader(part, ...)`` of a data set the file builds from the rank
    (``part = Subset(full, range(accelerator.process_index, len(full), world))``): each rank
    reads its own part, as a DistributedSampler would give it."""
    for binding in script.of_kind(Kind.DATALOADER):
        value = binding.value
        if binding.name != loader or not isinstance(value, cst.Call):
            continue
        dataset = next(
            (
                a.value
                for a in value.args
                if (a.keyword is None and a.star == "")
                or (a.keyword and a.keyword.value == "dataset")
            ),
            None,
        )
        if dataset is None:
            continue
        values = [dataset]
        if isinstance(dataset, cst.Name):
            values += [v for _, v in script.index.values_bound_to(dataset.value)]
        if any(script.reads_rank(v) for v in values):
            return True
    return False


def _splits_by_rank(loop: Loop) -> bool:
    """The loop splits its batches between the ranks itself (``split_between_processes``,
    ``x[accelerator.process_index::n]``): what it gathers is each rank's part."""
    return any(
        isinstance(node, cst.Attribute)
        and node.attr.value in ("split_between_processes", "process_index", "get_rank", "rank")
        for node in walk(loop.node.body)
    )


def _sample_count(node: cst.CSTNode, loop: Loop) -> bool:
    """``total_samples += batch_len`` (``batch_len = len(pred)`` in the loop), ``n +=
    len(pred)``, ``+= x.size(0)``, ``+= x.shape[0]``, ``+= y.numel()``, ``n_batches += 1``: a
    count of the batch's samples (or of batches), which only weighs the metric the loop sums
    beside it; that metric's line is the finding's, and its advice reduces the count too."""
    if not isinstance(node, cst.AugAssign) or not isinstance(node.operator, cst.AddAssign):
        return False
    value = node.value
    if isinstance(value, cst.Name):
        bound = [
            assign.value
            for assign in walk(loop.node.body)
            if isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and dotted(assign.targets[0].target) == value.value
        ]
        if len(bound) != 1:
            return False
        value = bound[0]
    if isinstance(value, cst.Integer):  # ``n_batches += 1``; not ``if hit: correct += 1``
        return not any(
            isinstance(branch, cst.If) and any(inner is node for inner in walk(branch))
            for branch in walk(loop.node.body)
        )
    return _a_count(value)


def _a_count(value: cst.BaseExpression) -> bool:
    """``len(x)``, ``x.size(0)``, ``x.shape[0]`` or ``x.numel()``."""
    if isinstance(value, cst.Call):
        func = value.func
        if dotted(func) == "len":
            return True
        if isinstance(func, cst.Attribute) and func.attr.value == "numel" and not value.args:
            return True
        return (
            isinstance(func, cst.Attribute)
            and func.attr.value == "size"
            and len(value.args) == 1
            and isinstance(value.args[0].value, cst.Integer)
            and value.args[0].value.value == "0"
        )
    return isinstance(value, cst.Subscript) and first_dimension_of(value) is not None


def _loss_total(node: cst.CSTNode) -> cst.AugAssign | None:
    """``val_loss += loss.item()``, ``losses[k] += v.detach()``: a running total of a loss,
    where there are no predictions and labels to gather, only the total to combine."""
    if not isinstance(node, cst.AugAssign) or not isinstance(node.operator, cst.AddAssign):
        return None
    names = (cst.Name, cst.Attribute)
    spelled = [dotted(n) or "" for n in walk(node.value) if isinstance(n, names)]
    if any("loss" in word.lower() for word in (*spelled, _total_name(node))):
        return node
    return None


def _total_name(node: cst.AugAssign) -> str:
    target = node.target
    if isinstance(target, cst.Subscript):
        return dotted(target.value) or ""
    return dotted(target) or ""


def _loss_total_message(script: ScriptModel, node: cst.AugAssign) -> str:
    """Advice for a loss summed per batch: reduce the total (a host value from ``.item()``,
    ``.numpy()`` or ``float()`` made a tensor first: ``reduce`` takes tensors only), with its
    count; ``gather_for_metrics`` needs a per-batch tensor."""
    accelerator = accelerator_name(script, node)
    total = _total_name(node)
    keyed = isinstance(node.target, cst.Subscript)
    from_item = _host_value(node.value) or _from_host_helper(script, node)
    on_cpu = not from_item and _moved_to_cpu(node.value)
    device = f"{accelerator}.device"
    if from_item and keyed:
        reduced = f"{{k: torch.tensor(v, device={device}) for k, v in {total}.items()}}"
    elif from_item:
        reduced = f"torch.tensor({total}, device={device})"
    elif on_cpu and keyed:
        reduced = f"{{k: v.to({device}) for k, v in {total}.items()}}"
    elif on_cpu:
        reduced = f"{total}.to({device})"
    else:
        reduced = total
    what = f"each total in {total}" if keyed else total
    why_device = (
        f" (reduce takes tensors on {device}: these totals are moved to the CPU, which NCCL "
        f"cannot reduce; for Python numbers use {accelerator}.gather_object)"
        if on_cpu
        else ""
    )
    return (
        f"Combine {what} across ranks after the loop: {accelerator}.reduce({reduced}, "
        f"reduction='sum'){why_device}, with its count (of batches or samples) reduced the "
        f"same way (or {accelerator}.gather_for_metrics the per-batch losses); each rank sums "
        "only its shard of the prepared loader"
    )


def _moved_to_cpu(node: cst.CSTNode) -> bool:
    """``v.detach().to("cpu")``, ``v.cpu()``: a host tensor, which ``reduce`` cannot send
    over NCCL."""
    for n in walk(node):
        if not isinstance(n, cst.Call) or not isinstance(n.func, cst.Attribute):
            continue
        if n.func.attr.value == "cpu" and not n.args:
            return True
        if n.func.attr.value == "to":
            target = argument_value(n, "device")
            if isinstance(target, cst.SimpleString) and target.evaluated_value == "cpu":
                return True
    return False


def _host_value(node: cst.CSTNode) -> bool:
    """A host value: ``.item()``, ``.cpu().numpy()``, ``float(loss)``."""
    return any(
        (isinstance(n, cst.Attribute) and n.attr.value in ("item", "numpy", "tolist"))
        or (isinstance(n, cst.Call) and dotted(n.func) in ("float", "int"))
        for n in walk(node)
    )


def _from_host_helper(script: ScriptModel, node: cst.AugAssign) -> bool:
    """The total adds a name bound from a call of a function of the file that returns host
    values (``loss, pred = self.make_step(batch, False)`` where it returns ``loss.item(),
    ...``): a float, which ``reduce`` refuses until it is made a tensor."""
    read = {n.value for n in walk(node.value) if isinstance(n, cst.Name)}
    function = next((a for a in script.ancestors(node) if isinstance(a, cst.FunctionDef)), None)
    if not read or function is None:
        return False
    for assign in walk(function.body):
        if not (isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)):
            continue
        if not read & {name for t in assign.targets for name in target_names(t.target)}:
            continue
        found = script.call_graph.callee(assign.value)
        if found is not None and any(
            isinstance(ret, cst.Return) and ret.value is not None and _host_value(ret.value)
            for ret in walk(found[0].body)
        ):
            return True
    return False


def _rank_only_call(
    script: ScriptModel, facts: Facts, node: cst.CSTNode, depth: int = 0
) -> cst.Call | None:
    """A call under a rank guard through which alone the evaluation at ``node`` runs
    (``if self.is_main: self.validate()``): every call of its function is guarded, or is in
    a function only so reached. A gather added in the loop would then hang: the other ranks
    never get there. None when some call reaches it on every rank, or it has no callers."""
    function = facts.placement.enclosing_function(node)
    if function is None or depth >= 3:
        return None
    sites = callers_of(script, facts.placement, function)
    if not sites:
        return None
    found = None
    for site in sites:
        guarded = site if script.under_rank_guard(site) else None
        guarded = guarded or _rank_only_call(script, facts, site, depth + 1)
        if guarded is None:
            return None
        found = found or guarded
    return found


def _guard_in_loop(
    script: ScriptModel, facts: Facts, loop: cst.CSTNode, node: cst.CSTNode
) -> cst.If | None:
    """The rank test inside the evaluation loop that only some ranks pass to reach ``node``
    (``if save_predictions and accelerator.is_main_process: rows.append(...)``), or None."""
    if not script.under_rank_guard(node) or script.under_rank_guard(loop):
        return None
    return facts.ranks.divergent_branch(node, within=loop)


def _inner_guard_message(script: ScriptModel, node: cst.CSTNode, kept: str, guard: cst.If) -> str:
    """The advice for values kept under a rank test inside the loop: the gather goes before the
    test, where every rank runs it; inside it, it would hang."""
    name = accelerator_name(script, node)
    return (
        f"Gather these values on every rank before the rank test at line {script.line(guard)} "
        f"({name}.gather_for_metrics(..., use_gather_object=True) for Python objects), then "
        f"keep them there: only that rank gets here, so {kept} covers its shard of the "
        f"prepared loader only (a gather inside the test would hang)"
    )


def _written_shard_message(script: ScriptModel, write: cst.Call) -> str:
    name = accelerator_name(script, write)
    return (
        "Gather before writing this row: the loader is prepared, so each batch is this rank's "
        "shard and the file gets 1/N of the evaluation set's rows; "
        f"{name}.gather_for_metrics(...) the values it writes, on every rank, before the write "
        "(and write on the main process only)"
    )


def _guarded_message(script: ScriptModel, node: cst.CSTNode, line: int) -> str:
    """The advice when the evaluation runs on some ranks only: gathering there would hang, so
    the call moves out of its guard first."""
    name = accelerator_name(script, node)
    return (
        f"Run this evaluation on every rank, then gather: it is called under a rank guard "
        f"(line {line}), so the metric covers that rank's shard of the prepared loader only; "
        f"call it on every rank and {name}.gather_for_metrics(...) the predictions and labels "
        f"(a gather added while the call stays guarded would hang)"
    )


def _main_only_note(script: ScriptModel, guarded: cst.Call) -> str:
    """What else the advice to call the evaluation on every rank must say: the guarded call hands
    it something only the main process has (conformer-VC's ``writer``, a ``SummaryWriter`` made
    under ``if accelerator.is_main_process:`` and None on the others), which the evaluation
    then uses (``self.write_losses(epoch, writer, tracker)``): called on every rank as advised,
    the others would crash on None, so those uses stay under the main-process test."""
    found = script.call_graph.callee(guarded)
    parts = []
    for argument in guarded.args:
        held = dotted(argument.value)
        if held is None or argument.star:
            continue
        made = [
            assign
            for assign in script.index.assignments_to(held)
            if script.under_rank_guard(assign)
            and (script.scope_of(assign) is script.scope_of(guarded) or "." in held)
        ]
        if not made or any(
            not script.under_rank_guard(assign)
            and assign.value is not None
            and dotted(assign.value) != "None"
            for assign in script.index.assignments_to(held)
            if script.scope_of(assign) is script.scope_of(guarded) or "." in held
        ):
            continue  # made on every rank too
        uses = []
        if found is not None:
            function, implicit = found
            parameter = next(
                (p for p, a in bound_arguments(function, guarded, implicit) if a is argument),
                None,
            )
            uses = sorted(
                {
                    script.line(node)
                    for node in walk(function.body)
                    if isinstance(node, cst.Name) and node.value == parameter
                }
            )
        if not uses:
            continue  # the evaluation does nothing with it: running it on every rank is safe
        where = f" (line {', '.join(map(str, uses))})"
        guard = script.rank_guard_of(made[0])
        test = (
            f"`if {script.module.code_for_node(guard.test)}:`"
            if isinstance(guard, cst.If)
            else "that rank test"
        )
        parts.append(
            f"`{held}` is set only on the ranks that pass the test at line "
            f"{script.line(guard)} (line {script.line(made[0])}), so keep the evaluation's "
            f"uses of it{where} under {test} inside the evaluation"
        )
    if not parts:
        return ""
    return "; " + "; ".join(parts) + " (on the other ranks it is unset or None)"


def _guarded_loop_message(
    script: ScriptModel, node: cst.CSTNode, loop: Loop, guard: cst.CSTNode
) -> str:
    """The advice when the evaluation loop itself runs on some ranks only: inside a rank test
    (``if accelerator.is_main_process:`` around the validation) or below an early ``return``
    the other ranks take (``if not accelerator.is_main_process: return``; `_guard_note` of
    ACC202 tells them apart the same way). A reduce or gather added there would hang, so the
    loop runs on every rank first."""
    name = accelerator_name(script, node)
    line = script.line(guard)
    if isinstance(guard, cst.If) and not script.inside(loop.node, guard):
        where = f"the other ranks return at line {line}, above it"
        move = "move that return below the loop (or drop it)"
        keep = "keep only the logging on the main process"
    else:
        where = f"it is inside the rank test at line {line}"
        move = "move the loop out of the test"
        keep = "keep only the logging under the test"
    return (
        f"Run this evaluation loop on every rank: {where}, so the metric covers that rank's "
        f"shard of the prepared loader only; {move}, combine its totals on every rank "
        f"({name}.gather_for_metrics(...) the predictions and labels, or {name}.reduce the "
        f"sums), and {keep} (a gather or reduce on some ranks only would hang)"
    )


def _helper_forward(facts: Facts, loop: Loop) -> cst.Call | None:
    """``ppl = eval_step(model, batch)``: the call of a helper that runs the model on the batch
    and returns per-batch numbers (`helper_evaluation`), when nothing in the helper combines the
    ranks (a gather there makes what it returns every rank's) and it is no training step (its
    ``accelerator.backward`` and ``optimizer.step()``: the loop's totals are training ones)."""
    helper = facts.helper_evaluations.get(id(loop.node))
    if helper is None or not _runs_the_model_only(helper.helper):
        return None
    return helper.call


def _runs_the_model_only(
    helper: cst.FunctionDef, off: frozenset[str] | set[str] = frozenset()
) -> bool:
    """Nothing in the helper combines the ranks (a gather there makes what it returns every
    rank's) and it is no training step (its ``backward``, ``optimizer.step()``), leaving out
    the bodies of ``if flag:`` tests on a parameter in ``off`` (one the call sets to False)."""
    skipped = {
        id(node)
        for branch in walk(helper.body)
        if isinstance(branch, cst.If)
        and isinstance(branch.test, cst.Name)
        and branch.test.value in off
        for node in walk(branch.body)
    }
    for node in walk(helper.body):
        if id(node) in skipped:
            continue
        func = node.func if isinstance(node, cst.Call) else None
        if isinstance(func, cst.Attribute) and func.attr.value in (
            *_COLLECTIVES,
            "all_reduce",
            "all_gather",
            "backward",
            "step",
        ):
            return False
    return True


def _model_helper_forward(script: ScriptModel, facts: Facts, loop: Loop) -> cst.Call | None:
    """``forward_with_model(model, inputs, labels).loss``: a function of the file, handed the
    prepared model, that calls it (a Florence-2 trainer's evaluation, the same helper its
    training loop uses), also where the loop's own function got the model from its callers
    (nanoT5's ``forward(model, batch)`` in ``eval()``, handed down from ``main.py``). The
    loop's forward runs there."""
    prepared = script.prepared_names
    for call, helper, implicit in _helper_calls(script, loop):
        if not _runs_the_model_only(helper):
            continue
        called = {dotted(node.func) for node in walk(helper.body) if isinstance(node, cst.Call)}
        for parameter, argument in bound_arguments(helper, call, implicit):
            name = dotted(argument.value)
            if (
                parameter in called
                and name is not None
                and (
                    name in prepared
                    or facts.flow.outer_name(name, call) in prepared
                    # nanoT5's ``eval(model, ...)``: a parameter every caller hands the
                    # prepared model, up to the project's entry script
                    or facts.flow.prepared_argument(call, argument.value)
                )
            ):
                return call
    return None


def _helper_calls(
    script: ScriptModel, loop: Loop
) -> Iterator[tuple[cst.Call, cst.FunctionDef, int]]:
    """Each call in ``loop``'s body to a function of the file, with that function and how many
    of its leading parameters the call binds implicitly (`CallGraph.callee`)."""
    for call in walk(loop.node.body):
        if isinstance(call, cst.Call) and (found := script.call_graph.callee(call)) is not None:
            yield call, *found


def _step_helper_forward(script: ScriptModel, facts: Facts, loop: Loop) -> cst.Call | None:
    """``loss, pred = self.make_step(batch, False)``: a function of the file that runs a
    prepared model on the batch and trains only under a parameter this call turns off
    (``if update_model: self.accelerator.backward(loss)``), so that here it is the loop's
    forward (a tabular trainer's evaluation, sharing its training step)."""
    for call, helper, implicit in _helper_calls(script, loop):
        off = {
            parameter
            for parameter, argument in bound_arguments(helper, call, implicit)
            if isinstance(argument.value, cst.Name) and argument.value.value in ("False", "None")
        }
        if off and _runs_the_model_only(helper, off) and _forward_in(helper, facts):
            return call
    return None


def _forward_in(helper: cst.FunctionDef, facts: Facts) -> bool:
    """The helper calls a model (``self.model(x)``, prepared by the class)."""
    return any(
        isinstance(node, cst.Call) and facts.flow.is_forward(node) for node in walk(helper.body)
    )


def _is_collective(call: cst.Call, accelerators: set[str]) -> bool:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _COLLECTIVES:
        owner = dotted(func.value)
        return owner in accelerators or owner in ("dist", "torch.distributed")
    return isinstance(func, cst.Attribute) and func.attr.value in ("all_reduce", "all_gather")


class _RankValues:
    """Which per-batch values in an evaluation loop are this rank's alone: a batch, a forward's
    output, what is computed from them. A value gathered or reduced on the spot, or a name last
    set from one (``preds, refs = accelerator.gather_for_metrics((preds, refs))``), is every
    rank's: a loop that gathers its predictions may still sum its loss unreduced."""

    def __init__(
        self, script: ScriptModel, loop: Loop, local: set[str], accelerators: set[str]
    ) -> None:
        self.script = script
        self.local = local
        self.accelerators = accelerators
        self.assigns = [node for node in walk(loop.node.body) if _single_target(node) is not None]
        self.inner_loops = {id(node) for node in walk(loop.node.body) if isinstance(node, cst.For)}
        self.loop_body = loop.node.body
        #: answers of `_gathered` by (name, reading node): each chain of assignments is
        #: followed once, however many values read it
        self._answers: dict[tuple[str, int], bool] = {}
        #: answers of `_from_collective` by (name, the assignment it was last set by): a chain
        #: ``b = a + a; c = b + b; ...`` is followed once per link, not once per path
        self._from_collectives: dict[tuple[str, int], bool] = {}

    def this_rank_only(self, value: cst.CSTNode, depth: int = 0) -> bool:
        if self._collective_in(value):
            return False
        mentioned = {
            n.value
            for n in walk(value)
            if isinstance(n, cst.Name) and n.value in self.local and not self._member_name(n)
        }
        return any(not self._gathered(name, value, depth) for name in mentioned)

    def _member_name(self, name: cst.Name) -> bool:
        """``data`` of ``outputs.data``: a member, not the batch named ``data``."""
        parent = self.script.parent(name)
        return isinstance(parent, cst.Attribute) and parent.attr is name

    def _gathered(self, name: str, value: cst.CSTNode, depth: int) -> bool:
        """Whether ``name``, where ``value`` reads it, was last set from every rank's values
        (``predictions = predictions[:n]`` reads the gathered one set above it), followed
        back through as many assignments as the loop has (a kNN step computes its labels
        six assignments after the gathered features)."""
        key = (name, id(value))
        if key not in self._answers:
            self._answers[key] = self._last_set_gathered(name, value, depth)
        return self._answers[key]

    def _last_set_gathered(self, name: str, value: cst.CSTNode, depth: int) -> bool:
        last = self._last_assign(name, value)
        if last is None:
            # ``for met in self.metric_ftns:`` inside the loop: ``met`` is what that loop walks,
            # the same on every rank unless what it walks is this rank's
            inner = [
                a
                for a in self.script.ancestors(value)
                if isinstance(a, cst.For) and id(a) in self.inner_loops
                if name in target_names(a.target)
            ]
            if inner and depth < len(self.assigns) + len(self.inner_loops):
                return not self.this_rank_only(inner[0].iter, depth + 1)
            return False  # the batch itself: this rank's
        if depth >= len(self.assigns):
            return False
        if isinstance(last.value, (cst.List, cst.Tuple)) and not last.value.elements:
            # ``losses = []`` then ``losses.append(model(x).loss)``: what it collects
            return not any(
                self.this_rank_only(argument.value, depth + 1)
                for call in walk(self.loop_body)
                if isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value in ("append", "extend")
                and dotted(call.func.value) == name
                for argument in call.args
            )
        return not self.this_rank_only(last.value, depth + 1)

    def mixed_with_gathered(self, node: cst.CSTNode) -> list[str]:
        """The names of this rank's values that ``node`` combines with gathered ones, followed
        back through the loop's assignments to the first that holds this rank's values alone
        (a stock forecaster compares gathered predictions with ``prev_values``, taken from its
        own batch): empty when ``node`` reads nothing gathered."""
        found: list[str] = []
        mixed = False
        seen: set[str] = set()
        pending: list[cst.CSTNode] = [node]
        while pending and len(seen) <= len(self.assigns) + 1:
            current = pending.pop()
            # what a collective's arguments read is every rank's once it returns:
            # ``preds == accelerator.gather(y)`` compares gathered rows with gathered labels
            inside = self._inside_collectives(current)
            names = [
                n.value
                for n in walk(current)
                if isinstance(n, cst.Name)
                and n.value in self.local
                and not self._member_name(n)
                and id(n) not in inside
            ]
            gathered = [name for name in names if self._from_collective(name, current, 0)]
            if inside:
                gathered.append("")  # the collective's own result
            local = [name for name in names if not self._gathered(name, current, 0)]
            if gathered and local:
                mixed = True
            for name in dict.fromkeys(local):
                if name in seen:
                    continue
                seen.add(name)
                last = self._last_assign(name, current)
                if last is None or not self._reads_gathered(last.value):
                    if current is not node or gathered:
                        found.append(name)
                    continue
                pending.append(last.value)
        return found if mixed else []

    def _inside_collectives(self, node: cst.CSTNode) -> set[int]:
        """The ids of the nodes under the arguments of the collectives in ``node``."""
        found: set[int] = set()
        for call in walk(node):
            if (
                isinstance(call, cst.Call)
                and id(call) not in found
                and (_is_collective(call, self.accelerators) or self._combining_helper(call))
            ):
                found |= {id(n) for argument in call.args for n in walk(argument)}
        return found

    def _reads_gathered(self, value: cst.CSTNode) -> bool:
        return self._collective_in(value) or any(
            isinstance(n, cst.Name)
            and n.value in self.local
            and not self._member_name(n)
            and self._from_collective(n.value, value, 0)
            for n in walk(value)
        )

    def _from_collective(self, name: str, value: cst.CSTNode, depth: int) -> bool:
        """``name``, where ``value`` reads it, holds what a collective returned (or is computed
        from it): gathered, not merely the same on every rank (a constant's ``f_dim``)."""
        last = self._last_assign(name, value)
        if last is None:
            return False
        key = (name, id(last))
        known = self._from_collectives.get(key)
        if known is not None:
            return known
        self._from_collectives[key] = False  # a name set from itself gathers nothing new
        found = self._collective_in(last.value) or (
            depth < len(self.assigns)
            and any(
                isinstance(n, cst.Name)
                and n.value in self.local
                and not self._member_name(n)
                and self._from_collective(n.value, last.value, depth + 1)
                for n in walk(last.value)
            )
        )
        self._from_collectives[key] = found
        return found

    def _last_assign(self, name: str, value: cst.CSTNode) -> cst.Assign | cst.AnnAssign | None:
        at = self.script.order(value)
        around = {id(a) for a in self.script.ancestors(value)}
        last = None
        for assign in self.assigns:
            if (
                self.script.order(assign) < at
                and id(assign) not in around
                and name in target_names(_single_target(assign))
            ):
                last = assign
        return last

    def reads_gathered(self, value: cst.CSTNode) -> bool:
        """``value`` holds a gather or reduce (or a helper that combines the ranks), or reads a
        name of the loop last set from one (``preds, y = accelerator.gather((preds, y))``)."""
        return self._reads_gathered(value)

    def _collective_in(self, node: cst.CSTNode) -> bool:
        return any(
            isinstance(call, cst.Call)
            and (_is_collective(call, self.accelerators) or self._combining_helper(call))
            for call in walk(node)
        )

    def _combining_helper(self, call: cst.Call) -> bool:
        """``reduced = self._reduce_loss_dict(losses)``: a function of the file (or a method of
        its class) that every rank running it reaches a gather or reduce in returns what it
        combined across the ranks, as the ``accelerator.reduce`` written in the loop would."""
        found = self.script.call_graph.callee(call)
        if found is None:
            return False
        reach = facts_of(self.script).collective_reach
        return any(
            _is_collective(collective, self.accelerators)
            for collective, _ in reach.reached_by(found[0])
        )


def _accumulations(
    loop: Loop, this_rank_only: Callable[[cst.CSTNode], bool], synced: set[cst.Call]
) -> list[tuple[str, cst.CSTNode]]:
    """Each ``total += <per-batch value>`` or ``total.append(<per-batch value>)`` whose target
    lives outside the loop and whose value is this rank's alone, in source order; not a
    torchmetrics metric's update (``synced``), which combines the ranks itself."""
    local = _assigned_in(loop.node.body) | loop.batch_names

    class Finder(Visitor):
        def __init__(self) -> None:
            self.found: list[tuple[str, cst.CSTNode]] = []

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            target = dotted(node.target)
            if target is None and isinstance(node.target, cst.Subscript):
                target = dotted(node.target.value)  # ``losses[name] += value``: a dict of totals
            if target and target not in local and this_rank_only(node.value):
                self.found.append((target, node))

        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in _ACCUMULATING_METHODS
                and node not in synced
            ):
                owner = dotted(func.value)
                if owner is None and isinstance(func.value, cst.Subscript):
                    # ``sports2prob[token].append(p)``: a dict of per-key lists
                    owner = dotted(func.value.value)
                inputs = [argument.value for argument in node.args]
                if (
                    owner
                    and owner.split(".")[0] not in local
                    and any(this_rank_only(value) for value in inputs)
                ):
                    self.found.append((owner, node))

    finder = Finder()
    visit_code(loop.node.body, finder)
    return finder.found


def _stats_dict(script: ScriptModel, loop: Loop, at: cst.CSTNode) -> str | None:
    """The name of a dict of this batch's statistics that ``at`` folds into a running meter
    (nanoT5's ``averager.update(stats)``, ``history.append(stats)``): bound in the loop to a
    dict display, or unpacked from a call of a function of the file that returns one in that
    place (``_, stats = forward(model, batch)`` of a ``return loss, stats``). Only a dict of
    fixed keys and scalar values (`_fixed_scalar_dict`): the advised reduce runs once per key on
    every rank, so keys one rank adds alone (``if loss > 10: stats["spike"] = 1.0``) hang it,
    and a string or a list has no ``torch.tensor`` to reduce; for those the gather advice."""
    node = at.value if isinstance(at, cst.Expr) else at
    if not (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and len(node.args) == 1
        and node.args[0].keyword is None
        and not node.args[0].star
        and isinstance(node.args[0].value, cst.Name)
    ):
        return None
    name = node.args[0].value.value
    for assign in walk(loop.node.body):
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            continue
        target = assign.targets[0].target
        if isinstance(target, cst.Name) and target.value == name:
            if _fixed_scalar_dict(script, assign.value, name, loop.node.body):
                return name
        elif (unpacked := unpacked_slot(assign, name)) is not None:
            _, slot, width = unpacked
            if not _keys_changed(script, name, loop.node.body) and _returns_a_dict_at(
                script, assign.value, slot, width
            ):
                return name
    return None


def _fixed_scalar_dict(
    script: ScriptModel, value: cst.BaseExpression, name: str, scope: cst.CSTNode
) -> bool:
    """``value`` is a dict display with string keys and scalar values (``{"loss":
    loss.item(), "acc": float(acc)}``) bound to ``name``, whose keys nothing in ``scope``
    changes: what every rank can reduce key by key, in the same order."""
    return (
        isinstance(value, cst.Dict)
        and bool(value.elements)
        and all(
            isinstance(e, cst.DictElement)
            and isinstance(e.key, cst.SimpleString)
            and _scalar(e.value)
            for e in value.elements
        )
        and not _keys_changed(script, name, scope)
    )


def _scalar(value: cst.BaseExpression) -> bool:
    """Not plainly something other than a number: no string, list, tuple, set or dict (a
    display or a comprehension), nor ``.tolist()``, ``.numpy()``, ``str(...)``, ``list(...)``
    of one; arithmetic of such values. ``loss.item()``, ``correct / labels.numel()``, a name:
    a number as statistics of a batch spell it."""
    if isinstance(value, cst.UnaryOperation):
        return _scalar(value.expression)
    if isinstance(value, cst.BinaryOperation):
        return _scalar(value.left) and _scalar(value.right)
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Attribute):
            return func.attr.value not in _NOT_SCALAR_METHODS
        return dotted(func) not in _NOT_SCALAR_BUILDERS
    return not isinstance(value, _NOT_SCALAR_DISPLAYS)


#: What holds no number a reduce takes (a string, a list of predictions, an array).
_NOT_SCALAR_DISPLAYS = (
    cst.SimpleString,
    cst.FormattedString,
    cst.ConcatenatedString,
    cst.List,
    cst.Tuple,
    cst.Set,
    cst.Dict,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
)
_NOT_SCALAR_METHODS = frozenset({"tolist", "numpy", "decode", "batch_decode", "split", "join"})
_NOT_SCALAR_BUILDERS = frozenset({"str", "list", "tuple", "dict", "set", "sorted", "repr"})


def _keys_changed(script: ScriptModel, name: str, scope: cst.CSTNode) -> bool:
    """``scope`` adds keys to ``name`` that some ranks may lack, or drops or replaces them:
    ``name[k] = v`` under a test the ranks may disagree on (``if loss > 10:``) or of a value
    that is no scalar, ``del name[k]``, ``name.update(...)``, ``name.pop(k)``. A key added
    under a setting every rank shares (nanoT5's ``if calc_acc:``) is there on every rank."""
    ranks = facts_of(script).ranks
    for node in walk(scope):
        if isinstance(node, cst.Assign):
            if not any(
                isinstance(t.target, cst.Subscript) and dotted(t.target.value) == name
                for t in node.targets
            ):
                continue
            if not _scalar(node.value):
                return True
            for ancestor in script.ancestors(node):
                if ancestor is scope:
                    break
                if isinstance(ancestor, cst.If) and not (
                    ranks.uniform(ancestor.test) or alike_by_its_callers(script, ancestor.test)
                ):
                    return True
        elif isinstance(node, cst.AugAssign | cst.AnnAssign | cst.Del):
            if isinstance(node.target, cst.Subscript) and dotted(node.target.value) == name:
                return True
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and dotted(node.func.value) == name
            and node.func.attr.value in ("update", "pop", "popitem", "setdefault", "clear")
        ):
            return True
    return False


def _returns_a_dict_at(script: ScriptModel, call: cst.Call, place: int, width: int) -> bool:
    """Every ``return`` of the function ``call`` runs hands back a tuple of ``width`` elements
    (`returned_tuples`) whose element at ``place`` is a dict of fixed keys and scalar values
    (`_fixed_scalar_dict`), or a name the function binds to one only."""
    found = script.call_graph.callee(call)
    if found is None:
        return False
    function = found[0]
    returns = [r for r in walk(function.body) if isinstance(r, cst.Return) and r.value is not None]
    tuples = returned_tuples([r.value for r in returns])
    if tuples is None or len(tuples[0].elements) != width:
        return False
    for value in tuples:
        element = value.elements[place].value
        if _fixed_scalar_dict(script, element, "", function.body):
            continue
        if not isinstance(element, cst.Name):
            return False
        bound = [
            a.value
            for a in walk(function.body)
            if isinstance(a, cst.Assign)
            and len(a.targets) == 1
            and dotted(a.targets[0].target) == element.value
        ]
        if not bound or not all(
            _fixed_scalar_dict(script, b, element.value, function.body) for b in bound
        ):
            return False
    return True


def _stats_dict_message(script: ScriptModel, at: cst.CSTNode, stats: str) -> str:
    accelerator = accelerator_name(script, at)
    return (
        f"Reduce `{stats}` over the ranks before folding it in: it holds statistics of this "
        "rank's batch only (each rank reads its own shard), so what is folded here and logged "
        f"after is one rank's; on every rank, before this line, write `{stats} = {{k: "
        f'{accelerator}.reduce(torch.tensor(v, device={accelerator}.device), "mean").item() '
        f"for k, v in {stats}.items()}}` (or gather the outputs the statistics come from with "
        f"{accelerator}.gather_for_metrics)"
    )


def _mixed_message(script: ScriptModel, at: cst.CSTNode, names: list[str]) -> str:
    accelerator = accelerator_name(script, at)
    listed = ", ".join(f"`{name}`" for name in names)
    return (
        f"Gather {listed} in the same {accelerator}.gather_for_metrics(...) as the predictions "
        f"they are compared with: this total mixes gathered values with {listed}, this rank's "
        "own (from its batch), whose rows on N processes are 1/N of theirs (a shape error, or "
        "a metric over rows that do not match)"
    )


def _fed_to_collectives(loop: Loop, accelerators: set[str]) -> set[str]:
    """The names whose values reach a gather in the loop, followed back through its
    assignments: ``seen += len(labels)`` read as the offset of the indices it gathers
    (``indices = torch.arange(seen, seen + n)``, ``gather_for_metrics((logits, indices))``) is
    a position in this rank's stream that the loop consumes, not a total left to report."""
    fed = {
        name.value
        for call in walk(loop.node.body)
        if isinstance(call, cst.Call) and _is_collective(call, accelerators)
        for argument in call.args
        for name in walk(argument.value)
        if isinstance(name, cst.Name)
    }
    assigns = [node for node in walk(loop.node.body) if isinstance(node, cst.Assign)]
    for _ in assigns:
        before = len(fed)
        for assign in assigns:
            if any(target_names(t.target) & fed for t in assign.targets):
                fed |= {n.value for n in walk(assign.value) if isinstance(n, cst.Name)}
        if len(fed) == before:
            break
    return fed


def _mentions(node: cst.CSTNode, names: set[str]) -> bool:
    class Names(Visitor):
        found = False

        def visit_Name(self, name: cst.Name) -> None:
            if name.value in names:
                self.found = True

    visitor = Names()
    visit_code(node, visitor)
    return visitor.found


def _single_target(node: cst.CSTNode) -> cst.BaseExpression | None:
    """The target of ``x = value`` or of an annotated ``x: T = value`` (a typed evaluation loop
    writes ``out: SequenceClassifierOutput = self.model(**batch)``), or None."""
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        return node.targets[0].target
    if isinstance(node, cst.AnnAssign) and node.value is not None:
        return node.target
    return None


def _assigned_in(body: cst.CSTNode) -> set[str]:
    class Assigned(Visitor):
        def __init__(self) -> None:
            self.names: set[str] = set()

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            self.names |= target_names(node.target)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            if node.value is not None:  # ``out: Output = model(**batch)``
                self.names |= target_names(node.target)

        def visit_For(self, node: cst.For) -> None:
            self.names |= target_names(node.target)

    visitor = Assigned()
    visit_code(body, visitor)
    return visitor.names


def _evaluation_forward(script: ScriptModel, facts: Facts, loop: Loop) -> cst.Call | None:
    """The model's forward an evaluation loop runs, itself or through a helper."""
    return (
        _first_forward(loop, facts)
        or _helper_forward(facts, loop)
        or _model_helper_forward(script, facts, loop)
        or _step_helper_forward(script, facts, loop)
        or _outside_forward(script, facts, loop)
    )


def _outside_forward(script: ScriptModel, facts: Facts, loop: Loop) -> cst.Call | None:
    """``pred = paradigm.inference(model, x)``: a call of something the file does not define,
    handed the prepared model and this batch (a name the loop binds from it) but not the
    accelerator: it runs the model on the batch and hands back this rank's outputs (a timm
    launcher's paradigm object, built by a registry). One handed the accelerator may combine
    the ranks itself and is left alone."""
    accelerators = script.names_of(Kind.ACCELERATOR)
    batch = loop.batch_names
    flow = facts.flow
    for call in walk(loop.node.body):
        if not isinstance(call, cst.Call) or script.call_graph.callee(call) is not None:
            continue
        names = [dotted(argument.value) for argument in call.args]
        if any((name or "").split(".")[0] in accelerators for name in names):
            continue
        model = any(
            name is not None
            and flow.kind_of(name, call) is Kind.MODEL
            and (name in script.prepared_names or flow.prepared_argument(call, argument.value))
            for argument, name in zip(call.args, names, strict=True)
        )
        if model and any(name in batch for name in names):
            return call
    return None


def _per_rank_totals(
    script: ScriptModel, loop: Loop, values: _RankValues, all_calls: list[cst.Call]
) -> list[tuple[str, cst.CSTNode]]:
    """The totals an evaluation loop over a prepared loader accumulates from this rank's
    batches and that nothing in the loop, or after it in the function, combines."""
    accelerators = script.names_of(Kind.ACCELERATOR)
    synced = set(self_syncing_metrics(loop, script))
    gathered = _fed_to_collectives(loop, accelerators)
    return [
        (target, node)
        for target, node in _accumulations(loop, values.this_rank_only, synced)
        if not _reduced_later(script, loop.node, target, all_calls, accelerators)
        and target.split(".")[0] not in gathered
    ]


def _helper_totals(
    script: ScriptModel, module: Path, member: str, lines: set[int] | None = None
) -> list[tuple[tuple[int, int] | None, int]]:
    """For ``member``, a top-level function of the project module ``module`` that this file
    calls: the place of each per-rank total it returns (`_returned_slot`: None for the whole
    value) with the line that accumulates it, read in the module's analysis with what this
    file's calls hand it (its loader is a prepared one only through them): of the calls at
    ``lines`` only, when given (what the helper does where those calls run it)."""
    from accelify.analysis.outside_callers import handed_calls
    from accelify.lint.engine import project_view
    from accelify.source import parse

    if script.project is None:
        return []
    data = read(module)
    if f"def {member}".encode() not in data:
        return []
    handed = handed_calls(script, script.project.path, {str(module)})
    if lines is not None:
        handed = tuple(call for call in handed if call.line in lines)
    view = project_view(str(module), data, (), handed=handed)
    try:
        helper = analyze(parse(data, str(module)), project=view)
    except (UserError, RecursionError):
        return []
    defined = top_level_functions(helper.module, member)
    if len(defined) != 1:
        return []  # defined twice: which one runs is the module's order
    function = defined[0]
    facts = facts_of(helper)
    all_calls = calls(helper)
    accelerators = helper.names_of(Kind.ACCELERATOR)
    found: list[tuple[tuple[int, int] | None, int]] = []
    for evaluation in facts.evaluations:
        loop = evaluation.loop
        if facts.placement.enclosing_function(loop.node) is not function:
            continue
        if _evaluation_forward(helper, facts, loop) is None:
            continue
        if not facts.flow.over_prepared_loader(loop):
            continue
        values = _RankValues(
            helper, loop, _assigned_in(loop.node.body) | loop.batch_names, accelerators
        )
        for target, node in _per_rank_totals(helper, loop, values, all_calls):
            slot = _returned_slot(helper, function, target)
            if (
                slot is False
                and lines is not None
                and _returns_arithmetic_of(helper, function, target)
            ):
                slot = None  # ``return correct / total``: a ratio of this rank's counts
            if slot is not False and "." not in target:
                found.append((slot, helper.line(node)))
    return found


def _returns_arithmetic_of(script: ScriptModel, function: cst.FunctionDef, target: str) -> bool:
    """Every return of ``function`` hands back arithmetic on the total ``target`` (``correct /
    total``, ``100.0 * correct / total``): a number made of this rank's counts."""
    values = [r.value for r in script.index.own_returns(function)]
    return bool(values) and all(
        isinstance(value, cst.BinaryOperation)
        and any(isinstance(n, cst.Name) and n.value == target for n in walk(value))
        and not any(isinstance(n, cst.Call) for n in walk(value))
        for value in values
    )


def _split_callers(
    script: ScriptModel, facts: Facts, loop: Loop, target: str
) -> tuple[tuple[int, int] | None, list[cst.Call], cst.Call] | None:
    """The loop's function returns the total ``target`` (whole, or at one place of a tuple),
    and the file's calls of it part: some gather what it returns, some leave it (the place of
    the total, the calls that leave it, the first that gathers). The helper is right for the
    calls that gather; those that leave it are the bug. None otherwise."""
    function = facts.placement.enclosing_function(loop.node)
    if function is None or "." in target:
        return None
    slot = _returned_slot(script, function, target)
    if slot is False:
        return None
    sites = [call for call, _ in facts.flow.calls_of(function)]
    left = [call for call in sites if not _combined_at(script, call, slot)]
    gathering = [call for call in sites if all(call is not other for other in left)]
    if not left or not gathering:
        return None
    return slot, left, gathering[0]


def _bound_at(script: ScriptModel, call: cst.Call, slot: tuple[int, int] | None) -> str | None:
    """``final`` where ``final = utils.evaluate(...)`` (or ``final, labels = ...`` binds the
    total at ``slot``): the name a message tells to gather."""
    statement = script.parent(call)
    if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
        return None
    target = statement.targets[0].target
    if slot is not None and isinstance(target, cst.Tuple | cst.List):
        if len(target.elements) != slot[1]:
            return None
        target = target.elements[slot[0]].value
    return f"`{target.value}`" if isinstance(target, cst.Name) else None


def _combined_somehow(script: ScriptModel, call: cst.Call) -> bool:
    """`_combined_at` for the whole of what ``call`` returns or for some name its unpacking
    binds: a test before analysing the helper."""
    if _combined_at(script, call, None):
        return True
    statement = script.parent(call)
    if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
        return False
    target = statement.targets[0].target
    if not isinstance(target, cst.Tuple | cst.List):
        return False
    width = len(target.elements)
    return any(_combined_at(script, call, (place, width)) for place in range(width))


def _relative(module: Path, caller: Path) -> str:
    """``utils.py``, ``pkg/utils.py``: ``module`` as the caller's folder reaches it."""
    try:
        return str(module.relative_to(caller.resolve().parent))
    except ValueError:
        return str(module)


def _reduced_by_callers(
    script: ScriptModel,
    facts: Facts,
    loop: Loop,
    target: str,
    all_calls: list[cst.Call],
    accelerators: set[str],
) -> bool:
    """The loop's helper returns the total (``return embeddings``) and every caller that holds
    the result combines it after the call (``accelerator.gather_for_metrics(embeddings)``):
    gathered, if after the loop (ACC404 reports there what that keeps)."""
    function = facts.placement.enclosing_function(loop.node)
    if function is None or "." in target:
        return False
    if _gathered_at_every_call(script, facts, function, target, accelerators):
        return True
    slot = _returned_slot(script, function, target)
    sites = facts.flow.calls_of(function)
    if (
        slot is not None
        and slot is not False
        and sites
        and all(_combined_at(script, call, slot) for call, _ in sites)
    ):
        return True  # ``gather(evaluate(model, loader)[0])``: each call gathers its place
    held = held_by_callers(facts, function, {target})
    if held:
        return all(
            _reduced_later(script, statement, name, all_calls, accelerators)
            for statement, name in held
        )
    return _combined_by_other_modules(script, facts, function, target)


def _combined_by_other_modules(
    script: ScriptModel, facts: Facts, function: cst.FunctionDef, target: str
) -> bool:
    """A helper module's evaluation (``def evaluate(model, loader): ... return
    torch.cat(preds)``) that this file never calls, and that every call of the project's other
    modules combines across the ranks, read in the caller's own analysis: handed straight to
    a gather (``accelerator.gather_for_metrics(utils.evaluate(model, loader))``), or bound to
    a name a collective reads after it (``preds = utils.evaluate(...)``, then
    ``accelerator.gather_for_metrics(preds)``). What the helper returns is this rank's; its
    callers make it the whole set's. The total may be one slot of a returned tuple (``return
    torch.cat(preds), torch.cat(labels)``): a caller then gathers the whole tuple, or the name
    its unpacking binds at that slot (``preds, labels = utils.evaluate(...)``)."""
    project = script.project
    if project is None or facts.flow.calls_of(function):
        return False
    slot = _returned_slot(script, function, target)
    if slot is False:
        return False
    owner = facts.placement.class_of(function)
    sites = project.callers_of(function, owner.name.value if owner is not None else None)
    if not sites or _named_but_not_called(project, function.name.value):
        return False
    left = {id(caller) for caller, call, _ in sites if not _combined_at(caller, call, slot)}
    gathering = {id(caller) for caller, call, _ in sites if _combined_at(caller, call, slot)}
    # a file that gathers one call and leaves another is told at the call it leaves
    # (`UngatheredMetric._left_by_this_caller`): the helper is right for the ones that gather
    return left <= gathering


def _named_but_not_called(project: ProjectView, name: str) -> bool:
    """A module of the project that imports this one names ``name`` other than in a plain
    import, a call or a definition: an alias (``from utils import evaluate as ev``), a
    reference kept or handed on (``fn = utils.evaluate``, ``pool.map(utils.evaluate, ...)``).
    Its calls are not among those `callers_of` finds, so whether they gather is not known
    (a module that cannot be parsed counts so too)."""
    for path in dict.fromkeys((*project.handing, *project.importers, *project.callers)):
        data = read(path)
        if name.encode() not in data:
            continue
        try:
            module = cst.parse_module(data)
        except (cst.ParserSyntaxError, ValueError):  # ValueError: UnicodeDecodeError too
            return True
        allowed: set[int] = set()
        for node in walk(module):
            if isinstance(node, cst.Call):
                func = node.func
                allowed.add(id(func.attr if isinstance(func, cst.Attribute) else func))
            elif isinstance(node, cst.FunctionDef | cst.ClassDef) or (
                isinstance(node, cst.ImportAlias) and node.asname is None
            ):
                allowed.add(id(node.name))
        if any(
            isinstance(node, cst.Name) and node.value == name and id(node) not in allowed
            for node in walk(module)
        ):
            return True
    return False


def _returned_slot(
    script: ScriptModel, function: cst.FunctionDef, target: str
) -> tuple[int, int] | bool | None:
    """Where every return of ``function`` hands back the total ``target``: None for the whole
    value, ``(slot, width)`` for one place of a tuple of that many elements (`returned_tuples`,
    the same place in each), False where some return hands back anything else."""
    values = [r.value for r in script.index.own_returns(function)]
    if not values:
        return False
    if all(_returns_total(script, value, target) for value in values):
        return None
    tuples = returned_tuples(values)
    if tuples is None:
        return False
    places = {
        tuple(i for i, e in enumerate(t.elements) if _returns_total(script, e.value, target))
        for t in tuples
    }
    if len(places) != 1 or len(place := places.pop()) != 1:
        return False
    return place[0], len(tuples[0].elements)


def _combined_at(caller: ScriptModel, call: cst.Call, slot: tuple[int, int] | None) -> bool:
    """``call``, in the caller's file, is an argument of a collective, or its whole result is
    bound to one name that a collective reaches after it, before any other read (or, for a
    total at ``slot`` of a returned tuple, the name an unpacking of as many targets binds
    there). A subscript of the call at a constant place (``evaluate(model, loader)[0]``)
    stands for that element: the total's own place then counts as the call would, and any
    other place leaves the total unread (nothing of this rank's alone is used)."""
    accelerators = caller.names_of(Kind.ACCELERATOR)
    value: cst.BaseExpression = call
    taken = caller.parent(call)
    if slot is not None and isinstance(taken, cst.Subscript) and taken.value is call:
        place = _constant_place(taken)
        if place is None or not -slot[1] <= place < slot[1]:
            return False
        if place % slot[1] != slot[0]:
            return True
        value, slot = taken, None
    if slot is None:
        value = _method_chain_of(caller, value)
    argument = caller.parent(value)
    gather = caller.parent(argument) if isinstance(argument, cst.Arg) else None
    if isinstance(gather, cst.Call) and (
        _is_collective(gather, accelerators)
        or combines_ranks(caller, gather)
        or _reaches_a_gather(caller, gather, accelerators)
    ):
        return True
    statement = caller.parent(value)
    if not (
        isinstance(statement, cst.Assign)
        and statement.value is value
        and len(statement.targets) == 1
    ):
        return False
    target = statement.targets[0].target
    if slot is not None and isinstance(target, cst.Tuple | cst.List):
        elements = target.elements
        if len(elements) != slot[1] or any(isinstance(e, cst.StarredElement) for e in elements):
            return False
        target = elements[slot[0]].value
    if not isinstance(target, cst.Name):
        return False
    return _reduced_later(caller, statement, target.value, calls(caller), accelerators)


def _reaches_a_gather(caller: ScriptModel, call: cst.Call, accelerators: set[str]) -> bool:
    """``finish(accelerator, evaluate(model, loader))``: a function of the file that every rank
    running it reaches a gather or reduce in (``return accelerator.gather_for_metrics(preds)``)
    combines what it is handed, as the collective written at the call would; telling the call
    to gather as well counted every rank's predictions N times (as `_combining_helper`)."""
    found = caller.call_graph.callee(call)
    if found is None:
        return False
    reach = facts_of(caller).collective_reach
    return any(
        _is_collective(collective, accelerators) for collective, _ in reach.reached_by(found[0])
    )


def _method_chain_of(caller: ScriptModel, value: cst.BaseExpression) -> cst.BaseExpression:
    """The outermost call of a chain of methods called on ``value``
    (``evaluate(model, loader).float().sum()``): a collective handed that chain
    (``accelerator.reduce(evaluate(...).float().sum())``) combines the ranks' values as one
    handed the call does; telling it to gather the call inside as well counted every rank's
    predictions N times."""
    while True:
        member = caller.parent(value)
        method = caller.parent(member) if isinstance(member, cst.Attribute) else None
        if not (
            isinstance(member, cst.Attribute)
            and member.value is value
            and isinstance(method, cst.Call)
            and method.func is member
        ):
            return value
        value = method


def _constant_place(subscript: cst.Subscript) -> int | None:
    """``0`` of ``value[0]``, ``-1`` of ``value[-1]``; None for a slice or a computed index."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    index = subscript.slice[0].slice.value
    sign = 1
    if isinstance(index, cst.UnaryOperation) and isinstance(index.operator, cst.Minus):
        index, sign = index.expression, -1
    if isinstance(index, cst.Integer):
        return sign * int(index.value, 0)
    return None


#: Calls that join a list of tensors and keep every value: what they return is the total.
_JOINS = frozenset({"torch.cat", "torch.stack", "torch.concat", "torch.tensor"})


def _gathered_at_every_call(
    script: ScriptModel,
    facts: Facts,
    function: cst.FunctionDef,
    target: str,
    accelerators: set[str],
) -> bool:
    """Every ``return`` of ``function`` hands back the total, whole or joined (``return
    torch.cat(preds)``), and every call of it in the file is combined (`_combined_at`: handed
    to a gather, ``accelerator.gather_for_metrics(evaluate(model, loader))``, or bound to a
    name a gather reaches before any other read): combined there."""
    returns = script.index.own_returns(function)
    if not returns or not all(_returns_total(script, r.value, target) for r in returns):
        return False
    sites = facts.flow.calls_of(function)
    if not sites:
        return False
    # handed to a gather, or bound to a name a gather reaches before any other read
    # (``final = evaluate(...)`` then ``final = accelerator.gather_for_metrics(final)``)
    return all(_combined_at(script, call, None) for call, _ in sites)


def _returns_total(script: ScriptModel, value: cst.BaseExpression | None, target: str) -> bool:
    if isinstance(value, cst.Name):
        return value.value == target
    return (
        isinstance(value, cst.Call)
        and bool(script.call_names(value) & _JOINS)
        and len(value.args) == 1
        and isinstance(value.args[0].value, cst.Name)
        and value.args[0].value.value == target
    )


def _reduced_later(
    script: ScriptModel,
    loop: cst.CSTNode,
    target: str,
    all_calls: list[cst.Call],
    accelerators: set[str],
) -> bool:
    """``total = accelerator.reduce(total)`` (or a gather of it, also by ``gather_object``
    imported from accelerate.utils) after the loop, also through
    what is built from it there (``t = torch.tensor([correct], device=...)``, then
    ``accelerator.gather(t).sum()``). Only a collective that every rank reaches before the
    total is used: one after ``print(errs.mean())`` leaves the printed number this rank's (a
    reduce whose result is never read, below the print). One under a rank test the loop is not
    under (``if acc.is_main_process: results = gather_object(results)``) is where the total is
    combined, in the wrong place: a hang, ACC202's finding at that call, and the one fix for
    both (call it on every rank); reported here too, it would be the same bug twice with advice
    that moves nothing."""
    after = script.order(loop)
    carriers = _built_after(script, loop, target.split(".")[0])
    for call in all_calls:
        if script.order(call) <= after:
            continue
        # a method of the accelerator, or Accelerate's own function (``val_results =
        # gather_object(val_results)`` from accelerate.utils, a VAE trainer's validation)
        if _is_collective(call, accelerators) or combines_ranks(script, call):
            held = carriers | _comprehension_carriers(script, call, carriers)
            if not any(_mentions(argument.value, held) for argument in call.args):
                continue
        elif not _combining_method(script, call, carriers, accelerators):
            continue
        if "." in target or _used_before(script, loop, carriers, call, accelerators) is None:
            return True  # ``self.total``: what reads ``self`` is no read of the total
    return False


def _comprehension_carriers(script: ScriptModel, call: cst.Call, carriers: set[str]) -> set[str]:
    """The names a comprehension around ``call`` binds from a carrier: ``v`` of ``{k:
    accelerator.gather_for_metrics(v).sum() for k, v in val_logs.items()}`` (a Whisper
    fine-tune's dict of totals, each combined across the ranks)."""
    found: set[str] = set()
    for around in script.ancestors(call):
        if isinstance(around, (cst.FunctionDef, cst.Lambda)):
            break
        if isinstance(around, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
            clause: cst.CompFor | None = around.for_in
            while clause is not None:
                if _mentions(clause.iter, carriers | found):
                    found |= target_names(clause.target)
                clause = clause.inner_for_in
    return found


def _combining_method(
    script: ScriptModel, call: cst.Call, carriers: set[str], accelerators: set[str]
) -> bool:
    """``evaluator.result()`` where ``evaluator`` holds the totals and the method (of a class of
    the file) reaches a gather or reduce: the object combines its own totals across the ranks
    (a meter whose ``result`` reduces ``[self.correct, self.total]``)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and (root_name(func.value) or "") in carriers):
        return False
    found = script.call_graph.callee(call)
    if found is None:
        return False
    reach = facts_of(script).collective_reach
    return any(
        _is_collective(collective, accelerators) for collective, _ in reach.reached_by(found[0])
    )


def _used_before(
    script: ScriptModel,
    loop: cst.CSTNode,
    carriers: set[str],
    collective: cst.Call,
    accelerators: set[str],
) -> cst.Name | None:
    """The first read of the total (or of what is built from it) after ``loop`` and before
    ``collective`` in the loop's scope that neither builds another carrier
    (``errs = torch.cat(errs)``, ``total /= n``) nor feeds a collective: the per-rank value
    was printed, logged or returned before anything combined it."""
    scope, start, end = script.scope_of(loop), script.order(loop), script.order(collective)
    for name in script.index.of_type(cst.Name):
        if name.value not in carriers or not start < script.order(name) < end:
            continue
        if script.scope_of(name) is not scope:
            continue
        parent = script.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            continue  # ``outputs.errs``: a member, not the total
        around = list(script.ancestors(name))
        if any(a is loop for a in around):
            continue  # in the loop (a comprehension's own element)
        if _truth_test(script, name):
            continue  # ``if values:`` before the gather reads whether it holds anything
        if _size_only(script, name):
            continue  # ``len(scores)``: how many this rank scored, not the numbers themselves
        if not any(_builds_or_combines(a, carriers, accelerators) for a in around):
            return name
    return None


def _truth_test(script: ScriptModel, name: cst.Name) -> bool:
    """``if values:`` (or ``if not values:``, ``while losses and ...:``): the test reads whether
    the collection is empty, not the per-rank numbers in it (a pore-signal trainer gathers
    ``torch.stack(values)`` under ``if values:``)."""
    child: cst.CSTNode = name
    for parent in script.ancestors(name):
        if isinstance(parent, (cst.If, cst.While)):
            return parent.test is child
        if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
            child = parent
            continue
        if isinstance(parent, cst.BooleanOperation):
            child = parent
            continue
        return False
    return False


def _size_only(script: ScriptModel, name: cst.Name) -> bool:
    """``len(change_list)`` (a reward-scoring script prints how many items each rank scored,
    then gathers the list with ``gather_for_metrics(..., use_gather_object=True)``): the read
    takes the collection's size, not the per-rank numbers in it."""
    parent = script.parent(name)
    if not isinstance(parent, cst.Arg):
        return False
    call = script.parent(parent)
    return (
        isinstance(call, cst.Call)
        and dotted(call.func) == "len"
        and len(call.args) == 1
        and call.args[0] is parent
    )


def _builds_or_combines(node: cst.CSTNode, carriers: set[str], accelerators: set[str]) -> bool:
    """``node`` assigns a carrier (``errs = torch.cat(errs)``), stores into one (``val_logs[
    "val_cer"] = metric.compute()``, another entry of a dict of totals gathered whole) or is a
    collective call."""
    if isinstance(node, cst.Assign):
        return any(
            target_names(t.target) & carriers
            or (isinstance(t.target, cst.Subscript) and root_name(t.target) in carriers)
            for t in node.targets
        )
    if isinstance(node, cst.AugAssign):
        return bool(target_names(node.target) & carriers)
    return isinstance(node, cst.Call) and _is_collective(node, accelerators)


def _built_after(script: ScriptModel, loop: cst.CSTNode, root: str) -> set[str]:
    """``root`` and the names assigned from it (or from one of those) after ``loop`` in its
    scope: the tensors a total is wrapped in on its way to a collective."""
    scope, after = script.scope_of(loop), script.order(loop)
    assigns = [
        node
        for node in script.index.of_type(cst.Assign)
        if isinstance(node, cst.Assign)
        and script.order(node) > after
        and script.scope_of(node) is scope
    ]
    names = {root}
    grew = True
    while grew:
        grew = False
        for assign in assigns:
            for target, value in _paired(assign):
                if not _mentions(value, names):
                    continue
                new = target_names(target) - names
                if new:
                    names |= new
                    grew = True
    return names


def _paired(assign: cst.Assign) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """Each target of ``assign`` with the value it gets: element by element for ``a, b = x,
    y`` (``preds, labels = torch.cat(all_preds), torch.cat(all_labels)``), else the whole
    value for each target."""
    value = assign.value
    found: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []
    for target in assign.targets:
        names = target.target
        if (
            isinstance(names, (cst.Tuple, cst.List))
            and isinstance(value, (cst.Tuple, cst.List))
            and len(names.elements) == len(value.elements)
            and not any(isinstance(e, cst.StarredElement) for e in value.elements)
        ):
            found += [
                (n.value, v.value) for n, v in zip(names.elements, value.elements, strict=True)
            ]
        else:
            found.append((names, value))
    return found
