"""The environment tritonserver and its python stub get (launcher.triton.server_env): no server started.

The stub of the nvidia-pytriton wheel ignores PYTHONPATH and takes its packages from the environment of the
first `python3` on PATH; LLMLAUNCH_STUB_PYTHON names that interpreter.  The numpy check runs the named
interpreter for real (a virtual environment made here, with or without numpy)."""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from launcher import triton as lt
from launcher.errors import LaunchError


def _wheel():
    return lt.TritonInstall("/x/tritonserver", "/x/backends", {}, lt.WHEEL_SOURCE)


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    """A virtual environment without numpy (and without pip: nothing is installed into it)."""
    d = tmp_path_factory.mktemp("stubenv")
    venv.create(d, with_pip=False)
    return d / "bin" / "python3"


def _fake_numpy(python: Path, version: str) -> None:
    """Make `python`'s environment report numpy `version` (a dist-info folder is what importlib.metadata reads)."""
    site = subprocess.check_output([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    for old in Path(site).glob("numpy-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = Path(site) / f"numpy-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: numpy\nVersion: {version}\n")


def test_stub_python_goes_first_on_path_and_engine_keeps_this_interpreter(bare_venv, monkeypatch):
    _fake_numpy(bare_venv, "1.26.4")
    monkeypatch.setenv(lt.STUB_PYTHON_ENV, str(bare_venv))
    env = lt.server_env(_wheel())
    assert env["PATH"].split(os.pathsep)[0] == str(bare_venv.parent)
    assert env["LLMLAUNCH_PYTHON"] == sys.executable
    assert Path(env["LLMLAUNCH_ROOT"], "launcher", "triton.py").exists()
    assert lt.stub_numpy_version(str(bare_venv)) == "1.26.4"


def test_stub_python_with_numpy2_is_refused_with_the_fix(bare_venv, monkeypatch):
    _fake_numpy(bare_venv, "2.5.2")
    monkeypatch.setenv(lt.STUB_PYTHON_ENV, str(bare_venv))
    with pytest.raises(LaunchError) as e:
        lt.server_env(_wheel())
    text = str(e.value)
    assert "numpy 2.5.2" in text and lt.STUB_PYTHON_ENV in text and "numpy<2" in text


def test_this_environment_is_checked_when_no_stub_python(monkeypatch):
    """CI's environment has numpy 1.x (nvidia-pytriton pins it): accepted; a numpy 2 here would be refused."""
    monkeypatch.delenv(lt.STUB_PYTHON_ENV, raising=False)
    monkeypatch.setattr(lt, "stub_numpy_version", lambda stub_python="": "2.1.0")
    with pytest.raises(LaunchError, match="numpy 2.1.0"):
        lt.server_env(_wheel())


def test_a_missing_stub_python_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(lt.STUB_PYTHON_ENV, str(tmp_path / "nope" / "python3"))
    with pytest.raises(LaunchError, match=lt.STUB_PYTHON_ENV):
        lt.server_env(_wheel())


def test_other_installs_are_not_checked(monkeypatch):
    """An NGC container's tritonserver has a stub built for its own numpy: no opinion there."""
    monkeypatch.delenv(lt.STUB_PYTHON_ENV, raising=False)
    monkeypatch.setattr(lt, "stub_numpy_version", lambda stub_python="": "2.1.0")
    lt.server_env(lt.TritonInstall(lt.NGC_PATH, "", {}, lt.NGC_PATH))



def test_engine_library_path_defaults_to_the_launchers_own(monkeypatch):
    """The server's additions go first on tritonserver's LD_LIBRARY_PATH; the hf engine process (this interpreter)
    is given the launcher's own path, the cluster's env where that sets one, and a value the user set stays."""
    install = lt.TritonInstall(lt.NGC_PATH, "", {"LD_LIBRARY_PATH": "/server/lib"}, lt.NGC_PATH)
    monkeypatch.delenv(lt.ENGINE_LD_LIBRARY_PATH, raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/own/lib")
    env = lt.server_env(install)
    assert env["LD_LIBRARY_PATH"] == "/server/lib:/own/lib"
    assert env[lt.ENGINE_LD_LIBRARY_PATH] == "/own/lib"
    assert lt.server_env(install, {"LD_LIBRARY_PATH": "/cluster/lib"})[lt.ENGINE_LD_LIBRARY_PATH] == "/cluster/lib"
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert lt.server_env(install)[lt.ENGINE_LD_LIBRARY_PATH] == ""  # the engine process then runs without one
    monkeypatch.setenv(lt.ENGINE_LD_LIBRARY_PATH, "inherit")
    assert lt.server_env(install)[lt.ENGINE_LD_LIBRARY_PATH] == "inherit"


def test_engine_process_library_path_can_be_set(tiny_model_dir, monkeypatch):
    """The hf engine process runs with LLMLAUNCH_ENGINE_LD_LIBRARY_PATH when that is set, and inherits the stub's
    LD_LIBRARY_PATH when it is unset or "inherit" (launcher.triton.ENGINE_LD_LIBRARY_PATH: the choice decides which
    cuDNN the engine loads on the H100 host)."""
    from launcher.engines.hf_process import EngineProcess

    def child_env(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        proc = EngineProcess(str(tiny_model_dir), device="cpu", max_num_seqs=2, max_model_len=64).start()
        try:
            text = Path(f"/proc/{proc.info['pid']}/environ").read_text()
        finally:
            proc.shutdown()
        return dict(kv.split("=", 1) for kv in text.split("\0") if "=" in kv)

    monkeypatch.delenv(lt.ENGINE_LD_LIBRARY_PATH, raising=False)
    assert child_env(LD_LIBRARY_PATH="/stub/lib:/own/lib")["LD_LIBRARY_PATH"] == "/stub/lib:/own/lib"
    assert child_env(**{lt.ENGINE_LD_LIBRARY_PATH: "inherit"})["LD_LIBRARY_PATH"] == "/stub/lib:/own/lib"
    assert child_env(**{lt.ENGINE_LD_LIBRARY_PATH: "/own/lib"})["LD_LIBRARY_PATH"] == "/own/lib"
    assert "LD_LIBRARY_PATH" not in child_env(**{lt.ENGINE_LD_LIBRARY_PATH: ""})


def test_waiting_for_a_server_shows_what_its_model_says_it_is_doing(tmp_path):
    """A model that takes long to get ready (compiling, capturing graphs) announces its stage in the server
    log (launcher.stage); wait_ready's progress lines show the latest one.  A real process that never
    answers stands in for a server that is still loading."""
    import subprocess

    from launcher import stage
    from launcher.triton import wait_ready
    from tests.models.serve import free_port

    log = tmp_path / "server.log"
    log.write_text("I1122 loading\n" + stage.PREFIX + "hf engine: loading /m (bfloat16) on cuda\n"
                   + "W1122 some warning\n" + stage.PREFIX + "hf engine: compiling the model\nmore output\n")
    notes: list = []
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(TimeoutError, match="not ready after 3s"):
            wait_ready(proc, f"127.0.0.1:{free_port()}", "m", log, deadline_s=3, progress=notes.append, probe=False)
    finally:
        proc.kill()
        proc.wait()
    assert notes and all(n.startswith("waiting for tritonserver: starting (hf engine: compiling the model) (")
                         for n in notes), notes
    assert stage.latest("nothing announced\n") == ""


def test_a_failed_servers_log_is_shown_from_its_errors(tmp_path):
    """log_excerpt: the error lines tritonserver logged (glog E lines; one failure that Triton logs twice, as the
    instance and as the model, shown once; the stub's escaped traceback unfolded; the last three, each cut; not the
    CUDA driver's on a CPU-only host), then the last lines; a log without errors is its last lines alone.  The lines
    are those of a real failed load (a stub whose transformers could not import AutoTokenizer), shortened."""
    failure = ("ModuleNotFoundError: Could not import module 'AutoTokenizer'. Are this object's requirements defined "
               "correctly?\\n\\nAt:\\n  /opt/torch/site-packages/transformers/utils/import_utils.py(2648): __getattr__\\n")
    lines = ['E1126 04:38:29.000001 2040 cuda_driver.cc:1] "CudaDriverHelper has not been initialized."',
             f'I1126 04:38:30.796025 2040 pb_stub.cc:366] "Failed to initialize Python stub: {failure}"',
             f'E1126 04:38:31.638021 2040 backend_model.cc:692] "ERROR: Failed to create instance: {failure}"',
             f'E1126 04:38:31.638149 2040 model_lifecycle.cc:642] "failed to load \'hf_model\' version 1: Internal: '
             f'{failure}"',
             "I1126 04:38:31.638179 2040 model_lifecycle.cc:777] \"failed to load 'hf_model'\"",
             *[f"| model_repository_path[{i}] | /tmp/repo |" for i in range(40)],
             "error: creating server: Internal - failed to load all models"]
    log = tmp_path / "tritonserver.log"
    log.write_text("\n".join(lines) + "\n")
    text = lt.log_excerpt(log, 5)
    errors, tail = text.split("\nlast lines:\n")
    assert errors.splitlines() == [
        "errors:",
        "  ERROR: Failed to create instance: ModuleNotFoundError: Could not import module 'AutoTokenizer'. Are this "
        "object's requirements defined correctly?",
        "    At:",
        "      /opt/torch/site-packages/transformers/utils/import_utils.py(2648): __getattr__"]
    assert tail.splitlines()[-1] == "error: creating server: Internal - failed to load all models"
    assert len(tail.splitlines()) == 5 and "AutoTokenizer" not in tail  # the tail alone would not say why
    many = [f"E1126 04:38:31.{i:06d} 1 m.cc:1] \"error number {i}: " + "x" * 900 + '"' for i in range(5)]
    log.write_text("\n".join(many) + "\n")
    shown = lt.log_errors(log)
    assert [e[:16] for e in shown] == ["error number 2: ", "error number 3: ", "error number 4: "]  # the latest
    assert all(len(e) == 704 and e.endswith(" ...") for e in shown)
    log.write_text("I1126 starting\nI1126 still starting\n")
    assert lt.log_excerpt(log) == "I1126 starting\nI1126 still starting"
    assert lt.log_excerpt(tmp_path / "missing.log") == "(no log)"


@pytest.mark.triton
def test_an_engine_in_a_stub_without_torch_fails_its_load_saying_why(tiny_model_dir, tmp_path, monkeypatch):
    """engine_process=false runs the hf engine in the python stub's interpreter.  A stub environment without torch
    (as the numpy<2 one README's "GPU machines" makes): the model's load fails, and the server's error (ServerDied,
    led by the log's error lines) names the parameter, the interpreter and both fixes.  The stub environment is a
    real virtual environment that sees this one's packages but cannot import torch (None in sys.modules, set by a
    .pth line: how a missing package fails an import)."""
    import importlib.util
    import sysconfig

    from launcher.triton import ServerDied
    from tests.models.serve import hf_server

    if importlib.util.find_spec("pytriton") is None:
        pytest.skip("needs nvidia-pytriton (tritonserver)")
    env_dir = tmp_path / "stub-env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python3"
    site = subprocess.check_output([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    (Path(site) / "zz_no_torch.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n"
                                                "import sys; sys.modules['torch'] = None\n")
    monkeypatch.setenv(lt.STUB_PYTHON_ENV, str(python))
    srv = hf_server(str(tiny_model_dir), tmp_path / "server", {"device": "cpu", "max_num_seqs": 2,
                                                                "engine_process": "false"})
    with pytest.raises(ServerDied) as died:
        with srv:
            pass
    errors = str(died.value).split("last lines:")[0]
    assert "engine_process=false runs the engine in the python stub's interpreter" in errors, errors
    assert "ModuleNotFoundError" in errors and "torch" in errors and "Leave engine_process=true" in errors
    assert "LLMLAUNCH_STUB_PYTHON; README, \"GPU machines\")" in errors  # the log's escaped quotes undone
    assert "CudaDriverHelper" not in errors
