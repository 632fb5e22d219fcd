"""Each formula of DESIGN.md section 2 against an independent float64 numpy reference.

References are plain Python loops over float64 values; they call no jaxplan code. jaxplan runs
in float32 (x64 off), so comparisons use float32 tolerances, stated at each assert.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.counters import Counter, counter_value
from jaxplan.distributions import Categorical, DiagGaussian
from jaxplan.gae import compute_gae
from jaxplan.ppo.config import PPOConfig, PPOHParams
from jaxplan.ppo.loss import clipped_surrogate, clipped_value_loss, explained_variance, ppo_loss
from jaxplan.stages.concat_batches import num_rounds
from jaxplan.stages.standardize_fields import standardize
from jaxplan.stages.update_kl import update_kl_coeff

# float32 tolerances for results of O(1) magnitude
RTOL = 1e-5
ATOL = 1e-5


def f32(x):
    return np.asarray(x, np.float32)


# Jitted once each: one compilation instead of one per eager op keeps the module fast.
_gae = jax.jit(compute_gae)
_surrogate = jax.jit(clipped_surrogate)
_value_loss = jax.jit(clipped_value_loss)
_explained_variance = jax.jit(explained_variance)
_ppo_loss = jax.jit(ppo_loss, static_argnames="use_kl_loss")
_standardize = jax.jit(standardize)


# ---------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------


def gae_reference(rewards, values, next_values, terminateds, truncateds, gamma, lam):
    """Float64 GAE over a time-major fragment [T, N] (N flattened batch), one column at a time.

    An episode ends at terminated or truncated; only terminated drops the bootstrap value; the
    last step of the fragment bootstraps from next_values and has nothing after it.
    """
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    nv = np.asarray(next_values, np.float64)
    term = np.asarray(terminateds, bool)
    trunc = np.asarray(truncateds, bool)
    num_steps, num_cols = r.shape
    adv = np.zeros((num_steps, num_cols), np.float64)
    for col in range(num_cols):
        following = 0.0  # advantage of the next step of the same episode in this fragment
        for t in reversed(range(num_steps)):
            bootstrap = 0.0 if term[t, col] else gamma * nv[t, col]
            delta = r[t, col] + bootstrap - v[t, col]
            if term[t, col] or trunc[t, col]:
                adv[t, col] = delta
            else:
                adv[t, col] = delta + gamma * lam * following
            following = adv[t, col]
    return adv, adv + v


def test_gae_hand_computed():
    # T=3, three columns, gamma=lambda=0.5 (all numbers dyadic, so float32 is exact):
    #   col 0: no episode end, fragment cut after t=2 (bootstrap from next_values[2] = 2.0)
    #   col 1: terminated at t=1 (next_values[1] = 9.0 must be ignored), new episode at t=2
    #   col 2: truncated at t=1 (bootstrap from V(final_obs) = 4.0), new episode at t=2
    rewards = f32([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [3.0, 3.0, 3.0]])
    values = f32([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [1.5, 1.5, 1.5]])
    next_values = f32([[1.0, 1.0, 1.0], [1.5, 9.0, 4.0], [2.0, 2.0, 2.0]])
    terminated = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
    truncated = np.array([[0, 0, 0], [0, 0, 1], [0, 0, 0]], bool)
    # deltas: col 0: 1 + .5 - .5 = 1.0, 2 + .75 - 1 = 1.75, 3 + 1 - 1.5 = 2.5
    #         col 1: 1.0, 2 + 0 - 1 = 1.0, 2.5;  col 2: 1.0, 2 + 2 - 1 = 3.0, 2.5
    # A (gamma*lambda = 0.25):
    #   col 0: A2 = 2.5, A1 = 1.75 + .25 * 2.5 = 2.375, A0 = 1 + .25 * 2.375 = 1.59375
    #   col 1: A2 = 2.5, A1 = 1.0 (episode ends), A0 = 1 + .25 * 1.0 = 1.25
    #   col 2: A2 = 2.5, A1 = 3.0 (episode ends), A0 = 1 + .25 * 3.0 = 1.75
    expected_adv = np.array([[1.59375, 1.25, 1.75], [2.375, 1.0, 3.0], [2.5, 2.5, 2.5]])
    adv, targets = _gae(
        jnp.asarray(rewards),
        jnp.asarray(values),
        jnp.asarray(next_values),
        jnp.asarray(terminated),
        jnp.asarray(truncated),
        0.5,
        0.5,
    )
    np.testing.assert_array_equal(np.asarray(adv), expected_adv)
    np.testing.assert_array_equal(np.asarray(targets), expected_adv + values)


def _random_fragment(rng, shape, p_term=0.12, p_trunc=0.12):
    rewards = f32(rng.normal(size=shape))
    values = f32(rng.normal(size=shape))
    next_values = f32(rng.normal(size=shape))
    u = rng.uniform(size=shape)
    terminated = u < p_term
    truncated = (u >= p_term) & (u < p_term + p_trunc)
    return rewards, values, next_values, terminated, truncated


@pytest.mark.parametrize("batch_shape", [(6,), (2, 3)])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (1.0, 0.0)])
def test_gae_against_reference(batch_shape, gamma, lam):
    rng = np.random.default_rng(0)
    num_steps = 25
    flat = int(np.prod(batch_shape))
    rewards, values, next_values, terminated, truncated = _random_fragment(rng, (num_steps, flat))
    # Guarantee every case appears: a terminated step, a truncated step, a step with both flags
    # (termination wins), and columns whose last step is a plain fragment cut.
    terminated[3, 0], truncated[3, 0] = True, False
    terminated[5, 1], truncated[5, 1] = False, True
    terminated[7, 2], truncated[7, 2] = True, True
    terminated[-1, :2], truncated[-1, :2] = False, False

    shape = (num_steps, *batch_shape)
    adv, targets = _gae(
        *(jnp.asarray(x.reshape(shape)) for x in (rewards, values, next_values)),
        jnp.asarray(terminated.reshape(shape)),
        jnp.asarray(truncated.reshape(shape)),
        jnp.float32(gamma),
        jnp.float32(lam),
    )
    assert adv.shape == shape and targets.shape == shape
    # the reference works on float32-rounded gamma/lambda, as the jitted code does
    ref_adv, ref_targets = gae_reference(
        rewards,
        values,
        next_values,
        terminated,
        truncated,
        float(np.float32(gamma)),
        float(np.float32(lam)),
    )
    # sums of up to 25 O(1) float32 terms: rtol 1e-5, atol 2e-5
    np.testing.assert_allclose(
        np.asarray(adv).reshape(num_steps, flat), ref_adv, rtol=1e-5, atol=2e-5
    )
    np.testing.assert_allclose(
        np.asarray(targets).reshape(num_steps, flat), ref_targets, rtol=1e-5, atol=2e-5
    )


def test_gae_bootstrap_semantics():
    """next_values matter at truncated steps and at the fragment end, never at terminated ones;
    nothing after an episode end leaks into the advantages before it."""
    rng = np.random.default_rng(1)
    shape = (20, 4)
    rewards, values, next_values, terminated, truncated = _random_fragment(rng, shape)
    terminated[8, :] = True
    truncated[8, :] = False
    truncated[12, :] = True
    terminated[12, :] = False
    terminated[-1, :] = False
    truncated[-1, :] = False

    def run(nv):
        adv, _ = _gae(
            jnp.asarray(rewards),
            jnp.asarray(values),
            jnp.asarray(nv),
            jnp.asarray(terminated),
            jnp.asarray(truncated),
            0.99,
            0.95,
        )
        return np.asarray(adv)

    base = run(next_values)

    # terminated: V(s') is ignored entirely
    nv = next_values.copy()
    nv[terminated] += 100.0
    np.testing.assert_array_equal(run(nv), base)

    def expected_shift(t_bootstrap):
        """Effect of +1 on next_values[t_bootstrap]: gamma (gamma lambda)^k on the k-th step
        before it, back to (not including) the previous episode end of that column."""
        done = terminated | truncated
        out = np.zeros(shape)
        for col in range(shape[1]):
            for t in reversed(range(t_bootstrap + 1)):
                if t < t_bootstrap and done[t, col]:
                    break
                out[t, col] = 0.99 * (0.99 * 0.95) ** (t_bootstrap - t)
        return out

    # truncated at t=12: bootstraps from V(final_obs); the change reaches back to the previous
    # episode end (at the latest the termination at t=8) and not past t=12
    nv = next_values.copy()
    nv[12, :] += 1.0
    expected = expected_shift(12)
    assert np.all(expected[12] > 0) and np.all(expected[:9] == 0) and np.all(expected[13:] == 0)
    # (float32 difference of O(1) numbers: rtol 1e-4, atol 1e-5)
    np.testing.assert_allclose(run(nv) - base, expected, rtol=1e-4, atol=1e-5)

    # fragment cut: the last step bootstraps from next_values[-1]
    nv = next_values.copy()
    nv[-1, :] += 1.0
    expected = expected_shift(shape[0] - 1)
    assert np.all(expected[-1] > 0) and np.all(expected[:13] == 0)
    np.testing.assert_allclose(run(nv) - base, expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# PPO loss terms
# ---------------------------------------------------------------------------------------------


def _loss_inputs(rng, n=64):
    return dict(
        logp=f32(rng.normal(-1.0, 0.5, n)),
        old_logp=None,
        advantages=f32(rng.normal(size=n)),
        kl=f32(np.abs(rng.normal(0.0, 0.05, n))),
        entropy=f32(rng.uniform(0.1, 1.5, n)),
        values=f32(rng.normal(size=n) * 2.0),
        vf_preds=f32(rng.normal(size=n) * 2.0),
        value_targets=f32(rng.normal(size=n) * 2.0),
    )


def _inputs(seed=0, n=64):
    rng = np.random.default_rng(seed)
    d = _loss_inputs(rng, n)
    # log-ratios spread well beyond +-clip_param so both clip sides are exercised
    d["old_logp"] = f32(d["logp"] - rng.normal(0.0, 0.4, n))
    return d


def surrogate_reference(logp, old_logp, adv, clip):
    out = []
    for lp, olp, a in zip(logp, old_logp, adv, strict=True):
        ratio = math.exp(float(lp) - float(olp))
        clipped = min(max(ratio, 1.0 - clip), 1.0 + clip)
        out.append(min(float(a) * ratio, float(a) * clipped))
    return np.array(out)


def value_loss_reference(values, vf_preds, targets, clip):
    out = []
    for v, old, r in zip(values, vf_preds, targets, strict=True):
        v, old, r = float(v), float(old), float(r)
        unclipped = (v - r) ** 2
        clipped_v = old + min(max(v - old, -clip), clip)
        out.append(max(unclipped, (clipped_v - r) ** 2))
    return np.array(out)


def explained_variance_reference(y, pred):
    y = np.asarray(y, np.float64)
    pred = np.asarray(pred, np.float64)
    var_y = np.mean((y - y.mean()) ** 2)
    d = y - pred
    var_d = np.mean((d - d.mean()) ** 2)
    if var_y == 0.0:
        return -1.0 if var_d > 0 else float("nan")
    return max(-1.0, 1.0 - var_d / var_y)


def test_clipped_surrogate():
    d = _inputs()
    clip = 0.2
    ratio = np.exp(d["logp"].astype(np.float64) - d["old_logp"])
    # both clip sides, with both advantage signs, actually occur in the data
    assert np.any((ratio > 1.2) & (d["advantages"] > 0)) and np.any(
        (ratio < 0.8) & (d["advantages"] < 0)
    )
    assert np.any((ratio > 1.2) & (d["advantages"] < 0)) and np.any(
        (ratio < 0.8) & (d["advantages"] > 0)
    )
    out = _surrogate(
        jnp.asarray(d["logp"]), jnp.asarray(d["old_logp"]), jnp.asarray(d["advantages"]), 0.2
    )
    ref = surrogate_reference(d["logp"], d["old_logp"], d["advantages"], clip)
    assert out.shape == ref.shape
    np.testing.assert_allclose(np.asarray(out), ref, rtol=RTOL, atol=ATOL)


def test_clipped_surrogate_hand_values():
    # ratio = e^0.5 ~ 1.6487 > 1.2: positive advantage is clipped at 1.2, negative one is not
    logp, old = jnp.float32([0.5, 0.5, -0.5, -0.5]), jnp.float32([0.0, 0.0, 0.0, 0.0])
    adv = jnp.float32([2.0, -2.0, 2.0, -2.0])
    out = np.asarray(_surrogate(logp, old, adv, jnp.float32(0.2)))
    r_hi, r_lo = math.exp(0.5), math.exp(-0.5)  # r_lo ~ 0.6065 < 0.8
    expected = [2.0 * 1.2, -2.0 * r_hi, 2.0 * r_lo, -2.0 * 0.8]
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_clipped_value_loss():
    d = _inputs(1)
    clip = 0.5
    out = _value_loss(
        jnp.asarray(d["values"]),
        jnp.asarray(d["vf_preds"]),
        jnp.asarray(d["value_targets"]),
        jnp.float32(clip),
    )
    ref = value_loss_reference(d["values"], d["vf_preds"], d["value_targets"], clip)
    # clipping changes the result somewhere (the test can tell clipped from unclipped)
    assert np.any(ref != (d["values"].astype(np.float64) - d["value_targets"]) ** 2)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=RTOL, atol=ATOL)


def test_explained_variance():
    rng = np.random.default_rng(2)
    y = f32(rng.normal(size=100) * 3.0)
    cases = [
        y + f32(rng.normal(size=100) * 0.5),  # good predictor
        f32(rng.normal(size=100) * 3.0),  # unrelated: EV < 0
        -y * 3.0,  # terrible: clipped at -1
        y + 1.0,  # perfect up to a constant offset: EV = 1
    ]
    for pred in cases:
        out = float(_explained_variance(jnp.asarray(y), jnp.asarray(pred)))
        ref = explained_variance_reference(y, pred)
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)
    assert float(_explained_variance(jnp.asarray(y), jnp.asarray(-y * 3.0))) == -1.0
    # constant targets, imperfect predictions: Var(y) = 0 -> -1 (RLlib's value)
    const = jnp.full((10,), 2.0, jnp.float32)
    assert float(_explained_variance(const, const + jnp.arange(10.0))) == -1.0


def _hparams(**kw):
    base = dict(
        lr=3e-4,
        gamma=0.99,
        lambda_=0.95,
        clip_param=0.2,
        vf_clip_param=0.5,
        vf_loss_coeff=0.7,
        entropy_coeff=0.01,
        kl_target=0.01,
    )
    base.update(kw)
    return PPOHParams(**{k: jnp.float32(v) for k, v in base.items()})


@pytest.mark.parametrize("use_kl_loss", [True, False])
def test_ppo_loss_total_and_stats(use_kl_loss):
    d = _inputs(3)
    hp = _hparams()
    kl_coeff = 0.3
    total, stats = _ppo_loss(
        **{k: jnp.asarray(v) for k, v in d.items()},
        hparams=hp,
        kl_coeff=jnp.float32(kl_coeff),
        use_kl_loss=use_kl_loss,
    )
    surr = surrogate_reference(d["logp"], d["old_logp"], d["advantages"], 0.2)
    vf = value_loss_reference(d["values"], d["vf_preds"], d["value_targets"], 0.5)
    kl = np.mean(d["kl"].astype(np.float64))
    ent = np.mean(d["entropy"].astype(np.float64))
    policy_loss = -np.mean(surr)
    vf_loss = np.mean(vf)
    ref_total = policy_loss + 0.7 * vf_loss - 0.01 * ent
    if use_kl_loss:
        ref_total += kl_coeff * kl
    expected = {
        "cur_kl_coeff": kl_coeff,
        "cur_lr": 3e-4,
        "total_loss": ref_total,
        "policy_loss": policy_loss,
        "vf_loss": vf_loss,
        "vf_explained_var": explained_variance_reference(d["value_targets"], d["values"]),
        "kl": kl,
        "entropy": ent,
        "entropy_coeff": 0.01,
    }
    assert set(stats) == set(expected)
    np.testing.assert_allclose(float(total), ref_total, rtol=RTOL, atol=ATOL)
    for name, value in expected.items():
        np.testing.assert_allclose(float(stats[name]), value, rtol=RTOL, atol=ATOL, err_msg=name)
    # the KL term is large enough here that the two settings are distinguishable
    assert kl_coeff * kl > 100 * ATOL


def test_ppo_loss_with_default_hparams_and_gradient():
    """PPOHParams.from_config(PPOConfig()) works; d total / d logp matches the reference's
    derivative (-A r / B where unclipped, 0 where the clipped branch is the minimum)."""
    d = _inputs(4, n=32)
    hp = PPOHParams.from_config(PPOConfig())  # clip 0.3, vf_clip 10, vf_coeff 1, ent 0

    def total_of_logp(logp):
        total, _ = _ppo_loss(
            **{k: jnp.asarray(v) for k, v in d.items() if k != "logp"},
            logp=logp,
            hparams=hp,
            kl_coeff=jnp.float32(0.2),
            use_kl_loss=True,
        )
        return total

    total = float(total_of_logp(jnp.asarray(d["logp"])))
    surr = surrogate_reference(d["logp"], d["old_logp"], d["advantages"], 0.3)
    vf = value_loss_reference(d["values"], d["vf_preds"], d["value_targets"], 10.0)
    ref = -surr.mean() + vf.mean() + 0.2 * d["kl"].astype(np.float64).mean()
    np.testing.assert_allclose(total, ref, rtol=RTOL, atol=ATOL)

    grad = np.asarray(jax.jit(jax.grad(total_of_logp))(jnp.asarray(d["logp"])))
    n = len(d["logp"])
    ref_grad = np.zeros(n)
    for i in range(n):
        a = float(d["advantages"][i])
        ratio = math.exp(float(d["logp"][i]) - float(d["old_logp"][i]))
        clipped = min(max(ratio, 0.7), 1.3)
        # the unclipped branch is active when it is the minimum and r is inside the band or
        # the clipped value equals it; otherwise the gradient is zero
        if a * ratio <= a * clipped:
            ref_grad[i] = -a * ratio / n
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Distributions
# ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=0)
def _dist_terms(dist, inputs, actions, new_inputs):
    """log_prob, entropy, KL(old || new) and KL(old || old) in one compiled call."""
    return (
        dist.log_prob(inputs, actions),
        dist.entropy(inputs),
        dist.kl(inputs, new_inputs),
        dist.kl(inputs, inputs),
    )


def _log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


def test_categorical_against_reference():
    rng = np.random.default_rng(5)
    dist = Categorical(4)
    shape = (3, 5)
    logits = f32(rng.normal(size=(*shape, 4)) * 2.0)
    new_logits = f32(logits + rng.normal(size=logits.shape))
    actions = rng.integers(0, 4, size=shape).astype(np.int32)

    logp, ent, kl, kl_self = map(np.asarray, _dist_terms(dist, logits, actions, new_logits))
    assert logp.shape == ent.shape == kl.shape == shape

    ref_logp, ref_ent, ref_kl = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for idx in np.ndindex(*shape):
        lp = _log_softmax([float(x) for x in logits[idx]])
        lq = _log_softmax([float(x) for x in new_logits[idx]])
        ref_logp[idx] = lp[actions[idx]]
        ref_ent[idx] = -sum(math.exp(a) * a for a in lp)
        ref_kl[idx] = sum(math.exp(a) * (a - b) for a, b in zip(lp, lq, strict=True))
    np.testing.assert_allclose(logp, ref_logp, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ent, ref_ent, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(kl, ref_kl, rtol=1e-4, atol=ATOL)
    # KL(p || p) = 0, KL >= 0; uniform logits have entropy log 4
    np.testing.assert_allclose(kl_self, 0.0, atol=1e-6)
    assert np.all(kl > 0)
    np.testing.assert_allclose(float(dist.entropy(jnp.zeros(4))), math.log(4), rtol=1e-6)


def test_diag_gaussian_against_reference():
    rng = np.random.default_rng(6)
    dim = 3
    dist = DiagGaussian(dim)
    shape = (4, 2)
    mean = rng.normal(size=(*shape, dim))
    log_std = rng.uniform(-1.0, 0.7, size=(*shape, dim))
    inputs = f32(np.concatenate([mean, log_std], axis=-1))
    new_inputs = f32(inputs + rng.normal(0.0, 0.3, size=inputs.shape))
    actions = f32(mean + rng.normal(size=mean.shape))

    logp, ent, kl, kl_self = map(np.asarray, _dist_terms(dist, inputs, actions, new_inputs))
    assert logp.shape == ent.shape == kl.shape == shape

    ref_logp, ref_ent, ref_kl = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for idx in np.ndindex(*shape):
        x = [float(v) for v in inputs[idx]]
        y = [float(v) for v in new_inputs[idx]]
        for i in range(dim):
            m, s = x[i], math.exp(x[dim + i])
            m2, s2 = y[i], math.exp(y[dim + i])
            a = float(actions[idx][i])
            ref_logp[idx] += -((a - m) ** 2) / (2 * s * s) - math.log(s * math.sqrt(2 * math.pi))
            ref_ent[idx] += 0.5 * math.log(2 * math.pi * math.e * s * s)
            ref_kl[idx] += math.log(s2 / s) + (s * s + (m - m2) ** 2) / (2 * s2 * s2) - 0.5
    np.testing.assert_allclose(logp, ref_logp, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ent, ref_ent, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(kl, ref_kl, rtol=1e-4, atol=ATOL)
    np.testing.assert_allclose(kl_self, 0.0, atol=1e-6)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 1)])
def test_samples_are_jax_randoms_numbers(shape):
    """`Categorical.sample` and `DiagGaussian.sample` draw their noise flat (`flat_draw`, a
    rank-1 draw XLA compiles faster under `vmap`): bitwise `jax.random.categorical` and
    `jax.random.normal`'s numbers, alone and `vmap`ped over keys (one per actor group)."""
    rng = np.random.default_rng(7)
    keys = jax.random.split(jax.random.PRNGKey(3), 4)
    logits = f32(rng.normal(size=(4, *shape, 3)) * 3.0)
    cat = Categorical(3)
    ours = jax.jit(jax.vmap(cat.sample))(keys, logits)
    theirs = jax.jit(jax.vmap(lambda k, x: jax.random.categorical(k, x, axis=-1)))(keys, logits)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    np.testing.assert_array_equal(np.asarray(cat.sample(keys[0], logits[0])), np.asarray(theirs[0]))
    assert len(np.unique(np.asarray(ours))) == 3  # not a constant

    gauss = DiagGaussian(2)  # mean 0, log_std 0: the sample is the noise itself
    ours = jax.jit(jax.vmap(gauss.sample))(keys, jnp.zeros((4, *shape, 4)))
    noise = jax.jit(jax.vmap(lambda k: jax.random.normal(k, (*shape, 2))))(keys)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(noise))


