"""A write the main process takes over, fed by a call that runs a prepared model: the call goes
under the main-process test with it only when its forward is no collective (no gradients, a
model of ``torch.nn`` layers without buffers); otherwise the write stays on every rank, with
the review line that says why."""

from __future__ import annotations

from accelify.convert import convert_source
from conftest import FIXTURES

CASE = FIXTURES / "convert" / "generator_sampled_and_saved_on_the_main_process"
SOURCE = (CASE / "before.py").read_text()
SAMPLER = "    @torch.no_grad()\n    def sample(self, n):\n"


def _reviews_of_the_write(source: str) -> list[str]:
    conversion = convert_source(source.encode(), "gan.py")
    return [r.text for r in conversion.reviews if "self.sample()" in r.text]


def test_a_no_grad_sample_of_a_generator_without_buffers_is_guarded_with_its_write():
    conversion = convert_source(SOURCE.encode(), "gan.py")
    assert "            if self.accelerator.is_main_process:\n" in conversion.converted.decode()
    assert not _reviews_of_the_write(SOURCE)


def test_a_generator_with_a_batchnorm_keeps_the_sampling_on_every_rank():
    # its DDP forward broadcasts the BatchNorm's buffers: a collective
    source = SOURCE.replace(
        "nn.Linear(z_dim, 16), nn.ReLU()", "nn.Linear(z_dim, 16), nn.BatchNorm1d(16), nn.ReLU()"
    )
    assert source != SOURCE
    (review,) = _reviews_of_the_write(source)
    assert "which every rank must run" in review


def test_a_sample_with_gradients_on_keeps_the_sampling_on_every_rank():
    # with gradients on, DDP's forward prepares a reduction the other ranks never join
    source = SOURCE.replace(SAMPLER, "    def sample(self, n):\n")
    assert source != SOURCE
    (review,) = _reviews_of_the_write(source)
    assert "which every rank must run" in review
