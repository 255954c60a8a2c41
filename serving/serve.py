"""`python -m search serve --engine FILE --model DIR`: an OpenAI-compatible HTTP server over an
engine file, with continuous batching (docs/SERVING.md). The model folder is generate's
(config.json, weights, tokenizer.json, tokenizer_config.json for the chat template). Needs the
`serve` extra (FastAPI, uvicorn); bad start-up input gets one line and exit code 2."""

from __future__ import annotations

import logging
import socket
import sys
import time
from pathlib import Path

from serving.chat_template import ChatTemplateError, chat_renderer
from serving.generate import GenerateError, eos_ids, load_engine, load_tokenizer, model_config
from variants.probe import UserError, resolve_device
from variants.serving.engine_loop import EngineLoop

log = logging.getLogger(__name__)

SERVE_EXTRA = 'pip install -e ".[serve]"'


def add_arguments(p) -> None:
    p.add_argument("--engine", required=True, help="engine file defining create_engine")
    p.add_argument(
        "--model",
        required=True,
        help="model folder: config.json (or model_config.json), the weights, tokenizer.json "
        "and, for /v1/chat/completions, tokenizer_config.json with a chat_template",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free one)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument(
        "--max-live", type=int, default=16, help="requests decoded together, at most (default 16)"
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=2048,
        help="prompt tokens prefilled in one step, at most; a longer prompt goes alone "
        "(default 2048)",
    )
    p.add_argument("--model-name", help="the model's name in the API (default: the folder's)")
    p.add_argument(
        "--max-body-mib",
        type=float,
        default=4.0,
        help="request bodies over this many MiB are refused with a 413 (default 4)",
    )


def serve_command(args) -> int:
    try:
        check_limits(args.max_live, args.max_prefill_tokens, args.max_body_mib)
        sock = listen(args.host, args.port)
        served, config = load_served_model(args)
        engine = load_engine(args.engine, config, args.model, served.device)
    except (GenerateError, ValueError, KeyError, OSError, ImportError, MemoryError) as exc:
        log.debug("serve failed to start", exc_info=True)
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        kind = "" if isinstance(exc, UserError) else f"{type(exc).__name__}: "
        print(f"error: {kind}{text}", file=sys.stderr)
        return 2
    import uvicorn  # (FastAPI and uvicorn: the serve extra, imported once the input is good)

    from serving.openai_api import create_app

    loop = EngineLoop(engine, args.max_live, args.max_prefill_tokens).start()
    host, port = sock.getsockname()[:2]
    log.info("serving %s on http://%s:%d/v1", served.name, host, port)
    app = create_app(loop, served, int(args.max_body_mib * 2**20))
    config = uvicorn.Config(app, log_level=args.log_level.lower(), timeout_graceful_shutdown=5)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shut down gracefully, then raised Ctrl-C's signal again
        pass
    finally:
        loop.close()
    return 0


def check_limits(max_live: int, max_prefill_tokens: int, max_body_mib: float) -> None:
    if max_live < 1 or max_prefill_tokens < 1:
        raise GenerateError("--max-live and --max-prefill-tokens must be >= 1")
    if not max_body_mib > 0 or max_body_mib == float("inf"):
        raise GenerateError(f"--max-body-mib must be a number > 0, got {max_body_mib}")


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the engine loads: a taken port is a start-up error."""
    if not 0 <= port < 65536:
        raise GenerateError(f"--port must be in [0, 65535], got {port}")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise GenerateError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def load_served_model(args):
    """(ServedModel, config dict) of --model: tokenizer, chat template, EOS ids, sizes."""
    try:
        import uvicorn  # noqa: F401

        from serving.openai_api import ServedModel, token_texts
    except ImportError as exc:
        raise GenerateError(f"serve needs FastAPI and uvicorn ({exc}): {SERVE_EXTRA}") from exc
    device = resolve_device(args.device)
    model = Path(args.model)
    config = model_config(model)
    tokenizer = load_tokenizer(model)
    served = ServedModel(
        name=args.model_name or model.resolve().name,
        tokenizer=tokenizer,
        render_chat=chat_renderer_or_none(model),
        eos_ids=frozenset(eos_ids(model, config)),
        max_positions=config["max_position_embeddings"],
        vocab_size=config["vocab_size"],
        device=device,
        created=int(time.time()),
        token_texts=token_texts(tokenizer, config["vocab_size"]),
    )
    return served, config


def chat_renderer_or_none(model: Path):
    try:
        return chat_renderer(model)
    except ChatTemplateError as exc:
        log.warning("no chat template (%s): /v1/chat/completions will answer 400", exc)
        return None
