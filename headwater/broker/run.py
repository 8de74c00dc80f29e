"""Running a broker process: event loop, signals, graceful stop (``headwater serve``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path

from headwater._version import __version__
from headwater.broker.allocator import keep_freed_memory
from headwater.broker.broker import Broker
from headwater.broker.cluster_node import ClusterNode
from headwater.broker.server import BrokerServer, ServerConfig
from headwater.cluster.coordination import Coordination, CoordinationError, CoordinationUnavailableError
from headwater.cluster.membership import Membership, ZooKeeperAddress
from headwater.cluster.records import BrokerRecord
from headwater.errors import HeadwaterError
from headwater.storage.store import StoreConfig

__all__ = ["connect_zookeeper", "join_cluster", "run_server"]

log = logging.getLogger("headwater.server")

ATTEMPT_S = 5.0  # one try at reaching ZooKeeper; a start keeps trying, saying so, up to its timeout


def run_server(
    data: str | Path, store: StoreConfig, server: ServerConfig, *, on_ready: Callable[[int], None] | None = None
) -> None:
    """Open the data directory and serve it until SIGTERM or SIGINT, then stop cleanly:
    stop accepting, finish requests in flight, flush, close. With ``server.zookeeper`` the
    broker joins that cluster once it listens, and leaves it first when it stops."""
    keep_freed_memory(server.allocator_cache_bytes)
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    broker = Broker.open(data, store, clustered=bool(server.zookeeper))

    async def main() -> None:
        srv = BrokerServer(broker, server)
        port = await srv.start()
        node = None
        try:
            if server.zookeeper:
                node = await asyncio.to_thread(join_cluster, broker, server, Path(data), port)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, srv.request_stop)
            if on_ready is not None:
                on_ready(port)
            await srv.serve_until_stopped()
        except BaseException:
            await srv.stop()
            raise
        finally:
            if node is not None:
                await asyncio.to_thread(_leave, node)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def connect_zookeeper(server: ServerConfig) -> Coordination:
    """A session with the cluster's ZooKeeper, trying again (and saying so) until
    ``zookeeper_connect_timeout_s`` has passed: ZooKeeper starting beside the broker is
    normal; one that never answers ends the start with an error naming it."""
    from headwater.cluster.zookeeper import ZooKeeperCoordination  # kazoo only for a cluster

    if not log.isEnabledFor(logging.DEBUG):  # kazoo tells every try at reconnecting; we tell what matters
        logging.getLogger("kazoo.client").setLevel(logging.ERROR)
    where = str(ZooKeeperAddress.parse(server.zookeeper))
    deadline = time.monotonic() + server.zookeeper_connect_timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            return ZooKeeperCoordination(
                where,
                session_timeout_s=server.zookeeper_session_timeout_s,
                connect_timeout_s=max(0.1, min(ATTEMPT_S, left)),
            )
        except CoordinationUnavailableError as e:
            if deadline - time.monotonic() <= 0:
                raise CoordinationUnavailableError(
                    f"ZooKeeper at {where} did not answer for {server.zookeeper_connect_timeout_s:g} s "
                    f"(zookeeper_connect_timeout_s): is it running, and is --zookeeper right?"
                ) from e
            log.warning("ZooKeeper at %s does not answer yet; trying for %.0f s more", where, left)


def join_cluster(broker: Broker, server: ServerConfig, data_dir: Path, port: int) -> ClusterNode:
    """Register this broker (listening on ``port``) in its cluster and take its part in it:
    follow the metadata, stand for controller, serve the partitions it leads."""
    coord = connect_zookeeper(server)
    record = BrokerRecord(
        broker_id=server.broker_id,
        host=server.advertised_address,
        port=port,
        version=__version__,
        started_ms=int(time.time() * 1000),
        store_id=broker.store.store_id.hex(),
    )
    membership = Membership(
        coord,
        where=str(ZooKeeperAddress.parse(server.zookeeper)),
        record=record,
        data_dir=data_dir,
        session_timeout_s=server.zookeeper_session_timeout_s,
        # a previous process's session lasts at most its timeout (ZooKeeper caps it at 20 ticks)
        stale_wait_s=2 * server.zookeeper_session_timeout_s + 5,
    )
    try:
        membership.join()
        node = ClusterNode(
            broker,
            membership,
            moves_running_max=server.moves_running_max,
            auto_rebalance_after_s=server.auto_rebalance_after_s,
            coordinator_partitions=server.coordinator_partitions,
        )
        node.start()
        if not node.wait_serving(server.zookeeper_connect_timeout_s):  # "listening" once it serves
            log.warning("broker %d: the first look at the cluster's state is taking long", server.broker_id)
    except CoordinationError as e:
        coord.close()
        if isinstance(e, HeadwaterError):
            raise
        raise CoordinationUnavailableError(f"joining the cluster at {server.zookeeper} failed: {e}") from e
    except BaseException:
        coord.close()
        raise
    return node


def _leave(node: ClusterNode) -> None:
    try:
        node.close()
        node.membership.leave()
    finally:
        node.coord.close()
