"""The layout's rules, checked over the source: no import cycle in launcher/ (imports inside functions count: a cycle
kept alive by a late import is still one), launcher/procs below everything and launcher/rank above the children it
starts, no product file over 500 lines, no function over 80 lines in
launcher/rank, and scheduler facts read from the scheduler classes instead of `cluster.scheduler` comparisons."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "launcher"
PRODUCT = ("launcher", "model_repository", "benchmark", "sbatch", "scripts")
MAX_FILE_LINES = 500
MAX_RANK_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def imported_modules(path: Path, modules: Set[str]) -> Set[str]:
    """The launcher modules `path` imports anywhere in it (functions included; `if TYPE_CHECKING:` blocks, which never
    run, left out). `from launcher.x import y` is launcher.x.y where that is a module, else launcher.x."""
    tree = ast.parse(path.read_text(), str(path))
    skip = {id(n) for node in ast.walk(tree) if _type_checking(node) for n in ast.walk(node)}
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: Set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "launcher"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if base.split(".")[0] != "launcher":
                continue
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in out if m in modules and m != me}


def import_graph() -> Dict[str, Set[str]]:
    files = [p for p in PACKAGE.rglob("*.py") if "testing/models" not in p.as_posix()]
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


def test_no_import_cycle_in_launcher():
    found = cycles(import_graph())
    assert found == [], (
        "import cycles (each a set of modules that import each other, late imports included): "
        + "; ".join(" <-> ".join(c) for c in found)
    )


def test_the_process_helpers_are_below_what_uses_them():
    """launcher/procs imports nothing of launcher/ outside itself, and the rank's children (the front end, the OpenAI
    API, launcher/triton.py) import nothing of launcher/rank, which starts them: no package loop between them."""
    graph = import_graph()
    above = {m: sorted(i for i in graph[m] if not i.startswith("launcher.procs")) for m in graph}
    assert {m: i for m, i in above.items() if m.startswith("launcher.procs") and i} == {}
    children = ("launcher.frontend", "launcher.openai_api", "launcher.triton", "launcher.procs")
    rank = {
        m: sorted(i for i in graph[m] if i.startswith("launcher.rank"))
        for m in graph
        if m.startswith(children) and any(i.startswith("launcher.rank") for i in graph[m])
    }
    assert rank == {}, f"modules that import launcher/rank, which starts them: {rank}"


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


def test_no_function_in_launcher_rank_is_over_80_lines():
    long = []
    for p in sorted((PACKAGE / "rank").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno + 1 > MAX_RANK_FUNCTION_LINES
            ):
                long.append(
                    f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
                )
    assert long == []


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
