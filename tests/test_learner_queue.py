"""RLlib's learner queue (`Enqueue`/`Dequeue` over a bounded FIFO, backpressure when full),
the learner's `MinibatchBuffer` (`minibatch_buffer_size`, `num_sgd_iter`) and `MixInReplay`
(`replay_proportion`, `replay_buffer_num_slots`) against RLlib's semantics, alone and inside
IMPALA / APPO."""

from __future__ import annotations

import math
from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.batch import DEFAULT_POLICY_ID as PID
from jaxplan.batch import MultiAgentBatch
from jaxplan.flow import Flow, Stage
from jaxplan.impala.config import IMPALAConfig
from jaxplan.impala.plan import impala_plan
from jaxplan.stages.concurrently import Concurrently
from jaxplan.stages.learner_queue import (
    Dequeue,
    Enqueue,
    LearnerQueue,
    MinibatchBuffer,
    MixedBatches,
)
from jaxplan.stages.mix_in_replay import MixInReplay

SMALL = {
    "num_workers": 1,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 8,
    "train_batch_size": 16,
    "model": {"fcnet_hiddens": [8]},
}


class Numbered(Stage):
    """A source of train batches numbered 0, 1, 2, ... (3 rows holding the number): one per
    pull, or `per_pull` stacked in a `MixedBatches` of which all count."""

    def __init__(self, per_pull: int = 1):
        self.per_pull = per_pull

    def init(self, state):
        return state, jnp.int32(0)

    def apply(self, state, n, item=None):
        ids = n + jnp.arange(self.per_pull, dtype=jnp.int32)
        if self.per_pull == 1:
            return state, n + 1, MultiAgentBatch({PID: {"id": jnp.full((3,), n)}}, env_steps=3)
        rows = {PID: {"id": jnp.broadcast_to(ids[:, None], (self.per_pull, 3))}}
        batches = MultiAgentBatch(rows, env_steps=3)
        return state, n + self.per_pull, MixedBatches(batches, jnp.int32(self.per_pull))


@pytest.fixture(scope="module")
def workers():
    return impala_plan(SMALL, env="CartPole-v1").workers


def _queue_sizes(per_pull: int, capacity: int, cycles: int):
    """The rule: each cycle the producer pushes `per_pull` if they fit, then the learner pops
    one if any. Returns per cycle (size after the pop, producer pulled?)."""
    size, out = 0, []
    for _ in range(cycles):
        pulled = size + per_pull <= capacity
        size += per_pull if pulled else 0
        size -= 1 if size else 0
        out.append((size, pulled))
    return out


@pytest.mark.parametrize("per_pull,capacity", [(1, 3), (2, 5), (3, 3)])
def test_queue_is_a_bounded_fifo_with_backpressure(workers, per_pull, capacity):
    """`Concurrently([producer -> Enqueue, Dequeue], mode="async")`: the learner gets the
    batches in the order they were produced, the queue never holds more than its capacity,
    and the producer is pulled only when what it emits fits (RLlib's blocking `Enqueue`)."""
    producer = Flow.source(Numbered(per_pull))
    queue = LearnerQueue(workers, producer, learner_queue_size=capacity)
    assert queue.per_pull == per_pull
    enqueue_op = producer.for_each(Enqueue(queue))
    merged = Concurrently([enqueue_op, Dequeue(queue)], mode="async", output_indexes=[1])
    state = merged.init(workers.init(jax.random.PRNGKey(0)))
    pull = jax.jit(merged.pull)
    expected = _queue_sizes(per_pull, capacity, 12)
    produced = 0
    for cycle, (size, pulled) in enumerate(expected):
        state, batch = pull(state)
        own = state.stages["learner_queue"]
        assert int(own.size) == size <= capacity
        produced += per_pull if pulled else 0
        assert int(state.stages["numbered"]) == produced  # held back: not pulled at all
        np.testing.assert_array_equal(batch.policy_batches[PID]["id"], cycle)  # FIFO
    assert int(own.num_enqueued) == produced and int(own.num_dequeued) == 12
    if per_pull > 1:
        assert not all(p for _, p in expected)  # backpressure happened


class Recorder(Stage):
    """Logs the id of every batch that reaches it (`[64]` int32, -1 unused) and passes it on."""

    def init(self, state):
        return state, (jnp.full((64,), -1, jnp.int32), jnp.int32(0))

    def apply(self, state, own, batch):
        log, n = own
        return state, (log.at[n].set(batch.policy_batches[PID]["id"][0]), n + 1), batch


