from collections.abc import Iterator

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.step_caches import step_indexed_caches, step_indexed_datasets
from accelify.lint.rule import HEADER, Example, Finding, Rule

_CACHE = (
    HEADER
    + "import torch\n"
    + "loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
    + "cache = []\n"
    + "with torch.no_grad():\n"
    + "    for x, y in loader:\n"
    + "        cache.append(encoder(x))\n"
)


class CacheIndexedByStep(Rule):
    """A cache filled over a DataLoader that is not prepared there (every batch of the dataset)
    and read as ``cache[step]`` in ``for step, batch in enumerate(prepared_loader)``. The prepared
    loader gives each rank 1/N of the batches, so the step runs from 0 to len/N: every rank reads
    the first 1/N of the cache, the same part on every rank, and never the entries of the batch
    it trains on."""

    code = "ACC406"
    name = "cache-indexed-by-step"
    message = (
        "Key this cache by sample, or build it over the prepared DataLoader (unshuffled: each rank "
        "caches its own batches): it holds every batch of the dataset, and the step of a prepared "
        "loop only reaches the first 1/N of it, the same part on every rank"
    )
    why = "A prepared loop's step counts this rank's batches, not the dataset's."
    bad = (
        # the dataset the prepared loader was built over, indexed by its step: each output file
        # is named after a sample of the first 1/N (a music-prompt generation pipeline)
        Example(
            HEADER
            + "import torch\n"
            + "loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
            + "model, loader = accelerator.prepare(model, loader)\n"
            + "for idx, batch in enumerate(loader):\n"
            + "    for j, out in enumerate(model.generate(batch)):\n"
            + "        name = data[idx * 8 + j]['url']\n"
            + "        save_text(out, name)\n",
            8,
            16,
        ),
        Example(
            _CACHE
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for step, (x, y) in enumerate(loader):\n"
            + "    loss = (model(cache[step]) - y).pow(2).mean()\n"
            + "    accelerator.backward(loss)\n",
            11,
            19,
        ),
    )
    good = (
        # the step mapped back to the sample: this rank's batches are every num_processes-th
        HEADER
        + "import torch\n"
        + "loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "n, rank = accelerator.num_processes, accelerator.process_index\n"
        + "for idx, batch in enumerate(loader):\n"
        + "    for j, out in enumerate(model.generate(batch)):\n"
        + "        name = data[(idx * n + rank) * 8 + j]['url']\n",
        # filled over the (unshuffled) prepared loader: each rank caches its own batches
        HEADER
        + "import torch\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "cache = []\n"
        + "with torch.no_grad():\n"
        + "    for x, y in loader:\n"
        + "        cache.append(encoder(x))\n"
        + "for step, (x, y) in enumerate(loader):\n"
        + "    loss = (model(cache[step]) - y).pow(2).mean()\n",
        # the cache becomes a dataset of its own, prepared and sharded like any other
        _CACHE
        + "cached = torch.utils.data.DataLoader(cache, batch_size=1)\n"
        + "model, optimizer, cached = accelerator.prepare(model, optimizer, cached)\n"
        + "for step, latents in enumerate(cached):\n"
        + "    loss = model(latents).mean()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for found in step_indexed_caches(facts_of(script)):
            message = (
                f"Key `{found.cache}` by sample, or build it over the prepared DataLoader "
                f"(unshuffled: each rank caches its own batches): filled over every batch of the "
                f"dataset (line "
                f"{script.line(found.built_in)}), it is read by a prepared loop's step, which "
                "reaches only its first 1/N, the same part on every rank"
            )
            yield self.finding(script, found.read, message=message)
        for read in step_indexed_datasets(facts_of(script)):
            message = (
                f"Take this sample from the batch, not from `{read.dataset}` by the step: the "
                f"prepared DataLoader (built over it at line {script.line(read.loader)}) gives "
                f"each rank 1/N of the batches, so this index reads the first 1/N of "
                f"`{read.dataset}`, the same samples on every rank, not those of the batch in hand "
                "(carry the field through the collate function, or gather what the loop makes)"
            )
            yield self.finding(script, read.read, message=message)
