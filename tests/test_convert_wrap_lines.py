"""A statement the conversion rewrites is laid out as black lays it out when the rewrite made one
of its lines too long, also one the user spread over several lines; a statement with a comment
inside keeps the user's layout, and nothing changes in what runs."""

from __future__ import annotations

from accelify.convert import convert_source

SCRIPT = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for inputs, labels in loader:
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
{save}


if __name__ == "__main__":
    main()
"""


def _saved(save: str) -> str:
    converted = convert_source(SCRIPT.format(save=save).encode(), "train.py").converted.decode()
    body = converted[converted.index("    accelerator.wait_for_everyone()") :]
    return body[: body.index("\n\n\nif __name__")] + "\n"


def test_a_save_the_user_spread_over_lines_is_laid_out_as_black_would():
    save = """\
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1},
               "full_checkpoint_of_the_linear_model.pt")"""
    assert _saved(save) == (
        "    accelerator.wait_for_everyone()\n"
        "    accelerator.save(\n"
        "        {\n"
        '            "model": accelerator.get_state_dict(model),\n'
        '            "optimizer": accelerator.get_state_dict(optimizer),\n'
        '            "epoch": 1,\n'
        "        },\n"
        '        "full_checkpoint_of_the_linear_model.pt",\n'
        "    )\n"
    )


def test_a_layout_black_already_made_is_kept():
    save = """\
    torch.save(
        model.state_dict(),
        "checkpoint_of_the_linear_model.pt",
    )"""
    assert _saved(save) == (
        "    accelerator.wait_for_everyone()\n"
        "    accelerator.save(\n"
        "        accelerator.get_state_dict(model),\n"
        '        "checkpoint_of_the_linear_model.pt",\n'
        "    )\n"
    )


def test_a_statement_with_a_comment_inside_keeps_the_users_layout():
    """Kept as the user laid it out: the second argument still under the first."""
    save = """\
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},  # both
               "full_checkpoint_of_the_linear_model.pt")"""
    assert _saved(save) == (
        "    accelerator.wait_for_everyone()\n"
        '    accelerator.save({"model": accelerator.get_state_dict(model), "optimizer": '
        "accelerator.get_state_dict(optimizer)},  # both\n"
        '                     "full_checkpoint_of_the_linear_model.pt")\n'
    )


PRINTED = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

x = torch.randn(64, 4)
loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=8)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for inputs, targets in loader:
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
{printed}
"""


def _printed(printed: str) -> str:
    source = PRINTED.format(printed=printed)
    converted = convert_source(source.encode(), "train.py").converted.decode()
    return converted[converted.index("    accelerator.print(") :]


def test_a_print_whose_lines_the_user_lined_up_under_its_bracket_stays_lined_up():
    """``print(f"..."`` / ``      f"...")`` made ``accelerator.print``: the lines under the
    first argument move with the bracket; a line left of it (a hanging indent, the closing
    bracket) stays where it was."""
    printed = """\
    print(f"epoch {epoch} loss {loss.item():.4f} "
          f"steps {len(loader)}",
          sep="",
    )"""
    assert _printed(printed) == (
        '    accelerator.print(f"epoch {epoch} loss {loss.item():.4f} "\n'
        '                      f"steps {len(loader)}",\n'
        '                      sep="",\n'
        "    )\n"
    )


def test_a_print_laid_out_with_a_hanging_indent_keeps_it():
    printed = """\
    print(f"epoch {epoch} loss {loss.item():.4f} "
        f"steps {len(loader)}")"""
    assert _printed(printed) == (
        '    accelerator.print(f"epoch {epoch} loss {loss.item():.4f} "\n'
        '        f"steps {len(loader)}")\n'
    )


def test_a_message_the_user_split_into_joined_strings_stays_one_string_per_line():
    """trial18: ``print(f"..." \\n f"...")`` rewritten to ``accelerator.print`` came out as one
    187-column line of joined f-strings; inside the call's brackets each stays on its line."""
    script = SCRIPT.format(save="").replace(
        "        optimizer.step()\n",
        "        optimizer.step()\n"
        '        print(f"loss {loss.item():.4f} over the batch of inputs {inputs.shape} "\n'
        "              f\"with labels {labels.shape} and lr {optimizer.param_groups[0]['lr']}\")\n",
    )
    converted = convert_source(script.encode(), "train.py").converted.decode()
    assert max(len(line) for line in converted.splitlines()) <= 88
    assert (
        "        accelerator.print(\n"
        '            f"loss {loss.item():.4f} over the batch of inputs {inputs.shape} "\n'
        "            f\"with labels {labels.shape} and lr {optimizer.param_groups[0]['lr']}\"\n"
        "        )\n"
    ) in converted
    compile(converted, "train.py", "exec")
