"""The renderer: one standalone file per Variant that imports nothing of ours.

Each rendered engine is imported BY FILE PATH in a fresh interpreter whose cwd is the render
folder and whose sys.meta_path refuses `variants`, `evaluator` and `search`; it runs a short
sequence there, and its logits are compared with `variants.build_engine` of the same Variant
(same code, so bit-identical) and with the reference model."""

import ast
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evaluator.engine_loader import load_engine_module
from evaluator.reference_model import ReferenceModel
from variants import Variant, build_engine
from variants.render import render_engine, render_source

RENDERED = [
    Variant(cache="contiguous", attention="manual"),
    Variant(cache="slab", attention="sdpa", fuse_qkv=False, fuse_gate_up=False),
    Variant(
        cache="paged", block_size=16, attention="sdpa", sdpa_backend="math", fuse_gate_up=False
    ),
    Variant(cache="paged", block_size=64, attention="manual", fuse_qkv=False),
    Variant(cache="slab", attention="manual"),
    Variant(cache="contiguous", attention="sdpa", fuse_qkv=False, fuse_gate_up=False),
]
IDS = [v.name for v in RENDERED]
COURSE_READER = 1  # RENDERED[1] is also rendered with weights="course"
BIG = 10**10 + 3
SCRIPT = (  # (op, ids, prompt lengths): re-prefill of a live id, ragged decode, removal
    ("prefill", [BIG, 4], [9, 21]),
    ("decode", [4, BIG], None),
    ("prefill", [6, BIG], [3, 5]),
    ("decode", [BIG, 6, 4], None),
    ("remove", [4], None),
    ("decode", [6], None),
)
# Modules a rendered file may import lazily inside a function, for inputs the course never
# gives (checkpoint/formats.py reads safetensors only when the weight file is one).
LAZY_OPTIONAL = {"safetensors"}

DRIVER = """
import importlib.abc, importlib.util, json, sys

BLOCKED = ("variants", "evaluator", "search")


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"refused: {name}")
        return None


sys.meta_path.insert(0, Refuse())
for name in BLOCKED:
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"the import blocker let {name} through")

import torch

torch.set_num_threads(1)
args = json.loads(sys.argv[1])
config = json.loads(open(args["config"]).read())
calls = torch.load(args["calls"], weights_only=True)

# The bare grader idiom first: no sys.modules entry for the loaded file.
spec = importlib.util.spec_from_file_location("rendered_bare", args["engines"][0])
try:
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    bare = "ok"
except Exception as exc:
    bare = f"{type(exc).__name__}: {exc}"
print("BARE", json.dumps(bare))

for i, path in enumerate(args["engines"]):
    spec = importlib.util.spec_from_file_location(f"rendered_{i}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # what evaluator/engine_loader.py does
    spec.loader.exec_module(module)
    engine = module.create_engine(config, args["weights"], "cpu")
    outs = []
    for op, ids, tokens in calls:
        if op == "remove":
            engine.remove(ids)
        else:
            outs.append(getattr(engine, op)(ids, tokens))
    torch.save(outs, f"out_{i}.pt")
ours = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print("OURS", json.dumps(ours))
"""


def script_calls(vocab: int) -> list:
    gen = torch.Generator().manual_seed(3)
    calls = []
    for op, ids, lengths in SCRIPT:
        if op == "prefill":
            calls.append([op, ids, [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]])
        elif op == "decode":
            calls.append([op, ids, torch.randint(0, vocab, (len(ids),), generator=gen)])
        else:
            calls.append([op, ids, None])
    return calls


def run_driver(folder: Path, engines: list, config_path, weights):
    args = {
        "config": str(config_path),
        "calls": str(folder / "calls.pt"),
        "engines": [str(p) for p in engines],
        "weights": weights,
    }
    return subprocess.run(
        [sys.executable, str(folder / "driver.py"), json.dumps(args)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, tiny_config, sharp_weights):
    """Render every Variant into its own folder, run them all in one blocked interpreter."""
    folder = tmp_path_factory.mktemp("rendered")
    calls = script_calls(tiny_config["vocab_size"])
    torch.save(calls, folder / "calls.pt")
    (folder / "driver.py").write_text(DRIVER)
    (folder / "config.json").write_text(json.dumps(tiny_config))
    engines = [render_engine(v, folder / f"v{i}" / "engine.py") for i, v in enumerate(RENDERED)]
    # and one rendered for a target whose weights are a course-layout model.pt (its own reader)
    course = folder / "course" / "engine.py"
    engines.append(render_engine(RENDERED[COURSE_READER], course, weights="course"))
    proc = run_driver(folder, engines, folder / "config.json", sharp_weights)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.split("OURS", 1)[1])
    bare = json.loads(proc.stdout.split("BARE", 1)[1].splitlines()[0])
    outs = [torch.load(folder / f"out_{i}.pt", weights_only=True) for i in range(len(engines))]
    return {"engines": engines, "calls": calls, "outs": outs, "ours": loaded, "bare": bare}


