"""The per-decoder samplers of ``specjax``'s first API: one-line conveniences over ``decode``.

``speculative_decoding(key, draft, target, C, lookahead=K)`` is
``decode(key, Speculative(lookahead=K), draft, target, C)``: the same tokens for the same key.
Research scripts written against these names keep working; new code can hold the decoder as a
value and pass it to ``decode``, ``exact`` and ``decoding_statistics`` alike.
"""

from __future__ import annotations

from specjax.decoders.autoregressive import Autoregressive
from specjax.decoders.batch import BatchSpeculative
from specjax.decoders.biased import BiasedSpeculative
from specjax.decoders.block import BlockVerification
from specjax.decoders.rejection import RejectionRule
from specjax.decoders.speculative import Speculative
from specjax.sampling.decoding import decode
from specjax.sampling.engine import DecodingTrace

__all__ = [
    "autoregressive_decoding",
    "batch_speculative_decoding",
    "biased_speculative_decoding",
    "block_verification_decoding",
    "rejection_decoding",
    "speculative_decoding",
]


def _with_decoder(build):
    """Records how ``decoding_statistics``' deprecated sampler-first form maps the sampler's
    arguments to ``(decoder, draft, target, num_chains, run settings)``."""

    def attach(sampler):
        sampler.decoder_from = build
        return sampler

    return attach


def _pair(build):
    def decoder_from(draft, target, num_chains, *, horizon=None, sharding=None, **settings):
        return build(**settings), draft, target, num_chains, dict(horizon=horizon,
                                                                  sharding=sharding)
    return decoder_from


@_with_decoder(lambda model, num_chains, *, horizon=None, sharding=None: (
    Autoregressive(), None, model, num_chains, dict(horizon=horizon, sharding=sharding)))
def autoregressive_decoding(key, model, num_chains: int, *, horizon: int | None = None,
                            sharding=None) -> DecodingTrace:
    """``decode(key, Autoregressive(), None, model, num_chains)``: Algorithm 3, one target call
    per token, nothing rejected."""
    return decode(key, Autoregressive(), None, model, num_chains, horizon=horizon,
                  sharding=sharding)


@_with_decoder(_pair(lambda lookahead=None: Speculative(lookahead)))
def speculative_decoding(key, draft, target, num_chains: int, *, lookahead: int | None = None,
                         horizon: int | None = None, sharding=None) -> DecodingTrace:
    """``decode(key, Speculative(lookahead), draft, target, num_chains)``: Algorithm 1;
    ``lookahead=None`` is the paper's ``K = T``, an int ``K`` adds a bonus token after ``K``
    accepted drafts (``num_rejections`` is the paper's ``N_rej``, Theorem 1)."""
    return decode(key, Speculative(lookahead), draft, target, num_chains, horizon=horizon,
                  sharding=sharding)


@_with_decoder(_pair(lambda num_drafts, lookahead=None, replacement=True: BatchSpeculative(
    num_drafts, replacement=replacement, lookahead=lookahead)))
def batch_speculative_decoding(key, draft, target, num_chains: int, *, num_drafts,
                               lookahead: int | None = None, replacement: bool = True,
                               horizon: int | None = None, sharding=None) -> DecodingTrace:
    """``decode(key, BatchSpeculative(num_drafts, replacement=..., lookahead=...), ...)``:
    Algorithm 4 with ``M`` drafts verified depth-first (Theorem 3)."""
    return decode(key, BatchSpeculative(num_drafts, replacement=replacement,
                                        lookahead=lookahead),
                  draft, target, num_chains, horizon=horizon, sharding=sharding)


@_with_decoder(_pair(lambda epsilon, residual="optimal", lookahead=None: BiasedSpeculative(
    epsilon, residual=residual, lookahead=lookahead)))
def biased_speculative_decoding(key, draft, target, num_chains: int, *, epsilon,
                                residual: str = "optimal", lookahead: int | None = None,
                                horizon: int | None = None, sharding=None) -> DecodingTrace:
    """``decode(key, BiasedSpeculative(epsilon, residual=..., lookahead=...), ...)``: lossy SD
    with ``b = min(1, (q + eps) / p)`` (Section 4, Theorems 4-5)."""
    return decode(key, BiasedSpeculative(epsilon, residual=residual, lookahead=lookahead),
                  draft, target, num_chains, horizon=horizon, sharding=sharding)


@_with_decoder(_pair(lambda accept_prob, residual, lookahead=None: RejectionRule(
    accept_prob, residual, lookahead=lookahead)))
def rejection_decoding(key, draft, target, num_chains: int, *, accept_prob, residual,
                       lookahead: int | None = None, horizon: int | None = None,
                       sharding=None) -> DecodingTrace:
    """``decode(key, RejectionRule(accept_prob, residual, lookahead=...), ...)``: any rule of
    the general framework (Algorithm 2)."""
    return decode(key, RejectionRule(accept_prob, residual, lookahead=lookahead), draft, target,
                  num_chains, horizon=horizon, sharding=sharding)


@_with_decoder(_pair(lambda lookahead: BlockVerification(lookahead)))
def block_verification_decoding(key, draft, target, num_chains: int, *, lookahead: int,
                                sharding=None) -> DecodingTrace:
    """``decode(key, BlockVerification(lookahead), draft, target, num_chains)``: Sun et al.
    2024's block verification, ``K`` drafts per call verified jointly."""
    return decode(key, BlockVerification(lookahead), draft, target, num_chains,
                  sharding=sharding)
