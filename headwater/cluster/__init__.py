"""Brokers as a cluster, coordinated by ZooKeeper (``docs/design/cluster.md``)."""
