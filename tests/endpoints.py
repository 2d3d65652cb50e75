"""endpoint.json records for tests that read one: what rank 0 of a two-replica Slurm job writes, with any field
changed."""

from __future__ import annotations

import dataclasses

from launcher.handoff.endpoint import EndpointRecord, FrontendEntry, RankEntry, ReplicaEntry


def endpoint_record(**changes) -> EndpointRecord:
    """A job on node1 (10.0.0.1) and node2 (10.0.0.2), one replica each, served through rank 0's front end."""
    record = EndpointRecord(
        url="grpc://10.0.0.1:8001",
        model="hf_model",
        job_id="7",
        host="10.0.0.1",
        grpc_port=8001,
        http_port=None,
        metrics_port=8002,
        metrics_url="http://10.0.0.1:8002/metrics",
        openai_port=8003,
        openai_url="http://10.0.0.1:8003/v1",
        token="5f3a",
        ready_s=12.5,
        ranks=(RankEntry(0, "10.0.0.1"), RankEntry(1, "10.0.0.2")),
        replicas=(
            ReplicaEntry(0, "10.0.0.1", 41001, "http://10.0.0.1:41003/metrics"),
            ReplicaEntry(1, "10.0.0.2", 41002, "http://10.0.0.2:41004/metrics"),
        ),
        frontend=FrontendEntry(pid=4242, processes=2),
    )
    return dataclasses.replace(record, **changes)