# ---------------------------------------------------------------------------------------------
# KL coefficient rule
# ---------------------------------------------------------------------------------------------


def kl_rule_reference(coeff, kl, target):
    if kl > 2.0 * target:
        return coeff * 1.5
    if kl < 0.5 * target:
        return coeff * 0.5
    return coeff  # inside the band, and NaN (every comparison is False)


@pytest.mark.parametrize(
    "kl",
    [0.05, 0.0201, 0.02, 0.01, 0.005, 0.0049, 0.001, 0.0, math.inf, math.nan, 1e6],
)
def test_update_kl_coeff_scalar(kl):
    target = np.float32(0.01)
    coeff = np.float32(0.2)
    out = float(update_kl_coeff(jnp.float32(coeff), jnp.float32(kl), jnp.float32(target)))
    # the reference sees the same float32-rounded inputs (2 * 0.01f == 0.02f exactly)
    ref = kl_rule_reference(float(coeff), float(np.float32(kl)), float(target))
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_update_kl_coeff_branches_explicit():
    target = jnp.float32(0.01)
    assert float(update_kl_coeff(jnp.float32(0.2), jnp.float32(0.03), target)) == pytest.approx(0.3)
    assert float(update_kl_coeff(jnp.float32(0.2), jnp.float32(0.001), target)) == pytest.approx(
        0.1
    )
    for band in (0.005, 0.01, 0.02, math.nan):
        assert float(update_kl_coeff(jnp.float32(0.2), jnp.float32(band), target)) == np.float32(
            0.2
        )


