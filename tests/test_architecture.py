"""The package's shape: layers that import only downward, a runtime that imports nothing outside itself, no import
cycle (static or through ``importlib``), and experiment code off the compress / save / load path."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_tensorcompress"
NAME = PACKAGE.name
#: The layers, bottom up: a module may import its own layer and those below, never one above. ``runtime`` is what
#: checkpoints ship; ``core`` what every method uses (and the package's plumbing); then the configs; the methods; the
#: application (compress, save, load, quantizer, Hub, reports); the experiment code; the command line and the package
#: entry. A top-level module not named here is application.
LAYERS = (
    ("runtime",),
    ("core",),
    ("config",),
    ("methods",),
    (),
    ("data", "evaluation", "training", "baselines", "search", "assets"),
    ("cli", "__main__", ""),
)
APPLICATION = 4


def layer_of(module: str) -> int:
    """The layer of a package module (``hf_tensorcompress`` itself: the top)."""
    top = module[len(NAME) + 1 :].split(".")[0] if module.startswith(NAME + ".") else ""
    return next((index for index, names in enumerate(LAYERS) if top in names), APPLICATION)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every package module ``path`` imports, at any depth of the file (lazy imports in functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
            if base.startswith("recipes"):
                found.add(base)
    return {target for target in found if target in known or target.startswith("recipes")}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, set(known)) - {name} for name, path in known.items()}


def test_no_module_imports_a_layer_above_its_own():
    wrong = sorted(
        (name, target)
        for name, targets in graph().items()
        for target in targets
        if target.startswith("recipes") or layer_of(target) > layer_of(name)
    )
    assert not wrong, f"imports of a layer above: {wrong}"


def test_the_runtime_imports_only_itself_torch_transformers_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {
        "torch",
        "transformers",
        "safetensors",
        NAME,
    }  # safetensors: transformers needs it
    wrong = []
    for path in (PACKAGE / "runtime").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module]
            else:
                continue
            wrong += [(path.name, name) for name in names if name.split(".")[0] not in allowed]
    in_runtime = {name for name in graph() if name.startswith(f"{NAME}.runtime")}
    outside = sorted((n, t) for n in in_runtime for t in graph()[n] if not t.startswith(f"{NAME}.runtime"))
    assert not wrong and not outside, f"runtime imports of other packages: {wrong + outside}"


#: The only places that import modules by name at run time, and why (a new one would hide an edge from the checks
#: above): the registry's discovery of method packages and its first-use loading of their build code; the runtime's
#: optional sibling files; the package's lazy exports and its walk of the methods for their public names; the
#: optional third-party extras; torchao and bitsandbytes, imported only where a checkpoint quantized its Linears
#: with them.
DYNAMIC_IMPORTS = {
    "core/registry.py",
    "runtime/optional.py",
    "core/lazy.py",
    "__init__.py",
    "core/extras.py",
    "runtime/torchao_linears.py",
    "runtime/bnb_linears.py",
}


def test_modules_are_imported_by_name_only_where_the_layering_allows_it():
    found = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "import_module(" in path.read_text(encoding="utf-8") or "__import__(" in path.read_text(encoding="utf-8")
    }
    assert found == DYNAMIC_IMPORTS, (
        f"importlib use changed: new {found - DYNAMIC_IMPORTS}, gone {DYNAMIC_IMPORTS - found}"
    )


def test_no_import_cycle():
    edges, state, cycles = graph(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_checker_sees_a_forbidden_import_and_a_cycle(tmp_path):
    """The checks above could fail: the same parser finds an upward import and a lazy one in made-up modules."""
    core = tmp_path / "core.py"
    core.write_text("from .methods import get_method\n")
    assert imports_of(f"{NAME}.core.x", core, {f"{NAME}.core.methods", f"{NAME}.methods"}) == {f"{NAME}.core.methods"}
    assert layer_of(f"{NAME}.methods.cp.layer") > layer_of(f"{NAME}.core.registry") > layer_of(f"{NAME}.runtime.lowbit")
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from ..hub import push_to_hub\n")
    assert imports_of(f"{NAME}.core.lazy", lazy, {f"{NAME}.hub"}) == {f"{NAME}.hub"}


#: Experiment code: public, but nothing on the compress / save / load path may import it.
EXPERIMENTS = tuple(f"{NAME}.{part}" for part in ("data", "evaluation", "training", "baselines", "assets"))

COMPRESS_SAVE_LOAD = """
import sys, tempfile
import hf_tensorcompress as htc
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
for options in ({"method": "cp", "rank": 0.5}, {"method": "tt", "tt_ranks": 4}):
    model = htc.apply_compression(LlamaForCausalLM(config), htc.CompressionConfig(**options))
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        htc.load_model(folder)
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
print(sorted(name for name in sys.modules if name.startswith(EXPERIMENTS)))
"""


def test_compress_save_and_load_import_no_experiment_code():
    script = f"EXPERIMENTS = {EXPERIMENTS!r}\n{COMPRESS_SAVE_LOAD}"
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    """Whether a module under ``start`` imports, directly or through others, a module under ``goal``."""
    seen, todo = set(), [name for name in edges if name.startswith(start)]
    while todo:
        name = todo.pop()
        if name.startswith(goal):
            return True
        if name not in seen:
            seen.add(name)
            todo.extend(edges.get(name, ()))
    return False


#: What compressing, saving and loading run (the modules and packages, their lazy imports included).
COMPRESS_SAVE_LOAD_MODULES = tuple(
    f"{NAME}.{part}"
    for part in (
        "config",
        "compress",
        "saving",
        "loading",
        "quantizer",
        "hub",
        "reporting",
        "stacking",
        "core",
        "methods",
    )
)


def test_no_compress_save_or_load_module_imports_experiment_code_even_lazily():
    edges = graph()
    wrong = [
        (start, goal) for start in COMPRESS_SAVE_LOAD_MODULES for goal in EXPERIMENTS if reaches(edges, start, goal)
    ]
    assert not wrong, f"on the compress/save/load path, imports of experiment code: {wrong}"


def test_training_builds_on_evaluation_never_the_reverse():
    edges = graph()
    assert not reaches(edges, f"{NAME}.evaluation", f"{NAME}.training")
    assert reaches(edges, f"{NAME}.training", f"{NAME}.evaluation")  # the direction that is allowed is still seen


def test_reaches_follows_imports_through_other_modules():
    edges = {"pkg.a.x": {"pkg.c"}, "pkg.c": {"pkg.b.y"}, "pkg.b.y": set()}
    assert reaches(edges, "pkg.a", "pkg.b") and not reaches(edges, "pkg.b", "pkg.a")


def test_no_package_file_is_longer_than_500_lines():
    """Small modules with one job: a file past 500 lines holds more than one."""
    lengths = {
        str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert not {name: length for name, length in lengths.items() if length > 500}
