"""Plan composition: the stage contract, flows of stages, and compiled plans.

A `Stage` is an optax-style pair of pure functions over its *own* typed state:

    init(state: PlanState) -> (PlanState, stage_state)
    apply(state: PlanState, stage_state, item) -> (PlanState, stage_state, item)

`state` is the plan's core (`PlanState` with `stages` emptied: policies, actor groups,
episode windows, counters, key); the stage's own state lives in `PlanState.stages[name]` and is
handed to it alone. A stage may also give its state's `partition_spec` on a device mesh and
add `metrics` to each iteration's result.

A `Flow` is built from stages at trace time: `Flow.source(stage)` starts it (the stage gets
`item=None`), `for_each(stage)` appends a stage (a plain function of the item, such as
`lambda t: t[1]`, is sugar for a stateless stage), `combine(op)` hands the upstream `pull` to
`op`, which may call it several times (ConcatBatches scans it). `StandardMetricsReporting`
ends a flow in a `Plan`: the pure pair `init(key) -> PlanState` and
`step(PlanState) -> (PlanState, Result)`. `Plan.on_result(fn)` adds a host-side hook that runs
on each result once it is off the device (RLlib's `warn_about_bad_reward_scales`).

Shared state: RLlib's DQN plan hands one `local_replay_buffer` to two operators
(`StoreToReplayBuffer` writes it, `Replay` reads it). A stage whose `shares` is a `SharedState`
(such as `jaxplan.stages.replay.LocalReplayBuffer`) gets that object's one state entry instead
of its own: the entry is named, initialised, laid out and reported once, by the object, and
every stage holding the same object reads and writes it, in flow order.

Readiness: a stage may define `ready(state, stage_state) -> bool`, read on the state before
the pull: a source's is RLlib's `_NextValueNotReady` (a replay buffer before
`learning_starts`, an empty learner queue), a later stage's is backpressure (`Enqueue` on a
full learner queue). `Flow.pull_if_ready` then pulls the whole flow only when all its stages
are ready (`lax.cond`), else leaves the state as it is and yields an item of zeros (see
`Concurrently`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxplan.workers import PlanState, WorkerSet

Pull = Callable[[PlanState], tuple[PlanState, Any]]
"""A flow so far: `PlanState -> (PlanState, item)`, pure and traced into the step."""

Result = dict[str, Any]
"""One training iteration's metrics as a nested dict pytree (device arrays inside `step`)."""


class Stage:
    """Base class of plan stages (see the module docstring for the contract).

    Subclasses override `apply`, and `init` (plus `partition_spec` if any of the state is
    split across devices, and `metrics` to report it) when they keep state. A stage without
    state returns `None` from `init` and gets `None` in `apply`. `name` is the key of the
    state in `PlanState.stages` (default: the class name in snake_case; a second stage of the
    same name in one plan gets a numbered suffix).
    """

    name: str | None = None
    shares: SharedState | None = None
    """A `SharedState` whose one entry this stage uses instead of a state of its own."""

    def init(self, state: PlanState) -> tuple[PlanState, Any]:
        """The stage's fresh state (`None`: stateless); may also advance the core state."""
        return state, None

    def apply(self, state: PlanState, stage_state: Any, item: Any) -> tuple[PlanState, Any, Any]:
        """One pass of the flow through the stage: new core state, own state and item."""
        raise NotImplementedError

    def partition_spec(self) -> Any:
        """`PartitionSpec` prefix of the stage state on a mesh; default: replicated."""
        return P()

    def metrics(self, state: PlanState, stage_state: Any) -> Result:
        """Entries merged into each iteration's result (nested dicts merge); default: none."""
        return {}


class SharedState:
    """State that several stages of one plan read and write (see the module docstring): it
    has a stage's `name`, `init`, `partition_spec` and `metrics`, and no `apply` of its own."""

    name: str | None = None

    def init(self, state: PlanState) -> tuple[PlanState, Any]:
        raise NotImplementedError

    def partition_spec(self) -> Any:
        return P()

    def metrics(self, state: PlanState, stage_state: Any) -> Result:
        return {}


