"""The client's network side: one pipelined TCP connection per broker and the services
built on it.

- :mod:`.async_transport` and its parts: the connection, its calls and deadlines, its push
  streams and the hand-off that lets a waiting thread read its own answers;
- :mod:`.remote`: ``RemoteService``, the ``BrokerService`` the sync client calls over it;
- :mod:`.fetch_stream`: the broker-pushed fetch streams a consumer reads from;
- :mod:`.polling`: waiting on several fetches at once and riding out a broker restart;
- :mod:`.send_future`: the futures these settle (sync, asyncio, and the lazy one).

Rule: sockets, the event loop that reads them and the futures they settle live here. A
module here imports :mod:`headwater.client.core` and the protocol, never
:mod:`headwater.client.sync` nor :mod:`headwater.client.aio` (import-linter).
"""
