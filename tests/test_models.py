"""RLlib's normc init from one draw: column norms, zero biases, independent layers."""

import jax
import numpy as np
import pytest

from jaxplan.models import ActorCritic, init_actor_critic


@pytest.mark.parametrize("share", [False, True])
def test_normc_init(share):
    model = ActorCritic(
        hiddens=(32, 16), activation="tanh", num_outputs=3, obs_ndim=2, share_layers=share
    )
    params = init_actor_critic(model, jax.random.PRNGKey(0), (5, 2))["params"]
    outputs = {("pi_head",), ("v_head",), ("actor", "Dense_2"), ("critic", "Dense_2")}
    kernels = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = tuple(k.key for k in path)
        x = np.asarray(leaf, np.float64)
        if names[-1] == "bias":
            assert not x.any()
            continue
        std = 0.01 if names[:-1] in outputs else 1.0
        np.testing.assert_allclose(np.linalg.norm(x, axis=0), std, rtol=1e-5)
        kernels.append(x / std)
    assert len(kernels) == (4 if share else 6)
    # every layer gets its own slice of the draw (no two kernels share values)
    firsts = {round(float(k.flat[0]), 6) for k in kernels}
    assert len(firsts) == len(kernels)
    # the forward pass runs with these params and the output layers start near zero
    inputs, value = model.apply({"params": params}, np.ones((7, 5, 2), np.float32))
    assert inputs.shape == (7, 3) and value.shape == (7,)
    assert np.abs(inputs).max() < 0.1 and np.abs(value).max() < 0.1


def test_init_depends_on_key():
    model = ActorCritic(hiddens=(8,), activation="tanh", num_outputs=2, obs_ndim=1)
    a = init_actor_critic(model, jax.random.PRNGKey(0), (4,))
    b = init_actor_critic(model, jax.random.PRNGKey(1), (4,))
    assert not np.array_equal(
        a["params"]["actor"]["Dense_0"]["kernel"], b["params"]["actor"]["Dense_0"]["kernel"]
    )


@pytest.mark.parametrize("features", [1, 2, 16, 17])
def test_output_dense_is_dense(features):
    """`OutputDense` (the transposed kernel behind an optimization barrier for narrow
    outputs on the CPU) has `nn.Dense`'s params and gives its outputs and gradients."""
    import flax.linen as nn
    import jax.numpy as jnp

    from jaxplan.models import OutputDense

    x = jax.random.normal(jax.random.PRNGKey(0), (5, 3, 64))
    ours, dense = OutputDense(features), nn.Dense(features)
    params = dense.init(jax.random.PRNGKey(1), x)
    params = jax.tree.map(lambda p: p + 0.1, params)  # a non-zero bias too
    assert jax.tree.map(jnp.shape, ours.init(jax.random.PRNGKey(1), x)) == jax.tree.map(
        jnp.shape, params
    )

    def loss(module, params, x):
        return jnp.sum(jnp.tanh(module.apply(params, x)) ** 2)

    for module_out, dense_out in [
        (jax.jit(ours.apply)(params, x), jax.jit(dense.apply)(params, x)),
        (
            jax.jit(jax.grad(lambda p, x: loss(ours, p, x), (0, 1)))(params, x),
            jax.jit(jax.grad(lambda p, x: loss(dense, p, x), (0, 1)))(params, x),
        ),
    ]:
        for a, b in zip(jax.tree.leaves(module_out), jax.tree.leaves(dense_out), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # float64 reference of the forward pass
    k, b = (np.asarray(params["params"][n], np.float64) for n in ("kernel", "bias"))
    np.testing.assert_allclose(
        np.asarray(ours.apply(params, x)), np.asarray(x, np.float64) @ k + b, rtol=1e-5, atol=1e-5
    )
    narrow = "optimization_barrier" in str(jax.make_jaxpr(ours.apply)(params, x))
    assert narrow == (jax.default_backend() == "cpu" and features <= 16)
