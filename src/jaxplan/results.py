"""Result files of a run: `result.jsonl`, `params.json` and `checkpoint.msgpack` in one folder.

Nothing is overwritten: an existing `result.jsonl` or `checkpoint.msgpack` is kept as
`result.N.jsonl` / `checkpoint.N.msgpack` (a resumed run appends to them instead). Lines are
strict JSON (NaN and inf are `null`). The checkpoint is the whole run state (every `PlanState`
leaf: policies, actor groups and env states, stage state, episode windows, counters, key; per
seed), with the run's params and the library version, so a run continues exactly
(`Runner(..., resume=True)`, `jaxplan train ... --resume DIR`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from flax import serialization

from jaxplan.checkpoint import save


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

    def __init__(self, directory: str | os.PathLike, params: dict[str, Any], *, resume=False):
        directory = Path(directory)
        self.path = directory / "result.jsonl"
        self.checkpoint_path = directory / "checkpoint.msgpack"
        self.params = params
        self.kept: list[tuple[Path, Path]] = []
        if resume:  # append to the run's files; params.json stays as the run wrote it
            return
        directory.mkdir(parents=True, exist_ok=True)
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

    def checkpoint(self, seeds: list[int], state, elapsed_s: float = 0.0) -> None:
        """Saves the whole run state `state` (host arrays, leading seed axis with several
        seeds) with the seeds, the params, the library version and the training seconds so
        far (`time_total_s` goes on from them after a resume)."""
        from jaxplan import __version__

        save(
            self.checkpoint_path,
            {
                "jaxplan_version": __version__,
                "params": json.dumps(finite(self.params), sort_keys=True),
                "seeds": list(seeds),
                "elapsed_s": float(elapsed_s),
                "state": state,
            },
        )


def read_checkpoint(directory: str | os.PathLike) -> dict[str, Any]:
    """The raw contents of `directory/checkpoint.msgpack` (`jaxplan_version`, `params` (a
    dict), `seeds`, `state` as nested dicts of arrays). Raises `ValueError` naming the file
    when it is missing or not a run checkpoint."""
    path = Path(directory) / "checkpoint.msgpack"
    if not path.is_file():
        raise ValueError(f"cannot resume: no checkpoint at {path}")
    raw = serialization.msgpack_restore(path.read_bytes())
    if not isinstance(raw, dict) or not {"jaxplan_version", "params", "state"} <= set(raw):
        raise ValueError(
            f"cannot resume from {path}: not a whole-run checkpoint (written by an older "
            "jaxplan that kept only policies and counters)"
        )
    return {**raw, "params": json.loads(raw["params"])}


def differences(saved: Any, now: Any, prefix: str = "") -> list[str]:
    """`key: saved -> now` for every leaf where two nested dicts differ."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out = []
        for key in sorted(set(saved) | set(now), key=str):
            out += differences(saved.get(key), now.get(key), f"{prefix}{key}.")
        return out
    return [] if saved == now else [f"{prefix[:-1]}: {saved!r} -> {now!r}"]