@pytest.fixture(scope="module")
def reference_outs(rendered, tiny_config, sharp_weights):
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    history, outs = {}, []
    for op, ids, tokens in rendered["calls"]:
        if op == "remove":
            continue
        for i, rid in enumerate(ids):
            new = tokens[i] if op == "prefill" else torch.cat([history[rid], tokens[i : i + 1]])
            history[rid] = new
        outs.append(torch.stack([ref.forward(history[r][None])[0, -1] for r in ids]))
    return outs


def test_the_subprocess_imported_nothing_of_ours(rendered):
    assert rendered["ours"] == []


@pytest.mark.parametrize("index", range(len(RENDERED)), ids=IDS)
def test_rendered_equals_the_library_engine(rendered, tiny_config, sharp_weights, index):
    engine = build_engine(tiny_config, sharp_weights, "cpu", RENDERED[index])
    outs = []
    for op, ids, tokens in rendered["calls"]:
        if op == "remove":
            engine.remove(ids)
        else:
            outs.append(getattr(engine, op)(ids, tokens))
    got = rendered["outs"][index]
    assert len(got) == len(outs) == 5
    for a, b in zip(got, outs):
        assert a.dtype == torch.float32 and a.shape == b.shape
        assert (a - b).abs().max().item() <= 1e-6


@pytest.mark.parametrize("index", range(len(RENDERED)), ids=IDS)
def test_rendered_matches_the_reference(rendered, reference_outs, index):
    for step, (got, want) in enumerate(zip(rendered["outs"][index], reference_outs)):
        assert got.shape == want.shape
        assert (got - want).abs().max().item() < 5e-4, step


def test_an_engine_with_the_course_readers_carries_no_other_format(rendered):
    """Rendered for a course-format target (its config in the course's keys, its weights a
    course-layout model.pt): the same logits as the engine that reads every format, without the
    code for the others (safetensors, shards, .bin, HF conversions, HF config keys)."""
    got, want = rendered["outs"][-1], rendered["outs"][COURSE_READER]
    assert len(got) == len(want) == 5
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    course = rendered["engines"][-1].read_text()
    general = rendered["engines"][COURSE_READER].read_text()
    for name in (
        "def read_checkpoint",
        "safetensors",
        "def strip_model_prefix",
        "def rope_theta_of",
    ):
        assert name not in course and name in general
    assert len(course.splitlines()) < len(general.splitlines()) - 150


def test_an_engine_with_the_course_readers_refuses_another_config_key(rendered, tiny_config):
    """It reads the course's keys alone; one of Hugging Face's is refused by name, not ignored
    (the engine that reads every format reads it)."""
    course = load_engine_module(rendered["engines"][-1])
    general = load_engine_module(rendered["engines"][COURSE_READER])
    assert repr(course.ModelSpec.from_config(tiny_config)) == repr(
        general.ModelSpec.from_config(tiny_config)
    )
    gelu = {**tiny_config, "hidden_act": "gelu"}
    with pytest.raises(ValueError, match="'hidden_act' is not one of the course's config keys"):
        course.ModelSpec.from_config(gelu)
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        general.ModelSpec.from_config(gelu)


def test_an_unknown_weights_format_is_refused():
    with pytest.raises(ValueError, match="unknown weights format"):
        render_source(Variant(), weights="gguf")


def test_rendered_file_imports_without_a_sys_modules_entry(rendered):
    """spec_from_file_location + module_from_spec + exec_module, nothing else: the grader may
    load engine.py exactly like this."""
    assert rendered["bare"] == "ok"


