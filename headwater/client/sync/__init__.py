"""The thread-based client: :class:`~headwater.client.sync.client.Client` and ``Admin``,
the ``Producer`` (and its sender thread), the consumers, the scanner and the subscriber.

Rule: a module here may block the calling thread, start threads and wait on
``concurrent.futures``; it reaches the broker only through a ``BrokerService`` (the
embedded broker, or :mod:`headwater.client.transport.remote` over the network) and keeps its
rules in :mod:`headwater.client.core`. It never imports :mod:`headwater.client.aio`.

Some modules here also hold what the asyncio twins reuse because it is not free of I/O or
waiting: the consumers' positions (:mod:`.positions`, which open fetch streams), the local
offsets file (:mod:`.local_offsets`), the ``Scanner`` (the asyncio one extends it) and the
bases of the keyed, shared and push consumers. :mod:`headwater.client.aio` may import them; the reverse is
forbidden (import-linter).
"""
