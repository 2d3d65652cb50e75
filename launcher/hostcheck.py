"""What the launch host sees, checked before a launch starts anything: the paths the job loads, tp and pp against the
model's shape (its config.json, or a made model's own), and a GPU for an engine that needs one.

launcher/validate.py validates values (pure); this module reads the host: each path field's kind (its declared
`launcher.domains.Path`, or for the model's folders the engine's `Engine.host_paths`) is looked for where the
path is visible. On this machine and the local Slurm cluster (`cluster.paths_on_host`) every path is; elsewhere
(an HPC cluster submitted to from a login node, which usually mounts the shared filesystem) a path this host does
not see is a warning and the launch goes on, since the nodes may see it. A GPU is looked for on a local launch
only. `check(config, probe)` returns (problems, warnings); the GPU probe is a parameter so tests can give either
answer; `before_launch(cfg)` is the launch's one call. A dry run (`before_dry_run(cfg)`) checks only the model's
shape, which needs nothing but files read on this host: it must plan a site cluster's job from a laptop, whose GPUs,
programs and paths are not the nodes'.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from launcher.domains import Nested, Path as PathDomain, domain_of
from launcher.engines.registry import ENGINES
from launcher.errors import LaunchError
from launcher.models import MAKERS
from launcher.schedulers.registry import SCHEDULERS
from launcher.spec import plain
from launcher.validate import typed_config

Problem = Tuple[str, str, str]

WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def _has_any(folder: Path, patterns) -> bool:
    return any(next(folder.glob(p), None) is not None for p in patterns)


def _weights_missing(folder: Path, c) -> List[str]:
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    if not _has_any(folder, WEIGHTS):
        missing.append(f"weights ({', '.join(WEIGHTS)})")
    return missing


def _tokenizer_missing(folder: Path, c) -> List[str]:
    return (
        []
        if _has_any(folder, TOKENIZER_FILES + ("*.tiktoken",))
        else [f"tokenizer files ({', '.join(TOKENIZER_FILES)})"]
    )


def _hf_model_missing(folder: Path, c) -> List[str]:
    return _weights_missing(folder, c) + _tokenizer_missing(folder, c)


def _hf_or_turbomind_missing(folder: Path, c) -> List[str]:
    if (folder / "triton_models" / "weights").is_dir():  # an LMDeploy TurboMind workspace (lmdeploy convert)
        return []
    return _hf_model_missing(folder, c)


def _trtllm_engine_missing(folder: Path, c) -> List[str]:
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    ranks = [f"rank{i}.engine" for i in range(max(1, c.tp * c.pp)) if not (folder / f"rank{i}.engine").is_file()]
    if ranks:
        missing.append(f"{', '.join(ranks)} (one engine file per rank of tp*pp={c.tp * c.pp})")
    return missing


# Folder kinds: (what it is, what is missing from `folder` (empty: it is one), the fix). {key} is the field.
FOLDERS = {
    "hf_model": (
        "a Hugging Face model folder",
        _hf_model_missing,
        "point {key} at a folder with config.json, the weights and the tokenizer (a `save_pretrained` or "
        "`huggingface-cli download` folder), or use model=smollm2 / model=tiny, which llmlaunch makes",
    ),
    "hf_weights": (
        "a Hugging Face model folder",
        _weights_missing,
        "point {key} at a folder with config.json and the weights (a `save_pretrained` folder)",
    ),
    "tokenizer": (
        "a tokenizer folder",
        _tokenizer_missing,
        "point {key} at the model's Hugging Face folder (or one with its tokenizer files)",
    ),
    "hf_or_turbomind": (
        "a Hugging Face model folder or a TurboMind workspace",
        _hf_or_turbomind_missing,
        "point {key} at a folder with config.json, the weights and the tokenizer, or at the output "
        "of `lmdeploy convert`",
    ),
    "trtllm_engine": (
        "a built TensorRT-LLM engine folder",
        _trtllm_engine_missing,
        "point {key} at the output folder of `trtllm-build` (built with tp_size*pp_size = tp*pp), or "
        "set tp and pp to what the engine was built for",
    ),
}
# Every kind a `launcher.domains.Path` may name ("engine": the engine's hook says; "": nothing is looked for).
KINDS = tuple(FOLDERS) + ("file", "key_file", "executable", "command", "dir", "engine", "")


def _path_problem(key: str, value: str, kind: str, c) -> Tuple[Optional[Problem], bool]:
    """(a problem with `value` as `kind`, or None; whether the path is visible from this host at all)."""
    what = f"{key}={value!r}"
    if kind == "command" and "/" not in value:
        if shutil.which(value):
            return None, True
        return (
            what,
            f"no command {value!r} on this host's PATH",
            f"give {key} the program's full path, or install it",
        ), False
    p = Path(value).expanduser()
    if kind == "dir":  # made when the job starts; only a file in its place is in the way
        if p.exists() and not p.is_dir():
            return (what, "exists and is not a folder", f"give {key} a folder (it is made if missing)"), True
        return None, True
    if not p.exists():
        fix = FOLDERS[kind][2].format(key=key) if kind in FOLDERS else f"fix the path in {key}"
        return (what, "no such file or folder", fix), False
    if kind == "key_file":  # the OpenAI API's key (launcher/openai_api/auth.py): read as the API will read it
        from launcher.openai_api.auth import read_key

        try:
            read_key(str(p))
        except ValueError as e:
            return (what, str(e), f"write the key on the first line of {value}, or set {key}='' for no key"), True
        return None, True
    if kind in ("file", "executable", "command"):
        if not p.is_file():
            return (what, "not a file", f"give {key} a file's path"), True
        if kind != "file" and not os.access(p, os.X_OK):
            return (what, "not executable", f"chmod +x {value}, or give {key} another program"), True
        return None, True
    desc, missing_in, fix = FOLDERS[kind]
    if not p.is_dir():
        return (what, f"not a folder; {key} must be {desc}", fix.format(key=key)), True
    missing = missing_in(p, c)
    if missing:
        return (what, f"not {desc}: no {' and no '.join(missing)} in it", fix.format(key=key)), True
    return None, True


def host_paths(c) -> List[Tuple[str, str, str]]:
    """(key, path, kind) of every non-empty path of the config to look for: the fields whose declared
    `launcher.domains.Path` names a kind, and the paths the engine loads (`Engine.host_paths`)."""
    out: List[Tuple[str, str, str]] = []

    def walk(obj, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            d, v = domain_of(f), getattr(obj, f.name)
            if isinstance(d, Nested) and dataclasses.is_dataclass(v):
                walk(v, f"{prefix}{f.name}.")
            elif isinstance(d, PathDomain) and d.kind not in ("", "engine") and v:
                out.append((prefix + f.name, v, d.kind))

    walk(c, "")
    return out + [p for p in ENGINES[c.engine.name].host_paths(c) if p[1]]


def probe_gpus() -> Tuple[bool, str]:
    """(a GPU is visible to processes started here, what was looked at): CUDA_VISIBLE_DEVICES, the /dev/nvidia*
    device files, `nvidia-smi -L`. No torch import: a launch must not pay for it."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False, f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
    looked = []
    if glob.glob("/dev/nvidia[0-9]*"):
        return True, "/dev/nvidia*"
    looked.append("no /dev/nvidia[0-9]* device files")
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError) as e:
            out = ""
            looked.append(f"nvidia-smi -L failed ({e})")
        if any(line.startswith("GPU ") for line in out.splitlines()):
            return True, "nvidia-smi -L"
        looked.append("nvidia-smi -L listed no GPU")
    else:
        looked.append("no nvidia-smi on PATH")
    return False, "; ".join(looked)


