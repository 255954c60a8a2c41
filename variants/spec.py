"""ModelSpec: the validated model config, the one place that reads `model_config.json` keys.

It reads the course's keys; a missing or inconsistent one is an error that names it. A Hugging
Face config is first given the course's keys (`course_keys`: `dtype`, `rope_parameters`,
LLaMA's defaults, its architecture's parts, refusals by name).
"""

from dataclasses import dataclass, field

import torch

from variants.checkpoint.hf_config import course_keys

# ModelSpec's sizes and counts, each read from its required config key
SIZE_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size", "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim", "max_positions": "max_position_embeddings",
}  # fmt: skip
# torch_dtype's names (and the variants' dtype names) -> the dtype
DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
DTYPES |= {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
DTYPES |= {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


def dtype_from_name(name: str) -> torch.dtype:
    key = str(name).replace("torch.", "").lower()
    if key not in DTYPES:
        raise ValueError(f"unsupported torch_dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[key]


@dataclass(frozen=True)
class ModelSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    rms_norm_eps: float
    rope_theta: float
    config_dtype: torch.dtype
    # The architecture's parts beyond LLaMA's (the config reader's table fills them in): biases on
    # the q, k and v projections (Qwen2), an RMSNorm over each head of q and k before RoPE
    # (Qwen3), attention to the last `sliding_window` positions only (Mistral), and Llama 3.x's
    # rescaled RoPE frequencies (factor, low and high frequency factors, original positions).
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    rope_scaling: tuple | None = None
    # the config as given: what a checkpoint reader may need of it (a tied head, for one)
    config: dict | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_config(cls, config: dict) -> "ModelSpec":
        if not isinstance(config, dict):
            raise TypeError(f"model_config must be a dict, got {type(config).__name__}")
        keys = course_keys(config)
        if missing := [key for key in SIZE_KEYS.values() if key not in keys]:
            raise ValueError(f"model_config is missing required key(s): {', '.join(missing)}")
        return cls(
            **{name: int(keys[key]) for name, key in SIZE_KEYS.items()},
            rms_norm_eps=float(keys.get("rms_norm_eps", 1e-5)),
            rope_theta=float(keys.get("rope_theta", 10000.0)),
            config_dtype=dtype_from_name(keys.get("torch_dtype") or "float16"),
            qkv_bias=bool(keys.get("qkv_bias", False)),
            qk_norm=bool(keys.get("qk_norm", False)),
            sliding_window=keys.get("sliding_window"),
            rope_scaling=keys.get("rope_scaling"),
            config=config,
        )

    def __post_init__(self) -> None:
        """Every size and count positive, the heads grouped evenly, a rotary head."""
        for name in SIZE_KEYS:
            if (value := getattr(self, name)) <= 0:
                raise ValueError(f"model_config: {name} must be positive, got {value}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"model_config: rope_theta must be positive, got {self.rope_theta}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(
                f"model_config: sliding_window must be positive, got {self.sliding_window}"
            )

    def compute_dtype(self, device: torch.device | str) -> torch.dtype:
        """The reference's rule: the config dtype on CUDA (float16 or bfloat16), float32 on CPU."""
        if torch.device(device).type != "cuda":
            return torch.float32
        return torch.bfloat16 if self.config_dtype == torch.bfloat16 else torch.float16

    @property
    def tie_word_embeddings(self) -> bool:
        """The head is the embedding: a Hugging Face config's `tie_word_embeddings`."""
        return bool((self.config or {}).get("tie_word_embeddings", False))

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of one token over all layers."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize
