"""A training loss summed over a loop of a prepared loader and divided by the last index
enumerate handed the loop (convert/steps/training_means.py): on N ranks that index is each
rank's own steps less one, so the printed average changes with N; the line stays as it is
(one process prints what it did) with a review line that names the divisor to write. Counted
from 1, the index is the count of batches: no review line."""

from __future__ import annotations

from accelify.convert import convert_source
from conftest import FIXTURES

CASE = FIXTURES / "convert" / "training_loss_divided_by_the_last_enumerate_index"
_SAID = "num is the last index enumerate handed the training loop over the prepared loader"


def _reviews(source: str) -> list[str]:
    return [f"{n.line}: {n.text}" for n in convert_source(source.encode(), "train.py").reviews]


def test_a_training_loss_over_the_last_enumerate_index_gets_a_review_line_at_the_division():
    source = (CASE / "before.py").read_text()
    (review,) = _reviews(source)
    assert review.startswith("21: train_loss / num: ") and _SAID in review
    assert "divide train_loss by len(loader)" in review


def test_an_index_counted_from_one_is_the_count_of_batches():
    source = (CASE / "before.py").read_text()
    old = "enumerate(loader)"
    assert old in source
    assert _reviews(source.replace(old, "enumerate(loader, start=1)")) == []
    assert _reviews(source.replace(old, "enumerate(loader, 1)")) == []


def test_a_name_the_loop_never_sums_into_is_not_said():
    """``train_loss`` no longer folds the loop's losses (it stays 0): its quotient by the
    index reads nothing of the shard, so nothing is said."""
    source = (CASE / "before.py").read_text()
    old = "            train_loss += loss.item()\n"
    assert old in source
    assert _reviews(source.replace(old, "")) == []