def test_update_kl_coeff_vectorized_and_jitted():
    rng = np.random.default_rng(7)
    kls = f32(10.0 ** rng.uniform(-4, -0.5, 200))
    kls[::17] = np.nan
    coeffs = f32(rng.uniform(0.01, 1.0, 200))
    out = np.asarray(
        jax.jit(update_kl_coeff)(jnp.asarray(coeffs), jnp.asarray(kls), jnp.float32(0.01))
    )
    ref = [
        kl_rule_reference(float(c), float(k), float(np.float32(0.01)))
        for c, k in zip(coeffs, kls, strict=True)
    ]
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    # all three outcomes occur
    ratio = out / coeffs
    for r in (0.5, 1.0, 1.5):
        assert np.any(np.isclose(ratio, r))


# ---------------------------------------------------------------------------------------------
# Standardization
# ---------------------------------------------------------------------------------------------


def standardize_reference(x):
    x = np.asarray(x, np.float64).ravel()
    n = len(x)
    mean = sum(x) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / n)  # population std
    return np.array([(v - mean) / max(1e-4, std) for v in x])


@pytest.mark.parametrize("shape", [(50,), (6, 7)])
def test_standardize_against_reference(shape):
    rng = np.random.default_rng(8)
    x = f32(rng.normal(3.0, 2.5, size=shape))
    out = np.asarray(_standardize(jnp.asarray(x)))
    assert out.shape == shape
    # float32: rtol 1e-5, atol 1e-5 (outputs are O(1))
    np.testing.assert_allclose(out.ravel(), standardize_reference(x), rtol=RTOL, atol=ATOL)
    # population, not sample, std: the standardized values have mean 0 and mean square 1
    np.testing.assert_allclose(np.mean(out.astype(np.float64) ** 2), 1.0, rtol=1e-5)


