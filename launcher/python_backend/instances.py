"""Instances of one Triton model that share one engine: who starts it, and how the others find it.

Triton's python backend runs every instance of a model (`instance_group { count: N }`) in a stub process
of its own, each with its own GIL, so N instances build and send N times the responses one can. They
share one engine: the first instance starts it, the others wait until it is up and connect to it. The
engine's addresses, or why it failed, are files in a private directory, keyed by the tritonserver that
started the stubs and the model's name, so two servers on one node (or two jobs sharing a node's /tmp)
never meet.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time


def private_dir() -> str:
    """$TMPDIR/llmlaunch-<uid>, created mode 0700; refused if someone else owns it or others may read it."""
    base = os.path.join(tempfile.gettempdir(), f"llmlaunch-{os.getuid()}")
    if len(base) > 80:  # unix socket paths under it have at most 107 bytes
        raise RuntimeError(
            f"the model instances' shared files would live under {base}, too long a path for a unix "
            f"socket; set TMPDIR to a shorter directory (e.g. /tmp)"
        )
    os.makedirs(base, mode=0o700, exist_ok=True)
    st = os.stat(base)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RuntimeError(
            f"{base} is not a private directory of this user (mode {oct(st.st_mode & 0o777)}): remove "
            f"it, or set TMPDIR to a directory of your own"
        )
    return base


def share_key(model_name: str) -> str:
    """The same for every instance of `model_name` in this tritonserver (the stubs' parent)."""
    return hashlib.sha1(f"{os.getppid()}:{model_name}".encode()).hexdigest()[:12]


def instance_index(model_config: dict, instance_name: str) -> int:
    """This instance's place 0..count-1 among the model's instances: Triton names them `<group name>_<k>`."""
    before = 0
    for group in model_config.get("instance_group") or []:
        prefix = f"{group.get('name', '')}_"
        k = instance_name[len(prefix) :] if instance_name.startswith(prefix) else ""
        if group.get("name") and k.isdigit():
            return before + int(k)
        before += int(group.get("count", 1))
    raise RuntimeError(
        f"instance {instance_name!r} is not named after one of the model's instance groups "
        f"{[g.get('name') for g in model_config.get('instance_group') or []]}"
    )


def frontend_params(params: dict, model_config: dict, instance_name: str) -> dict:
    """`params` with `frontends` (the model's instance count: the stubs that are front ends of one engine) and,
    where there are several, this instance's `frontend_index`."""
    count = sum(int(g.get("count", 1)) for g in model_config.get("instance_group") or []) or 1
    params = dict(params, frontends=str(count))
    if count > 1:
        params["frontend_index"] = str(instance_index(model_config, instance_name))
    return params


class InstanceShare:
    """One model's instances in one tritonserver, each at its place (`instance_index`). Place 0 starts the
    engine and `publish()`es what the others need once it is up, or `fail()`s with the reason; the others
    `wait()` for either (Triton initializes a model's instances at the same time). Place 0 `release()`s
    the files when it unloads."""

    def __init__(self, kind: str, model_name: str, index: int, count: int):
        self.index, self.count = index, count
        self.prefix = os.path.join(private_dir(), f"{kind}-{share_key(model_name)}")
        if index == 0:  # what an earlier load in this server left must not be read as this one's
            self.release()

    def _path(self, suffix: str) -> str:
        return f"{self.prefix}.{suffix}"

    def _write(self, suffix: str, doc: dict) -> None:
        tmp = self._path(f"{suffix}.tmp")
        with open(tmp, "w") as f:
            json.dump(dict(doc, owner_pid=os.getpid()), f)
        os.replace(tmp, self._path(suffix))

    def publish(self, info: dict) -> None:
        self._write("info", info)

    def fail(self, message: str, linger_s: float = 1.0) -> None:
        """Tell the waiting instances why the engine did not start; the marker is removed after `linger_s`
        (they poll more often), so a later load in this server does not read it."""
        self._write("failed", {"message": message})
        time.sleep(linger_s)
        self.release()

    def _read(self, suffix: str):
        try:
            with open(self._path(suffix)) as f:
                doc = json.load(f)
        except (FileNotFoundError, ValueError):
            return None
        try:  # a file whose writer is gone is left from an earlier load
            os.kill(int(doc.get("owner_pid", 0)), 0)
        except (OSError, ValueError):
            return None
        return doc

    def wait(self, timeout_s: float, poll_s: float = 0.1) -> dict:
        """What place 0 published; RuntimeError at once when it failed, else after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            failed = self._read("failed")
            if failed is not None:
                raise RuntimeError(f"the instance that starts the shared engine failed: {failed['message']}")
            info = self._read("info")
            if info is not None:
                return info
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the shared engine was not up after {timeout_s:.0f} s (waiting for "
                    f"{self._path('info')}); see the first instance's log"
                )
            time.sleep(poll_s)

    def release(self) -> None:
        if self.index == 0:
            for suffix in ("info", "failed"):
                _remove(self._path(suffix))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
