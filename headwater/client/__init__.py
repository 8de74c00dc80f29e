"""Producer, consumers, scanner and admin over any BrokerService (embedded or remote)."""

from headwater.client.client import Admin, Client
from headwater.client.consumer import Consumer
from headwater.client.group_consumer import GroupConsumer
from headwater.client.keyed_consumer import KeyedConsumer
from headwater.client.partitioner import Partitioner, key_partition
from headwater.client.producer import BatchReceipt, Producer
from headwater.client.scanner import Scanner
from headwater.client.shared_consumer import Delivery, SharedConsumer
from headwater.client.subscriber import Subscriber

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
