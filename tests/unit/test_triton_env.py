"""The environment tritonserver and its python stub get (launcher.triton_install.server_env): no server started (what an
engine or a server that really runs gets: tests/integration/test_triton_env_engine.py).

The stub of the nvidia-pytriton wheel ignores PYTHONPATH and takes its packages from the environment of the
first `python3` on PATH; LLMLAUNCH_STUB_PYTHON names that interpreter.  The numpy check runs the named
interpreter for real (a virtual environment made here, with or without numpy)."""

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from launcher import logtext, triton_install as lt
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
    site = subprocess.check_output(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
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
    assert env["_LLMLAUNCH_PYTHON"] == sys.executable
    assert Path(env["_LLMLAUNCH_ROOT"], "launcher", "triton.py").exists()
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


def test_waiting_for_a_server_shows_what_its_model_says_it_is_doing(tmp_path):
    """A model that takes long to get ready (compiling, capturing graphs) announces its stage in the server
    log (launcher.stage); wait_ready's progress lines show the latest one.  A real process that never
    answers stands in for a server that is still loading."""
    import subprocess

    from launcher import stage
    from launcher.ports import free_port
    from launcher.triton import wait_ready

    log = tmp_path / "server.log"
    log.write_text(
        "I1122 loading\n"
        + stage.PREFIX
        + "hf engine: loading /m (bfloat16) on cuda\n"
        + "W1122 some warning\n"
        + stage.PREFIX
        + "hf engine: compiling the model\nmore output\n"
    )
    notes: list = []
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(TimeoutError, match="not ready after 3s"):
            wait_ready(proc, f"127.0.0.1:{free_port()}", "m", log, deadline_s=3, progress=notes.append, probe=False)
    finally:
        proc.kill()
        proc.wait()
    assert notes and all(
        n.startswith("waiting for tritonserver: starting (hf engine: compiling the model) (") for n in notes
    ), notes
    assert stage.latest("nothing announced\n") == ""


def test_a_failed_servers_log_is_shown_from_its_errors(tmp_path):
    """log_excerpt: the error lines tritonserver logged (glog E lines; one failure that Triton logs twice, as the
    instance and as the model, shown once; the stub's escaped traceback unfolded; the last three, each cut; not the
    CUDA driver's on a CPU-only host), then the last lines; a log without errors is its last lines alone.  The lines
    are those of a real failed load (a stub whose transformers could not import AutoTokenizer), shortened."""
    failure = (
        "ModuleNotFoundError: Could not import module 'AutoTokenizer'. Are this object's requirements defined "
        "correctly?\\n\\nAt:\\n  /opt/torch/site-packages/transformers/utils/import_utils.py(2648): __getattr__\\n"
    )
    lines = [
        'E1126 04:38:29.000001 2040 cuda_driver.cc:1] "CudaDriverHelper has not been initialized."',
        f'I1126 04:38:30.796025 2040 pb_stub.cc:366] "Failed to initialize Python stub: {failure}"',
        f'E1126 04:38:31.638021 2040 backend_model.cc:692] "ERROR: Failed to create instance: {failure}"',
        f"E1126 04:38:31.638149 2040 model_lifecycle.cc:642] \"failed to load 'hf_model' version 1: Internal: "
        f'{failure}"',
        "I1126 04:38:31.638179 2040 model_lifecycle.cc:777] \"failed to load 'hf_model'\"",
        *[f"| model_repository_path[{i}] | /tmp/repo |" for i in range(40)],
        "error: creating server: Internal - failed to load all models",
    ]
    log = tmp_path / "tritonserver.log"
    log.write_text("\n".join(lines) + "\n")
    text = logtext.log_excerpt(log, 5)
    errors, tail = text.split("\nlast lines:\n")
    assert errors.splitlines() == [
        "errors:",
        "  ERROR: Failed to create instance: ModuleNotFoundError: Could not import module 'AutoTokenizer'. Are this "
        "object's requirements defined correctly?",
        "    At:",
        "      /opt/torch/site-packages/transformers/utils/import_utils.py(2648): __getattr__",
    ]
    assert tail.splitlines()[-1] == "error: creating server: Internal - failed to load all models"
    assert len(tail.splitlines()) == 5 and "AutoTokenizer" not in tail  # the tail alone would not say why
    many = [f'E1126 04:38:31.{i:06d} 1 m.cc:1] "error number {i}: ' + "x" * 900 + '"' for i in range(5)]
    log.write_text("\n".join(many) + "\n")
    shown = logtext.log_errors(log)
    assert [e[:16] for e in shown] == ["error number 2: ", "error number 3: ", "error number 4: "]  # the latest
    assert all(len(e) == 704 and e.endswith(" ...") for e in shown)
    log.write_text("I1126 starting\nI1126 still starting\n")
    assert logtext.log_excerpt(log) == "I1126 starting\nI1126 still starting"
    assert logtext.log_excerpt(tmp_path / "missing.log") == "(no log)"


def _dist(site: Path, name: str, files: dict, requires=()):
    """A distribution installed the way pip leaves one: its files and a .dist-info with METADATA and RECORD."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: " + name + "\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in [*files, f"{info.name}/METADATA"]))


def test_stub_site_links_a_host_site_leaving_out_what_cannot_import_under_the_stubs_numpy(tmp_path):
    """benchmark/gpu/carry/stub_site.py (a failure seen on a GPU host: transformers -> scikit-learn -> a scipy built for numpy 2).  A real
    stub virtual environment with its own numpy 1.26 (a stand-in package: only its version is read) and a host
    site-packages of hand-made distributions: numpy 2; `modern`, which requires numpy>=2 (left out from metadata);
    `brokenlib`, which fails to import as that scipy did (left out for the failure's innermost frame); `needsbroken`,
    which requires it (left out with it); `good` and `app`, linked.  `app` imports what it finds, as transformers
    does.  A statement that no leaving out can fix, or an interpreter that dies, exits 1 and removes the .pth again;
    a folder that holds more than links is refused before anything is written."""
    host = tmp_path / "host-site"
    host.mkdir()
    _dist(host, "numpy", {"numpy/__init__.py": "__version__ = '2.5.2'\n"})
    _dist(
        host,
        "modern",
        {"modern.py": "import numpy; assert numpy.__version__ >= '2', numpy.__version__\n"},
        ["numpy>=2"],
    )
    _dist(
        host,
        "brokenlib",
        {"brokenlib/__init__.py": "from . import _util\n", "brokenlib/_util.py": "import numpy\nlong = numpy.long\n"},
        ["numpy>=1.25"],
    )
    _dist(host, "needsbroken", {"needsbroken.py": "X = 1\n"}, ["brokenlib", "good; extra == 'never'"])
    _dist(host, "good", {"good.py": "OK = True\n"})
    _dist(
        host,
        "app",
        {
            "app.py": "import importlib.util, good\nfor m in ('modern', 'needsbroken', 'brokenlib'):\n"
            "    if importlib.util.find_spec(m):\n        __import__(m)\n"
        },
    )
    stub = tmp_path / "stub-env"
    venv.create(stub, with_pip=False)
    python = stub / "bin" / "python3"
    purelib = Path(
        subprocess.check_output(
            [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (purelib / "numpy").mkdir()
    (purelib / "numpy" / "__init__.py").write_text("__version__ = '1.26.4'\n")  # no `long`, as numpy 1.26
    script = Path(__file__).resolve().parents[2] / "benchmark" / "gpu" / "carry" / "stub_site.py"
    dest = tmp_path / "linked"

    def run(check):
        return subprocess.run(
            [sys.executable, str(script), str(host), str(dest), "--python", str(python), "--check", check],
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = run("import app, numpy, good; assert numpy.__version__ == '1.26.4', numpy.__version__")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "left out numpy: the stub environment has its own" in out
    assert "left out modern: requires numpy>=2, the stub has 1.26.4" in out
    assert "left out brokenlib: fails to import: AttributeError" in out and "'long'" in out
    assert "left out needsbroken: requires brokenlib" in out
    assert "left out good" not in out and "left out app" not in out
    assert sorted(p.name for p in dest.iterdir()) == ["app-1.0.dist-info", "app.py", "good-1.0.dist-info", "good.py"]
    pth = purelib / "zz_llmlaunch_host_site.pth"
    assert pth.read_text().strip() == str(dest)
    # the stub's interpreter, run plainly, now finds the host's packages through the .pth and its own numpy first
    seen = subprocess.check_output(
        [str(python), "-c", "import app, numpy; print(numpy.__version__)"],
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert seen.strip() == "1.26.4"

    failed = run("import app, not_anywhere")
    assert failed.returncode == 1
    assert "`import app, not_anywhere` still fails" in failed.stderr and "not_anywhere" in failed.stderr
    assert not pth.exists()
    crashed = run("import os; os._exit(3)")  # an interpreter that dies without the probe's report
    assert crashed.returncode == 1 and "still fails" in crashed.stderr and "exit 3" in crashed.stderr
    (dest / "mine.txt").write_text("not a link")
    refused = run("import app")
    assert refused.returncode != 0 and "holds more than links (mine.txt" in refused.stderr + refused.stdout
    assert (dest / "mine.txt").exists() and not pth.exists()


def _shared_library(path: Path, needs=(), symbol="x"):
    """A real shared library (cc) with its file name as soname and DT_NEEDED entries for `needs` (found beside it)."""
    src = path.with_suffix(".c")
    src.write_text(f"int {symbol}(void) {{ return 1; }}\n")
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-o",
            str(path),
            str(src),
            f"-Wl,-soname,{path.name}",
            f"-L{path.parent}",
            "-Wl,--no-as-needed",
            *[f"-l:{n}" for n in needs],
        ],
        check=True,
    )
    src.unlink()


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the stand-in libraries")
def test_torch_cudnn_is_preloaded_by_full_path_for_an_engine_in_the_stub(tmp_path):
    """launcher.python_backend.torch_libs, which the hf model calls before it starts an engine in the stub (a mix seen on a GPU host:
    torch's libcudnn_adv, loaded before torch's libcudnn_ops, pulled in the system's ops through LD_LIBRARY_PATH).
    Stand-ins for torch's cuDNN wheel folder and a system folder, real ELF libraries built here with sonames and
    DT_NEEDED as cuDNN's (adv needs ops and graph, ops needs graph); real loading in fresh processes with the system
    folder on LD_LIBRARY_PATH.  Loading in name order maps the system's ops; preload_torch_cudnn maps torch's
    only, each after what it needs, skips a file that is not a library, and finds the folder beside torch without
    importing it."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('torch_cudnn_dir must not import torch')\n")
    lib = site / "nvidia" / "cudnn" / "lib"
    system = tmp_path / "system"
    for d in (lib, system):
        d.mkdir(parents=True)
        _shared_library(d / "libcudnn_graph.so.9", symbol="graph")
        _shared_library(d / "libcudnn_ops.so.9", ["libcudnn_graph.so.9"], symbol="ops")
    _shared_library(lib / "libcudnn_adv.so.9", ["libcudnn_ops.so.9", "libcudnn_graph.so.9"], symbol="adv")
    (lib / "libcudnn_broken.so.9").write_text("not a shared library\n")
    from launcher.python_backend.torch_libs import elf_needed

    assert elf_needed(str(lib / "libcudnn_adv.so.9"))[:2] == ["libcudnn_ops.so.9", "libcudnn_graph.so.9"]
    probe = (
        "import ctypes, json, sys; from launcher.python_backend.torch_libs import torch_cudnn_dir, "
        "preload_torch_cudnn, mapped_from\n"
        "d = torch_cudnn_dir()\n"
        "if sys.argv[1] == 'name-order':\n"
        "    loaded = [p for n in ('adv', 'graph', 'ops') if ctypes.CDLL(p := f'{d}/libcudnn_{n}.so.9', ctypes.RTLD_GLOBAL)]\n"
        "else:\n"
        "    loaded = preload_torch_cudnn()\n"
        "print(json.dumps([d, loaded, mapped_from('libcudnn')]))"
    )
    root = Path(__file__).resolve().parents[2]

    def run(how="preload"):
        out = subprocess.check_output(
            [sys.executable, "-c", probe, how],
            text=True,
            cwd=root,
            env=dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{root}", LD_LIBRARY_PATH=str(system)),
        )
        return json.loads(out)

    _, _, mixed = run("name-order")
    assert str(system / "libcudnn_ops.so.9") in mixed  # the hazard, as on the GPU host
    found, loaded, mapped = run()
    assert found == str(lib)
    assert loaded == [str(lib / n) for n in ("libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_adv.so.9")]
    assert mapped == sorted(loaded)  # torch's only: nothing from the system folder
    # a torch without cuDNN wheels (CPU builds): nothing to do
    (site / "nvidia").rename(tmp_path / "elsewhere")
    assert run() == [None, [], []]
