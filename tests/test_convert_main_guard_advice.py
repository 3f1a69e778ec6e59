"""Review advice at module level names what exists there (convert/steps/main_process.py): a
trainer class holds ``self.accelerator``, and ``if __name__ == "__main__":`` deletes a folder
then runs ``Trainer(OUT).fit()``: the advice to run the rest on the main process names
``PartialState().is_main_process`` and its import, never ``self.accelerator`` where no ``self``
exists (review10a b1)."""

from __future__ import annotations

from accelify.convert import convert_source

SCRIPT = """
import os
import shutil

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

OUT = "stats_out"


class Trainer:
    def __init__(self, out_dir):
        x = torch.randn(64, 8)
        self.loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)
        self.model = nn.Linear(8, 2)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.out_dir = out_dir

    def fit(self):
        for xb, yb in self.loader:
            self.optimizer.zero_grad()
            nn.functional.cross_entropy(self.model(xb), yb).backward()
            self.optimizer.step()


if __name__ == "__main__":
    shutil.rmtree(OUT, ignore_errors=True)
    Trainer(OUT).fit()
"""


def test_module_level_advice_names_the_process_state_not_self():
    conversion = convert_source(SCRIPT.encode(), "train.py")
    (review,) = [n for n in conversion.reviews if "every rank must run" in n.text]
    assert review.line == 27  # the main guard, which holds the delete
    assert "`if PartialState().is_main_process:`" in review.text
    assert "from accelify import PartialState" in review.text
    assert "self.accelerator" not in review.text
