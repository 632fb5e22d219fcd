"""Live progress of a training run: one tqdm bar on a terminal, periodic plain lines elsewhere.

```python
progress = Progress(stop, seeds, bar=sys.stderr.isatty())
for results in runner:
    progress.update(results, done=runner.done)
progress.close()
```

The bar's total is the stop criterion: `timesteps_total` when given (capped by
`training_iteration` x steps per iteration once known), else `training_iteration`; with only
a reward stop it counts timesteps with no total and no ETA (the postfix shows the reward
against its target). The ETA is the wall time so far over the progress so far (compile time
excluded: the clock starts at `Progress(...)`), times the progress left; `eta <=` when a
reward stop may end the run sooner. Postfix: env steps per second over the last chunk (all
seeds), the mean `episode_reward_mean` of the seeds still running, seeds done / total.
Plain mode prints a line for the latest iteration at most every `every_s` seconds (0: every
iteration) and the last one at `close()`.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable
from typing import IO

from jaxplan.run import Stop


def format_eta(seconds: float) -> str:
    """`83.2` -> `01:23`, `3725` -> `1:02:05` (tqdm's style); `?` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def plain_line(row: list[dict]) -> str:
    """A minimal line for one iteration's results (all seeds): what `jaxplan train` replaces
    by its own (`cli._format_line`)."""
    rewards = [r["episode_reward_mean"] for r in row if math.isfinite(r["episode_reward_mean"])]
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    r0 = row[0]
    return (
        f"iter {r0['training_iteration']:5d}  timesteps {r0['timesteps_total']:>10,}  "
        f"episode_reward_mean {mean:8.2f}"
    )


class Progress:
    """Progress of a run of `seeds` towards `stop`, fed each chunk's results (`update`).

    `bar=True`: a tqdm bar on `file` (default stderr); `bar=False`: lines on `file` (default
    stdout) through `line` (one iteration's results of all seeds -> text), at most every
    `every_s` seconds. `clock` (seconds) is for tests.
    """

    def __init__(
        self,
        stop: Stop | None,
        seeds: Iterable[int],
        *,
        bar: bool = False,
        file: IO[str] | None = None,
        every_s: float = 10.0,
        line: Callable[[list[dict]], str] = plain_line,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stop = stop or Stop()
        self.seeds = list(seeds)
        self.every_s = every_s
        self.line = line
        self.clock = clock
        self.t0 = self._t_last = clock()
        self._n0: float | None = None  # progress before the first chunk (a resumed run's)
        self._latest: dict[int, dict] = {}
        self._done: set[int] = set()
        self._last_row: list[dict] | None = None
        self._printed_at: float | None = None
        self._printed_row: list[dict] | None = None
        self.sps = float("nan")
        by_steps = self.stop.timesteps_total is not None or self.stop.training_iteration is None
        self.unit = "steps" if by_steps else "iters"
        self.bar = None
        if bar:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                file=file if file is not None else sys.stderr,
                unit=self.unit,
                unit_scale=self.unit == "steps",
                dynamic_ncols=True,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed}{postfix}]"
                if self.total is not None
                else "{n_fmt} {unit} [{elapsed}{postfix}]",
                mininterval=0,
            )
        self.file = file

    @property
    def total(self) -> float | None:
        """The progress at which the run stops (in `unit`), None if only a reward stops it."""
        stop = self.stop
        if self.unit == "iters":
            return stop.training_iteration
        if stop.timesteps_total is None and stop.training_iteration is None:
            return None
        per_iter = next(iter(self._latest.values()), {}).get("timesteps_this_iter")
        totals = [stop.timesteps_total] if stop.timesteps_total is not None else []
        if stop.training_iteration is not None and per_iter:
            totals.append(stop.training_iteration * per_iter)
        return min(totals) if totals else None

    def _position(self, r: dict) -> float:
        return r["timesteps_total"] if self.unit == "steps" else r["training_iteration"]

    @property
    def n(self) -> float:
        """The run's progress: that of the seeds still running (they run in step), the total
        once all are done."""
        live = [self._position(r) for s, r in self._latest.items() if s not in self._done]
        if live:
            return min(live)
        if self._latest:
            return (
                self.total
                if self.total is not None
                else max(self._position(r) for r in self._latest.values())
            )
        return self._n0 or 0

    @property
    def eta(self) -> float:
        """Seconds left to the stop criterion at the pace so far; NaN if unknown."""
        total, n = self.total, self.n
        if total is None or self._n0 is None or n <= self._n0:
            return float("nan")
        elapsed = self._t_last - self.t0
        return max(total - n, 0) * elapsed / (n - self._n0)

    @property
    def reward(self) -> float:
        """The mean `episode_reward_mean` of the running seeds (all seeds once all are done);
        NaN before any episode."""
        live = [r for s, r in self._latest.items() if s not in self._done] or list(
            self._latest.values()
        )
        rewards = [r["episode_reward_mean"] for r in live]
        rewards = [x for x in rewards if math.isfinite(x)]
        return sum(rewards) / len(rewards) if rewards else float("nan")

    def postfix(self) -> str:
        """`eta 01:23, 12,345 SPS, reward 123.4/475, seeds 1/4 done`."""
        parts = []
        if self.total is not None:
            sooner = "<=" if self.stop.episode_reward_mean is not None else ""
            parts.append(f"eta {sooner}{format_eta(self.eta)}")
        if math.isfinite(self.sps):
            parts.append(f"{self.sps:,.0f} SPS")
        target = self.stop.episode_reward_mean
        parts.append(f"reward {self.reward:.1f}" + (f"/{target:g}" if target is not None else ""))
        if len(self.seeds) > 1:
            parts.append(f"seeds {len(self._done)}/{len(self.seeds)} done")
        return ", ".join(parts)

    def update(self, results: list[dict], done: Iterable[int] = ()) -> None:
        """One chunk's results (iteration order, then seed order); `done`: the seeds that
        have stopped (`Runner.done`)."""
        if not results:
            return
        now = self.clock()
        if self._n0 is None:
            first = results[0]
            self._n0 = (
                first["timesteps_total"] - first["timesteps_this_iter"]
                if self.unit == "steps"
                else first["training_iteration"] - 1
            )
        steps = sum(r["timesteps_this_iter"] for r in results)
        self.sps = steps / (now - self._t_last) if now > self._t_last else float("nan")
        self._t_last = now
        for r in results:
            self._latest[r["seed"]] = r
        self._done = set(done)
        rows = [list(g) for _, g in itertools.groupby(results, lambda r: r["training_iteration"])]
        self._last_row = rows[-1]
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.n = self.n
            self.bar.set_postfix_str(self.postfix(), refresh=False)
            self.bar.refresh()
            return
        if self.every_s <= 0:  # every iteration (each with the chunk's ETA)
            for row in rows[:-1]:
                self._print(row)
        if self._printed_at is None or self.every_s <= 0 or now - self._printed_at >= self.every_s:
            self._print(rows[-1])
            self._printed_at = now

    def _print(self, row: list[dict]) -> None:
        text = self.line(row)
        if self.total is not None:
            sooner = "<=" if self.stop.episode_reward_mean is not None else ""
            text += f"  eta {sooner}{format_eta(self.eta)}"
        print(text, file=self.file if self.file is not None else sys.stdout, flush=True)
        self._printed_row = row

    def write(self, text: str, file: IO[str] | None = None) -> None:
        """Prints `text` (a warning, a note) without breaking the bar."""
        if self.bar is not None:
            from tqdm import tqdm

            tqdm.write(text, file=file or sys.stderr)
        else:
            print(text, file=file or sys.stdout, flush=True)

    def close(self) -> None:
        """Ends the bar, or prints the last iteration's line if it was not printed."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self._last_row is not None and self._printed_row is not self._last_row:
            self._print(self._last_row)
