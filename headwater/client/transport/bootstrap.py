"""Connecting to the brokers of a bootstrap list (``headwater.connect("h1:p1,h2:p2")``):
the first that answers says, in its METADATA, whether it runs alone (the plain
:class:`~headwater.client.transport.remote.RemoteService`, as before) or in a cluster (a
:class:`~headwater.client.transport.routing.RoutedService` over it). Which address is
tried when is :func:`~headwater.client.core.routed_plans.first_that_answers`' (the
asyncio twin runs it too). docs/cluster.md, "Clients"."""

from __future__ import annotations

import socket
import time

from headwater.client.core.effects import Open, Sleep, drive
from headwater.client.core.routed_plans import first_that_answers
from headwater.client.core.routing import parse_bootstrap
from headwater.client.transport.link import parse_address
from headwater.client.transport.remote import RemoteService
from headwater.client.transport.routing import RoutedService
from headwater.model.cluster import ClusterMetadata
from headwater.model.service import BrokerService

__all__ = ["open_service"]


def open_service(
    addresses: str | list[str], *, connect_timeout_s: float = 10.0, request_timeout_s: float = 60.0, retries: int = 3
) -> BrokerService:
    """The service of the brokers at ``addresses`` (``"h1:p1,h2:p2"``, or a list): METADATA
    from the first that answers (the next tried on a connection failure). A broker running
    alone (cluster id ``""``): its own RemoteService, as before; a cluster: a
    :class:`RoutedService` over it. Raises one :class:`UnavailableError` naming every
    address tried when none answers within ``connect_timeout_s``."""
    bootstrap = parse_bootstrap(addresses)

    def perform(effect: Open | Sleep) -> tuple[RemoteService, ClusterMetadata] | None:
        if isinstance(effect, Sleep):
            time.sleep(effect.seconds)
            return None
        if effect.probe_s is not None:  # does anybody take a connection there at all?
            socket.create_connection(parse_address(effect.address), timeout=effect.probe_s).close()
        service = RemoteService(
            effect.address,
            connect_timeout_s=effect.connect_timeout_s,
            request_timeout_s=request_timeout_s,
            retries=retries,
        )
        try:
            return service, service.metadata()  # a broker still joining its cluster: the next one
        except BaseException:
            service.close()
            raise

    home, md = drive(first_that_answers(bootstrap, connect_timeout_s), perform)
    if not md.cluster_id:
        return home  # a broker alone: the plain client, no routing layer
    settings = {"connect_timeout_s": connect_timeout_s, "request_timeout_s": request_timeout_s, "retries": retries}
    return RoutedService(home, md, bootstrap=bootstrap, **settings)
