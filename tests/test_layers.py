"""Layers that only import downward, checked on the source with ``ast``.

The layer list is written once, in ``docs/architecture.md`` (the fenced ``layers`` block): one line
a layer, top (imported by everything) to bottom, each entry a module or package under ``diffpipe``;
a module is placed by its longest listed prefix. Module-level imports form the import graph
(``if TYPE_CHECKING:`` blocks never run and are left out). The graph must have no cycle, every
module must sit in a layer, and a module imports only its own layer or the layers above it. Imports
inside functions hide cycles: none of a diffpipe module, except in the CLI shell (``LAZY_PACKAGES``,
which defers the library to the command that needs it), whose module-level imports in exchange load
none of ``HEAVY``; the graph with those function-local imports added has no cycle either. A
module over 500 lines says in its docstring why it stays one module. No tracked file cites a
document the repository does not hold. The studies, benchmarks and examples use public names only,
but for the private imports listed in ``PRIVATE_ALLOWED``, each with its reason.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "diffpipe"


def _read_layers() -> tuple[tuple[str, ...], ...]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"^```layers\n(.*?)^```", text, re.M | re.S)
    assert block, "docs/architecture.md has no ```layers block"
    return tuple(tuple(line.split()) for line in block.group(1).splitlines() if line.strip())


#: docs/architecture.md's layers, top to bottom.
LAYERS = _read_layers()
#: Packages whose modules may import diffpipe inside functions (start-up time of the command).
LAZY_PACKAGES = ("diffpipe.cli",)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The diffpipe modules an import statement in ``module`` loads (its own package first)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "diffpipe"]
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    if node.level:
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "diffpipe":
        return []
    found = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    return found if len(found) == len(node.names) else [target, *found]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(module-level imports, function-local imports) of diffpipe modules."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    top: set[str] = set()
    local: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(ast.Module(body=[sub], type_ignores=[]), in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (local if in_function else top).update(m for m in _resolve(module, child) if m != module)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return top, local


GRAPH = {m: _imports(m) for m in MODULES}


def _layer(module: str) -> int | None:
    """Index in ``LAYERS`` of ``module`` (by its longest listed prefix); None for ``diffpipe``
    itself (the public ``__init__`` re-exports everything); -1 when unlisted."""
    if module == "diffpipe":
        return None
    name = module.removeprefix("diffpipe.")
    best, where = -1, -1
    for i, entries in enumerate(LAYERS):
        for entry in entries:
            if (name == entry or name.startswith(entry + ".")) and len(entry) > best:
                best, where = len(entry), i
    return where


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if _layer(m) == -1]
    assert not missing, f"modules missing from the layers block of docs/architecture.md: {missing}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> the modules it imports), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in graph:
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles():
    found = _cycle({m: top for m, (top, _) in GRAPH.items()})
    assert found is None, "import cycle: " + " -> ".join(found or ())


def test_no_import_cycles_counting_function_local_imports():
    """The CLI's deferred imports (and any other import inside a function) must not close a cycle
    either: a cycle through a function-local import is a cycle that only shows at run time."""
    found = _cycle({m: top | local for m, (top, local) in GRAPH.items()})
    assert found is None, "import cycle through a function-local import: " + " -> ".join(found or ())


def _violations() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, (top, local) in GRAPH.items():
        here = _layer(m)
        bad = set() if m.startswith(LAZY_PACKAGES) or m == "diffpipe.__main__" else set(local)
        if here is not None:
            bad |= {n for n in top if (_layer(n) or 0) > here}
        if bad:
            out[m] = bad
    return out


def test_layers_import_only_downward_and_never_inside_functions():
    found = {m: sorted(bad) for m, bad in _violations().items()}
    assert not found, f"upward or function-local imports of diffpipe modules: {found}"


#: What the command line must not load before a command needs it: the one exception to "never
#: inside a function" (``LAZY_PACKAGES``) buys that every ``diffpipe`` command starts without them.
HEAVY = ("jax", "jaxlib", "equinox", "numpy", "matplotlib", "torch")


def _third_party(module: str) -> set[str]:
    """The packages other than diffpipe that ``module`` imports when it loads (not inside a function
    or class, not under ``TYPE_CHECKING``)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.If):
                visit(node.orelse if _is_type_checking(node) else node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(ast.parse(MODULES[module].read_text(encoding="utf-8")).body)
    return found - {"diffpipe"}


def _loads(module: str) -> set[str]:
    """Every diffpipe module that importing ``module`` runs: its module-level imports, transitively,
    and the packages above each."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in MODULES]
        todo += sorted(GRAPH[m][0])
    return seen


def test_the_cli_loads_nothing_heavy_before_a_command_needs_it():
    """The CLI's modules import the library inside their commands (``cli._plan`` the planner and
    ``viz.report``, ``cli._simulate`` the simulator, ...): in exchange, what they import at module
    level loads none of ``HEAVY``, directly or through a diffpipe module."""
    heavy = {}
    for m in MODULES:
        if m.startswith(LAZY_PACKAGES):
            found = {f"{n}: {sorted(set(HEAVY) & _third_party(n))}" for n in _loads(m) if set(HEAVY) & _third_party(n)}
            if found:
                heavy[m] = sorted(found)
    assert not heavy, f"CLI modules that load heavy packages at start-up: {heavy}"


def test_every_listed_layer_entry_exists():
    stale = [e for entries in LAYERS for e in entries
             if not any(m == f"diffpipe.{e}" or m.startswith(f"diffpipe.{e}.") for m in MODULES)]
    assert not stale, f"docs/architecture.md lists modules that do not exist: {stale}"


#: A module longer than this says why it stays one module, in its docstring: "... past 500 lines: <why>".
MAX_LINES = 500


def _silent_long_modules(modules: dict[str, Path]) -> dict[str, int]:
    """Module -> line count of every module over ``MAX_LINES`` whose docstring gives no reason."""
    out = {}
    for m, path in modules.items():
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_LINES and f"past {MAX_LINES} lines:" not in (ast.get_docstring(ast.parse(text)) or ""):
            out[m] = lines
    return out


def test_modules_past_500_lines_say_why_they_stay_one():
    silent = _silent_long_modules(MODULES)
    assert not silent, (f"modules over {MAX_LINES} lines with no 'past {MAX_LINES} lines: <why>' in their "
                        f"docstring: {silent}")


def test_the_size_check_sees_a_long_silent_module(tmp_path):
    body = "x = 1\n" * MAX_LINES
    (tmp_path / "silent.py").write_text(f'"""A long module."""\n{body}')
    why = f"Why one module past {MAX_LINES} lines: one concept."
    (tmp_path / "why.py").write_text(f'"""A long module.\n\n{why}"""\n{body}')
    (tmp_path / "short.py").write_text('"""Short."""\nx = 1\n')
    found = _silent_long_modules({p.stem: p for p in tmp_path.glob("*.py")})
    assert found == {"silent": MAX_LINES + 1}


def test_the_checker_sees_cycles_and_local_imports(tmp_path, monkeypatch):
    # The checker itself: a two-module cycle and a function-local import are found.
    pkg = tmp_path / "diffpipe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_errors.py").write_text("from ._checks import x\n")
    (pkg / "_checks.py").write_text("from ._errors import y\ndef f():\n    from . import _graph\n")
    (pkg / "_graph.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import _errors\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    modules = {_module_name(p): p for p in sorted(pkg.rglob("*.py"))}
    monkeypatch.setattr(sys.modules[__name__], "MODULES", modules)
    graph = {m: _imports(m) for m in modules}
    assert graph["diffpipe._errors"][0] == {"diffpipe._checks"}
    assert graph["diffpipe._checks"] == ({"diffpipe._errors"}, {"diffpipe._graph"})
    assert graph["diffpipe._graph"] == (set(), set())
    monkeypatch.setattr(sys.modules[__name__], "GRAPH", graph)
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycles()
    # A cycle closed only by a function-local import: invisible to the module-level scan.
    (pkg / "_errors.py").write_text("def f():\n    from . import _checks\n")
    graph = {m: _imports(m) for m in modules}
    monkeypatch.setattr(sys.modules[__name__], "GRAPH", graph)
    test_no_import_cycles()
    with pytest.raises(AssertionError, match="through a function-local import"):
        test_no_import_cycles_counting_function_local_imports()


def test_every_module_imports_in_dependency_order_in_a_fresh_interpreter():
    order: list[str] = []
    seen: set[str] = set()

    def visit(m: str) -> None:
        seen.add(m)
        for n in sorted(GRAPH[m][0]):
            if n not in seen:
                visit(n)
        order.append(m)

    for m in MODULES:
        if m not in seen:
            visit(m)
    code = "".join(f"import {m}\n" for m in order if m != "diffpipe.__main__")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=300)


def test_every_base_dependency_is_imported_by_the_package():
    """``pyproject.toml``'s base dependencies are what the package imports (``jaxlib``: JAX's backend,
    never imported by name); a library only the tests use (``chex``) belongs in the ``test`` extra."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    declared = {re.split(r"[<>=\[; ]", d, maxsplit=1)[0] for d in data["project"]["dependencies"]}
    imported: set[str] = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
    assert declared - imported == {"jaxlib"}, f"base dependencies the package never imports: {declared - imported}"


#: Documents earlier versions cited that were never in this repository: nothing may cite them.
#: (Built from their stems, so this file does not itself name them.)
ABSENT_DOCUMENTS = tuple(f"{stem}.md" for stem in ("DESIGN", "API", "REFERENCE"))
_CITED = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.md)\b")


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                           timeout=60).stdout.decode().split("\0")
    return [ROOT / n for n in names if n.endswith((".py", ".md", ".toml", ".txt", ".cfg", ".yaml", ".yml"))
            and (ROOT / n).is_file()]


