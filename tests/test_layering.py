"""The package layering (docs/design.md, Layout): the project's import graph, built with ``ast`` over
``models/``, ``datamodules/``, the top-level scripts, ``tests/`` and ``bench/`` (imports inside
functions and a lazy facade's ``_LAZY`` table included, ``if TYPE_CHECKING:`` blocks left out),
has no cycle between files and no import from a lower layer to a higher one; ``import models``
loads no Lightning, Hydra or wandb."""

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

# Layer ranks, lowest first: a module may import modules of its own rank or lower. The longest
# matching prefix decides. geometry -> gaussians/sh -> render -> layers -> families ->
# weights/factory/registry -> metrics/inference -> training, with timm's placement of the
# registration modules: the weights line pretrained_cfg -> registry -> hub -> builder sits below
# the families (every family module registers itself with them and finishes its
# checkpoint_filter_fn with the builder's check, as timm's _registry/_pretrained/_hub/_builder),
# the factory (create_model, load_model) and the release converter above them. Fractional ranks
# order that line inside layer 5.
RANKS: dict[str, float] = {
    # utilities every layer may use (no project imports of their own above rank 0); the one
    # bad-input error class sits at the bottom of the data package, which never imports models
    "datamodules.errors": 0,
    "models.layers._timm_import": 0,
    "models.core.output_folder": 0,
    "models.core.command_line": 0,
    "models.core.budget": 0,
    "models.core.pixels": 0,  # 8-bit pixels <-> float images (no project imports)  # time/memory estimates of big work (imports only datamodules.errors)
    "models.geometry": 1,
    "models.splat_formats": 1,  # splat file formats (NumPy; imports only datamodules.errors)
    "models.core.gaussians": 2,
    "models.core.sh": 2,
    "models.render": 3,
    # the facade (its __init__): it imports errors only, the rest on first access (its _LAZY
    # table counts as imports), up to the training data
    "datamodules": 9,
    "datamodules.readers": 3,
    "datamodules.transforms": 3,  # image resizing shared by the readers and the training data
    "models.layers": 4,
    "models.core.base": 5,  # SplatModel, ModelOutput: what every family subclasses / returns
    "models.weights.knobs": 5.5,  # inference-knob declarations the families make (reads the registry)
    "models.weights": 5.1,  # the package (a docstring)
    "models.weights.pretrained_cfg": 5.1,  # PretrainedCfg, the architecture.tag tables
    "models.weights.registry": 5.2,  # entry points, families, list_models
    "models.weights.hub": 5.3,  # locations, downloads, sha256, files
    "models.weights.publish": 5.3,  # model cards, the upload to the Hub, ExportError
    "models.weights.builder": 5.4,  # build from recorded arguments, filter fns, strict load
    "models.weights.input_recipe": 0,  # a dataclass the pretrained configs hold
    "models.families": 6,
    "models.weights.factory": 7,
    "models.weights.convert": 7,  # python -m models.weights.convert (release files)
    "models": 7,  # the facade (its __init__) re-exports the factory
    "models.pipeline.metrics": 8,
    "models.pipeline.reconstruction": 8,  # the result types inference's stages share
    "models.pipeline.inference_inputs": 8,  # device, knobs, model, recipe, context batch
    "models.pipeline.inference_outputs": 8,  # the output folder of a reconstruction
    "models.pipeline.inference": 8,
    "models.refine": 8,  # per-scene refinement (application layer, beside inference)
    "models.convert_splats": 8,  # python -m models.convert_splats (splat file formats)
    "models.pipeline.pose_fit": 8,
    "models.view.server": 8,
    "models.pipeline.capture": 9,  # a user's capture: inputs (SfM, readers) for inference
    # the application layer: typed settings, the refinement's checks, infer.py's stages
    "models.pipeline": 9.5,
    "models.refine.cli": 9.6,  # python -m models.refine: a client of the pipeline's checks
    "models.refine.__main__": 9.6,
    "datamodules.synthetic": 6,  # the scene generator (python -m datamodules.synthetic)
    "datamodules.synthetic_scenes": 3,  # its scenes (textures, primitives, camera paths)
    "datamodules.synthetic_render": 3,  # its analytic ray casting
    "datamodules.tools": 3,  # convert uses sfm; the registry's hints come from the callers
    "datamodules.training": 9,
    "models.training": 10,
    # the commands, then what exercises everything (nothing in models/ or datamodules/ imports
    # them)
    "train": 11,
    "eval": 11,
    "infer": 11,
    "view": 11,
    "tests": 12,
    "bench": 12,
}

