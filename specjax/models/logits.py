"""Logits processing as serving engines do it: temperature, top-k, top-p, min-p.

``process_logits(logits, ...)`` turns ``(..., V)`` logits into the probabilities an engine samples
from; ``process_chain(chain, ...)`` applies the same to every row of a ``MarkovChain``, so the
exact theory (``specjax.exact``, ``verify_drafts_law``, the tuning objectives) reads off what a
temperature or a truncation does to acceptance and calls, exactly.

Semantics (shared by vLLM v1 and HuggingFace ``transformers`` unless said):

* **temperature** ``t``: logits divided by ``t``; ``t = 0`` is greedy: the one-hot of the first
  maximal logit (vLLM's ``all_greedy`` path, HuggingFace's ``do_sample=False``).
* **top-k** ``k``: logits below the ``k``-th largest masked (``-inf``); ties with the ``k``-th are
  kept (both engines compare with ``<`` against the ``k``-th value).
* **top-p** ``P``: on the softmax of the current logits, sorted ascending, the tokens whose
  cumulative mass is at most ``1 - P`` are masked; the largest token is always kept (both
  engines' ``probs_sum <= 1 - p``). Ties in probability are sorted by token id (lower ids first,
  so masked first); engines' unstable sorts may order ties differently.
* **min-p** ``m``: tokens of probability below ``m`` times the largest probability masked.
* **order**: ``"vllm"`` (v1 ``Sampler``: temperature, min-p, then top-k and top-p) or
  ``"huggingface"`` (the warpers' order: temperature, top-k, top-p, min-p). They differ only when
  top-p and min-p are both set: top-p's masses are renormalised after min-p in vLLM, min-p's
  threshold is unaffected by renormalisation in both.

A processed row is renormalised over the kept tokens (softmax of the masked logits).
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.models.markov import MarkovChain

__all__ = ["process_logits", "process_chain", "ORDERS"]

#: The engines whose order of processing steps ``process_logits`` follows.
ORDERS = ("vllm", "huggingface")


def _masked(logits, drop):
    return jnp.where(drop, -jnp.inf, logits)


def _top_k(logits, k):
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return _masked(logits, logits < kth)


def _top_p(logits, top_p):
    probs = jax.nn.softmax(logits, axis=-1)
    order = jnp.argsort(probs, axis=-1, stable=True)  # ascending, ties by token id
    sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
    drop_sorted = jnp.cumsum(sorted_probs, axis=-1) <= 1 - top_p
    drop_sorted = drop_sorted.at[..., -1].set(False)  # the largest token is always kept
    drop = jnp.zeros_like(drop_sorted)
    drop = jnp.put_along_axis(drop, order, drop_sorted, axis=-1, inplace=False)
    return _masked(logits, drop)


def _min_p(logits, min_p):
    probs = jax.nn.softmax(logits, axis=-1)
    return _masked(logits, probs < min_p * jnp.max(probs, axis=-1, keepdims=True))


def _check_settings(temperature, top_k, top_p, min_p, order, num_tokens):
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if _checks.is_concrete(temperature):
        t = jnp.asarray(temperature)
        if t.shape != () or not bool(jnp.isfinite(t)) or float(t) < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        _checks.check_static_int("top_k", top_k)
        if not 1 <= top_k:
            raise ValueError(f"top_k must be a positive int (or None), got {top_k}")
    for name, value, low_open in (("top_p", top_p, True), ("min_p", min_p, False)):
        if value is None or not _checks.is_concrete(value):
            continue
        v = jnp.asarray(value)
        ok = v.shape == () and bool(jnp.isfinite(v)) and float(v) <= 1 \
            and (float(v) > 0 if low_open else float(v) >= 0)
        if not ok:
            interval = "(0, 1]" if low_open else "[0, 1]"
            raise ValueError(f"{name} must be a number in {interval} (or None), got {value!r}")
    del num_tokens


def process_logits(logits, *, temperature=1.0, top_k: int | None = None, top_p=None,
                   min_p=None, order: str = "vllm") -> jax.Array:
    """The probabilities an engine samples from after processing ``logits``.

    Args:
      logits: ``(..., V)`` floating logits (``-inf`` allowed: a masked token).
      temperature: ``t >= 0`` (may be traced, then it must be positive); ``0`` is greedy.
      top_k: a static positive int, or ``None``; values above ``V`` keep every token.
      top_p: in ``(0, 1]``, or ``None`` (may be traced).
      min_p: in ``[0, 1]``, or ``None`` (may be traced).
      order: ``"vllm"`` or ``"huggingface"`` (see the module docstring).

    Returns:
      ``(..., V)`` probabilities, zero on masked tokens. Differentiable in ``logits`` and
      ``temperature`` (the masks are piecewise constant).

    Raises:
      ValueError: a non-floating ``logits``, a row with no finite logit, or a setting out of its
        range (``top_k`` traced included); before any work. Value checks are skipped for traced
        settings and logits.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
      >>> tuple(round(float(v), 3) for v in specjax.process_logits(logits, top_p=0.8))
      (0.625, 0.375, 0.0, 0.0)
      >>> specjax.process_logits(logits, temperature=0.0).tolist()
      [1.0, 0.0, 0.0, 0.0]
    """
    logits = jnp.asarray(logits)
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"logits must be floating-point, got dtype {logits.dtype}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape (..., V) with V >= 1, got {logits.shape}")
    num_tokens = logits.shape[-1]
    _check_settings(temperature, top_k, top_p, min_p, order, num_tokens)
    if _checks.is_concrete(logits):
        values = np.asarray(logits)
        if np.isnan(values).any() or (values == np.inf).any():
            raise ValueError("logits must be finite or -inf, got NaN or +inf")
        if (~np.isfinite(values).any(axis=-1)).any():
            raise ValueError("logits has a row with no finite logit (every token masked)")
    if isinstance(temperature, numbers.Real) and not isinstance(temperature, bool) \
            and temperature == 0:
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), num_tokens, dtype=logits.dtype)
    x = logits / jnp.asarray(temperature, logits.dtype)
    steps = {"top_k": (lambda z: _top_k(z, min(top_k, num_tokens))) if top_k else None,
             "top_p": (lambda z: _top_p(z, top_p)) if top_p is not None else None,
             "min_p": (lambda z: _min_p(z, min_p)) if min_p is not None else None}
    names = ("min_p", "top_k", "top_p") if order == "vllm" else ("top_k", "top_p", "min_p")
    for name in names:
        if steps[name] is not None:
            x = steps[name](x)
    return jax.nn.softmax(x, axis=-1)


def process_chain(chain: MarkovChain, *, temperature=1.0, top_k: int | None = None, top_p=None,
                  min_p=None, order: str = "vllm") -> MarkovChain:
    """``chain`` with every row (the prompt law and each transition row) processed as an engine
    processes the logits ``log(row)``: see ``process_logits``.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cold = specjax.process_chain(target, temperature=0.5)
      >>> bool(specjax.exact(specjax.Speculative(), draft, cold).expected_rejections
      ...      > specjax.exact(specjax.Speculative(), draft, target).expected_rejections)
      True
    """
    if not isinstance(chain, MarkovChain):
        raise ValueError(f"chain must be a specjax.MarkovChain, got {type(chain).__name__}")
    settings = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, order=order)
    return MarkovChain(process_logits(jnp.log(chain.init), **settings),
                       process_logits(jnp.log(chain.trans), **settings))
