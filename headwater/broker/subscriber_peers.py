"""What a subscriber's coordinator tells the other brokers (docs/design/cluster.md,
"Subscriptions (built)", "Delivery").

On a cluster a subscriber process has one push stream on each leader of its partitions;
its coordinator, the single authority on who owns the name, tells every live broker at once
(END_SUBSCRIBER_STREAMS) when that changes: after a claim, to end the streams of an older
epoch (the process they belong to was replaced), and after a delete, to end them all. The
claim or the delete is answered once every broker answered or ``END_STREAMS_TIMEOUT_S``
passed: a broker out of reach is logged and left to the subscriber process, which asks the
coordinator itself every few seconds.

Thread-safety: a call opens its own connections (claims and deletes are rare), in threads
of its own, and closes them.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable

from headwater.broker.peer import PeerClient, PeerError
from headwater.cluster.metadata import ClusterView
from headwater.errors import HeadwaterError

__all__ = ["END_STREAMS_TIMEOUT_S", "end_streams_everywhere"]

log = logging.getLogger("headwater.push")

#: The longest a claim or a delete waits for the brokers to end a subscriber's streams.
END_STREAMS_TIMEOUT_S = 3.0


def end_streams_everywhere(
    view: ClusterView,
    broker_id: int,
    queue: str,
    name: str,
    epoch: int,
    deleted: bool,
    *,
    timeout_s: float = END_STREAMS_TIMEOUT_S,
    connect: Callable[[str, str, float], PeerClient] | None = None,
) -> list[int]:
    """Ask every live broker of ``view`` (this one, ``broker_id``, too) to end its stream of
    subscriber (``queue``, ``name``) older than ``epoch`` (every one when ``deleted``); the
    ids of the brokers that did not answer in ``timeout_s``."""
    opener = connect or (
        lambda address, who, t: PeerClient(address, name=who, connect_timeout_s=t, request_timeout_s=t)
    )

    def tell(address: str) -> None:
        with opener(address, f"headwater-broker-{broker_id}-subscribers", timeout_s) as peer:
            peer.end_subscriber_streams(queue, name, epoch, deleted)

    brokers = {b: view.broker_address(b) for b in view.brokers}
    missed: list[int] = []
    if not brokers:
        return missed
    with concurrent.futures.ThreadPoolExecutor(len(brokers), thread_name_prefix="headwater-end-streams") as pool:
        asked = {b: pool.submit(tell, address) for b, address in brokers.items() if address is not None}
        for b, fut in sorted(asked.items()):
            try:
                fut.result(timeout=timeout_s * 2 + 1)
            except (PeerError, HeadwaterError, concurrent.futures.TimeoutError) as e:
                log.warning("broker %d did not end the streams of subscriber %s/%s: %s", b, queue, name, e)
                missed.append(b)
    return missed