def _minibatch_buffer(size, passes, capacity, cycles):
    """RLlib's `LearnerThread` over a `MinibatchBuffer(inqueue, size, num_passes=passes)` (its
    `get`: refill the current slot when its passes are used up, waiting while the queue is
    empty; return it; next slot), `passes` gets a cycle after the producer pushed one batch
    if the queue had room. Returns per cycle the ids trained on, the batches taken from the
    queue so far and whether the producer was pulled."""
    queue, ttl, ring, idx, made, taken, out = deque(), [0] * size, [None] * size, 0, 0, 0, []
    for _ in range(cycles):
        pulled = len(queue) < capacity
        if pulled:
            queue.append(made)
            made += 1
        steps = []
        for _ in range(passes):
            if ttl[idx] <= 0:
                if not queue:  # RLlib's get blocks: this learner step does not happen
                    continue
                ring[idx], ttl[idx], taken = queue.popleft(), passes, taken + 1
            steps.append(ring[idx])
            ttl[idx] -= 1
            idx = (idx + 1) % size
        out.append((steps, taken, pulled))
    return out


@pytest.mark.parametrize("size,passes,capacity", [(2, 2, 4), (3, 2, 1), (2, 3, 4), (4, 2, 8)])
def test_minibatch_buffer_follows_rllib(workers, size, passes, capacity):
    """The learner flow `MinibatchBuffer(queue, num_passes) -> ...` pulled `num_passes` times
    a cycle (IMPALA's `repeat`): the batch of every learner step, the cycles in which a slot
    is refilled from the queue and the producer's backpressure are RLlib's (the Python model
    above); each batch is trained on exactly `num_passes` times, `size` of them in turn."""
    producer = Flow.source(Numbered())
    queue = LearnerQueue(workers, producer, learner_queue_size=capacity, minibatch_buffer_size=size)
    enqueue_op = producer.for_each(Enqueue(queue))
    learner = MinibatchBuffer(queue, num_passes=passes).for_each(Recorder()).repeat(passes)
    merged = Concurrently([enqueue_op, learner], mode="async", output_indexes=[1])
    state = merged.init(workers.init(jax.random.PRNGKey(0)))
    pull = jax.jit(merged.pull)
    expected = _minibatch_buffer(size, passes, capacity, 14)
    trained, produced = [], 0
    for steps, taken, pulled in expected:
        state, batch = pull(state)
        log, n = state.stages["recorder"]
        new = [int(i) for i in log[len(trained) : int(n)]]
        assert new == steps
        trained += new
        if steps:  # the cycle's item: its last learner step's batch
            np.testing.assert_array_equal(batch.policy_batches[PID]["id"], steps[-1])
        produced += pulled
        assert int(state.stages["numbered"]) == produced
        assert int(state.stages["learner_queue"].num_dequeued) == taken
    counts = np.bincount(trained)
    assert (counts[: len(counts) - size] == passes).all()  # all but the last ring's: k times
    assert trained[:size] == list(range(size))  # B batches in turn, not one k times
    if capacity >= size:  # the queue absorbs the ring's refill bursts: k steps every cycle
        assert all(len(steps) == passes for steps, _, _ in expected[size:])


def test_queue_needs_room_for_one_pull(workers):
    producer = Flow.source(Numbered(3))
    with pytest.raises(ValueError, match="learner_queue_size"):
        LearnerQueue(workers, producer, learner_queue_size=2)
    with pytest.raises(ValueError, match="learner_queue_size"):
        IMPALAConfig.from_dict(
            {"replay_proportion": 1.5, "replay_buffer_num_slots": 4, "learner_queue_size": 2}
        )
    with pytest.raises(ValueError, match="replay_buffer_num_slots"):
        IMPALAConfig.from_dict({"replay_proportion": 0.5})


@pytest.mark.parametrize("proportion,num_slots", [(0.3, 4), (1.0, 3), (2.5, 5)])
def test_mix_in_replay_proportions_match_rllib(workers, proportion, num_slots):
    """RLlib's `MixInReplay`: each input batch is emitted first, followed by `k` replays,
    `k = floor(p) + Bernoulli(p - floor(p))` (its `while random() < f: f -= 1` loop), each
    drawn uniformly from the last `num_slots` inputs, the current one included. Over 4000
    inputs: the counts take only those two values, their mean is `p` (within 4 standard
    errors), and the replayed ages are uniform over the filled slots (chi-square)."""
    source = Flow.source(Numbered())
    flow = source.for_each(
        MixInReplay(workers, source, num_slots=num_slots, replay_proportion=proportion)
    )
    state = flow.init(workers.init(jax.random.PRNGKey(1)))
    n = 4000

    def body(s, _):
        s, item = flow.pull(s)
        return s, (item.batches.policy_batches[PID]["id"][:, 0], item.count)

    state, (ids, counts) = jax.jit(lambda s: jax.lax.scan(body, s, None, length=n))(state)
    ids, counts = np.asarray(ids), np.asarray(counts) - 1
    width = 1 + math.ceil(proportion)
    assert ids.shape == (n, width)
    np.testing.assert_array_equal(ids[:, 0], np.arange(n))  # the input batch comes first
    whole, frac = math.floor(proportion), proportion - math.floor(proportion)
    assert set(np.unique(counts)) <= {whole, whole + 1}
    se = math.sqrt(frac * (1 - frac) / n)
    assert abs(counts.mean() - proportion) <= 4 * se + 1e-9
    # ages of the counted replays once the ring is full: uniform over 0..num_slots-1
    ages = []
    for i in range(num_slots, n):
        ages.extend(i - ids[i, 1 : 1 + counts[i]])
    ages = np.asarray(ages)
    assert ages.min() >= 0 and ages.max() <= num_slots - 1
    observed = np.bincount(ages, minlength=num_slots)
    expected = len(ages) / num_slots
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.0, observed  # df <= 4: p < 0.001 at 18.5
    own = state.stages["mix_in_replay"]
    assert int(own.num_added) == n and int(own.num_replayed) == counts.sum()
    assert int(own.size) == num_slots


