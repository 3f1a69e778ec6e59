"""Values every rank holds alike (accelify/analysis/agreed_values.py): a greedy token of the
prepared model in eval mode, a name bound only under tests every rank decides alike."""

from __future__ import annotations

import textwrap

import libcst as cst

from accelify.analysis.agreed_values import AgreedValues
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import analyze
from accelify.analysis.syntax import walk

TRAINED = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randint(1, 9, (32, 4))), batch_size=8)
model = nn.Sequential(nn.Embedding(9, 8), nn.Linear(8, 9))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for (x,) in loader:
    loss = model(x).logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
"""


def _agreed_at_module(source: str) -> frozenset[str]:
    model = analyze(cst.parse_module(textwrap.dedent(TRAINED) + textwrap.dedent(source)))
    return AgreedValues(facts_of(model), lambda evaluation: True).names(model.module)


def test_a_greedy_token_of_the_model_in_eval_mode_is_agreed():
    agreed = _agreed_at_module(
        """
        model.eval()
        generated = [5]
        for _ in range(10):
            logits = model(torch.tensor([generated], device="cpu"))
            next_tok = logits[0, -1].argmax().item()
            generated.append(next_tok)
        """
    )
    assert {"generated", "logits", "next_tok"} <= agreed


def test_a_sampled_token_is_not_agreed():
    agreed = _agreed_at_module(
        """
        model.eval()
        generated = [5]
        for _ in range(10):
            logits = model(torch.tensor([generated]))
            next_tok = torch.multinomial(logits[0, -1].softmax(-1), 1).item()
            generated.append(next_tok)
        """
    )
    assert "next_tok" not in agreed
    assert "generated" not in agreed  # it holds what was appended


def test_the_model_in_train_mode_is_not_agreed():
    agreed = _agreed_at_module(
        """
        model.train()
        logits = model(torch.tensor([[5]]))
        """
    )
    assert "logits" not in agreed


def test_a_counter_stepped_under_a_test_of_this_ranks_loss_is_not_agreed():
    agreed = _agreed_at_module(
        """
        bad = 0
        if loss.item() > 1.0:
            bad += 1
        """
    )
    assert "bad" not in agreed


def test_a_write_through_a_subscript_binds_the_dict():
    agreed = _agreed_at_module(
        """
        state = {"done": False}
        state["done"] = loss.item() < 0.3
        """
    )
    assert "state" not in agreed


def test_a_write_of_a_constant_through_a_subscript_keeps_the_dict_agreed():
    agreed = _agreed_at_module(
        """
        state = {"done": False}
        state["done"] = True
        """
    )
    assert "state" in agreed


def test_a_flag_set_in_a_loop_over_this_ranks_values_is_not_agreed():
    agreed = _agreed_at_module(
        """
        stop = False
        history = [loss.item()]
        for h in [v for v in history if v > 5]:
            stop = True
        """
    )
    assert "stop" not in agreed


def test_a_flag_set_in_a_loop_over_a_range_of_constants_is_agreed():
    agreed = _agreed_at_module(
        """
        stop = False
        for i in range(3):
            stop = True
        """
    )
    assert "stop" in agreed


def test_an_eval_before_a_loop_that_trains_is_not_eval_mode():
    agreed = _agreed_at_module(
        """
        model.eval()
        for _ in range(3):
            logits = model(torch.tensor([[5]]))
            model.train()
        """
    )
    assert "logits" not in agreed


def test_an_eval_under_a_test_is_not_eval_mode():
    agreed = _agreed_at_module(
        """
        import sys
        if len(sys.argv) > 1:
            model.eval()
        logits = model(torch.tensor([[5]]))
        """
    )
    assert "logits" not in agreed


def test_an_eval_again_in_each_round_of_a_loop_that_trains_is_eval_mode():
    agreed = _agreed_at_module(
        """
        for _ in range(3):
            model.eval()
            logits = model(torch.tensor([[5]]))
            model.train()
        """
    )
    assert "logits" in agreed


def test_a_helper_handed_agreed_values_returns_an_agreed_value():
    # ``ratio(a, b)`` reads only its parameters: agreed where it is handed agreed values
    agreed = _agreed_at_module(
        """
        def ratio(part, whole):
            return part / whole

        correct, seen = 3, 4
        acc = ratio(correct, seen)
        """
    )
    assert "acc" in agreed


def test_a_helper_handed_a_rank_s_own_value_does_not_return_an_agreed_one():
    agreed = _agreed_at_module(
        """
        def ratio(part, whole):
            return part / whole

        mine = ratio(loss.item(), 4)
        """
    )
    assert "mine" not in agreed


def _agreed_in(source: str, function: str) -> frozenset[str]:
    model = analyze(cst.parse_module(textwrap.dedent(TRAINED) + textwrap.dedent(source)))
    found = next(
        node
        for node in model.module.body
        if isinstance(node, cst.FunctionDef) and node.name.value == function
    )
    return AgreedValues(facts_of(model), lambda evaluation: True).names(found)


def test_a_parameter_every_call_hands_an_agreed_value_is_agreed():
    agreed = _agreed_in(
        """
        def check(value, limit):
            better = value < limit
            return better

        check(3, 4)
        check(5, 4)
        """,
        "check",
    )
    assert {"value", "limit", "better"} <= agreed


def test_a_parameter_one_call_hands_a_rank_s_own_value_is_not_agreed():
    agreed = _agreed_in(
        """
        def check(value, limit):
            better = value < limit
            return better

        check(3, 4)
        check(loss.item(), 4)
        """,
        "check",
    )
    assert "value" not in agreed and "better" not in agreed
    assert "limit" in agreed


def test_an_agreed_element_of_a_returned_tuple_is_agreed_beside_one_that_is_not():
    """``loss, acc, n = evaluate(...)``: the accuracy of gathered counts is agreed, though the
    running loss of this rank (the tuple's first element) is not."""
    source = """
    def evaluate(model, loader, accelerator, running):
        correct, total = 0, 0
        for (x,) in loader:
            out = model(x)
            out, x = accelerator.gather_for_metrics((out, x))
            correct += (out.argmax(-1) == x).sum().item()
            total += x.numel()
        return running, correct / total, total

    running = loss.item()
    kept, acc, n = evaluate(model, loader, accelerator, running)
    """
    agreed = _agreed_at_module(source)
    assert {"acc", "n"} <= agreed
    assert "kept" not in agreed


TRAINER = """
import torch
from torch import nn


class Trainer:
    def __init__(self, model, optimizer, loader):
        self.model = model
        self.optimizer = optimizer
        self.loader = loader
        self.patience = 3
        self.best = 0.0
        self.train_loss = 0.0

    def fit(self, epochs):
        for epoch in range(epochs):
            total = 0.0
            for x, y in self.loader:
                loss = nn.functional.mse_loss(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                total += loss.item()
            self.train_loss = total / len(self.loader)
            self.best = 1.0
            gap = 0.5 - self.train_loss
            slack = self.best - self.patience
"""


def _test_in_fit(expression: str) -> bool:
    model = analyze(cst.parse_module(TRAINER))
    values = AgreedValues(facts_of(model), lambda evaluation: True)
    fit = next(
        node
        for node in walk(model.module)
        if isinstance(node, cst.FunctionDef) and node.name.value == "fit"
    )
    last = fit.body.body[-1]
    return values.test_agreed(cst.parse_expression(expression), last)


def test_an_attribute_folded_from_training_batches_is_not_agreed():
    assert not _test_in_fit("self.train_loss < 0.3")
    assert not _test_in_fit("gap > 0.1")  # a local set from it


def test_settings_and_attributes_set_from_constants_stay_agreed():
    assert _test_in_fit("self.patience > 2")
    assert _test_in_fit("slack > 0")


def test_a_numpy_score_of_gathered_lists_is_agreed_and_a_random_one_is_not():
    """trial12: a per-class F1 (``np.maximum``) of predictions and labels joined with
    ``torch.cat`` from a gathered evaluation is every rank's; a NumPy draw is not."""
    agreed = _agreed_at_module(
        """
        import numpy as np

        def f1_per_class(pred, target):
            tp = (pred * target).sum(0)
            return 2 * tp / np.maximum(2 * tp + pred.sum(0) + target.sum(0), 1)

        preds, targets = [], []
        with torch.no_grad():
            for (x,) in loader:
                preds.append(model(x).argmax(-1))
                targets.append(x[:, 0])
        f1 = f1_per_class(torch.cat(preds).numpy(), torch.cat(targets).numpy())
        macro = float(f1.mean())
        noisy = macro + np.random.rand()
        """
    )
    assert {"f1", "macro"} <= agreed
    assert "noisy" not in agreed


def test_train_false_is_eval_mode():
    """``model.train(False)`` is nn.Module's eval(): a greedy token after it is agreed."""
    agreed = _agreed_at_module(
        """
        model.train(False)
        logits = model(torch.tensor([[5]]))
        """
    )
    assert "logits" in agreed


STOPPER = """
import torch
from torch import nn


class Trainer:
    def fit(self, epochs, patience):
        self.patience = patience
        self.last_loss = torch.inf
        self.trigger = 0
        self.losses = []
        self.stop = False
        self.epoch = 0
        while self.epoch < epochs and not self.stop:
            self.losses.append({loss})
            self.earlystopping()
            self.epoch += 1

    def earlystopping(self):
        if self.losses[-1] >= self.last_loss:
            self.trigger += 1
        self.last_loss = self.losses[-1]
        if self.trigger >= self.patience:
            self.stop = True

    def rank_loss(self):
        return torch.rand(1).item()


Trainer().fit(5, 2)
"""


def _state(loss: str) -> AgreedValues:
    model = analyze(cst.parse_module(STOPPER.replace("{loss}", loss)))
    return AgreedValues(facts_of(model), lambda evaluation: True)


def test_a_flag_a_trigger_method_sets_from_agreed_state_is_agreed():
    """The stop flag of realconv36's whilestop, through ``earlystopping()``: every write of
    ``stop``, ``trigger``, ``last_loss`` and ``losses`` is agreed (a constant here)."""
    state = _state("0.5")
    assert all(state.state_agreed(a) for a in ("stop", "epoch", "trigger", "losses"))


def test_a_flag_a_trigger_method_sets_from_a_ranks_own_value_is_not_agreed():
    state = _state("self.rank_loss()")
    assert not state.state_agreed("losses")
    assert not state.state_agreed("trigger")
    assert not state.state_agreed("stop")


def test_a_checkpoint_every_rank_reads_by_a_shared_path_is_agreed():
    """A resume before training (trial19): every rank of a run on one file system finds the
    same file and loads the same state."""
    agreed = _agreed_at_module(
        """
        import os
        CKPT = "ckpt.pt"
        step = 0
        if args.resume and os.path.exists(args.ckpt):
            state = torch.load(args.ckpt, map_location="cpu")
            step = state["step"]
        found = os.path.isfile(CKPT)
        """
    )
    assert {"state", "step", "found"} <= agreed


def test_a_file_looked_for_in_a_loop_or_to_decide_a_save_is_not_agreed():
    """A stop file touched by hand, or a file the first rank to look writes: a slower rank
    may find what a faster one did not."""
    agreed = _agreed_at_module(
        """
        import os
        for epoch in range(3):
            stop = os.path.exists("STOP")
        made = False
        if not os.path.exists(args.ckpt):
            torch.save(model.state_dict(), args.ckpt)
            made = True
        """
    )
    assert "stop" not in agreed
    assert "made" not in agreed
