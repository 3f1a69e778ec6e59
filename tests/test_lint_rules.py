"""Every rule's examples are its tests: each bad example is reported at its line and column and
fixes to its fixed form; each good example is silent."""

from __future__ import annotations

import pytest

from accelify.lint.cli import rule_page
from accelify.lint.engine import lint_source
from accelify.lint.finding import Finding
from accelify.lint.registry import all_rules
from accelify.lint.rule import HEADER
from accelify.lint.selection import Selection

RULES = all_rules()
BAD = [(rule, example) for rule in RULES for example in rule.bad]
GOOD = [(rule, code) for rule in RULES for code in rule.good]


def lint(code: str, rule_code: str, fix: bool = False):
    return lint_source(code.encode(), "example.py", Selection(select=[rule_code]), fix=fix)


def test_codes_are_unique_and_well_formed():
    codes = [rule.code for rule in RULES]
    assert len(codes) == len(set(codes))
    assert all(code.startswith("ACC") and len(code) == 6 for code in codes)
    assert all(rule.__doc__ and rule.message and rule.bad and rule.good for rule in RULES)


def the_finding(code: str, rule_code: str, line: int | None = None) -> Finding:
    """The one finding ``rule_code`` reports on ``code``, linted with that rule alone (the one at
    ``line``, where the rule reports other lines too)."""
    findings = lint(code, rule_code).findings
    found = [f for f in findings if f.code == rule_code and line in (None, f.line)]
    assert len(found) == 1, [(f.code, f.line, f.message) for f in findings]
    return found[0]


@pytest.mark.parametrize(("rule", "example"), BAD, ids=lambda v: getattr(v, "code", "")[:6])
def test_bad_example_is_reported_where_it_is(rule, example):
    found = [(f.code, f.line, f.column) for f in lint(example.code, rule.code).findings]
    assert (rule.code, example.line, example.column) in found, example.code


@pytest.mark.parametrize(("rule", "example"), [(r, e) for r, e in BAD if e.fixed is not None])
def test_fix_turns_the_bad_example_into_the_fixed_one(rule, example):
    result = lint(example.code, rule.code, fix=True)
    assert result.fixed is not None
    assert result.fixed.decode() == example.fixed
    again = lint(example.fixed, rule.code, fix=True)
    assert again.fixed in (None, example.fixed.encode())  # fixing twice changes nothing


@pytest.mark.parametrize(("rule", "code"), GOOD)
def test_good_example_is_silent(rule, code):
    assert [f for f in lint(code, rule.code).findings if f.code == rule.code] == []


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.code)
def test_a_rules_page_advises_code_the_rule_leaves_silent(rule):
    """`accelify rules CODE`'s "Use instead" is the shown example cured (ACC404's page once
    showed a Ray worker's ``gather(loss[None])``, never the ``gather_for_metrics`` it advises)."""
    page = rule_page(rule)
    advised = page.split("## Use instead\n```python\n")[1].split("\n```")[0] + "\n"
    if rule.bad[0].fixed is not None:
        assert advised == rule.bad[0].fixed
    assert [f for f in lint(advised, rule.code).findings if f.code == rule.code] == []


def test_a_trainers_model_saved_under_fsdp_is_never_advised_an_if_around_it():
    """``trainer.model`` is no model the analysis tracks, but its name says it is one: under
    FSDP its state dict gathers from every rank, so a guard would hang the others."""
    code = (
        "from accelerate import Accelerator, FullyShardedDataParallelPlugin\n"
        "accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())\n"
        "trainer.train()\n"
        "trainer.model.save_pretrained('out')\n"
        "trainer.tokenizer.save_pretrained('out')\n"
    )
    finding = the_finding(code, "ACC201")
    assert finding.line == 4
    assert "is_main_process=accelerator.is_main_process" in finding.message
    assert "state_dict=accelerator.get_state_dict(trainer.model)" in finding.message
    assert "guard with" not in finding.message


def test_a_dump_into_a_file_every_rank_opens_for_writing_is_guarded_at_its_with():
    """NLPer-Arsenal's predictions.json: a guard around the json.dump alone leaves every other
    rank's ``open(..., "w")`` truncating the file the main process wrote, so the advice names
    the ``with``."""
    code = (
        "import json\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "with open('predictions.json', 'w') as f:\n"
        "    json.dump(predictions, f, indent=1)\n"
        "    accelerator.print('predictions written')\n"
    )
    finding = the_finding(code, "ACC201")
    assert finding.line == 5
    assert "put the `with` at line 4 under `if accelerator.is_main_process:`" in finding.message


def test_a_file_opened_exclusively_is_guarded_at_its_open_never_swapped_for_devnull():
    """Opened ``"x"``, every rank's open but the first fails (the file exists): a guard around the
    write alone fixes nothing, and ``os.devnull`` opened ``"x"`` fails too."""
    alone = (
        "import json\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "with open('predictions.json', 'x') as f:\n    json.dump(predictions, f)\n"
    )
    finding = the_finding(alone, "ACC201")
    assert "put the `with` at line 4 under `if accelerator.is_main_process:`" in finding.message
    around_training = (
        "from accelerate import Accelerator\naccelerator = Accelerator()\n"
        "with open('history.csv', 'x') as log:\n    for x in loader:\n"
        "        accelerator.backward(model(x).sum())\n        log.write('step\\n')\n"
    )
    finding = the_finding(around_training, "ACC201")
    assert finding.line == 6
    assert "the `with` at line 3 also runs accelerator.backward()" in finding.message
    assert "devnull" not in finding.message


def test_a_dump_into_a_file_opened_for_reading_and_writing_keeps_the_plain_advice():
    code = (
        "import json\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "with open('weights.json', 'r+') as f:\n    json.dump(predictions, f)\n"
    )
    finding = the_finding(code, "ACC201")
    assert "guard with `if accelerator.is_main_process:`" in finding.message


def test_a_record_appended_with_its_newline_is_guarded_at_its_with():
    """A gist-token pretraining loop appends each step's losses as a JSON line: ``json.dump``
    then ``f.write("\\n")`` in one ``with open(..., "a")``. A guard around the dump alone leaves
    every rank writing its newline into the main process's file, so the advice names the
    ``with``."""
    code = (
        "import json\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "with open('losses.json', 'a') as file:\n"
        "    json.dump(loss_set, file)\n"
        "    file.write('\\n')\n"
    )
    finding = the_finding(code, "ACC201")
    assert finding.line == 5
    assert "put the `with` at line 4 under `if accelerator.is_main_process:`" in finding.message
    assert "other writes to the file" in finding.message


def test_a_single_append_keeps_the_plain_advice():
    code = (
        "import json\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "with open('losses.json', 'a') as file:\n    json.dump(loss_set, file)\n"
    )
    finding = the_finding(code, "ACC201")
    assert "guard with `if accelerator.is_main_process:`" in finding.message


_READ_BACK = (
    "import json\nfrom accelerate import Accelerator\nfrom datasets import load_dataset\n\n\n"
    "def read_data(path):\n"
    "    rows = json.load(open(path))\n"
    "    with open('/data/formatted.json', 'w') as out:\n"
    "        json.dump([{'prompt': r['input']} for r in rows], out)\n"
    "    return load_dataset('json', data_files='/data/formatted.json')\n\n\n"
    "def main():\n"
    "    accelerator = Accelerator()\n"
    "    data = read_data('/data/raw.json')\n"
    "    model, loader = accelerator.prepare(model, loader)\n"
)


def test_a_file_written_then_read_back_is_advised_a_barrier_before_the_read():
    """An instruction-tuning script reformats its data set into one JSON file and loads it
    back with ``load_dataset`` in the same helper, on every rank. Guarding only the write
    leaves the other ranks loading the file before the main process has written it, so the
    advice names the barrier and the line of the read."""
    finding = the_finding(_READ_BACK, "ACC201")
    assert finding.line == 9
    assert "put the `with` at line 8 under `if accelerator.is_main_process:`" in finding.message
    assert "then call accelerator.wait_for_everyone() before line 10" in finding.message


_VOCABULARY_READ_BY_ITS_FOLDER = (
    "import json\nimport os\nfrom accelerate import Accelerator\n"
    "from transformers import AutoTokenizer\n\n\n"
    "def main(args, model, vocab_dict):\n"
    "    accelerator = Accelerator()\n"
    "    model = accelerator.prepare(model)\n"
    "    vocab_file = os.path.join(args.output_dir, 'vocab.json')\n"
    "    with open(vocab_file, 'w') as file:\n"
    "        json.dump(vocab_dict, file)\n"
    "    tokenizer = AutoTokenizer.from_pretrained(args.output_dir)\n"
)


def test_a_file_read_back_through_its_folder_is_advised_a_barrier_before_the_read():
    """A wav2vec2 CTC script writes ``vocab.json`` into the output folder and builds its
    tokenizer from that folder on every rank: ``from_pretrained`` reads the file back, so
    guarding the write alone leaves the other ranks loading before it exists."""
    finding = the_finding(_VOCABULARY_READ_BY_ITS_FOLDER, "ACC201")
    assert finding.line == 12
    assert "then call accelerator.wait_for_everyone() before line 13" in finding.message


def test_a_file_deleted_on_every_rank_before_the_write_is_advised_to_delete_under_the_guard():
    """The wav2vec2 script removes a stale ``vocab.json`` on every rank (an ``OSError`` let
    pass) before writing it: with the write alone moved onto the main process, a slower rank
    still deletes the file the main process has just written, so the advice moves the
    deletion under the same test."""
    code = _VOCABULARY_READ_BY_ITS_FOLDER.replace(
        "    with open(vocab_file, 'w') as file:\n",
        "    try:\n        os.remove(vocab_file)\n    except OSError:\n        pass\n"
        "    with open(vocab_file, 'w') as file:\n",
    )
    finding = the_finding(code, "ACC201")
    assert finding.line == 16
    assert "delete the old file (line 12) under the same test" in finding.message
    assert "then call accelerator.wait_for_everyone() before line 17" in finding.message


def test_a_file_not_read_back_is_advised_no_barrier():
    """Printing the path, or making a ``Path`` of it, does not open the file."""
    code = _READ_BACK.replace(
        "    return load_dataset('json', data_files='/data/formatted.json')\n",
        "    print('wrote', '/data/formatted.json')\n    return Path('/data/formatted.json')\n",
    )
    finding = the_finding(code, "ACC201")
    assert "wait_for_everyone" not in finding.message


def test_a_file_per_process_read_back_is_advised_no_barrier():
    """A path from the clock is another file on each rank: the main process alone writing it
    and a barrier would leave the other ranks reading a file nobody wrote."""
    code = _READ_BACK.replace(
        "    with open('/data/formatted.json', 'w') as out:\n",
        "    stamp = f'/data/{time.time()}.json'\n    with open(stamp, 'w') as out:\n",
    ).replace("data_files='/data/formatted.json'", "data_files=stamp")
    code = "import time\n" + code
    finding = the_finding(code, "ACC201")
    assert "wait_for_everyone" not in finding.message


