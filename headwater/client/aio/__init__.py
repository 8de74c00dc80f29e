"""The asyncio client: the twins of :mod:`headwater.client.sync` (same class names with
``Async`` in front, same modules without the old ``aio_`` prefix) and the asyncio broker
service (:mod:`.service`) that they call over the network or, embedded, on a thread.

Rule: a module here waits by awaiting, on one event loop; it keeps its rules in
:mod:`headwater.client.core` and reuses the bases :mod:`headwater.client.sync` shares with
it, and talks to the network through :mod:`headwater.client.transport`. Nothing outside this
package and ``headwater.aio`` imports it (import-linter).
"""
