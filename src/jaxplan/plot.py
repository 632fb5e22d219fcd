"""Learning curves of runs written by `jaxplan train --output DIR` (`jaxplan plot DIR ...`).

```python
from jaxplan.plot import load_curves, draw, save

curves = load_curves(["runs/a", "runs/b"], x="timesteps_total", y="episode_reward_mean")
save(draw(curves, x="timesteps_total", y="episode_reward_mean"), "curve.png")
```

The data part (`read_rows`, `seed_band`, `load_curves`, `labels`) is numpy only; the drawing
part (`draw`, `save`) imports matplotlib when first called (Agg canvas, no pyplot state).

How a run's seeds become one curve (`seed_band`): each seed's rows where `y` is a number (rows
where it is missing or null are skipped) give points `(x, y)`, sorted by `x` (a repeated `x`
keeps the row written last). The common grid is every seed's `x` values inside the range that
all seeds cover (from the largest first `x` to the smallest last `x`); each seed is linearly
interpolated onto it, and the mean, min and max over seeds are taken there. Seeds that share
their `x` values (one vmapped run: every seed samples the same steps per iteration) are not
interpolated at all; a seed that ran longer than another (`--stop-reward` stops each seed on its
own) is drawn only as far as the shortest one (`per_seed` keeps each seed's own points).
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

X_KEYS = ("timesteps_total", "time_total_s", "training_iteration")
FORMATS = ("png", "pdf", "svg")


@dataclasses.dataclass(frozen=True)
class Curve:
    """One run's curve: `x` [n] the common grid, `mean`, `low`, `high` [n] over its seeds;
    `per_seed` maps each seed to its own points `(x [k], y [k])`; `label` for the legend."""

    directory: Path
    label: str
    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    per_seed: dict[int, tuple[np.ndarray, np.ndarray]]
    params: dict[str, Any] | None


def result_path(run: str | os.PathLike) -> Path:
    """`DIR/result.jsonl` (or `run` itself when it is a `.jsonl` file); `ValueError` naming
    the path when it is missing."""
    run = Path(run)
    if run.is_file() and run.suffix == ".jsonl":
        return run
    if not run.exists():
        raise ValueError(f"{run}: no such folder")
    if not run.is_dir():
        raise ValueError(f"{run}: not a run folder (jaxplan train --output DIR) or a .jsonl file")
    path = run / "result.jsonl"
    if not path.is_file():
        raise ValueError(f"{run}: no result.jsonl (not a `jaxplan train --output` folder)")
    return path


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The result rows of a `result.jsonl` (a last line cut short by a run still writing is
    skipped; any other bad line is a `ValueError` naming it)."""
    path = Path(path)
    lines = path.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON line ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i + 1}: not a result object")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no results yet")
    return rows


def lookup(row: dict, key: str) -> float | None:
    """`row`'s number at the dotted `key` (`info.learner.default_policy.cur_lr`), or None when
    missing, null or not a number."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def key_paths(rows: list[dict]) -> list[str]:
    """Every dotted key path with a number in some row (sorted)."""
    out: set[str] = set()

    def walk(value, prefix):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{prefix}{k}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.add(prefix[:-1])

    for row in rows:
        walk(row, "")
    return sorted(out)


def close_keys(key: str, paths: list[str], n: int = 5) -> list[str]:
    """Key paths like `key`: close as a whole, or by the last part (`cur_lr` ->
    `info.learner.default_policy.learner_stats.cur_lr`)."""
    last = key.rsplit(".", 1)[-1]
    by_last = [p for p in paths if p.rsplit(".", 1)[-1] == last]
    whole = difflib.get_close_matches(key, paths, n=n, cutoff=0.6)
    ends = {p.rsplit(".", 1)[-1]: p for p in paths}
    near = [ends[e] for e in difflib.get_close_matches(last, list(ends), n=n, cutoff=0.7)]
    return list(dict.fromkeys(by_last + whole + near))[:n]


def seed_band(
    points: list[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seeds' points `[(x [k_i], y [k_i]), ...]` (each sorted by x, k_i >= 1) -> `(grid [n],
    mean [n], low [n], high [n])` over seeds on the common grid (module docstring)."""
    start = max(float(x[0]) for x, _ in points)
    stop = min(float(x[-1]) for x, _ in points)
    if start > stop:  # no x that every seed covers: the seeds' own points, not a band
        return (np.zeros(0),) * 4
    grid = np.unique(np.concatenate([x[(x >= start) & (x <= stop)] for x, _ in points]))
    ys = np.stack([np.interp(grid, x, y) for x, y in points])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def _seed_points(rows: list[dict], x: str, y: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    by_seed: dict[int, dict[float, float]] = {}
    for row in rows:
        xv, yv = lookup(row, x), lookup(row, y)
        if xv is not None and yv is not None:
            by_seed.setdefault(int(row.get("seed", 0)), {})[xv] = yv  # the last row wins
    out = {}
    for seed, pts in sorted(by_seed.items()):
        xs = np.array(sorted(pts))
        out[seed] = (xs, np.array([pts[v] for v in xs]))
    return out


def read_params(run: Path) -> dict[str, Any] | None:
    """The run's `params.json` (algorithm, seeds, config), or None when there is none."""
    path = (run.parent if run.is_file() else run) / "params.json"
    try:
        params = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return params if isinstance(params, dict) else None


def load_curves(
    runs: list[str | os.PathLike], x: str = "timesteps_total", y: str = "episode_reward_mean"
) -> list[Curve]:
    """One `Curve` per run folder (or `result.jsonl`), labelled by `labels`. `ValueError`
    (one line) for a missing folder or file, an `x` not in `X_KEYS`, or a `y` for which a run
    has no number (naming close key paths)."""
    if x not in X_KEYS:
        raise ValueError(f"x {x!r}: expected one of {', '.join(X_KEYS)}")
    paths = [result_path(r) for r in runs]  # every path checked before any file is read
    loaded = []
    for run, path in zip(runs, paths, strict=True):
        rows = read_rows(path)
        seeds = _seed_points(rows, x, y)
        if not seeds:
            have = key_paths(rows)
            if x not in have:
                raise ValueError(f"{path}: no row has a number at {x!r}")
            close = close_keys(y, have)
            hint = (
                f"close key paths: {', '.join(close)}"
                if close
                else (f"top-level keys with numbers: {', '.join(k for k in have if '.' not in k)}")
            )
            raise ValueError(f"--y {y}: no row of {path} has a number there; {hint}")
        loaded.append((Path(run), seeds, read_params(Path(run))))
    names = labels([(d, p) for d, _, p in loaded])
    return [
        Curve(d, name, *seed_band(list(seeds.values())), per_seed=seeds, params=p)
        for (d, seeds, p), name in zip(loaded, names, strict=True)
    ]


def _flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(config, dict) and config:
        out = {}
        for k, v in config.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: config}


