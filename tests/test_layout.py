"""The house (README "Layout"): the core library never imports the command line or the measurement machinery, not
even inside a function; no package imports itself in a cycle; no library file reads the pipeline's variants sheet."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPPER = ("swiftkv.cli", "swiftkv.bench")  # rooms above the core
OUTSIDE_CORE = (*UPPER, "swiftkv.vllm_plugin")


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in (ROOT / package).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, known: dict[str, Path], module_level: bool) -> set[str]:
    """The known modules ``path`` imports (module level only, or anywhere in the file)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body if module_level else ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in known}


def test_the_core_never_imports_the_command_line_or_the_measurement_code():
    mods = _modules("swiftkv")
    arrows = {m: sorted(x for x in _imports(p, mods, module_level=False) if x.startswith(UPPER))
              for m, p in mods.items() if m != "swiftkv" and not m.startswith(OUTSIDE_CORE)}
    assert not {m: up for m, up in arrows.items() if up}
    assert len(arrows) > 30  # the walk saw the core


def test_no_import_cycle_at_module_level():
    mods = {**_modules("swiftkv"), **_modules("analysis")}
    graph = {m: _imports(p, mods, module_level=True) - {m} for m, p in mods.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if n in m.split(".")[:-1] or m.startswith(n + "."):  # a module importing its own package (re-exports)
                continue
            assert state.get(n) != 1, "import cycle: " + " -> ".join([*path, m, n])
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_no_library_file_knows_the_pipelines_variants_sheet():
    """No string of the library (docstrings aside) names config/variants.tsv: the workflow reads the sheet and passes
    typed options; only the command line offers it as a default to a user in a checkout."""
    for path in (ROOT / "swiftkv").rglob("*.py"):
        if "swiftkv/cli/" in path.as_posix():
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        strings = [n.value for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]
        assert not [s for s in strings if "variants.tsv" in s], path


def test_the_package_root_is_a_handful_of_modules_beside_packages_grouped_by_what_they_do():
    root = sorted(p.name for p in (ROOT / "swiftkv").glob("*.py"))
    assert len(root) <= 8, root
    packages = {p.name for p in (ROOT / "swiftkv").iterdir() if (p / "__init__.py").is_file()}
    assert packages >= {"models", "data", "measure", "distill", "cli", "bench", "vllm_plugin"}, packages


def test_no_file_is_over_400_lines_and_no_distill_function_over_80():
    """Issue 33's sizes: a file of swiftkv/ or analysis/ fits in ~400 lines (the model mixins, swiftkv/models/common.py,
    stay one file), a function of swiftkv/distill/ in ~80."""
    files = [*(ROOT / "swiftkv").rglob("*.py"), *(ROOT / "analysis").rglob("*.py")]
    long = {p.relative_to(ROOT).as_posix(): n for p in files
            if (n := len(p.read_text().splitlines())) > 410 and p != ROOT / "swiftkv" / "models" / "common.py"}
    assert not long, long
    functions = {}
    for path in (ROOT / "swiftkv" / "distill").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                functions[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert not functions, functions
