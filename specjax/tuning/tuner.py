"""Tune a draft for what decoding costs: an optax loop over exact, differentiable objectives.

The exact quantities of ``specjax.theory`` are differentiable in the draft, so a draft family
(``specjax.tuning.families``) can be tuned by gradient descent on the cost of decoding itself instead of
being distilled by maximum likelihood (``kl_fit``) in the hope that acceptance follows.

Example:
  >>> import jax, specjax
  >>> draft, target = specjax.paper_instance()
  >>> family = specjax.tuning.StationaryDraft(num_states=7, horizon=50)
  >>> fit = specjax.tuning.kl_fit(family, target)
  >>> sd = specjax.objective(specjax.Speculative())
  >>> result = specjax.tune_draft(family, fit, target, sd, num_steps=200)
  >>> bool(result.value < specjax.expected_rejections(family.chain(fit), target))
  True

References:
  Theorem 1 (SD), Theorem 3 (batch SD) and Theorems 4-5 (the biased trade-off) of the paper;
  Zhou et al. 2023 (DistillSpec) on TV rather than KL as the distillation target for SD.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any
from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax import _checks
from specjax._pytree import tree_where
from specjax.models.markov import MarkovChain
from specjax.tuning.families import DraftFamily
from specjax.tuning.objectives import kl_divergence

__all__ = ["MAX_STEPS", "TuneResult", "kl_fit", "tune_draft"]

# --- the tuner -------------------------------------------------------------------------------------


class TuneResult(NamedTuple):
    """What ``tune_draft`` returns.

    Attributes:
      params: the best parameters seen (lowest objective); ``value <= history[0]`` always.
      draft: ``family.chain(params)``.
      value: the objective at ``params``.
      history: the objective at every iterate ``0..num_steps`` (iterate 0 is the start).
      best_step: the index in ``history`` of ``params``.
      final_params: the last iterate (to continue from).
      skipped: updates skipped because the objective, gradient or new parameters were not
        finite (a skip repeats until the end: tuning stopped at the first one).
    """

    params: Any
    draft: MarkovChain
    value: jax.Array  # shape=(), dtype=float
    history: jax.Array  # shape=(num_steps + 1,), dtype=float
    best_step: jax.Array  # shape=(), dtype=int32
    final_params: Any
    skipped: jax.Array  # shape=(), dtype=int32


class _Carry(NamedTuple):
    params: Any
    opt_state: Any
    best_params: Any
    best_value: jax.Array  # shape=()
    best_step: jax.Array  # shape=(), int32
    step: jax.Array  # shape=(), int32
    skipped: jax.Array  # shape=(), int32


def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)
              if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return functools.reduce(jnp.logical_and, leaves, jnp.array(True))


def _record(carry, value):
    """Keeps ``carry.params`` as the best so far when ``value`` beats it (a non-finite value
    never does)."""
    better = jnp.isfinite(value) & (value < carry.best_value)
    return carry._replace(best_params=tree_where(better, carry.params, carry.best_params),
                          best_value=jnp.where(better, value, carry.best_value),
                          best_step=jnp.where(better, carry.step, carry.best_step))


def _evaluate(objective, draft, target) -> jax.Array:
    """``objective(draft, target)``, refused (at trace time, before any step) unless it is a
    floating-point scalar: ``tune_draft`` minimises one number."""
    value = objective(draft, target)
    if isinstance(value, float):
        value = jnp.asarray(value)
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape != () or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        got = (f"an array of shape {shape} and dtype {dtype}" if shape is not None
               else f"a {type(value).__name__}")
        raise ValueError(f"objective must return a floating-point scalar (shape ()), got {got} "
                         f"from {objective!r}; reduce it to one number (e.g. its sum or mean)")
    return value


@functools.partial(jax.jit, static_argnames=("family", "objective", "optimizer", "length"))
def _chunk(carry, target, num_steps, last, *, family, objective, optimizer, length):
    """``num_steps <= length`` optimiser steps (traced: one program serves every chunk of a run,
    the remainder and the evaluation of the start, ``num_steps = 0``) and their objective values
    in the first ``num_steps`` entries of a ``(length,)`` buffer. When ``last`` (the end of the
    run, or the start), one more pass of the step evaluates the objective at the params reached
    (its update dropped: the program holds one copy of the objective and its gradient, not a
    separate evaluation), returned as ``end`` and recorded as a candidate best."""
    def loss(params):
        return _evaluate(objective, family.chain(params), target)

    def step(i, state):
        carry, values, _ = state
        value, grads = jax.value_and_grad(loss)(carry.params)
        moved = _record(carry, value)
        updates, opt_state = optimizer.update(grads, carry.opt_state, carry.params)
        params = optax.apply_updates(carry.params, updates)
        ok = jnp.isfinite(value) & _all_finite(grads) & _all_finite(params)
        moved = moved._replace(params=tree_where(ok, params, carry.params),
                               opt_state=tree_where(ok, opt_state, carry.opt_state),
                               step=carry.step + 1,
                               skipped=carry.skipped + jnp.where(ok, 0, 1).astype(jnp.int32))
        stepping = i < num_steps  # the pass after the last step only evaluates
        carry = tree_where(stepping, moved, carry)
        index = jnp.minimum(i, length - 1)
        values = values.at[index].set(jnp.where(stepping, value, values[index]))
        return carry, values, value

    dtype = jax.eval_shape(loss, carry.params).dtype
    state = (carry, jnp.zeros((length,), dtype), jnp.zeros((), dtype))
    carry, values, end = jax.lax.fori_loop(0, num_steps + jnp.where(last, 1, 0), step, state)
    return _record(carry, jnp.where(last, end, jnp.inf)), values, end


# What tune_draft and kl_fit say under a transformation.
_HOST_LOOP = "a Python loop over compiled chunks of steps"
_NO_RECOMPILE = "It compiles its own loop, and a new target or new params do not recompile it"

_DEFAULT_LEARNING_RATE = 0.05
_DEFAULT_OPTIMIZER = optax.adam(_DEFAULT_LEARNING_RATE)


def _check_family(family, target):
    if not isinstance(family, DraftFamily):
        raise ValueError(f"family must be a specjax DraftFamily, got {type(family).__name__}")
    family.check_target(target)


def _check_params(family, params):
    want, want_tree = family.shape_leaves()
    if jax.tree_util.tree_structure(params) != want_tree:
        raise ValueError(f"params must be a pytree of arrays shaped like {family.shapes()} for "
                         f"{family!r} (e.g. family.init(key)), got structure "
                         f"{jax.tree_util.tree_structure(params)}")
    leaves = jax.tree_util.tree_leaves(params)
    got = [tuple(jnp.shape(x)) for x in leaves]
    if got != want:
        raise ValueError(f"params must have shapes {family.shapes()} for {family!r}, got "
                         f"{jax.tree_util.tree_unflatten(want_tree, got)}")
    for x in leaves:
        dtype = _checks.dtype_of(x)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"params must be floating-point arrays, got dtype {dtype}")
        # On the host: a jnp check would compile two programs per leaf shape.
        if _checks.is_concrete(x) and not np.isfinite(_checks.host_array(x)).all():
            raise ValueError("params contain NaN or infinite values")


def _print_progress(step, num_steps, value, best):
    print(f"tune_draft: step {step:>6d}/{num_steps}  objective {value:.6g}  best {best:.6g}",
          file=sys.stderr, flush=True)


def tune_draft(family: DraftFamily, params, target: MarkovChain,
               objective: Callable[[MarkovChain, MarkovChain], jax.Array], *,
               num_steps: int = 500, optimizer: optax.GradientTransformation | None = None,
               log_every: int | None = None,
               callback: Callable[[int, float, float], None] | None = None,
               progress: bool = False) -> TuneResult:
    """Minimises an exact objective over a draft family with an optax optimiser.

    Each step evaluates ``objective(family.chain(params), target)`` and its gradient in the
    parameters (logits) and applies one optimiser update. The loop runs under ``jit`` as a
    ``lax.fori_loop`` of ``log_every`` steps at a time; between those chunks ``callback`` (or the
    progress line) sees the step and the objective. The result is the best iterate seen, so the
    returned draft is never worse on the objective than the starting one.

    Non-finite values: a start where the objective is not finite raises ``ValueError``. Later,
    an update whose objective, gradient or new parameters are not finite is skipped, so the
    parameters never become NaN; the state is then unchanged, so every later step repeats the
    skip: tuning has stopped there (``TuneResult.skipped`` counts the skipped steps and a
    ``RuntimeWarning`` says so). Lower the step size if that happens.

    Compilation: once per family, objective, optimiser, chunk length (``log_every``; the
    remainder and the evaluation of the start run in the same program) and dtype; a new
    target or new parameter values do not recompile.

    A host-side driver: call it outside ``jax.jit``, ``vmap`` and ``grad``. Under a
    transformation its params and target are traced, and it raises ``ValueError`` saying so
    (families and ``objective(...)`` values are pytrees without leaves, so ``jax.jit`` passes
    them through to that check; a plain function as ``objective``, an optax optimiser or a
    ``callback`` are not JAX types, and ``jax.jit`` itself refuses them first with JAX's "Error
    interpreting argument").

    Args:
      family: a ``DraftFamily`` (``specjax.tuning.StationaryDraft(V, T)``, ...).
      params: starting parameters, e.g. ``family.init(key)``, ``family.uniform()`` or
        ``kl_fit(family, target)``.
      target: the target ``MarkovChain`` ``q`` (traced: a new target does not recompile).
      objective: ``objective(decoder, quantity)`` (the exact rejections, calls or trade-off of
        any decoder, e.g. ``objective(Speculative())``), ``biased_tradeoff(eps, weight=lam)``,
        ``kl_divergence()``, ``make_objective(name)`` or any hashable callable
        ``(draft, target) -> scalar`` (a scalar: an objective that returns an array of another
        shape is refused before any step, with a ``ValueError`` naming it and the shape).
      num_steps: number of optimiser steps (``>= 1``).
      optimizer: any ``optax.GradientTransformation``; default ``optax.adam(0.05)``. It is a
        static argument of the compiled loop: reuse the same object to avoid recompiling.
      log_every: steps per compiled chunk, i.e. how often ``callback`` runs; default all steps
        in one chunk, or a tenth of them when ``callback`` or ``progress`` is set.
      callback: ``callback(step, objective, best)`` with Python numbers, after each chunk
        (``objective`` is the value at the chunk's last evaluated iterate).
      progress: print a progress line to standard error after each chunk.

    Returns:
      ``TuneResult`` (``params``, ``draft``, ``value``, ``history``, ``best_step``,
      ``final_params``, ``skipped``).

    Raises:
      ValueError: a bad argument (named), an objective that does not return a floating-point
        scalar (named with the shape it returned) or is not finite at the start, or traced
        arguments (a call under ``jax.jit``, ``vmap`` or ``grad``); all before any step.
    """
    _checks.refuse_traced("tune_draft", _HOST_LOOP, _NO_RECOMPILE, params=params, target=target,
                          num_steps=num_steps, log_every=log_every, progress=progress)
    _check_family(family, target)
    _check_params(family, params)
    if not callable(objective):
        raise ValueError(f"objective must be callable (draft, target) -> scalar, got {objective!r}")
    _checks.check_positive_int("num_steps", num_steps)
    if num_steps > MAX_STEPS:
        raise ValueError(f"num_steps must be at most {MAX_STEPS:,} (the step counter is int32), "
                         f"got {num_steps:,}")
    _checks.check_positive_int("log_every", log_every, allow_none=True)
    optimizer = _DEFAULT_OPTIMIZER if optimizer is None else optimizer
    if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise ValueError(f"optimizer must be an optax.GradientTransformation, got {optimizer!r}")
    if callback is not None and not callable(callback):
        raise ValueError(f"callback must be callable (step, objective, best), got {callback!r}")
    if log_every is None:
        log_every = max(1, num_steps // 10) if (callback or progress) else num_steps

    dtype = jnp.result_type(float)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), params)
    carry = _Carry(params, optimizer.init(params), params, jnp.array(jnp.inf, dtype),
                   jnp.array(0, jnp.int32), jnp.array(0, jnp.int32), jnp.array(0, jnp.int32))
    # One compiled program for the whole run (the start, every chunk and the remainder).
    run = functools.partial(_chunk, family=family, objective=objective, optimizer=optimizer,
                            length=min(log_every, num_steps))
    _, _, start = run(carry, target, 0, True)
    if not bool(jnp.isfinite(start)):
        raise ValueError(
            f"the objective at the starting params is {float(start)}, not finite; no update can "
            "be taken from there (for kl_divergence: logits so spread out that the draft's "
            "softmax underflows to 0 where the target has mass; start from smaller logits)")
    chunks, done = [], 0
    while done < num_steps:
        size = min(log_every, num_steps - done)
        carry, values, final = run(carry, target, size, done + size == num_steps)
        values = np.asarray(values)[:size]
        chunks.append(values)
        done += size
        if callback is not None or progress:
            last, best = float(values[-1]), float(carry.best_value)
            if progress:
                _print_progress(done, num_steps, last, best)
            if callback is not None:
                callback(done, last, best)
    history = jnp.asarray(np.concatenate(chunks + [np.asarray(final)[None]]))
    if int(carry.skipped):
        warnings.warn(
            f"tune_draft skipped {int(carry.skipped)} of {num_steps} updates whose objective, "
            "gradient or new parameters were not finite; a skipped update leaves the state "
            "unchanged, so the steps after it repeat it: tuning stopped at the first one. The "
            "result is the best iterate before it; try a smaller step size.",
            RuntimeWarning, stacklevel=2)
    return TuneResult(carry.best_params, family.chain(carry.best_params), carry.best_value,
                      history, carry.best_step, carry.params, carry.skipped)


#: The most optimiser steps one ``tune_draft`` call takes (an int32 step counter).
MAX_STEPS = 2**31 - 1


def kl_fit(family: DraftFamily, target: MarkovChain, *, num_steps: int = 2000,
           optimizer: optax.GradientTransformation | None = None):
    """Maximum-likelihood (forward-KL) fit of a draft family to the target: the usual distillation.

    Minimises ``sum_n E_{x_{n-1} ~ q}[KL(q_n(.|x_{n-1}) || p_n(.|x_{n-1}))]``, the whole-sequence
    ``KL(q || p)`` without the prompt term (which no draft parameter affects). In closed form for
    the full family (the target itself), the stationary family (the target's rows averaged with
    the target's marginals as weights) and the context-free family (the target's marginals); for
    the low-rank family by ``tune_draft`` on ``kl_divergence()`` from ``spectral_start``.

    Args:
      family: a ``DraftFamily``.
      target: the target ``MarkovChain`` ``q``.
      num_steps: optimiser steps when there is no closed form.
      optimizer: optax optimiser when there is no closed form (default ``optax.adam(0.05)``).

    Returns:
      The fitted parameters (``family.chain(params)`` is the fitted draft). Zero probabilities
      of a closed-form fit become logits ``log(tiny)``, so the parameters are finite.

    A host-side driver, as ``tune_draft``: under ``jax.jit``, ``vmap`` or ``grad`` (a traced
    target) it raises ``ValueError``.
    """
    _checks.refuse_traced("kl_fit", _HOST_LOOP, _NO_RECOMPILE, target=target,
                          num_steps=num_steps)
    _check_family(family, target)
    _checks.check_positive_int("num_steps", num_steps)
    params = family.kl_fit_closed_form(target)
    if params is not None:
        return params
    start = family.spectral_start(target)
    return tune_draft(family, start, target, kl_divergence(), num_steps=num_steps,
                      optimizer=optimizer).params
