"""The layout's rules, checked over the source: launcher/'s packages in layers that import only downwards, no import
cycle in launcher/ or benchmark/ (imports inside functions and under `if TYPE_CHECKING:` count: a cycle kept alive by
a late import or a type hint is still one), no product file over 500 lines, no function over 80 lines in launcher/,
and scheduler facts read from the scheduler classes instead of `cluster.scheduler` comparisons."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "launcher"
BENCHMARK = ROOT / "benchmark"
PRODUCT = ("launcher", "model_repository", "benchmark", "sbatch", "scripts")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, modules: Set[str]) -> Set[str]:
    """The modules of `modules` that `path` imports anywhere in it (functions and `if TYPE_CHECKING:` blocks included).
    `from pkg.x import y` is pkg.x.y where that is a module, else pkg.x."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in out if m in modules and m != me}


def import_graph(top: Path = PACKAGE) -> Dict[str, Set[str]]:
    """module -> the modules of the same top package it imports (launcher's fixture models, run by Triton alone,
    left out)."""
    files = [p for p in top.rglob("*.py") if "testing/models" not in p.as_posix()]
    modules = {module_name(p) for p in files}
    return {module_name(p): imported_modules(p, modules) for p in files}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_finds_a_cycle_where_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_launcher_or_benchmark():
    for top in (PACKAGE, BENCHMARK):
        found = cycles(import_graph(top))
        assert found == [], (
            f"import cycles in {top.name}/ (each a set of modules that import each other, late imports and type "
            "hints included): " + "; ".join(" <-> ".join(c) for c in found)
        )


# launcher/'s layers, lowest first: a module may import its own layer's and lower layers' modules only. A unit is a
# top-level module or package of launcher/ (launcher.frontend, launcher.rundir), the engines' packages split by what
# runs where (ENGINE_RUNTIME).
LAYERS = {
    # what every process may use: errors, paths, ports, log text, the request contract, the typed hand-offs between
    # processes and the shared process helpers
    "base": (
        "launcher",
        "errors",
        "paths",
        "ports",
        "logtext",
        "stage",
        "contract",
        "error_kinds",
        "readiness",
        "kv_events",
        "jobindex",
        "handoff",
        "procs",
    ),
    # from a command line to a validated spec and the text of what would run: pure
    "plan": (
        "domains",
        "schema",
        "spec",
        "pbtxt",
        "engines",
        "models",
        "tiny",
        "render",
        "replay",
        "suggest",
        "compose",
        "validate",
        "scale_signals",
    ),
    # the processes that serve and measure: they get their config as data and import nothing that launches
    "serve": ("python_backend", "hf", "engine runtime", "frontend", "openai_api", "client", "bench"),
    # starting, following and stopping jobs on this machine or Slurm, and what a launch records
    "launch": (
        "rundir",
        "record",
        "triton",
        "triton_install",
        "hostcheck",
        "schedulers",
        "localslurm",
        "logs",
        "triage",
        "sweep",
        "service",
        "plan",
        "cli",
        "testing",
    ),
    # one rank of a job: starts its server and, on rank 0, the serving processes
    "rank": ("rank",),
}
# The engines' code that Triton's python backend runs (their model modules and what those import of their own):
# it serves, while each engine package's Engine and Config are part of the plan.
ENGINE_RUNTIME = re.compile(r"launcher\.engines\.\w+\.(model|core|core_process|streams|models(\.\w+)?)$")


def unit_of(module: str) -> str:
    if ENGINE_RUNTIME.match(module):
        return "engine runtime"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(module: str) -> Optional[int]:
    unit = unit_of(module)
    return next((i for i, units in enumerate(LAYERS.values()) if unit in units), None)


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    """Each import of a module in a higher layer than the importer's, as 'importer (layer) -> imported (layer)'."""
    names = list(LAYERS)
    return sorted(
        f"{m} ({names[layer_of(m)]}) -> {d} ({names[layer_of(d)]})"
        for m, deps in graph.items()
        for d in deps
        if layer_of(d) > layer_of(m)
    )


def test_every_unit_of_launcher_has_a_layer():
    missing = sorted({unit_of(m) for m in import_graph() if layer_of(m) is None})
    assert missing == [], f"give these units of launcher/ a layer in LAYERS: {missing}"


def test_the_layer_check_finds_an_upward_import():
    assert upward_imports({"launcher.frontend.server": {"launcher.rank.rank"}}) == [
        "launcher.frontend.server (serve) -> launcher.rank.rank (rank)"
    ]
    assert upward_imports({"launcher.rank.rank": {"launcher.frontend.server"}}) == []
    assert layer_of("launcher.engines.vllm.model") == layer_of("launcher.frontend") != layer_of("launcher.engines.vllm")


def test_launcher_imports_only_downwards_through_its_layers():
    found = upward_imports(import_graph())
    assert found == [], (
        "imports that reach up a layer (tests/unit/test_structure.py LAYERS says which unit is where; move the code "
        "both need down, or hand the lower one data): " + "; ".join(found)
    )


def product_files() -> List[Path]:
    return sorted(
        p
        for top in PRODUCT
        for p in (ROOT / top).rglob("*")
        if p.is_file() and p.suffix in (".py", ".sh", ".sub") and "__pycache__" not in p.parts
    )


def test_no_product_file_is_over_500_lines():
    long = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in product_files()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert long == [], f"files over {MAX_FILE_LINES} lines (split them where their parts do different jobs): {long}"


def test_no_function_in_launcher_is_over_80_lines():
    long = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
            ):
                long.append(
                    f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
                )
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines (split them by what their parts do): {long}"


def test_scheduler_facts_come_from_the_scheduler_classes():
    """`cluster.scheduler == "slurm"` and the like appear nowhere: each fact is a class attribute of the scheduler
    (launcher/schedulers/base.py) that the registry (launcher/schedulers/registry.py) names."""
    compare = re.compile(
        r"""scheduler\s*(==|!=)\s*["']|["'](local|slurm|allocation)["']\s*(==|!=)\s*\w*\.?scheduler\b"""
    )
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for top in ("launcher", "model_repository")
        for p in sorted((ROOT / top).rglob("*.py"))
        if p.name != "registry.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if compare.search(line)
    ]
    assert found == []
