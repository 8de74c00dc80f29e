"""The Spark connector on a cluster: a queue spread over three brokers, written and read by a
Spark job in ``local-cluster[2,1,1024]`` mode (two executor processes of their own), through
the bootstrap list (tests/support/spark_cluster_job.py runs the job: one process holds one
SparkContext, and the other Spark tests share a ``local[2]`` one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import headwater
from tests.support.cluster import Cluster

# make test runs these alone, after the rest: Spark's JVMs take both cores
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parent.parent


def test_a_spark_job_writes_and_reads_a_queue_spread_over_three_brokers(zk_server, tmp_path):
    pytest.importorskip("pyspark", reason="the Spark connector tests need pyspark: pip install 'headwater[spark]'")
    cluster = Cluster(zk_server, tmp_path, 3)
    try:
        cluster.controller()
        with cluster.connect(1) as hw:
            hw.admin.create_queue("clicks", partitions=6)
            leaders = {p.partition: p.leader for p in hw.admin.cluster_metadata(["clicks"]).queue("clicks").partitions}
        assert Counter(leaders.values()) == {1: 2, 2: 2, 3: 2}
        from headwater.spark.source import _brokers

        with headwater.connect(cluster.address(2)) as hw:  # what the driver gives each task to ask first
            assert _brokers(hw, "clicks") == {p: cluster.address(b) for p, b in leaders.items()}
        servers = ",".join(cluster.address(i) for i in (1, 2, 3))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.spark_cluster_job", servers, "clicks", "3000"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env=env,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert sum(result["per_partition"].values()) == 3000 and result["keys"] == 3000
        assert set(result["per_partition"]) == {str(p) for p in range(6)}  # spread over every partition
        assert result["driver"] not in result["pids"] and len(result["pids"]) >= 1  # executors read
        for partition, leader in leaders.items():  # each partition's rows are on its leader
            with cluster.connect(leader) as hw:
                kept = hw.admin.describe_queue("clicks").partitions[partition]
                assert kept.end_offset - kept.start_offset == result["per_partition"][str(partition)]
    finally:
        cluster.stop()
