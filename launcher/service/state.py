"""A service's files (serve.router=host|job), all under its run dir, and one writer each:

launch.json          one replica job's spec (replicas=1; service_replicas: how many the service starts with)
token                the service's token (mode 0600): replica jobs present it when they register
endpoint.json        the stable endpoint, once a replica serves (launcher/handoff/endpoint.py)
service/service.json the service's id (what llmlaunch-status, -stop and -scale take) and how its router runs
service/router.json  where the router runs: its pid, host, control URL, Slurm job (router=job)
service/members.json the replicas the front end routes to (launcher/frontend/members.py)
service/status.json  the controller's view each second: target, every replica job, the last decisions
service/decisions.jsonl  every decision with its reason, one JSON line each
service/router.log   the router's log (the front end's and the OpenAI API's lines with it)
replicas/r<K>/       replica job K's own run dir (its spec with the link to the router, its ranks' logs)
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Dict, List, Optional

from launcher.rundir import RunDir, _read, _write


class ServiceDir:
    """A service's run dir: the files the router, its replica jobs and llmlaunch-status share."""

    def __init__(self, path):
        self.path = Path(path)
        self.run = RunDir(self.path)
        self.dir = self.path / "service"

    # -- files
    @property
    def token_file(self) -> Path:
        return self.path / "token"

    @property
    def members(self) -> Path:
        return self.dir / "members.json"

    @property
    def status_file(self) -> Path:
        return self.dir / "status.json"

    @property
    def decisions(self) -> Path:
        return self.dir / "decisions.jsonl"

    @property
    def router_file(self) -> Path:
        return self.dir / "router.json"

    @property
    def log(self) -> Path:
        return self.dir / "router.log"

    @property
    def service_file(self) -> Path:
        return self.dir / "service.json"

    def replica_dir(self, name: str) -> Path:
        return self.path / "replicas" / name

    # -- writers and readers
    def make_token(self) -> str:
        """The service's token, made once, readable by the user only."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.token_file.exists():
            fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(24) + "\n")
        return self.token_file.read_text().strip()

    def write_json(self, path: Path, doc: Dict) -> None:
        _write(path, doc)

    def read_json(self, path: Path) -> Optional[Dict]:
        return _read(path)

    def add_decision(self, doc: Dict) -> None:
        with open(self.decisions, "a") as f:
            f.write(json.dumps(doc, sort_keys=True) + "\n")

    def read_decisions(self, last: int = 0) -> List[Dict]:
        try:
            lines = self.decisions.read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines[-last:] if last else lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def service(self) -> Dict:
        return self.read_json(self.service_file) or {}

    def router(self) -> Optional[Dict]:
        return self.read_json(self.router_file)

    def status(self) -> Optional[Dict]:
        return self.read_json(self.status_file)
