"""The bucket index (headwater.broker.delay.buckets.BucketIndex) against a replay of the whole
bucket file: for every message number, the batch it rebuilds from that batch's own records
is the one the whole file gives, whatever records came after (cancels, deliveries, drops,
moves, adoptions) and however the index caught up with appends; and the batches of a
partition it names for a hand-off are the whole file's."""

from __future__ import annotations

import random

from headwater.broker.delay.buckets import BucketIndex, Entry, find_entry, replay
from headwater.broker.delay.lifecycle import State
from headwater.model.batch import encode_batch
from headwater.storage.memory_schedule import MemoryScheduleFile
from headwater.storage.schedule import ADOPTED, CANCELLED, DELIVERED, DROPPED, MOVED, SCHEDULE, encode_record

T0 = 1_800_000_000_000


def state(e: Entry | None) -> object:
    if e is None:
        return None
    runs = [(g.due_ms, g.first, g.end, g.state, g.delivered_offset) for g in e.runs]
    return e.number, e.count, runs, sorted(e.cancelled or ()), e.origin, e.gate, e.open_runs, e.position, e.size


def whole_file(f: MemoryScheduleFile, number: int) -> Entry | None:
    entries: dict[int, Entry] = {}
    numbers: list[int] = []
    replay(f.scan(cut=False), entries, numbers)
    return find_entry(entries, numbers, number)


def first_due(f: MemoryScheduleFile) -> int | None:
    entries: dict[int, Entry] = {}
    replay(f.scan(cut=False), entries, [])
    return min((g.due_ms for e in entries.values() for g in e.runs if g.state == State.PENDING), default=None)


def test_each_batch_rebuilt_from_its_own_records_is_the_whole_files():
    for seed in range(40):
        rng = random.Random(seed)
        f = MemoryScheduleFile(T0, T0 + 3_600_000, b"s" * 16, 0)
        index = BucketIndex()
        batches: list[tuple[int, int, int, int]] = []  # (first number, count, queue id, partition)
        nxt = 0
        for step in range(60):
            roll = rng.random()
            if roll < 0.4 or not batches:
                count = rng.randint(1, 6)
                q, p = rng.choice([(7, 1), (7, 2), (8, 1)])
                times = sorted(T0 + rng.randrange(5_000) for _ in range(count))
                batch = encode_batch([b"m%d" % i for i in range(count)], deliver_times=times)
                parts = []
                if rng.random() < 0.15:  # taken from another broker with its partition
                    parts += encode_record(ADOPTED, q, p, 0, nxt, rng.randrange(5), 0, rng.randrange(1 << 30))
                parts += encode_record(SCHEDULE, q, p, count, nxt, times[0], 0, step, batch)
                f.append(parts)
                batches.append((nxt, count, q, p))
                nxt += count + rng.randrange(3)  # numbers rise; adopted ones may leave gaps
            else:
                first, count, q, p = rng.choice(batches)
                kind = rng.choice([CANCELLED, CANCELLED, CANCELLED, DELIVERED, DROPPED, MOVED])
                index_in = rng.randrange(count)  # CANCELLED: a message; DELIVERED, DROPPED: a run's first
                f.append(encode_record(kind, q, p, index_in, first, T0, rng.randrange(1000)))
            if rng.random() < 0.3:
                index.catch_up(f)  # now and then, as lookups come
                if rng.random() < 0.5:  # and delay_stats: when the first pending message is due
                    assert index.next_due(f) == first_due(f), (seed, step)
        index.catch_up(f)
        assert index.next_due(f) == first_due(f), seed
        for number in range(nxt + 2):
            assert state(index.read_entry(f, number)) == state(whole_file(f, number)), (seed, number)
        entries: dict[int, Entry] = {}
        replay(f.scan(cut=False), entries, [])
        for q, p in [(7, 1), (7, 2), (8, 1), (9, 1)]:  # a hand-off's pages: a partition's batches after one
            for after in (-1, rng.randrange(60)):
                want = [
                    e.number for e in entries.values() if (e.queue_id, e.partition) == (q, p) and e.accept_seq > after
                ]
                got = index.batches_of(q, p, after)
                assert [index.numbers[i] for i in got] == want, (seed, q, p, after)
                assert [state(index.entry_at(f, i)) for i in got] == [state(entries[n]) for n in want], seed


def test_an_index_caught_up_to_a_size_then_to_the_end_sees_every_record():
    f = MemoryScheduleFile(T0, T0 + 3_600_000, b"s" * 16, 0)
    batch = encode_batch([b"a", b"b", b"c"], deliver_at_ms=T0)
    size = 0
    for n in range(0, 30, 3):
        f.append(encode_record(SCHEDULE, 1, 0, 3, n, T0 + n, 0, n, batch))
        if n == 12:
            size = f.size  # what the read outside the lock covers: appends go on meanwhile
    f.append(encode_record(CANCELLED, 1, 0, 1, 27, T0))
    index = BucketIndex()
    index.catch_up(f, end=size)
    assert list(index.numbers) == [0, 3, 6, 9, 12]
    index.catch_up(f)  # under the lock: the rest
    assert sorted(index.read_entry(f, 28).cancelled or ()) == [1]
    assert index.read_entry(f, 31) is None and index.read_entry(f, 0).number == 0
