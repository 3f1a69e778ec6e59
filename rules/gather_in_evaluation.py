from collections.abc import Iterator

import libcst as cst

from accelify.analysis.evaluation import (
    evaluates_each_batch,
    gather_counts_padding,
    gathers_batch_loss,
)
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.edits import rewrites
from accelify.edits.plan import Plan
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, loop_of

_EVAL = (
    HEADER
    + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
    + "with torch.no_grad():\n    for x, y in loader:\n"
)


class GatherInEvaluation(Rule):
    """``accelerator.gather`` in an evaluation loop keeps the samples repeated to give every rank
    a full last batch, so they are counted twice and the metric is off. ``gather_for_metrics``
    drops exactly those repeats. Not reported where the loop runs no forward pass, drops the
    repeats by hand (slicing the gathered tensors to the dataset's length) or gathers the batch's
    mean loss (the repeats are inside each mean, which ``gather_for_metrics`` does not undo)."""

    code = "ACC404"
    name = "gather-in-evaluation"
    message = (
        "Use accelerator.gather_for_metrics in evaluation: gather counts the padding samples twice"
    )
    why = "The last round is evened out with repeated samples; only gather_for_metrics drops them."
    bad = (
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
    )
    good = (
        _EVAL + "        preds = accelerator.gather_for_metrics(model(x))\n",
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
        # a training loop gathers its losses for logging: no evaluation, no padding to drop
        HEADER
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for x, y in loader:\n    loss = model(x).mean()\n    accelerator.backward(loss)\n"
        + "    logged = accelerator.gather(loss).mean()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        accelerators = script.names_of(Kind.ACCELERATOR)
        facts = facts_of(script)
        evaluating = {
            id(loop.node): loop for loop in script.loops if evaluates_each_batch(loop, script)
        } | {id(evaluation.loop.node): evaluation.loop for evaluation in facts.evaluations}
        for call in calls(script):
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "gather"):
                continue
            loop = loop_of(script, call)
            if (
                dotted(func.value) in accelerators
                and loop is not None
                and id(loop) in evaluating
                and gather_counts_padding(evaluating[id(loop)], call, facts)
                and not gathers_batch_loss(call)
                and not _result_dropped(script, call)
            ):
                yield self.finding(script, call, Plan.of(rewrites.use_gather_for_metrics(call)))


def _result_dropped(script: ScriptModel, call: cst.Call) -> bool:
    """``accelerator.gather(predictions)`` alone on its line (a GLUE LoRA script gathers twice
    and keeps the second): nothing is counted from it, padding or not."""
    return isinstance(script.parent(call), cst.Expr)
