"""Every sampler with representative settings, shared by the scale tests and their subprocess.

``CASES`` maps a name to ``(sampler, kwargs)``; ``arguments(sampler, draft, target)`` gives the
positional arguments after the key and before ``num_chains``.
"""

import jax.numpy as jnp

import specjax


def sd_accept(p, q):
    return jnp.where(p > 0, jnp.minimum(1.0, q / jnp.where(p > 0, p, 1.0)), 1.0)


def sd_residual(p, q, b):
    return jnp.maximum(q - p, 0.0)


CASES = {
    "autoregressive": (specjax.autoregressive_decoding, {}),
    "sd": (specjax.speculative_decoding, {}),
    "sd K=3": (specjax.speculative_decoding, dict(lookahead=3)),
    "batch M=3": (specjax.batch_speculative_decoding, dict(num_drafts=3)),
    "batch M=2 K=2": (specjax.batch_speculative_decoding, dict(num_drafts=2, lookahead=2)),
    "biased eps=0.1 UNO K=4": (specjax.biased_speculative_decoding,
                               dict(epsilon=0.1, residual="target", lookahead=4)),
    "rejection": (specjax.rejection_decoding, dict(accept_prob=sd_accept, residual=sd_residual)),
}


def arguments(sampler, draft, target) -> tuple:
    return (target,) if sampler is specjax.autoregressive_decoding else (draft, target)


def instance(num_states=5, horizon=12, seed=3):
    """A small float32 pair with zeros, so edge cases occur in every run."""
    import jax
    key_d, key_t = jax.random.split(jax.random.key(seed))
    draft = specjax.random_markov_chain(key_d, num_states, horizon, concentration=0.5)
    target = specjax.random_markov_chain(key_t, num_states, horizon, concentration=0.5)
    return draft, target
