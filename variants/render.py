"""The renderer: Variant -> one standalone engine.py holding only the chosen components.

It copies the source of the core modules and of the chosen components (plus whatever they import
from us), in dependency order with the Triton kernels first, drops the imports between our
modules, and ends with a `create_engine` that wires the chosen classes. The result imports only
torch (and triton where a chosen component does)."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import re
import sys
import tempfile
from pathlib import Path

from variants.components import (
    CORE_MODULES,
    KERNEL_ORDER,
    READERS,
    Ref,
    Table,
    assembly_path,
    component_parts,
    model_options,
)

PACKAGE = "variants"


# A module's source is read and parsed once a process (the library does not change under a
# running search); a trial renders one engine, a test suite hundreds.
@functools.cache
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


@functools.cache
def _module_source(name: str) -> str:
    return inspect.getsource(importlib.import_module(name))


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


def _ordered_modules(roots: list, swap: dict | None = None) -> list:
    """Depth-first: every module comes after the modules it imports from us; a module named in
    `swap` is replaced by the one it maps to (a choice made at render time)."""
    order, seen = [], set()

    def visit(name: str) -> None:
        name = (swap or {}).get(name, name)
        if name in seen:
            return
        seen.add(name)
        for dep in _our_imports(_parse(_module_source(name))):
            visit(dep)
        order.append(name)

    for root in roots:
        visit(root)
    return order


@functools.cache
def _module_body(name: str) -> str:
    """The module's source without its docstring, `__future__` and our own imports; the
    docstring becomes a comment under a header naming the file."""
    source = _module_source(name)
    tree = _parse(source)
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
        for node in _parse(text).body:
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


def _defined_names(node) -> set:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _used_names(node) -> set:
    """The names `node` mentions, its attribute names as ".attr", and its string constants as
    both (a `getattr` by name)."""
    used = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            used.add(n.id)
        elif isinstance(n, ast.Attribute):
            used.add(f".{n.attr}")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            used.update((n.value, f".{n.value}"))
    return used


def _span(node, lines: list) -> range:
    """The lines of `node` (0-based), its decorators and the comment block right above it."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while (
        start > 0 and lines[start - 1].strip().startswith("#") and "-" * 20 not in lines[start - 1]
    ):
        start -= 1
    return range(start, node.end_lineno)


def _reachable_only(source: str, context: str) -> str:
    """`source` without the top-level definitions, and the methods, that nothing reachable
    from `context` (the wiring, the kernels) uses: a library module brings what every assembly
    needs; one engine keeps what its own assembly does. Dunder methods always stay."""
    tree = ast.parse(source)
    lines = source.splitlines()
    nodes = [(node, _defined_names(node)) for node in tree.body]
    definers: dict = {}  # name -> the top-level nodes defining it
    for node, names in nodes:
        for name in names:
            definers.setdefault(name, []).append(node)

    def methods(node) -> list:
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
        return (
            [m for m in node.body if isinstance(m, kinds)] if isinstance(node, ast.ClassDef) else []
        )

    def uses(node) -> set:  # a class's own statements (not its methods' bodies)
        if not isinstance(node, ast.ClassDef):
            return _used_names(node)
        own = [*node.bases, *node.keywords, *node.decorator_list]
        own += [m for m in node.body if m not in methods(node)]
        own += [d for m in methods(node) for d in m.decorator_list]
        return set().union(*map(_used_names, own)) if own else set()

    live, reached, kept = set(), set(), set()  # names; top-level nodes; methods
    pending = set(_used_names(_parse(context)))

    def reach(node) -> None:
        if id(node) not in reached:
            reached.add(id(node))
            pending.update(uses(node))
            for m in methods(node):
                if m.name.startswith("__") or f".{m.name}" in live:
                    keep(m)

    def keep(method) -> None:
        if id(method) not in kept:
            kept.add(id(method))
            pending.update(_used_names(method))

    for node, names in nodes:
        if not names:  # imports and statements run when the file is imported
            reach(node)
    while pending:
        name = pending.pop()
        if name in live:
            continue
        live.add(name)
        for node in definers.get(name, []):
            reach(node)
        if name.startswith("."):
            for node, _ in nodes:
                if id(node) in reached:
                    for m in methods(node):
                        if f".{m.name}" == name:
                            keep(m)
    drop: set = set()
    for node, _ in nodes:
        if id(node) not in reached:
            drop.update(_span(node, lines))
            continue
        for m in methods(node):
            if id(m) not in kept:
                span = _span(m, lines)
                blank_above = span.start > 0 and not lines[span.start - 1].strip()
                drop.update(range(span.start - blank_above, span.stop))
    kept_lines = [line for i, line in enumerate(lines) if i not in drop]
    return re.sub(r"\n{4,}", "\n\n\n", "\n".join(kept_lines) + "\n")