def test_standardize_floor():
    # constant input: every value equals the mean -> zeros, not NaN
    out = np.asarray(_standardize(jnp.full((10,), 0.25, jnp.float32)))
    np.testing.assert_array_equal(out, np.zeros(10))
    # std ~1e-6 < 1e-4: divided by the 1e-4 floor, so outputs are ~0.01, not ~1
    rng = np.random.default_rng(9)
    x = f32(rng.normal(size=40) * 1e-6)
    out = np.asarray(_standardize(jnp.asarray(x)))
    ref = standardize_reference(x)
    assert np.max(np.abs(ref)) < 0.1
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# ConcatBatches round count
# ---------------------------------------------------------------------------------------------


def train_batch_reference(min_batch_size, round_size):
    """RLlib's ConcatBatches: buffer rounds until the count reaches the minimum."""
    total = 0
    while True:
        total += round_size
        if total >= min_batch_size:
            return total


def test_num_rounds_against_reference():
    for min_batch_size in range(1, 120):
        for round_size in range(1, 40):
            rounds = num_rounds(min_batch_size, round_size)
            assert rounds * round_size == train_batch_reference(min_batch_size, round_size), (
                min_batch_size,
                round_size,
            )
    assert num_rounds(4000, 200) == 20
    assert num_rounds(40, 16) == 3
    with pytest.raises(ValueError):
        num_rounds(40, 0)


