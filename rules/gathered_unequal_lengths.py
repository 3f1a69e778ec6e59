from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from accelify.analysis.evaluation import (
    PaddingCollator,
    padding_collator,
    tokenizer_pads_to_its_longest,
)
from accelify.analysis.facts import facts_of
from accelify.analysis.objects import bound_arguments
from accelify.analysis.script_model import Loop, ScriptModel
from accelify.analysis.syntax import assigned_targets, dotted, keyword_value, target_names, walk
from accelify.lint.rule import Example, Finding, Rule, accelerator_name, calls, calls_accelerator

_GATHERS = frozenset({"gather", "gather_for_metrics"})


@dataclass
class _Helper:
    """A function the evaluation loop calls (``ids, mask = encode(tokenizer, batch)``,
    ``token_logprobs(model, ids, mask)``: common_dpo's), read as the loop is read: its body
    binds names above each ``return``, and a parameter stands for what the call hands it, read
    back in the caller."""

    script: ScriptModel  # the helper's module
    node: cst.FunctionDef
    handed: dict[str, cst.BaseExpression]
    caller: ScriptModel
    caller_loop: Scope
    call: cst.Call
    file: str | None  # the helper's module where it is not the linted one: ``utils.py``
    batch_names: frozenset[str] = frozenset()

    def handed_sequences(
        self, name: str, collator: PaddingCollator | None, depth: int
    ) -> str | None:
        """`_sequences` of what the call hands the parameter ``name``, read in the caller."""
        given = self.handed.get(name)
        if given is None:
            return None
        return _sequences(self.caller, self.caller_loop, self.call, given, collator, depth)

    def handed_encoding(self, name: str) -> str | None:
        """`_encoding` of what the call hands the parameter ``name``, read in the caller."""
        given = self.handed.get(name)
        return None if given is None else _encoding(self.caller, self.caller_loop, self.call, given)


#: Where names are read: the evaluation loop, or a helper it calls.
Scope = Loop | _Helper

#: Batch fields that are token sequences whatever the task; ``labels`` is one only where the
#: collator pads labels (token classification, seq2seq, language modelling).
_SEQUENCE_FIELDS = ("input_ids", "attention_mask", "token_type_ids", "decoder_input_ids")
_LABELS = ("labels", "label_ids")
#: Model outputs with one value per token of the batch: as long as its padded sequences.
_PER_TOKEN_OUTPUTS = ("start_logits", "end_logits")
#: Methods that hand back a tensor of the same shape.
_SAME_SHAPE = ("cpu", "cuda", "to", "contiguous", "detach", "long", "int", "clone")
#: Methods that keep one value per token: a per-token tensor stays one (log-probabilities).
_PER_TOKEN = ("log_softmax", "softmax", "float", "half", "exp", "log", "sigmoid")
#: Fields of a tokenizer's output that are as long as its longest text.
_ENCODED_FIELDS = ("input_ids", "attention_mask", "token_type_ids")
#: How many renames of a gathered name, and calls of the helpers that make it, are followed back
#: to what it was made from.
_DEPTH = 10

_NER = (
    "import torch\n"
    "from torch.utils.data import DataLoader\nfrom accelerate import Accelerator\n"
    "from transformers import DataCollatorForTokenClassification\n"
    "accelerator = Accelerator()\n"
    "collator = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8)\n"
    "loader = DataLoader(eval_set, collate_fn=collator, batch_size=8)\n"
    "model, loader = accelerator.prepare(model, loader)\n"
    "for batch in loader:\n"
    "    with torch.no_grad():\n"
    "        outputs = model(**batch)\n"
    "    predictions = outputs.logits.argmax(dim=-1)\n"
    "    labels = batch['labels']\n"
)
_SUMMARIES = (
    "import torch\n"
    "from torch.utils.data import DataLoader\nfrom accelerate import Accelerator\n"
    "from transformers import DataCollatorForSeq2Seq\n"
    "accelerator = Accelerator()\n"
    "collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)\n"
    "loader = DataLoader(eval_set, collate_fn=collator, batch_size=8)\n"
    "model, loader = accelerator.prepare(model, loader)\n"
    "for batch in loader:\n"
    "    with torch.no_grad():\n"
    "        tokens = accelerator.unwrap_model(model).generate(batch['input_ids'])\n"
)


#: Hugging Face's run_qa_no_trainer evaluation: each batch padded to its longest sequence.
_QA = (
    "import torch\n"
    "from torch.utils.data import DataLoader\nfrom accelerate import Accelerator\n"
    "from transformers import DataCollatorWithPadding\n"
    "accelerator = Accelerator()\n"
    "collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)\n"
    "loader = DataLoader(eval_set, collate_fn=collator, batch_size=8)\n"
    "model, loader = accelerator.prepare(model, loader)\n"
    "for batch in loader:\n"
    "    with torch.no_grad():\n"
    "        outputs = model(**batch)\n"
    "    start_logits = outputs.start_logits\n"
    "    end_logits = outputs.end_logits\n"
    "{padded}"
    "    all_start.append(accelerator.gather_for_metrics(start_logits).cpu().numpy())\n"
    "    all_end.append(accelerator.gather_for_metrics(end_logits).cpu().numpy())\n"
)

#: The NER evaluation with its gather in a helper called per batch.
_PER_BATCH_HELPER = (
    _NER.split("for batch in loader:")[0] + "def compute(logits, labels):\n"
    "    preds = logits.argmax(dim=-1)\n"
    "{padded}"
    "    preds, labels = accelerator.gather((preds, labels))\n"
    "    metric.add_batch(predictions=preds, references=labels)\n"
    "for batch in loader:\n"
    "    with torch.no_grad():\n"
    "        outputs = model(**batch)\n"
    "    compute(outputs.logits, batch['labels'])\n"
)


#: A text-to-text evaluation (lintreal43, a T5 table-QA eval): the batch's fields unpacked
#: in one tuple assignment, the generations padded across the processes, the inputs not.
_UNPACKED = (
    "from torch.utils.data import DataLoader\nfrom accelerate import Accelerator\n"
    "from transformers import DataCollatorWithPadding\n"
    "accelerator = Accelerator()\n"
    "device = accelerator.device\n"
    "loader = DataLoader(eval_set, batch_size=8, collate_fn=DataCollatorWithPadding(tokenizer))\n"
    "model, loader = accelerator.prepare(model, loader)\n"
    "for step, inputs in enumerate(loader):\n"
    "    ids, targets = inputs['input_ids'].to(device), inputs['labels'].to(device)\n"
    "    preds = accelerator.unwrap_model(model).generate(input_ids=ids, max_length=256)\n"
    "    preds = accelerator.pad_across_processes(preds, dim=1, pad_index=tokenizer.pad_token_id)\n"
    "{padded}"
    "    preds, ids, targets = accelerator.gather_for_metrics((preds, ids, targets))\n"
)


