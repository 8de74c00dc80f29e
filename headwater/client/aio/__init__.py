"""The asyncio client: the twins of :mod:`headwater.client.sync` (same class names with
``Async`` in front, same module names) and the asyncio broker service (:mod:`.service`)
that they call over the network or, embedded, on a thread.

Rule: a module here waits by awaiting, on one event loop. What it shares with the thread
client is written once in :mod:`headwater.client.common` (its ``@waits`` bodies run here
with the ASYNCIO driver); a class here keeps only how it waits. It talks to the network
through :mod:`headwater.client.transport` and never imports :mod:`headwater.client.sync`;
nothing outside this package and ``headwater.aio`` imports it (import-linter).
"""