# ---------------------------------------------------------------------------------------------
# 64-bit-safe counter
# ---------------------------------------------------------------------------------------------


def test_counter_add_carries_exactly():
    rng = np.random.default_rng(10)
    c = Counter.zero()
    expected = 0
    steps = [2**32 - 1, 0, 1, 5, 0, 2**32 - 3, 2**31, 2**31, 7]
    steps += [int(v) for v in rng.integers(0, 2**32, size=40, dtype=np.int64)]
    for n in steps:
        c = c.add(n)
        expected += n
        assert counter_value(c) == expected
    assert expected > 2**36  # many carries happened
    # uint32 and int32 array increments, and under jit
    add = jax.jit(lambda c, n: c.add(n))
    for n in (jnp.uint32(4_000_000_000), jnp.int32(2**31 - 1), jnp.uint32(2**32 - 1)):
        c = add(c, n)
        expected += int(n)
        assert counter_value(c) == expected


def test_counter_wraps_low_word_exactly_at_boundary():
    c = Counter.zero().add(2**32 - 2)
    assert counter_value(c) == 2**32 - 2
    c = c.add(1)
    assert (int(c.hi), int(c.lo)) == (0, 2**32 - 1)
    c = c.add(1)
    assert (int(c.hi), int(c.lo)) == (1, 0)
    assert counter_value(c) == 2**32
    c = c.add(2**32 - 1)
    assert counter_value(c) == 2**33 - 1
    c = c.add(1)
    assert counter_value(c) == 2**33


def test_counter_add_rejects_out_of_range():
    with pytest.raises(ValueError):
        Counter.zero().add(2**32)
    with pytest.raises(ValueError):
        Counter.zero().add(-1)


def test_counter_ge_exact():
    values = [0, 1, 2**32 - 1, 2**32, 2**32 + 1, 5 * 2**32 + 17, 2**63 + 3, 2**64 - 1]
    probes = set()
    for v in values:
        probes.update(p for p in (v - 1, v, v + 1) if 0 <= p < 2**64)
    probes.update([2**33, 2**40, 2**53 + 1])
    for v in values:
        c = Counter(lo=jnp.uint32(v & 0xFFFFFFFF), hi=jnp.uint32(v >> 32))
        assert counter_value(c) == v
        for p in sorted(probes):
            assert bool(c.ge(p)) == (v >= p), (v, p)


def test_counter_stacked_values():
    counters = jax.vmap(lambda n: Counter.zero().add(2**32 - 1).add(n))(
        jnp.arange(4, dtype=jnp.uint32)
    )
    np.testing.assert_array_equal(counter_value(counters), [2**32 - 1 + i for i in range(4)])