def _uncited(files: list[Path], root: Path) -> dict[str, list[str]]:
    """File -> the documents it cites that this repository does not hold: one of
    ``ABSENT_DOCUMENTS``, anything under ``../shared/``, or (outside ``papers/``) a ``dir/name.md``
    whose folder is in the repository (relative to the repository or to the citing file) and whose
    file is not. A path whose folder the repository lacks (``docs/user-guide/...``) names another
    project's file; the papers cite other projects' ``docs/*.md`` by the hundred (torchtitan's
    ``docs/performance.md``), so there only the first two rules apply."""
    out: dict[str, list[str]] = {}
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        bad = [d for d in ABSENT_DOCUMENTS if re.search(rf"(?<![\w-]){re.escape(d)}", text)]
        bad += ["../shared/"] if "../shared/" in text else []
        for cited in set(_CITED.findall(text)):
            if "/" not in cited or path.relative_to(root).parts[0] == "papers":
                continue
            for base in (root, path.parent):
                if (base / cited).parent.is_dir() and not (base / cited).is_file():
                    bad.append(cited)
                    break
        if bad:
            out[str(path.relative_to(root))] = sorted(set(bad))
    return out


def test_no_file_cites_a_document_outside_the_repository():
    files = [p for p in _tracked_text_files() if p.resolve() != Path(__file__).resolve()]
    found = _uncited(files, ROOT)
    assert not found, f"files citing documents this repository does not hold: {found}"


