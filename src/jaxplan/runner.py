"""Train a plan in compiled chunks until each seed stops: the loop behind `jaxplan train`.

```python
import jaxplan
from jaxplan.runner import Runner

plan = jaxplan.ppo_plan(env="CartPole-v1")
runner = Runner(plan, seeds=[0, 1], stop=jaxplan.Stop(episode_reward_mean=475), chunk=10,
                output="runs/cartpole")          # optional: result.jsonl, checkpoints
print(f"compiled in {runner.compile().compile_s:.1f} s")
with runner:                                     # releases the folder's lock at the end
    for results in runner:                       # one list per chunk: iterations x live seeds
        for r in results:
            print(r["seed"], r["training_iteration"], r["episode_reward_mean"])
# or: results = runner.run(on_results=print)     # every result, each chunk's list as it comes
```
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization
from jax.experimental import multihost_utils
from jax.extend import core as jax_core
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxplan import distributed
from jaxplan import loggers as _loggers
from jaxplan.compiler import compiler_options
from jaxplan.fast_rng import unrolled_threefry
from jaxplan.flow import Plan
from jaxplan.results import (
    ResultWriter,
    differences,
    finite,
    read_checkpoint,
    with_empty_fields,
)
from jaxplan.run import Stop, run_iterations
from jaxplan.seed_devices import SEED_AXIS, pad_seeds, padded_seeds, seed_mesh, spread_seeds

_DEVICE_KEYS = ("config.num_devices", "config.num_gpus", "config._fake_gpus")
"""Params a resumed run may change: the run's data do not depend on the device layout."""


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


class NonFiniteTraining(RuntimeError):
    """Training stopped: updates were non-finite for `max_nonfinite_iters` iterations in a row."""


def _finite_policies(policies: Any) -> bool:
    """Every float leaf of the policies (params, optimizer state, kl_coeff) is finite."""
    return all(
        np.all(np.isfinite(x))
        for x in jax.tree.leaves(policies)
        if np.issubdtype(np.asarray(x).dtype, np.inexact)
    )


def estimate_bytes(jaxpr: Any, state: Any) -> tuple[int, int]:
    """`(state bytes, largest value's bytes)` of a traced program: its state, and the largest
    output of any one operation inside it (the train batch, typically), from shapes only."""

    def nbytes(avals):
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in avals if hasattr(a, "shape"))

    largest = 0
    todo = [jaxpr.jaxpr if hasattr(jaxpr, "jaxpr") else jaxpr]
    while todo:
        for eqn in todo.pop().eqns:
            largest = max(largest, nbytes(v.aval for v in eqn.outvars))
            for sub in jax_core.jaxprs_in_params(eqn.params):
                todo.append(sub)
    return nbytes(jax.tree.leaves(state)), largest


def available_bytes(workers: Any) -> int | None:
    """Memory the run may use: the host's MemAvailable on CPU, else the devices' limits."""
    devices = list(workers.mesh.devices.flat) if workers.mesh is not None else [jax.devices()[0]]
    if devices[0].platform == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices]
    return None if None in limits else sum(limits)


def check_memory(jaxpr: Any, state: Any, workers: Any) -> None:
    """Refuses, before compiling, a program whose state plus twice its largest value (the
    train batch and a copy) cannot fit in `available_bytes`."""
    state_bytes, largest = estimate_bytes(jaxpr, state)
    need, have = state_bytes + 2 * largest, available_bytes(workers)
    if have is not None and need > have:
        gib = 2.0**30
        raise ValueError(
            f"the run needs about {need / gib:.1f} GiB (state {state_bytes / gib:.1f} GiB + 2 x "
            f"its largest buffer, {largest / gib:.1f} GiB), more than the {have / gib:.1f} GiB "
            f"available; {workers.num_actor_groups} actor groups x "
            f"{workers.num_envs_per_worker} envs x {workers.rollout_fragment_length} steps: "
            "use fewer envs (num_workers, num_envs_per_worker), a shorter "
            "rollout_fragment_length or a smaller train_batch_size"
        )


