"""Draft families: unconstrained parameters -> a draft ``MarkovChain``, for tuning with optax.

A family is a small frozen (hashable) description of the draft's shape: ``V``, ``T`` and, for the
low-rank family, the rank. Its parameters are logits, a pytree of arrays that any optax optimiser
can update freely; ``family.chain(params)`` maps them through a softmax to a draft
``MarkovChain`` (always a valid chain, whatever the parameter values).

| family | parameters | transition ``p_n(b | a)`` |
| --- | --- | --- |
| ``FullDraft`` | ``(T, V, V)`` logits | one matrix per position (contains every target) |
| ``StationaryDraft`` | ``(V, V)`` logits | one matrix shared by all positions |
| ``LowRankDraft`` | ``(V, r)``, ``(r, V)``, ``(V,)`` | stationary, logits ``U @ W + b`` of rank ``r`` |
| ``ContextFreeDraft`` | ``(T, V)`` logits | one distribution per position, ignoring ``a`` |

The draft's prompt law ``init`` is uniform in every family: decoding never uses it (the prompt
``x_0`` is the target's), so it is not a parameter.

``specjax.tuning.kl_fit(family, target)`` is the baseline users would otherwise use: the
maximum-likelihood (forward-KL) fit ``argmin_p E_{x ~ q}[-log p(x_{1:T})]``, in closed form for
the full, stationary and context-free families and by optax for the low-rank family.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax import _memory
from specjax.models.markov import MarkovChain
from specjax.models.markov import check_chain
from specjax.numerics import HIGHEST
from specjax.numerics import tiny
from specjax.theory.laws import marginals

__all__ = [
    "ContextFreeDraft",
    "DraftFamily",
    "FAMILIES",
    "FullDraft",
    "LowRankDraft",
    "StationaryDraft",
    "draft_family",
]


def _dtype():
    return jnp.result_type(float)


def _uniform_init(num_states, dtype):
    return jnp.full((num_states,), 1.0 / num_states, dtype)


def _logits_of(probs):
    """Finite logits of probabilities: ``log(max(probs, tiny))`` (a zero becomes about -87 in
    float32, -708 in float64: a probability that underflows to 0 under the softmax)."""
    return jnp.log(jnp.maximum(probs, tiny(probs)))


@dataclasses.dataclass(frozen=True)
class DraftFamily:
    """Base class: a parametrisation of draft chains with ``V`` states and horizon ``T``.

    Subclasses define ``init`` (random parameters), ``chain`` (parameters -> ``MarkovChain``) and
    ``kl_fit_closed_form`` (or ``None`` when there is none). Families are frozen dataclasses, so
    they are hashable and can be static arguments of ``jax.jit``; every family (subclasses
    included) is also a pytree without leaves, so passing one through a transformation carries
    it as static data (``jax.jit(tune_draft)`` then reaches ``tune_draft``'s own refusal).
    """

    num_states: int
    horizon: int

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_static(cls)

    def __post_init__(self):
        _checks.check_positive_int("num_states", self.num_states)
        _checks.check_positive_int("horizon", self.horizon)

    @property
    def name(self) -> str:
        raise NotImplementedError

    def shapes(self):
        """The parameters' pytree of shapes."""
        raise NotImplementedError

    def shape_leaves(self):
        """``(shapes, treedef)``: the parameters' leaf shapes in pytree order, and the tree."""
        return jax.tree_util.tree_flatten(self.shapes(), is_leaf=lambda s: isinstance(s, tuple))

    def init(self, key, scale: float = 1.0):
        """Random parameters: logits ``scale * N(0, 1)``, one independent draw per leaf."""
        _checks.check_key(key)
        scale = _checks.check_finite_non_negative("scale", scale)
        self._check_fits()
        return _draw(self, key, scale)

    def uniform(self):
        """Parameters of the uniform draft (all logits zero). For ``LowRankDraft`` a saddle
        point of tuning (see ``LowRankDraft.uniform``): start from ``init(key, scale)``."""
        self._check_fits()
        shapes, treedef = self.shape_leaves()
        return jax.tree_util.tree_unflatten(treedef, [jnp.zeros(s, _dtype()) for s in shapes])

    def _check_fits(self) -> None:
        """Refuse, before any work, parameters (and the ``(T, V, V)`` draft they make) that
        cannot fit: about three copies of the larger of the two (draws, logits, softmax)."""
        shapes, _ = self.shape_leaves()
        entries = max(sum(math.prod(s) for s in shapes),
                      self.horizon * self.num_states ** 2)
        _memory.check_fits(
            3 * entries * jnp.dtype(_dtype()).itemsize,
            argument=f"num_states = {self.num_states:,} with horizon = {self.horizon:,}",
            what=f"the {self.name} parameters and the (T, V, V) draft they make",
            remedy="use a smaller V, or a family with fewer parameters (LowRankDraft, "
                   "StationaryDraft)")

    def transitions(self, params) -> jax.Array:
        """The ``(T, V, V)`` transition logits (up to a per-row constant)."""
        raise NotImplementedError

    def chain(self, params) -> MarkovChain:
        """The draft ``MarkovChain``: uniform prompt law, softmax of ``transitions(params)``
        (one compiled program per family and parameter shapes, called eagerly or traced)."""
        return _chain(self, params)

    def kl_fit_closed_form(self, target: MarkovChain):
        """Forward-KL fit in closed form (parameters), or ``None`` when the family has none."""
        del target
        return None

    def check_target(self, target) -> None:
        """Raise ``ValueError`` unless ``target`` is a chain with this family's ``V`` and ``T``."""
        check_chain("target", target)
        if (target.num_states, target.horizon) != (self.num_states, self.horizon):
            raise ValueError(
                f"target has V = {target.num_states}, T = {target.horizon} but the draft family "
                f"{self!r} has V = {self.num_states}, T = {self.horizon}")


# The families' maps, compiled once per family (static: families are hashable) and argument
# shapes: called eagerly (tests, notebooks, kl_fit's start) their dozen operations would each
# compile a program of their own per shape.
@functools.partial(jax.jit, static_argnums=0)
def _draw(family, key, scale):
    shapes, treedef = family.shape_leaves()
    keys = jax.random.split(key, len(shapes))
    return jax.tree_util.tree_unflatten(
        treedef, [scale * jax.random.normal(k, s, _dtype()) for k, s in zip(keys, shapes)])


@functools.partial(jax.jit, static_argnums=0)
def _chain(family, params) -> MarkovChain:
    trans = jax.nn.softmax(family.transitions(params), axis=-1)
    return MarkovChain.tree_unflatten(None, (_uniform_init(family.num_states, trans.dtype),
                                             trans))


@functools.partial(jax.jit, static_argnums=0)
def _spectral_start(family, target):
    logits = jnp.log(_stationary_fit(target, family.horizon) + 1e-6)
    logits = logits - jnp.mean(logits, axis=-1, keepdims=True)
    bias = jnp.mean(logits, axis=0)
    u, s, vt = jnp.linalg.svd(logits - bias[None, :], full_matrices=False)
    root = jnp.sqrt(s[:family.rank])
    u, vt = u[:, :family.rank] * root[None, :], vt[:family.rank] * root[:, None]
    return {"u": u, "w": vt, "bias": bias}


def _target_weights(target):
    """``(T, V)``: ``mu_{n-1}(a)``, the target's law of the context ``x_{n-1}`` at position n."""
    return marginals(target)[:-1]


def _stationary_fit(target, horizon):
    """``(V, V)``: the forward-KL optimal stationary transition matrix (probabilities)."""
    # argmin_p sum_n sum_a mu_{n-1}(a) KL(q_n(.|a) || p(.|a)): for each row a, the average of
    # the target's rows q_n(.|a) weighted by mu_{n-1}(a). A context never reached (total
    # weight 0) does not matter; it gets the plain average.
    weights = _target_weights(target)  # (T, V)
    total = jnp.sum(weights, axis=0)  # (V,)
    reached = total > 0
    weights = jnp.where(reached, weights, 1.0)
    total = jnp.where(reached, total, float(horizon))
    return jnp.einsum("na,nab->ab", weights, target.trans,
                      precision=HIGHEST) / total[:, None]


jax.tree_util.register_static(DraftFamily)


@dataclasses.dataclass(frozen=True)
class FullDraft(DraftFamily):
    """One transition matrix per position: parameters ``(T, V, V)`` logits."""

    @property
    def name(self):
        return "full"

    def shapes(self):
        return (self.horizon, self.num_states, self.num_states)

    def transitions(self, params):
        return params

    def kl_fit_closed_form(self, target):
        # The family contains the target: the fit is the target itself.
        return _logits_of(target.trans)


@dataclasses.dataclass(frozen=True)
class StationaryDraft(DraftFamily):
    """One matrix shared by all positions (a small model approximating a non-stationary one)."""

    @property
    def name(self):
        return "stationary"

    def shapes(self):
        return (self.num_states, self.num_states)

    def transitions(self, params):
        return jnp.broadcast_to(params, (self.horizon,) + params.shape)

    def kl_fit_closed_form(self, target):
        return _logits_of(_stationary_fit(target, self.horizon))


@dataclasses.dataclass(frozen=True)
class LowRankDraft(DraftFamily):
    """Stationary with rank-``r`` logits ``U @ W + b``: parameters ``{"u", "w", "bias"}``.

    ``bias`` (a ``(V,)`` row added to every context) lets a draft of small rank still match the
    average next-token law. There is no closed-form KL fit; ``specjax.tuning.kl_fit`` runs optax
    from ``spectral_start``. The rank is at most ``V`` (``r = V`` is the stationary family).

    ``uniform()`` (both factors zero) is a saddle point: the factors' gradients vanish there and
    tuning from it only moves the bias. Tune from ``init(key, scale)`` or ``spectral_start``.
    """

    rank: int = 2

    def __post_init__(self):
        super().__post_init__()
        _checks.check_positive_int("rank", self.rank)
        if self.rank > self.num_states:
            raise ValueError(f"rank must be at most num_states = {self.num_states} (the logits "
                             f"are a V x V matrix), got rank = {self.rank}")

    def uniform(self):
        """Parameters of the uniform draft: factors and bias all zero.

        A saddle point for tuning: at ``U = 0, W = 0`` the factors' gradients
        (``dL/dU = G W^T``, ``dL/dW = U^T G`` for ``G = dL/dlogits``) are exactly zero, so
        gradient steps move only ``bias`` and the draft stays context-free. To tune, start from
        ``init(key, scale)`` (random factors; a small ``scale`` stays close to uniform) or from
        ``spectral_start(target)``.
        """
        return super().uniform()

    @property
    def name(self):
        return "lowrank"

    def shapes(self):
        return {"u": (self.num_states, self.rank), "w": (self.rank, self.num_states),
                "bias": (self.num_states,)}

    def spectral_start(self, target):
        """Deterministic starting parameters for fitting: the rank-``r`` truncated SVD of the
        (row-centred) logits of the stationary forward-KL fit, probabilities floored at 1e-6."""
        return _spectral_start(self, target)

    def transitions(self, params):
        logits = jnp.dot(params["u"], params["w"], precision=HIGHEST)
        logits = logits + params["bias"][None, :]
        return jnp.broadcast_to(logits, (self.horizon,) + logits.shape)


@dataclasses.dataclass(frozen=True)
class ContextFreeDraft(DraftFamily):
    """One distribution per position that ignores the previous token: ``(T, V)`` logits."""

    @property
    def name(self):
        return "contextfree"

    def shapes(self):
        return (self.horizon, self.num_states)

    def transitions(self, params):
        return jnp.broadcast_to(params[:, None, :],
                                (self.horizon, self.num_states, self.num_states))

    def kl_fit_closed_form(self, target):
        # argmin sum_a mu_{n-1}(a) KL(q_n(.|a) || p_n): the mixture sum_a mu_{n-1}(a) q_n(.|a),
        # i.e. the target's marginal law of x_n.
        return _logits_of(marginals(target)[1:])


FAMILIES = {"full": FullDraft, "stationary": StationaryDraft, "lowrank": LowRankDraft,
            "contextfree": ContextFreeDraft}


def draft_family(name: str, num_states: int, horizon: int, *, rank: int = 2) -> DraftFamily:
    """A draft family by name: ``"full"``, ``"stationary"``, ``"lowrank"`` or ``"contextfree"``.

    Args:
      name: the family.
      num_states: ``V``.
      horizon: ``T``.
      rank: ``r`` for ``"lowrank"`` (ignored otherwise).
    """
    if name not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {name!r}")
    if name == "lowrank":
        return LowRankDraft(num_states, horizon, rank)
    return FAMILIES[name](num_states, horizon)
