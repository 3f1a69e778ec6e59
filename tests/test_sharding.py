"""Whole batches strided across ranks; the last round evened out with repeats that are counted."""

import pytest

from accelify.runtime.sharding import (
    ShardPass,
    shard_batches,
    shard_index_batches,
    sharded_length,
    split_index_batches,
)


def shards(batches, world, even_batches=True, drop_last=False, batch_size=None):
    per_rank, records = [], []
    for rank in range(world):
        record = ShardPass()
        options = {"even_batches": even_batches, "drop_last": drop_last, "record": record}
        if batch_size is None:
            sharded = shard_batches(batches, rank, world, size_of=len, **options)
        else:
            sharded = shard_index_batches(batches, rank, world, batch_size=batch_size, **options)
        per_rank.append(list(sharded))
        records.append(record.padding)
    return per_rank, records


def test_batches_are_strided_so_rank_order_is_dataset_order():
    batches = [[0, 1], [2, 3], [4, 5], [6, 7]]
    (rank0, rank1), padding = shards(batches, 2)
    assert rank0 == [[0, 1], [4, 5]]
    assert rank1 == [[2, 3], [6, 7]]
    assert padding == [0, 0]


def test_short_last_round_repeats_first_batches_and_counts_them():
    batches = [[0, 1], [2, 3], [4]]
    (rank0, rank1), padding = shards(batches, 2)
    assert rank0 == [[0, 1], [4]]
    assert rank1 == [[2, 3], [0, 1]]
    assert padding == [2, 2]  # every rank knows the two repeated samples


def test_uneven_batches_leave_the_last_rank_short():
    batches = [[0, 1], [2, 3], [4]]
    (rank0, rank1), padding = shards(batches, 2, even_batches=False)
    assert rank0 == [[0, 1], [4]]
    assert rank1 == [[2, 3]]
    assert padding == [0, 0]


def test_drop_last_drops_an_incomplete_round():
    batches = [[0, 1], [2, 3], [4, 5]]
    (rank0, rank1), _ = shards(batches, 2, drop_last=True)
    assert rank0 == [[0, 1]] and rank1 == [[2, 3]]


def test_fewer_batches_than_ranks_still_gives_every_rank_one():
    (r0, r1, r2), padding = shards([[0, 1, 2]], 3)
    assert r0 == r1 == r2 == [[0, 1, 2]]
    assert padding == [6, 6, 6]