def test_identical_bytes_read_back_are_advised_the_barrier_first():
    """Every rank saves the same tokenizer and loads it again: a barrier after the save is the
    fix; a main-process guard alone would leave the others loading before it is written."""
    code = (
        "from accelerate import Accelerator\naccelerator = Accelerator()\n"
        "tokenizer.save_pretrained('out')\n"
        "tokenizer = AutoTokenizer.from_pretrained('out')\n"
    )
    finding = the_finding(code, "ACC201")
    assert finding.message.startswith(
        "Call accelerator.wait_for_everyone() after this write, before line 4"
    )


_LOSS_EVAL = (
    "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
    "model, val_loader = accelerator.prepare(model, val_loader)\n"
    "val_loss, batches = 0.0, 0\n"
    "with torch.no_grad():\n"
    "    for x, y in val_loader:\n"
    "        loss = model(x, y)\n"
    "        val_loss += loss.item()\n"
    "        batches += 1\n"
    "accelerator.log({'val_loss': val_loss / batches})\n"
)


def test_a_backward_no_accelerator_reaches_is_told_what_to_add():
    """The advice never names an accelerator the line cannot reach: a helper is told to take
    its callers' one as a parameter, code above the file's Accelerator to make one first."""
    from accelify.rules.loss_backward import _TEACHER_FIRST

    teacher = the_finding(_TEACHER_FIRST, "ACC301")
    assert "no Accelerator exists at this line (the file makes its Accelerator at line 7" in (
        teacher.message
    )
    assert "make one above it (`accelerator = Accelerator()`)" in teacher.message
    helper = the_finding(
        "from accelify import Accelerator\n"
        "def fit(net, batches, opt):\n"
        "    for x, y in batches:\n"
        "        (net(x) - y).pow(2).mean().backward()\n"
        "def main():\n"
        "    accelerator = Accelerator()\n"
        "    model, optimizer, loader = accelerator.prepare(net, opt, data)\n"
        "    fit(model, loader, optimizer)\n",
        "ACC301",
    )
    assert (
        "fit() has no Accelerator: add an `accelerator` parameter and have the calls that have "
        "one hand it theirs (`accelerator` at line 8)"
    ) in helper.message
    assert "has none" not in helper.message


def test_a_backward_helper_names_only_the_calls_that_have_an_accelerator():
    """A helper called with prepared objects and also by a single-device baseline that has no
    accelerator: the advice names the call that can hand one, and tells the other apart (a
    default of None, the plain backward kept there), not "its callers hand it theirs"."""
    helper = the_finding(
        "from accelify import Accelerator\n"
        "def fit(net, batches, opt):\n"
        "    for x, y in batches:\n"
        "        (net(x) - y).pow(2).mean().backward()\n"
        "def baseline():\n"
        "    fit(net, data, opt)\n"
        "def main():\n"
        "    accelerator = Accelerator()\n"
        "    model, optimizer, loader = accelerator.prepare(net, opt, data)\n"
        "    fit(model, loader, optimizer)\n",
        "ACC301",
    )
    assert "have the calls that have one hand it theirs (`accelerator` at line 10)" in (
        helper.message
    )
    assert "the call at line 6 has none: default the parameter to None for it" in helper.message
    assert "line 6)" not in helper.message and "at line 6," not in helper.message


def test_an_ungathered_loss_total_is_advised_a_reduce_of_a_tensor():
    """A streaming-ASR validation sums ``loss.item()`` per batch of a prepared loader: there
    are no predictions and labels to gather, and a float cannot be reduced, so the advice
    names the total, the tensor to reduce and its count."""
    finding = the_finding(_LOSS_EVAL, "ACC403")
    assert finding.line == 9
    assert finding.message.startswith(
        "Combine val_loss across ranks after the loop: accelerator.reduce(torch.tensor("
        "val_loss, device=accelerator.device), reduction='sum'), with its count"
    )


@pytest.mark.parametrize("count", ["x.size(0)", "x.shape[0]", "y.numel()", "len(y)", "1"])
def test_a_sample_count_beside_a_loss_total_is_not_told_to_gather(count):
    """``n += x.size(0)`` (or ``.shape[0]``, ``.numel()``, ``len()``, ``+= 1``) only counts the
    batch: the advice reduces it with the loss total and asks to gather the predictions alone."""
    code = _LOSS_EVAL.replace("val_loss, batches", "val_loss, preds, n").replace(
        "0.0, 0\n", "0.0, [], 0\n"
    )
    code = code.replace(
        "        batches += 1\n",
        f"        n += {count}\n        preds.append(model(x).argmax(-1))\n",
    )
    finding = the_finding(code, "ACC403")
    assert finding.line == 9
    assert "`preds` also holds this rank's batches only" in finding.message
    assert "`n`" not in finding.message


@pytest.mark.parametrize("early_return", [True, False])
def test_an_evaluation_loop_on_main_only_is_told_where_the_other_ranks_part(early_return):
    """Below ``if not accelerator.is_main_process: return`` the loop is inside no rank test:
    the advice names the return and moves it, as ACC202's `_guard_note` does."""
    body = (
        "    for batch in val_loader:\n"
        "        val_loss += model(**batch).loss.item()\n"
        "    accelerator.log({'val_loss': val_loss / len(val_loader)})\n"
    )
    guard = (
        "    if not accelerator.is_main_process:\n        return\n    val_loss = 0.0\n" + body
        if early_return
        else "    val_loss = 0.0\n    if accelerator.is_main_process:\n"
        + body.replace("\n    ", "\n        ").replace("    for", "        for", 1)
    )
    code = (
        "from accelerate import Accelerator\n\naccelerator = Accelerator()\n"
        "model, val_loader = accelerator.prepare(model, val_loader)\n\n\n"
        "def validate():\n" + guard + "\n\nvalidate()\n"
    )
    message = the_finding(code, "ACC403").message
    if early_return:
        assert "the other ranks return at line 8, above it" in message
        assert "move that return below the loop" in message
        assert "inside the rank test" not in message
    else:
        assert "it is inside the rank test at line 9" in message
        assert "move the loop out of the test" in message


def test_an_ungathered_loss_total_of_numpy_values_is_advised_a_reduce_of_a_tensor():
    """A CLIP evaluation sums ``loss.cpu().numpy() * n``: ``reduce`` takes tensors only, so the
    advice makes the total one first, as for ``.item()``."""
    code = _LOSS_EVAL.replace("loss.item()", "loss.cpu().numpy() * x.shape[0]")
    finding = the_finding(code, "ACC403")
    assert "accelerator.reduce(torch.tensor(val_loss, device=accelerator.device)" in (
        finding.message
    )


def test_an_ungathered_dict_of_loss_tensors_is_advised_a_reduce_of_each_total():
    code = _LOSS_EVAL.replace("val_loss += loss.item()", "losses['ce'] += loss.detach()")
    code = code.replace("val_loss, batches = 0.0, 0", "losses, batches = {'ce': 0}, 0")
    finding = the_finding(code, "ACC403")
    assert "Combine each total in losses across ranks" in finding.message
    assert "accelerator.reduce(losses, reduction='sum')" in finding.message


def test_an_ungathered_dict_of_cpu_loss_tensors_is_advised_a_reduce_of_device_tensors():
    """BioZorro sums ``v.detach().to("cpu")`` per key: NCCL cannot reduce CPU tensors, so the
    advice moves each total back to the accelerator's device."""
    code = _LOSS_EVAL.replace("val_loss += loss.item()", "losses['ce'] += loss.detach().to('cpu')")
    code = code.replace("val_loss, batches = 0.0, 0", "losses, batches = {'ce': 0}, 0")
    message = the_finding(code, "ACC403").message
    assert (
        "accelerator.reduce({k: v.to(accelerator.device) for k, v in losses.items()}, "
        "reduction='sum')"
    ) in message
    assert "moved to the CPU, which NCCL cannot reduce" in message
    assert "accelerator.reduce(losses," not in message


def test_an_ungathered_cpu_loss_total_is_advised_a_reduce_of_a_device_tensor():
    code = _LOSS_EVAL.replace("val_loss += loss.item()", "val_loss += loss.detach().cpu()")
    message = the_finding(code, "ACC403").message
    assert "accelerator.reduce(val_loss.to(accelerator.device), reduction='sum')" in message


def test_an_ungathered_dict_of_item_losses_is_advised_a_tensor_per_entry():
    code = _LOSS_EVAL.replace("val_loss += loss.item()", "losses['ce'] += loss.item()")
    code = code.replace("val_loss, batches = 0.0, 0", "losses, batches = {'ce': 0.0}, 0")
    message = the_finding(code, "ACC403").message
    assert "{k: torch.tensor(v, device=accelerator.device) for k, v in losses.items()}" in message


def test_an_ungathered_accuracy_keeps_the_gather_advice():
    code = _LOSS_EVAL.replace("val_loss += loss.item()", "correct += (model(x) == y).sum()")
    code = code.replace("val_loss, batches = 0.0, 0", "correct, batches = 0, 0")
    finding = the_finding(code, "ACC403")
    assert "gather_for_metrics(...) on the predictions and labels" in finding.message


def test_wrapped_state_dict_advice_names_the_saved_model_and_accelerator():
    code = (
        "from accelerate import Accelerator\n"
        "class Trainer:\n"
        "    def __init__(self, model, optimizer):\n"
        "        self.accelerator = Accelerator()\n"
        "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n"
        "    def save(self, path):\n"
        "        self.accelerator.save(self.model.state_dict(), path)\n"
    )
    finding = the_finding(code, "ACC503")
    assert finding.message.startswith(
        "Save self.accelerator.get_state_dict(self.model): self.model.state_dict() is the wrapper's"
    )
    fixed = lint(code, "ACC503", fix=True).fixed.decode()
    assert "self.accelerator.save(self.accelerator.get_state_dict(self.model), path)" in fixed


def test_wrapped_state_dict_under_a_rank_test_is_unwrapped_and_says_where_get_state_dict_goes():
    """get_state_dict is a collective under FSDP and ZeRO-3: under the main-process test the
    fix keeps the unwrapped state dict, and the advice puts get_state_dict before the test."""
    code = (
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "model = accelerator.prepare(model)\n"
        "if accelerator.is_main_process:\n"
        "    accelerator.save(model.state_dict(), 'm.pt')\n"
    )
    finding = the_finding(code, "ACC503")
    assert finding.message.startswith("Save accelerator.unwrap_model(model).state_dict()")
    assert "get_state_dict(model) where every rank runs it, before any rank test" in finding.message
    fixed = lint(code, "ACC503", fix=True).fixed.decode()
    assert "accelerator.save(accelerator.unwrap_model(model).state_dict(), 'm.pt')" in fixed


def test_an_evaluation_run_under_a_rank_guard_is_advised_out_of_the_guard_first():
    """A gather added inside an evaluation that only the main process calls would hang the
    others: the advice names the guarded call and moves it out before gathering."""
    code = (
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "model, val_loader = accelerator.prepare(model, val_loader)\n"
        "def validate():\n"
        "    total = 0.0\n"
        "    for batch in val_loader:\n"
        "        total += model(**batch).loss.item()\n"
        "    return total\n"
        "if accelerator.is_main_process:\n"
        "    print(validate())\n"
    )
    finding = the_finding(code, "ACC403")
    assert finding.line == 7
    assert "under a rank guard (line 10)" in finding.message
    unguarded = code.replace("if accelerator.is_main_process:\n    print", "print")
    finding = the_finding(unguarded, "ACC403")
    assert "rank guard" not in finding.message


