"""The package layering (docs/design.md, Layout): each folder of ``models/`` is a layer, and the
layers are in one order. A module imports only from its own folder or from a folder of a lower
layer (two folders of the same layer do not import each other); ``models/`` holds no module
outside a layer's folder but its facade, ``models/__init__.py``; the data package imports
nothing of ``models`` above the core; no file imports another in a cycle; ``import models`` loads
no Lightning, Hydra or wandb and ``import datamodules`` nothing of ``models`` or torch.

The import graph is built with ``ast`` over ``models/``, ``datamodules/``, the top-level
scripts, ``tests/`` and ``bench/`` (imports inside functions and a lazy facade's ``_LAZY`` table
included, ``if TYPE_CHECKING:`` blocks left out)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "datamodules")
SCRIPTS = ("train", "eval", "infer", "view")  # the commands, at the repository root
# Folders of scripts that import their siblings by bare name (pytest and ``python bench/x.py``
# put the folder itself on ``sys.path``).
SCRIPT_FOLDERS = ("tests", "bench")

# The layers, lowest first: each entry is the folders of one layer. A module's folder is its
# ``models/`` sub-folder (``models.core.gaussians`` -> ``models.core``); the facade
# ``models/__init__.py`` is the folder ``models``; ``datamodules.errors`` (the one bad-input error,
# which every error of both packages derives from) is a layer of its own below everything, the
# rest of ``datamodules`` one folder.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("datamodules.errors",),  # InputError: imports nothing
    ("models.geometry",),  # cameras, rotations, Similarity, camera paths: imports nothing
    ("models.splat_formats",),  # splat files besides the INRIA .ply (NumPy)
    ("models.core",),  # Gaussians, SH, SplatModel, pixels, output folders, budgets, arguments
    ("datamodules",),  # the data package: readers, training data, tools, synthetic scenes
    ("models.render",),  # render()
    ("models.layers",),  # backbones, heads, trunks (and timm imported without wandb)
    ("models.weights",),  # timm's order: pretrained_cfg -> registry -> hub -> builder -> factory
    ("models.families",),  # one file per family or released architecture
    ("models",),  # the facade: the weights line's names, render, and every family
    ("models.pipeline",),  # the application: inference, capture, refinement, pose fit, metrics
    ("models.training",),  # LightningModule, training recipes, exporter
    ("models.view", "models.refine", "models.convert_splats"),  # the commands' folders
    ("scripts",),  # the commands at the top level: train.py, eval.py, infer.py, view.py
    ("tests", "bench"),  # what exercises everything
)
RANK = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}

# Edges that are deliberate, each with its reason. Each must still exist (a stale entry fails),
# so the list cannot grow silently: remove an entry when its import goes.
ALLOWED: dict[tuple[str, str], str] = {}


def folder(module: str) -> str | None:
    """The layer folder of a module (see LAYERS), None when it is in none."""
    parts = module.split(".")
    if parts[0] == "models":
        name = "models" if len(parts) == 1 else f"models.{parts[1]}"
    elif parts[0] == "datamodules":
        name = "datamodules.errors" if module == "datamodules.errors" else "datamodules"
    elif module in SCRIPTS:
        name = "scripts"  # the repository's root folder
    else:
        name = parts[0]
    return name if name in RANK else None


def rank(module: str) -> int | None:
    name = folder(module)
    return None if name is None else RANK[name]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for child in node.body:
                skipped |= {id(n) for n in ast.walk(child)}
    return skipped


def build_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    """{module: {imported project module: line}}, {module: file}."""
    files: dict[str, Path] = {}
    for package in PACKAGES + SCRIPT_FOLDERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            files[_module_name(path)] = path
    for script in SCRIPTS:
        files[script] = ROOT / f"{script}.py"
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _type_checking_nodes(tree)
        is_package = path.name == "__init__.py"
        folder = name.split(".")[0] if name.split(".")[0] in SCRIPT_FOLDERS else None
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    targets.append(sub if sub in files else module)
            for target in targets:
                if folder and f"{folder}.{target}" in files:  # a sibling, by bare name
                    target = f"{folder}.{target}"
                # the deepest project module the dotted name names
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        for target, line in _lazy_targets(tree, name if is_package else name.rpartition(".")[0]):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph, files


def _lazy_targets(tree: ast.Module, package: str) -> list[tuple[str, int]]:
    """The modules a lazy facade imports on first access: the values of its module-level
    ``_LAZY = {attribute: "relative.module"}`` table (``datamodules/__init__.py`` loads them in its
    ``__getattr__`` with ``importlib``, which the ``import`` statements above do not show)."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["_LAZY"]
            and isinstance(node.value, ast.Dict)
        ):
            return [(f"{package}.{ast.literal_eval(v)}", v.lineno) for v in node.value.values]
    return []


@pytest.fixture(scope="module")
def graph():
    return build_graph()


