"""Session fixture `local_slurm`: a real multi-node Slurm cluster (launcher.localslurm.cluster) for tests.

conftest.py imports it (`from tests.slurm_fixture import local_slurm`). The cluster
is brought up once per session with the CLI defaults (4 nodes x 4 fake GPUs, state
dir from $LLMLAUNCH_LOCALSLURM_DIR or /var/lib/llmlaunch-localslurm), so it is the
same cluster `llmlaunch-localslurm up` makes and a kept cluster is reused at once.

- Not root: every test using it is skipped (network namespaces, mknod and daemons need root).
- LLMLAUNCH_KEEP_SLURM=1: the cluster is left running at session end (next runs start in ~0.1 s); a session starts
  by cancelling whatever jobs an earlier one left on it.
- While the session runs, os.environ["SLURM_CONF"] points at the cluster, so
  srun/sbatch/sacct and submitit (which calls them) find it without arguments.
"""

from __future__ import annotations

import os

import pytest

NOT_ROOT_REASON = "needs root: llmlaunch-localslurm makes network namespaces, mknod devices and runs slurmd as root"


def requires_slurm(obj):
    """Decorator for tests (or classes) needing the cluster: marks them `slurm`, skips them when not root."""
    return pytest.mark.slurm(pytest.mark.skipif(os.geteuid() != 0, reason=NOT_ROOT_REASON)(obj))


@pytest.fixture(scope="session")
def local_slurm():
    """A running `launcher.localslurm.cluster.LocalSlurm` (node1..node4, partition `local`, 4 GPUs per node)."""
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT_REASON)
    from launcher.localslurm import cluster as localslurm

    cluster = localslurm.up()
    # A kept cluster may still run jobs of a session killed before its teardown (a requeued job comes back on its
    # own): they would hold the nodes and ports these tests count on
    localslurm.cancel_all_jobs(cluster.slurm_conf)
    previous = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env())
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        if os.environ.get("LLMLAUNCH_KEEP_SLURM") != "1":
            localslurm.down(cluster.state_dir)
