"""Delayed messages: the schedule on disk, the buckets due soon in memory, the dispatcher.

See :mod:`headwater.broker.delay.service` and docs/design/delay.md.
"""

from headwater.broker.delay.service import DelayLimits, DelayService, DelayTicket

__all__ = ["DelayService", "DelayLimits", "DelayTicket"]
