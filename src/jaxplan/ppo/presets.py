"""Tuned PPO presets per env, kept as data in `presets.yaml` beside this module.

`PRESETS[env_id]` is an RLlib-style dict of config overrides that `preset_config` applies on
top of RLlib's defaults (top-level YAML keys starting with `_` are shared blocks, not envs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxplan.config import load_presets

PRESETS_FILE = Path(__file__).with_name("presets.yaml")

PRESETS: dict[str, dict[str, Any]] = load_presets(PRESETS_FILE)
"""Env id -> config overrides (RLlib-style dict) that `preset_config` applies."""