def _default_params(params: dict) -> dict:
    """`{"config": <the algorithm's default config as JSON>}` for a run's params naming its
    algorithm (`{}` otherwise): what a config key missing from an older checkpoint means."""
    try:
        from jaxplan.algorithms import get_algorithm

        config = get_algorithm(params["algorithm"]).config_class().to_dict()
    except (KeyError, TypeError, ValueError):
        return {}
    return {"config": json.loads(json.dumps(finite(config), sort_keys=True))}


class Runner:
    """Runs `plan` for `seeds` in chunks of `chunk` iterations (one AOT-compiled program,
    vmapped over the seeds when there are several) until `stop` is met for every seed; each
    seed stops on its own. Iterating yields, per chunk, the host results (`plan.report` dicts
    plus `seed`, `time_this_iter_s`, `time_total_s`,
    `num_env_steps_sampled_throughput_per_sec`) of the iterations each seed still ran, in
    iteration order then seed order. Without `stop` it never ends (break out of the loop).

    With `output` (and `writes`, default: this is process 0) results are appended to
    `output/result.jsonl` per chunk, `params` (default `{"seeds": seeds}`) go to
    `params.json` and the whole run state to `checkpoint.msgpack`, the last
    `keep_checkpoints` chunks' and the best one to `checkpoints/` (`jaxplan.results`: the
    layout, the folder's lock, earlier runs' files kept, write errors). The lock is taken at
    once (a second run on the folder raises `FolderInUse`) and released when the run ends or
    on `close()` (or leaving a `with runner:` block). On a mesh every process checks after
    each chunk that the policies are replicated bitwise.

    Programs are compiled with `jaxplan.compiler_options()` and, for several seeds, lowered
    with the unrolled threefry (`jaxplan.fast_rng`; the same random numbers). Several seeds
    are split over the devices where there are several (`jaxplan.seed_devices`; on the CPU
    after `use_cpu_devices()`); `seed_mesh` is that mesh, else None.

    `state` is the latest `PlanState` (leading seed axis when there are several seeds),
    `last` maps each seed to its latest result and `done` lists the seeds that stopped.

    With `resume` (and `output`), the run in `output` continues from its checkpoint (the
    whole state of every seed) instead of from `plan.init`, appending to its `result.jsonl`:
    N iterations, then a resumed run, write the rows one longer run writes (wall-clock fields
    aside). The checkpoint's params (config, seeds) and library version must be this run's;
    only the device settings may differ. Seeds whose checkpointed state already meets `stop`
    are done at once. In a multi-process run every process reads the checkpoint and places
    it onto the global shardings.

    An update whose loss, gradients or new params are not finite is skipped inside the step
    (`learner_stats.num_nonfinite_updates`, `first_nonfinite_stat`); once a seed has
    `max_nonfinite_iters` iterations in a row with skipped updates (None: never), iterating
    raises `NonFiniteTraining` naming the seed, the iteration and the statistic, after
    writing that chunk (the params are the last finite ones). Before compiling, a program
    whose buffers cannot fit in memory is refused with the estimate (`check_memory`).

    `loggers` (`jaxplan.loggers`) is exactly where results go besides the checkpoints, like
    Tune's `loggers` (it replaces the defaults): built-in names (`"json"`, `"csv"`,
    `"tensorboard"`; default all three with `output`, none without) and your own loggers,
    objects with `on_result(result)` (optionally `flush()` per chunk, `close()`) or callables
    of the result, e.g. `loggers=[*jaxplan.loggers.DEFAULT_LOGGERS, wandb_log]`. Each gets
    every host result (one per seed per iteration, as yielded), after the chunk's files are
    written, in the writing process only; one that raises stops the run with `LoggerError`
    naming it, the seed and the iteration (the files stay whole and the run resumable).
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
        resume: bool = False,
        keep_checkpoints: int = 3,
        max_nonfinite_iters: int | None = 3,
        loggers: Iterable[str | _loggers.Logger | Callable[[dict], Any]] | None = None,
    ):
        self.plan = plan
        self.seed_mesh: Mesh | None = None
        self.seeds = [int(s) for s in seeds]
        if not self.seeds:
            raise ValueError("Runner needs at least one seed")
        bad = [s for s in self.seeds if not 0 <= s < 2**32]
        if bad:
            raise ValueError(f"seeds must be in [0, 2**32) (PRNG keys are uint32), got {bad}")
        if max_nonfinite_iters is not None and max_nonfinite_iters < 1:
            raise ValueError(f"max_nonfinite_iters must be >= 1 or None, got {max_nonfinite_iters}")
        self.max_nonfinite_iters = max_nonfinite_iters
        self._nonfinite_streak = dict.fromkeys(self.seeds, 0)
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        if resume and output is None:
            raise ValueError("resume needs the output folder of the run to continue")
        self.stop = stop
        self.chunk = chunk
        self.output = output
        self.params = {"seeds": self.seeds} if params is None else params
        self.resume = resume
        writes = distributed.is_writer() if writes is None else writes
        if loggers is None:
            loggers = _loggers.DEFAULT_LOGGERS if output is not None else ()
        loggers = list(loggers)
        names = _loggers.check_names(x for x in loggers if isinstance(x, str))
        if names and output is None:
            raise ValueError(
                f"loggers {', '.join(map(repr, names))} write into output; give output=DIR"
            )
        custom = [_loggers.as_logger(x) for x in loggers if not isinstance(x, str)]
        self.writer = None
        if output is not None and writes:  # the lock first: a busy folder is refused at once
            self.writer = ResultWriter(
                output,
                self.params,
                keep_checkpoints=keep_checkpoints,
                results_file="json" in names,
            )
        try:
            self._saved = self._check_checkpoint() if resume else None
        except BaseException:
            self.close()
            raise
        if self.writer is not None and self._saved is not None:
            self.writer.resume_from(self._saved)
        self.loggers = (self._file_loggers(names) if self.writer is not None else []) + (
            custom if writes else []
        )
        """Every logger the results go to, built-in ones first (empty where not `writes`)."""
        self._logged = False
        self._state = None  # on the device; its seed axis padded to `_length` (seed_devices)
        self._length = len(self.seeds)
        self.compile_s: float | None = None
        self.last: dict[int, dict] = {}
        self.done: list[int] = []
        self._chunk_fn = None
        self._elapsed = 0.0

    def close(self) -> None:
        """Closes the loggers that got results since the last close, then releases the output
        folder's lock (the run's files stay as written)."""
        try:
            if getattr(self, "_logged", False):
                self._logged = False
                _loggers.close_all(self.loggers)
        finally:
            if self.writer is not None:
                self.writer.close()

    def _file_loggers(self, names: list[str]) -> list:
        """The csv and tensorboard loggers in `output`; on resume the CSV is rebuilt from the
        result.jsonl rows up to the checkpoint (when the run has that file)."""
        out, directory = [], Path(self.output)
        if "csv" in names:
            history = None
            size = (self._saved or {}).get("result_bytes")
            jsonl = directory / "result.jsonl"
            if self._saved is not None and size is not None and jsonl.exists():

                def history(jsonl=jsonl, size=int(size)):
                    with open(jsonl, "rb") as f:
                        lines = f.read(size).decode().splitlines()
                    return [json.loads(line) for line in lines if line.strip()]

            out.append(_loggers.CsvLogger(directory / "progress.csv", history=history))
        if "tensorboard" in names:
            out.append(_loggers.TensorBoardLogger(directory / "tb", resume=self.resume))
        return out

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_checkpoint(self) -> dict:
        """Reads the checkpoint to resume from and checks, before any compile, that it is
        this run's: same library version, same params (config, seeds) up to device settings."""
        from jaxplan import __version__

        try:
            raw = read_checkpoint(self.output)
        except ValueError as e:
            raise ValueError(f"cannot resume: {e}") from None
        if raw["jaxplan_version"] != __version__:
            raise ValueError(
                f"cannot resume: the checkpoint was written by jaxplan "
                f"{raw['jaxplan_version']}, this is {__version__}"
            )
        now = json.loads(json.dumps(finite(self.params), sort_keys=True))
        # a config key the checkpoint lacks was added to jaxplan after it was written: at its
        # default (the resumed config's value) it keeps the old behaviour
        diff = [
            d
            for d in differences(raw["params"], now, defaults=_default_params(now))
            if d.split(":")[0] not in _DEVICE_KEYS
        ]
        if diff:
            raise ValueError("cannot resume: the checkpoint is of another run; " + "; ".join(diff))
        return raw

    def compile(self) -> Runner:
        """AOT-compiles `init` and one chunk, and initializes the state (once)."""
        if self._chunk_fn is not None:
            return self
        try:
            return self._compile()
        except BaseException:
            self.close()
            raise

    def _compile(self) -> Runner:
        plan, stop, n = self.plan, self.stop, self.chunk

        def run_chunk(state):
            return run_iterations(plan, state, n, stop)

        t0 = time.perf_counter()
        # host arrays: in a multi-process run every process passes the same (replicated) keys
        keys = np.asarray(jax.vmap(jax.random.PRNGKey)(jnp.asarray(self.seeds, jnp.uint32)))
        vmapped = len(self.seeds) > 1  # a vmap of one seed would cost compile time for nothing
        init_fn, chunk_fn, init_arg = plan.init, run_chunk, keys[0]
        if vmapped:  # the seeds split over the devices where there are several (seed_devices)
            self.seed_mesh = seed_mesh(len(self.seeds), plan.workers.mesh)
            self._length = padded_seeds(len(self.seeds), self.seed_mesh)
            init_fn = spread_seeds(jax.vmap(plan.init), self.seed_mesh)
            chunk_fn = spread_seeds(jax.vmap(run_chunk), self.seed_mesh)
            init_arg = pad_seeds(keys, self._length)  # copies of the last seed: never reported
        # several seeds: threefry lowered unrolled, the same numbers (jaxplan.fast_rng)
        rng = unrolled_threefry() if vmapped else contextlib.nullcontext()
        with rng:
            return self._compile_programs(init_fn, chunk_fn, init_arg, t0)

    def _compile_programs(self, init_fn, chunk_fn, init_arg, t0: float) -> Runner:
        init_lowered = jax.jit(init_fn).lower(init_arg)
        if self.plan.workers.mesh is None and jax.process_count() == 1:
            # no data-parallel mesh: init's XLA compile runs in a thread while the chunk is
            # traced and lowered (Python, one core) from init's abstract outputs (the same
            # avals; the default device's placement, or split along the seed axis)
            state_info = jax.eval_shape(init_fn, init_arg)
            if self.seed_mesh is not None:  # init's outputs: split along the seed axis
                split = NamedSharding(self.seed_mesh, P(SEED_AXIS))
                state_info = jax.tree.map(
                    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=split), state_info
                )
            with ThreadPoolExecutor(1) as pool:
                init_compiling = pool.submit(init_lowered.compile, compiler_options())
                compiled = self._compile_chunk(chunk_fn, state_info)
                init = init_compiling.result()
        else:  # a mesh: the chunk takes the compiled init's output shardings
            init = init_lowered.compile(compiler_options())
            compiled = self._compile_chunk(chunk_fn, init.out_info)
        self._chunk_fn = compiled
        self._state = init(init_arg)
        self.compile_s = time.perf_counter() - t0
        if self.resume:
            self._restore(init.out_info)
        return self

    def _compile_chunk(self, chunk_fn: Callable, state_info: Any) -> Any:
        """The compiled chunk for a state of `state_info` (its buffers donated), after
        `check_memory` of its program."""
        traced = jax.jit(chunk_fn, donate_argnums=0).trace(state_info)
        check_memory(traced.jaxpr, state_info, self.plan.workers)
        return traced.lower().compile(compiler_options())

    def _restore(self, placement) -> None:
        """Replaces the fresh state by the checkpointed one, laid out as `placement` (the
        compiled init's outputs; global shardings in a multi-process run: each process puts
        its own shards)."""
        saved = with_empty_fields(serialization.to_state_dict(placement), self._saved.pop("state"))
        try:
            state = serialization.from_state_dict(placement, saved)
        except (ValueError, KeyError) as e:
            raise ValueError(f"cannot resume: the checkpoint's state does not fit: {e}") from None
        if self._length > len(self.seeds):  # saved without the padding: copies of the last seed
            state = pad_seeds(jax.tree.map(np.asarray, state), self._length)
        for path, x, p in zip(
            *zip(*jax.tree_util.tree_flatten_with_path(state)[0], strict=True),
            jax.tree.leaves(placement),
            strict=True,
        ):
            if np.shape(x) != p.shape or np.asarray(x).dtype != p.dtype:
                raise ValueError(
                    f"cannot resume: the checkpoint's state{jax.tree_util.keystr(path)} is "
                    f"{np.asarray(x).dtype}{list(np.shape(x))}, this plan's is "
                    f"{p.dtype}{list(p.shape)}"
                )

        def place(x, p):
            x = np.asarray(x)
            return jax.make_array_from_callback(p.shape, p.sharding, lambda index: x[index])

        self._state = jax.tree.map(place, state, placement)
        self._elapsed = float(self._saved.get("elapsed_s", 0.0))
        if self.stop is not None:  # seeds that already stopped stay stopped
            met = jax.jit(jax.vmap(self.stop.met) if len(self.seeds) > 1 else self.stop.met)
            met = self._unpadded(np.atleast_1d(np.asarray(met(self._state))))
            self.done = [seed for seed, m in zip(self.seeds, met, strict=True) if m]

    @property
    def state(self) -> Any:
        """The latest `PlanState` (None before `compile`); a leading seed axis when there are
        several seeds, `len(seeds)` long."""
        return None if self._state is None else self._unpadded(self._state)

    def _unpadded(self, tree: Any) -> Any:
        """`tree` (device or host arrays with the seed axis first) without the padded seed
        slots (`seed_devices.padded_seeds`): `len(seeds)` rows; itself when there are none."""
        n = len(self.seeds)
        return tree if self._length == n else jax.tree.map(lambda x: x[:n], tree)

    def __iter__(self) -> Iterator[list[dict]]:
        try:
            self.compile()
            while len(self.done) < len(self.seeds):
                yield self._run_chunk()
        finally:  # the run ended, failed, or the loop over it was left
            self.close()

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
        self._state, stacked = self._chunk_fn(self._state)
        stacked = jax.device_get(stacked)
        if len(self.seeds) == 1:  # the seed axis on the host (on the device: one op per leaf)
            stacked = jax.tree.map(lambda x: np.asarray(x)[None], stacked)
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
        failed = self._count_nonfinite(out)
        if self.plan.workers.mesh is not None:  # collective: every process, every chunk
            distributed.check_replicated(self._state.policies, "policies")
        multi_process = jax.process_count() > 1
        written = True
        if self.writer is not None or (self.output is not None and multi_process):
            # the whole state on the host (a collective: every process joins it)
            if multi_process:
                state = multihost_utils.process_allgather(self._state, tiled=True)
            else:  # without the padding (seed_devices), cut on the host
                state = self._unpadded(jax.device_get(self._state))
            if self.writer is not None:
                if _finite_policies(state.policies):  # never a checkpoint of such a state
                    self.writer.write_chunk(out, self.seeds, state, self._elapsed)
                else:
                    written = False
                    if failed is None:
                        failed = NonFiniteTraining("the policies' params are not finite")
        if self.loggers and written:  # what the files hold, after them: they stay whole
            self._logged = True
            _loggers.log_chunk(self.loggers, out)
        if failed is not None:
            failed.results = out  # this chunk's results, for whoever prints them
            raise failed
        return out

    def _count_nonfinite(self, results: list[dict]) -> NonFiniteTraining | None:
        """Counts each seed's iterations in a row with updates skipped as non-finite; the
        error to raise once a seed reaches `max_nonfinite_iters` of them (else None)."""
        failed = None
        for r in results:
            learner = r.get("info", {}).get("learner", {})
            skipped = {
                pid: {
                    **info["learner_stats"],
                    "first_nonfinite_stat": info.get("first_nonfinite_stat"),
                }
                for pid, info in learner.items()
                if info.get("learner_stats", {}).get("num_nonfinite_updates", 0) > 0
            }
            seed = r["seed"]
            self._nonfinite_streak[seed] = self._nonfinite_streak[seed] + 1 if skipped else 0
            limit = self.max_nonfinite_iters
            if failed is None and limit is not None and self._nonfinite_streak[seed] >= limit:
                pid, stats = next(iter(skipped.items()))
                failed = NonFiniteTraining(
                    f"seed {seed}, iteration {r['training_iteration']}: {limit} iteration(s) in "
                    f"a row with non-finite updates ({stats['num_nonfinite_updates']} skipped "
                    f"for {pid}, first non-finite: {stats.get('first_nonfinite_stat')}); the "
                    "params are the last finite ones"
                )
        return failed
