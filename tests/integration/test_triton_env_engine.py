"""The environment an engine gets when it really runs: the hf engine process's library path, and a load that
fails in a python stub that cannot import the engine (a real tritonserver). The environment itself, with no
server or engine started: tests/unit/test_triton_env.py."""

import subprocess
import venv
from pathlib import Path

import pytest

from launcher import triton_install as lt


def test_engine_process_library_path_can_be_set(tiny_model_dir, monkeypatch):
    """The hf engine process runs with _LLMLAUNCH_ENGINE_LD_LIBRARY_PATH when that is set, and inherits the stub's
    LD_LIBRARY_PATH when it is unset or "inherit" (launcher.triton_install.ENGINE_LD_LIBRARY_PATH: the choice decides which
    cuDNN the engine loads on the H100 host)."""
    from launcher.engines.hf.config import HFEngineArgs
    from launcher.hf.client import EngineProcess

    def child_env(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        proc = EngineProcess(
            HFEngineArgs(model_path=str(tiny_model_dir), device="cpu", max_num_seqs=2, max_model_len=64)
        ).start()
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


@pytest.mark.triton
@pytest.mark.parametrize(
    "blocked, says",
    [
        ("torch", ["ModuleNotFoundError", "torch"]),
        # transformers' lazy import wraps the real failure ("Could not import module 'AutoTokenizer'" over a
        # scipy built for numpy 2); the message goes down the chain to it
        (
            "tokenizers.decoders",
            [
                "needs: ModuleNotFoundError: import of tokenizers.decoders halted",
                "(raised inside ModuleNotFoundError: Could not import module 'AutoTokenizer'",
            ],
        ),
    ],
)
def test_an_engine_in_a_stub_that_cannot_import_it_fails_its_load_saying_why(
    tiny_model_dir, tmp_path, monkeypatch, blocked, says
):
    """engine_process=false runs the hf engine in the python stub's interpreter.  A stub environment without torch
    (as the numpy<2 one of docs/engines.md, "GPU machines", makes), or whose transformers cannot import a module of its own: the
    model's load fails, and the server's error (ServerDied, led by the log's error lines) names the parameter, the
    interpreter, the innermost cause and both fixes.  The stub environment is a real virtual environment that sees
    this one's packages but cannot import `blocked` (None in sys.modules, set by a .pth line: how a missing package
    fails an import)."""
    import importlib.util
    import sysconfig

    from launcher.testing.serve import hf_server
    from launcher.triton import ServerDied

    if importlib.util.find_spec("pytriton") is None:
        pytest.skip("needs nvidia-pytriton (tritonserver)")
    env_dir = tmp_path / "stub-env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python3"
    site = subprocess.check_output(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    (Path(site) / "zz_blocked.pth").write_text(
        f"{sysconfig.get_paths()['purelib']}\nimport sys; sys.modules['{blocked}'] = None\n"
    )
    monkeypatch.setenv(lt.STUB_PYTHON_ENV, str(python))
    srv = hf_server(
        str(tiny_model_dir), tmp_path / "server", {"device": "cpu", "max_num_seqs": 2, "engine_process": "false"}
    )
    with pytest.raises(ServerDied) as died:
        with srv:
            pass
    errors = str(died.value).split("last lines:")[0]
    assert "engine_process=false runs the engine in the python stub's interpreter" in errors, errors
    assert all(s in errors for s in says), errors
    assert "Leave engine_process=true" in errors
    assert 'LLMLAUNCH_STUB_PYTHON; docs/engines.md, "GPU machines")' in errors  # the log's escaped quotes undone
    assert "CudaDriverHelper" not in errors
