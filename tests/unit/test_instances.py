"""launcher.python_backend.instances: how the instances of one Triton model find the engine the first one starts."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from launcher.python_backend.instances import InstanceShare, instance_index

CONFIG = {"name": "vllm_model", "instance_group": [{"name": "vllm_model_0", "count": 3}]}


def test_instance_index_follows_triton_instance_names():
    assert [instance_index(CONFIG, f"vllm_model_0_{k}") for k in range(3)] == [0, 1, 2]
    two = {"instance_group": [{"name": "g_a", "count": 2}, {"name": "g_b", "count": 2}]}
    assert instance_index(two, "g_b_1") == 3
    with pytest.raises(RuntimeError, match="not named after one of the model's instance groups"):
        instance_index(CONFIG, "other_0")


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    return tmp_path


# Every instance is a child of one process here, as the stubs are children of one tritonserver (the share's key).
def _waiter(model, index, out):
    try:
        out.put(("ok", InstanceShare("t", model, index, 3).wait(20)))
    except RuntimeError as exc:
        out.put(("error", str(exc)))


def _first(model, action, out):
    share = InstanceShare("t", model, 0, 3)
    if action == "publish":
        share.publish({"inputs": ["ipc://a", "ipc://b", "ipc://c"]})
        time.sleep(2)  # alive while the others read it
        share.release()
    else:
        share.fail("CUDA out of memory", linger_s=1.0)
    out.put(("first", share.prefix))


def _run(target, *args):
    p = multiprocessing.Process(target=target, args=args)
    p.start()
    return p


def test_the_others_get_what_the_first_publishes(tmpdir_env):
    q = multiprocessing.Queue()
    procs = [_run(_waiter, "m", k, q) for k in (1, 2)]
    time.sleep(0.5)  # the others are waiting before the first publishes
    procs.append(_run(_first, "m", "publish", q))
    got = [q.get(timeout=20) for _ in procs]
    for p in procs:
        p.join(10)
    ((_, prefix),) = [g for g in got if g[0] == "first"]
    docs = [doc for kind, doc in got if kind == "ok"]
    assert len(docs) == 2 and all(d["inputs"][2] == "ipc://c" for d in docs), got
    assert not os.path.exists(prefix + ".info")  # released when the first unloads


def test_the_others_fail_at_once_with_the_first_ones_reason(tmpdir_env):
    q = multiprocessing.Queue()
    procs = [_run(_waiter, "m", 1, q)]
    time.sleep(0.3)
    t0 = time.monotonic()
    procs.append(_run(_first, "m", "fail", q))
    got = dict(q.get(timeout=20) for _ in procs)
    for p in procs:
        p.join(10)
    assert "the instance that starts the shared engine failed: CUDA out of memory" in got["error"]
    assert time.monotonic() - t0 < 5
    assert not os.path.exists(got["first"] + ".failed")  # a later load does not read it


def test_a_file_whose_writer_is_gone_is_not_read(tmpdir_env):
    """What a crashed earlier load left (its writer's pid is gone) is ignored: the wait goes on."""
    share = InstanceShare("t", "m", 1, 2)
    with open(share.prefix + ".info", "w") as f:
        f.write('{"inputs": ["stale"], "owner_pid": 999999999}')
    with pytest.raises(RuntimeError, match="was not up after 1 s"):
        share.wait(1.0)


def test_a_directory_others_can_read_is_refused(tmpdir_env):
    os.makedirs(tmpdir_env / f"llmlaunch-{os.getuid()}", mode=0o755)
    os.chmod(tmpdir_env / f"llmlaunch-{os.getuid()}", 0o755)
    with pytest.raises(RuntimeError, match="is not a private directory of this user"):
        InstanceShare("t", "m", 0, 2)
