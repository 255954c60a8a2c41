"""The gate against faults planted on purpose, judged by the independent reference (transformers'
own model of each held-out checkpoint): each fault fails, at float32 and at bfloat16, while the
same engine without it passes. The faults are the mistakes a reader of these checkpoints makes:
the rotary layout swapped, a projection transposed, K and V swapped, a wrong norm epsilon, a
dropped bias, a sliding window ignored; and our own engine reading HF's LLaMA as interleaved
(a Mistral checkpoint was once read that way and passed against a reference that shared the
reader)."""

import pytest
import torch

from evaluator.correctness import check_prepared, prepare_check
from evaluator.gates import NoiseGate

transformers = pytest.importorskip("transformers")

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16  # tests/conftest.py HELD_OUT_SIZES


class HistoryEngine:
    """The course's interface over a transformers model: every call recomputes each request's
    whole history, in the model's dtype; float32 logits."""

    def __init__(self, model):
        self.model, self.history = model, {}

    def prefill(self, ids, tokens):
        self.history.update({rid: t.cpu() for rid, t in zip(ids, tokens)})
        return self.last(ids)

    def decode(self, ids, tokens):
        for rid, token in zip(ids, tokens.cpu()):
            self.history[rid] = torch.cat([self.history[rid], token[None]])
        return self.last(ids)

    def remove(self, ids):
        for rid in ids:
            del self.history[rid]

    def last(self, ids):
        rows = [self.model(self.history[rid][None]).logits[0, -1] for rid in ids]
        return torch.stack(rows).float()


def rows_per_head_interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:
    """HF's rotate-half row order read as if it were interleaved (pairs (2j, 2j+1))."""
    return w.view(heads, 2, HEAD_DIM // 2, -1).transpose(1, 2).reshape(w.shape)


def swap_rotary_layout(state, config):
    for name, heads in (("q_proj", HEADS), ("k_proj", KV_HEADS)):
        for key in [k for k in state if k.endswith(f"self_attn.{name}.weight")]:
            state[key] = rows_per_head_interleaved(state[key], heads)


def transpose_o_proj(state, config):
    for key in [k for k in state if k.endswith("o_proj.weight")]:
        state[key] = state[key].T.contiguous()  # square: heads x head_dim == hidden


def swap_k_and_v(state, config):
    for key in [k for k in state if k.endswith("k_proj.weight")]:
        other = key.replace("k_proj", "v_proj")
        state[key], state[other] = state[other], state[key]


def wrong_norm_eps(state, config):
    config["rms_norm_eps"] = 1e-2  # the checkpoint's is 1e-6


def drop_biases(state, config):
    for key in [k for k in state if k.endswith(".bias")]:
        state[key] = torch.zeros_like(state[key])


def ignore_window(state, config):
    config["sliding_window"] = None


FAULTS = {
    "rotary layout swapped": ("llama", swap_rotary_layout),
    "o_proj transposed": ("llama", transpose_o_proj),
    "K and V swapped": ("llama", swap_k_and_v),
    "norm epsilon 1e-2 for 1e-6": ("llama", wrong_norm_eps),
    "q/k/v biases dropped": ("qwen2", drop_biases),
    "sliding window ignored": ("mistral-window16", ignore_window),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def faulty_model(folder, dtype, fault=None):
    """transformers' model of the folder in `dtype`, with `fault(state, config)` planted."""
    config = transformers.AutoConfig.from_pretrained(folder).to_dict()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)  # saved in float32
    state = dict(model.state_dict())
    if fault is not None:
        fault(state, config)
    planted = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config), attn_implementation="sdpa"
    )
    planted.load_state_dict(state)
    return planted.to(dtype).eval()


@pytest.fixture(scope="module")
def prepared(held_out):
    """The gate's references, built once per checkpoint and dtype (the noise gate in the dtype
    the engine computes in: a bfloat16 engine is judged in bfloat16's noise)."""
    made = {}

    def get(name, dtype_name):
        if (name, dtype_name) not in made:
            folder = held_out(name)
            config = transformers.AutoConfig.from_pretrained(folder).to_dict()
            gate = NoiseGate(dtype=dtype_name)
            made[name, dtype_name] = prepare_check(gate, config, folder, "cpu", stress_positions=48)
        return made[name, dtype_name]

    return get


def judged(prepared_check, model) -> dict:
    return check_prepared(lambda *args: HistoryEngine(model), prepared_check)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("name", sorted({name for name, _ in FAULTS.values()}))
def test_each_checkpoint_s_honest_engine_passes(held_out, prepared, name, dtype_name):
    model = faulty_model(held_out(name), DTYPES[dtype_name])
    results = judged(prepared(name, dtype_name), model)
    assert all(r["passed"] for r in results.values()), results
    assert all(r["greedy_checked"] > 0 for r in results.values())


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_fault_fails_the_gate(held_out, prepared, fault, dtype_name):
    name, plant = FAULTS[fault]
    model = faulty_model(held_out(name), DTYPES[dtype_name], plant)
    results = judged(prepared(name, dtype_name), model)
    failed = [case for case, r in results.items() if not r["passed"]]
    assert failed, f"{fault} passed: {results}"
    assert (
        "from the precise reference" in results[failed[0]]["failure"]
        or "greedy" in (results[failed[0]]["failure"])
    )


def test_our_engine_reading_hf_llama_as_interleaved_fails(
    held_out, prepared, monkeypatch, tmp_path
):
    """The engine as the search builds it (its file), honest and with the layout misread."""
    from evaluator.engine_loader import load_engine_module
    from variants.render import render_engine
    from variants.variant import Variant

    check = prepared("llama", "float32")
    engine = load_engine_module(render_engine(Variant(), tmp_path / "engine.py"))
    honest = check_prepared(engine.create_engine, check)
    assert all(r["passed"] for r in honest.values()), honest
    monkeypatch.setattr(engine, "uses_rotate_half", lambda *args: False)
    misread = check_prepared(engine.create_engine, check)
    assert not any(r["passed"] for r in misread.values()), misread
