"""Logits processing as serving engines do it: temperature, top-k, top-p, min-p.

``process_logits(logits, ...)`` turns ``(..., V)`` logits into the probabilities an engine samples
from; ``process_chain(chain, ...)`` applies the same to every row of a ``MarkovChain``, so the
exact theory (``specjax.exact``, ``verify_drafts_law``, the tuning objectives) reads off what a
temperature or a truncation does to acceptance and calls, exactly.

Semantics (shared by vLLM v1 and HuggingFace ``transformers`` unless said):

* **temperature** ``t``: logits divided by ``t``; ``t < 1e-5`` is greedy (vLLM's
  ``_SAMPLING_EPS``): the one-hot of the first maximal logit (vLLM's ``all_greedy`` path,
  HuggingFace's ``do_sample=False``).
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

from typing import Any
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax._pytree import array_field
from specjax._pytree import pytree_dataclass
from specjax.models.base import ModelKind
from specjax.models.base import ProtocolModel
from specjax.models.base import as_model
from specjax.models.base import model_view
from specjax.models.finite_state import FiniteStateModel
from specjax.models.markov import MarkovChain
from specjax.models.ngram import NGramModel

__all__ = ["process_logits", "process_chain", "process_model", "ProcessedModel", "ORDERS"]

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


#: Temperatures below this are greedy, as in vLLM (``_SAMPLING_EPS``): dividing by a smaller one
#: overflows the logits (and a float32 temperature below about 1e-45 is 0).
GREEDY_BELOW = 1e-5


def _scalar(value):
    """A concrete setting as a NumPy scalar array (NumPy: jnp ops would trace under a jit); NaN
    for what is not a number (strings included)."""
    if isinstance(value, (str, bytes)):
        return np.asarray(np.nan)
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return np.asarray(np.nan)


def _check_settings(temperature, top_k, top_p, min_p, order):
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if _checks.is_concrete(temperature):
        t = _scalar(temperature)
        if isinstance(temperature, bool) or t.shape != () or not np.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        _checks.check_static_int("top_k", top_k)
        if not 1 <= top_k:
            raise ValueError(f"top_k must be a positive int (or None), got {top_k}")
    for name, value, low_open in (("top_p", top_p, True), ("min_p", min_p, False)):
        if value is None or not _checks.is_concrete(value):
            continue
        v = _scalar(value)
        ok = not isinstance(value, bool) and v.shape == () and np.isfinite(v) and v <= 1 \
            and (v > 0 if low_open else v >= 0)
        if not ok:
            interval = "(0, 1]" if low_open else "[0, 1]"
            raise ValueError(f"{name} must be a number in {interval} (or None), got {value!r}")


def process_logits(logits, *, temperature=1.0, top_k: int | None = None, top_p=None,
                   min_p=None, order: str = "vllm") -> jax.Array:
    """The probabilities an engine samples from after processing ``logits``.

    Args:
      logits: ``(..., V)`` floating logits (``-inf`` allowed: a masked token).
      temperature: ``t >= 0`` (may be traced); below ``1e-5`` it is greedy (vLLM's rule).
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
    _check_settings(temperature, top_k, top_p, min_p, order)
    _checks.check_logits("logits", logits)
    greedy = jax.nn.one_hot(jnp.argmax(logits, axis=-1), num_tokens, dtype=logits.dtype)
    if _checks.is_concrete(temperature) and float(_scalar(temperature)) < GREEDY_BELOW:
        return greedy
    t = jnp.asarray(temperature, logits.dtype)
    warm = t >= GREEDY_BELOW
    x = logits / jnp.where(warm, t, jnp.ones_like(t))  # a traced tiny one selects greedy below
    steps = {"top_k": (lambda z: _top_k(z, min(top_k, num_tokens))) if top_k else None,
             "top_p": (lambda z: _top_p(z, top_p)) if top_p is not None else None,
             "min_p": (lambda z: _min_p(z, min_p)) if min_p is not None else None}
    names = ("min_p", "top_k", "top_p") if order == "vllm" else ("top_k", "top_p", "min_p")
    for name in names:
        if steps[name] is not None:
            x = steps[name](x)
    probs = jax.nn.softmax(x, axis=-1)
    if _checks.is_concrete(temperature):
        return probs
    return jnp.where(warm, probs, greedy)


def process_chain(chain: MarkovChain, *, temperature=1.0, top_k: int | None = None, top_p=None,
                  min_p=None, order: str = "vllm") -> MarkovChain:
    """``chain`` with every row (the prompt law and each transition row) processed as an engine
    processes the logits ``log(row)``: see ``process_logits``.

    Example:
      >>> import specjax
      >>> draft, target = specjax.paper_instance()
      >>> cold = specjax.models.process_chain(target, temperature=0.5)
      >>> bool(specjax.exact(specjax.Speculative(), draft, cold).expected_rejections
      ...      > specjax.exact(specjax.Speculative(), draft, target).expected_rejections)
      True
    """
    if not isinstance(chain, MarkovChain):
        raise ValueError(f"chain must be a specjax.MarkovChain, got {type(chain).__name__}")
    settings = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, order=order)
    return MarkovChain(process_logits(jnp.log(chain.init), **settings),
                       process_logits(jnp.log(chain.trans), **settings))


