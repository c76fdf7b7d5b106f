"""No module of minillm/ or widgets/ imports a module of a higher layer.

Every import counts: at module level, inside a function (a lazy import still runs) and under
TYPE_CHECKING (a type named is a dependency all the same). Importing a submodule also runs its
package's __init__, which is not counted: every package sits at or below its own modules, except
the root `minillm`, whose __init__ re-exports `LLM` and so runs the whole engine on any import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"minillm": ROOT / "minillm", "minillm.widgets": ROOT / "widgets"}  # widgets/ installs as minillm.widgets

# Bottom to top, by folder: each layer can be read, and tested, knowing only the layers below it. A
# dotted name covers its submodules; the root package `minillm` covers its __init__ alone. Modules of
# one layer may import each other (the engine runs the proposers, which build inputs as the runner does).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("utilities", ("minillm.utils", "minillm.version")),
    ("settings, requests and their results, quantization formulas", (
        "minillm.config", "minillm.quant", "minillm.sampling_params", "minillm.outputs", "minillm.sequence")),
    ("kernels: Triton and their PyTorch references", ("minillm.kernels",)),
    ("layers", ("minillm.layers",)),
    ("models and their loading", ("minillm.models",)),
    ("KV caches", ("minillm.kv",)),
    ("attention backends and their metadata", ("minillm.attention",)),
    ("sampling", ("minillm.sample",)),
    ("a step: scheduler, model runner, proposers, the engine", ("minillm.engine", "minillm.spec_decode")),
    ("LLM, the public API", ("minillm.llm", "minillm.chat_utils", "minillm")),
    ("the async engine and the HTTP server", ("minillm.async_llm", "minillm.entrypoints")),
    ("tools and course", (
        "minillm.cli", "minillm.bench", "minillm.eval", "minillm.grading", "minillm.course", "minillm.widgets")),
)


@dataclass(frozen=True)
class Module:
    name: str
    source: str
    is_package: bool = False


def layer_of(name: str) -> int | None:
    best, layer = "", None
    for index, (_, names) in enumerate(LAYERS):
        for listed in names:
            covers = name == listed or (listed != "minillm" and name.startswith(listed + "."))
            if covers and len(listed) > len(best):
                best, layer = listed, index
    return layer


def imported_modules(module: Module, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) for every minillm module that `module` imports. `from a import b` imports the
    module a.b where there is one (a's __init__ then only runs, as for any submodule), else a."""
    found = []
    for node in ast.walk(ast.parse(module.source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one package up per extra dot
                package = module.name.split(".")[:None if module.is_package else -1]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
            found += [(node.lineno, name) for name in names if name in known]
            if any(name not in known for name in names):
                found.append((node.lineno, base))
    return [(line, name) for line, name in found if name == "minillm" or name.startswith("minillm.")]


def violations(modules: list[Module]) -> list[str]:
    known = {m.name for m in modules}
    found = []
    for module in modules:
        layer = layer_of(module.name)
        if layer is None:
            found.append(f"{module.name} has no layer: add it to LAYERS in tests/project/test_layering.py")
            continue
        for line, name in imported_modules(module, known):
            target = layer_of(name)
            if target is None:
                found.append(f"{module.name}:{line} imports {name}, which has no layer")
            elif target > layer:
                found.append(f"{module.name}:{line} imports {name}: layer {target} ({LAYERS[target][0]}) is "
                             f"above {module.name}'s layer {layer} ({LAYERS[layer][0]})")
    return found


def project_modules() -> list[Module]:
    modules = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            modules.append(Module(".".join(parts[:-1] if is_package else parts), path.read_text(), is_package))
    return modules


def test_no_module_imports_a_higher_layer():
    found = violations(project_modules())
    assert not found, "imports that point up a layer:\n" + "\n".join(found)


def test_the_check_finds_every_kind_of_upward_import():
    kernel = Module("minillm.kernels.fused", "\n".join([
        "from typing import TYPE_CHECKING",
        "import minillm.layers.norm",  # up one layer
        "if TYPE_CHECKING:",
        "    from minillm.engine.llm_engine import LLMEngine",
        "def run():",
        "    from ..engine import scheduler",  # relative, inside a function
        "from . import attention_reference",  # the kernels' own: allowed
    ]))
    modules = [kernel, Module("minillm.engine.llm_engine", ""), Module("minillm.engine.scheduler", ""),
               Module("minillm.kernels.attention_reference", ""), Module("minillm.layers.norm", "")]
    kernels, layers, engine = (f"layer {layer_of(name)} ({LAYERS[layer_of(name)][0]})"
                               for name in ("minillm.kernels", "minillm.layers", "minillm.engine"))
    assert violations(modules) == [
        f"minillm.kernels.fused:2 imports minillm.layers.norm: {layers} is above minillm.kernels.fused's {kernels}",
        f"minillm.kernels.fused:4 imports minillm.engine.llm_engine: {engine} is above "
        f"minillm.kernels.fused's {kernels}",
        f"minillm.kernels.fused:6 imports minillm.engine.scheduler: {engine} is above "
        f"minillm.kernels.fused's {kernels}",
    ]
    assert violations([Module("minillm.attention", "from . import paged", is_package=True),
                       Module("minillm.attention.paged", "from ..kernels import ops")]) == []


def test_an_unlisted_module_is_named():
    assert violations([Module("minillm.speculative", "")]) == [
        "minillm.speculative has no layer: add it to LAYERS in tests/project/test_layering.py"]


def test_layers_are_folders():
    """Every layer is named by folders (or the few modules the package root keeps), and every folder of
    minillm/ belongs to exactly one layer."""
    folders = {p.name for p in (ROOT / "minillm").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    named = [name.removeprefix("minillm.") for _, names in LAYERS for name in names if name != "minillm"]
    assert folders <= set(named) and len(named) == len(set(named))
    root_modules = {p.stem for p in (ROOT / "minillm").glob("*.py")} - {"__init__"}
    assert set(named) - folders - {"widgets"} == root_modules
    assert len(root_modules) <= 10, f"the package root should keep only what a learner imports: {root_modules}"
    assert layer_of("minillm") == layer_of("minillm.llm") and layer_of("minillm.kv.pool") == layer_of("minillm.kv")
    assert layer_of("minillm.widgets.live") == len(LAYERS) - 1 and layer_of("minillm.nonexistent") is None


def called_in(name: str) -> set[str]:
    """The modules of minillm/ and widgets/ that call a function or class named `name`."""
    def calls(module: Module) -> bool:
        return any(isinstance(node, ast.Call) and name in (getattr(node.func, "id", None),
                                                           getattr(node.func, "attr", None))
                   for node in ast.walk(ast.parse(module.source)))
    return {m.name for m in project_modules() if calls(m)}


def test_attention_metadata_is_built_by_the_attention_backends_alone():
    assert {m.split(".")[1] for m in called_in("AttentionMetadata")} == {"attention"}


def test_the_engine_chooses_the_kernels_once_and_the_layers_call_them():
    """The kernel choice is made in one place; besides the layers' own default (a model built on its
    own runs the references) only the quantization exercise's check switches a layer, to the
    reference it compares against."""
    assert called_in("resolve_kernel") == {"minillm.engine.llm_engine"}
    assert called_in("load_ops") == {"minillm.engine.llm_engine", "minillm.layers.custom_op", "minillm.models.llama",
                                     "minillm.grading.checks_quant"}
