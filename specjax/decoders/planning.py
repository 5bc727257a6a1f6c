"""One planning path: the checks and bindings every entry point makes before any work.

``plan_run(decoder, draft, target, engine=..., horizon=...)`` validates a decoder against its
models and resolves its static settings, once, for the sampler (``specjax.decode``,
``specjax.decoding_statistics``), the exact values (``specjax.exact``, ``accepted_length``,
``decoding_time``, ``engine_metrics``), the long-run rate and the output chain. It returns a
``Run`` that the engines trust: they do not check again. The given-drafts kernel has no models
(its rows are given) and shares the decoder's part, ``resolve_decoder``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax

from specjax import _checks
from specjax.decoders.base import CallDecoder
from specjax.decoders.base import check_decoder
from specjax.models.checks import check_horizon
from specjax.models.checks import model_kind

__all__ = ["ENGINES", "MAX_COUNTER", "Run", "check_supported", "plan_run", "resolve_decoder"]

#: Chains (and a call-level decoder's uniforms) are numbered with 32-bit counters.
MAX_COUNTER = 2**32

ENGINES = ("monte_carlo", "exact")

_KIND_NAMES = {"finite_state": "FiniteStateModels",
               "protocol": "autoregressive models other than MarkovChain"}


class Run(NamedTuple):
    """A validated run: the decoder to run, its models and their kind, and the static sizes."""

    decoder: object  # validated; a call-level decoder truncated to the horizon for the sampler
    draft: object  # the target itself for a decoder that does not use the draft
    target: object
    kind: str  # "markov", "finite_state" or "protocol": the models' kind
    horizon: int  # T
    lookahead: int  # the resolved K (0 for autoregressive decoding)


def resolve_decoder(decoder) -> None:
    """The decoder's own checks, before any model is read: a decoder value with valid
    settings (``validate``)."""
    check_decoder(decoder)
    decoder.validate()


def check_supported(decoder, kind: str, engine: str) -> None:
    """Raise ``ValueError`` unless ``decoder`` supports models of ``kind`` for ``engine``
    (``"protocol"``: Monte Carlo; ``"finite_state"``: exact values)."""
    if kind == "markov" or kind in decoder.model_kinds:
        return
    name = type(decoder).__name__
    lead = f"decoder {name} does not support Monte Carlo" if engine == "monte_carlo" else \
        f"{name} has no exact values"
    raise ValueError(
        f"{lead} on {_KIND_NAMES[kind]} (the draft and target given): its "
        f"{'sampler' if kind == 'protocol' else 'exact law'} is written for MarkovChain models "
        f"(see the support table in docs/guides/decoders.md)")


def plan_run(decoder, draft, target, *, engine: str, horizon=None, num_chains=None) -> Run:
    """Validates ``decoder`` on ``draft`` and ``target`` for ``engine`` before any work.

    Args:
      decoder: any decoder value.
      draft: the draft model (``None`` for a decoder that does not use it).
      target: the target model.
      engine: ``"monte_carlo"`` (any model kind the decoder's sampler supports; finite-state
        models run as protocol models) or ``"exact"`` (two ``MarkovChain``s, or two
        ``FiniteStateModel``s the decoder has exact values on).
      horizon: ``T``; required for models other than ``MarkovChain``.
      num_chains: the chains of a Monte Carlo run (static; they set the rows a protocol
        model's run evaluates at once).

    Returns:
      ``Run``; for ``"monte_carlo"``, ``kind`` is ``"markov"`` or ``"protocol"`` (the engine's
      kind) and a call-level decoder is truncated to the drafts that fit in ``T``.

    Raises:
      ValueError: a decoder or setting that is not valid, models of a kind the decoder does not
        support for ``engine``, or a decoder too large for the models (``check``,
        ``check_exact``).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    resolve_decoder(decoder)
    if draft is None and not decoder.uses_draft:
        draft = target
    kind = model_kind(draft, target)
    if all(_checks.is_concrete(leaf) for leaf in jax.tree_util.tree_leaves((draft, target))):
        decoder.probe(draft, target, kind)
    if engine == "exact":
        if kind == "protocol":
            raise ValueError(
                "draft and target must both be MarkovChains, or both FiniteStateModels on one "
                "state space (exact quantities need a finite state space: lift n-grams with "
                f"as_finite_state), got {type(draft).__name__} and {type(target).__name__}")
        check_supported(decoder, kind, engine)
    horizon = check_horizon(kind, target, horizon)
    if engine == "monte_carlo":
        kind = "markov" if kind == "markov" else "protocol"  # finite-state models are protocol
        check_supported(decoder, kind, engine)
        _checks.check_static_int("num_chains", num_chains)
    lookahead = decoder.resolve_lookahead(horizon)
    num_states = target.num_states
    if engine == "exact" and isinstance(decoder, CallDecoder):
        decoder.check_exact(num_states, horizon)
    else:
        rows = horizon * num_states if kind == "markov" else \
            num_chains if engine == "monte_carlo" else target.num_contexts
        if isinstance(decoder, CallDecoder):
            decoder = decoder.truncate(lookahead)
        decoder.check(num_states, rows)
    return Run(decoder, draft, target, kind, horizon, lookahead)
