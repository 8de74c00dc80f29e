"""DurableAcks: sync-flush answers released by one fsync thread, in position order."""

from __future__ import annotations

import asyncio
import threading

from headwater.broker.durable_acks import DurableAcks
from headwater.errors import StorageError


def test_answers_go_out_once_their_position_is_durable_in_order():
    async def main() -> None:
        gate = threading.Event()
        synced: list[int] = []

        def wait_durable(position: int) -> None:
            assert gate.wait(10)
            synced.append(position)

        acks = DurableAcks(asyncio.get_running_loop(), wait_durable)
        answered: list[tuple[str, object]] = []
        for pos, name in [(10, "a"), (20, "b"), (15, "c"), (30, "d")]:
            acks.add(pos, lambda err, name=name: answered.append((name, err)))
        await asyncio.sleep(0.05)
        assert answered == [] and acks.pending == 4  # nothing before the fsync
        gate.set()
        await acks.drain(10)
        assert [n for n, _ in answered] == ["a", "c", "b", "d"]  # by position
        assert all(err is None for _, err in answered)
        assert synced and synced[-1] == 30  # one fsync may cover them all
        acks.stop()

    asyncio.run(main())


def test_a_failed_fsync_answers_with_the_error_and_later_ones_retry():
    async def main() -> None:
        calls = {"n": 0}

        def wait_durable(position: int) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise StorageError("cannot fsync: injected")

        acks = DurableAcks(asyncio.get_running_loop(), wait_durable)
        got: list[object] = []
        acks.add(5, got.append)
        await acks.drain(10)
        assert len(got) == 1 and isinstance(got[0], StorageError)
        acks.add(6, got.append)  # the next fsync works
        await acks.drain(10)
        assert got[1] is None
        acks.stop()

    asyncio.run(main())


def test_drain_gives_up_after_its_timeout():
    async def main() -> None:
        release = threading.Event()
        acks = DurableAcks(asyncio.get_running_loop(), lambda pos: release.wait(10))
        acks.add(1, lambda err: None)
        await acks.drain(0.05)
        assert acks.pending == 1
        release.set()
        await acks.drain(10)
        assert acks.pending == 0
        acks.stop()

    asyncio.run(main())