def _bindings(tree: ast.Module) -> dict:
    """{import: the name it binds} of a module's top-level imports, an import as a key:
    ("import", "torch.nn.functional as F") or ("from", "dataclasses", "dataclass")."""
    found = {}
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for alias in node.names:
            clause = alias.name + (f" as {alias.asname}" if alias.asname else "")
            if isinstance(node, ast.Import):  # `import a.b` binds a
                found[("import", clause)] = alias.asname or alias.name.split(".")[0]
            else:
                found[("from", node.module, clause)] = alias.asname or alias.name
    return found


def _import_block(imports: list) -> str:
    """The imports as ruff's isort writes them: the standard library's, then the others; in
    each, `import x` before `from x import y`, one `from` line a module."""
    sections = []
    for stdlib in (True, False):
        mine = [i for i in imports if (i[1].split(".")[0] in sys.stdlib_module_names) == stdlib]
        lines = sorted(f"import {i[1]}" for i in mine if i[0] == "import")
        for module in sorted({i[1] for i in mine if i[0] == "from"}):
            clauses = sorted(i[2] for i in mine if i[0] == "from" and i[1] == module)
            lines.append(f"from {module} import {', '.join(clauses)}")
        if lines:
            sections.append("\n".join(lines))
    return "\n\n".join(sections)


def _hoist_imports(rest: str, above: str) -> tuple:
    """(`rest` without its top-level imports, those of them its code uses as one block): each
    import once, none that `above` (the kernel modules, kept whole) already made. Two modules
    binding one name to different things would not work in one file: ValueError."""
    tree = ast.parse(rest)
    imports = _bindings(tree)
    named: dict = {}
    for key, name in imports.items():
        alias = key[0] == "from" or " as " in key[1]
        if alias and named.setdefault(name, key) != key:
            raise ValueError(f"{name!r} is imported as {named[name]} and as {key}")
    lines = rest.splitlines()
    drop = {
        i
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for i in range(node.lineno - 1, node.end_lineno)
    }
    code = re.sub(r"\n{4,}", "\n\n\n", "\n".join(s for i, s in enumerate(lines) if i not in drop))
    used = {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}
    made = _bindings(ast.parse(above)) if above else {}
    wanted = [key for key, name in imports.items() if name in used and key not in made]
    return code, _import_block(wanted)


def _import_time_names(tree: ast.Module) -> set:
    """Names a module's top level evaluates when it runs: bases, decorators, defaults, class
    bodies and (no `from __future__ import annotations` here) annotations. Function bodies look
    their names up only when called, so their definitions may come later in the file."""
    needed: set = set()

    def signature(fn) -> list:
        a = fn.args
        annotated = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
        nodes = [*fn.decorator_list, *a.defaults, *[d for d in a.kw_defaults if d is not None]]
        nodes += [x.annotation for x in annotated if x is not None and x.annotation is not None]
        return nodes + ([fn.returns] if fn.returns is not None else [])

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                parts = signature(node)
            elif isinstance(node, ast.ClassDef):
                parts = [*node.bases, *node.keywords, *node.decorator_list]
                visit(node.body)
            else:
                parts = [node]
            needed.update(n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name))

    visit(tree.body)
    return needed


def _top_down(modules: list, first: list, sources: dict) -> list:
    """`modules` with `first` leading, then each module before those it uses (the reverse of
    the dependency order), except that one whose top level needs a name runs after the module
    defining it."""
    trees = {m: _parse(sources[m]) for m in modules}
    owner = {}
    for m in modules:
        for node in trees[m].body:
            for name in _defined_names(node):
                owner.setdefault(name, m)
    needs = {
        m: {owner[n] for n in _import_time_names(trees[m]) if n in owner} - {m} for m in modules
    }
    wanted = [m for m in dict.fromkeys(first) if m in modules]
    wanted += [m for m in reversed(modules) if m not in wanted]
    order: list = []

    def place(m: str, seen: tuple = ()) -> None:
        if m in order or m in seen:  # (a cycle of top-level needs would not import at all)
            return
        for dep in [d for d in wanted if d in needs[m]]:  # what it needs, just above it
            place(dep, (*seen, m))
        order.append(m)

    for m in wanted:
        place(m)
    return order


