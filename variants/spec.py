"""ModelSpec: the validated model config, the one place that reads `model_config.json` keys.

A missing or inconsistent key is an error that names it; `head_dim` defaults to hidden/heads.
Hugging Face LLaMA configs are read too (`dtype` for `torch_dtype`, `rope_parameters`), and
what the engine cannot compute (biases, scaled RoPE, another activation) is refused by name.
"""

import dataclasses
from dataclasses import dataclass

import torch

_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)
_HALF_NAMES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
_BF16_NAMES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_F32_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


def dtype_from_name(name: str) -> torch.dtype:
    table = {**_HALF_NAMES, **_BF16_NAMES, **_F32_NAMES}
    key = str(name).replace("torch.", "").lower()
    if key not in table:
        raise ValueError(f"unsupported torch_dtype {name!r}; expected one of {sorted(table)}")
    return table[key]


def config_dtype_name(config: dict) -> str:
    """`torch_dtype`, or `dtype` as transformers >= 4.56 writes it; float16 when neither."""
    for key in ("torch_dtype", "dtype"):
        if config.get(key) is not None:
            return str(config[key])
    return "float16"


def rope_theta_of(config: dict) -> float:
    """`rope_theta`, or `rope_parameters["rope_theta"]` (transformers 5); only unscaled RoPE."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for source, table in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(table, dict):
            raise ValueError(f"model_config: {source} must be an object, got {table!r}")
        kind = table.get("rope_type", table.get("type", "default"))
        if kind not in (None, "default"):
            raise ValueError(
                f"model_config: {source} type {kind!r} is not supported (only plain RoPE)"
            )
    given = (config.get("rope_theta"), params.get("rope_theta"))
    thetas = {float(t) for t in given if t is not None}
    if len(thetas) > 1:
        raise ValueError(f"model_config: rope_theta and rope_parameters disagree: {sorted(thetas)}")
    return thetas.pop() if thetas else 10000.0


def check_supported_features(config: dict) -> None:
    """Refuse configs whose model differs from the one the engine computes."""
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"model_config: hidden_act {act!r} is not supported (only silu)")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise ValueError(f"model_config: {key} is true; layers with biases are not supported")


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
    tie_word_embeddings: bool = False
    # the config as given: what a checkpoint reader may need of it (checkpoint/hf_llama.py)
    config: dict | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def from_config(cls, config: dict) -> "ModelSpec":
        if not isinstance(config, dict):
            raise TypeError(f"model_config must be a dict, got {type(config).__name__}")
        missing = [k for k in _REQUIRED if k not in config]
        if missing:
            raise ValueError(f"model_config is missing required key(s): {', '.join(missing)}")
        check_supported_features(config)
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads", heads))
        hidden = int(config["hidden_size"])
        head_dim = config.get("head_dim")
        if head_dim is None:
            if heads <= 0 or hidden % heads:
                raise ValueError(
                    f"head_dim is absent and hidden_size {hidden} is not divisible by "
                    f"num_attention_heads {heads}"
                )
            head_dim = hidden // heads
        spec = cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(head_dim),
            max_positions=int(config["max_position_embeddings"]),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
            rope_theta=rope_theta_of(config),
            config_dtype=dtype_from_name(config_dtype_name(config)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            config=config,
        )
        spec.check()
        return spec

    def check(self) -> None:
        for field in dataclasses.fields(self):  # every size and count
            if field.type in (int, "int") and getattr(self, field.name) <= 0:
                value = getattr(self, field.name)
                raise ValueError(f"model_config: {field.name} must be positive, got {value}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"model_config: rope_theta must be positive, got {self.rope_theta}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    def compute_dtype(self, device: torch.device | str) -> torch.dtype:
        """The reference's rule: the config dtype on CUDA (float16 or bfloat16), float32 on CPU."""
        if torch.device(device).type != "cuda":
            return torch.float32
        return torch.bfloat16 if self.config_dtype == torch.bfloat16 else torch.float16

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """K and V of one token over all layers."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize
