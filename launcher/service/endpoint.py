"""The service's stable endpoint, which the router serves whatever replica jobs come and go: the front end on the
public gRPC and metrics ports, following the members file, and the OpenAI API in front of it; endpoint.json once the
first replica serves."""

from __future__ import annotations

import os
import time

from launcher.engines.registry import ENGINES
from launcher.frontend import FrontendConfig, FrontendProcess
from launcher.frontend.settings import serve_settings
from launcher.handoff.endpoint import EndpointRecord, FrontendEntry, ReplicaEntry
from launcher.openai_api.process import start_api
from launcher.paths import PACKAGE_ROOT
from launcher.ports import metrics_url
from launcher.python_backend.responders import responders


class Endpoint:
    """The front end and the OpenAI API of a service's router (a Controller's)."""

    def __init__(self, controller):
        self.c = controller
        self.api = None

    def start_frontend(self) -> None:
        c, spec = self.c, self.c.spec
        edef = ENGINES[spec.engine.name]
        processes = responders(
            spec.engine.device,
            len(os.sched_getaffinity(0)),
            edef.response_processes(spec.engine),
            max(c.target, c.auto.max_replicas),
        ).frontend_processes
        cfg = FrontendConfig(
            [],
            members=str(c.sdir.members),
            slots=c.slots,
            host=spec.host,
            port=int(spec.serve.grpc_port),
            metrics_port=int(spec.serve.metrics_port),
            processes=processes,
            **serve_settings(
                spec.serve, edef.continues_requests, spec.model_name, str(spec.model.tokenizer or spec.model.path or "")
            ),
        )
        c.publish_members()  # none yet: the front end starts with an empty file
        env = dict(os.environ)
        env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        c.frontend = FrontendProcess(cfg, env=env, config_path=c.sdir.dir / "frontend.json").start()
        c.frontend.wait_ready(60.0)

    async def publish(self) -> None:
        """The first replica serves: the OpenAI API, then endpoint.json (the launching side waits for it)."""
        import asyncio

        c, spec = self.c, self.c.spec
        grpc = f"127.0.0.1:{spec.serve.grpc_port}"
        self.api = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: start_api(
                spec,
                grpc,
                spec.host,
                int(spec.serve.openai_port),
                say=lambda m: print(m, flush=True),
                timeout_s=float(spec.serve.ready_timeout_s),
                config_path=c.sdir.dir / "openai.json",
                avoid=(int(spec.serve.grpc_port), int(spec.serve.metrics_port)),
            ),
        )
        serving = [j for j in c.jobs.values() if j.state == "serving"]
        host, port = c.host, int(spec.serve.grpc_port)
        c.sdir.run.write_endpoint(
            EndpointRecord(
                url=f"grpc://{host}:{port}",
                model=spec.model_name,
                job_id=c.sdir.service().get("id", c.sdir.path.name),
                host=host,
                grpc_port=port,
                http_port=None,
                metrics_port=int(spec.serve.metrics_port),
                metrics_url=metrics_url(host, int(spec.serve.metrics_port)),
                openai_port=self.api.cfg.port,
                openai_url=f"http://{host}:{self.api.cfg.port}/v1",
                token=c.sdir.service().get("id", ""),
                ready_s=round(min(j.ready_s or 0.0 for j in serving), 2),
                ranks=(),
                replicas=tuple(ReplicaEntry(j.slot, j.host, j.grpc_port, j.metrics_url) for j in serving),
                frontend=FrontendEntry(c.frontend.proc.pid, c.frontend.cfg.processes),
            )
        )
        c.serving_since = time.time()
        c.decide("serving", f"endpoint grpc://{host}:{port}, OpenAI http://{host}:{self.api.cfg.port}/v1")

    def stop(self) -> None:
        for child in (self.api, self.c.frontend):
            if child is not None:
                child.stop()
