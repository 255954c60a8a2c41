"""Kernel tests run on CPU under Triton's interpreter unless a CUDA device is present.

Triton fixes the interpreter choice when it is imported (its own tl functions are jitted then),
so TRITON_INTERPRET is set here before the test modules import triton. If something imported
triton earlier in the session (torch._dynamo does), the CPU cases skip with that reason: run
this folder on its own, or set TRITON_INTERPRET=1 before torch is imported (tests/conftest.py)."""

import os
import sys

import pytest
import torch

STALE_TRITON = None
if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        STALE_TRITON = (
            "triton was imported before TRITON_INTERPRET=1 was set (by torch._dynamo, say); "
            "run `pytest tests/variants/kernels` on its own"
        )
    else:
        os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _interpretable_triton():
    if STALE_TRITON:
        pytest.skip(STALE_TRITON)


@pytest.fixture
def embedding_table():
    """A seeded random [vocab, hidden] table: `embedding_table(vocab, hidden, dtype)`."""

    def make(vocab: int, hidden: int, dtype=torch.float16) -> torch.Tensor:
        gen = torch.Generator().manual_seed(vocab + hidden)
        return torch.randn(vocab, hidden, generator=gen).to(dtype)

    return make


# The megakernel tests' model: the tests' tiny config with a head_dim of 32 (a 16-row tile
# never straddles a head) and GQA; 8 ragged rows, whose 66 and 141 keys leave a split empty.
MEGA_CONFIG = {
    "model_type": "tiny_llama", "torch_dtype": "float16", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
}  # fmt: skip
MEGA_PROMPTS = [1, 5, 20, 33, 65, 100, 140, 7]


@pytest.fixture(scope="session")
def mega_step(tmp_path_factory):
    """step(device, dtype, cache_cls) -> (engine, (x, positions, plan), x after
    run_fused_stack, each row's ids, the config, the weights' folder): an engine of the
    megakernel tests' model (our attention, the fused stack) after a prefill of 8 ragged rows
    and one decode step, whose stack arguments a StepRecorder kept."""
    from evaluator.toy_weights import save_toy_weights
    from variants.attention.triton_attention import TritonAttention
    from variants.engine import assemble_engine
    from variants.kernels.megakernel import StepRecorder
    from variants.layers.fused_stack import fused_head, run_fused_stack

    path = tmp_path_factory.mktemp("mega_weights")
    save_toy_weights(MEGA_CONFIG, path / "model.pt", seed=7, qk_scale=12.0, head_scale=10.0)

    def step(device: str, dtype: str, cache_cls) -> tuple:
        recorder = StepRecorder(run_fused_stack)
        engine = assemble_engine(MEGA_CONFIG, str(path), device, cache_cls=cache_cls,
                                 attention_cls=TritonAttention, stack=recorder,
                                 head=fused_head, dtype=dtype)  # fmt: skip
        gen = torch.Generator().manual_seed(3)
        rids = list(range(len(MEGA_PROMPTS)))
        prompts = [torch.randint(0, 256, (n,), generator=gen) for n in MEGA_PROMPTS]
        tokens = torch.randint(0, 256, (len(rids),), generator=gen)
        engine.prefill(rids, [p.to(device) for p in prompts])
        engine.decode(rids, tokens.to(device))
        fused = run_fused_stack(engine, *recorder.last, None)
        history = [p.tolist() + [int(t)] for p, t in zip(prompts, tokens)]
        return engine, recorder.last, fused, history, MEGA_CONFIG, str(path)

    return step