def test_values_kept_under_a_rank_test_in_the_loop_are_gathered_before_the_test():
    """An evaluation loop that keeps its rows on the main process only (a detector's
    ``if save_predictions and accelerator.is_main_process: rows.append(...)``): the advice
    gathers before that test, never inside it, where the other ranks would not come."""
    code = (
        "import torch\n"
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "model, loader = accelerator.prepare(model, loader)\n"
        "rows = []\n"
        "with torch.no_grad():\n"
        "    for batch in loader:\n"
        "        out = model(batch['x'])\n"
        "        if save_predictions and accelerator.is_main_process:\n"
        "            rows.append({'id': batch['id'], 'pred': out.argmax(-1).tolist()})\n"
    )
    finding = the_finding(code, "ACC403")
    assert finding.line == 10
    assert "before the rank test at line 9" in finding.message
    assert "would hang" in finding.message


def test_accumulation_advice_names_the_trainers_prepared_model():
    code = (
        "import torch\n"
        "from accelerate import Accelerator\n"
        "class Trainer:\n"
        "    def __init__(self, model, loader, steps):\n"
        "        self.accelerator = Accelerator(gradient_accumulation_steps=steps)\n"
        "        self.optimizer = torch.optim.AdamW(model.parameters())\n"
        "        self.policy, self.optimizer, self.loader = self.accelerator.prepare(\n"
        "            model, self.optimizer, loader\n"
        "        )\n"
        "    def train(self):\n"
        "        for batch in self.loader:\n"
        "            self.accelerator.backward(self.policy(batch).mean())\n"
        "            self.optimizer.step()\n"
        "            self.optimizer.zero_grad()\n"
    )
    finding = the_finding(code, "ACC304")
    assert finding.line == 5
    assert finding.message.startswith("Wrap the step in self.accelerator.accumulate(self.policy):")


def test_a_trainer_that_subclasses_nn_module_holds_an_optimizer_not_a_layer():
    """A DPO trainer written as ``class DPOTrainer(nn.Module)`` prepares its own model: its
    ``self.optimizer`` is the optimizer the advice is about, not a layer of a model."""
    code = (
        "import torch\n"
        "from torch import nn\n"
        "from accelerate import Accelerator\n"
        "class DPOTrainer(nn.Module):\n"
        "    def __init__(self, model, loader, steps):\n"
        "        super().__init__()\n"
        "        self.model = model\n"
        "        self.optimizer = torch.optim.AdamW(self.model.parameters())\n"
        "        self.accelerator = Accelerator(gradient_accumulation_steps=steps)\n"
        "        self.model, self.optimizer = self.accelerator.prepare(\n"
        "            self.model, self.optimizer)\n"
        "        self.loader = self.accelerator.prepare(loader)\n"
        "    def train(self):\n"
        "        for batch in self.loader:\n"
        "            self.accelerator.backward(self.model(batch).mean())\n"
        "            self.optimizer.step()\n"
    )
    finding = the_finding(code, "ACC304")
    assert finding.line == 9
    assert "self.accelerator.accumulate(self.model):" in finding.message


def test_a_prepare_result_unpacked_on_the_next_line_is_what_the_rules_follow():
    """``prepared = accelerator.prepare(model, optimizer)`` then ``model, optimizer = prepared``:
    the objects are prepared under the unpacked names (no ACC401), and ACC304 names them."""
    code = (
        "import torch\n"
        "from accelerate import Accelerator\n"
        "class Trainer:\n"
        "    def __init__(self, model, loader, steps):\n"
        "        self.model = model\n"
        "        self.optimizer = torch.optim.AdamW(self.model.parameters())\n"
        "        self.accelerator = Accelerator(gradient_accumulation_steps=steps)\n"
        "        prepared = self.accelerator.prepare(self.model, self.optimizer, loader)\n"
        "        self.model, self.optimizer, self.loader = prepared\n"
        "    def train(self):\n"
        "        for batch in self.loader:\n"
        "            self.accelerator.backward(self.model(batch).mean())\n"
        "            self.optimizer.step()\n"
    )
    selection = Selection(select=["ACC304", "ACC401"])
    findings = lint_source(code.encode(), "example.py", selection).findings
    assert [(finding.code, finding.line) for finding in findings] == [("ACC304", 7)]
    assert "self.accelerator.accumulate(self.model):" in findings[0].message


def test_a_load_state_reached_before_prepare_names_the_calls_that_order_them():
    """A trainer's ``__init__`` calls ``self.load_checkpoint()`` (which runs ``load_state``)
    before ``self.prepare_training()``: the finding at the load names both calls, so the advice
    says which call to move."""
    code = (
        "from accelerate import Accelerator\n"
        "class Trainer:\n"
        "    def __init__(self, model, path):\n"
        "        self.accelerator = Accelerator()\n"
        "        self.model = model\n"
        "        self.load_checkpoint(path)\n"
        "        self.prepare_training()\n"
        "    def load_checkpoint(self, path):\n"
        "        self.accelerator.load_state(path)\n"
        "    def prepare_training(self):\n"
        "        self.model = self.accelerator.prepare(self.model)\n"
    )
    finding = the_finding(code, "ACC501")
    assert finding.line == 9
    assert "self.load_checkpoint() (line 6)" in finding.message
    assert "self.prepare_training() (line 7)" in finding.message


def test_a_state_dict_saved_under_two_names_is_one_finding():
    """A trainer writes the same checkpoint dict as ``model-{step}.pt`` and ``model-last.pt``:
    one wrapped state dict, one finding at it (not one per save)."""
    code = (
        "import torch\nfrom accelify import Accelerator\naccelerator = Accelerator()\n"
        "model = accelerator.prepare(torch.nn.Linear(2, 2))\n"
        "data = {'model': model.state_dict(), 'step': 3}\n"
        "torch.save(data, 'model-3.pt')\ntorch.save(data, 'model-last.pt')\n"
    )
    found = [(f.line, f.column) for f in lint(code, "ACC503").findings if f.code == "ACC503"]
    assert found == [(5, 18)]


def test_a_second_write_of_the_same_path_is_no_read_back():
    """A VAE trainer's ``model_save``: ``save_file(sd, path)`` for ``.safetensors``, else
    ``torch.save(sd, path)``. The other branch writes the file too; the advice names no read
    that needs a barrier."""
    code = (
        "import os\nimport torch\nfrom safetensors.torch import save_file\n"
        "from accelify import Accelerator\naccelerator = Accelerator()\n\n\n"
        "def model_save(state_dict, path):\n"
        "    if path.endswith('.safetensors'):\n        save_file(state_dict, path)\n"
        "    else:\n        torch.save(state_dict, path)\n\n\n"
        "model_save(accelerator.unwrap_model(model).state_dict(), 'vae.safetensors')\n"
    )
    findings = [f for f in lint(code, "ACC201").findings if f.code == "ACC201"]
    assert [f.line for f in findings] == [10, 12]
    assert all("reads it back" not in f.message for f in findings)


def test_a_scheduler_sized_by_the_whole_loader_is_told_so():
    """A ChatGLM LoRA script under DeepSpeed: the scheduler, sized from the loader's length
    before prepare and left out of it, is stepped beside the optimizer: it covers 1/N of its
    schedule. The message says that, and what fixes it under DeepSpeed too."""
    code = (
        "import torch\nfrom accelerate import Accelerator, DeepSpeedPlugin\n"
        "from transformers import get_linear_schedule_with_warmup\n"
        "accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))\n"
        "model = torch.nn.Linear(2, 2)\n"
        "optimizer = torch.optim.AdamW(model.parameters())\n"
        "scheduler = get_linear_schedule_with_warmup(optimizer, 0, len(loader) * 2)\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "for batch in loader:\n"
        "    accelerator.backward(model(batch))\n"
        "    optimizer.step()\n    scheduler.step()\n"
    )
    finding = the_finding(code, "ACC401")
    assert finding.line == 12
    assert "sized from len(loader) at line 7, before prepare" in finding.message
    assert "build it after prepare from the prepared len(loader)" in finding.message


def test_a_division_inside_accumulate_without_steps_names_the_setting():
    """No steps on the Accelerator, the loss divided by the script's own count inside
    ``accumulate()``: the advice moves the count onto the Accelerator."""
    code = (
        "from accelify import Accelerator\naccelerator = Accelerator()\n"
        "for batch in loader:\n"
        "    with accelerator.accumulate(model):\n"
        "        accelerator.backward(model(batch) / args.grad_accum)\n"
        "        optimizer.step()\n"
    )
    finding = the_finding(code, "ACC303")
    assert finding.line == 5
    assert finding.message.startswith(
        "Pass gradient_accumulation_steps=args.grad_accum to the Accelerator (line 2)"
    )


def test_a_division_under_deepspeed_names_the_engine():
    """Under ``deepspeed_plugin=`` Accelerate's backward does not divide: DeepSpeed's engine
    does, by its own steps (a ChatGLM LoRA script divides again by hand)."""
    code = (
        "from accelerate import Accelerator, DeepSpeedPlugin\n"
        "plugin = DeepSpeedPlugin(gradient_accumulation_steps=8, zero_stage=2)\n"
        "accelerator = Accelerator(gradient_accumulation_steps=8, deepspeed_plugin=plugin)\n"
        "for batch in loader:\n"
        "    loss = model(**batch).loss / accumulate_step\n"
        "    accelerator.backward(loss)\n"
    )
    finding = the_finding(code, "ACC303")
    assert finding.line == 5
    assert "DeepSpeed's engine already divides the loss" in finding.message


def test_a_total_mixing_gathered_and_local_values_names_the_local_one():
    """A stock forecaster gathers its predictions and targets and compares both with
    ``prev_values`` from its own batch: the advice names what is left to gather."""
    code = (
        "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "model, loader = accelerator.prepare(model, loader)\ncorrect = 0\n"
        "with torch.no_grad():\n    for batch_x, batch_y in loader:\n"
        "        outputs = model(batch_x)\n"
        "        outputs, batch_y = accelerator.gather_for_metrics((outputs, batch_y))\n"
        "        prev_values = batch_x[:, -1]\n"
        "        pred_dir = outputs[:, 0] > prev_values\n"
        "        true_dir = batch_y[:, 0] > prev_values\n"
        "        correct += (pred_dir == true_dir).sum().item()\n"
    )
    finding = the_finding(code, "ACC403")
    assert finding.line == 13
    assert finding.message.startswith("Gather `prev_values` in the same accelerator.")


def test_a_runner_annotated_with_a_quoted_trainer_is_checked_like_an_unquoted_one():
    """``trainer: "Trainer | None"`` names the class as ``trainer: Trainer | None`` does: the
    runner holds a trainer with an accelerator and is not taken for a single-device twin."""
    code = (
        "from accelerate import Accelerator\n\n\n"
        "class Trainer:\n    def __init__(self, model):\n"
        "        self.accelerator = Accelerator()\n"
        "        self.model = self.accelerator.prepare(model)\n\n\n"
        "class Runner:\n    def __init__(self, trainer: {annotation} = None):\n"
        "        self.trainer = trainer\n\n"
        "    def step(self, batch):\n"
        "        loss = self.trainer.model(batch).sum()\n        loss.backward()\n"
    )
    for annotation in ('"Trainer | None"', '"Optional[Trainer]"', "Trainer | None"):
        findings = lint(code.format(annotation=annotation), "ACC301").findings
        assert [(f.code, f.line) for f in findings] == [("ACC301", 16)], annotation


