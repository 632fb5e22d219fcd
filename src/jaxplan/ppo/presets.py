"""Tuned PPO presets per env, kept as data in `presets.yaml` beside this module.

`PRESETS[env_id]` is an RLlib-style dict of config overrides that `preset_config` applies on
top of RLlib's defaults (top-level YAML keys starting with `_` are shared blocks, not envs).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

PRESETS_FILE = Path(__file__).with_name("presets.yaml")


def load_presets(path: str | Path = PRESETS_FILE) -> dict[str, dict]:
    """Env id -> overrides, from a YAML mapping (anchors and `<<` merges resolved)."""
    data = yaml.safe_load(Path(path).read_text())
    return {env: copy.deepcopy(dict(v)) for env, v in data.items() if not env.startswith("_")}


PRESETS: dict[str, dict[str, Any]] = load_presets()
"""Env id -> config overrides (RLlib-style dict) that `preset_config` applies."""
