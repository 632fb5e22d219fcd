"""A2CPolicy: the actor-critic policy with RLlib's A2C loss."""

from __future__ import annotations

from typing import Any

import jax

from jaxplan import batch as sb
from jaxplan.a2c.config import A2CHParams
from jaxplan.a2c.loss import a2c_loss
from jaxplan.actor_critic import ActorCriticPolicy


class A2CPolicy(ActorCriticPolicy):
    """Implements `jaxplan.policy.Policy` for A2C/A3C (GAE postprocessing, RLlib's summed
    actor-critic loss; `kl_coeff` is unused)."""

    hparams_class = A2CHParams

    def fragment_values(self, params: Any, hparams: A2CHParams, traj: sb.SampleBatch) -> tuple:
        """GAE's inputs; with `use_gae=False`, lambda 1 (RLlib's discounted returns minus the
        value: the same advantages)."""
        fragment = super().fragment_values(params, hparams, traj)
        return fragment if getattr(self.config, "use_gae", True) else (*fragment[:-1], 1.0)

    def loss(
        self,
        params: Any,
        hparams: A2CHParams,
        kl_coeff: jax.Array,
        batch: sb.SampleBatch,
        axis_name: str | None = None,
    ):
        inputs, values, batch = self.forward(params, batch)
        return a2c_loss(
            logp=self.dist.log_prob(inputs, batch[sb.ACTIONS]),
            advantages=batch[sb.ADVANTAGES],
            entropy=self.dist.entropy(inputs),
            values=values,
            value_targets=batch[sb.VALUE_TARGETS],
            hparams=hparams,
            axis_name=axis_name,
        )