class ItemFunction(Stage):
    """A plain function of the item as a stateless stage (`flow.for_each(lambda t: t[1])`)."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn
        self.name = getattr(fn, "__name__", None)

    def apply(self, state, stage_state, item):
        return state, stage_state, self.fn(item)


class Combinator(Protocol):
    """What `Flow.combine` takes: an operator from the upstream pull to a new pull."""

    def combine(self, upstream: Pull) -> Pull: ...


class Flow:
    """A pure dataflow over `PlanState`: `pull(state) -> (state, item)` and its stages."""

    def __init__(
        self,
        pull: Pull,
        stages: tuple[tuple[str, Stage | SharedState], ...],
        ready: Callable[[PlanState], jax.Array] | None = None,
    ):
        self.pull = pull
        self.stages = stages  # (name, owner of the state entry): a stage or a SharedState
        self.ready = ready

    @classmethod
    def source(cls, stage: Stage) -> Flow:
        """A flow that starts with `stage` (its `apply` gets `item=None`); if the stage has
        `ready(state, stage_state)`, the flow is pulled only when that is true (see
        `pull_if_ready`)."""
        return cls(lambda state: (state, None), ()).for_each(stage)

    def pull_if_ready(self, state: PlanState) -> tuple[PlanState, Any, jax.Array]:
        """`(state, item, ready)`: the flow pulled if its source is ready (always without a
        `ready`), else the state unchanged and an item of zeros shaped like the pull's."""
        if self.ready is None:
            state, item = self.pull(state)
            return state, item, jnp.bool_(True)
        _, shapes = jax.eval_shape(self.pull, state)
        zeros = jax.tree.map(_zeros, shapes)
        ok = self.ready(state)
        state, item = jax.lax.cond(ok, self.pull, lambda s: (s, zeros), state)
        return state, item, ok

    def for_each(self, stage: Stage | Callable[[Any], Any]) -> Flow:
        """Applies `stage` (or a plain function of the item) to every item of the flow; a
        stage with `ready(state, stage_state)` also gates the flow (see `pull_if_ready`)."""
        if not isinstance(stage, Stage):
            if not callable(stage):
                raise TypeError(f"for_each takes a Stage or a function of the item, got {stage!r}")
            stage = ItemFunction(stage)
        owner = stage if stage.shares is None else stage.shares
        known = [n for n, o in self.stages if o is owner]
        name = known[0] if known else _unique_name(owner, {n for n, _ in self.stages})
        upstream = self.pull

        def pull(state: PlanState) -> tuple[PlanState, Any]:
            state, item = upstream(state)
            own = state.stages.get(name)
            core, new, item = stage.apply(state.replace(stages={}), own, item)
            _check_same_kind(name, own, new)
            stages = dict(state.stages)
            if new is not None:
                stages[name] = new
            return core.replace(stages=stages), item

        stages = self.stages if known else (*self.stages, (name, owner))
        check = getattr(stage, "ready", None)
        if check is None:
            return Flow(pull, stages, self.ready)
        before = self.ready

        def ready(state: PlanState) -> jax.Array:
            ok = check(state.replace(stages={}), state.stages.get(name))
            return ok if before is None else jnp.logical_and(before(state), ok)

        return Flow(pull, stages, ready)

    def combine(self, op: Combinator) -> Flow:
        """`op.combine(upstream pull) -> pull` (e.g. ConcatBatches); the stages stay."""
        return Flow(op.combine(self.pull), self.stages, self.ready)

    def batch(self, n: int) -> Flow:
        """RLlib's `LocalIterator.batch(n)`: each item is the next `n` items of this flow,
        stacked on a new leading axis `[n]` (a `lax.scan` over the upstream pull)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"Flow.batch(n) needs an integer n >= 1, got {n!r}")
        upstream = self.pull

        def pull(state: PlanState) -> tuple[PlanState, Any]:
            return jax.lax.scan(lambda s, _: upstream(s), state, None, length=n)

        return Flow(pull, self.stages, self.ready)

    def repeat(self, n: int) -> Flow:
        """Each item is the last of the next `n` items of this flow (a `lax.scan`): RLlib
        pulls a plan's iterator until an iteration's `timesteps_per_iteration` are sampled
        (`OncePerTimestepsElapsed`); here the number of pulls is static. A flow with a
        `ready` is pulled `n` times only while ready (`pull_if_ready` each time: a pull that
        is not ready leaves the state) and the item is the last ready pull's; the repeated
        flow is ready when this one is."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"Flow.repeat(n) needs an integer n >= 1, got {n!r}")
        upstream = self.pull
        if self.ready is None:

            def pull(state: PlanState) -> tuple[PlanState, Any]:
                state, items = jax.lax.scan(lambda s, _: upstream(s), state, None, length=n)
                return state, jax.tree.map(lambda x: x[-1], items)

            return Flow(pull, self.stages, self.ready)

        def pull_ready(state: PlanState) -> tuple[PlanState, Any]:
            def body(carry, _):
                s, last = carry
                s, item, ok = self.pull_if_ready(s)
                return (s, jax.tree.map(lambda a, b: jnp.where(ok, a, b), item, last)), None

            _, shapes = jax.eval_shape(upstream, state)
            (state, item), _ = jax.lax.scan(
                body, (state, jax.tree.map(_zeros, shapes)), None, length=n
            )
            return state, item

        return Flow(pull_ready, self.stages, self.ready)

    def init(self, state: PlanState) -> PlanState:
        """Runs the stages' `init` in flow order on a fresh core state; stores their states."""
        stages = dict(state.stages)
        for name, stage in self.stages:
            core, own = stage.init(state.replace(stages={}))
            if own is not None:
                stages[name] = own
            state = core.replace(stages=stages)
        return state


