"""The course's own `model_config.json`: the keys the course's contract lists, read as they are
(this engine was written for a config that holds those keys alone; a Hugging Face config needs
an engine written for one); any other key, which might change the model, is refused by name,
never ignored."""

from variants.spec import SIZE_KEYS

# the course's keys besides the required ones (ModelSpec's defaults, or not read)
OPTIONAL_KEYS = ("rms_norm_eps", "rope_theta", "torch_dtype", "model_type", "architectures")


def course_keys(config: dict) -> dict:
    for key in config:
        if key not in OPTIONAL_KEYS and key not in SIZE_KEYS.values():
            raise ValueError(
                f"model_config: {key!r} is not one of the course's config keys, which alone this "
                "engine reads; write an engine for this config (run.sh --model-config)"
            )
    return config
