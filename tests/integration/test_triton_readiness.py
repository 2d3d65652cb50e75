"""launcher.triton's readiness probe against a real tritonserver whose port another real tritonserver already serves.

A server binds its gRPC port only once its models are loaded; until then whatever else listens there (a leftover of an
earlier run, another job's server on a shared node) answers the probe. The probe takes an answer as its server's only
under the server's own id (`--id`, launcher.render.server_id)."""

from __future__ import annotations

import pytest

from launcher.testing.serve import make_repository, serve


def test_a_server_whose_port_another_tritonserver_answers_is_not_taken_for_ready(tmp_path):
    """The other server answers live, model ready and a real request on the port this one is told to bind, but
    reports another id: wait_ready does not call this server READY; this server fails its bind and wait_ready says so
    with Triton's "already in use" (what a rank retries on fresh ports, launcher/rank/rank.py)."""
    from launcher import triton_install
    from launcher.triton import ServerDied, TritonServer

    install = triton_install.resolve_tritonserver()
    repo = make_repository(tmp_path / "repo", {"timed": {}})
    with serve(repo) as url:  # the other server: the default id, "triton"
        prefix = "lltready_"
        argv = [
            install.binary,
            f"--model-repository={repo}",
            f"--backend-config=python,shm-region-prefix-name={prefix}",
            f"--grpc-port={url.rsplit(':', 1)[1]}",
            "--allow-http=false",
            "--allow-metrics=false",
            "--id=llmlaunch-test-r0",
        ]
        if install.backend_directory:
            argv.append(f"--backend-directory={install.backend_directory}")
        server = TritonServer(
            argv,
            env=triton_install.server_env(install),
            log_path=tmp_path / "ours.log",
            grpc_url=url,
            model="timed",
            ready_timeout_s=60,
            drain_timeout_s=5,
            shm_prefix=prefix,
        )
        with pytest.raises(ServerDied, match="already in use"):
            with server:
                pass