def item_shape(flow: Flow, workers: WorkerSet) -> Any:
    """The item one pull of `flow` yields, as shapes (`jax.ShapeDtypeStruct` leaves; on the
    workers' mesh, one device's shard, as a stage inside the step sees it), from a fresh
    state with the flow's stages initialised; nothing is computed. For stages whose state
    is shaped like the items they receive (`LearnerQueue`, `MixInReplay`)."""
    core = jax.eval_shape(workers.init, jax.random.PRNGKey(0))

    def pull(state: PlanState) -> Any:
        return flow.pull(state)[1]

    full = jax.eval_shape(flow.init, core)
    if workers.mesh is None:
        return jax.eval_shape(pull, full)
    specs = {name: owner.partition_spec() for name, owner in flow.stages if name in full.stages}
    local = jax.shard_map(
        pull,
        mesh=workers.mesh,
        in_specs=(workers.state_specs(specs),),
        out_specs=P(),  # not replicated, but its shapes are one device's: what is asked
        check_vma=False,
    )
    return jax.eval_shape(local, full)


def merged_stages(flows: list[Flow]) -> tuple[tuple[str, Stage | SharedState], ...]:
    """The state owners of several flows joined into one plan (`Concurrently`): an owner in
    several flows (a `SharedState`) once; two different owners must not share a name (their
    pulls were built with it), except stateless item functions, which keep no entry."""
    out: list[tuple[str, Stage | SharedState]] = []
    for flow in flows:
        for name, owner in flow.stages:
            same = [n for n, o in out if o is owner]
            if same and same[0] != name:
                raise ValueError(
                    f"{type(owner).__name__} is named {same[0]!r} in one flow and {name!r} in "
                    "another; give it a `name`"
                )
            clash = [o for n, o in out if n == name and o is not owner]
            if clash and not (
                isinstance(owner, ItemFunction) and isinstance(clash[0], ItemFunction)
            ):
                raise ValueError(
                    f"two different stages are named {name!r} in the joined flows; give one of "
                    "them another `name`"
                )
            if not same and not clash:
                out.append((name, owner))
    return tuple(out)


def _zeros(shape: jax.ShapeDtypeStruct) -> jax.Array:
    """Zeros of `shape`; inside `shard_map`, typed as varying across the mesh axes the
    shape's value varies over (so that both branches of a `lax.cond` have one type)."""
    zeros = jnp.zeros(shape.shape, shape.dtype)
    manual = getattr(shape, "manual_axis_type", None)
    axes = tuple(sorted(manual.varying)) if manual is not None else ()
    return jax.lax.pcast(zeros, axes, to="varying") if axes else zeros


def _check_same_kind(name: str, before: Any, after: Any) -> None:
    """At trace time: a stage's `apply` must return its state with the structure, shapes and
    dtypes it got (the state is a `scan` carry); a clear error names the stage otherwise."""
    kinds = [jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), s) for s in (before, after)]
    if jax.tree.structure(before) != jax.tree.structure(after) or kinds[0] != kinds[1]:
        raise TypeError(
            f"stage {name!r}: apply must return its state as init made it (structure, shapes "
            f"and dtypes); got {kinds[1]} for {kinds[0]}"
        )


