"""`python -m search generate --engine FILE --model DIR`: see a written engine produce text.

Loads the engine file as the grader does, the model folder's config.json (or model_config.json)
and tokenizer.json (`tokenizers`), prefills every prompt in one call, decodes them together,
removing each request at EOS or at its token limit, and samples with variants.serving.sampling.
`--chat` renders tokenizer_config.json's chat template with jinja2 (the `models` extra)."""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from evaluator.engine_loader import EngineLoadError, load_engine_module, load_model_config
from serving.chat_template import ChatTemplateError, render_chat
from variants.probe import UserError, resolve_device
from variants.serving.sampling import SEEDS, SamplingParams, TokenSampler

log = logging.getLogger(__name__)

DEFAULT_PROMPT = "The capital of France is"
MODELS_EXTRA = 'pip install -e ".[models]"'
CONFIG_NAMES = ("config.json", "model_config.json")


class GenerateError(UserError):
    """Bad input to the command; the message is one line naming the problem and the fix."""


def add_arguments(p) -> None:
    p.add_argument("--engine", required=True, help="engine file defining create_engine")
    p.add_argument(
        "--model",
        required=True,
        help="model folder: config.json (or model_config.json), the weights, tokenizer.json",
    )
    p.add_argument(
        "--prompt",
        action="append",
        help=f"a prompt; repeat for several, decoded together (default {DEFAULT_PROMPT!r})",
    )
    p.add_argument(
        "--chat", action="store_true", help="wrap each prompt in the model's chat template"
    )
    p.add_argument("--max-new-tokens", type=int, default=32, help="per prompt (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1.0: off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")


@dataclass
class Generation:
    tokens: list  # per prompt, the generated ids (an EOS that ended it included)
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    finished_by_eos: list = field(default_factory=list)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate_tokens(engine, prompts, sample, max_new: int, eos_ids, max_positions: int, device):
    """Prefill `prompts` (lists of ids) in one call, then decode all live requests together
    until each hits an EOS id, `max_new` tokens or the context end. Times the engine calls."""
    device = torch.device(device)
    ids = list(range(len(prompts)))
    out = Generation(tokens=[[] for _ in prompts], finished_by_eos=[False] * len(prompts))
    inputs = [torch.tensor(p, dtype=torch.long, device=device) for p in prompts]
    start = time.perf_counter()
    logits = engine.prefill(ids, inputs)
    _sync(device)
    out.prefill_s, out.prompt_tokens = time.perf_counter() - start, sum(map(len, prompts))
    live = ids
    while True:
        for rid, token in zip(live, sample(logits).tolist()):
            out.tokens[rid].append(token)
        ended = []
        for rid in live:
            seq = out.tokens[rid]
            out.finished_by_eos[rid] = seq[-1] in eos_ids
            full = len(prompts[rid]) + len(seq) >= max_positions
            if out.finished_by_eos[rid] or len(seq) >= max_new or full:
                ended.append(rid)
        if ended:
            engine.remove(ended)
        live = [rid for rid in live if rid not in ended]
        if not live:
            return out
        step = torch.tensor([out.tokens[rid][-1] for rid in live], device=device)
        start = time.perf_counter()
        logits = engine.decode(live, step)
        _sync(device)
        out.decode_s += time.perf_counter() - start
        out.decode_tokens += len(live)


def sampling_params(args) -> SamplingParams:
    if args.max_new_tokens < 1:
        raise GenerateError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not SEEDS[0] <= args.seed <= SEEDS[1]:
        raise GenerateError(
            f"--seed must be a 64-bit integer, -2**63 to 2**63 - 1; got {args.seed}"
        )
    try:
        return SamplingParams(args.temperature, args.top_k, args.top_p)
    except ValueError as exc:  # "temperature must be >= 0, got -1.0"
        raise GenerateError(f"--{str(exc).replace('_', '-')}") from exc


def model_config(model: Path) -> dict:
    if not model.is_dir():
        raise GenerateError(f"--model {model} is not a folder: give the model folder")
    for name in CONFIG_NAMES:
        if (model / name).is_file():
            try:
                return load_model_config(model / name)
            except EngineLoadError as exc:
                raise GenerateError(f"{exc}: fix or re-export the config") from exc
    raise GenerateError(
        f"no config.json or model_config.json in {model}: copy the model's config there"
    )


