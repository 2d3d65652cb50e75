"""launcher.localslurm.cluster: the real cluster (root, `slurm` marker). The rendering without a cluster:
tests/unit/test_localslurm_render.py.

The cluster tests share one session cluster (the `local_slurm` fixture of
tests/slurm_fixture.py, imported by tests/conftest.py); LLMLAUNCH_KEEP_SLURM=1 keeps the cluster for the next run.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from launcher.localslurm import cluster as ls
from tests.slurm_fixture import requires_slurm  # the `local_slurm` fixture comes from conftest.py

# ------------------------------------------------------------ the real cluster


def _srun(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(["srun", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"srun {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _wait_for(what: str, predicate, timeout: float = 60.0, poll: float = 0.3):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)
    return value


@requires_slurm
class TestCluster:
    def test_up_again_is_a_no_op(self, local_slurm):
        t0 = time.monotonic()
        again = ls.up(len(local_slurm.nodes), local_slurm.gpus_per_node, local_slurm.state_dir)
        assert time.monotonic() - t0 < 5
        assert again == local_slurm
        st = ls.status(local_slurm.state_dir)
        assert st.up and all(d.alive for d in st.daemons)
        assert set(st.nodes) == set(local_slurm.nodes) == {f"node{i}" for i in range(1, len(local_slurm.nodes) + 1)}
        assert local_slurm.node_addrs["node1"] == "10.213.7.11" and local_slurm.partition == "local"

    def test_pmix_mpi4py_bcast_across_two_nodes(self, local_slurm):
        code = (
            "from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
            "print(c.Get_rank(), c.Get_size(), c.bcast('x' if c.Get_rank() == 0 else None), socket.gethostname())"
        )
        out = _srun("--mpi=pmix", "-N2", "-n4", sys.executable, "-c", code).stdout.split("\n")
        rows = sorted(line.split() for line in out if line)
        assert [r[:3] for r in rows] == [[str(i), "4", "x"] for i in range(4)]
        hosts = {r[3] for r in rows}  # usually node1,node2; others when those are busy
        assert len(hosts) == 2 and hosts <= set(local_slurm.nodes)

    def test_forgetting_mpi_pmix_fails(self, local_slurm):
        # MpiDefault=none on purpose: a launcher that forgets --mpi=pmix must fail, not run N singletons.
        code = "from mpi4py import MPI; print(MPI.COMM_WORLD.Get_size())"
        proc = _srun("-N2", "-n2", sys.executable, "-c", code, check=False)
        assert proc.returncode != 0 and "MPI_Init" in proc.stdout + proc.stderr

    def test_gres_binds_fake_gpus(self, local_slurm):
        # Slurm binds whichever GPUs are free: another test's job still ending on a node may hold GPU 0 there, so
        # the step's own GPU list (SLURM_STEP_GPUS) is what CUDA_VISIBLE_DEVICES must equal, not "0,1,2".
        out = _srun(
            "-N2", "--gpus-per-node=3", "sh", "-c", "echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $SLURM_STEP_GPUS"
        )
        rows = [line.split() for line in out.stdout.splitlines()]
        queue = subprocess.run(["squeue", "-h", "-o", "%i %T %N %b"], capture_output=True, text=True).stdout
        assert len({r[0] for r in rows}) == 2, out.stdout
        for _node, visible, step_gpus in rows:
            ids = [int(i) for i in visible.split(",")]
            assert visible == step_gpus and len(set(ids)) == 3, (out.stdout, queue)
            assert set(ids) <= set(range(local_slurm.gpus_per_node)), (out.stdout, queue)
        node = subprocess.run(["scontrol", "show", "node", "node1"], capture_output=True, text=True, check=True).stdout
        assert f"Gres=gpu:{local_slurm.gpus_per_node}" in node

    def test_tcp_by_node_name_from_host_and_other_node(self, local_slurm):
        server = (
            "import socket; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); "
            "print(s.getsockname()[1], flush=True)\n"
            "for _ in range(2):\n"
            "    c, a = s.accept(); c.sendall(socket.gethostname().encode()); c.close()"
        )
        proc = subprocess.Popen(
            ["srun", "-u", "-N1", "-n1", "-w", "node1", sys.executable, "-c", server], stdout=subprocess.PIPE, text=True
        )
        try:
            port = int(proc.stdout.readline())
            with socket.create_connection(("node1", port), timeout=10) as c:  # host namespace -> node1
                assert c.recv(64) == b"node1"
            client = f"import socket; print(socket.create_connection(('node1', {port}), timeout=10).recv(64).decode())"
            assert _srun("-N1", "-n1", "-w", "node2", sys.executable, "-c", client).stdout.strip() == "node1"
            proc.wait(timeout=30)
        finally:
            proc.kill()

    def test_submitit_multinode_job(self, local_slurm, tmp_path):
        submitit = pytest.importorskip("submitit")

        def rank_info():  # local function: cloudpickle ships it by value
            import socket

            import submitit
            from mpi4py import MPI

            env = submitit.JobEnvironment()
            return env.global_rank, env.num_tasks, socket.gethostname(), MPI.COMM_WORLD.bcast("hi")

        ex = submitit.AutoExecutor(folder=tmp_path)
        assert ex.cluster == "slurm"
        ex.update_parameters(nodes=2, tasks_per_node=2, timeout_min=5, slurm_srun_args=["--mpi=pmix"])
        job = ex.submit(rank_info)
        _wait_for(f"submitit job {job.job_id}", lambda: job.done(force_check=True))
        results = sorted(job.results())
        assert [r[:2] for r in results] == [(i, 4) for i in range(4)]
        assert len({r[2] for r in results}) == 2 and {r[3] for r in results} == {"hi"}

    def test_scancel_surfaces_as_failure(self, local_slurm, tmp_path):
        submitit = pytest.importorskip("submitit")
        ex = submitit.AutoExecutor(folder=tmp_path)
        ex.update_parameters(nodes=1, tasks_per_node=1, timeout_min=5)
        job = ex.submit(time.sleep, 300)
        # submitit waits up to 15 s for the result file of a finished job (slow NFS); a cancelled
        # job never writes one and this filesystem is local. Harmless if submitit renames it.
        job._results_timeout_s = 1
        _wait_for("the job to run", lambda: job.get_info(mode="force").get("State") == "RUNNING")
        job.cancel(check=True)
        _wait_for("the cancel to reach accounting", lambda: job.done(force_check=True))
        with pytest.raises(submitit.core.utils.UncompletedJobError, match="CANCELLED"):
            job.result()
        sacct = subprocess.run(
            ["sacct", "-j", job.job_id, "-X", "-n", "-P", "-o", "State"], capture_output=True, text=True, check=True
        ).stdout
        assert sacct.startswith("CANCELLED"), sacct  # "CANCELLED by 0"