def test_impala_learner_takes_one_plus_p_batches_per_sampled_one():
    """IMPALA with `replay_proportion=1` (one replay per train batch) and a queue of 2: the
    learner takes one batch per iteration, so the producer (2 batches a pull) is held back
    every other iteration: sampling halves, learning does not (RLlib's learner-bound
    pipeline). V-trace is recomputed on the learner side (RLlib computes it in the loss)."""
    plan = impala_plan(
        {**SMALL, "replay_proportion": 1.0, "replay_buffer_num_slots": 4, "learner_queue_size": 2},
        env="CartPole-v1",
    )
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    sampled = []
    for _ in range(6):
        state, result = step(state)
        r = plan.report(result)
        sampled.append(r["timesteps_this_iter"])
    assert sampled == [16, 0, 16, 0, 16, 0]
    info = r["info"]
    assert info["num_steps_trained"] == 6 * 16 and info["num_steps_sampled"] == 3 * 16
    assert info["learner_queue"]["num_enqueued"] == 6
    assert info["learner_queue"]["num_dequeued"] == 6
    assert info["learner_queue"]["size_quantiles"] == [0.0, 0.0, 0.5, 1.0, 1.0]
    assert info["mix_in_replay"] == {"num_added": 3, "num_replayed": 3, "size": 3}
    stats = info["learner"][PID]["learner_stats"]
    assert np.isfinite(stats["policy_loss"]) and np.isfinite(stats["vf_loss"])


def test_learner_postprocessing_reproduces_the_rollouts_postprocessing():
    """Regrouping a train batch of several rounds (2 staggered groups, 2 rounds of 16 steps)
    into fragments and postprocessing it again with the same params gives the rows the
    rollouts emitted: the layout round-trips and the V-trace inputs are the same."""
    from jaxplan.impala.plan import gather_experiences_directly
    from jaxplan.stages.learner_postprocessing import LearnerPostprocessing

    config = IMPALAConfig.from_dict({**SMALL, "num_workers": 2, "train_batch_size": 32})
    plan = impala_plan(config)
    flow = gather_experiences_directly(plan.workers, config)
    state = flow.init(plan.workers.init(jax.random.PRNGKey(2)))
    state, batch = jax.jit(flow.pull)(state)
    assert batch.time_steps == 16  # 2 rounds of fragments of 8 steps
    stage = LearnerPostprocessing(plan.workers)
    _, _, again = jax.jit(lambda s, b: stage.apply(s.replace(stages={}), None, b))(state, batch)
    rows, redone = batch.policy_batches[PID], again.policy_batches[PID]
    assert set(rows) == set(redone)
    for field in rows:
        np.testing.assert_allclose(redone[field], rows[field], rtol=1e-5, atol=1e-6)
    # with other params the advantages change (the stage does recompute them)
    moved = state.policies[PID].replace(
        params=jax.tree.map(lambda p: 1.5 * p, state.policies[PID].params)
    )
    state = state.replace(policies={PID: moved})
    _, _, other = stage.apply(state.replace(stages={}), None, batch)
    assert not np.allclose(other.policy_batches[PID]["advantages"], rows["advantages"])


@pytest.mark.slow
def test_appo_with_replay_solves_cartpole_in_fewer_env_steps():
    """APPO's CartPole preset with `replay_proportion=1` (8 slots, queue of 2: each sampled
    batch is trained on, then one uniform replay): seeds 0-2 vmapped reach 475 within 200k
    env steps (measured on the 2-core CPU machine: 121k, 161k, 115k; without replay 224k,
    201k, 156k), the learner taking two batches per sampled one."""
    import jaxplan
    from jaxplan.appo.plan import appo_plan
    from jaxplan.counters import counter_value

    extra = {"replay_proportion": 1.0, "replay_buffer_num_slots": 8, "learner_queue_size": 2}
    plan = appo_plan(extra, env="CartPole-v1")
    stop = jaxplan.Stop(episode_reward_mean=475)
    _, results = jaxplan.train_seeds(plan, [0, 1, 2], 1600, stop=stop)
    done = np.asarray(results["done"])
    assert done.any(axis=1).all(), np.nanmax(np.asarray(results["episode_reward_mean"]), axis=1)
    first = done.argmax(axis=1)
    sampled = counter_value(results["timesteps_total"])[np.arange(3), first]
    trained = counter_value(results["info"]["num_steps_trained"])[np.arange(3), first]
    assert (sampled <= 200_000).all(), sampled
    assert (np.abs(trained - 2 * sampled) <= 256).all(), (trained, sampled)
