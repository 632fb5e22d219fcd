"""Plan composition: `Flow.for_each` / `Flow.combine` build a pure `step` function.

A `Flow` is a pure function `pull(PlanState) -> (PlanState, item)`, built from stages at trace
time. `for_each(stage)` applies a `Stage` (`(state, item) -> (state, item)`) or a plain function
of the item (`lambda t: t[1]`) to each item; `combine(op)` hands the whole upstream `pull` to
`op`, which may call it several times (ConcatBatches scans it). `StandardMetricsReporting`
turns a flow into a `Plan`: the compiled pair `init(key) -> PlanState` and
`step(PlanState) -> (PlanState, Result)`. Functions given to `Plan.for_each` run on the host, on
each result once it is off the device (RLlib's `warn_about_bad_reward_scales` is one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from jaxplan.workers import PlanState, WorkerSet

Pull = Callable[[PlanState], tuple[PlanState, Any]]
Init = Callable[[PlanState], PlanState]
"""Extends a fresh `PlanState` with the state a stage keeps (e.g. async rollouts' per-group
params and fragments); a flow's inits run in order after `WorkerSet.init`."""


def run_inits(inits: tuple[Init, ...], state: PlanState) -> PlanState:
    """Applies the stages' state initializers in order."""
    for fn in inits:
        state = fn(state)
    return state


class Stage:
    """Base class of stages that read or write `PlanState`: `(state, item) -> (state, item)`."""

    def __call__(self, state: PlanState, item: Any) -> tuple[PlanState, Any]:
        raise NotImplementedError


class Combinator:
    """Base class of operators used with `Flow.combine`: `upstream pull -> new pull`."""

    def combine(self, upstream: Pull) -> Pull:
        raise NotImplementedError


class Flow:
    """A pure dataflow over `PlanState`; see the module docstring."""

    def __init__(self, workers: WorkerSet, pull: Pull, inits: tuple[Init, ...] = ()):
        self.workers = workers
        self.pull = pull
        self.inits = tuple(inits)

    def init(self, state: PlanState) -> PlanState:
        """Runs the stages' state initializers on a fresh `PlanState`."""
        return run_inits(self.inits, state)

    def for_each(self, fn: Stage | Callable[[Any], Any]) -> Flow:
        upstream = self.pull
        if isinstance(fn, Stage):

            def pull(state):
                return fn(*upstream(state))

        else:

            def pull(state):
                state, item = upstream(state)
                return state, fn(item)

        return Flow(self.workers, pull, self.inits)

    def combine(self, op: Combinator) -> Flow:
        return Flow(self.workers, op.combine(self.pull), self.inits)


Result = dict[str, Any]
"""One training iteration's metrics as a nested dict pytree (device arrays inside `step`)."""


class Plan:
    """A compiled execution plan: `init(key) -> PlanState`, `step(state) -> (state, Result)`.

    Both are pure; `jax.jit(plan.step)` is one training iteration. `report(result)` turns a
    device result into RLlib's nested result dict of Python numbers and runs the host stages.
    """

    def __init__(
        self,
        workers: WorkerSet,
        pull: Pull,
        to_host: Callable[[Result], dict],
        host_stages: tuple[Callable[[dict], Any], ...] = (),
        inits: tuple[Init, ...] = (),
    ):
        self.workers = workers
        self._pull = pull
        self._to_host = to_host
        self.host_stages = host_stages
        self.inits = tuple(inits)

    def init(self, key: jax.Array, hparams: dict[str, Any] | None = None) -> PlanState:
        """Fresh `PlanState` (with the stages' own state), laid out on the workers' mesh if
        there is one."""
        return self.workers.place(run_inits(self.inits, self.workers.init(key, hparams)))

    def step(self, state: PlanState) -> tuple[PlanState, Result]:
        """One training iteration. On a mesh the stages run inside `jax.shard_map` over its
        devices (actor groups split, the rest replicated; the result is replicated)."""
        workers = self.workers
        if workers.mesh is None:
            return self._pull(state)
        specs = workers.state_specs()
        return jax.shard_map(
            self._pull, mesh=workers.mesh, in_specs=(specs,), out_specs=(specs, P())
        )(state)

    def for_each(self, fn: Callable[[dict], Any]) -> Plan:
        """Adds a host-side function of each result (its return value, if not None, replaces it)."""
        return Plan(self.workers, self._pull, self._to_host, (*self.host_stages, fn), self.inits)

    def report(self, result: Result) -> dict:
        """Host side: one device result -> RLlib-style dict, after the host stages."""
        out = self._to_host(jax.device_get(result))
        for fn in self.host_stages:
            new = fn(out)
            out = out if new is None else new
        return out

    def reports(self, results: Result) -> list[dict]:
        """Host side: results stacked over a leading iteration axis -> one dict per iteration."""
        results = jax.device_get(results)
        n = jax.tree.leaves(results)[0].shape[0]
        return [self.report(jax.tree.map(lambda x, i=i: x[i], results)) for i in range(n)]