def test_graph_covers_scripts_tests_and_bench(graph) -> None:
    edges, _ = graph
    assert {"train", "infer", "tests.test_layering", "bench.common"} <= set(edges)
    assert any(folder(t) == "models.pipeline" for t in edges["infer"])  # infer.py runs it
    assert "tests.test_infer" in edges["tests.test_bad_inputs"]  # a sibling, by bare name
    assert "view" in edges["tests.test_viewer"]
    assert "datamodules.training.datamodule" in edges["datamodules"]  # lazily, by _LAZY


def test_every_module_has_a_layer(graph) -> None:
    edges, files = graph
    unranked = sorted(str(files[m].relative_to(ROOT)) for m in edges if rank(m) is None)
    assert not unranked, (
        f"modules in no layer's folder (move them into one, see LAYERS): {unranked}"
    )


def test_models_holds_folders_and_its_facade_only() -> None:
    """The layers are the folders: no module of ``models/`` beside them but ``__init__.py``, and
    every folder of ``models/`` that holds Python is a layer's."""
    loose = sorted(p.name for p in (ROOT / "models").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules loose in models/ (move them into a layer's folder): {loose}"
    folders = sorted(
        p.name
        for p in (ROOT / "models").iterdir()
        if p.is_dir() and any(p.rglob("*.py")) and f"models.{p.name}" not in RANK
    )
    assert not folders, f"folders of models/ in no layer (add them to LAYERS): {folders}"


def test_allowed_exceptions_still_exist(graph) -> None:
    edges, _ = graph
    stale = [edge for edge in ALLOWED if edge[1] not in edges.get(edge[0], {})]
    assert not stale, f"allowed imports that no longer exist (remove them from ALLOWED): {stale}"


def forbidden_imports(edges: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """``(module, target, line)`` of every import of a higher layer's folder, or of another
    folder of the same layer."""
    bad = []
    for module, targets in sorted(edges.items()):
        for target, line in sorted(targets.items()):
            if (module, target) in ALLOWED:
                continue
            low, high = rank(module), rank(target)
            if low is None or high is None:
                continue
            if high > low or (high == low and folder(target) != folder(module)):
                bad.append((module, target, line))
    return bad


def test_forbidden_imports_are_reported() -> None:
    edges = {
        "models.render.core": {"models.pipeline.inference": 3, "models.geometry.cameras": 4},
        "models.view.live": {"models.refine.cli": 5, "models.view.server": 6},
        "datamodules.tools.sfm": {"models.weights.registry": 7, "models.core.pixels": 8},
    }
    assert forbidden_imports(edges) == [
        ("datamodules.tools.sfm", "models.weights.registry", 7),
        ("models.render.core", "models.pipeline.inference", 3),
        ("models.view.live", "models.refine.cli", 5),  # same layer, another folder
    ]
    assert forbidden_imports({"models.pipeline.inference": {"models.render.core": 1}}) == []
    assert folder("models.core.gaussians") == "models.core"
    assert folder("models") == "models" and folder("datamodules") == "datamodules"
    assert folder("models.loose_module") is None
    assert folder("infer") == folder("view") == "scripts"


def test_no_import_of_a_higher_layer(graph) -> None:
    edges, files = graph
    bad = [
        f"{files[module].relative_to(ROOT)}:{line}: {module} ({folder(module)}, layer "
        f"{rank(module)}) imports {target} ({folder(target)}, layer {rank(target)})"
        for module, target, line in forbidden_imports(edges)
    ]
    assert not bad, "imports of a higher layer or of a folder beside it:\n" + "\n".join(bad)


# What the data package may import of ``models``: the folders up to the core (geometry, the
# splat formats, the core's types and the plumbing every command shares), never the registry,
# the families, the weights or the application (pipeline, training, the commands' folders).
DATA_PACKAGE_MAY_IMPORT = tuple(
    name
    for layer in LAYERS[: RANK["models.core"] + 1]
    for name in layer
    if name.split(".")[0] == "models"
)


def data_package_violations(edges: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """``(module, target, line)`` of every import from ``datamodules`` of a ``models`` module
    outside :data:`DATA_PACKAGE_MAY_IMPORT` (imports inside functions included)."""
    bad = []
    for module, targets in sorted(edges.items()):
        if module.split(".")[0] != "datamodules":
            continue
        for target, line in sorted(targets.items()):
            allowed = any(
                target == ok or target.startswith(f"{ok}.") for ok in DATA_PACKAGE_MAY_IMPORT
            )
            if target.split(".")[0] == "models" and not allowed:
                bad.append((module, target, line))
    return bad


def test_data_package_rule_is_checked() -> None:
    edges = {
        "datamodules.tools.sfm": {"models.weights.registry": 7, "models.geometry.cameras": 3},
        "datamodules.readers.colmap": {"models.pipeline.settings": 2, "models": 1},
        "models.pipeline.capture.inputs": {"models.weights.registry": 5},
    }
    assert DATA_PACKAGE_MAY_IMPORT == ("models.geometry", "models.splat_formats", "models.core")
    assert data_package_violations(edges) == [
        ("datamodules.readers.colmap", "models", 1),
        ("datamodules.readers.colmap", "models.pipeline.settings", 2),
        ("datamodules.tools.sfm", "models.weights.registry", 7),
    ]


def test_data_package_imports_nothing_above_it(graph) -> None:
    """``datamodules/`` imports nothing from the model registry, the families, the weights or
    the application: only :data:`DATA_PACKAGE_MAY_IMPORT` (the ast scan includes imports inside
    functions)."""
    edges, files = graph
    bad = [
        f"{files[module].relative_to(ROOT)}:{line}: {module} imports {target}"
        for module, target, line in data_package_violations(edges)
    ]
    assert not bad, "the data package imports above itself:\n" + "\n".join(bad)


def find_cycle(edges: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_reports_a_cycle() -> None:
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) is None


def test_no_import_cycle_between_files(graph) -> None:
    edges, files = graph
    pruned = {
        module: {t: line for t, line in targets.items() if (module, t) not in ALLOWED}
        for module, targets in edges.items()
    }
    cycle = find_cycle(pruned)
    if cycle:
        steps = [
            f"{files[a].relative_to(ROOT)}:{pruned[a][b]} imports {b}"
            for a, b in zip(cycle, cycle[1:])
        ]
        pytest.fail("import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(steps))


# Project imports sit at their module's top, so the graph above is the real one. Laziness is
# kept only for heavy optional third-party packages, inside the modules that wrap them:
# lightning, hydra and wandb (training: models/training/, datamodules/training/, train.py,
# eval.py), pycolmap (structure-from-motion: datamodules/tools/sfm_result.py, its child process),
# viser (the browser viewer), gsplat (models/render/gsplat_backend.py), torchmetrics and
# matplotlib (models/pipeline/metrics.py, models/pipeline/refine/report.py); the compiled CPU rasteriser
# (models/render/cpu.py) is built on its first call, not on import. A project import that must
# stay inside a function is listed here with its reason (none today).
LAZY_PROJECT_IMPORTS: dict[tuple[str, str], str] = {}
HEAVY_OPTIONAL = ("lightning", "hydra", "wandb", "pycolmap", "viser", "gsplat", "torchmetrics")


def imports_inside_functions(files: dict[str, Path]) -> list[tuple[str, str, int]]:
    """``(module, imported project module, line)`` of every project import inside a function."""
    found = []
    for name, path in sorted(files.items()):
        if name.split(".")[0] in SCRIPT_FOLDERS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom):
                    targets = ["." * node.level + (node.module or "")]
                elif isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                else:
                    continue
                for target in targets:
                    top = target.split(".")[0]
                    if target.startswith(".") or top in PACKAGES or top in SCRIPTS:
                        found.append((name, target, node.lineno))
    return sorted(set(found))


def test_project_imports_are_at_module_top(graph) -> None:
    _, files = graph
    inside = imports_inside_functions(files)
    bad = [
        f"{files[module].relative_to(ROOT)}:{line}: imports {target} inside a function"
        for module, target, line in inside
        if (module, target) not in LAZY_PROJECT_IMPORTS
    ]
    assert not bad, "project imports belong at the module top:\n" + "\n".join(bad)
    stale = [edge for edge in LAZY_PROJECT_IMPORTS if edge not in {(m, t) for m, t, _ in inside}]
    assert not stale, f"LAZY_PROJECT_IMPORTS entries that no longer exist: {stale}"


def test_the_application_loads_no_heavy_optional_package() -> None:
    """``import models``, every module of the application (``models.pipeline``), the viewer's
    module and the data tools import none of the heavy optional packages (Lightning, Hydra, wandb,
    pycolmap, viser, gsplat, torchmetrics) until a function needs them (timm would import wandb
    when installed: ``models`` imports timm with it hidden), and wandb still imports afterwards.
    One process for all of them: each start costs seconds of imports."""
    pipeline = ROOT / "models" / "pipeline"
    modules = ["models", "models.view.server", "datamodules.tools.convert", "datamodules.tools.sfm"]
    modules += [
        _module_name(path) for path in sorted(pipeline.rglob("*.py")) if path.name != "__main__.py"
    ]
    heavy = (*HEAVY_OPTIONAL, "pytorch_lightning")
    code = (
        "import sys\n" + "".join(f"import {m}\n" for m in modules) + f"heavy = {heavy!r}\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in heavy})\n"
        "assert not loaded, loaded\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('wandb') is not None:\n"
        "    import wandb\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok")


def test_import_datamodules_loads_no_models() -> None:
    """``import datamodules`` (and its error class, which every ``models`` error derives from)
    loads nothing of ``models``, whose package initialiser imports every family, nor torch: the
    data package's facade imports its readers on first use."""
    code = (
        "import sys\n"
        "import datamodules\n"
        "from datamodules import InputError\n"
        "from datamodules.errors import InputError as same\n"
        "assert InputError is same and issubclass(InputError, ValueError)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('models', 'torch'))\n"
        "assert not loaded, loaded\n"
        "from datamodules import load_index\n"
        "assert 'datamodules.readers.chunks' in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok")
