"""Connecting to the brokers of a bootstrap list (``headwater.connect("h1:p1,h2:p2")``):
the first that answers says, in its METADATA, whether it runs alone (the plain
:class:`~headwater.client.transport.remote.RemoteService`, as before) or in a cluster (a
:class:`~headwater.client.transport.routing.RoutedService` over it). docs/cluster.md,
"Clients"."""

from __future__ import annotations

import socket
import time

from headwater.client.core.routing import BOOTSTRAP_PROBE_S, parse_bootstrap
from headwater.client.transport.link import parse_address
from headwater.client.transport.remote import RemoteService
from headwater.client.transport.routing import RoutedService
from headwater.errors import InvalidArgumentError, UnavailableError
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
    if len(bootstrap) == 1:  # as before: the one address gets the whole connect_timeout_s
        home = RemoteService(
            bootstrap[0], connect_timeout_s=connect_timeout_s, request_timeout_s=request_timeout_s, retries=retries
        )
    else:
        home = _first_that_answers(bootstrap, connect_timeout_s, request_timeout_s, retries)
    try:
        md = home.metadata()
    except BaseException:
        home.close()
        raise
    if not md.cluster_id:
        return home  # a broker alone: the plain client, no routing layer
    return RoutedService(
        home,
        md,
        bootstrap=bootstrap,
        connect_timeout_s=connect_timeout_s,
        request_timeout_s=request_timeout_s,
        retries=retries,
    )


def _first_that_answers(
    bootstrap: list[str], connect_timeout_s: float, request_timeout_s: float, retries: int
) -> RemoteService:
    """A connection to the first of ``bootstrap`` that takes one, trying each in turn (a
    refused connection moves on at once) until ``connect_timeout_s`` has passed."""
    deadline = time.monotonic() + connect_timeout_s
    errors: dict[str, str] = {}
    while True:
        for address in bootstrap:
            left_s = deadline - time.monotonic()
            try:
                host, port = parse_address(address)
                socket.create_connection((host, port), timeout=max(0.05, min(left_s, BOOTSTRAP_PROBE_S))).close()
            except (OSError, ValueError, InvalidArgumentError) as e:
                errors[address] = str(e) or type(e).__name__
                continue
            try:
                return RemoteService(
                    address,
                    connect_timeout_s=max(0.1, left_s),
                    request_timeout_s=request_timeout_s,
                    retries=retries,
                )
            except UnavailableError as e:
                errors[address] = str(e)
        if time.monotonic() >= deadline:
            tried = "; ".join(f"{a}: {why}" for a, why in errors.items())
            raise UnavailableError(
                f"cannot reach any broker of {','.join(bootstrap)} within {connect_timeout_s} s ({tried}); "
                f"are they running, and are the addresses right?"
            )
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
