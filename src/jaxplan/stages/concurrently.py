"""Concurrently: RLlib's operator that runs several flows of one plan together.

RLlib's `Concurrently(ops, mode="round_robin", output_indexes, round_robin_weights)` pulls
its ops in turn, op `i` `round_robin_weights[i]` times per cycle, and yields the items of the
ops in `output_indexes`. jaxplan's is the same, deterministic and static: one pull of the
joined flow is one cycle; an op whose source is not ready (a replay buffer before
`learning_starts`, RLlib's `_NextValueNotReady`) is skipped without changing the state (see
`Flow.pull_if_ready`). The cycle's item is the last item an output op produced in it (zeros
if none did). RLlib's weight `"*"` (pull until not ready) has no static counterpart here.

`mode="async"` (RLlib: items in whatever order the ops produce them, e.g. IMPALA's producer
and learner) is made deterministic: each cycle pulls every ready op once, in list order (the
round robin with weights 1), so a plan that runs its ops "concurrently" replays exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxplan.flow import Flow, merged_stages
from jaxplan.workers import PlanState


def Concurrently(  # noqa: N802 - RLlib's name
    ops: Sequence[Flow],
    *,
    mode: str = "round_robin",
    output_indexes: Sequence[int] | None = None,
    round_robin_weights: Sequence[int] | None = None,
) -> Flow:
    """One flow of `ops` pulled in round-robin order (see the module docstring; `"async"`:
    each ready op once per cycle, in order).

    `output_indexes` (default: all ops) must name ops whose items have one structure;
    `round_robin_weights` (default: 1 each; round_robin only) are integers >= 1."""
    ops = list(ops)
    if mode not in ("round_robin", "async"):
        raise ValueError(
            f"Concurrently mode {mode!r} is not supported; valid modes: round_robin, async"
        )
    if mode == "async" and round_robin_weights is not None:
        raise ValueError("Concurrently: round_robin_weights apply to mode='round_robin' only")
    if not ops or not all(isinstance(op, Flow) for op in ops):
        raise ValueError(f"Concurrently takes a non-empty list of flows, got {ops!r}")
    weights = [1] * len(ops) if round_robin_weights is None else list(round_robin_weights)
    if len(weights) != len(ops) or any(
        isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in weights
    ):
        raise ValueError(
            f"round_robin_weights {weights!r}: one integer >= 1 per op ({len(ops)} ops); "
            "RLlib's '*' is not supported"
        )
    outputs = list(range(len(ops))) if output_indexes is None else list(output_indexes)
    if not outputs or any(not 0 <= i < len(ops) for i in outputs):
        raise ValueError(f"output_indexes {outputs!r}: indexes of the {len(ops)} ops")

    def pull(state: PlanState) -> tuple[PlanState, Any]:
        out = None
        for i, (op, weight) in enumerate(zip(ops, weights, strict=True)):
            if weight == 1:
                state, item, ok = op.pull_if_ready(state)
            else:  # readiness only grows, so the last pull is the newest ready one, if any
                state, (items, oks) = jax.lax.scan(
                    lambda s, _, op=op: _split(op.pull_if_ready(s)), state, None, length=weight
                )
                item, ok = jax.tree.map(lambda x: x[-1], items), oks[-1]
            if i not in outputs:
                continue
            if out is None:
                out = item
                continue
            if jax.tree.structure(out) != jax.tree.structure(item):
                raise ValueError(
                    f"Concurrently: the items of the output ops {outputs} differ in structure; "
                    "pick ops with one kind of item in output_indexes"
                )
            out = jax.tree.map(lambda new, old, ok=ok: jnp.where(ok, new, old), item, out)
        return state, out

    return Flow(pull, merged_stages(ops))


def _split(result):
    state, item, ok = result
    return state, (item, ok)
