"""Deprecated conveniences: names that only repeat an entry point under another name.

Every function here warns ``DeprecationWarning`` with the call to write instead, then returns
exactly what that call returns (the same tokens for the same key, the same exact values). They
are kept so that scripts written against specjax's first API keep running; new code holds the
decoder as a value and passes it to ``decode``, ``exact``, ``accepted_length`` or ``objective``:

| deprecated | write instead |
| --- | --- |
| ``exact_speculative_decoding(d, t, lookahead=K)`` | ``exact(Speculative(K), d, t)`` |
| ``exact_batch_speculative_decoding(d, t, num_drafts=M, ...)`` | ``exact(BatchSpeculative(M, ...), d, t)`` |
| ``exact_biased_speculative_decoding(d, t, epsilon=e, ...)`` | ``exact(BiasedSpeculative(e, ...), d, t)`` |
| ``exact_rejection_decoding(d, t, accept_prob=a, residual=r)`` | ``exact(RejectionRule(a, r), d, t)`` |
| ``exact_block_expected_calls(d, t, lookahead=K)`` | ``exact(BlockVerification(K), d, t).expected_calls`` |
| ``exact_block_accepted_length(d, t, lookahead=K, position=n)`` | ``accepted_length(BlockVerification(K), d, t, position=n)`` |
| ``block_verification_decoding(key, d, t, C, lookahead=K)`` | ``decode(key, BlockVerification(K), d, t, C)`` |
| ``sd_rejections(lookahead=K)`` | ``objective(Speculative(K), "rejections")`` |
| ``batch_rejections(M, lookahead=K)`` | ``objective(BatchSpeculative(M, lookahead=K), "rejections")`` |
| ``target_calls(lookahead=K)`` | ``objective(Speculative(K), "calls")`` |

The names that moved from the top level to a subpackage (kernels such as the stopping policies,
result types of secondary functions) are not here: ``specjax.<name>`` still resolves for them,
with a ``DeprecationWarning`` naming their subpackage.
"""

import warnings

from specjax.sampling import samplers as _samplers
from specjax.theory import block as _block
from specjax.theory import values as _values
from specjax.tuning import objectives as _objectives

__all__ = [
    "batch_rejections",
    "block_verification_decoding",
    "exact_batch_speculative_decoding",
    "exact_biased_speculative_decoding",
    "exact_block_accepted_length",
    "exact_block_expected_calls",
    "exact_rejection_decoding",
    "exact_speculative_decoding",
    "sd_rejections",
    "target_calls",
]


def _warn(name: str, instead: str) -> None:
    warnings.warn(f"specjax.compat.{name} is deprecated: use {instead}", DeprecationWarning,
                  stacklevel=3)


def exact_speculative_decoding(draft, target, *, lookahead: int | None = None,
                               horizon: int | None = None):
    """Deprecated: ``specjax.exact(specjax.Speculative(lookahead), draft, target,
    horizon=horizon)``, which returns the same ``ExactDecoding`` (Theorem 1 for
    ``lookahead=None``)."""
    _warn("exact_speculative_decoding",
          "specjax.exact(specjax.Speculative(lookahead), draft, target)")
    return _values.exact_speculative_decoding(draft, target, lookahead=lookahead,
                                              horizon=horizon)


def exact_batch_speculative_decoding(draft, target, *, num_drafts, lookahead: int | None = None,
                                     replacement: bool = True, horizon: int | None = None):
    """Deprecated: ``specjax.exact(specjax.BatchSpeculative(num_drafts, replacement=...,
    lookahead=...), draft, target)`` (Theorem 3)."""
    _warn("exact_batch_speculative_decoding",
          "specjax.exact(specjax.BatchSpeculative(num_drafts, replacement=replacement, "
          "lookahead=lookahead), draft, target)")
    return _values.exact_batch_speculative_decoding(
        draft, target, num_drafts=num_drafts, lookahead=lookahead, replacement=replacement,
        horizon=horizon)


