"""Producer, consumers, scanner and admin over any BrokerService (embedded or remote)."""

from headwater.client.core.partitioner import Partitioner, key_partition
from headwater.client.sync.client import Admin, Client
from headwater.client.sync.consumer import Consumer
from headwater.client.sync.group_consumer import GroupConsumer
from headwater.client.sync.keyed_consumer import KeyedConsumer
from headwater.client.sync.producer import BatchReceipt, Producer
from headwater.client.sync.scanner import Scanner
from headwater.client.sync.shared_consumer import Delivery, SharedConsumer
from headwater.client.sync.subscriber import Subscriber

__all__ = [
    "Admin",
    "BatchReceipt",
    "Client",
    "Consumer",
    "Delivery",
    "GroupConsumer",
    "KeyedConsumer",
    "Partitioner",
    "Producer",
    "Scanner",
    "SharedConsumer",
    "Subscriber",
    "key_partition",
]
