"""When a spin pays: the back-off both spins share, the client's before a leading caller
blocks (``headwater.client.transport.leading``) and the broker's before its loop blocks
(``headwater.broker.idle_spin``). No I/O: the caller spins and tells the gate what it found.

A spin pays only while it finds what it waits for (an answer, a request), so the gate keeps
a moving average of the spins that did (about the last eight); below a quarter (a peer
further away than a spin reaches, a busy machine) the next ``pause`` chances to spin are let
go, and then one spin looks again.

>>> gate = SpinGate(pause=2)
>>> for _ in range(11):  # 0.875 ** 11 < 0.25 <= 0.875 ** 10
...     gate.spun(False)
>>> [gate.may_spin() for _ in range(3)]
[False, False, True]
>>> gate.spun(True)  # the one that looks again finds it: the share is back over a quarter
>>> gate.hit_share > SPIN_HIT_SHARE_MIN, gate.may_spin()
(True, True)
>>> gate.spun(False); gate.paused  # a miss: the share falls, still over a quarter
0
>>> gate.spun(False); gate.paused  # a second one: under it, and the spins pause again
2
"""

from __future__ import annotations

__all__ = ["SPIN_HIT_SHARE_MIN", "SpinGate"]

#: Below this share of spins finding what they waited for, spinning pauses.
SPIN_HIT_SHARE_MIN = 0.25


class SpinGate:
    """Whether the next wait may spin, from how the last spins went. Not thread-safe: one
    spinner at a time (the leading caller; the broker's loop)."""

    __slots__ = ("hit_share", "pause", "paused")

    def __init__(self, pause: int) -> None:
        self.pause = pause  # chances to spin let go once spins stop paying
        self.hit_share = 1.0  # a moving average of the spins that found what they waited for
        self.paused = 0  # chances still to let go

    def may_spin(self) -> bool:
        """Whether to spin now (a paused chance is used up either way)."""
        if self.paused:
            self.paused -= 1
            return False
        return True

    def spun(self, found: bool) -> None:
        """A spin ended, having ``found`` what it waited for or not."""
        share = self.hit_share = self.hit_share * 0.875 + (0.125 if found else 0.0)
        if share < SPIN_HIT_SHARE_MIN:
            self.paused = self.pause