def _bound(path: str, options: dict) -> str:
    """The source of a component bound to its options, as build.bind makes it."""
    name = path.split(":")[1]
    if not options:
        return name
    named = lambda v: v.path.split(":")[1] if isinstance(v, Ref) else v.name  # noqa: E731
    args = [
        f"{k}={named(v) if isinstance(v, (Ref, Table)) else repr(v)}" for k, v in options.items()
    ]
    line = f"functools.partial({name}, {', '.join(args)})"
    if len(line) <= 80:
        return line
    return (
        f"functools.partial(\n            {name},\n"
        + "".join(f"            {a},\n" for a in args)
        + "        )"
    )


def _default(module: str, name: str, key: str):
    """The default of function `name`'s argument `key` (inspect's `empty` where it has none)."""
    function = getattr(importlib.import_module(module), name)
    parameter = inspect.signature(function).parameters.get(key)
    return inspect.Parameter.empty if parameter is None else parameter.default


def _knobs_source(table: Table) -> str:
    """A kernel search's table as a constant, an entry a line, under its comment."""
    rows = "".join(
        f"    {key!r}: dict({', '.join(f'{k}={v!r}' for k, v in launch.items())}),\n"
        for key, launch in sorted(table.value.items())
    )
    about = "".join(f"# {line}\n" for line in table.about)
    return f"{about}{table.name} = {{\n{rows}}}\n\n"


def render_source(
    variant,
    header: str = "",
    memory_budget_gib: float | None = None,
    weights: str = "any",
    knobs: dict | None = None,
    few_row_knobs: dict | None = None,
    prefill_knobs: dict | None = None,
) -> str:
    """The engine's source; `memory_budget_gib` becomes its MEMORY_BUDGET_GIB (None: the
    device's memory is its only bound); `weights` picks its config and weight readers (READERS:
    "course" for a target in the course's format, its config in the course's keys and its
    weights a course-layout model.pt, else "any"); `knobs`, `few_row_knobs` and
    `prefill_knobs`: the kernel searches' launches (`component_parts`)."""
    if weights not in READERS:
        raise ValueError(f"unknown weights format {weights!r}; expected one of {list(READERS)}")
    parts = component_parts(variant, knobs, few_row_knobs, prefill_knobs)
    # a table bound to several components (the fused stack and its head) is one constant
    tables = {
        v.name: v for _, options in parts.values() for v in options.values() if isinstance(v, Table)
    }.values()
    refs = [v.path for _, options in parts.values() for v in options.values() if isinstance(v, Ref)]
    assembly_module, assemble = assembly_path(variant).split(":")
    paths = [path for path, _ in parts.values()] + refs
    roots = list(CORE_MODULES) + [p.split(":")[0] for p in paths] + [assembly_module]
    swap = dict(zip(READERS["any"], READERS[weights]))
    modules = _kernels_first(_ordered_modules(roots, swap))
    sources = {m: _module_body(m) for m in modules}
    _check_unique_names(sources)
    moot = {"block_size": variant.cache != "paged", "prefix_cache": variant.cache != "paged"}
    moot.update(
        sdpa_backend=variant.attention != "sdpa",
        compile_mode=variant.execution != "compile",
        cache_tokens=variant.cache == "contiguous",
    )
    choices = "".join(
        f"#   {k} = {v!r}\n" for k, v in variant.to_dict().items() if not moot.get(k, False)
    )
    wiring = "".join(
        f"        {key}={_bound(path, options)},\n" for key, (path, options) in parts.items()
    )
    # the model options (the choices above name them all) its assembly does not take by default
    wiring += "".join(
        f"        {key}={value!r},\n"
        for key, value in model_options(variant).items()
        if _default(assembly_module, assemble, key) != value
    )
    budget = None if memory_budget_gib is None else round(float(memory_budget_gib), 2)
    tail = (
        f"# {'-' * 20} create_engine {'-' * 20}\n"
        "# The choices this engine was assembled from (one value per axis of the search), each\n"
        "# resolved into the components create_engine wires:\n"
        f"{choices}"
        "#\n"
        "# The most memory (GiB) one engine holds: weights, KV cache, CUDA graphs. Its KV cache\n"
        "# grows with the live requests up to what is left of it; a call that needs more raises\n"
        "# CacheFullError and changes nothing. None: the device's memory is the only bound.\n"
        f"MEMORY_BUDGET_GIB = {budget!r}\n\n" + "".join(_knobs_source(t) for t in tables) + "\n"
        'def create_engine(model_config: dict, weight_dir: str, device: str = "cuda"):\n'
        '    """The course entry point: build, load and warm up (nothing lazy is left)."""\n'
        f"    return {assemble}(\n"
        "        model_config, weight_dir, device,\n"
        f"{wiring}"
        "        memory_budget_gib=MEMORY_BUDGET_GIB,\n"
        "    )\n"
    )
    # The kernel modules (and what they import) lead, kept whole: a kernel's line is in
    # Triton's cache key and must not depend on what the rest of the file needs. The rest reads
    # top-down: the choices and create_engine, the engine, the chosen components, then what
    # they use; of it, only what the assembly reaches from create_engine.
    lead = _ordered_modules([m for m in modules if m.startswith(f"{PACKAGE}.kernels.")])
    kernels = "\n\n".join(sources[m] for m in lead)
    # the engine, the model, the layers it is built with and their math, then the other parts
    layers = parts["stack"][0].split(":")[0]
    first = [f"{PACKAGE}.engine", assembly_module, f"{PACKAGE}.model", layers]
    first += [f"{PACKAGE}.layers.block"] + [p.split(":")[0] for p in paths]
    order = ["entry", *_top_down([m for m in modules if m not in lead], first, sources)]
    sources["entry"] = tail
    rest = _reachable_only("\n\n".join(sources[m] for m in order), kernels + "\ncreate_engine")
    # The rest's imports once, at its top (after the kernels, under a header of their own).
    rest, imports = _hoist_imports(rest, kernels)
    if imports and kernels:
        imports = f"# {'-' * 20} imports {'-' * 20}\n{imports}"
    after = "\n\n\n".join(part for part in (imports, rest) if part)
    # No `from __future__ import annotations`: string annotations make dataclasses look the
    # module up in sys.modules, and the grader's spec_from_file_location import never adds it.
    # The header goes last: every line above stays where a trial's render (no header) had it,
    # and Triton's cache key holds each kernel's line number (experiments/compile_reuse.py), so the
    # written engine reuses the kernels its trial compiled.
    about = "".join(f"# {line}".rstrip() + "\n" for line in header.rstrip().splitlines())
    text = _with_map(variant, kernels.rstrip("\n"), after)
    return text + (f"\n\n{about}" if about else "")


