"""A memory bank in a module's buffer filled with each training step's values (a MoCo queue on
an EMA teacher): on N ranks each rank would fill its own from its own shard, so the conversion
says to gather the values first; a buffer written with anything else, or filled outside
training, gets no such line."""

from __future__ import annotations

from accelify.convert import convert_source
from conftest import FIXTURES

CASE = FIXTURES / "convert" / "memory_bank_buffer_filled_per_step_on_an_ema_teacher"
SOURCE = (CASE / "before.py").read_text()


def _bank_reviews(source: str) -> list[str]:
    conversion = convert_source(source.encode(), "moco.py")
    return [r.text for r in conversion.reviews if "into the buffer" in r.text]


def test_a_queue_filled_with_each_steps_keys_is_reviewed_at_the_call():
    (review,) = _bank_reviews(SOURCE)
    assert review.startswith("teacher.enqueue() stores k into the buffer queue (line 29)")
    assert "teacher.enqueue(accelerator.gather(k))" in review


def test_a_buffer_written_with_what_the_method_makes_itself_is_not_a_bank():
    source = SOURCE.replace("self.queue[idx] = keys", "self.queue[idx] = 0.0")
    assert source != SOURCE
    assert _bank_reviews(source) == []


def test_a_bank_filled_once_after_training_is_not_reviewed():
    source = SOURCE.replace("            teacher.enqueue(k)\n", "").replace(
        '        print(f"epoch {epoch} loss {loss.item():.4f}")\n',
        '        print(f"epoch {epoch} loss {loss.item():.4f}")\n    teacher.enqueue(k)\n',
    )
    assert "            teacher.enqueue(k)\n" not in source and source != SOURCE
    assert _bank_reviews(source) == []
