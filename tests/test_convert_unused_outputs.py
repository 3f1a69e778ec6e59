"""Which dropped outputs of a training forward make the conversion tell DDP to expect
parameters without gradients (convert/steps/unused_outputs.py): the question ACC310 asks
(`idle_members.members_only_dropped`). Only where a dropped output is computed by layers no
kept output needs, or where the forward cannot be read (then a parameter that goes without a
gradient would stop DDP, and the option costs a graph walk only)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from accelify.convert import convert_source

HANDLER = "DistributedDataParallelKwargs(find_unused_parameters=True)"

MODEL = """
import torch
from torch import nn


class CharGRU(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.rnn = nn.GRU(8, 16, batch_first=True)
        self.head = nn.Linear(16, vocab)

    def forward(self, x, h=None):
        {forward}
"""

GRU_FORWARD = "out, h = self.rnn(self.embed(x), h)\n        return self.head(out), h"

TRAIN = """
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
{imports}

def main():
    model = CharGRU(5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randint(0, 5, (16, 6)), torch.randint(0, 5, (16, 6)))
    for x, y in DataLoader(data, batch_size=4):
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 5), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()


main()
"""


def _one_file(forward: str, members: str = "") -> tuple[str, str]:
    """The converted script and its summary's change lines, for the model class with
    ``forward``'s body and ``members`` added to ``__init__``, trained in the same file."""
    model = textwrap.dedent(MODEL).replace("{forward}", forward)
    if members:
        model = model.replace(
            "self.head = nn.Linear(16, vocab)\n",
            f"self.head = nn.Linear(16, vocab)\n        {members}\n",
        )
    source = model + textwrap.dedent(TRAIN).replace("{imports}", "")
    conversion = convert_source(source.encode(), "train.py")
    return conversion.converted.decode(), _changes(conversion)


def _changes(conversion) -> str:
    return "\n".join(note.text for note in conversion.changes)


def test_a_dropped_hidden_state_the_kept_logits_are_computed_from_needs_no_option():
    """``logits, _ = model(x)`` of ``return self.head(out), h`` with ``out, h = self.rnn(...)``:
    the GRU and the embedding get their gradients through ``logits`` (trial19: every 2-rank run
    printed torch's "find_unused_parameters=True was specified ... but did not find any")."""
    converted, _ = _one_file(GRU_FORWARD)
    assert HANDLER not in converted
    assert "accelerator = Accelerator()" in converted


def test_a_dropped_output_only_its_own_layer_computes_gets_the_option_named():
    forward = "out, h = self.rnn(self.embed(x), h)\n        return self.head(out), self.aux(h)"
    converted, changes = _one_file(forward, "self.aux = nn.Linear(16, 2)")
    assert HANDLER in converted
    assert "model drops outputs here that only self.aux compute" in changes


def test_a_kept_output_computed_through_detach_leaves_the_dropped_one_s_layers_without_gradient():
    forward = "out, h = self.rnn(self.embed(x), h)\n        return self.head(out.detach()), out"
    converted, changes = _one_file(forward)
    assert HANDLER in converted
    assert "only self.embed, self.rnn compute" in changes


def test_a_forward_that_rebinds_a_returned_name_keeps_the_option():
    """``h = self.head(out)`` after ``out, h = self.rnn(...)``: which value the returned
    name holds is not read, so DDP is told (a parameter left without a gradient stops it).
    A chain of one name (``out = self.head(out)``) is read."""
    chained = (
        "out, h = self.rnn(self.embed(x), h)\n        out = self.head(out)\n        return out, h"
    )
    converted, _ = _one_file(chained)
    assert HANDLER not in converted
    rebound = (
        "out, h = self.rnn(self.embed(x), h)\n        hidden = h\n"
        "        h = self.head(out)\n        return h, hidden"
    )
    converted, changes = _one_file(rebound)
    assert HANDLER in converted
    assert "its forward does not show which layers only they need" in changes


def test_a_model_class_of_a_sibling_module_is_read_there(tmp_path: Path):
    (tmp_path / "model.py").write_text(textwrap.dedent(MODEL).replace("{forward}", GRU_FORWARD))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent(TRAIN).replace("{imports}", "from model import CharGRU"))
    converted = convert_source(train.read_bytes(), train).converted.decode()
    assert "accelerator.prepare(" in converted
    assert HANDLER not in converted


def test_a_model_class_the_conversion_cannot_read_keeps_the_option(tmp_path: Path):
    """A class of a library (no file of the project): its forward is not read, and a dropped
    output may leave parameters without gradients."""
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent(TRAIN).replace("{imports}", "from charlib import CharGRU"))
    conversion = convert_source(train.read_bytes(), train)
    assert HANDLER in conversion.converted.decode()
    assert "its forward does not show which layers only they need" in _changes(conversion)


LM = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 16)
        self.head = nn.Linear(16, 12)

    def forward(self, x, targets=None):
        logits = self.head(self.emb(x))
        if {test}:
            return logits
        return logits, F.cross_entropy(logits.reshape(-1, 12), targets.reshape(-1))


def main():
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randint(0, 12, (16, 6)), torch.randint(0, 12, (16, 6)))
    for x, y in DataLoader(data, batch_size=4):
        _, loss = {call}
        loss.backward()
        opt.step()
        opt.zero_grad()


main()
"""


def _lm(test: str, call: str) -> str:
    source = LM.replace("{test}", test).replace("{call}", call)
    return convert_source(source.encode(), "train.py").converted.decode()


def test_the_return_a_call_reaches_by_the_targets_it_passes_is_the_one_read():
    """``_, loss = model(x, y)`` of a forward that returns ``logits`` when ``targets is None``
    and ``logits, loss`` otherwise: the call reaches the second, whose dropped logits need no
    layer the loss does not (it gave the option, for two returns were not read)."""
    assert HANDLER not in _lm("targets is None", "model(x, y)")
    assert HANDLER not in _lm("targets is None", "model(x, targets=y)")


def test_a_return_no_argument_of_the_call_decides_keeps_the_option():
    assert HANDLER in _lm("not self.training", "model(x, y)")


def test_reached_return_follows_none_tests_of_passed_and_defaulted_parameters():
    import libcst as cst

    from accelify.analysis.reached_returns import reached_return

    forward = cst.parse_module(
        textwrap.dedent(
            """
            def forward(self, x, targets=None, mask=None):
                if targets is None:
                    return 1
                elif mask is not None:
                    return 2
                else:
                    return 3
            """
        )
    ).body[0]

    def reached(call: str) -> int | None:
        found = reached_return(forward, cst.parse_expression(call))
        return None if found is None else int(found.value.value)

    assert reached("model(x)") == 1
    assert reached("model(x, y)") == 3
    assert reached("model(x, y, m)") == 2
    assert reached("model(x, targets=y, mask=None)") == 3
    assert reached("model(*batch)") is None
