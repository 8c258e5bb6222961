"""The package import graph is the design's DAG (type-only and function-level imports included).

    api -> frontend;  engine_core -> core, worker;  worker -> core's data types only;
    core never imports worker;  trace and structured (grammars) are leaves every layer may use;  nothing in shared/ imports an engine except
    cli/, the composition root;  the engines never import each other.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "engine_v0", "engine_v1", "kernels", "compare")
# Modules at shared/'s top level that everyone may use: config, errors and typed messages.
BASE = {"shared.config", "shared.errors", "shared.messages", "shared.processes"}
# Leaves: packages that import only themselves and BASE, so any layer may use them.
LEAVES = ("shared.trace", "shared.structured")
WORKER_MAY_USE_FROM_CORE = {"shared.core.request", "shared.core.scheduler_output"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every project module this file imports, anywhere in it (TYPE_CHECKING blocks too)."""
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + int(is_pkg)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        # "from shared.x import Y" names Y, which may be a class: keep only real modules.
        graph[name] = {m for m in _imports(path, name) if m in files and m != name}
    return graph


GRAPH = _graph()


def _edges(src_prefix: str) -> list[tuple[str, str]]:
    return [(a, b) for a, deps in GRAPH.items() if _under(a, src_prefix) for b in deps]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _allowed(edges: list[tuple[str, str]], *prefixes: str, also: set[str] = frozenset()) -> list:
    return [(a, b) for a, b in edges
            if not any(_under(b, p) for p in prefixes) and b not in also and b not in BASE]


def test_graph_sees_the_tree() -> None:
    assert "shared.core.scheduler" in GRAPH["shared.engine_core"]
    assert "shared.frontend.engine_client" in GRAPH["shared.api.state"]


def test_trace_is_a_leaf() -> None:
    assert _allowed(_edges("shared.trace"), "shared.trace") == []


def test_structured_is_a_leaf() -> None:
    assert _allowed(_edges("shared.structured"), "shared.structured", "shared.trace") == []


@pytest.mark.parametrize("base", sorted(BASE))
def test_base_modules_use_only_each_other_and_trace(base: str) -> None:
    assert _allowed(_edges(base), "shared.trace") == []


def test_core_never_imports_worker_or_the_layers_above() -> None:
    assert _allowed(_edges("shared.core"), "shared.core", *LEAVES) == []


def test_worker_uses_only_cores_data_types() -> None:
    bad = _allowed(_edges("shared.worker"), "shared.worker", *LEAVES, "kernels",
                   also=WORKER_MAY_USE_FROM_CORE)
    assert bad == []


def test_frontend_knows_nothing_of_the_core_or_http() -> None:
    assert _allowed(_edges("shared.frontend"), "shared.frontend", "shared.trace") == []


def test_api_sees_only_the_frontend() -> None:
    assert _allowed(_edges("shared.api"), "shared.api", "shared.frontend", *LEAVES) == []


def test_engine_core_wires_core_and_worker() -> None:
    assert _allowed(_edges("shared.engine_core"), "shared.core", "shared.worker", *LEAVES) == []


def test_only_cli_imports_an_engine_or_the_harness() -> None:
    bad = [(a, b) for a, b in _edges("shared") if not _under(a, "shared.cli")
           and b.split(".")[0] in ("engine_v0", "engine_v1", "compare")]
    assert bad == []


def test_engines_never_import_each_other_or_the_harness() -> None:
    assert [e for e in _edges("engine_v0") if e[1].split(".")[0] in ("engine_v1", "compare")] == []
    assert [e for e in _edges("engine_v1") if e[1].split(".")[0] in ("engine_v0", "compare")] == []


def test_kernels_stand_alone() -> None:
    assert _allowed(_edges("kernels"), "kernels") == []


def test_no_import_cycles() -> None:
    """Among modules (type-only imports count: a cycle there is still a tangle to read)."""
    state: dict[str, int] = {}      # 1: on the stack, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(GRAPH[node]):
            if _is_package_of(dep, node):
                continue    # a module importing its own package's __init__ is not a cycle
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node, [])
    assert cycles == []


def _is_package_of(package: str, module: str) -> bool:
    return module.startswith(package + ".") and (ROOT / package.replace(".", "/")).is_dir()


def test_the_v1_api_process_never_imports_torch() -> None:
    """Its start-up then overlaps the core's instead of repeating its 2+ s torch import."""
    import subprocess
    import sys
    code = ("import sys, engine_v1, shared.api.server, shared.cli.main; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
