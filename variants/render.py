"""The renderer: Variant -> one standalone engine.py holding only the chosen components.

It copies the source of the core modules and of the chosen components (plus whatever they import
from us), in dependency order with the Triton kernels first, drops the imports between our
modules, and ends with a `create_engine` that wires the chosen classes. The result imports only
torch (and triton where a chosen component does)."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import tempfile
from pathlib import Path

from variants.components import CORE_MODULES, KERNEL_ORDER, assembly_path, component_paths

PACKAGE = "variants"


def _our_imports(tree: ast.Module) -> list:
    found = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE:
            found.append(node.module)
        elif isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == PACKAGE for a in node.names
        ):
            raise ValueError("use `from variants.x import name` inside the package")
    return found


def _ordered_modules(roots: list) -> list:
    """Depth-first: every module comes after the modules it imports from us."""
    order, seen = [], set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        tree = ast.parse(inspect.getsource(importlib.import_module(name)))
        for dep in _our_imports(tree):
            visit(dep)
        order.append(name)

    for root in roots:
        visit(root)
    return order


def _module_body(name: str) -> str:
    """The module's source without its docstring, `__future__` and our own imports; the
    docstring becomes a comment under a header naming the file."""
    source = inspect.getsource(importlib.import_module(name))
    tree = ast.parse(source)
    lines = source.splitlines()
    drop: set = set()
    doc = ""
    for i, node in enumerate(tree.body):
        is_doc = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ours = isinstance(node, ast.ImportFrom) and (
            node.module == "__future__" or (node.module or "").split(".")[0] == PACKAGE
        )
        if is_doc:
            doc = node.value.value
        if is_doc or ours:
            drop.update(range(node.lineno - 1, node.end_lineno))
    body = "\n".join(line for i, line in enumerate(lines) if i not in drop).strip("\n")
    path = name.replace(".", "/") + ".py"
    comment = "\n".join(f"# {line}".rstrip() for line in doc.strip().splitlines())
    return f"# {'-' * 20} {path} {'-' * 20}\n{comment}\n\n{body}\n"


def _check_unique_names(sources: dict) -> None:
    owner: dict = {}
    for module, text in sources.items():
        for node in ast.parse(text).body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for n in names:
                if n in owner and owner[n] != module:
                    raise ValueError(f"top-level name {n!r} defined in {owner[n]} and {module}")
                owner[n] = module


def _kernels_first(modules: list) -> list:
    """`modules` with the Triton kernel modules (and what they import) moved to the front in
    KERNEL_ORDER, so a kernel's line does not depend on the cache or layers chosen."""
    kernels = [m for m in KERNEL_ORDER if m in modules]
    kernels += [m for m in modules if m.startswith(f"{PACKAGE}.kernels.") and m not in kernels]
    first = _ordered_modules(kernels)
    return first + [m for m in modules if m not in first]


def render_source(variant, header: str = "", memory_budget_gib: float | None = None) -> str:
    """The engine's source; `memory_budget_gib` becomes its MEMORY_BUDGET_GIB (None: the
    device's memory is its only bound)."""
    parts = {key: path.split(":") for key, path in component_paths(variant).items()}
    assembly_module, assemble = assembly_path(variant).split(":")
    roots = list(CORE_MODULES) + [module for module, _ in parts.values()] + [assembly_module]
    modules = _kernels_first(_ordered_modules(roots))
    sources = {m: _module_body(m) for m in modules}
    _check_unique_names(sources)
    title = f"Standalone inference engine, variant {variant.name}"
    lines = [
        title,
        "",
        "Rendered by variants/render.py from the component library; it imports only",
        "torch (and triton where a chosen component needs it). Where it came from, when a",
        "study wrote it: the comment at the end.",
        "",
    ]
    lines += ["Variant:"] + [f"    {k} = {v!r}" for k, v in variant.to_dict().items()]
    docstring = '"""' + "\n".join(lines).replace('"""', "'''").rstrip() + '\n"""'
    wiring = "".join(f"        {key}={name},\n" for key, (_, name) in parts.items())
    budget = None if memory_budget_gib is None else round(float(memory_budget_gib), 2)
    tail = (
        f"VARIANT = Variant.from_dict({variant.to_dict()!r})\n"
        "# The most memory (GiB) one engine holds: weights, KV cache, CUDA graphs. Its KV cache\n"
        "# grows with the live requests up to what is left of it; a call that needs more raises\n"
        "# CacheFullError and changes nothing. None: the device's memory is the only bound.\n"
        f"MEMORY_BUDGET_GIB = {budget!r}\n\n\n"
        'def create_engine(model_config: dict, weight_dir: str, device: str = "cuda"):\n'
        '    """The course entry point: build, load and warm up (nothing lazy is left)."""\n'
        f"    return {assemble}(\n"
        "        model_config, weight_dir, device, VARIANT,\n"
        f"{wiring}"
        "        memory_budget_gib=MEMORY_BUDGET_GIB,\n"
        "    )\n"
    )
    body = "\n\n".join(sources[m] for m in modules)
    # No `from __future__ import annotations`: string annotations make dataclasses look the
    # module up in sys.modules, and the grader's spec_from_file_location import never adds it.
    # The header goes last: every line above stays where a trial's render (no header) had it,
    # and Triton's cache key holds each kernel's line number (scripts/compile_reuse.py), so the
    # written engine reuses the kernels its trial compiled.
    about = "".join(f"# {line}".rstrip() + "\n" for line in header.rstrip().splitlines())
    return f"{docstring}\n\n{body}\n\n{tail}" + (f"\n\n{about}" if about else "")


def render_engine(variant, path, header: str = "", memory_budget_gib: float | None = None) -> Path:
    """Write the standalone engine atomically (a temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_source(variant, header, memory_budget_gib)
    compile(text, str(path), "exec")  # a syntax error must never reach disk
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # (mkstemp makes it 0600) readable by a grader or a container
    os.replace(tmp, path)
    return path