_TWO_TRAINERS = """\
from accelerate import Accelerator
from transformers import AutoModelForCausalLM


class First:
    def __init__(self, name):
        self.acc_a = Accelerator()
        self.model = self.acc_a.prepare(AutoModelForCausalLM.from_pretrained(name))

    def train(self, batch):
        self.acc_a.backward(self.model(**batch).loss)


class Second:
    def __init__(self, name):
        self.acc_b = Accelerator()
        self.model = self.acc_b.prepare(AutoModelForCausalLM.from_pretrained(name))

    def train(self, batch):
        self.acc_b.backward(self.model(**batch).loss)


def main(ids, batch):
    second = Second("gpt2")
    second.train(batch)
    second.model.save_pretrained("out")
"""


def test_a_trainers_model_is_unwrapped_by_its_own_classs_accelerator():
    """Two trainer classes each prepare ``self.model`` with their own accelerator attribute:
    the advice for ``second.model`` names ``second.acc_b`` (``second.acc_a`` does not exist)."""
    findings = lint(_TWO_TRAINERS, "ACC104").findings
    assert [(f.line, f.column) for f in findings] == [(26, 5)]
    assert "second.acc_b.unwrap_model(second.model)" in findings[0].message


_RUNNER = (
    "import torch\nfrom accelerate import Accelerator\n\n\n"
    "class Trainer:\n    def __init__(self, model, optimizer):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)\n\n\n"
    "class Runner:\n    def __init__(self, trainer):\n        self.trainer = trainer\n\n"
    "    def run(self, loader):\n"
    "        for x in loader:\n"
    "            loss = self.trainer.model(x).sum()\n"
    "            loss.backward()\n"
    "            print(loss.item())\n"
    "        torch.save({'step': 1}, 'state.pt')\n\n\n"
    "def main():\n"
    "    trainer = Trainer(torch.nn.Linear(2, 2), None)\n"
    "    Runner(trainer).run([])\n"
)


@pytest.mark.parametrize(
    ("code", "line", "advice"),
    [
        ("ACC301", 18, "self.trainer.accelerator.backward(loss)"),
        ("ACC203", 19, "self.trainer.accelerator.print"),
        ("ACC201", 20, "if self.trainer.accelerator.is_main_process:"),
    ],
)
def test_advice_in_a_runner_names_the_accelerator_through_the_trainer_it_holds(code, line, advice):
    """A runner handed a trainer has no ``accelerator`` of its own: the advice names the one it
    reaches, ``self.trainer.accelerator``, never a bare ``accelerator.``."""
    finding = the_finding(_RUNNER, code, line=line)
    assert advice in finding.message
    assert " accelerator." not in finding.message and "`accelerator." not in finding.message


def test_advice_in_a_function_names_the_accelerator_of_the_trainer_it_made():
    import libcst as cst

    from accelify.analysis.script_model import analyze
    from accelify.lint.rule import accelerator_name

    code = _RUNNER + "    torch.save(trainer.optimizer.state_dict(), 's.pt')\n"
    script = analyze(cst.parse_module(code), code)
    save = [c for c in script.calls if script.module.code_for_node(c).startswith("torch.save(")][-1]
    assert accelerator_name(script, save) == "trainer.accelerator"


def test_a_fix_in_a_runner_calls_the_trainers_accelerator():
    fixed = lint(_RUNNER, "ACC301", fix=True).fixed.decode()
    assert "            self.trainer.accelerator.backward(loss)\n" in fixed


def test_a_read_after_accelerator_save_in_a_branch_the_ranks_may_disagree_on_is_read_after_it():
    """The converted checkpoint_reload: ``accelerator.save`` then ``torch.load`` of the best
    weights under ``if total < best:`` on a per-rank total. A barrier before the read would sit
    in the branch some ranks skip (hang); moving the read after the branch would reload every
    epoch: the advice makes the ranks agree on the branch (``total`` reduced), then waits."""
    from pathlib import Path

    after = Path(__file__).parent.parent / "fixtures/convert/checkpoint_reload/after.py"
    finding = the_finding(after.read_text(), "ACC212")
    assert finding.line == 38
    assert "Make every rank take the branch at line 35 alike" in finding.message
    assert "the branch tests `total`, computed by each rank on its own" in finding.message
    assert "reduce or gather `total` across the ranks before the test" in finding.message
    assert "accelerator.wait_for_everyone() before this read" in finding.message
    assert "after the branch" not in finding.message


def test_a_tracker_run_started_before_the_accelerator_is_not_guarded_by_it():
    """A terrain GAN's ``main`` calls ``wandb.init`` above ``accelerator = Accelerator(...)``:
    ``if accelerator.is_main_process:`` there is a NameError, so the advice moves the run below
    the Accelerator's line or guards it with ``PartialState()``."""
    code = (
        "import torch\nimport wandb\nfrom accelerate import Accelerator\n\n\n"
        "def main():\n    wandb.init(project='p')\n    accelerator = Accelerator()\n"
        "    model = accelerator.prepare(torch.nn.Linear(2, 2))\n"
        "    if accelerator.is_main_process:\n        wandb.log({'x': 1})\n"
    )
    finding = the_finding(code, "ACC207")
    assert finding.line == 7
    assert "move it below `accelerator = Accelerator(...)` (line 8)" in finding.message
    assert "`if PartialState().is_main_process:` (from accelerate import" in finding.message
    assert "(under `if accelerator.is_main_process:`" not in finding.message


def test_a_trainers_tracker_run_is_guarded_by_its_own_accelerator_attribute():
    code = (
        "import wandb\nfrom accelerate import Accelerator\n\n\nclass Trainer:\n"
        "    def __init__(self, model):\n        self.accelerator = Accelerator()\n"
        "        self.model = self.accelerator.prepare(model)\n        wandb.init(project='p')\n"
    )
    finding = the_finding(code, "ACC207")
    assert "`if self.accelerator.is_main_process:`" in finding.message
    assert "self.accelerator.init_trackers" in finding.message


@pytest.mark.parametrize(
    ("collective", "one_process"),
    [
        ("gather(preds.cpu().numpy())", "one process returns it unchanged and hides it"),
        ("reduce(loss.item(), reduction='sum')", "raises TypeError (Unsupported types), on one"),
    ],
)
def test_a_non_tensor_gathered_or_reduced_is_told_what_one_process_does(collective, one_process):
    """Accelerate 1.15: ``gather(1.5)`` on one process returns 1.5, ``reduce(1.5, 'sum')``
    raises TypeError there too (it checks the type first): the message says which."""
    code = "from accelerate import Accelerator\naccelerator = Accelerator()\n"
    finding = the_finding(code + f"total = accelerator.{collective}\n", "ACC411")
    assert one_process in finding.message
    if collective.startswith("reduce"):
        assert "returns it unchanged" not in finding.message


def test_a_parameter_clamped_through_data_is_advised_unwrap_model():
    """A CLIP trainer clamps its learned temperature after each step (``self.t.data =
    torch.clamp(self.t.data, max=10)``): the wrapper has no ``clamp_t`` (AttributeError), but no
    gradient is involved, so the advice is to call it through ``unwrap_model``, not to move it
    into the forward."""
    code = (
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        "class Encoder(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.proj = torch.nn.Linear(4, 4)\n"
        "        self.t = torch.nn.Parameter(torch.tensor(0.5))\n\n"
        "    def clamp_t(self):\n"
        "        self.t.data = torch.clamp(self.t.data, max=10)\n\n"
        "    def forward(self, x):\n"
        "        return self.proj(x) * torch.exp(self.t)\n\n\n"
        "accelerator = Accelerator()\n"
        "model = Encoder()\n"
        "optimizer = torch.optim.Adam(model.parameters())\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "for x in loader:\n"
        "    accelerator.backward(model(x).sum())\n"
        "    optimizer.step()\n"
        "    model.clamp_t()\n"
    )
    finding = the_finding(code, "ACC104")
    assert finding.line == 25
    assert "accelerator.unwrap_model(model).clamp_t" in finding.message
    assert "outside its forward" not in finding.message


_LOG_CSV = (
    "import csv\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
    "csv_file = open('log.csv', 'a' if resume else 'w', newline='')\n"
    "writer = csv.writer(csv_file)\n"
    "for epoch in range(3):\n"
    "    train_one_epoch()\n"
    "    writer.writerow([epoch, loss])\n"
    "    csv_file.flush()\n"
    "csv_file.close()\n"
)


def test_a_csv_log_every_rank_opens_is_advised_to_open_it_on_the_main_process():
    """A pix2pix trainer opens its CSV log on every rank and writes a row per epoch: every rank
    appends the same rows to one file. Guarding the row alone leaves every rank opening (and,
    with ``"w"``, emptying) the file, so the advice names the open."""
    finding = the_finding(_LOG_CSV, "ACC201")
    assert finding.line == 8
    assert "open the file (line 4) under `if accelerator.is_main_process:`" in finding.message


def test_a_log_file_named_per_rank_is_no_race():
    code = _LOG_CSV.replace("open('log.csv',", "open(f'log_{accelerator.process_index}.csv',")
    assert [f for f in lint(code, "ACC201").findings if f.code == "ACC201"] == []


def test_a_file_written_through_its_handle_is_one_finding_per_open():
    """``f.write`` twice into one ``with open(..., "w")``: one finding, at the first write, that
    names the ``with``."""
    code = (
        "from accelerate import Accelerator\naccelerator = Accelerator()\n"
        "with open('result.txt', 'w') as f:\n"
        "    f.write(setting)\n"
        "    print(mse, file=f)\n"
    )
    finding = the_finding(code, "ACC201")
    assert finding.line == 4
    assert "put the `with` at line 3 under" in finding.message


_PREPARED_IN_TRAIN = (
    "import torch\nfrom util.trainer import Trainer\n\n\n"
    "class DistillTrainer(Trainer):\n"
    "    def _load_models(self):\n"
    "        self.model = InternVLChatModel.from_pretrained(self.config.path)\n\n"
    "    def _load_optimizer(self):\n"
    "        self.optimizer = torch.optim.AdamW(self.model.parameters())\n\n"
    "    def train(self):\n"
    "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
    "            self.model, self.optimizer, self.loader\n"
    "        )\n"
    "        for batch in self.loader:\n"
    "            with torch.no_grad():\n"
    "                feature = self.model.get_vit_feature(batch)\n"
    "            loss = self.model.rec_loss(feature)\n"
    "            self.accelerator.backward(loss)\n"
    "            self.optimizer.step()\n"
)


