"""The import table that names are resolved through (instead of libcst's scope analysis)."""

import libcst as cst
import pytest

from accelify.analysis.imports import ImportTable
from accelify.analysis.script_model import Kind, analyze

SOURCE = """\
import torch
import torch.optim as optim
from torch import nn
from torch.utils.data import DataLoader as Loader
from . import helpers
from .models import Net
try:
    from accelerate import Accelerator
except ImportError:
    from accelify import Accelerator as Accelerator
if True:
    pass
elif False:
    import numpy as np
"""


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("torch.nn.Linear", "torch.nn.Linear"),
        ("optim.SGD", "torch.optim.SGD"),
        ("nn.functional.relu", "torch.nn.functional.relu"),
        ("Loader", "torch.utils.data.DataLoader"),
        ("helpers.load", ".helpers.load"),
        ("Net", ".models.Net"),
        ("Accelerator", "accelify.Accelerator"),  # the last import read wins
        ("np.zeros", "numpy.zeros"),
        ("model.to", None),
    ],
)
def test_names_resolve_through_the_imports(name: str, expected: str | None):
    table = ImportTable.of_module(cst.parse_module(SOURCE))
    assert table.resolve(name) == expected


def test_an_import_at_the_bottom_is_known_to_code_above_it():
    script = analyze(cst.parse_module("model = nn.Linear(2, 2)\nfrom torch import nn\n"))
    assert script.names_of(Kind.MODEL) == {"model"}


def test_function_level_imports_are_seen():
    script = analyze(
        cst.parse_module("def main():\n    import torch.optim as o\n    opt = o.SGD(p, lr=1)\n")
    )
    assert script.names_of(Kind.OPTIMIZER) == {"opt"}