GPU_PROBE: Callable[[], Tuple[bool, str]] = probe_gpus  # what `check` asks when given no probe


def model_shape(c) -> Optional[Tuple[Dict[str, int], str]]:
    """(the text model's shape: num_attention_heads, num_key_value_heads, num_hidden_layers, intermediate_size; where it
    was read) for the model a launch loads: model.path's config.json where this host sees it, a made model's own
    (launcher.models' Maker.shape) before it is made; None where neither is known here."""
    m = c.model
    if m.path:
        f = Path(m.path).expanduser() / "config.json"
        try:
            cfg = json.loads(f.read_text())
        except (OSError, ValueError):
            return None
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg  # a multimodal model's LM
        return text, str(f)
    if m.make in MAKERS:
        return MAKERS[m.make].shape(), f"model={m.name}"
    return None


def _tp_fits(tp: int, shape: Dict[str, int], edef) -> List[str]:
    """What `tp` does not divide in the model (empty: it fits): each rank takes an equal share of the attention heads,
    of the KV heads (or, where the engine replicates KV heads, an equal number of ranks shares each) and of the MLP."""
    heads = shape.get("num_attention_heads") or 0
    kv = shape.get("num_key_value_heads") or heads
    inter = shape.get("intermediate_size") or 0
    bad = []
    if heads and heads % tp:
        bad.append(f"its {heads} attention heads")
    if kv and kv % tp and not (edef.kv_heads_replicate and tp % kv == 0):
        bad.append(f"its {kv} KV heads" + (" (nor is tp a multiple of them)" if edef.kv_heads_replicate else ""))
    if inter and inter % tp:
        bad.append(f"its MLP's {inter} rows")
    return bad


