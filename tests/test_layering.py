"""The package layering (DESIGN.md, Layout; issue 16): the project's import graph, built with
``ast`` over ``models/`` and ``datamodules/`` (imports inside functions included, ``if
TYPE_CHECKING:`` blocks and alias modules left out), has no cycle between files and no import
from a lower layer to a higher one; ``import models`` loads no Lightning, Hydra or wandb."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "datamodules")

# Layer ranks, lowest first: a module may import modules of its own rank or lower. The longest
# matching prefix decides. geometry -> gaussians/sh -> render -> layers -> families ->
# weights/factory/registry -> metrics/inference -> training, with timm's placement of the
# registration modules: the registry, the pretrained configs and the weights I/O sit below the
# families (every family module registers itself with them, as timm's _registry/_pretrained),
# the factory (create_model, load_model) above them.
RANKS: dict[str, int] = {
    # utilities every layer may use (no project imports of their own above rank 0)
    "models._timm_import": 0,
    "models.errors": 0,
    "models.output_folder": 0,
    "models.command_line": 0,
    "datamodules.errors": 0,
    "models.geometry": 1,
    "models.gaussians": 2,
    "models.sh": 2,
    "models.render": 3,
    "datamodules": 3,  # the facade (its __init__) imports readers only (the rest lazily)
    "datamodules.readers": 3,
    "datamodules.transforms": 3,  # image resizing shared by the readers and the training data
    "models.layers": 4,
    "models.base": 5,  # SplatModel, ModelOutput: what every family subclasses / returns
    "models.knobs": 5,  # inference-knob declarations the families make
    "models.registry": 5,
    "models.weights": 5,
    "models.input_recipe": 0,  # a dataclass the pretrained configs hold
    "models.families": 6,
    "models.factory": 7,
    "models": 7,  # the facade (its __init__) re-exports the factory
    "models.metrics": 8,
    "models.inference": 8,
    "models.refine": 8,  # per-scene refinement (application layer, beside inference)
    "models.pose_refinement": 8,
    "models.viewer": 8,
    "models.capture": 9,  # a user's capture: inputs (SfM, readers) for inference
    "datamodules.synthetic": 6,  # the scene generator (python -m datamodules.synthetic)
    "datamodules.tools": 6,  # sfm asks the registry for pose-free models; convert uses sfm
    "datamodules.training": 9,
    "models.training": 10,
}

# Edges that are deliberate, each with its reason. Each must still exist (a stale entry fails),
# so the list cannot grow silently: remove an entry when its import goes.
ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_alias(tree: ast.Module, text: str) -> bool:
    """An old import path kept for one release: it replaces itself in ``sys.modules``."""
    if "# relayout: alias" in text:
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and ast.unparse(target.value) == "sys.modules"
                    and ast.unparse(target.slice) == "__name__"
                ):
                    return True
    return False


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


def _getattr_nodes(tree: ast.Module) -> set[int]:
    """Imports inside a module-level ``__getattr__``: lazy re-exports of old names."""
    skipped: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            skipped |= {id(n) for n in ast.walk(node)}
    return skipped


def build_graph() -> tuple[dict[str, dict[str, int]], set[str], dict[str, Path]]:
    """{module: {imported project module: line}}, the alias modules, {module: file}."""
    files: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            files[_module_name(path)] = path
    graph: dict[str, dict[str, int]] = {}
    aliases: set[str] = set()
    for name, path in files.items():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        if _is_alias(tree, text):
            aliases.add(name)
            continue
        skip = _type_checking_nodes(tree) | _getattr_nodes(tree)
        is_package = path.name == "__init__.py"
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
                # the deepest project module the dotted name names
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph, aliases, files


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


def test_every_module_has_a_layer(graph) -> None:
    edges, aliases, _ = graph
    unranked = sorted(m for m in edges if rank(m) is None)
    assert not unranked, f"modules without a layer (add them to RANKS): {unranked}"


def test_allowed_exceptions_still_exist(graph) -> None:
    edges, _, _ = graph
    stale = [edge for edge in ALLOWED if edge[1] not in edges.get(edge[0], {})]
    assert not stale, f"allowed imports that no longer exist (remove them from ALLOWED): {stale}"


def test_no_import_through_an_old_path(graph) -> None:
    edges, aliases, files = graph
    bad = [
        f"{files[m].relative_to(ROOT)}:{line} imports {target} (an old path)"
        for m, targets in edges.items()
        for target, line in targets.items()
        if target in aliases
    ]
    assert not bad, "\n".join(bad)


def test_no_import_from_a_lower_layer_to_a_higher_one(graph) -> None:
    edges, aliases, files = graph
    bad = []
    for module, targets in sorted(edges.items()):
        for target, line in sorted(targets.items()):
            if target in aliases or (module, target) in ALLOWED:
                continue
            low, high = rank(module), rank(target)
            if low is not None and high is not None and high > low:
                bad.append(
                    f"{files[module].relative_to(ROOT)}:{line}: {module} (layer {low}) imports "
                    f"{target} (layer {high})"
                )
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


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
    edges, aliases, files = graph
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


def test_import_models_loads_no_training_stack() -> None:
    """``import models`` (and ``models.inference`` where it exists) loads no Lightning, Hydra or
    wandb (timm would import wandb when installed: ``models`` imports timm with it hidden), and
    wandb still imports afterwards."""
    modules = ["models"] + (
        ["models.inference"] if (ROOT / "models" / "inference.py").exists() else []
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
