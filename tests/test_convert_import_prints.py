"""A project module that prints at its top level prints once per rank when the converted
script imports it: the import gets a review line naming the print's file and line."""

from __future__ import annotations

from pathlib import Path

from accelify.convert import convert_source

TRAIN = """import torch
from torch import nn
{imports}


def main():
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
"""

UTILS = '''"""Helpers."""
import torch


def log(msg):
    print(msg)


if __name__ == "__main__":
    print("self test")
{tail}
'''


def _reviews(tmp_path: Path, imports: str, tail: str) -> list[str]:
    (tmp_path / "utils.py").write_text(UTILS.replace("{tail}", tail))
    script = tmp_path / "train.py"
    source = TRAIN.replace("{imports}", imports)
    script.write_text(source)
    conversion = convert_source(source.encode(), script)
    return [f"{note.line}: {note.text}" for note in conversion.reviews]


def test_an_import_of_a_module_that_prints_at_its_top_level_is_reviewed(tmp_path: Path):
    reviews = _reviews(tmp_path, "from utils import log", 'DEVICE = "cpu"\nprint("using", DEVICE)')
    assert any(
        r.startswith("3: importing utils runs its print at utils.py:12 on every rank")
        for r in reviews
    ), reviews


def test_prints_in_functions_and_the_main_block_are_not_import_time_prints(tmp_path: Path):
    reviews = _reviews(tmp_path, "import utils", "")
    assert not any("importing utils" in r for r in reviews), reviews
