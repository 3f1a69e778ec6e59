"""Random values drawn each training step after one seed: the same on every rank (reviewed),
unless the seed reads the rank or the draw is per-sample code."""

from __future__ import annotations

from accelify.convert import convert_source

GAN = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(x + torch.randn_like(x))


def main(rank=0):
    torch.manual_seed(SEED)
    loader = DataLoader(TensorDataset(torch.randn(32, 2)), batch_size=8)
    gen, disc = nn.Linear(4, 2), Net()
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
    for (real,) in loader:
        fake = gen(torch.randn(real.size(0), 4))
        d_loss = disc(torch.cat([fake.detach(), real], 1)).mean()
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = -disc(torch.cat([fake, real], 1)).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
"""


def _reviews(seed: str) -> list[str]:
    source = GAN.replace("SEED", seed).encode()
    return [note.text for note in convert_source(source, "gan.py").reviews]


def test_noise_drawn_after_one_seed_is_reviewed_at_its_draw():
    reviews = [text for text in _reviews("0") if "is drawn each training step" in text]
    assert len(reviews) == 1, reviews
    assert reviews[0].startswith("torch.randn(real.size(0), 4) is drawn each training step")
    assert "(torch.manual_seed(0), line 17)" in reviews[0]
    assert "set_seed(seed, device_specific=True)" in reviews[0]


def test_a_seed_that_reads_the_rank_draws_apart():
    assert not [text for text in _reviews("1234 + rank") if "drawn each training step" in text]


def _unseeded_reviews(step: str) -> list[str]:
    source = GAN.replace("    torch.manual_seed(SEED)\n", "").replace(
        "fake = gen(torch.randn(real.size(0), 4))", step
    )
    reviews = convert_source(source.encode(), "gan.py").reviews
    return [note.text for note in reviews if "is drawn each training step" in note.text]


def test_noise_after_the_state_the_conversion_synchronizes_is_reviewed_too():
    """No seed, a synthetic data set drawn before training: the conversion makes the random
    state alike on every rank (synchronize_rng_states) so that the data is; the generator's
    noise drawn after it is then alike on every rank as well."""
    reviews = _unseeded_reviews("fake = gen(torch.randn(real.size(0), 4))")
    assert len(reviews) == 1, reviews
    assert "the random state this conversion makes alike on every rank" in reviews[0]


def test_noise_shaped_like_a_batch_tensor_is_applied_to_each_ranks_own_samples():
    """Drawn in the batch tensor's whole shape, then added to it: each rank's own samples."""
    assert not _unseeded_reviews(
        "noise = torch.randn(real.shape)\n        fake = gen(real - noise)"
    )
    assert not _unseeded_reviews(
        "noise = torch.randn(real.size())\n        fake = gen(real * noise)"
    )
