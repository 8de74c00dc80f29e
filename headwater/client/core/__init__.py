"""The client's cores: state machines and rules that do no I/O, start no thread and read
no clock of their own (time comes in as ``now_ms`` arguments or a clock the driver passes),
driven by the thread-based
(:mod:`headwater.client.sync`) and the asyncio (:mod:`headwater.client.aio`) clients, which
own the sockets, the waiting and the futures (h11's and httpx's split).

- :mod:`.outcomes`: what one attempt at sending a batch ended with, and what the producer
  does next, as one table; the retry policy.
- :mod:`.sequences`: the producer id, its epoch and the per-partition sequence numbers.
- :mod:`.producer`: partitions and batches, lingering and sealing, what is in flight, what
  is sent again after a failure and in which order.
- :mod:`.batching`: what both producers do above that core: settings, routing a message to
  its partition, building a ``send_batch``.
- :mod:`.partitioner`: the partition of a message (key hash, round robin, random, custom).
- :mod:`.membership`: a group member's rules (settings, assignment, what it owns).
- :mod:`.lookups`: decoding fetched batches, and what ``get`` and ``find`` make of them.
- :mod:`.reads`: the rules of a read: a scan's bounds, the partitions named, a poll's arguments.

Rule: a module here imports only this package, the model, the protocol and the errors;
never :mod:`headwater.client.sync`, :mod:`headwater.client.aio`,
:mod:`headwater.client.transport`, nor ``asyncio``, ``threading``, ``socket`` or
``concurrent.futures`` (import-linter checks it). So it is tested without a broker, a loop
or a thread, and both clients follow the same rules.
"""
