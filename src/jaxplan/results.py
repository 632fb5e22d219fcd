"""Result files of a run: `result.jsonl`, `params.json` and `checkpoint.msgpack` in one folder.

Nothing is overwritten: an existing `result.jsonl` or `checkpoint.msgpack` is kept as
`result.N.jsonl` / `checkpoint.N.msgpack`. Lines are strict JSON (NaN and inf are `null`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def finite(x: Any) -> Any:
    """NaN/inf -> None, recursively: `episode_reward_mean` is NaN before the first episode and
    NaN is not JSON (jq and browsers reject it)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite(v) for v in x]
    return x


def keep_previous(path: Path) -> Path | None:
    """Renames an existing `NAME.SUFFIX` to the first free `NAME.N.SUFFIX`; returns the new
    path, or None when there was nothing to keep."""
    if not path.exists():
        return None
    n = 1
    while path.with_name(f"{path.stem}.{n}{path.suffix}").exists():
        n += 1
    kept = path.with_name(f"{path.stem}.{n}{path.suffix}")
    path.rename(kept)
    return kept


class ResultWriter:
    """Writes `params` to `directory/params.json` (atomically) at once, then appends results
    to `result.jsonl` (flushed and fsynced per `write`) and replaces `checkpoint.msgpack`
    atomically per `checkpoint`. Raises `OSError` when the folder cannot be written.
    `kept` lists `(old, new)` paths of files moved out of the way."""

    def __init__(self, directory: str | os.PathLike, params: dict[str, Any]):
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "result.jsonl"
        self.checkpoint_path = directory / "checkpoint.msgpack"
        self.kept: list[tuple[Path, Path]] = []
        for path in (self.path, self.checkpoint_path):
            kept = keep_previous(path)
            if kept is not None:
                self.kept.append((path, kept))
        tmp = directory / "params.json.tmp"
        tmp.write_text(json.dumps(finite(params), indent=2) + "\n")
        os.replace(tmp, directory / "params.json")
        self.path.touch()

    def write(self, results: list[dict]) -> None:
        """Appends one strict-JSON line per result."""
        if not results:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(finite(r), allow_nan=False) + "\n" for r in results))
            f.flush()
            os.fsync(f.fileno())

    def checkpoint(self, seeds: list[int], state) -> None:
        """Saves the policies (params, optimizer state, kl_coeff) and counters of `state`."""
        from jaxplan.checkpoint import save

        save(
            self.checkpoint_path,
            {"seeds": list(seeds), "policies": state.policies, "counters": state.counters},
        )
