"""The broker: queues over the storage engine, served in-process or over the network."""

from headwater.broker.broker import Broker

__all__ = ["Broker"]
