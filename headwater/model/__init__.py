"""Value types: messages, ids, settings, the record batch codec. No I/O."""

from headwater.model.config import FlushPolicy, PartitionInfo, QueueConfig, QueueInfo
from headwater.model.message import Message, MessageId, Record

__all__ = ["FlushPolicy", "Message", "MessageId", "PartitionInfo", "QueueConfig", "QueueInfo", "Record"]