#: common_dpo's evaluation: each rank tokenizes its own texts, padded to their longest, and
#: gathers the log-probabilities of that batch.
_TOKENIZED_HERE = (
    "import torch\nfrom accelerate import Accelerator\n"
    "accelerator = Accelerator()\n"
    "model, loader = accelerator.prepare(model, loader)\n"
    "for batch in loader:\n"
    "    enc = tokenizer(batch['text'], padding={padding}, return_tensors='pt')"
    ".to(accelerator.device)\n"
    "    with torch.no_grad():\n"
    "        logprobs = model(**enc).logits.log_softmax(-1)[:, :-1]\n"
    "{between}"
    "    logprobs = accelerator.gather_for_metrics(logprobs)\n"
)


#: common_dpo's trainer: the chosen texts tokenized by a helper that returns a tuple, and their
#: per-token log-probabilities computed by another (``{reduced}`` after them), gathered
#: (``{padded}`` before).
_DPO_HELPERS = (
    "import torch\nfrom accelerate import Accelerator\n"
    "accelerator = Accelerator()\n"
    "def encode(tokenizer, batch):\n"
    "    chosen = tokenizer(batch['chosen'], padding=True, return_tensors='pt')\n"
    "    return chosen['input_ids'], chosen['attention_mask']\n"
    "def token_logprobs(model, input_ids, attention_mask):\n"
    "    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits\n"
    "    logprobs = logits[:, :-1].log_softmax(-1)\n"
    "    return torch.gather(logprobs, 2, input_ids[:, 1:, None]).squeeze(-1){reduced}\n"
    "model, loader = accelerator.prepare(model, loader)\n"
    "for batch in loader:\n"
    "    chosen_ids, chosen_mask = encode(tokenizer, batch)\n"
    "    with torch.no_grad():\n"
    "        chosen_logps = token_logprobs(model, chosen_ids, chosen_mask)\n"
    "{padded}"
    "    chosen_logps = accelerator.gather_for_metrics(chosen_logps)\n"
)


