"""Traced hyper-parameters: checked at `init` (not later in `step`), swept through
`make_train` / `train_seeds`, and every preset env's `plan.step` compiles once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan.ppo.presets import PRESETS

PID = jaxplan.DEFAULT_POLICY_ID
SMALL = {
    "num_workers": 1,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 64,  # 128 env steps per iteration
    "train_batch_size": 128,
    "sgd_minibatch_size": 64,
    "num_sgd_iter": 1,
    "model": {"fcnet_hiddens": [8]},
    "lr_schedule": None,  # the CartPole preset's schedule would scale a swept lr
}


@pytest.fixture(scope="module")
def plan():
    return jaxplan.ppo_plan({**SMALL, "lr": 5e-4, "gamma": 0.98}, env="CartPole-v1")


def test_a_partial_mapping_overrides_only_its_fields(plan):
    state = plan.init(jax.random.PRNGKey(0), {PID: {"lr": 1e-3, "entropy_coeff": 2}})
    hp = state.policies[PID].hparams
    assert isinstance(hp, jaxplan.PPOHParams)
    assert hp.lr.dtype == jnp.float32 and hp.lr.shape == ()
    assert float(hp.lr) == np.float32(1e-3)
    assert float(hp.entropy_coeff) == 2.0
    assert float(hp.gamma) == np.float32(0.98)  # the config's, untouched
    # the same state as a PPOHParams built by hand
    by_hand = jaxplan.PPOHParams.from_config(plan.workers.policies[PID].config).replace(
        lr=jnp.float32(1e-3), entropy_coeff=jnp.float32(2.0)
    )
    other = plan.init(jax.random.PRNGKey(0), {PID: by_hand})
    assert jax.tree.map(float, other.policies[PID].hparams) == jax.tree.map(float, hp)


@pytest.mark.parametrize(
    "hparams,fragments",
    [
        ({"lr": 1e-3}, ["unknown policy id(s) ['lr']", "['default_policy']", "{'default_policy'"]),
        ({"pol": {"lr": 1e-3}}, ["unknown policy id(s) ['pol']"]),
        ({PID: {"lrr": 1e-3}}, ["hparams['default_policy']", "['lrr']", "Did you mean 'lr'?"]),
        ({PID: {"lr": [1e-3, 1e-4]}}, ["hparams['default_policy']: 'lr' has shape [2]"]),
        ({PID: {"lr": "fast"}}, ["'lr' = 'fast': expected a number"]),
        ({PID: {"lr": True}}, ["'lr' = True: expected a number"]),
        ({PID: 1e-3}, ["got 0.001; expected a PPOHParams or a mapping"]),
        ([1e-3], ["expected a mapping of policy ids"]),
    ],
)
def test_bad_hparams_are_named_at_init(plan, hparams, fragments):
    with pytest.raises(ValueError) as e:
        jax.eval_shape(lambda key: plan.init(key, hparams), jax.random.PRNGKey(0))
    for fragment in fragments:
        assert fragment in str(e.value)


def test_train_seeds_sweeps_hparams_in_one_program():
    """Runs of one seed with lr 1e-3 and 3e-3 in one program: each uses its lr, and the second
    equals a separate run whose config sets lr 3e-3 (and the shared gamma)."""
    lrs = [1e-3, 3e-3]
    sweep = jaxplan.ppo_plan(SMALL, env="CartPole-v1")
    _, results = jaxplan.train_seeds(sweep, [0, 0], 2, hparams={PID: {"lr": lrs, "gamma": 0.95}})
    got = results["info"]["learner"][PID]["learner_stats"]
    np.testing.assert_array_equal(got["cur_lr"], np.float32([[1e-3] * 2, [3e-3] * 2]))
    alone = jaxplan.ppo_plan({**SMALL, "lr": 3e-3, "gamma": 0.95}, env="CartPole-v1")
    want = jaxplan.train_seeds(alone, [0], 2)[1]["info"]["learner"][PID]["learner_stats"]
    for key in ("total_loss", "vf_loss", "kl", "entropy"):
        # programs vmapped over 2 and over 1 run round differently: 2.3e-6 relative seen on
        # kl, and 7e-10 absolute on a kl of 3.9e-6 (a mean of differences of log-probs ~0.7,
        # whose float32 rounding is ~6e-8 each)
        np.testing.assert_allclose(got[key][1], want[key][0], rtol=2e-5, atol=1e-8)
        assert not np.allclose(got[key][0], want[key][0], rtol=1e-4)  # lr 1e-3 learns otherwise


def test_make_train_takes_hparams():
    plan = jaxplan.ppo_plan(SMALL, env="CartPole-v1")
    train = jaxplan.make_train(plan, 1)
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    lrs = jnp.asarray([1e-4, 1e-3, 1e-2], jnp.float32)
    _, results = jax.jit(jax.vmap(train))(keys, {PID: {"lr": lrs}})
    stats = results["info"]["learner"][PID]["learner_stats"]
    np.testing.assert_array_equal(stats["cur_lr"][:, 0], lrs)


def test_train_seeds_names_a_badly_shaped_sweep_before_compiling():
    plan = jaxplan.ppo_plan(SMALL, env="CartPole-v1")
    with pytest.raises(ValueError, match=r"hparams\['default_policy'\]\['lr'\] has shape \[3\]"):
        jaxplan.train_seeds(plan, [0, 1], 2, hparams={PID: {"lr": [1e-3, 2e-3, 3e-3]}})
    with pytest.raises(ValueError, match="Did you mean 'lr'"):
        jaxplan.train_seeds(plan, [0, 1], 2, hparams={PID: {"lrr": 1e-3}})


@pytest.mark.parametrize("env", sorted(PRESETS))
def test_every_preset_steps_with_the_types_it_starts_with(env):
    """`plan.step`'s output state has the input's shapes, dtypes and weak types, leaf for
    leaf: a jitted step (and a chunked CLI run) compiles once. gymnax Pendulum's reset state
    was weakly typed and cost a second compile."""
    small = {"train_batch_size": 64, "sgd_minibatch_size": 32, "rollout_fragment_length": 32}
    # a recurrent preset's sequences must cut the 32-step fragments (ignored by the others)
    plan = jaxplan.ppo_plan({**small, "model": {"max_seq_len": 8}}, env=env)
    before = jax.eval_shape(plan.init, jax.random.PRNGKey(0))
    after, _ = jax.eval_shape(plan.step, before)
    flat_before, tree_before = jax.tree_util.tree_flatten_with_path(before)
    flat_after, tree_after = jax.tree_util.tree_flatten_with_path(after)
    assert tree_before == tree_after
    for (path, a), (_, b) in zip(flat_before, flat_after, strict=True):
        assert (a.shape, a.dtype, a.weak_type) == (b.shape, b.dtype, b.weak_type), (
            f"{env}: state{jax.tree_util.keystr(path)} enters as {a} and leaves as {b}"
        )


def test_pendulum_step_compiles_once():
    plan = jaxplan.ppo_plan({**SMALL, "model": {"fcnet_hiddens": [8]}}, env="Pendulum-v1")
    traces = []

    def step(state):
        traces.append(1)  # runs once per trace, i.e. per compilation of the jitted step
        return plan.step(state)

    step = jax.jit(step)
    state = plan.init(jax.random.PRNGKey(0))
    for _ in range(3):
        state, _ = step(state)
    assert len(traces) == 1