SECTION = re.compile(r"^# -{20} (\S+) -{20}$", re.M)


def _with_map(variant, kernels: str, after: str) -> str:
    """The docstring, the kernel modules, a map of the file's sections by first line, then the
    rest. The docstring's length depends only on whether there are kernels and the map follows
    them, so no kernel's line depends on the rest (Triton's cache key holds it)."""
    about = [
        f"Standalone inference engine, variant {variant.name}",
        "",
        "Rendered from the autotuner's component library; it imports only torch (and triton",
        "where a chosen component needs it). Where it came from, when a study wrote it:",
        "the comment at the end. It reads top-down: the choices and create_engine, the engine,",
        "the chosen components, then what they use. Its sections, by first line: line {map}.",
    ]
    if kernels:
        about[4:] = [
            "the comment at the end. The kernel modules lead, kept whole (a kernel's line",
            "number is in Triton's cache key); from create_engine on it reads top-down: the",
            "choices, the engine, the chosen components, then what they use. Its sections, by",
            "first line: line {map}.",
        ]
    lead = f"{kernels}\n\n\n" if kernels else ""
    lead_at = len(about) + 3  # the docstring's lines and its closing quotes, then a blank line
    map_at = lead_at + lead.count("\n")
    above = [(lead_at + lead.count("\n", 0, m.start()), m.group(1)) for m in SECTION.finditer(lead)]
    after_at = map_at + 2 + len(above) + len(SECTION.findall(after)) + 2  # the map, two blanks
    below = [
        (after_at + after.count("\n", 0, m.start()), m.group(1)) for m in SECTION.finditer(after)
    ]
    rows = [f"# {n:>6}  {name}" for n, name in above + below]
    block = "\n".join(["# The sections of this file, by first line:", *rows, "#"])
    text = "\n".join(about).replace('"' * 3, "'" * 3).replace("{map}", str(map_at))
    return '"' * 3 + text + "\n" + '"' * 3 + f"\n\n{lead}{block}\n\n\n{after}"


def render_engine(
    variant,
    path,
    header: str = "",
    memory_budget_gib: float | None = None,
    weights: str = "any",
    knobs: dict | None = None,
    few_row_knobs: dict | None = None,
    prefill_knobs: dict | None = None,
) -> Path:
    """Write the standalone engine atomically (a temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_source(
        variant, header, memory_budget_gib, weights, knobs, few_row_knobs, prefill_knobs
    )
    compile(text, str(path), "exec")  # a syntax error must never reach disk
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # (mkstemp makes it 0600) readable by a grader or a container
    os.replace(tmp, path)
    return path
