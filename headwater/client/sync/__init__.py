"""The thread-based client: :class:`~headwater.client.sync.client.Client` and ``Admin``,
the ``Producer`` (and its sender thread), the consumers, the scanner and the subscriber.

Rule: a module here may block the calling thread, start threads and wait on
``concurrent.futures``; it reaches the broker only through a ``BrokerService`` (the
embedded broker, or :mod:`headwater.client.transport.remote` over the network). What it
shares with the asyncio client is written once in :mod:`headwater.client.common` (its
``@waits`` bodies run here with the BLOCKING driver); a class here keeps only how it waits.
It never imports :mod:`headwater.client.aio`, nor the reverse (import-linter).
"""
