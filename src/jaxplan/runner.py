"""Train a plan in compiled chunks until each seed stops: the loop behind `jaxplan train`.

```python
import jaxplan
from jaxplan.runner import Runner

plan = jaxplan.ppo_plan(env="CartPole-v1")
runner = Runner(plan, seeds=[0, 1], stop=jaxplan.Stop(episode_reward_mean=475), chunk=10,
                output="runs/cartpole")          # optional: result.jsonl, checkpoint.msgpack
print(f"compiled in {runner.compile().compile_s:.1f} s")
for results in runner:                           # one list per chunk: iterations x live seeds
    for r in results:
        print(r["seed"], r["training_iteration"], r["episode_reward_mean"])
# or: results = runner.run(on_results=print)     # every result, each chunk's list as it comes
```
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan import distributed
from jaxplan.flow import Plan
from jaxplan.results import ResultWriter
from jaxplan.run import Stop, run_iterations


def enable_compile_cache(directory: str | os.PathLike | None = None) -> None:
    """Persistent XLA compilation cache in `directory` (default `$JAXPLAN_CACHE_DIR`, else
    `~/.cache/jaxplan/xla`): a second run with the same shapes skips compiling."""
    if directory is None:
        default = Path.home() / ".cache" / "jaxplan" / "xla"
        directory = os.environ.get("JAXPLAN_CACHE_DIR", str(default))
    try:
        jax.config.update("jax_compilation_cache_dir", str(directory))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    except Exception:  # noqa: BLE001 - the cache is an optimisation only
        pass


class Runner:
    """Runs `plan` for `seeds` in chunks of `chunk` iterations (one AOT-compiled program,
    vmapped over the seeds when there are several) until `stop` is met for every seed; each
    seed stops on its own. Iterating yields, per chunk, the host results (`plan.report` dicts
    plus `seed`, `time_this_iter_s`, `time_total_s`,
    `num_env_steps_sampled_throughput_per_sec`) of the iterations each seed still ran, in
    iteration order then seed order. Without `stop` it never ends (break out of the loop).

    With `output` (and `writes`, default: this is process 0) results are appended to
    `output/result.jsonl` per chunk, `params` (default `{"seeds": seeds}`) go to
    `params.json` and the latest policies and counters to `checkpoint.msgpack`. On a mesh every
    process checks after each chunk that the policies are replicated bitwise.

    `state` is the latest `PlanState` (leading seed axis when there are several seeds),
    `last` maps each seed to its latest result and `done` lists the seeds that stopped.
    """

    def __init__(
        self,
        plan: Plan,
        seeds: Iterable[int] = (0,),
        stop: Stop | None = None,
        chunk: int = 10,
        output: str | os.PathLike | None = None,
        params: dict[str, Any] | None = None,
        writes: bool | None = None,
    ):
        self.plan = plan
        self.seeds = [int(s) for s in seeds]
        if not self.seeds:
            raise ValueError("Runner needs at least one seed")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.stop = stop
        self.chunk = chunk
        writes = distributed.is_writer() if writes is None else writes
        self.writer = None
        if output is not None and writes:
            self.writer = ResultWriter(output, {"seeds": self.seeds} if params is None else params)
        self.state = None
        self.compile_s: float | None = None
        self.last: dict[int, dict] = {}
        self.done: list[int] = []
        self._chunk_fn = None
        self._elapsed = 0.0

    def compile(self) -> Runner:
        """AOT-compiles `init` and one chunk, and initializes the state (once)."""
        if self._chunk_fn is not None:
            return self
        plan, stop, n = self.plan, self.stop, self.chunk

        def run_chunk(state):
            return run_iterations(plan, state, n, stop)

        t0 = time.perf_counter()
        # host arrays: in a multi-process run every process passes the same (replicated) keys
        keys = np.asarray(jax.vmap(jax.random.PRNGKey)(jnp.asarray(self.seeds, jnp.uint32)))
        if len(self.seeds) > 1:  # a vmap of one seed would cost compile time for nothing
            init = jax.jit(jax.vmap(plan.init)).lower(keys).compile()
            compiled = jax.jit(jax.vmap(run_chunk), donate_argnums=0)
            self._chunk_fn = compiled.lower(init.out_info).compile()
            self.state = init(keys)
        else:
            init = jax.jit(plan.init).lower(keys[0]).compile()
            compiled = jax.jit(run_chunk, donate_argnums=0).lower(init.out_info).compile()

            def chunk_fn(state):
                state, results = compiled(state)
                return state, jax.tree.map(lambda x: x[None], results)

            self._chunk_fn = chunk_fn
            self.state = init(keys[0])
        self.compile_s = time.perf_counter() - t0
        return self

    def __iter__(self) -> Iterator[list[dict]]:
        self.compile()
        while len(self.done) < len(self.seeds):
            yield self._run_chunk()

    def run(self, on_results: Callable[[list[dict]], Any] | None = None) -> list[dict]:
        """Runs to the end; calls `on_results` with each chunk's results; returns them all."""
        out = []
        for results in self:
            if on_results is not None:
                on_results(results)
            out.extend(results)
        return out

    def _run_chunk(self) -> list[dict]:
        t0 = time.perf_counter()
        self.state, stacked = self._chunk_fn(self.state)
        stacked = jax.device_get(stacked)
        per_iter = (time.perf_counter() - t0) / self.chunk
        out = []
        for i in range(self.chunk):
            for s, seed in enumerate(self.seeds):
                if seed in self.done:
                    continue
                r = self.plan.report(jax.tree.map(lambda x, s=s, i=i: x[s, i], stacked))
                if r.pop("done", False):
                    self.done.append(seed)
                r.update(
                    seed=seed,
                    time_this_iter_s=per_iter,
                    time_total_s=self._elapsed + (i + 1) * per_iter,
                    num_env_steps_sampled_throughput_per_sec=r["timesteps_this_iter"] / per_iter,
                )
                self.last[seed] = r
                out.append(r)
        self._elapsed += self.chunk * per_iter
        if self.plan.workers.mesh is not None:  # collective: every process, every chunk
            distributed.check_replicated(self.state.policies, "policies")
        if self.writer is not None:
            self.writer.write(out)
            self.writer.checkpoint(self.seeds, self.state)
        return out
