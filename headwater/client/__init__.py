"""Producer, scanner and admin over any BrokerService (embedded or remote)."""

from headwater.client.client import Admin, Client
from headwater.client.consumer import Consumer
from headwater.client.partitioner import Partitioner, key_partition
from headwater.client.producer import BatchReceipt, Producer
from headwater.client.scanner import Scanner

__all__ = ["Admin", "BatchReceipt", "Client", "Consumer", "Partitioner", "Producer", "Scanner", "key_partition"]
