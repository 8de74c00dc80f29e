"""Counting the records read from the delay schedule's bucket files: what a test checks to
show that an operation reads its own batches, not whole files."""

from __future__ import annotations

from typing import Any

from headwater.storage.schedule import ScheduleFile


class ScheduleReads:
    """From now on, count every record ``ScheduleFile.scan`` yields (in ``count``)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.count = 0
        scan = ScheduleFile.scan

        def counting(file: ScheduleFile, **kw: Any) -> Any:
            for r in scan(file, **kw):
                self.count += 1
                yield r

        monkeypatch.setattr(ScheduleFile, "scan", counting)