def parallel_problems(c, edef) -> List[Problem]:
    """tp and pp against the model's shape, where this host knows it: a tp that does not split the heads evenly, or
    more pipeline stages than layers, would fail on the nodes after submission."""
    found = model_shape(c)
    if found is None:
        return []
    shape, where = found
    problems: List[Problem] = []
    bad = _tp_fits(c.tp, shape, edef) if c.tp > 1 else []
    if bad:
        heads = shape.get("num_attention_heads") or 0
        ok = [
            t
            for t in range(1, max(heads, 1) + 1)
            if not _tp_fits(t, shape, edef) and (edef.tp_any_divisor or not t & (t - 1))
        ]
        problems.append(
            (
                f"tp={c.tp}",
                f"tp does not divide {' or '.join(bad)} ({where}): every tensor-parallel rank takes an "
                f"equal share of them",
                f"use tp={', '.join(map(str, ok))} with engine={c.engine.name}",
            )
        )
    layers = shape.get("num_hidden_layers") or 0
    if layers and c.pp > layers:
        problems.append(
            (
                f"pp={c.pp}",
                f"the model has {layers} layers ({where}): every pipeline stage needs at least one",
                f"use pp={layers} or fewer",
            )
        )
    return problems


def kv_tokenizer_problem(c) -> Optional[Tuple[Problem, bool]]:
    """serve.routing=kv: the front end cuts prompts into the engines' token blocks with the model's tokenizer.json
    (the `tokenizers` library, no transformers), which a folder of tokenizer.model alone lacks.  (the problem, whether
    this host sees the folder), or None."""
    if c.serve.routing != "kv" or c.replicas <= 1:
        return None
    folder = str(c.model.tokenizer or c.model.path or "")
    if not folder or (Path(folder) / "tokenizer.json").is_file():
        return None
    return (
        (
            "serve.routing=kv",
            f"the front end tokenizes prompts with {Path(folder) / 'tokenizer.json'}, which does not exist",
            "point model.tokenizer at a folder with tokenizer.json (transformers' save_pretrained writes it), or use "
            "serve.routing=prefix",
        ),
        Path(folder).is_dir(),
    )


def check(c, probe: Optional[Callable[[], Tuple[bool, str]]] = None) -> Tuple[List[Problem], List[str]]:
    """(problems, warnings) for a typed config (launcher.schema.LaunchConfig) about to launch; `probe` answers
    whether a GPU is visible (default GPU_PROBE)."""
    problems: List[Problem] = []
    warnings: List[str] = []
    scheduler = SCHEDULERS[c.cluster.scheduler]
    everywhere = scheduler.on_this_machine or c.cluster.paths_on_host
    for key, value, kind in host_paths(c):
        problem, visible = _path_problem(key, value, kind, c)
        if problem is None:
            continue
        if visible or everywhere:
            problems.append(problem)
        else:
            warnings.append(
                f"{problem[0]}: {problem[1]} on this host; cluster={c.cluster.name}'s nodes may see it, "
                "so the launch goes on"
            )
    kv = kv_tokenizer_problem(c)
    if kv is not None:
        (problems if kv[1] or everywhere else warnings).append(
            kv[0] if kv[1] else f"{kv[0][0]}: {kv[0][1]} on this host; cluster={c.cluster.name}'s nodes may see it"
        )
    edef = ENGINES[c.engine.name]
    problems += parallel_problems(c, edef)
    if scheduler.on_this_machine and edef.needs_gpu(c.engine):
        found, looked = (probe or GPU_PROBE)()
        if not found:
            what = f"engine.device={c.engine.device!r}" if c.engine.device == "cuda" else f"engine={c.engine.name}"
            problems.append(
                (
                    what,
                    f"needs a GPU and this machine shows none ({looked})",
                    "run on a machine with an NVIDIA GPU and its driver, or use engine=hf with "
                    "engine.device=cpu (or auto)",
                )
            )
    return problems, warnings


def before_launch(cfg, say: Callable[[str], None]) -> None:
    """A composed, validated config about to launch: say each warning, raise LaunchError with every problem."""
    problems, warnings = check(typed_config(plain(cfg))[0])
    for w in warnings:
        say(f"warning: {w}")
    if problems:
        raise LaunchError(problems)


def before_dry_run(cfg) -> None:
    """A composed, validated config about to be planned, not launched: raise LaunchError with what the model's shape
    refuses (tp and pp, `parallel_problems`, the error a launch gives). The shape is model.path's config.json where
    this host has the folder (a site cluster's dry run may name a path only its nodes see: then nothing is checked)
    or a made model's own; no path, GPU or program is looked for."""
    c = typed_config(plain(cfg))[0]
    problems = parallel_problems(c, ENGINES[c.engine.name])
    if problems:
        raise LaunchError(problems)
