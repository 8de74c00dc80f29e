"""The log engine: segments, indexes, recovery, retention, flush. No networking."""

from headwater.storage.store import LogStore, StoreConfig

__all__ = ["LogStore", "StoreConfig"]