def test_a_model_a_trainer_prepares_in_train_is_the_wrapper_below_the_prepare():
    """A VQ-distillation trainer prepares ``self.model`` at the top of ``train()`` (its
    accelerator from a base class in another module) and then calls the model's own methods on
    it: the wrapper has none of them. Under ``no_grad`` the advice is ``unwrap_model``; in the
    training step, where an unknown method may run the layers, it names the forward too."""
    findings = {f.line: f.message for f in lint(_PREPARED_IN_TRAIN, "ACC104").findings}
    assert set(findings) == {18, 19}
    assert findings[18].startswith(
        "Call this through self.accelerator.unwrap_model(self.model).get_vit_feature"
    )
    assert "compute it in the model's forward() and call self.model(...)" in findings[19]
    assert (
        "if it does not, call self.accelerator.unwrap_model(self.model).rec_loss" in (findings[19])
    )


def test_a_model_prepared_below_the_call_is_no_wrapper_there():
    code = _PREPARED_IN_TRAIN.replace(
        "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
        "            self.model, self.optimizer, self.loader\n"
        "        )\n",
        "",
    ) + (
        "        self.model, self.optimizer = self.accelerator.prepare(\n"
        "            self.model, self.optimizer\n"
        "        )\n"
    )
    assert [f for f in lint(code, "ACC104").findings if f.code == "ACC104"] == []


def test_a_log_held_open_across_training_is_never_advised_a_guard_around_its_with():
    """A training loop inside ``with open("log.txt", "w") as log:`` writes a line per epoch on
    every rank. A guard around the ``with`` would run the backward on the main process alone
    (a hang): the advice guards the writes and the open, not the block."""
    code = (
        "from accelerate import Accelerator\naccelerator = Accelerator()\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "with open('log.txt', 'w') as log:\n"
        "    for epoch in range(3):\n"
        "        for x, y in loader:\n"
        "            accelerator.backward(model(x, y))\n"
        "            optimizer.step()\n"
        "        log.write(f'{epoch}\\n')\n"
    )
    finding = the_finding(code, "ACC201")
    assert finding.line == 9
    assert "put the `with`" not in finding.message
    assert "the `with` at line 4 also runs accelerator.backward() (line 7)" in finding.message


def test_a_block_of_a_prepared_model_is_advised_through_unwrap_model_with_its_index():
    """``model.blocks[0].attn(x)`` on the wrapper: the advice names the expression to write up to
    the method called, the model unwrapped and the rest kept (``unwrap_model(model).blocks[0]``);
    in a training step the same block runs outside the forward, and unwrapping is no fix."""
    code = (
        "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "for x, y in loader:\n"
        "    hidden = model.layers[2].mlp(x)\n"
        "    accelerator.backward(model(x).sum())\n"
        "    optimizer.step()\n"
        "with torch.no_grad():\n"
        "    maps = model.blocks[0].attn(x)\n"
    )
    evaluated = the_finding(code, "ACC104", line=10)
    assert "through accelerator.unwrap_model(model).blocks[0]:" in evaluated.message
    read = the_finding(code.replace(".attn(x)", ".attn.weight"), "ACC104", line=10)
    assert "through accelerator.unwrap_model(model).blocks[0].attn.weight:" in read.message
    trained = the_finding(code, "ACC104", line=6)
    assert "model.layers[2].mlp() runs the model's layers outside its forward" in trained.message
    assert "unwrap_model(model).layers" not in trained.message


def test_a_save_method_and_a_load_method_called_in_turn_are_reported_at_the_read():
    """A trainer's ``save()`` writes on the main process and ``finish()`` calls ``load()`` next
    on every rank: the finding is at the read and names the write and both calls."""
    code = (
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, model):\n"
        "        self.accelerator = Accelerator()\n"
        "        self.model = self.accelerator.prepare(model)\n\n"
        "    def save(self, path):\n"
        "        if self.accelerator.is_main_process:\n"
        "            torch.save(self.model.state_dict(), path)\n\n"
        "    def load(self, path):\n"
        "        return torch.load(path)\n\n"
        "    def finish(self, path):\n"
        "        self.save(path)\n"
        "        self.load(path)\n"
    )
    finding = the_finding(code, "ACC212")
    assert finding.line == 15
    assert "written at line 12" in finding.message
    assert "between the calls at lines 18 and 19" in finding.message
    assert "self.accelerator.wait_for_everyone()" in finding.message


_STAGES = (
    "import torch\nfrom accelerate import Accelerator\n\n"
    "accelerator = Accelerator()\n"
    "model = accelerator.prepare(model)\n\n\n"
    "def run(stage):\n"
    "    if stage == 'fit':\n"
    "        if accelerator.is_main_process:\n"
    "            torch.save(model.state_dict(), 'best.pt')\n"
    "    elif stage == 'test':\n"
    "        model.load_state_dict(torch.load('best.pt'))\n\n\n"
)


@pytest.mark.parametrize(
    "calls", ["run('fit')\nrun('test')\n", "for stage in ['fit', 'test']:\n    run(stage)\n"]
)
def test_a_branch_on_a_parameter_every_call_fills_alike_is_plain_barrier_advice(calls):
    """``def run(stage): if stage == "fit": ...`` run as ``run("fit")`` then ``run("test")`` (or
    over a literal list): every rank takes the branch alike, so the advice is the barrier alone,
    not to reduce a string across the ranks."""
    finding = the_finding(_STAGES + calls, "ACC212")
    assert finding.line == 13
    assert finding.message.startswith("Call accelerator.wait_for_everyone() before this read")


def test_a_branch_on_a_parameter_a_call_fills_per_rank_keeps_the_branch_advice():
    """The same helper called with a per-rank value: the ranks may disagree on the branch."""
    code = _STAGES + "run('fit' if loss.item() < best else 'test')\n"
    finding = the_finding(code, "ACC212")
    assert finding.message.startswith("Make every rank take the branch at line 9 alike")


def test_a_while_loops_training_step_is_not_advised_to_unwrap_the_model():
    """A step loop written as ``while`` (batches from ``next(it)``) trains as a ``for`` does: the
    model's own method called through the wrapper there runs layers whose gradients
    ``unwrap_model`` would leave unsynchronised, so the advice moves it into forward(); the
    same method under ``no_grad`` is plain unwrap advice."""
    code = (
        "from accelerate import Accelerator\nimport torch\naccelerator = Accelerator()\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "model.train()\nit = iter(loader)\nstep = 0\n"
        "while step < max_steps:\n"
        "    batch = next(it)\n"
        "    with torch.no_grad():\n"
        "        target = model.encode(batch)\n"
        "    z = model.encode(batch)\n"
        "    accelerator.backward((z - target).pow(2).mean())\n"
        "    optimizer.step()\n"
        "    step += 1\n"
    )
    trained = the_finding(code, "ACC104", line=12)
    assert "in a training step" in trained.message
    assert "compute it in the model's forward()" in trained.message
    frozen = the_finding(code, "ACC104", line=11)
    assert "Call this through accelerator.unwrap_model(model).encode:" in frozen.message


def test_a_scheduler_inside_accumulate_of_an_accelerator_that_never_accumulates():
    """``accumulate()`` on ``Accelerator()`` (no gradient_accumulation_steps) syncs on every
    batch: an unprepared scheduler stepped inside it is not stepped "per batch, N times per
    optimizer step" (a motion-transfer GAN wraps each model in accumulate); it is still
    unprepared, sized on the whole dataset while each rank steps its shard."""
    code = (
        "import torch\nfrom accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=8)\n"
        "sched = torch.optim.lr_scheduler.OneCycleLR(\n"
        "    optimizer, max_lr=0.1, total_steps=len(dataset) // 8 * epochs\n)\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "for epoch in range(epochs):\n"
        "    for x in loader:\n"
        "        with accelerator.accumulate(model):\n"
        "            accelerator.backward(model(x).sum())\n"
        "            optimizer.step()\n"
        "            sched.step()\n"
        "            optimizer.zero_grad()\n"
    )
    plain = the_finding(code, "ACC401", line=14)
    assert "sync_gradients" not in plain.message
    assert "Pass scheduler `sched` to accelerator.prepare" in plain.message
    accumulating = code.replace("Accelerator()", "Accelerator(gradient_accumulation_steps=4)")
    assert "sync_gradients" in the_finding(accumulating, "ACC401", line=14).message


def test_wrapper_attribute_advice_names_no_accelerator_the_helper_cannot_see():
    """A DDPM trainer's ``train_step(model, x)`` reads ``model.scheduler`` off the prepared
    model; the helper has no Accelerator in scope (main() made it), so the advice names none
    (``accelerator.unwrap_model`` there would be a NameError); main's own read names it."""
    code = (
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        "def train_step(model, x):\n"
        "    t = torch.randint(0, model.scheduler.config['steps'], (x.shape[0],))\n"
        "    return model(x, t).mean()\n\n\n"
        "def main():\n"
        "    acc = Accelerator()\n"
        "    model, optimizer, loader = acc.prepare(model, optimizer, loader)\n"
        "    for x in loader:\n"
        "        acc.backward(train_step(model, x))\n"
        "        optimizer.step()\n"
        "    print(model.scheduler)\n"
    )
    helper = the_finding(code, "ACC104", line=6)
    assert "unwrap_model(model).scheduler.config['steps'] of the Accelerator that prepared it" in (
        helper.message
    )
    assert "accelerator." not in helper.message
    assert "acc.unwrap_model(model).scheduler" in the_finding(code, "ACC104", line=16).message


_PATIENCE_CLASS = """
class EarlyStopping:
    def __init__(self, patience=7, delta=0):
        self.patience, self.delta = patience, delta
        self.counter, self.best_score, self.early_stop = 0, None, False

    def __call__(self, val_loss, model):
        score = -val_loss
        if self.best_score is None:
            self.best_score = score
        elif score < self.best_score + self.delta:
            self.counter += 1
            if self.counter >= self.patience:
                self.early_stop = True
        else:
            self.best_score, self.counter = score, 0


class Trainer:
    def __init__(self, model, optimizer, loader, val_loader):
        self.model, self.optimizer, self.loader, self.val_loader = accelerator.prepare(
            model, optimizer, loader, val_loader
        )
        self.early_stopping = EarlyStopping(patience=5)

    def validate(self):
        losses = []
        with torch.no_grad():
            for x, y in self.val_loader:
                losses.append(loss_fn(self.model(x), y).item())
        val_loss = sum(losses) / len(losses)
        self.early_stopping(val_loss, self.model)

    def fit(self, epochs):
        for epoch in range(epochs):
            for x, y in self.loader:
                accelerator.backward(loss_fn(self.model(x), y))
                self.optimizer.step()
            self.validate()
            if self.early_stopping.early_stop:
                break
"""


def test_an_early_stopping_object_a_helper_hands_the_rank_s_loss_is_fixed_at_that_call():
    """The common EarlyStopping class, handed this rank's validation loss in the trainer's
    ``validate()``: its flag, tested in ``fit``, stops this rank alone. The advice reduces the
    loss before the call in ``validate`` (line 34), the line the user fixes."""
    code = HEADER + "import torch\n" + _PATIENCE_CLASS
    found = the_finding(code, "ACC420", line=44)
    assert "reads self.early_stopping.early_stop" in found.message
    # the counter it tests is stepped under ``score < best`` (an unpacking resets it): of val_loss
    assert "EarlyStopping.__call__ sets at line 17 under `if self.counter >= " in found.message
    assert "a test of val_loss" in found.message
    assert "before the call at line 35 (`val_loss = accelerator.reduce(" in found.message
    reduced = code.replace(
        "        val_loss = sum(losses) / len(losses)\n",
        "        val_loss = accelerator.reduce(torch.tensor(sum(losses) / len(losses)), 'mean')\n",
    )
    assert [f for f in lint(reduced, "ACC420").findings if f.code == "ACC420"] == []