def _unique_name(stage: Stage, taken: set[str]) -> str:
    base = stage.name or re.sub(r"(?<!^)(?=[A-Z])", "_", type(stage).__name__).lower()
    base = re.sub(r"\W", "_", base) or "stage"
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name


def merge_results(result: Result, extra: Mapping[str, Any]) -> Result:
    """`result` with `extra`'s entries added, nested dicts merged key by key."""
    out = dict(result)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_results(out[key], value)
        else:
            out[key] = value
    return out


class Plan:
    """A compiled execution plan: `init(key) -> PlanState`, `step(state) -> (state, Result)`.

    Both are pure; `jax.jit(plan.step)` is one training iteration. `report(result)` turns a
    device result into RLlib's nested result dict of Python numbers and runs the host hooks.
    `finish(start, state, item) -> (state, result)` builds the result from the state at the
    start of the step, the state after the flow and its last item (StandardMetricsReporting's).
    """

    def __init__(
        self,
        workers: WorkerSet,
        flow: Flow,
        finish: Callable[[PlanState, PlanState, Any], tuple[PlanState, Result]],
        to_host: Callable[[Result], dict],
        hooks: tuple[Callable[[dict], Any], ...] = (),
    ):
        self.workers = workers
        self.flow = flow
        self._finish = finish
        self._to_host = to_host
        self.hooks = hooks

    def init(self, key: jax.Array, hparams: dict[str, Any] | None = None) -> PlanState:
        """Fresh `PlanState` with every stage's own state, laid out on the workers' mesh if
        there is one. `hparams`: see `WorkerSet.init`.

        Called on concrete values it runs as one compiled program (cached per plan without
        `hparams`): run op by op, its hundreds of small ops would each be dispatched and
        compiled on their own, about twice the time of one compile. Under a trace (`jit`,
        `vmap`, `eval_shape`) it is traced into the caller's program as it is."""
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((key, hparams))):
            return self._init(key, hparams)
        if hparams is None:
            return self._compiled_init(key)
        # the values stay Python's, so a bad one is named in the error as the user wrote it
        return jax.jit(lambda k: self._init(k, hparams))(key)

    @functools.cached_property
    def _compiled_init(self) -> Callable[[jax.Array], PlanState]:
        return jax.jit(self._init)

    def _init(self, key: jax.Array, hparams: dict[str, Any] | None = None) -> PlanState:
        state = self.flow.init(self.workers.init(key, hparams))
        return self.workers.place(state, self.state_specs(state))

    def state_specs(self, state: PlanState) -> PlanState:
        """`PartitionSpec` prefix of `state` on the mesh: the core's and each stage's."""
        return self.workers.state_specs(
            {
                name: stage.partition_spec()
                for name, stage in self.flow.stages
                if name in state.stages
            }
        )

    def _pull(self, start: PlanState) -> tuple[PlanState, Result]:
        state, item = self.flow.pull(start)
        state, result = self._finish(start, state, item)
        for name, stage in self.flow.stages:
            own = state.stages.get(name)
            result = merge_results(result, stage.metrics(state.replace(stages={}), own))
        return state, result

    def step(self, state: PlanState) -> tuple[PlanState, Result]:
        """One training iteration. On a mesh the stages run inside `jax.shard_map` over its
        devices (actor groups split, the rest replicated; the result is replicated)."""
        if self.workers.mesh is None:
            return self._pull(state)
        specs = self.state_specs(state)
        return jax.shard_map(
            self._pull, mesh=self.workers.mesh, in_specs=(specs,), out_specs=(specs, P())
        )(state)

    def on_result(self, fn: Callable[[dict], Any]) -> Plan:
        """Adds a host-side hook on each reported result (its return value, if not None,
        replaces the result); it runs in `report`, never inside the compiled step."""
        return Plan(self.workers, self.flow, self._finish, self._to_host, (*self.hooks, fn))

    def report(self, result: Result) -> dict:
        """Host side: one device result -> RLlib-style dict, after the host hooks."""
        out = self._to_host(jax.device_get(result))
        for fn in self.hooks:
            new = fn(out)
            out = out if new is None else new
        return out

    def reports(self, results: Result) -> list[dict]:
        """Host side: results stacked over a leading iteration axis -> one dict per iteration."""
        results = jax.device_get(results)
        n = jax.tree.leaves(results)[0].shape[0]
        return [self.report(jax.tree.map(lambda x, i=i: x[i], results)) for i in range(n)]