def exact_biased_speculative_decoding(draft, target, *, epsilon, residual: str = "optimal",
                                      lookahead: int | None = None, horizon: int | None = None):
    """Deprecated: ``specjax.exact(specjax.BiasedSpeculative(epsilon, residual=...,
    lookahead=...), draft, target)`` (Theorems 4-5)."""
    _warn("exact_biased_speculative_decoding",
          "specjax.exact(specjax.BiasedSpeculative(epsilon, residual=residual, "
          "lookahead=lookahead), draft, target)")
    return _values.exact_biased_speculative_decoding(
        draft, target, epsilon=epsilon, residual=residual, lookahead=lookahead, horizon=horizon)


def exact_rejection_decoding(draft, target, *, accept_prob, residual,
                             lookahead: int | None = None, horizon: int | None = None):
    """Deprecated: ``specjax.exact(specjax.RejectionRule(accept_prob, residual,
    lookahead=...), draft, target)`` (Algorithm 2)."""
    _warn("exact_rejection_decoding",
          "specjax.exact(specjax.RejectionRule(accept_prob, residual, lookahead=lookahead), "
          "draft, target)")
    return _values.exact_rejection_decoding(draft, target, accept_prob=accept_prob,
                                            residual=residual, lookahead=lookahead,
                                            horizon=horizon)


def exact_block_expected_calls(draft, target, *, lookahead: int):
    """Deprecated: ``specjax.exact(specjax.BlockVerification(lookahead), draft,
    target).expected_calls``."""
    _warn("exact_block_expected_calls",
          "specjax.exact(specjax.BlockVerification(lookahead), draft, target).expected_calls")
    return _block.exact_block_expected_calls(draft, target, lookahead=lookahead)


def exact_block_accepted_length(draft, target, *, lookahead: int, position: int = 1,
                                prev_token: int | None = None):
    """Deprecated: ``specjax.accepted_length(specjax.BlockVerification(lookahead), draft,
    target, position=position)`` (``(V,)``; index it with ``prev_token``)."""
    _warn("exact_block_accepted_length",
          "specjax.accepted_length(specjax.BlockVerification(lookahead), draft, target, "
          "position=position)")
    return _block.exact_block_accepted_length(draft, target, lookahead=lookahead,
                                              position=position, prev_token=prev_token)


def block_verification_decoding(key, draft, target, num_chains: int, *, lookahead: int,
                                sharding=None):
    """Deprecated: ``specjax.decode(key, specjax.BlockVerification(lookahead), draft, target,
    num_chains)``, which returns the same tokens for the same key."""
    _warn("block_verification_decoding",
          "specjax.decode(key, specjax.BlockVerification(lookahead), draft, target, num_chains)")
    return _samplers.block_verification_decoding(key, draft, target, num_chains,
                                                 lookahead=lookahead, sharding=sharding)


#: ``decoding_statistics``' deprecated sampler-first form reads how the sampler's arguments map
#: to a decoder.
block_verification_decoding.decoder_from = _samplers.block_verification_decoding.decoder_from


def sd_rejections(*, lookahead: int | None = None):
    """Deprecated: ``specjax.objective(specjax.Speculative(lookahead), "rejections")`` (the same
    value; ``specjax.tuning.make_objective("sd")`` keeps the name for command lines)."""
    _warn("sd_rejections", 'specjax.objective(specjax.Speculative(lookahead), "rejections")')
    return _objectives.sd_rejections(lookahead=lookahead)


def batch_rejections(num_drafts, *, lookahead: int | None = None):
    """Deprecated: ``specjax.objective(specjax.BatchSpeculative(num_drafts,
    lookahead=lookahead), "rejections")``."""
    _warn("batch_rejections", "specjax.objective(specjax.BatchSpeculative(num_drafts, "
          'lookahead=lookahead), "rejections")')
    return _objectives.batch_rejections(num_drafts, lookahead=lookahead)


def target_calls(*, lookahead: int | None = None):
    """Deprecated: ``specjax.objective(specjax.Speculative(lookahead), "calls")``."""
    _warn("target_calls", 'specjax.objective(specjax.Speculative(lookahead), "calls")')
    return _objectives.target_calls(lookahead=lookahead)

