"""Which model to tune: `/target` on the grading machine, else the public copy in `target/`.

Missing weights are generated as the course's public toy weights, except for `/target`: the
hidden model's weights are never made up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from evaluator.engine_loader import default_target_paths, load_model_config
from search.trial import REPO_ROOT
from variants.checkpoint.formats import find_weight_file

log = logging.getLogger(__name__)


@dataclass
class Target:
    config_path: Path
    weight_dir: Path
    config: dict
    notes: list[str]

    def describe(self) -> dict:
        return {
            "model_config": str(self.config_path),
            "weight_dir": str(self.weight_dir),
            "notes": "; ".join(self.notes) or "-",
            "config": self.config,
        }


def has_weight_file(folder: Path) -> bool:
    """Whether the engine's loader finds weights there (model.pt, model.safetensors, ...): toy
    weights must never shadow a user's model. Several candidates raise the loader's error."""
    try:
        find_weight_file(folder)
    except FileNotFoundError:
        return False
    return True


def resolve_target(model_config: str | None, weight_dir: str | None) -> Target:
    default_config, default_weights = default_target_paths(REPO_ROOT)
    config_path = Path(model_config) if model_config else default_config
    weights = Path(weight_dir) if weight_dir else default_weights
    notes = []
    if model_config is None:
        notes.append(f"model config found at {config_path}")
    config = load_model_config(config_path)
    if not has_weight_file(weights):
        if weights.resolve().is_relative_to(Path("/target")):
            raise FileNotFoundError(f"no weights in {weights}: the target's weights are missing")
        from evaluator.toy_weights import save_toy_weights

        save_toy_weights(config, weights / "model.pt", seed=1234)
        notes.append(f"generated the public toy weights (seed 1234) into {weights}")
        log.info("generated toy weights into %s", weights)
    return Target(config_path.resolve(), weights.resolve(), config, notes)
