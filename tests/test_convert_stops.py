"""Which stops the conversion makes collective (convert/steps/collective_stops.py): a test of an
instance's setting (``bad >= self.patience``, set once in ``__init__`` of an agreed value) beside
a count every rank keeps alike stays a plain ``break``; the same test of an attribute another
method writes from this rank's loss is made collective."""

from __future__ import annotations

import textwrap

from accelify.convert import convert_source
from conftest import FIXTURES

TRAINER = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, loader, patience=2):
        self.model = model
        self.loader = loader
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.patience = patience

    def fit(self, epochs):
        bad = 0
        for epoch in range(epochs):
            for x, y in self.loader:
                self.optimizer.zero_grad()
                loss = nn.functional.mse_loss(self.model(x), y)
                loss.backward()
                self.optimizer.step()
            if epochs > 3:  # a parameter every call hands alike
                bad += 1
            {extra}
            if bad >= self.patience:
                break


Trainer(nn.Linear(3, 1), DataLoader(TensorDataset(torch.randn(8, 3), torch.randn(8, 1)))).fit(5)
"""


def _converted(extra: str) -> str:
    source = textwrap.dedent(TRAINER).replace("{extra}", extra)
    return convert_source(source.encode(), "trainer.py").converted.decode()


def test_a_setting_the_constructor_keeps_decides_alike_on_every_rank():
    converted = _converted("pass")
    assert "set_trigger" not in converted
    assert "            if bad >= self.patience:\n                break\n" in converted


def test_an_attribute_a_method_writes_from_this_rank_s_loss_is_made_collective():
    converted = _converted("self.patience = loss.item()")
    assert "self.accelerator.set_trigger()" in converted
    assert "if self.accelerator.check_trigger():" in converted


SETATTR = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

{key}


class Trainer:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.best = float("inf")
        self.bad_epochs = 0

    def fit(self, epochs):
        for epoch in range(epochs):
            running = 0.0
            for x, y in self.loader:
                self.optimizer.zero_grad()
                loss = nn.functional.mse_loss(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                running += loss.item()
            if running < self.best:
                self.best = running
                setattr(self, KEY, 0)
            else:
                setattr(self, KEY, self.bad_epochs + 1)
            if self.bad_epochs >= 2:
                break


Trainer(nn.Linear(3, 1), DataLoader(TensorDataset(torch.randn(8, 3), torch.randn(8, 1)))).fit(5)
"""


def _stop_made_collective(key: str) -> bool:
    converted = convert_source(SETATTR.format(key=key).encode(), "t.py").converted.decode()
    return "if self.accelerator.check_trigger():" in converted


def test_a_setattr_key_bound_by_unpacking_is_read_as_its_slot():
    assert _stop_made_collective('KEY, OTHER = "bad_epochs", "x"')
    assert _stop_made_collective('(OTHER, (KEY, _)) = "x", ("bad_epochs", "y")')
    # the slot names another attribute: the counter is never written by it
    assert not _stop_made_collective('OTHER, KEY = "bad_epochs", "x"')


def test_a_setattr_key_the_file_does_not_pin_to_one_string_may_write_the_counter():
    # a ``for``, an import, a ``with``, a walrus, two bindings, an entry of a dict: the write
    # may be the counter's, so the stop on it is made collective
    for key in (
        'for KEY in ["bad_epochs"]:\n    pass',
        "from string import ascii_letters as KEY",
        "with open(__file__) as KEY:\n    pass",
        'print(KEY := "bad_epochs")',
        'KEY = "x"\nKEY = "bad_epochs"',
        'NAMES = {"counter": "bad_epochs"}\nKEY = NAMES["counter"]',
        'KEY = "x"\n\ndef rebind():\n    global KEY\n    KEY = "bad_epochs"',
    ):
        assert _stop_made_collective(key), key


STOP_FLAG = (
    FIXTURES / "convert" / "early_stop_flag_set_by_a_trigger_method_from_the_validation_loss"
)
_HANG = "this loop's condition reads a value each rank computed for itself"