_MAIN_ONLY_STOPPER = (
    HEADER
    + """import torch


class EarlyStopping:
    def __init__(self, patience=3):
        self.patience, self.best, self.counter, self.early_stop = patience, float('inf'), 0, False

    def __call__(self, val_loss, model):
        if val_loss < self.best:
            self.best, self.counter = val_loss, 0
            torch.save(model.state_dict(), 'best.pt')
        else:
            self.counter += 1
            if self.counter >= self.patience:
                self.early_stop = True


model, optimizer, loader, val_loader = accelerator.prepare(model, optimizer, loader, val_loader)
stopper = EarlyStopping(patience=5)
for epoch in range(100):
    for x, y in loader:
        accelerator.backward(loss_fn(model(x), y))
        optimizer.step()
    val_loss = 0.0
    with torch.no_grad():
        for x, y in val_loader:
            val_loss += loss_fn(model(x), y).item()
    if accelerator.is_main_process:
        stopper(val_loss / len(val_loader), model)
    if stopper.early_stop:
        break
"""
)


def test_a_stopper_called_on_the_main_process_alone_is_never_advised_a_reduce_before_its_call():
    """The checkpointing EarlyStopping called under ``if accelerator.is_main_process:``: a
    reduce before the call (line 31) would run on the main process alone, a hang of its own. The
    advice is the trigger, or the reduce outside the guard with the call moved out of it."""
    found = the_finding(_MAIN_ONLY_STOPPER, "ACC420", line=33)
    assert "that call runs only under the rank test at line 30" in found.message
    assert "call accelerator.set_trigger() under the test at line 32" in found.message
    assert (
        "reduce the value on every rank, outside the rank test at line 30, and move the call at "
        "line 31 out of it" in found.message
    )
    assert "before the call at line 31" not in found.message


_MAIN_ONLY_COUNTER = _MAIN_ONLY_STOPPER.replace(
    "    if accelerator.is_main_process:\n        stopper(val_loss / len(val_loader), model)\n"
    "    if stopper.early_stop:\n",
    "    if accelerator.is_main_process:\n        if val_loss < best:\n"
    "            best, bad = val_loss, 0\n        else:\n            bad += 1\n"
    "    if bad >= patience:\n",
)


def test_a_counter_stepped_on_the_main_process_alone_is_never_advised_a_reduce_under_the_guard():
    found = the_finding(_MAIN_ONLY_COUNTER, "ACC420", line=36)
    assert "line 31 runs only under the rank test at line 30" in found.message
    assert "reduce the value on every rank before the rank test at line 30" in found.message
    assert "before the test at line 31" not in found.message


def test_a_stop_decided_on_the_main_process_on_its_own_value_is_one_finding():
    """One bug, one finding: the stop under the rank test on this rank's own value is ACC420's
    (its advice reduces the value too); ACC210, which sees the rank test alone, reports it only
    where ACC420 is not selected."""
    for code, line in ((_MAIN_ONLY_STOPPER, 33), (_MAIN_ONLY_COUNTER, 36)):
        both = lint_source(code.encode(), "example.py", Selection(select=["ACC210", "ACC420"]))
        assert [(f.code, f.line) for f in both.findings] == [("ACC420", line)]
        alone = lint(code, "ACC210").findings
        assert [(f.code, f.line) for f in alone] == [("ACC210", line)]


def test_a_decision_an_early_stopping_method_returns_is_followed_through_the_name_bound_to_it():
    stop = (
        HEADER
        + "import torch\n\n\nclass Patience:\n"
        + "    def __init__(self):\n"
        + "        self.best, self.bad = float('inf'), 0\n\n"
        + "    def update(self, metric):\n"
        + "        if metric < self.best:\n"
        + "            self.best, self.bad = metric, 0\n"
        + "        else:\n"
        + "            self.bad += 1\n"
        + "        return self.bad >= 3\n\n\n"
        + "model, optimizer, loader, val_loader = accelerator.prepare(\n"
        + "    model, optimizer, loader, val_loader\n)\n"
        + "patience = Patience()\n"
        + "for epoch in range(100):\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward(loss_fn(model(x), y))\n"
        + "    val_loss = 0.0\n"
        + "    for x, y in val_loader:\n"
        + "        val_loss += loss_fn(model(x), y).item()\n"
        + "    stop = patience.update(val_loss)\n"
        + "    if stop:\n"
        + "        break\n"
    )
    found = the_finding(stop, "ACC420", line=30)
    assert "reads stop, bound at line 28 to patience.update(val_loss)" in found.message
    assert "Patience.update" in found.message


@pytest.mark.parametrize(
    ("folded", "reported"),
    [
        ("sum(loss_fn(model(x), y).item() for x, y in val_loader)", True),
        ("np.mean([loss_fn(model(x), y).item() for x, y in val_loader])", True),
        ("sum(1 for _ in val_loader)", False),  # a count of batches: the same on every rank
        ("sum(len(y) for x, y in val_loader)", False),  # ... and of samples
        ("np.mean([accelerator.gather_for_metrics(loss_fn(model(x), y)).mean().item()", False),
    ],
)
def test_a_validation_loss_folded_by_a_comprehension_over_the_shard_is_the_rank_s_own(
    folded, reported
):
    if not folded.endswith(")"):
        folded += " for x, y in val_loader])"
    code = (
        HEADER
        + "import numpy as np\n\n\nclass Stopper:\n"
        + "    def __init__(self):\n"
        + "        self.best, self.bad, self.stop = float('inf'), 0, False\n\n"
        + "    def __call__(self, metric):\n"
        + "        if metric < self.best:\n"
        + "            self.best, self.bad = metric, 0\n"
        + "        else:\n"
        + "            self.bad += 1\n"
        + "        self.stop = self.bad >= 3\n\n\n"
        + "model, optimizer, loader, val_loader = accelerator.prepare(\n"
        + "    model, optimizer, loader, val_loader\n)\n"
        + "stopper = Stopper()\n"
        + "for epoch in range(100):\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward(loss_fn(model(x), y))\n"
        + f"    stopper({folded})\n"
        + "    if stopper.stop:\n"
        + "        break\n"
    )
    found = [(f.line, f.column) for f in lint(code, "ACC420").findings if f.code == "ACC420"]
    assert found == ([(27, 9)] if reported else [])
    unprepared = code.replace(", val_loader = accelerator", " = accelerator").replace(
        "    model, optimizer, loader, val_loader\n)", "    model, optimizer, loader\n)"
    )
    assert [f for f in lint(unprepared, "ACC420").findings if f.code == "ACC420"] == []


def test_a_plateau_metric_folded_by_a_comprehension_over_the_shard_is_the_rank_s_own():
    code = (
        HEADER
        + "import numpy as np\nimport torch\n"
        + "model, optimizer, loader, val_loader = accelerator.prepare(\n"
        + "    model, optimizer, loader, val_loader\n)\n"
        + "scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)\n"
        + "for epoch in range(100):\n"
        + "    for x, y in loader:\n"
        + "        accelerator.backward(loss_fn(model(x), y))\n"
        + "    val_loss = np.mean([loss_fn(model(x), y).item() for x, y in val_loader])\n"
        + "    scheduler.step(val_loss)\n"
    )
    assert "computed at line 12" in the_finding(code, "ACC409", line=13).message
    gathered = code.replace(
        "loss_fn(model(x), y).item() for",
        "accelerator.gather_for_metrics(loss_fn(model(x), y)).mean().item() for",
    )
    assert [f for f in lint(gathered, "ACC409").findings if f.code == "ACC409"] == []


def test_a_fixed_count_scheduler_stepped_at_every_micro_batch_is_advised_its_size():
    """A MeanFlow trainer: ``lr_scheduler.step()`` inside ``accumulate()`` with no
    ``sync_gradients`` test. Left out of prepare (or with ``step_scheduler_with_optimizer=False``)
    it would step at every micro-batch, so the only right advice is to size it for the N steps."""
    code = (
        "import torch\nfrom accelerate import Accelerator\n"
        "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
        "max_steps = 5000\n"
        "optimizer = torch.optim.AdamW(model.parameters())\n"
        "scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=max_steps)\n"
        "model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)\n"
        "step = 0\n"
        "while step < max_steps:\n"
        "    with accelerator.accumulate(model):\n"
        "        accelerator.backward(model(next(batches)))\n"
        "        optimizer.step()\n"
        "        scheduler.step()\n"
        "        optimizer.zero_grad()\n"
        "    if accelerator.sync_gradients:\n"
        "        step += 1\n"
    )
    finding = the_finding(code, "ACC410")
    assert "times accelerator.num_processes" in finding.message
    assert "accelerator.accumulate() (line 10)" in finding.message
    assert "leave it out of prepare" not in finding.message


def test_a_scheduler_sized_before_prepare_and_stepped_in_a_helper_names_its_size():
    """The helper that steps the scheduler is written above ``main``, which sizes it from the
    loader and prepares the loader before calling the helper: the schedule is the whole
    loader's, stepped over one rank's shard, and the finding says so (not "not stepped with
    the optimizer": the helper steps it with the optimizer)."""
    code = (
        "import torch\n"
        "from accelerate import Accelerator\n"
        "from transformers import get_cosine_schedule_with_warmup\n"
        "def train(accelerator, loader, model, optimizer, scheduler):\n"
        "    for idx, (x, y) in enumerate(loader):\n"
        "        accelerator.backward((model(x) - y).pow(2).mean() / 4)\n"
        "        if (idx + 1) % 4 == 0:\n"
        "            optimizer.step()\n"
        "            optimizer.zero_grad()\n"
        "            scheduler.step()\n"
        "def main(args):\n"
        "    accelerator = Accelerator()\n"
        "    model = torch.nn.Linear(4, 1)\n"
        "    optimizer = torch.optim.AdamW(model.parameters())\n"
        "    loader = torch.utils.data.DataLoader(args.data, batch_size=8, shuffle=True)\n"
        "    scheduler = get_cosine_schedule_with_warmup(\n"
        "        optimizer, 0, args.epochs * len(loader) // 4\n"
        "    )\n"
        "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "    for epoch in range(args.epochs):\n"
        "        train(accelerator, loader, model, optimizer, scheduler)\n"
    )
    finding = the_finding(code, "ACC401")
    assert finding.line == 10
    assert "sized from len(loader) at line 17, before prepare" in finding.message


def test_a_reduce_that_says_sum_is_told_it_sums_not_that_it_sums_by_default():
    code = (
        HEADER
        + "for x, y in loader:\n"
        + "    loss = model(x).sub(y).pow(2).mean()\n"
        + "    accelerator.backward(loss)\n"
        + '    print(accelerator.reduce(loss.detach(), reduction="sum").item())\n'
    )
    (finding,) = [f for f in lint(code, "ACC416").findings if f.code == "ACC416"]
    assert "this reduce sums" in finding.message
    assert "by default" not in finding.message
    default = code.replace(', reduction="sum"', "")
    (finding,) = [f for f in lint(default, "ACC416").findings if f.code == "ACC416"]
    assert "sums by default" in finding.message