def imported_roots(tree: ast.AST) -> tuple[set, set]:
    """(roots imported at module level, roots imported inside functions)."""
    top, nested = set(), set()
    functions = [
        n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    inside = {id(n) for f in functions for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in a standalone file"
            roots = {node.module.split(".")[0]}
        else:
            continue
        (nested if id(node) in inside else top).update(roots)
    return top, nested


def check_sections_map(text: str) -> None:
    """The map the docstring points to lists every section at the line it starts on."""
    doc = " ".join(ast.get_docstring(ast.parse(text)).split())
    at = int(re.search(r"Its sections, by first line: line (\d+)\.", doc).group(1))
    lines = text.splitlines()
    assert lines[at - 1] == "# The sections of this file, by first line:"
    rows = list(itertools.takewhile(lambda line: line != "#", lines[at:]))
    mapped = [(int(n), name) for n, name in (row[1:].split() for row in rows)]
    headers = [(n, m.group(1)) for n, line in enumerate(lines, 1)
               if (m := re.match(r"# -{20} (\S+) -{20}$", line))]  # fmt: skip
    assert mapped == headers and len(headers) > 5


def test_a_triton_engine_maps_its_kernels_and_sections():
    """The fastest preset's engine (rendering needs no GPU): its kernels lead, and the map's
    lines hold with a header and a kernel search's table too (the map is as long either way,
    so no kernel moves)."""
    from variants.presets import PRESETS

    variant = PRESETS["slab-triton-pdl-allgraphs"]
    plain = render_source(variant, "", 8.0)
    knobs = {(8, 1024): {"num_splits": 4, "tiles": (32, 2, 2)}}
    tuned = render_source(variant, "a study's header", 8.0, knobs=knobs)
    for text in (plain, tuned):
        check_sections_map(text)
        kernel, entry = "variants/kernels/device.py ----", " create_engine ----"
        assert text.index(kernel) < text.index("# The sections") < text.index(entry)
    start, end = "# -------------------- variants/kernels/", "# The sections of this file"
    at = [text.index(start) for text in (plain, tuned)]
    assert plain[: at[0]].count("\n") == tuned[: at[1]].count("\n")  # the same first line
    assert plain[at[0] :].split(end)[0] == tuned[at[1] :].split(end)[0]


@pytest.mark.parametrize("index", range(len(RENDERED)), ids=IDS)
def test_rendered_source_is_standalone(rendered, index):
    variant = RENDERED[index]
    path = rendered["engines"][index]
    text = path.read_text()
    compile(text, str(path), "exec")
    tree = ast.parse(text)
    doc = ast.get_docstring(tree)
    assert doc.splitlines()[0] == f"Standalone inference engine, variant {variant.name}"
    check_sections_map(text)
    choices = text.split("def create_engine")[0]  # the choices, right above create_engine
    for key, value in variant.to_dict().items():
        moot = key in ("block_size", "prefix_cache") and variant.cache != "paged"
        moot |= key == "sdpa_backend" and variant.attention != "sdpa"
        moot |= key == "compile_mode" and variant.execution != "compile"
        moot |= key == "cache_tokens" and variant.cache == "contiguous"
        assert (f"\n#   {key} = {value!r}\n" in choices) != moot, key
    assert not re.search(r"^\s*(from|import)\s+(variants|evaluator|search)\b", text, re.M)
    allowed = {"torch"} | set(sys.stdlib_module_names)
    top, nested = imported_roots(tree)
    assert "torch" in top
    assert top <= allowed, top - allowed
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert nested <= allowed | LAZY_OPTIONAL, nested - allowed
    assert {"create_engine", "assemble_engine", "Engine"} <= names
    assert "Variant" not in names  # the choices are resolved: no genome in the engine
    # top-down: the entry point, then the engine, then its cache, then the config it reads
    line = {n.name: n.lineno for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    cache = {"contiguous": "ContiguousKVCache", "slab": "SlabKVCache"}.get(variant.cache)
    cache = cache or "PagedKVCache"
    assert line["create_engine"] < line["Engine"] < line[cache] < line["ModelSpec"]
    # Only the chosen components are in the file.
    classes = {"contiguous": "ContiguousKVCache", "slab": "SlabKVCache", "paged": "PagedKVCache"}
    for cache, cls in classes.items():
        assert (cls in names) == (variant.cache == cache), cls
    assert ("ManualAttention" in names) == (variant.attention == "manual")
    assert ("SdpaAttention" in names) == (variant.attention == "sdpa")
    assert "run_compiled" not in names and "DecodeGraphs" not in names


def _top_level_imports(text: str) -> list:
    return [
        ast.unparse(n) for n in ast.parse(text).body if isinstance(n, (ast.Import, ast.ImportFrom))
    ]


def test_the_imports_come_once_at_the_top_and_only_those_used():
    """A person's file: each import once, above the code, none the kept code does not use (the
    pinned SDPA's backend table, for one, only where it is chosen)."""
    text = render_source(Variant(cache="slab", attention="sdpa"))
    imports = _top_level_imports(text)
    assert len(imports) == len(set(imports)) and "import torch" in imports
    body = ast.parse(text).body[1:]  # (after the docstring)
    kinds = [isinstance(n, (ast.Import, ast.ImportFrom)) for n in body]
    assert kinds == sorted(kinds, reverse=True)  # the imports, then the code
    assert not any("sdpa_kernel" in line for line in imports)
    pinned = render_source(Variant(cache="slab", attention="sdpa", sdpa_backend="math"))
    assert "from torch.nn.attention import SDPBackend, sdpa_kernel" in _top_level_imports(pinned)


def test_the_kernel_modules_keep_their_imports_and_the_rest_adds_only_its_own():
    """The kernel modules lead whole (their lines are Triton's cache key); the rest's imports
    follow them under a header of their own, without those the kernels made already."""
    text = render_source(Variant(cache="slab", attention="triton", layers="fused-pdl"))
    kernels, rest = text.split("# -------------------- imports --------------------\n")
    assert "import torch" in _top_level_imports(kernels)
    assert "import triton" in _top_level_imports(kernels)
    assert "import torch" not in _top_level_imports(rest)
    assert not set(_top_level_imports(rest)) & set(_top_level_imports(kernels))


def test_two_modules_binding_one_name_differently_are_refused():
    from variants.render import _hoist_imports

    with pytest.raises(ValueError, match="'F' is imported as"):
        _hoist_imports("import torch.nn.functional as F\nfrom x import F\nF\n", "")


def test_create_engine_passes_the_model_options_that_differ_from_the_assembly_s_defaults():
    """The choices in the comment above name them all; the call names only what it changes."""

    def call(variant):  # create_engine, down to the blank lines after it
        return render_source(variant).split("def create_engine")[1].split("\n\n\n")[0]

    plain = call(Variant())
    assert "fuse_qkv=" not in plain and "dtype=" not in plain
    changed = call(Variant(fuse_qkv=False, dtype="float32"))
    assert "        fuse_qkv=False,\n" in changed and "        dtype='float32',\n" in changed
    assert "fuse_gate_up=" not in changed


def test_header_is_kept_and_source_is_deterministic(tmp_path):
    variant = Variant(cache="paged", block_size=32)
    header = 'Written by run.sh\ntrial 7 of "study"'
    path = render_engine(variant, tmp_path / "deep" / "engine.py", header=header)
    text = path.read_text()
    assert text.endswith('\n\n# Written by run.sh\n# trial 7 of "study"\n')
    assert text == render_source(variant, header=header)
    # the header is last: every line above sits where it does without one, so a kernel
    # compiled from a trial's render (no header) is found in Triton's cache by line number
    assert text.startswith(render_source(variant))
    assert "the comment at the end" in ast.get_docstring(ast.parse(text))
    assert [p.name for p in path.parent.iterdir()] == ["engine.py"]  # no temp file left


@pytest.mark.parametrize(
    "variant",
    [
        Variant(cache="slab", attention="triton", layers="triton", graphs="pow2"),
        Variant(cache="paged", block_size=64, attention="sdpa", graphs="every8"),
        Variant(cache="paged", block_size=64, attention="triton", layers="fused", graphs="pow2"),
        Variant(cache="slab", attention="triton", layers="fused-pdl", graphs="pow2"),
    ],
    ids=lambda v: v.name,
)
def test_gpu_variants_render_with_only_their_components(variant):
    """CUDA-only assemblies render here too (rendering needs no GPU): triton appears exactly when
    a Triton component is chosen, and the graph capture only when graphs are on."""
    text = render_source(variant)
    tree = ast.parse(text)
    top, nested = imported_roots(tree)
    uses_triton = variant.attention == "triton" or variant.layers != "torch"
    assert ("triton" in top) == uses_triton
    assert top <= {"torch", "triton"} | set(sys.stdlib_module_names)
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert "DecodeGraphs" in names and "use_cuda_graphs" in names
    assert ("run_triton_stack" in names) == (variant.layers != "torch")  # fused runs it at prefill
    assert ("run_fused_stack" in names) == (variant.layers in ("fused", "fused-pdl"))
    assert ("head=fused_head" in text) == (variant.layers == "fused")
    pdl = "head=functools.partial(fused_head, pdl=True)"
    assert (pdl in text) == (variant.layers == "fused-pdl")
    assert ("wait_previous" in names) == uses_triton
    assert ("paged_decode_attention" in names) == (variant.attention == "triton")
    assert re.search(
        rf"capture=functools.partial\(\s*use_cuda_graphs,\s+policy={variant.graphs!r}", text
    )


def _kernel_lines(variant) -> dict:
    """{kernel name: line} of every @triton.jit function in the variant's render."""
    tree = ast.parse(render_source(variant))
    return {
        node.name: node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d).startswith("triton.jit") for d in node.decorator_list)
    }


def test_a_kernel_sits_on_the_same_line_whatever_the_cache_and_layers():
    """Triton's cache key holds a kernel's line number: with the kernels first in a fixed order,
    a slab and a paged engine, and the Triton and fused stacks, share their compiled kernels."""
    kw = dict(attention="triton", graphs="pow2", prefill_graphs="pow2")
    fused = _kernel_lines(Variant(cache="slab", layers="fused-pdl", **kw))
    paged = _kernel_lines(Variant(cache="paged", block_size=64, layers="fused", **kw))
    plain = _kernel_lines(Variant(cache="paged", block_size=16, layers="triton", **kw))
    assert len(plain) > 20 and len(fused) > len(plain)
    assert paged == fused
    assert all(fused[name] == line for name, line in plain.items())


@pytest.mark.parametrize(
    "variant",
    [
        Variant(cache="slab", attention="sdpa"),
        Variant(
            cache="paged", block_size=64, attention="triton", layers="fused-pdl", graphs="pow2"
        ),
    ],
    ids=lambda v: v.name,
)
def test_the_engine_holds_only_what_its_assembly_reaches(variant):
    """Outside the kernel modules (kept whole for their lines), every top-level definition and
    method of the written engine is used by some other part of it: a library helper that this
    assembly never calls (the pinned ring of the graph runners in an eager engine) is left out."""
    text = render_source(variant)
    tree = ast.parse(text)
    headers = [
        (n, line) for n, line in enumerate(text.splitlines(), 1) if line.startswith("# ----")
    ]
    kernels = [n for n, line in headers if "variants/kernels/" in line]
    # the first module after the kernels and what they import (staging, for the Triton stacks)
    first_core = min(
        n for n, line in headers if "variants/spec.py" in line or "variants/variant.py" in line
    )
    first_core = max(first_core, *kernels) if kernels else first_core
    mentioned: dict = {}
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
        if name:
            mentioned[name] = mentioned.get(name, 0) + 1
    defined = []
    for node in tree.body:
        if node.lineno <= first_core or not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        defined.append(node.name)
        if isinstance(node, ast.ClassDef):
            defined += [m.name for m in node.body if isinstance(m, ast.FunctionDef)]
    unused = [
        n for n in defined if not n.startswith("__") and n != "create_engine" and n not in mentioned
    ]
    assert defined and not unused
    if not kernels:
        assert "PinnedRing" not in defined  # the graph runners' pinned buffers


# A written engine is read without the repository: its comments name no document, tool or
# library file it does not contain (the scripts and experiments that measure a rule excepted).
ELSEWHERE = re.compile(
    r"docs/|search/|tuning/|evaluator/|PERF\b|\brun \d+|(?<![\w/])([\w/]+\.py)\b"
)


@pytest.mark.parametrize("weights", ["course", "safetensors", "any"])
def test_an_engine_names_nothing_it_does_not_contain(weights):
    from variants.presets import PRESETS

    for name, variant in PRESETS.items():
        lines = render_source(variant, memory_budget_gib=8.0, weights=weights).splitlines()
        modules = {m for line in lines for m in re.findall(r"^# -+ variants/(\S+\.py) -+$", line)}
        for n, line in enumerate(lines, 1):
            if re.match(r"^#( -+|\s+\d+) +variants/", line):  # the map and the section marks
                continue
            for found in ELSEWHERE.finditer(line):
                file = found.group(1)
                inside = file and any(f"/{m}".endswith(f"/{file}") for m in modules)
                measures = file and file.startswith(("scripts/", "experiments/"))
                if not (inside or file == "engine.py" or measures):
                    pytest.fail(f"{name} ({weights}), line {n} names {found.group()}: {line}")
