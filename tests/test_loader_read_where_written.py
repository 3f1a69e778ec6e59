"""A test loader read both by an evaluation and by a loop that writes its predictions to a file
(`prepare._read_where_written`): prepared and gathered where that loop gathers its rows in place
and its file can be opened on the main process only; else whole, the file written under
``if accelerator.is_main_process:``, with no review that advises a gather there."""

from __future__ import annotations

from accelify.convert import Conversion, convert_source

HEAD = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ds = TensorDataset(torch.randn(16, 4), torch.zeros(16, dtype=torch.long))
train_loader = DataLoader(ds, batch_size=4, shuffle=True)
test_loader = DataLoader(ds, batch_size=4)
for x, y in train_loader:
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
correct = 0
with torch.no_grad():
    for x, y in test_loader:
        correct += (model(x).argmax(1) == y).sum().item()
print(correct)
with open("preds.txt", "w") as f:
    with torch.no_grad():
        for x, y in test_loader:
"""
WRITTEN_AT = HEAD.splitlines().index('with open("preds.txt", "w") as f:') + 1
BOUND = """\
            p = model(x).argmax(1)
            for a in p.tolist():
                f.write(f"{a}\\n")
"""
IN_HEADER = """\
            for a in model(x).argmax(1).tolist():
                f.write(f"{a}\\n")
"""


def _convert(source: str) -> Conversion:
    return convert_source(source.encode(), "written.py")


def test_rows_gathered_in_place_keep_the_loader_prepared():
    conversion = _convert(HEAD + BOUND)
    converted = conversion.converted.decode()
    assert "test_loader" in conversion.prepared
    assert converted.count("accelerator.gather_for_metrics(") == 2
    assert 'open("preds.txt" if accelerator.is_main_process else os.devnull, "w")' in converted
    assert not conversion.reviews


def test_a_forward_in_a_loop_header_keeps_the_loader_whole_without_advice():
    conversion = _convert(HEAD + IN_HEADER)
    converted = conversion.converted.decode()
    assert "test_loader" not in conversion.prepared
    assert "gather" not in converted
    assert "if accelerator.is_main_process:\n    with open(" in converted
    assert any("test_loader is read here, where a file" in n.text for n in conversion.changes)
    assert not [n.text for n in conversion.reviews if n.line >= WRITTEN_AT]


def test_a_file_the_other_ranks_cannot_skip_keeps_the_loader_whole():
    """A file opened "w+" cannot be os.devnull on the other ranks (they would read back
    nothing), so the block runs on the main process alone, where a gather would hang."""
    conversion = _convert((HEAD + BOUND).replace('"w")', '"w+")'))
    converted = conversion.converted.decode()
    assert "test_loader" not in conversion.prepared
    assert "gather" not in converted
    assert "if accelerator.is_main_process:\n    with open(" in converted
