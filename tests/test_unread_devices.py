"""`drop_unread_devices`: the ``device = accelerator.device`` line the conversion wrote goes
when nothing reads it, and stays wherever something may."""

from __future__ import annotations

import textwrap

import libcst as cst

from accelify.convert.unread_devices import drop_unread_devices
from accelify.edits.plan import Note

ORIGINAL = b"device = torch.device('cuda')\n"


def _drop(code: str) -> tuple[str, list[Note]]:
    module = cst.parse_module(textwrap.dedent(code))
    notes = [Note(3, "device = accelerator.device")]
    converted, changes = drop_unread_devices(module, ORIGINAL, notes)
    return converted.code, changes


def test_an_unread_binding_is_removed_and_its_note_says_so():
    code, changes = _drop(
        """\
        def main():
            x = 1

            device = accelerator.device
            train(x)
        """
    )
    assert "device" not in code
    assert "\n\n    train(x)" in code  # the blank line above it stays
    assert changes == [
        Note(
            3,
            "removed device = accelerator.device: nothing reads it once the device moves are gone",
        )
    ]


def test_a_binding_read_anywhere_in_the_function_stays():
    for read in (
        "print(f'{device}')",
        "def inner():\n        return device",
        "train(device=device)",
    ):
        code, changes = _drop(f"def main():\n    device = accelerator.device\n    {read}\n")
        assert "device = accelerator.device" in code, read
        assert changes == [Note(3, "device = accelerator.device")]


def test_module_globals_locals_readers_and_lone_statements_stay():
    for code_in in (
        "device = accelerator.device\n",  # another file may import it
        "def main():\n    global device\n    device = accelerator.device\n",
        "def main():\n    device = accelerator.device\n    print(locals())\n",
        "def main(cuda):\n    if cuda:\n        device = accelerator.device\n",
    ):
        code, _ = _drop(code_in)
        assert "device = accelerator.device" in code, code_in


def test_a_line_the_original_had_is_the_users():
    module = cst.parse_module("def main():\n    device = accelerator.device\n")
    notes = [Note(2, "device = accelerator.device")]
    converted, changes = drop_unread_devices(
        module, b"def main():\n    device = accelerator.device\n", notes
    )
    assert converted.code == module.code and changes == notes
