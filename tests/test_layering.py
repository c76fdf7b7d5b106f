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

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"minillm": ROOT / "minillm", "minillm.widgets": ROOT / "widgets"}  # widgets/ installs as minillm.widgets

# Bottom to top: each layer can be read, and tested, knowing only the layers below it. A dotted name
# covers its submodules unless one of them is listed itself (the longest name wins); the root
# package `minillm` covers its __init__ alone.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leaves: utilities, settings read from a checkpoint, result types, quantization formulas", (
        "minillm.version", "minillm.logger", "minillm.device", "minillm.env", "minillm.validation",
        "minillm.config", "minillm.sampling_params", "minillm.outputs", "minillm.runner_output",
        "minillm.trace", "minillm.metrics", "minillm.corpus",
        "minillm.quant")),  # its formulas (int4, int8, reference), which kernels build on; not quant.linear
    ("kernels: Triton and their PyTorch references", ("minillm.kernels",)),
    ("model: layers, the Llama family, quantized linear layers", (
        "minillm.layers", "minillm.models", "minillm.quant.linear")),
    ("attention backends, KV caches, engine settings", (
        "minillm.attention", "minillm.kv_pool", "minillm.kv_cache", "minillm.block_manager",
        "minillm.kv_cache_manager", "minillm.sequence", "minillm.input_buffers", "minillm.model_input",
        "minillm.spec_decode.config", "minillm.spec_decode.chi_square", "minillm.engine_config")),
    ("a step: scheduler, model runner, sampler; loading and saving models", (
        "minillm.scheduler", "minillm.model_runner", "minillm.cuda_graph", "minillm.output_processor",
        "minillm.layers.sampler", "minillm.loader", "minillm.quant_checkpoint", "minillm.spec_decode")),
    ("engine", ("minillm.engine", "minillm.engine_metrics")),
    ("LLM, the public API", ("minillm.llm", "minillm")),
    ("the async engine and the HTTP server", ("minillm.async_llm", "minillm.entrypoints")),
    ("tools and course", (
        "minillm.cli", "minillm.bench", "minillm.eval", "minillm.grading", "minillm.course", "minillm.release",
        "minillm.course_sync", "minillm.widgets")),
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
            found.append(f"{module.name} has no layer: add it to LAYERS in tests/test_layering.py")
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
        "    from minillm.engine import LLMEngine",
        "def run():",
        "    from .. import engine",  # relative, inside a function
        "from . import reference",  # the kernels' own: allowed
    ]))
    modules = [kernel, Module("minillm.engine", ""), Module("minillm.kernels.reference", ""),
               Module("minillm.layers.norm", "")]
    kernels, model, engine = (f"layer {i} ({LAYERS[i][0]})" for i in (1, 2, 5))
    assert violations(modules) == [
        f"minillm.kernels.fused:2 imports minillm.layers.norm: {model} is above minillm.kernels.fused's {kernels}",
        f"minillm.kernels.fused:4 imports minillm.engine: {engine} is above minillm.kernels.fused's {kernels}",
        f"minillm.kernels.fused:6 imports minillm.engine: {engine} is above minillm.kernels.fused's {kernels}",
    ]
    assert violations([Module("minillm.attention", "from . import paged", is_package=True),
                       Module("minillm.attention.paged", "from ..kernels import ops")]) == []


def test_an_unlisted_module_is_named():
    assert violations([Module("minillm.speculative", "")]) == [
        "minillm.speculative has no layer: add it to LAYERS in tests/test_layering.py"]


def test_the_most_specific_entry_decides():
    assert layer_of("minillm") == 6 and layer_of("minillm.quant.linear") == 2 and layer_of("minillm.quant.int4") == 0
    assert layer_of("minillm.layers.sampler") == 4 and layer_of("minillm.layers.norm") == 2
    assert layer_of("minillm.entrypoints.api_server") == 7 and layer_of("minillm.async_llm") == 7
    assert layer_of("minillm.widgets.live") == 8 and layer_of("minillm.nonexistent") is None
