"""The client's cores: state machines that do no I/O, start no thread and never read a clock
(time comes in as ``now_ms`` arguments), driven by the thread-based and the asyncio clients,
which own the sockets, the waiting and the futures (h11's and httpx's split).

- :mod:`.outcomes`: what one attempt at sending a batch ended with, and what the producer
  does next, as one table; the retry policy.
- :mod:`.sequences`: the producer id, its epoch and the per-partition sequence numbers.
- :mod:`.producer`: partitions and batches, lingering and sealing, what is in flight, what
  is sent again after a failure and in which order.
"""