def test_the_citation_check_sees_a_missing_document(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("# real\n")
    good = tmp_path / "good.py"
    good.write_text('"""See docs/real.md and Megatron-LM\'s docs/user-guide/features/x.md."""\n')
    bad = tmp_path / "bad.py"
    design, _, reference = ABSENT_DOCUMENTS
    bad.write_text(f'"""See {design}, docs/gone.md and ../shared/notes.txt."""\n')
    (tmp_path / "papers").mkdir()
    paper = tmp_path / "papers" / "run.py"
    paper.write_text(f'"""torchtitan\'s docs/performance.md; our {reference}."""\n')
    assert _uncited([good, bad, paper], tmp_path) == {
        "bad.py": ["../shared/", design, "docs/gone.md"], "papers/run.py": [reference]}


# -- the package's users in the repository import its public names -----------------------------------
#: The private imports the studies, benchmarks and examples may keep, ``(file, private name)``, each
#: with its one-line reason in a comment beside it in the file: everything else they use is public,
#: and a new private import (or a stale entry here) fails ``test_users_import_only_public_names``.
PRIVATE_ALLOWED = {
    # an ablation undoes one change by patching the module holding it (a preset table, a kernel
    # rule, a framework term); the ceiling fit swaps the presets' kernel models while it searches
    ("papers/published-runs/ablation.py", "diffpipe._machine._presets"),
    ("papers/published-runs/ablation.py", "diffpipe._model._kernels"),
    ("papers/published-runs/ablation.py", "diffpipe._workload._frameworks"),
    ("papers/published-runs/fit_ceilings.py", "diffpipe._machine._presets"),
    # the trace parser's per-step records (and its op reader) have no public form: research plumbing
    ("papers/validation/core_share.py", "diffpipe.calibrate._trace"),
    ("papers/validation/pair_link.py", "diffpipe.calibrate._trace"),
    ("papers/validation/replay.py", "diffpipe.calibrate._trace"),
    ("papers/validation/replay.py", "diffpipe.calibrate._trace._ops"),
    ("papers/validation/transfers.py", "diffpipe.calibrate._trace"),
    # the sweep benchmark's memory check measures the sweep's evaluator against its chunk estimate
    ("benchmarks/bench_sweep.py", "diffpipe._sweep.evaluate"),
    ("benchmarks/bench_sweep.py", "diffpipe._sweep.plan"),
    ("benchmarks/bench_sweep.py", "diffpipe._sweep.variants"),
}
#: The folders whose Python files use the package as its users do.
USER_FOLDERS = ("papers", "benchmarks", "examples")


def _private_uses(path: Path) -> set[str]:
    """The private diffpipe names ``path`` reaches: a module path or an imported name with a part
    starting ``_``, and ``alias._name`` on a name bound to something imported from diffpipe."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    private = lambda dotted: any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))  # noqa: E731
    found, bound = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "diffpipe":
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else "diffpipe"
                    if private(a.name):
                        found.add(a.name)
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "diffpipe":
            for a in node.names:
                dotted = f"{node.module}.{a.name}"
                bound[a.asname or a.name] = dotted
                if private(dotted):
                    found.add(dotted)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and private(node.attr)):
            found.add(f"{bound[node.value.id]}.{node.attr}")
    return found


def _private_imports(root: Path) -> set[tuple[str, str]]:
    return {(str(path.relative_to(root)), name) for folder in USER_FOLDERS
            for path in sorted((root / folder).rglob("*.py")) for name in _private_uses(path)}


def test_users_import_only_public_names():
    found = _private_imports(ROOT)
    assert not found - PRIVATE_ALLOWED, f"private diffpipe names used outside the package: {found - PRIVATE_ALLOWED}"
    assert not PRIVATE_ALLOWED - found, f"allowed private imports no file uses any more: {PRIVATE_ALLOWED - found}"


def test_the_private_import_check_sees_each_form(tmp_path):
    (tmp_path / "papers").mkdir()
    (tmp_path / "papers" / "study.py").write_text(
        "import diffpipe as dp\nimport diffpipe._io\nfrom diffpipe import Network, _io as io\n"
        "from diffpipe._engine._communication import transfer_order\nfrom diffpipe.calibrate import _trace\n"
        "dp._LAZY, Network._pairs, io.Staged, dp.simulate, dp.__doc__\n")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "fine.py").write_text("import diffpipe as dp\nfrom diffpipe import viz\ndp.simulate\n")
    assert _private_imports(tmp_path) == {("papers/study.py", name) for name in (
        "diffpipe._io", "diffpipe._io", "diffpipe._engine._communication.transfer_order", "diffpipe.calibrate._trace",
        "diffpipe._LAZY", "diffpipe.Network._pairs")}