# Edges that are deliberate, each with its reason. Each must still exist (a stale entry fails),
# so the list cannot grow silently: remove an entry when its import goes.
ALLOWED: dict[tuple[str, str], str] = {}


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


# Package facades: their rank is their own (not a default for the modules inside them).
FACADES = ("models", "datamodules")


def rank(module: str) -> int | None:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if i == 1 and len(parts) > 1 and parts[0] in FACADES:
            break
        prefix = ".".join(parts[:i])
        if prefix in RANKS:
            return RANKS[prefix]
    return None


@pytest.fixture(scope="module")
def graph():
    return build_graph()


def test_graph_covers_scripts_tests_and_bench(graph) -> None:
    edges, _ = graph
    assert {"train", "infer", "tests.test_layering", "bench.common"} <= set(edges)
    assert "models.pipeline.run" in edges["infer"]  # infer.py runs the pipeline
    assert "models.pipeline.inference" in edges["models.pipeline.run"]
    assert "tests.test_infer" in edges["tests.test_bad_inputs"]  # a sibling, by bare name
    assert "view" in edges["tests.test_viewer"]
    assert "datamodules.training.datamodule" in edges["datamodules"]  # lazily, by _LAZY


def test_every_module_has_a_layer(graph) -> None:
    edges, _ = graph
    unranked = sorted(m for m in edges if rank(m) is None)
    assert not unranked, f"modules without a layer (add them to RANKS): {unranked}"


def test_allowed_exceptions_still_exist(graph) -> None:
    edges, _ = graph
    stale = [edge for edge in ALLOWED if edge[1] not in edges.get(edge[0], {})]
    assert not stale, f"allowed imports that no longer exist (remove them from ALLOWED): {stale}"


def upward_imports(edges: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """``(module, target, line)`` of every import from a lower layer to a higher one."""
    bad = []
    for module, targets in sorted(edges.items()):
        for target, line in sorted(targets.items()):
            if (module, target) in ALLOWED:
                continue
            low, high = rank(module), rank(target)
            if low is not None and high is not None and high > low:
                bad.append((module, target, line))
    return bad


def test_upward_imports_are_reported() -> None:
    edges = {"models.render.core": {"models.pipeline.inference": 3, "models.geometry.cameras": 4}}
    assert upward_imports(edges) == [("models.render.core", "models.pipeline.inference", 3)]
    assert upward_imports({"models.pipeline.inference": {"models.render.core": 1}}) == []


def test_no_import_from_a_lower_layer_to_a_higher_one(graph) -> None:
    edges, files = graph
    bad = [
        f"{files[module].relative_to(ROOT)}:{line}: {module} (layer {rank(module)}) imports "
        f"{target} (layer {rank(target)})"
        for module, target, line in upward_imports(edges)
    ]
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


# What the data package may import of ``models``: the layers below the networks (geometry and
# the plumbing every command shares), never the registry, the families, the weights or the
# application (pipeline, inference, capture, refine, training).
DATA_PACKAGE_MAY_IMPORT = (
    "models.geometry",
    "models.core.pixels",
    "models.core.budget",
    "models.core.output_folder",
    "models.core.command_line",
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
    """The inference path, the viewer's module and the data tools import none of the heavy
    optional packages until a function needs them."""
    modules = (
        "models",
        "models.pipeline.run",
        "models.view.server",
        "datamodules.tools.convert",
        "datamodules.tools.sfm",
    )
    code = (
        "import sys\n" + "".join(f"import {m}\n" for m in modules) + f"heavy = {HEAVY_OPTIONAL!r}\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in heavy})\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok")


def test_import_models_loads_no_training_stack() -> None:
    """``import models`` (and ``models.pipeline.inference`` where it exists) loads no Lightning, Hydra or
    wandb (timm would import wandb when installed: ``models`` imports timm with it hidden), and
    wandb still imports afterwards."""
    modules = ["models"] + (
        ["models.pipeline.inference"] if (ROOT / "models" / "inference.py").exists() else []
    )
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "heavy = ('lightning', 'pytorch_lightning', 'hydra', 'wandb')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
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
