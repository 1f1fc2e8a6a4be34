"""The layout is the architecture: multicast/ <- launch/ <- rsar_core/, and no module imports
itself back through another (lazy imports inside functions included)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("multicast", "launch", "rsar_core")
LAYER = {"multicast": 0, "launch": 1, "rsar_core": 2}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            rel = f.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports anywhere in its text, packages' ``__init__`` left out
    where a submodule is named (``from . import x`` imports ``pkg.x``)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    got = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            got |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names} & known
            got |= subs or {mod}
    return {m for m in got if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {n: _imports(n, p, set(mods)) for n, p in mods.items()}


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m])
                                     if m in path else f"import cycle through {m}")
            if m not in state:
                visit(m, path + [m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


def test_lower_layers_never_import_higher_ones():
    wrong = [(n, m) for n, deps in _graph().items() for m in deps
             if LAYER[m.split(".")[0]] > LAYER[n.split(".")[0]]]
    assert not wrong, wrong


def test_every_package_exports_its_public_names():
    import importlib
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        assert mod.__all__, pkg
        for name in mod.__all__:
            assert getattr(mod, name) is not None, (pkg, name)