def eos_ids(model: Path, config: dict) -> set:
    """`eos_token_id` of config.json and generation_config.json (an int or a list)."""
    found = set()
    sources = [config]
    if (model / "generation_config.json").is_file():
        sources.append(json.loads((model / "generation_config.json").read_text()))
    for source in sources:
        value = source.get("eos_token_id")
        found.update(value if isinstance(value, list) else [] if value is None else [value])
    return found


def load_tokenizer(model: Path):
    path = model / "tokenizer.json"
    if not path.is_file():
        raise GenerateError(
            f"no tokenizer.json in {model}: copy the model's tokenizer.json there (or convert a "
            "GGUF with `python -m search import-gguf`)"
        )
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise GenerateError(f"generate needs the tokenizers package: {MODELS_EXTRA}") from exc
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise GenerateError(f"{path} is not a readable tokenizer.json ({exc})") from exc


def encode_prompts(model: Path, tokenizer, texts: list, chat: bool) -> list:
    if not chat:
        prompts = [tokenizer.encode(t).ids for t in texts]
    else:
        try:
            rendered = [render_chat(model, t) for t in texts]
        except ChatTemplateError as exc:
            raise GenerateError(str(exc)) from exc
        prompts = [tokenizer.encode(t, add_special_tokens=False).ids for t in rendered]
    empty = [t for t, p in zip(texts, prompts) if not p]
    if empty:
        raise GenerateError(f"prompt {empty[0]!r} has no tokens: give a non-empty --prompt")
    return prompts


def generate_command(args) -> int:
    try:
        return run_generate(args)
    except (GenerateError, ValueError, KeyError, OSError, ImportError) as exc:
        log.debug("generate failed", exc_info=True)
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        kind = "" if isinstance(exc, UserError) else f"{type(exc).__name__}: "
        print(f"error: {kind}{text}", file=sys.stderr)
        return 2


def run_generate(args) -> int:
    params = sampling_params(args)
    device = resolve_device(args.device)
    model = Path(args.model)
    config = model_config(model)
    tokenizer = load_tokenizer(model)
    texts = args.prompt or [DEFAULT_PROMPT]
    prompts = encode_prompts(model, tokenizer, texts, args.chat)
    most = config["max_position_embeddings"]
    if long := [n for n, p in enumerate(prompts) if len(p) > most]:
        raise GenerateError(
            f"prompt {long[0]} has {len(prompts[long[0]])} tokens, and the model's context "
            f"(max_position_embeddings) is {most}: shorten it to leave room for what it writes"
        )
    engine = load_engine(args.engine, config, model, device)
    with torch.no_grad():
        sampler = TokenSampler(params, args.seed, device=device)
        result = generate_tokens(
            engine, prompts, sampler, args.max_new_tokens, eos_ids(model, config),
            config["max_position_embeddings"], device,
        )  # fmt: skip
    for n, (text, tokens) in enumerate(zip(texts, result.tokens)):
        ending = "EOS" if result.finished_by_eos[n] else "limit"
        print(f"--- prompt {n} ({len(prompts[n])} tokens, {len(tokens)} new, ended by {ending})")
        reply = tokenizer.decode(tokens, skip_special_tokens=True)
        print(f"{text}\n{reply}" if args.chat else text + reply)
    print(speed_line(result, device))
    return 0


def load_engine(path: str, config: dict, model: Path, device: str):
    """create_engine of the engine file, loaded as the grader loads it, on the model folder."""
    try:
        module = load_engine_module(path)
    except EngineLoadError as exc:
        raise GenerateError(f"{exc}: pass the engine file with --engine") from exc
    start = time.perf_counter()
    try:
        with torch.no_grad():
            engine = module.create_engine(config, str(model), device)
    except OSError as exc:  # a file of the folder missing or unreadable: its own message
        raise GenerateError(str(exc)) from exc
    except (ValueError, KeyError) as exc:  # the engine's checks of the config and weights
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise GenerateError(
            f"{path} cannot load {model}: {text} (is the folder's config the one its weights "
            "were saved with, and the engine written for this model?)"
        ) from exc
    log.info("create_engine took %.1f s on %s", time.perf_counter() - start, device)
    return engine


def speed_line(result: Generation, device: str) -> str:
    prefill = result.prompt_tokens / result.prefill_s if result.prefill_s else 0.0
    decode = result.decode_tokens / result.decode_s if result.decode_s else 0.0
    return (
        f"prefill {result.prompt_tokens} tokens in {result.prefill_s * 1e3:.1f} ms "
        f"({prefill:,.0f} tokens/s); decode {result.decode_tokens} tokens in "
        f"{result.decode_s * 1e3:.1f} ms ({decode:,.0f} tokens/s) on {device}"
    )
