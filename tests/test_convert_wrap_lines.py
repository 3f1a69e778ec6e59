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
    save = """\
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},  # both
               "full_checkpoint_of_the_linear_model.pt")"""
    assert _saved(save) == (
        "    accelerator.wait_for_everyone()\n"
        '    accelerator.save({"model": accelerator.get_state_dict(model), "optimizer": '
        "accelerator.get_state_dict(optimizer)},  # both\n"
        '               "full_checkpoint_of_the_linear_model.pt")\n'
    )
