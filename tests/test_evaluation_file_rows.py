"""Rows written per batch to a file opened before an evaluation loop keep every batch, as a list
does (`evaluation._writes_a_row`): the loop gathers before the rows are made. A ``.write`` of a
progress bar or of the console keeps nothing, and its loop is left alone."""

from __future__ import annotations

from accelify.convert import convert_source

SOURCE = """\
import sys
import torch
from tqdm import tqdm
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ds = TensorDataset(torch.randn(16, 4), torch.zeros(16, dtype=torch.long))
loader = DataLoader(ds, batch_size=4)
test_loader = DataLoader(ds, batch_size=4)
for x, y in loader:
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
bar = tqdm(test_loader)
with torch.no_grad():
    for x, y in bar:
        p = model(x).argmax(1)
        bar.write(f"{p.tolist()}")
        sys.stdout.write(f"{y.tolist()}\\n")
f = open("preds.txt", "w")
with torch.no_grad():
    for x, y in test_loader:
        p = model(x).argmax(1)
        for a, b in zip(p.tolist(), y.tolist()):
            f.write(f"{a},{b}\\n")
f.close()
"""


def _converted() -> str:
    return convert_source(SOURCE.encode(), "file_rows.py").converted.decode()


def test_a_file_written_per_batch_gets_the_gathered_rows():
    converted = _converted()
    assert converted.count("gather_for_metrics") == 1
    gathered = "        outputs, y = accelerator.gather_for_metrics((outputs, y))\n"
    assert gathered + "        p = outputs.argmax(1)\n" in converted
    assert '            f.write(f"{a},{b}\\n")\n' in converted


def test_writes_to_a_bar_or_the_console_leave_their_loop_alone():
    converted = _converted()
    loop = converted[converted.index("    for x, y in bar:") : converted.index("f = open(")]
    assert "gather" not in loop
    assert "        p = model(x).argmax(1)\n        bar.write(" in loop