def test_a_while_flag_set_by_a_trigger_method_from_a_gathered_loss_is_not_a_hang():
    """``while ... and not self.stop`` where ``earlystopping()`` sets ``self.stop`` from the
    gathered validation loss (realconv36's whilestop, with ``model.train(False)``): every
    rank decides alike, so no review line says it may hang."""
    conversion = convert_source((STOP_FLAG / "before.py").read_bytes(), "before.py")
    assert not [note for note in conversion.reviews if _HANG in note.text]


def test_a_while_flag_set_by_a_trigger_method_from_a_training_loss_keeps_its_review():
    """The same flag set from this rank's own training loss: the ranks may leave apart."""
    source = (STOP_FLAG / "before.py").read_text()
    for old, new in (
        (
            "        self.val_losses = []\n",
            "        self.val_losses = []\n        self.seen = []\n",
        ),
        (
            "            self.forward_train()\n",
            "            self.seen.append(self.forward_train())\n",
        ),
        (
            "            self.optimizer.step()\n",
            "            self.optimizer.step()\n        return loss.item()\n",
        ),
        (
            "        if self.val_losses[-1] >= self.last_loss:",
            "        if self.seen[-1] >= self.last_loss:",
        ),
    ):
        assert old in source
        source = source.replace(old, new)
    conversion = convert_source(source.encode(), "before.py")
    (review,) = [note for note in conversion.reviews if _HANG in note.text]
    assert review.line == 22  # the while, below the one line added above it


RESUMED = """
import argparse
import os

import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ckpt", default="ckpt.pt")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    step = 0
    if args.resume and os.path.exists(args.ckpt):
        state = torch.load(args.ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        step = state["step"]
    while step < args.steps:
        for x, y in loader:
            {stop}
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if (step + 1) % 4 == 0:
                torch.save({"model": model.state_dict(), "step": step + 1}, args.ckpt)
            step += 1
    print(step)


main()
"""


def _resumed(stop: str) -> tuple[str, str]:
    source = textwrap.dedent(RESUMED).replace("{stop}", stop)
    conversion = convert_source(source.encode(), "resumed.py")
    notes = [note.text for note in (*conversion.changes, *conversion.reviews)]
    return conversion.converted.decode(), "\n".join(notes)


def test_a_step_a_resume_loads_from_the_run_s_checkpoint_path_is_every_rank_s():
    """``if args.resume and os.path.exists(args.ckpt): step = torch.load(args.ckpt)["step"]``:
    every rank of a run reads the same file, so ``step`` (and ``if step >= args.steps: break``)
    is every rank's alike: no trigger (an all-reduce per step), no review line saying a rank
    may leave alone, and the save gets its barrier (trial19)."""
    converted, notes = _resumed("if step >= args.steps:\n                break")
    assert "set_trigger" not in converted and "check_trigger" not in converted
    assert "may leave alone" not in notes and "computed for itself" not in notes
    assert "accelerator.wait_for_everyone()" in converted


def test_a_stop_file_looked_for_in_the_loop_is_each_rank_s_own():
    """``if os.path.exists("STOP"): break`` in the loop: a file touched by hand may be seen by
    one rank a step before another: the stop is made collective."""
    converted, _ = _resumed('if os.path.exists("STOP"):\n                break')
    assert "accelerator.set_trigger()" in converted


def test_a_save_after_a_stop_the_conversion_makes_collective_gets_its_barrier():
    """``if loss.item() < 0.01: break`` on this rank's loss becomes set_trigger/check_trigger:
    every rank then leaves at the same step, so the save after it is reached by every rank and
    the summary must not say a rank may leave alone there."""
    stop = "if torch.nn.functional.mse_loss(model(x), y).item() < 0.01:\n                break"
    converted, notes = _resumed(stop)
    assert "accelerator.set_trigger()" in converted
    assert "may leave alone" not in notes, notes
    assert "accelerator.wait_for_everyone()" in converted