def _show(value: Any, width: int = 32) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def labels(runs: list[tuple[Path, dict | None]], max_keys: int = 3) -> list[str]:
    """Legend labels of runs `[(directory, params or None)]`: the config keys whose values
    differ between the runs (`lr=0.001, gamma=0.9`; `env` first, at most `max_keys`, then `+N`);
    one run: its algorithm and env; the folder name where there is no difference or no
    params. Labels that would repeat get the folder name added."""
    configs = [_flatten((p or {}).get("config", {})) if p else None for _, p in runs]
    if len(runs) == 1:
        (d, p), c = runs[0], configs[0]
        return ["{} on {}".format(*_algorithm_env(p)) if c and "env" in c else _name(d)]
    known = [c for c in configs if c is not None]
    keys = sorted({k for c in known for k in c})
    differ = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in known}) > 1]
    differ.sort(key=lambda k: (k != "env", k))
    out = []
    for (d, _), c in zip(runs, configs, strict=True):
        if c is None or not differ:
            out.append(_name(d))
            continue
        shown = [f"{k}={_show(c.get(k))}" for k in differ[:max_keys]]
        more = f", +{len(differ) - max_keys} more" if len(differ) > max_keys else ""
        out.append(", ".join(shown) + more)
    counts = {s: out.count(s) for s in out}
    return [
        f"{s} ({_name(d)})" if counts[s] > 1 else s for s, (d, _) in zip(out, runs, strict=True)
    ]


def _name(directory: Path) -> str:
    return directory.parent.name if directory.suffix == ".jsonl" else directory.name


def check_output(path: str | os.PathLike) -> str:
    """The format of output `path` from its suffix (`FORMATS`); `ValueError` when unknown or
    its folder does not exist."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"-o {path}: the format comes from the suffix: .png, .pdf or .svg")
    if not path.parent.is_dir():
        raise ValueError(f"-o {path}: no such folder {path.parent}")
    return fmt


def draw(
    curves: list[Curve],
    x: str = "timesteps_total",
    y: str = "episode_reward_mean",
    *,
    title: str | None = None,
    size: tuple[float, float] = (6.4, 4.0),
    dpi: int = 100,
    per_seed: bool = False,
):
    """A matplotlib `Figure` of `size` inches at `dpi`: per curve its mean (a line, colour Ci)
    and min-max band over seeds (`fill_between`, drawn when there are 2+ seeds), and with
    `per_seed` each seed's own points as thin lines. `title` defaults to the runs' common
    algorithm and env."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    for i, c in enumerate(curves):
        color = f"C{i % 10}"
        n = len(c.per_seed)
        seeds = f"{n} seed{'s' if n > 1 else ''}"
        ax.plot(c.x, c.mean, color=color, lw=1.5, label=f"{c.label} ({seeds})")
        if n > 1:
            ax.fill_between(c.x, c.low, c.high, color=color, alpha=0.2, lw=0)
        if per_seed:
            for xs, ys in c.per_seed.values():
                ax.plot(xs, ys, color=color, lw=0.6, alpha=0.5)
    if title is None:
        pairs = {_algorithm_env(c.params) for c in curves}
        if len(pairs) == 1 and None not in (pair := pairs.pop()):
            title = "{} on {}".format(*pair)
    if title:
        ax.set_title(title, fontsize=10)
    ax.set_xlabel({"timesteps_total": "env steps", "time_total_s": "seconds"}.get(x, x))
    ax.set_ylabel(y)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _algorithm_env(params: dict | None) -> tuple[Any, Any]:
    params = params or {}
    config = params.get("config")
    return params.get("algorithm"), config.get("env") if isinstance(config, dict) else None


def save(fig, path: str | os.PathLike) -> Path:
    """Writes `fig` to `path` in the format of its suffix, atomically (temp + rename): an
    existing file is replaced whole or not at all."""
    from jaxplan.checkpoint import write_bytes

    fmt = check_output(path)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    return write_bytes(path, buf.getvalue())