def test_scheduler_sized_through_an_alias_or_a_parameter_names_the_prepare():
    """``train_loader = loaders["train"]`` of a dict prepared entry by entry, and a helper's
    parameter filled with a prepared loader: the message names the line that prepared it."""
    rule = next(r for r in RULES if r.code == "ACC415")
    aliased = next(e for e in rule.bad if 'train_loader = loaders["train"]' in e.code)
    assert "(prepared at line 7)" in the_finding(aliased.code, "ACC415").message
    helper = next(e for e in rule.bad if "def setup_scheduler(" in e.code)
    assert "(prepared at line 13)" in the_finding(helper.code, "ACC415").message


def test_a_scheduler_sized_per_rank_and_stepped_a_fixed_count_is_one_finding():
    """review11b: the record's scheduler sized with len(dataloader) // num_processes and stepped
    by a while loop bounded by that same count is one bug at one argument; ACC410 alone reports
    it, and with both rules on only ACC415's finding, which names the sizing, is left."""
    from accelify.rules.scheduler_sized_per_rank import _RECORD_RUN

    code = _RECORD_RUN.replace(
        "    batches = iter(run.dataloader)\n    while True:\n"
        "        batch = next(batches, None)\n        if batch is None:\n            break\n",
        "    batches = iter(run.dataloader)\n    step = 0\n"
        "    while step < run.total_steps:\n        batch = next(batches)\n",
    ).replace(
        "        run.optimizer.zero_grad()\n",
        "        run.optimizer.zero_grad()\n        step += 1\n",
    )
    assert "while step < run.total_steps:" in code
    alone = [(f.line, f.column, f.code) for f in lint(code, "ACC410").findings]
    assert alone == [(23, 62, "ACC410")]
    both = lint_source(code.encode(), "example.py", Selection(select=["ACC410", "ACC415"]))
    assert [(f.line, f.column, f.code) for f in both.findings] == [(23, 62, "ACC415")]


def test_a_loss_total_from_a_step_helper_returning_item_is_reduced_as_a_tensor():
    """A tabular trainer's ``loss, pred = self.make_step(batch, False)`` returns ``loss.item()``:
    the advice makes the float total a tensor first (``reduce`` refuses floats)."""
    from accelify.rules.ungathered_metric import UngatheredMetric

    finding = the_finding(UngatheredMetric.bad[-1].code, "ACC403")
    assert "reduce(torch.tensor(total_loss, device=self.accelerator.device)" in finding.message


def test_a_loss_total_beside_per_rank_prediction_lists_names_them_too():
    """A finance classifier's validation sums its loss and collects predictions and labels for
    an accuracy: reducing the loss alone would leave the accuracy this rank's, so the message
    names the lists (and not the sample count the loss advice already covers)."""
    code = (
        HEADER
        + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
        + "total_loss, seen, preds, golds = 0, 0, [], []\n"
        + "with torch.no_grad():\n"
        + "    for batch in loader:\n"
        + "        golds += batch['labels'].tolist()\n"
        + "        out = model(**batch)\n"
        + "        total_loss += out.loss.item()\n"
        + "        seen += len(batch['labels'])\n"
        + "        preds += out.logits.argmax(-1).tolist()\n"
    )
    finding = the_finding(code, "ACC403")
    assert finding.line == 10
    assert "`golds`, `preds` also hold this rank's batches only" in finding.message
    assert "`seen`" not in finding.message


_BUCKET_SAMPLER = """
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset
from accelerate import Accelerator


class BucketSampler(Sampler):
    def __init__(self, n):
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self):
        return self.n


accelerator = Accelerator()
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = DataLoader(data, batch_size=4, sampler=BucketSampler(32))
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for epoch in range(2):
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_loader_of_a_bucket_sampler_is_reported_and_advised_its_own_set_epoch():
    """A project's own sampler seeded by its epoch does not shard: the loader reads the whole
    data set on every rank. Prepared, ``loader.sampler`` is not the sampler it reads (a copy),
    so the advice is the loader's own ``set_epoch``, which reaches that copy."""
    finding = the_finding(_BUCKET_SAMPLER, "ACC401")
    assert finding.line == 30  # the loop over the loader
    assert "call `loader.set_epoch(epoch)` instead" in finding.message


def test_a_settings_object_read_for_its_accumulation_steps_is_no_accelerator():
    """``self.args.accumulate`` is a number the trainer reads, not ``accumulate()`` called: the
    advice unwraps through the trainer's own accelerator, never through its settings."""
    from accelify.rules.wrapper_attribute import WrapperAttribute

    example = next(e for e in WrapperAttribute.bad if "compute_loss" in e.code)
    finding = the_finding(example.code, "ACC104")
    assert "self.accelerator.unwrap_model(self.model).compute_loss" in finding.message
    assert "self.args" not in finding.message


def test_a_data_set_split_by_rank_by_hand_is_advised_a_gather_not_a_prepare():
    """``Subset(full, range(accelerator.process_index, n, accelerator.num_processes))``: each rank
    reads its own part already, so gathered predictions against its own labels are 1/N of the
    rows, and gathering the labels too is the fix; gathered inline, nothing is reported."""
    code = (
        "import torch\nfrom accelerate import Accelerator\nfrom torch.utils.data import Subset\n"
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "world = accelerator.num_processes\n"
        "part = Subset(full, range(accelerator.process_index, len(full), world))\n"
        "loader = torch.utils.data.DataLoader(part, batch_size=8)\ncorrect = 0\n"
        "with torch.no_grad():\n    for x, y in loader:\n"
        "        preds = accelerator.gather(model(x).argmax(-1))\n"
        "        correct += (preds == y).sum().item()\n"
        "accelerator.print(correct / len(full))\n"
    )
    finding = the_finding(code, "ACC403")
    assert finding.line == 13
    assert finding.message.startswith("Gather `y` in the same accelerator.gather_for_metrics")
    inline = code.replace("(preds == y)", "(preds == accelerator.gather(y))")
    assert [f for f in lint(inline, "ACC403").findings if f.code == "ACC403"] == []


def test_a_total_gathered_over_an_unprepared_loader_is_one_finding_at_the_total():
    """Every rank reads the unprepared loader whole and the gather sums N copies: ACC403 reports
    the total a user sees (N times the accuracy), with the prepare advice; ACC401's finding at
    the loader (or at the argument a caller hands the helper) is that bug, so it is dropped
    where both rules run. Divided by a count of what was gathered, the ratio is right: ACC403
    says nothing and ACC401 keeps its own finding."""
    code = (
        "import torch\nfrom accelerate import Accelerator\n"
        "from torch.utils.data import DataLoader\n\n\n"
        "def evaluate(model, loader, accelerator):\n    correct = 0\n"
        "    with torch.no_grad():\n        for x, y in loader:\n"
        "            preds, labels = accelerator.gather_for_metrics((model(x).argmax(-1), y))\n"
        "            correct += (preds == labels).sum().item()\n"
        "    return correct / len(loader.dataset)\n\n\n"
        "accelerator = Accelerator()\n"
        "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)\n"
        "test_loader = DataLoader(test_set, batch_size=64)\n"
        "accelerator.print(evaluate(model, test_loader, accelerator))\n"
    )
    both = Selection(select=["ACC401", "ACC403"])
    findings = lint_source(code.encode(), "example.py", both).findings
    assert [(f.code, f.line) for f in findings] == [("ACC403", 11)]
    assert findings[0].message.startswith("Pass test_loader to accelerator.prepare")
    assert "line 12 divides it by len(loader.dataset)" in findings[0].message
    alone = [(f.code, f.line) for f in lint(code, "ACC401").findings]
    assert alone == [("ACC401", 18)]  # the argument, when ACC401 runs alone
    ratio = code.replace("correct = 0\n", "correct = total = 0\n").replace(
        ".sum().item()\n", ".sum().item()\n            total += labels.size(0)\n"
    )
    ratio = ratio.replace("len(loader.dataset)", "total")
    findings = lint_source(ratio.encode(), "example.py", both).findings
    assert [(f.code, f.line) for f in findings] == [("ACC401", 19)]
    # a second unprepared loader handed on the same line, read by a loop with no wrong total:
    # ACC403 covers test_loader's argument only, val_loader's ACC401 stays
    two = code.replace(
        "def evaluate(model, loader, accelerator):",
        "def evaluate(model, loader, other, accelerator):",
    )
    two = two.replace(
        "    return correct",
        "        for x, y in other:\n"
        "            preds, labels = accelerator.gather_for_metrics((model(x).argmax(-1), y))\n"
        "            accelerator.print((preds == labels).float().mean())\n"
        "    return correct",
    )
    two = two.replace(
        "evaluate(model, test_loader, accelerator)",
        "evaluate(model, test_loader, val_loader, accelerator)",
    ).replace(
        "accelerator.print(evaluate",
        "val_loader = DataLoader(val_set, batch_size=64)\naccelerator.print(evaluate",
    )
    findings = lint_source(two.encode(), "example.py", both).findings
    assert [(f.code, f.line, f.column) for f in findings] == [
        ("ACC403", 11, 13),
        ("ACC401", 22, 48),
    ]
    assert "`val_loader`" in findings[1].message


def test_a_batch_sampler_over_a_distributed_sampler_is_advised_a_rebuild_that_runs():
    """``shuffle=True`` beside ``batch_sampler=`` is refused by the DataLoader itself: the advice
    rebuilds the batch sampler over the whole data set, code that builds and lints clean."""
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    from accelify.rules.distributed_sampler_prepared import DistributedSamplerPrepared

    example = next(e for e in DistributedSamplerPrepared.bad if "BatchSampler" in e.code)
    finding = the_finding(example.code, "ACC402")
    advised = "BatchSampler(RandomSampler(data), batch_size=8, drop_last=False)"
    assert f"(`{advised}`)" in finding.message
    assert "shuffle=True" not in finding.message
    data = torch.utils.data.TensorDataset(torch.arange(20))
    with pytest.raises(ValueError):
        DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), 8, False), shuffle=True)
    loader = DataLoader(
        data, batch_sampler=BatchSampler(RandomSampler(data), batch_size=8, drop_last=False)
    )
    assert sorted(int(i) for (batch,) in loader for i in batch) == list(range(20))
    fixed = example.code.replace(
        "BatchSampler(DistributedSampler(data), batch_size=8, drop_last=False)", advised
    ).replace(
        "from torch.utils.data import BatchSampler\n",
        "from torch.utils.data import BatchSampler, RandomSampler\n",
    )
    assert [f for f in lint(fixed, "ACC402").findings if f.code == "ACC402"] == []


def test_a_forward_in_the_header_of_a_loop_over_the_batch_is_linted_not_crashed_on():
    """``for p, t in zip(model(x).argmax(-1), y):`` inside an evaluation loop: the forward has
    no statement of its own, which the evaluation analysis once took for granted (lint and
    convert stopped with an internal error on the file)."""
    code = (
        "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "model, loader = accelerator.prepare(model, loader)\ncorrect = 0\n"
        "with torch.no_grad():\n    for x, y in loader:\n"
        "        for p, t in zip(model(x).argmax(-1), y):\n"
        "            correct += int(p == t)\n"
        "print(correct)\n"
    )
    findings = lint_source(code.encode(), "example.py", Selection()).findings
    assert ("ACC403", 9) in [(f.code, f.line) for f in findings]