@pytest.mark.parametrize("batches", range(0, 12))
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("even", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_length_matches_what_is_yielded(batches, world, even, drop_last):
    stream = [[i] for i in range(batches)]
    per_rank, _ = shards(stream, world, even_batches=even, drop_last=drop_last)
    for rank, got in enumerate(per_rank):
        expected = sharded_length(batches, rank, world, even_batches=even, drop_last=drop_last)
        assert len(got) == expected


def index_shards(batches, world, batch_size, even_batches=True, drop_last=False):
    """`shards` through `shard_index_batches`, which completes batches of ``batch_size``."""
    return shards(batches, world, even_batches, drop_last, batch_size=batch_size)


def test_a_short_last_batch_is_completed_from_the_start_as_in_accelerate():
    batches = [[0, 1], [2, 3], [4, 5], [6]]  # 7 samples, batch 2
    (rank0, rank1), padding = index_shards(batches, 2, 2)
    assert rank0 == [[0, 1], [4, 5]]
    assert rank1 == [[2, 3], [6, 0]]  # HF Accelerate: [2, 2] samples, not [2, 1]
    assert padding == [1, 1]


def test_missing_batches_of_the_last_round_are_made_from_the_start():
    batches = [[0, 1], [2, 3], [4]]  # 5 samples, batch 2
    (rank0, rank1), padding = index_shards(batches, 2, 2)
    assert rank0 == [[0, 1], [4, 0]]
    assert rank1 == [[2, 3], [1, 2]]
    assert padding == [3, 3]


def test_a_dataset_smaller_than_a_round_is_cycled():
    (r0, r1, r2), padding = index_shards([[0, 1]], 3, 2)
    assert r0 == [[0, 1]] and r1 == [[0, 1]] and r2 == [[0, 1]]
    assert padding == [4, 4, 4]


@pytest.mark.parametrize("samples", range(0, 15))
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_completed_ends_keep_every_sample_once_and_full_batches(samples, world, batch_size):
    stream = [list(range(i, min(i + batch_size, samples))) for i in range(0, samples, batch_size)]
    per_rank, padding = index_shards(stream, world, batch_size)
    for rank, got in enumerate(per_rank):
        expected = sharded_length(len(stream), rank, world, even_batches=True, drop_last=False)
        assert len(got) == expected
        if world > 1:  # one process keeps its short last batch, as without prepare
            assert all(len(batch) == batch_size for batch in got)
    gathered = [i for step in zip(*per_rank, strict=True) for batch in step for i in batch]
    assert gathered[: len(gathered) - padding[0]] == list(range(samples))


@pytest.mark.parametrize("even", [True, False])
def test_without_even_batches_or_with_drop_last_whole_batches_are_strided(even):
    batches = [[0, 1], [2, 3], [4]]
    assert index_shards(batches, 2, 2, even_batches=even, drop_last=True)[0] == [
        [[0, 1]],
        [[2, 3]],
    ]
    if not even:
        assert index_shards(batches, 2, 2, even_batches=False)[0] == [[[0, 1], [4]], [[2, 3]]]


@pytest.mark.parametrize(
    ("samples", "batch_size", "even_batches", "expected"),
    [
        # HF's BatchSamplerShard(split_batches=True): each batch cut in 2, the short end completed
        (8, 4, True, ([[0, 1], [4, 5]], [[2, 3], [6, 7]], 0)),
        (6, 4, True, ([[0, 1], [4, 5]], [[2, 3], [0, 1]], 2)),
        (6, 4, False, ([[0, 1], [4, 5]], [[2, 3]], 0)),
        (5, 4, False, ([[0, 1], [4]], [[2, 3]], 0)),
    ],
)
def test_split_batches_cut_every_batch_across_the_ranks(
    samples: int, batch_size: int, even_batches: bool, expected: tuple
) -> None:
    batches = [list(range(i, min(i + batch_size, samples))) for i in range(0, samples, batch_size)]
    records = [ShardPass(), ShardPass()]
    shards = [
        list(
            split_index_batches(
                batches,
                rank,
                2,
                batch_size=batch_size,
                even_batches=even_batches,
                drop_last=False,
                record=records[rank],
            )
        )
        for rank in (0, 1)
    ]
    assert (shards[0], shards[1], records[0].padding) == expected


@pytest.mark.parametrize(
    ("samples", "padding"),
    [
        (8, 0),
        (9, 1),  # HF's dispatcher: the short end completed only to a multiple of the ranks
        (10, 0),
        (5, 1),
    ],
)
def test_dispatched_split_batches_give_every_rank_a_slice_of_every_batch(
    samples: int, padding: int
) -> None:
    """dispatch_batches + split_batches: rank 0 cuts each batch for every rank, so each rank
    steps len(loader) times, as HF's DataLoaderDispatcher does; none is left without the last."""
    torch = pytest.importorskip("torch")
    from accelify.runtime.dispatch import _split_rounds

    loader = list(torch.arange(samples).split(4))
    record = ShardPass()
    rounds = list(_split_rounds(loader, 2, False, record))
    assert len(rounds) == len(loader)
    for pieces in rounds:
        assert len(pieces) == 2 and len(pieces[0]) == len(pieces[1]) > 0
    assert record.padding == padding
    gathered = torch.cat([piece for pieces in rounds for piece in pieces]).tolist()
    assert gathered[: len(gathered) - padding] == list(range(samples))


@pytest.mark.parametrize(
    ("samples", "drop_last", "last_round", "padding"),
    [
        (64, False, [list(range(48, 56)), list(range(56, 64))], 0),
        # the rows of a short last round shared out evenly, as HF's DataLoaderDispatcher does:
        # every rank steps ceil(batches / ranks) times, no sample repeated
        (40, False, [[32, 33, 34, 35], [36, 37, 38, 39]], 0),
        (50, False, [[48], [49]], 0),
        # completed to a multiple of the ranks with the first rows of the pass
        (49, False, [[48], [0]], 1),
        # a full last round keeps a batch per rank, its short batch too (HF cuts its 10 rows
        # 5 + 5): every rank steps, nothing repeated
        (42, False, [list(range(32, 40)), [40, 41]], 0),
        (57, True, [list(range(32, 40)), list(range(40, 48))], 0),
    ],
)
def test_dispatched_batches_share_the_last_rounds_rows_evenly(
    samples: int, drop_last: bool, last_round: list[list[int]], padding: int
) -> None:
    torch = pytest.importorskip("torch")
    from accelify.runtime.dispatch import _batch_rounds

    loader = list(torch.arange(samples).split(8))
    if drop_last and samples % 8:
        loader = loader[:-1]  # the DataLoader drops its short batch itself
    record = ShardPass()
    rounds = [
        [piece.tolist() for piece in pieces]
        for pieces in _batch_rounds(loader, 2, drop_last, record)
    ]
    assert all(len(pieces) == 2 for pieces in rounds)
    assert rounds[-1] == last_round
    assert len(rounds) == (len(loader) // 2 if drop_last else -(-len(loader) // 2))
    assert record.padding == padding
    gathered = [row for pieces in rounds for piece in pieces for row in piece]
    kept = samples if not drop_last else len(rounds) * 16
    assert gathered[: len(gathered) - padding] == list(range(kept))


def _per_batch_reference(batches, rank, world, batch_size, record):
    """`shard_index_batches`' even path as a Python loop over every batch (before its rounds
    were taken in C): the rounds must come out the same, whatever the stream."""
    from accelify.runtime.sharding import _completed_round

    start, round_ = [], []
    for index, batch in enumerate(batches):
        if index < world:
            start += batch
        round_.append(batch)
        if len(round_) == world and len(batch) == batch_size:
            yield round_[rank]
            round_ = []
    if not round_ or not start:
        return
    final, record.padding = _completed_round(round_, start, world, batch_size)
    yield final[rank]


@pytest.mark.parametrize("seed", range(40))
def test_rounds_taken_in_c_are_the_per_batch_loops_rounds(seed):
    import random

    rng = random.Random(seed)
    world, batch_size = rng.randint(2, 4), rng.randint(1, 4)  # one rank is not sharded
    sizes = [batch_size] * rng.randint(0, 9) + rng.choice([[], [rng.randint(1, batch_size)]])
    if rng.random() < 0.3:  # a batch sampler of its own: a short batch inside the stream
        sizes.insert(rng.randint(0, len(sizes)), rng.randint(0, batch_size))
    stream, first = [], 0
    for size in sizes:
        stream.append(list(range(first, first + size)))
        first += size
    for rank in range(world):
        mine, theirs = ShardPass(), ShardPass()
        options = {"even_batches": True, "drop_last": False, "record": mine}
        got = list(shard_index_batches(iter(stream), rank, world, batch_size=batch_size, **options))
        assert got == list(_per_batch_reference(stream, rank, world, batch_size, theirs))
        assert mine.padding == theirs.padding


@pytest.mark.parametrize("world", [2, 3, 4])
def test_batches_cut_from_a_range_are_those_read_from_the_sequential_batch_sampler(world):
    """`shard_range_batches` (a `BatchSampler` over a `SequentialSampler`) gives each rank the
    batches and the padding that `shard_index_batches` gives from the sampler's own batches,
    for every length around the rounds' edges (empty, shorter than a round, a short batch)."""
    from torch.utils.data import BatchSampler, SequentialSampler

    from accelify.runtime.sharding import shard_range_batches

    for batch_size in (1, 2, 3, 5):
        for length in range(0, 3 * world * batch_size + 2):
            sampler = BatchSampler(SequentialSampler(range(length)), batch_size, drop_last=False)
            for rank in range(world):
                cut, read = ShardPass(), ShardPass()
                got = list(
                    shard_range_batches(
                        range(length), rank, world, batch_size=batch_size, record=cut
                    )
                )
                options = {"even_batches": True, "drop_last": False, "record": read}
                expected = list(
                    shard_index_batches(sampler, rank, world, batch_size=batch_size, **options)
                )
                assert got == expected, (length, batch_size, rank)
                assert cut.padding == read.padding