class GatheredUnequalLengths(Rule):
    """A gather of token sequences whose length differs from rank to rank: the batches of a
    loader whose collator pads each batch to its own longest sequence
    (``DataCollatorWithPadding``, ``DataCollatorForSeq2Seq``, ``pad_to_multiple_of=8``, a
    ``collate_fn`` that calls ``pad_sequence``), and what ``generate`` returns (it stops when
    the batch's sequences end). ``gather`` joins the ranks' tensors along the first dimension
    and needs every other dimension equal: rank 0's batch padded to 37 tokens and rank 1's to
    52 fail the gather (a size mismatch, or a hang on NCCL) on the first evaluation batch of
    any run with more than one process. Hugging Face's examples pad first:
    ``accelerator.pad_across_processes(x, dim=1, pad_index=...)`` (run_ner_no_trainer,
    run_summarization_no_trainer). Flattened first (``preds.flatten()``, ``labels.view(-1)``),
    each rank's tensor is its batch times its own longest sequence long, and the gather fails
    the same way: pad the per-token tensor, gather it whole, flatten after. Also a batch the
    loop tokenizes itself (``tokenizer(texts, padding=True, return_tensors="pt")``, there or in
    a helper of the file that returns the encoding: common_dpo's evaluation): its token ids,
    and a language model's log-probabilities of it (its logits shifted along the sequence,
    ``[:, :-1]``; a classifier's logits are one row per text and are left alone). Not
    reported for a value padded so first, for a collator or tokenizer told
    ``padding="max_length"``, for a value reduced to one number per text before the gather,
    nor for a sequence-classification label (one per sample)."""

    code = "ACC413"
    name = "gathered-unequal-lengths"
    message = (
        "Pad to one length before the gather: accelerator.pad_across_processes(x, dim=1, "
        "pad_index=...); each rank's batch is padded to its own longest sequence, so the "
        "gather fails (size mismatch) or hangs"
    )
    why = "gather needs every dimension but the first equal on every rank."
    bad = (
        Example(
            _NER + "    accelerator.gather_for_metrics((predictions, labels))\n",
            14,
            5,
        ),
        # lintreal41 (a NER trainer under Ray Tune): the model returns ``(loss, logits)``, and
        # the argmax of ``outputs[1]`` is one prediction per token of the padded batch
        Example(
            _NER.replace("outputs.logits.argmax", "outputs[1].argmax")
            + "    accelerator.gather(predictions)\n",
            14,
            5,
        ),
        Example(  # the generated tokens: their length is the longest generation of the batch
            _SUMMARIES + "    tokens = accelerator.gather(tokens.contiguous())\n",
            12,
            14,
        ),
        Example(  # a field of the batch, gathered inline, through DataCollatorWithPadding
            "from torch.utils.data import DataLoader\nfrom accelerate import Accelerator\n"
            "from transformers import DataCollatorWithPadding, default_data_collator\n"
            "accelerator = Accelerator()\n"
            "if args.pad_to_max_length:\n"
            "    collate = default_data_collator\n"
            "else:\n"
            "    collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)\n"
            "loader = DataLoader(eval_set, collate_fn=collate, batch_size=8)\n"
            "model, loader = accelerator.prepare(model, loader)\n"
            "for step, batch in enumerate(loader):\n"
            "    ids = accelerator.gather(batch['input_ids'])\n"
            "    texts += tokenizer.batch_decode(ids)\n",
            12,
            11,
        ),
        Example(  # a collate_fn of the file that pads with pad_sequence
            "import torch\n"
            "from torch.nn.utils.rnn import pad_sequence\n"
            "from torch.utils.data import DataLoader\nfrom accelerate import Accelerator\n"
            "def collate(items):\n"
            "    ids = pad_sequence([i['ids'] for i in items], batch_first=True)\n"
            "    tags = pad_sequence([i['tags'] for i in items], batch_first=True, "
            "padding_value=-100)\n"
            "    return {'input_ids': ids, 'labels': tags}\n"
            "accelerator = Accelerator()\n"
            "loader = DataLoader(eval_set, collate_fn=collate, batch_size=8)\n"
            "model, loader = accelerator.prepare(model, loader)\n"
            "for batch in loader:\n"
            "    preds = model(batch['input_ids']).logits.argmax(-1)\n"
            "    preds, tags = accelerator.gather_for_metrics((preds, batch['labels']))\n",
            14,
            19,
        ),
        # a question-answering evaluation gathers the start and end logits unpadded
        Example(
            _QA.format(padded=""),
            14,
            22,
        ),
        # gathered in a helper the loop calls per batch with the logits and the labels
        Example(_PER_BATCH_HELPER.format(padded=""), 11, 21),
        # flattened per-token predictions and labels: each rank's as long as its batch times
        # its own longest sequence (review11b)
        Example(
            _NER.replace("outputs.logits.argmax", "outputs[1].argmax")
            + "    predictions = predictions.flatten()\n"
            + "    predictions, labels = accelerator.gather_for_metrics(\n"
            + "        (predictions, labels.view(-1))\n    )\n",
            15,
            27,
        ),
        # the inputs unpacked from a tuple of the batch's fields, gathered unpadded beside
        # padded generations
        Example(_UNPACKED.format(padded=""), 12, 27),
        # a batch the loop tokenizes itself, padded to its own longest text (common_dpo)
        Example(_TOKENIZED_HERE.format(padding="True", between=""), 9, 16),
        # ... tokenized by a helper of the file the loop calls
        Example(
            _TOKENIZED_HERE.format(padding="True", between="")
            .replace(
                "    enc = tokenizer(batch['text'], padding=True, return_tensors='pt')",
                "    enc = encode(batch['text'])",
            )
            .replace(
                "accelerator = Accelerator()\n",
                "accelerator = Accelerator()\n"
                "def encode(texts):\n"
                "    enc = tokenizer(texts, padding=True, truncation=True, return_tensors='pt')\n"
                "    return enc\n",
            ),
            12,
            16,
        ),
        # ... its token predictions, and the token ids themselves
        Example(
            _TOKENIZED_HERE.format(padding="'longest'", between="").replace(
                "gather_for_metrics(logprobs)",
                "gather_for_metrics((logprobs.argmax(-1), enc['input_ids']))",
            ),
            9,
            16,
        ),
        # ... tokenized by a helper that returns the ids and the mask as a tuple, and the
        # per-token log-probabilities computed by another helper (common_dpo)
        Example(_DPO_HELPERS.format(reduced="", padded=""), 16, 20),
        # ... the helper returning the ids and the mask in a dict
        Example(
            _DPO_HELPERS.format(reduced="", padded="")
            .replace(
                "return chosen['input_ids'], chosen['attention_mask']",
                "return {'ids': chosen['input_ids'], 'mask': chosen['attention_mask']}",
            )
            .replace(
                "    chosen_ids, chosen_mask = encode(tokenizer, batch)\n",
                "    chosen = encode(tokenizer, batch)\n",
            )
            .replace(
                "token_logprobs(model, chosen_ids, chosen_mask)",
                "token_logprobs(model, chosen['ids'], chosen['mask'])",
            ),
            16,
            20,
        ),
    )
    good = (
        # common_dpo's log-probabilities padded across the processes first, as advised; or
        # summed to one per text by the helper
        _DPO_HELPERS.format(
            reduced="",
            padded="    chosen_logps = accelerator.pad_across_processes(chosen_logps, dim=1)\n",
        ),
        _DPO_HELPERS.format(reduced=".sum(-1)", padded=""),
        # ... the inputs padded across the processes too
        _UNPACKED.format(
            padded="    ids = accelerator.pad_across_processes(ids, dim=1, "
            "pad_index=tokenizer.pad_token_id)\n"
        ),
        # unpacked from one call's result: its parts are not known
        _UNPACKED.format(padded="").replace(
            "inputs['input_ids'].to(device), inputs['labels'].to(device)",
            "encode_pair(inputs)",
        ),
        # a sequence classifier's ``(loss, logits)``: one prediction per sample, whatever the
        # batch's sequence length (DataCollatorWithPadding pads no labels)
        _NER.replace("DataCollatorForTokenClassification", "DataCollatorWithPadding").replace(
            "outputs.logits.argmax", "outputs[1].argmax"
        )
        + "    accelerator.gather_for_metrics((predictions, labels))\n",
        # run_qa_no_trainer pads them first, with -100
        _QA.format(
            padded="    start_logits = accelerator.pad_across_processes(start_logits, dim=1, "
            "pad_index=-100)\n"
            "    end_logits = accelerator.pad_across_processes(end_logits, dim=1, pad_index=-100)\n"
        ),
        # the helper pads both before its gather
        _PER_BATCH_HELPER.format(
            padded="    preds = accelerator.pad_across_processes(preds, dim=1, pad_index=-100)\n"
            "    labels = accelerator.pad_across_processes(labels, dim=1, pad_index=-100)\n"
        ),
        # padded across the processes first, as run_ner_no_trainer does
        _NER
        + "    if not args.pad_to_max_length:\n"
        + "        predictions = accelerator.pad_across_processes(predictions, dim=1, "
        + "pad_index=-100)\n"
        + "        labels = accelerator.pad_across_processes(labels, dim=1, pad_index=-100)\n"
        + "    accelerator.gather_for_metrics((predictions, labels))\n",
        _SUMMARIES
        + "    tokens = accelerator.pad_across_processes(tokens, dim=1, "
        + "pad_index=tokenizer.pad_token_id)\n"
        + "    labels = accelerator.pad_across_processes(batch['labels'], dim=1, "
        + "pad_index=tokenizer.pad_token_id)\n"
        + "    tokens, labels = accelerator.gather_for_metrics((tokens, labels))\n",
        # sequence classification (run_glue_no_trainer): one prediction and label per sample
        "import torch\n"
        "from torch.utils.data import DataLoader\nfrom accelerate import Accelerator\n"
        "from transformers import DataCollatorWithPadding\n"
        "accelerator = Accelerator()\n"
        "collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)\n"
        "loader = DataLoader(eval_set, collate_fn=collator, batch_size=8)\n"
        "model, loader = accelerator.prepare(model, loader)\n"
        "for batch in loader:\n"
        "    with torch.no_grad():\n"
        "        outputs = model(**batch)\n"
        "    predictions = outputs.logits.argmax(dim=-1)\n"
        "    predictions, references = accelerator.gather_for_metrics(\n"
        "        (predictions, batch['labels']))\n",
        # a collate_fn that pads the inputs only: one label per sample
        "from torch.nn.utils.rnn import pad_sequence\n"
        "from torch.utils.data import DataLoader\nfrom accelerate import Accelerator\n"
        "def collate(items):\n"
        "    ids = pad_sequence([i['ids'] for i in items], batch_first=True)\n"
        "    return {'input_ids': ids, 'labels': torch.tensor([i['y'] for i in items])}\n"
        "accelerator = Accelerator()\n"
        "loader = DataLoader(eval_set, collate_fn=collate, batch_size=8)\n"
        "model, loader = accelerator.prepare(model, loader)\n"
        "for batch in loader:\n"
        "    preds = model(batch['input_ids']).logits.argmax(-1)\n"
        "    preds, y = accelerator.gather_for_metrics((preds, batch['labels']))\n",
        # padded to one length by the collator itself
        _NER.replace("pad_to_multiple_of=8", "padding='max_length', max_length=128")
        + "    accelerator.gather_for_metrics((predictions, labels))\n",
        # ... padded, gathered whole, and flattened after the gather
        _NER.replace("outputs.logits.argmax", "outputs[1].argmax")
        + "    predictions = accelerator.pad_across_processes(predictions, dim=1, pad_index=-100)\n"
        + "    labels = accelerator.pad_across_processes(labels, dim=1, pad_index=-100)\n"
        + "    predictions, labels = accelerator.gather_for_metrics((predictions, labels))\n"
        + "    predictions, labels = predictions.flatten(), labels.flatten()\n",
        # a classifier's class probabilities and predictions of a tokenized batch: one row per
        # text, whatever its length
        _TOKENIZED_HERE.format(padding="True", between="").replace(
            "model(**enc).logits.log_softmax(-1)[:, :-1]", "model(**enc).logits.softmax(-1)"
        ),
        _TOKENIZED_HERE.format(padding="True", between="").replace(
            "model(**enc).logits.log_softmax(-1)[:, :-1]", "model(**enc).logits.argmax(-1)"
        ),
        # gathered as Python objects
        _TOKENIZED_HERE.format(padding="True", between="").replace(
            "gather_for_metrics(logprobs)", "gather_for_metrics(logprobs, use_gather_object=True)"
        ),
        # the loop's own tokenization padded to one length, or the log-probabilities padded
        # across the processes, or reduced to one number per text before the gather
        _TOKENIZED_HERE.format(padding="'max_length', max_length=128", between=""),
        _TOKENIZED_HERE.format(
            padding="True",
            between="    logprobs = accelerator.pad_across_processes(logprobs, dim=1)\n",
        ),
        _TOKENIZED_HERE.format(
            padding="True",
            between="    logprobs = (logprobs * enc['attention_mask'][:, 1:]).sum(-1)\n",
        ),
        # a per-sample value computed from the sequences: one number per sample
        _NER
        + "    lengths = batch['attention_mask'].sum(-1)\n"
        + "    accelerator.gather_for_metrics(lengths)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        loops = {id(loop.node): loop for loop in script.loops}
        for call in calls(script):
            if not calls_accelerator(script, call, _GATHERS) or not call.args:
                continue
            as_objects = keyword_value(call, "use_gather_object")
            if as_objects is not None and dotted(as_objects) == "True":
                continue  # gathered as Python objects: no shape to agree on
            loop = _innermost_loop(script, call, loops)
            if loop is None:
                unequal = _through_call_sites(script, call, loops)
            elif not facts.flow.over_prepared_loader(loop):
                continue
            else:
                collator = padding_collator(loop, facts)
                unequal = []
                for element in _elements(call.args[0].value):
                    flat: list[cst.Call] = []
                    what = _sequences(script, loop, call, element, collator, 0, flat)
                    if what is not None and not what.startswith(_LOGITS):
                        unequal.append((element, what, flat[0] if flat else None))
            if not unequal:
                continue
            accelerator = accelerator_name(script, call)
            fixes = "; ".join(_fix(script, accelerator, *found) for found in unequal)
            flattened = any(flat is not None for _, _, flat in unequal)
            needs = "the shapes" if flattened else "every dimension but the first"
            whats = "; ".join(f"{script.module.code_for_node(e)}: {what}" for e, what, _ in unequal)
            if any(_tokenized(what) for _, what, _ in unequal):
                fixes += (
                    " (or have the tokenizer pad every batch to one length: "
                    "padding='max_length', max_length=...)"
                )
            yield self.finding(
                script,
                call,
                message=(
                    f"Pad to one length before the gather: {fixes}. Each rank's value is as "
                    f"long as its own batch's longest sequence ({whats}), and the gather needs "
                    f"{needs} equal on every rank (a size-mismatch error, or a hang)"
                ),
            )


def _fix(
    script: ScriptModel,
    accelerator: str,
    element: cst.BaseExpression,
    what: str,
    flat: cst.Call | None = None,
) -> str:
    """``x = accelerator.pad_across_processes(x, dim=1, pad_index=-100)`` before the gather for
    a name, the padded value gathered in place of an expression; labels and token predictions
    padded with -100 (what the loss and the metrics skip), per-token logits with -100 too (as
    run_qa_no_trainer pads them: below any real logit), token ids with the pad token."""
    code = script.module.code_for_node(element)
    if flat is None and what.startswith("per-token values"):
        # log-probabilities of a tokenized batch: padded with 0s (the attention mask, padded
        # the same way, is 0 there too)
        padded = f"{accelerator}.pad_across_processes({code}, dim=1)"
        return f"{code} = {padded}" if isinstance(element, cst.Name) else f"gather {padded}"
    pad = (
        "-100"
        if what.startswith(("label", "token predictions", "per-token"))
        else _pad_token(script)
    )
    if flat is not None:
        # flattened, each rank's value is its batch times its own longest sequence long, and
        # gather_for_metrics would drop the last batch's repeated samples by token: pad the
        # per-token tensor, gather it whole, flatten after
        whole = script.module.code_for_node(flat.func.value)  # type: ignore[attr-defined]
        padded = f"{accelerator}.pad_across_processes({whole}, dim=1, pad_index={pad})"
        where = f"before line {script.line(flat)} flattens it"
        if isinstance(element, cst.Name):
            return f"{whole} = {padded} {where}, gather it unflattened and flatten the result"
        return f"gather {padded} in place of {code} and flatten the result"
    padded = f"{accelerator}.pad_across_processes({code}, dim=1, pad_index={pad})"
    if isinstance(element, cst.Name):
        return f"{code} = {padded}"
    return f"gather {padded} instead of {code}"


def _through_call_sites(
    script: ScriptModel, gather: cst.Call, loops: dict[int, Loop]
) -> list[tuple[cst.BaseExpression, str, cst.Call | None]]:
    """A gather in a helper the evaluation loop calls per batch (``def compute(logits, labels):
    accelerator.gather((logits.argmax(-1), labels))``): each gathered parameter stands for what
    a call site in a loop over a prepared loader hands it, and a local of the helper for its
    one assignment there (``preds = logits.argmax(-1)``)."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(gather)
    if function is None:
        return []
    assigned: dict[str, list[cst.BaseExpression]] = {}
    for node in walk(function.body):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            target = node.targets[0].target
            if isinstance(target, cst.Name) and script.order(node) < script.order(gather):
                assigned.setdefault(target.value, []).append(node.value)
    found: list[tuple[cst.BaseExpression, str, cst.Call | None]] = []
    for site, implicit in script.call_graph.calls_of(function):
        loop = _innermost_loop(script, site, loops)
        if loop is None or not facts.flow.over_prepared_loader(loop):
            continue
        collator = padding_collator(loop, facts)
        passed = {n: a.value for n, a in bound_arguments(function, site, implicit)}
        for element in _elements(gather.args[0].value):
            value: cst.BaseExpression | None = element
            if isinstance(element, cst.Name):
                bound = assigned.get(element.value, [])
                if len(bound) == 1:
                    value = bound[0]
                elif not bound and element.value in passed:
                    value = passed[element.value]
                else:
                    value = None  # bound again in the helper (padded there, perhaps)
            if value is None or any(e is element for e, _, _ in found):
                continue
            flat: list[cst.Call] = []
            what = _sequences(script, loop, site, value, collator, 0, flat)
            if what is not None and not what.startswith(_LOGITS):
                handed = f"{what}, handed in at line {script.line(site)}"
                found.append((element, handed, flat[0] if flat else None))
    return found


def _innermost_loop(script: ScriptModel, call: cst.Call, loops: dict[int, Loop]) -> Loop | None:
    for ancestor in script.ancestors(call):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return None
        if isinstance(ancestor, cst.For) and id(ancestor) in loops:
            return loops[id(ancestor)]
    return None


def _elements(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """What a gather gathers: each element of a tuple or list, each value of a dict."""
    if isinstance(value, (cst.Tuple, cst.List)):
        return [e.value for e in value.elements if isinstance(e, cst.Element)]
    if isinstance(value, cst.Dict):
        return [e.value for e in value.elements if isinstance(e, cst.DictElement)]
    return [value]


def _sequences(
    script: ScriptModel,
    loop: Scope,
    gather: cst.CSTNode,
    value: cst.BaseExpression,
    collator: PaddingCollator | None,
    depth: int,
    flat: list[cst.Call] | None = None,
) -> str | None:
    """What makes ``value`` a batch of token sequences as long as this rank's batch, or None:
    ``generate`` output, a sequence field of a batch its collator pads, the token-level
    predictions of such a batch; through the names the loop binds before the gather (a name
    padded across the processes there is not followed: it is one length); and flattened
    (``.flatten()``, ``.view(-1)``), each rank's value as long as its batch times its longest
    sequence: the call is put in ``flat``."""
    if isinstance(value, cst.Call):
        func = value.func
        member = func.attr.value if isinstance(func, cst.Attribute) else dotted(func)
        if isinstance(func, cst.Attribute) and member in _SAME_SHAPE:
            # ``tokens.cpu()``, ``labels.to(device)``: the same lengths
            return _sequences(script, loop, gather, func.value, collator, depth, flat)
        if isinstance(func, cst.Attribute) and member in _PER_TOKEN:
            # ``logits.log_softmax(-1)``: one value per token still, where it was one
            inner = _sequences(script, loop, gather, func.value, collator, depth, flat)
            return inner if inner is not None and _tokenized(inner) else None
        if isinstance(func, cst.Attribute) and _flattens(value):
            inner = _sequences(script, loop, gather, func.value, collator, depth, flat)
            if inner is None:
                return None
            if flat is not None:
                flat.append(value)
            return f"{inner}, flattened at line {script.line(value)}"
        if member == "generate":
            return "token ids from generate, as long as the batch's longest generation"
        if member in ("gather", "torch.gather"):
            # ``logprobs.gather(-1, ids)``, ``torch.gather(logprobs, 2, ids)``: a value per
            # token picked from per-token values, one per token still
            inner = _gathered_from(value)
            what = (
                _sequences(script, loop, gather, inner, collator, depth, flat)
                if inner is not None
                else None
            )
            return what if what is not None and what.startswith(_PER_TOKEN_VALUES) else None
        squeezed = value.args[0].value if value.args else None
        if isinstance(func, cst.Attribute) and member == "squeeze" and _last_axis(squeezed):
            # ``picked.squeeze(-1)``: the index's last axis of one dropped, a value per token
            inner = _sequences(script, loop, gather, func.value, collator, depth, flat)
            return inner if inner is not None and _tokenized(inner) else None
        if member == "argmax" and _last_axis(_argmax_axis(value)):
            # the argmax of a tokenizer-padded batch's logits: one prediction per token
            inner = _argmax_receiver(value)
            inner_what = (
                None
                if inner is None
                else _sequences(script, loop, gather, inner, collator, depth, flat)
            )
            if inner_what is not None and _tokenized(inner_what):
                return inner_what
        if (
            member == "argmax"
            and collator is not None
            and collator.labels_padded
            and _last_axis(_argmax_axis(value))
            and (
                "logits" in script.module.code_for_node(value)
                or _forward_of_the_batch(script, loop, _argmax_receiver(value), gather)
            )
        ):
            return f"token predictions of batches {collator.name} pads"
        if depth < _DEPTH:
            return _returned_by_helper(script, loop, gather, value, None, collator, depth)
        return None
    if isinstance(value, cst.Subscript) and _cuts_along(value):
        # ``logprobs[:, :-1]``: as many dimensions, the sequence one a token shorter; the
        # logits so shifted are a language model's, one per token (a classifier's are one row
        # of class scores per text, as long on every rank)
        inner = _sequences(script, loop, gather, value.value, collator, depth, flat)
        if inner is None or not _tokenized(inner):
            return None
        if inner.startswith(_LOGITS) and _shifts_the_sequence(value):
            return f"{_PER_TOKEN_VALUES} of{inner.removeprefix(_LOGITS)}"
        return inner
    entry = _entry_of_a_helper(script, loop, gather, value, collator, depth)
    if entry is not None:
        return entry
    tokenized = _tokenized_here(script, loop, gather, value, depth)
    if tokenized is not None:
        return tokenized
    field = _field(value)
    if field is not None and collator is not None and _batch_read(loop, value):
        if field in _SEQUENCE_FIELDS or (field in _LABELS and collator.labels_padded):
            kind = "labels" if field in _LABELS else "token ids"
            return f"{kind} padded by {collator.name}"
        return None
    if field in _PER_TOKEN_OUTPUTS and collator is not None:
        # ``outputs.start_logits`` of a question-answering model: one logit per token
        return f"per-token {field} of batches {collator.name} pads"
    if not isinstance(value, cst.Name) or depth >= _DEPTH:
        return None
    latest = None
    part: tuple[cst.Call, int] | None = None  # ``ids, mask = encode(...)``: what it returns
    bound: cst.CSTNode = gather
    for node in walk(loop.node.body):
        if not isinstance(node, (cst.Assign, cst.AnnAssign)) or node.value is None:
            continue
        if script.order(node) >= script.order(gather) or any(
            a is node for a in script.ancestors(gather)
        ):
            continue
        for target in assigned_targets(node):
            if value.value in target_names(target):
                if _pads_across(node.value):
                    return None  # padded first (under a flag too: that run is padded)
                # unpacked: followed only from a tuple of as many values, element by element
                latest = (
                    node.value
                    if isinstance(target, cst.Name)
                    else _paired_value(target, node.value, value.value)
                )
                part = _unpacked_call(target, node.value, value.value)
                bound = node
    if part is not None:
        return _returned_by_helper(script, loop, bound, part[0], part[1], collator, depth + 1)
    if latest is None and bound is gather and isinstance(loop, _Helper):
        return loop.handed_sequences(value.value, collator, depth + 1)
    if latest is None:
        return None
    # what it was made from, read above that binding (``preds = preds.flatten()``)
    return _sequences(script, loop, bound, latest, collator, depth + 1, flat)


_TOKENIZED = "tokenized with padding=True at"
_PER_TOKEN_VALUES = "per-token values"
#: A model's logits for a tokenized batch: per token for a language model, per text for a
#: classifier; reported only once shifted along the sequence (`_shifts_the_sequence`).
_LOGITS = "logits of"


def _tokenized(what: str) -> bool:
    """``what`` (`_sequences`) is padded by a tokenizer call in the loop."""
    return _TOKENIZED in what


def _tokenized_here(
    script: ScriptModel,
    loop: Scope,
    gather: cst.CSTNode,
    value: cst.BaseExpression,
    depth: int = _DEPTH,
) -> str | None:
    """``enc["input_ids"]`` (or ``enc.input_ids``) of ``enc = tokenizer(texts, padding=True,
    return_tensors="pt")`` bound in the loop above ``gather``, and the ``.logits`` of a forward
    handed such an encoding (``model(**enc).logits``, or of ``out = model(**enc)``): as long
    as this rank's longest text, a length the other ranks' batches do not share."""
    field = _field(value)
    owner = value.value if isinstance(value, cst.Subscript | cst.Attribute) else None
    if owner is None:
        return None
    if field in _ENCODED_FIELDS:
        place = _encoding(script, loop, gather, owner)
        if place is not None:
            return f"token ids {_TOKENIZED} {place}"
        return None
    if field != "logits":
        return None
    forward = owner
    if isinstance(owner, cst.Name):
        forward = _bound_in_loop(script, loop, gather, owner.value)  # ``out = model(**enc)``
    if not isinstance(forward, cst.Call):
        return None
    for argument in forward.args:
        handed = argument.value
        if isinstance(handed, cst.Subscript | cst.Attribute) and _field(handed) in _ENCODED_FIELDS:
            handed = handed.value
        place = _encoding(script, loop, gather, handed)
        if place is not None:
            return f"{_LOGITS} a batch {_TOKENIZED} {place}"
        # token ids a helper returned (``ids, mask = encode(...)``, then ``model(ids, mask)``)
        ids = (
            _sequences(script, loop, gather, argument.value, None, depth + 1)
            if depth < _DEPTH
            else None
        )
        if ids is not None and ids.startswith("token ids") and _tokenized(ids):
            return f"{_LOGITS} a batch {ids.removeprefix('token ids ')}"
    return None


def _encoding(
    script: ScriptModel, loop: Scope, gather: cst.CSTNode, value: cst.BaseExpression
) -> str | None:
    """Where the tokenizer call that pads to its longest text is, which ``value`` (a name bound
    in the loop above ``gather``, or the call itself, moved to a device; in a helper, what its
    call hands a parameter) is: ``line 12``, or ``utils.py:12`` in another module."""
    if isinstance(value, cst.Name):
        bound = _bound_in_loop(script, loop, gather, value.value)
        if bound is None and isinstance(loop, _Helper):
            return loop.handed_encoding(value.value)
        value = bound if bound is not None else value
    value = _unmoved(value)  # ``tokenizer(...).to(device)``
    if isinstance(value, cst.Call) and tokenizer_pads_to_its_longest(value):
        return _place(script, loop, value)
    found = _returned_encoding(script, value) if isinstance(value, cst.Call) else None
    return _place(script, loop, found) if found is not None else None


def _unmoved(value: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """``enc`` of ``enc.to(device)``, ``enc.cpu()``: what a same-shape call is made on."""
    while (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _SAME_SHAPE
    ):
        value = value.func.value
    return value


def _returned_encoding(script: ScriptModel, call: cst.Call) -> cst.Call | None:
    """The padding tokenizer call a function of the file returns, where ``call`` runs it
    (``def encode(texts): enc = tokenizer(texts, padding=True, return_tensors="pt"); return
    enc``): every ``return`` hands back that encoding (moved to a device perhaps)."""
    callee = script.call_graph.callee(call)
    if callee is None:
        return None
    function = callee[0]
    # its own returns, a bare one included (it hands back no encoding); not those of the
    # functions defined inside it
    returns = [r for r in script.index.own_nodes(function) if isinstance(r, cst.Return)]
    found = None
    for returned in returns:
        value = returned.value
        value = _unmoved(value)
        if isinstance(value, cst.Name):
            bound = [
                a.value
                for a in script.index.assignments_to(value.value)
                if script.index.enclosing_function(a) is function
            ]
            value = bound[0] if len(bound) == 1 else None
        value = _unmoved(value)
        if not (isinstance(value, cst.Call) and tokenizer_pads_to_its_longest(value)):
            return None
        found = found or value
    return found


def _bound_in_loop(
    script: ScriptModel, loop: Scope, gather: cst.CSTNode, name: str
) -> cst.BaseExpression | None:
    """What ``name`` was last bound to by a plain assignment in the loop above ``gather``."""
    latest = None
    for node in walk(loop.node.body):
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0].target, cst.Name)
            and node.targets[0].target.value == name
            and script.order(node) < script.order(gather)
        ):
            latest = node.value
    return latest


def _returned_by_helper(
    script: ScriptModel,
    loop: Scope,
    gather: cst.CSTNode,
    call: cst.Call,
    part: tuple[int, int] | str | None,
    collator: PaddingCollator | None,
    depth: int,
) -> str | None:
    """What a helper of the file or of another module of the project returns (`_sequences` of
    each of its own ``return`` values, read in it with what ``call`` hands its parameters),
    where every return agrees: the whole value, the element at ``part`` (position, count) of
    a returned tuple of that many (``return enc["input_ids"], enc["attention_mask"]``), or the
    value at the key ``part`` of a returned dict (``return {"ids": enc["input_ids"]}``). A value
    flattened inside the helper is not followed: the padding belongs before the flattening."""
    helper = _helper_of(script, loop, call)
    if helper is None:
        return None
    found = None
    for returned in helper.script.index.own_nodes(helper.node):
        if not isinstance(returned, cst.Return):
            continue
        value = returned.value
        if isinstance(part, str):
            value = _keyed(value, part)
        elif part is not None:
            value = _element(value, *part)
        what = (
            _sequences(helper.script, helper, returned, value, collator, depth + 1)
            if value is not None
            else None
        )
        if what is None or "flattened" in what:
            return None
        found = found or what
    if found is None:
        return None
    name = helper.node.name.value
    return f"{found}, from {name}() at {_place(helper.script, helper, helper.node)}"


def _helper_of(script: ScriptModel, loop: Scope, call: cst.Call) -> _Helper | None:
    """The function ``call`` runs, as a `_Helper`: one of this module (`call_graph`), or one of
    another module of the project (`ProjectView.function_called`)."""
    callee = script.call_graph.callee(call)
    if callee is not None:
        function, implicit = callee
        helper_script = script
        file = loop.file if isinstance(loop, _Helper) else None
    else:
        project = script.project
        found = project.function_called(script, call) if project is not None else None
        if found is None:
            return None
        function, helper_script, path = found
        implicit = 1 if helper_script.index.enclosing_class(function) is not None else 0
        file = os.path.relpath(path, project.path.parent)  # type: ignore[union-attr]
    handed = {parameter: a.value for parameter, a in bound_arguments(function, call, implicit)}
    return _Helper(helper_script, function, handed, script, loop, call, file)


def _place(script: ScriptModel, loop: Scope, node: cst.CSTNode) -> str:
    """``line 12`` of ``node``; ``utils.py:12`` where it is in a helper of another module."""
    if isinstance(loop, _Helper) and loop.file is not None:
        return f"{loop.file}:{script.line(node)}"
    return f"line {script.line(node)}"


def _unpacked_call(
    target: cst.BaseExpression, value: cst.BaseExpression, name: str
) -> tuple[cst.Call, tuple[int, int]] | None:
    """``ids, mask = encode(tokenizer, batch)``: the call, with the position of ``name`` among
    the plain names of the target and their count."""
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(value, cst.Call):
        return None
    names = target.elements
    if any(not isinstance(e.value, cst.Name) or isinstance(e, cst.StarredElement) for e in names):
        return None
    for position, element in enumerate(names):
        if element.value.value == name:  # type: ignore[attr-defined]
            return value, (position, len(names))
    return None


def _entry_of_a_helper(
    script: ScriptModel,
    loop: Scope,
    gather: cst.CSTNode,
    value: cst.BaseExpression,
    collator: PaddingCollator | None,
    depth: int,
) -> str | None:
    """``enc["ids"]`` of ``enc = encode(tokenizer, texts)`` bound above ``gather``, where the
    helper returns a dict: what it returns at that key (`_returned_by_helper`)."""
    key = _field(value) if isinstance(value, cst.Subscript) else None
    if key is None or not isinstance(value.value, cst.Name) or depth >= _DEPTH:  # type: ignore[attr-defined]
        return None
    bound = _bound_in_loop(script, loop, gather, value.value.value)  # type: ignore[attr-defined]
    if not isinstance(bound, cst.Call):
        return None
    return _returned_by_helper(script, loop, gather, bound, key, collator, depth + 1)


def _keyed(value: cst.BaseExpression | None, key: str) -> cst.BaseExpression | None:
    """The value at the string ``key`` of a dict display (``{"ids": ids, "mask": mask}``)."""
    if not isinstance(value, cst.Dict):
        return None
    for element in value.elements:
        if (
            isinstance(element, cst.DictElement)
            and isinstance(element.key, cst.SimpleString)
            and element.key.evaluated_value == key
        ):
            return element.value
    return None


def _element(
    value: cst.BaseExpression | None, position: int, count: int
) -> cst.BaseExpression | None:
    """The element at ``position`` of a tuple (or list) of ``count`` plain elements."""
    if not isinstance(value, (cst.Tuple, cst.List)) or len(value.elements) != count:
        return None
    if any(isinstance(e, cst.StarredElement) for e in value.elements):
        return None
    return value.elements[position].value


def _gathered_from(call: cst.Call) -> cst.BaseExpression | None:
    """``logprobs`` of ``logprobs.gather(-1, ids)`` and ``torch.gather(logprobs, 2, ids)``, where
    the values are picked along the last axis (each token's own)."""
    func = call.func
    positional = [a.value for a in call.args if a.keyword is None]
    if isinstance(func, cst.Attribute) and dotted(func.value) != "torch":
        source, axes = func.value, positional[:1]
    else:
        source = positional[0] if positional else None
        axes = positional[1:2]
    axis = keyword_value(call, "dim") or (axes[0] if axes else None)
    return source if _last_axis(axis) else None


def _shifts_the_sequence(value: cst.Subscript) -> bool:
    """``x[:, :-1]``, ``x[:, 1:, :]``: the second axis cut at one end, the next-token shift of
    a language model's logits."""
    if len(value.slice) < 2:
        return False
    second = value.slice[1].slice
    return isinstance(second, cst.Slice) and (second.lower is not None) != (
        second.upper is not None
    )


def _cuts_along(value: cst.Subscript) -> bool:
    """``x[:, :-1]``, ``x[:, 1:, :]``: every index a slice, so no dimension is dropped."""
    return all(isinstance(element.slice, cst.Slice) for element in value.slice)


def _paired_value(
    target: cst.BaseExpression, value: cst.BaseExpression, name: str
) -> cst.BaseExpression | None:
    """What ``name`` gets from ``ids, tags = batch["input_ids"].to(d), batch["labels"].to(d)``:
    the value at its position, where the target and the value are tuples (or lists) of as
    many plain elements; None for anything unpacked from one value (a call's result, a
    starred element), whose parts are not known."""
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(
        value, (cst.Tuple, cst.List)
    ):
        return None
    names = target.elements
    values = value.elements
    if len(names) != len(values) or any(
        isinstance(e, cst.StarredElement) for e in (*names, *values)
    ):
        return None
    for named, given in zip(names, values, strict=True):
        if isinstance(named.value, cst.Name) and named.value.value == name:
            return given.value
    return None


def _flattens(call: cst.Call) -> bool:
    """``x.flatten()``, ``x.view(-1)``, ``x.reshape(-1)``: one axis of every value."""
    member = call.func.attr.value  # type: ignore[attr-defined]
    given = [a.value for a in call.args]
    if member == "flatten":
        return not given or (isinstance(given[0], cst.Integer) and given[0].value == "0")
    return (
        member in ("view", "reshape")
        and len(given) == 1
        and isinstance(given[0], cst.UnaryOperation)
        and isinstance(given[0].operator, cst.Minus)
        and isinstance(given[0].expression, cst.Integer)
        and given[0].expression.value == "1"
    )


def _field(value: cst.BaseExpression) -> str | None:
    """``labels`` for ``batch["labels"]`` and ``batch.labels``."""
    if isinstance(value, cst.Subscript) and len(value.slice) == 1:
        index = value.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            return (
                index.value.evaluated_value
                if isinstance(index.value.evaluated_value, str)
                else None
            )
    if isinstance(value, cst.Attribute):
        return value.attr.value
    return None


def _batch_read(loop: Scope, value: cst.BaseExpression) -> bool:
    root = value.value if isinstance(value, (cst.Subscript, cst.Attribute)) else None
    return isinstance(root, cst.Name) and root.value in loop.batch_names


def _argmax_axis(call: cst.Call) -> cst.BaseExpression | None:
    """The ``dim`` of ``logits.argmax(-1)``, ``logits.argmax(dim=-1)`` or ``torch.argmax(logits,
    -1)``."""
    given = keyword_value(call, "dim")
    if given is not None:
        return given
    positional = [a.value for a in call.args if a.keyword is None]
    func = call.func
    at = 1 if isinstance(func, cst.Attribute) and dotted(func.value) == "torch" else 0
    return positional[at] if len(positional) > at else None


def _argmax_receiver(call: cst.Call) -> cst.BaseExpression | None:
    """``outputs[1]`` of ``outputs[1].argmax(-1)`` or of ``torch.argmax(outputs[1], -1)``."""
    func = call.func
    if isinstance(func, cst.Attribute) and dotted(func.value) != "torch":
        return func.value
    positional = [a.value for a in call.args if a.keyword is None]
    return positional[0] if positional else None


def _forward_of_the_batch(
    script: ScriptModel,
    loop: Scope,
    value: cst.BaseExpression | None,
    gather: cst.CSTNode,
) -> bool:
    """``value`` is an item of what a call handed this loop's batch returned, bound in the loop
    above the gather (``outputs = model(**batch)``, then ``outputs[1]``: a model returning a
    ``(loss, logits)`` tuple, a NER trainer under Ray Tune): with a collator that pads labels,
    its argmax over the last axis is one prediction per token."""
    while isinstance(value, (cst.Subscript, cst.Attribute)):
        value = value.value
    if not isinstance(value, cst.Name):
        return False
    for node in walk(loop.node.body):
        if (
            isinstance(node, cst.Assign)
            and isinstance(node.value, cst.Call)
            and script.order(node) < script.order(gather)
            and any(value.value in target_names(t) for t in assigned_targets(node))
            and any(
                isinstance(n, cst.Name) and n.value in loop.batch_names
                for argument in node.value.args
                for n in walk(argument.value)
            )
        ):
            return True
    return False


def _last_axis(axis: cst.BaseExpression | None) -> bool:
    return (
        isinstance(axis, cst.UnaryOperation)
        and isinstance(axis.operator, cst.Minus)
        and isinstance(axis.expression, cst.Integer)
        and axis.expression.value == "1"
    ) or (isinstance(axis, cst.Integer) and axis.value == "2")


def _pads_across(value: cst.BaseExpression) -> bool:
    return any(
        isinstance(n, cst.Call)
        and isinstance(n.func, cst.Attribute)
        and n.func.attr.value == "pad_across_processes"
        for n in walk(value)
    )


def _pad_token(script: ScriptModel) -> str:
    """``tokenizer.pad_token_id`` where the file reads a tokenizer by that name."""
    if re.search(r"\btokenizer\b", script.module.code):
        return "tokenizer.pad_token_id"
    return "<the pad token id>"