def test_one_wrapper_attribute_read_twice_in_one_statement_is_one_finding():
    """``model.weight.shape, model.weight.dtype`` on the DDP wrapper is one bug (one
    unwrap_model to add), reported once; another attribute of the same call is its own."""
    code = (
        "import torch\n" + HEADER + "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model, opt = accelerator.prepare(model, opt)\n"
    )
    same = code + "print(model.weight.shape, model.weight.dtype)\n"
    assert the_finding(same, "ACC104").line == 7
    module = code + "print(model.module.weight.shape, model.module.bias.shape)\n"
    assert the_finding(module, "ACC104").line == 7
    both = code + "print(model.weight.shape, model.bias.shape)\n"
    assert [f.column for f in lint(both, "ACC104").findings if f.code == "ACC104"] == [7, 27]


def test_a_barrier_on_some_epochs_only_is_named_where_the_read_races():
    """ACC212: a barrier under ``if epoch % 5 == 0:`` orders the read on those epochs only;
    the message names it and says to call it on every pass."""
    from rules.read_before_written import _EVERY_EPOCH

    code = _EVERY_EPOCH.format(
        barrier="    if epoch % 5 == 0:\n        accelerator.wait_for_everyone()\n"
    )
    message = the_finding(code, "ACC212").message
    assert "the barrier at line 8 runs only when `epoch % 5 == 0` (line 7)" in message


def test_an_exit_names_where_the_others_wait_on_every_pass():
    """ACC210: after the main process leaves the epoch loop, the others wait at the next
    collective that runs on every pass (the next epoch's backward), not at a barrier that runs
    every fifth epoch only."""
    code = (
        HEADER
        + "for epoch in range(epochs):\n"
        + "    for x in loader:\n"
        + "        accelerator.backward(model(x).sum())\n"
        + "    if accelerator.is_main_process and done(epoch):\n"
        + "        break\n"
        + "    if epoch % 5 == 0:\n"
        + "        accelerator.wait_for_everyone()\n"
    )
    message = the_finding(code, "ACC210").message
    assert "the others go on to the collective at line 5 " in message


@pytest.mark.parametrize(
    ("loaded", "reason"),
    [
        ("model", "DistributedDataParallel copies the main process's weights"),
        ("optimizer", "keep their own optimizer state (moments, step counts)"),
        ("scheduler", "keep their own schedule (its step count)"),
    ],
)
def test_a_trainers_state_loaded_on_one_rank_is_explained_by_what_it_is(loaded, reason):
    """A trainer handed its objects by a caller the file does not show (their kinds unknown):
    the optimizer's and the scheduler's state loaded on the main process alone is not
    explained as DDP's copy of the model's weights (review9a)."""
    code = (
        "import torch\nfrom accelerate import Accelerator\n\n\n"
        "class Trainer:\n"
        "    def __init__(self, model, optimizer, scheduler, loader):\n"
        "        self.accelerator = Accelerator()\n"
        "        self.model, self.optimizer, self.scheduler, self.loader = (\n"
        "            self.accelerator.prepare(model, optimizer, scheduler, loader))\n\n"
        "    def load(self, path):\n"
        "        if not self.accelerator.is_main_process:\n"
        "            return\n"
        f"        self.{loaded}.load_state_dict(torch.load(path)['x'])\n\n"
        "    def train(self, path):\n"
        "        self.load(path)\n"
        "        for batch in self.loader:\n"
        "            self.accelerator.backward(self.model(batch).sum())\n"
        "            self.optimizer.step()\n"
        "            self.scheduler.step()\n"
    )
    found = the_finding(code, "ACC213")
    assert (found.line, reason in found.message) == (14, True), found.message
    assert "outside the rank test at line 12" in found.message


def test_a_dict_of_loaders_prepared_whole_is_told_to_prepare_its_entries():
    """``accelerator.prepare(loaders)`` of a dict hands the dict back as it is: the advice is
    not "pass it to prepare" (it was) but the same call with the entries the file reads (run on
    2 ranks, fixtures/lint/projects/loader_dict_of_another_module_prepared_by_entry_good)."""
    finding = the_finding(
        "import torch\nfrom accelify import Accelerator\naccelerator = Accelerator()\n"
        'loaders = {"train": torch.utils.data.DataLoader(data, batch_size=8)}\n'
        "model, optimizer, loaders = accelerator.prepare(model, optimizer, loaders)\n"
        'for x, y in loaders["train"]:\n'
        "    accelerator.backward(model(x).sum())\n"
        "    optimizer.step()\n",
        "ACC401",
        line=6,
    )
    assert "accelerator.prepare hands a dict back as it is (line 5)" in finding.message
    assert (
        '`model, optimizer, loaders["train"] = accelerator.prepare(model, optimizer, '
        'loaders["train"])`'
    ) in finding.message
    assert "Pass DataLoader" not in finding.message


def test_a_return_before_the_backward_is_advised_its_own_test_gathered():
    """ACC420's advice keeps the user's test (review10b): ``if loss.item() > 100.0: return``
    was told to gather ``torch.isnan(loss)``, a test it never made."""
    from rules.stop_on_own_value import _NAN_STEP

    kept = the_finding(_NAN_STEP.format(nan="loss.item() > 100.0"), "ACC420")
    assert (
        "`if self.accelerator.gather(torch.tensor(loss.item() > 100.0, "
        "device=self.accelerator.device)).any():`" in kept.message
    )
    assert "isnan" not in kept.message
    nan = the_finding(_NAN_STEP.format(nan="torch.isnan(loss)"), "ACC420")
    assert "`if self.accelerator.gather(torch.isnan(loss)).any():`" in nan.message


def test_a_trained_models_own_method_in_a_training_step_is_not_advised_unwrap_model():
    """lintreal41 (a TTS GRPO trainer): ``self.model = model``, its optimizer built from
    ``model.parameters()``, both prepared; ``self.model.forward_rl(batch)`` in the training
    step was told to call it through unwrap_model, which runs the layers past the wrapper and
    leaves their gradients unaveraged: the replicas drift apart silently."""
    from rules.wrapper_attribute import WrapperAttribute

    (example,) = (
        example
        for example in WrapperAttribute.bad
        if "self.model.forward_rl(" in example.code and "ref_model" not in example.code
    )
    finding = the_finding(example.code, "ACC104")
    assert finding.line == example.line
    assert "compute it in the model's forward() and call self.model(...)" in finding.message
    assert not finding.message.startswith("Call this through")


def test_a_read_in_a_helper_also_called_on_one_rank_is_advised_the_wait_at_its_every_rank_call():
    """A helper saves the model and loads its weights file back; every rank calls it, and the
    main process alone calls it again: a barrier inside it would wait alone in that second
    call, so the advice puts the wait after the every-rank call (review11b)."""
    code = (
        HEADER
        + "import torch\n\n\ndef save_and_reload(model, path):\n"
        + "    accelerator.save_model(model, path)\n"
        + "    return torch.load(path + '/pytorch_model.bin')\n\n\n"
        + "state = save_and_reload(model, 'last')\n"
        + "if accelerator.is_main_process:\n"
        + "    best = save_and_reload(model, 'best')\n"
    )
    finding = the_finding(code, "ACC212")
    assert finding.line == 8
    assert "Call accelerator.wait_for_everyone() before this read" not in finding.message
    assert "called on some ranks only (line 13)" in finding.message
    assert "at the calls every rank makes (line 11)" in finding.message
    unguarded = code.replace(
        "if accelerator.is_main_process:\n    best = save_and_reload(model, 'best')\n", ""
    )
    assert "Call accelerator.wait_for_everyone() before this read" in (
        the_finding(unguarded, "ACC212").message
    )


def test_scaled_backward_covers_the_grad_scaler_it_drops():
    """lintreal42 (a time-series trainer whose Accelerator comes from its base class): ACC301's
    advice for ``scaler.scale(loss).backward()`` drops the GradScaler, so ACC504's finding where
    the scaler is made is the same bug, reported once; with ACC301 left out ACC504 stays."""
    code = (
        "import torch\n"
        "from exp_basic import ExpBasic\n\n\n"
        "class Exp(ExpBasic):\n"
        "    def train(self, loader, optimizer):\n"
        "        scaler = torch.cuda.amp.GradScaler()\n"
        "        self.model, loader, optimizer = self.accelerator.prepare(\n"
        "            self.model, loader, optimizer)\n"
        "        for x, y in loader:\n"
        "            loss = (self.model(x) - y).pow(2).mean()\n"
        "            scaler.scale(loss).backward()\n"
        "            scaler.step(optimizer)\n"
        "            scaler.update()\n"
    )
    both = lint_source(code.encode(), "example.py", Selection(select=["ACC301", "ACC504"]))
    assert [(f.code, f.line) for f in both.findings] == [("ACC301", 12)]
    alone = lint(code, "ACC504")
    assert [(f.code, f.line) for f in alone.findings] == [("ACC504", 7)]


def test_never_stepped_names_every_test_that_parts_a_step():
    """lintreal42 (a time-series Exp): one step under ``if use_amp:`` (``scaler.step``), the
    other in the ``else`` under ``if not accelerate``; the accelerate path backwards and never
    steps. The finding names both tests, and advises the step on this path: after the outer
    if/else it would step twice on the GradScaler's path."""
    code = (
        "import torch\n"
        "from accelerate import Accelerator\n\n"
        "accelerator = Accelerator()\n"
        "model, opt, loader = accelerator.prepare(model, opt, loader)\n"
        "for x, y in loader:\n"
        "    opt.zero_grad()\n"
        "    loss = (model(x) - y).pow(2).mean()\n"
        "    if args.use_amp:\n"
        "        scaler.scale(loss).backward()\n"
        "        scaler.step(opt)\n"
        "        scaler.update()\n"
        "    else:\n"
        "        if args.accelerate:\n"
        "            accelerator.backward(loss)\n"
        "        else:\n"
        "            loss.backward()\n"
        "            opt.step()\n"
    )
    finding = the_finding(code, "ACC312")
    assert finding.line == 15
    assert "line 9 (`args.use_amp`), line 14 (`args.accelerate`)" in finding.message
    assert "right after this backward, on this path" in finding.message
    assert "after the if/else" not in finding.message


def test_a_clip_the_accelerators_cannot_replace_is_told_to_unscale_first():
    """``clip_grad_norm_(..., error_if_nonfinite=True)``: accelerator.clip_grad_norm_ takes no
    such argument (the converter keeps the clip, golden clip_grad_arguments), so the advice is
    to unscale before it, which the rule leaves silent; a plain clip keeps its fix."""
    kept = "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)\n"
    found = the_finding(HEADER + "import torch\n" + kept, "ACC302")
    assert found.message.startswith("Call accelerator.unscale_gradients() before this clip")
    assert "takes no error_if_nonfinite=" in found.message and found.fix is None
    plain = the_finding(
        HEADER + "import torch\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", "ACC302"
    )
    assert plain.message.startswith("Use accelerator.clip_grad_norm_") and plain.fix is not None