@pytree_dataclass
class ProcessedModel(ProtocolModel):
    """A protocol model whose rows are processed as an engine processes logits.

    ``probs(state)`` is ``process_logits(logits, ...)`` of ``model.logits(state)`` when the model
    has that method (a model that gives logits), else of ``log(model.probs(state))``;
    ``init_state``, ``update`` and ``num_states`` are the model's. Build it with
    ``specjax.models.process_model``.

    Attributes:
      model: the wrapped model (a pytree child).
      temperature, top_p, min_p: leaves (may be traced; ``None`` for no truncation).
      top_k: static int or ``None``.
      order: ``"vllm"`` or ``"huggingface"`` (static).
    """

    kind: ClassVar[ModelKind] = ModelKind.PROTOCOL

    model: Any = array_field()
    temperature: Any = array_field(default=1.0)
    top_p: Any = array_field(default=None)
    min_p: Any = array_field(default=None)
    top_k: int | None = None
    order: str = "vllm"

    @property
    def num_states(self) -> int:
        return self.model.num_states

    def init_state(self):
        return self.model.init_state()

    def update(self, state, token):
        return self.model.update(state, token)

    def logits(self, state):
        """The wrapped model's logits in ``state`` (``log probs`` for a probability model)."""
        return as_model(self.model).logits(state)

    def _process(self, logits):
        """``process_logits`` of one row of logits with this model's settings."""
        return process_logits(logits, temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, min_p=self.min_p, order=self.order)

    def probs(self, state):
        return self._process(self.logits(state))

    def probs_block(self, state, tokens):
        """``(K + 1, V)`` processed rows after each prefix of ``tokens`` (batched scoring): from
        the wrapped model's ``logits_block(state, tokens)`` or ``probs_block`` when it has one,
        else from a scan of ``logits`` and ``update`` (the wrapped model's ``logits_block``:
        ``specjax.models.base.ProtocolModel.logits_block``)."""
        return jax.vmap(self._process)(as_model(self.model).logits_block(state, tokens))


def as_probability_model(model):
    """A model that gives logits (a ``logits(state)`` method and no ``probs``) as a protocol
    model (``ProcessedModel``: softmax of its logits); any other value unchanged. ``decode`` and
    ``decoding_statistics`` call it on both models, so a neural model need not compute a softmax
    itself."""
    view = model_view(model)
    if isinstance(view, ProtocolModel) and not view.has_probs:
        return ProcessedModel(model=model)
    return model


def process_model(model, *, temperature=1.0, top_k: int | None = None, top_p=None,
                  min_p=None, order: str = "vllm"):
    """Any model with its rows processed as an engine processes logits (``process_logits``).

    A ``MarkovChain`` gives a ``MarkovChain`` (``process_chain``), a ``FiniteStateModel`` or an
    ``NGramModel`` the same kind of model with its table processed (so the exact theory applies
    to them), any other protocol model a ``ProcessedModel`` wrapper (Monte Carlo). A model that
    gives logits rather than probabilities has a ``logits(state)`` method and no ``probs``:
    ``process_model(model)`` makes it a protocol model (softmax, and the processing asked for).

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> lm = specjax.models.NGramModel(jnp.array([[0.5, 0.3, 0.2]] * 3), 2)
      >>> cold = specjax.models.process_model(lm, temperature=0.5, top_k=2)
      >>> tuple(round(float(v), 3) for v in cold.probs(cold.init_state()))
      (0.735, 0.265, 0.0)
    """
    settings = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, order=order)
    if isinstance(model, MarkovChain):
        return process_chain(model, **settings)
    if isinstance(model, FiniteStateModel):
        return FiniteStateModel(model.start, model.next_state,
                                process_logits(jnp.log(model.table), **settings))
    if isinstance(model, NGramModel):
        return NGramModel(process_logits(jnp.log(model.table), **settings), model.order)
    as_model(model, "model")  # names the members a model of the protocol lacks
    _check_settings(temperature, top_k, top_p, min_p, order)
    return ProcessedModel(model, temperature, top_p, min_p, top_k=top_k, order=order)
