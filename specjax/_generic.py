"""Engines for any autoregressive model (``specjax.models``): Monte Carlo and exact.

Why the Markov engine's argument carries over. Drafting a whole lookahead and then verifying it
in order has the same law as drafting each token only when it is verified: the draft of position
``n + 1`` is conditioned on the drafted prefix, which equals the accepted prefix whenever it is
verified at all, and a draft that is never verified influences nothing. So a decoder is still a
Markov chain, now over ``(draft state, target state, phase j)``, with the phases of
``specjax._engine`` (``j = 0`` opens a target call, the *root*; ``0 < j < K`` verifies inside a
call; ``j = K`` emits the target's bonus token). Each position draws its outcome (token,
rejected) from the laws of ``specjax._rules`` built on the chain's own rows
``p = draft.probs(draft state)``, ``q = target.probs(target state)``.

* ``simulate_models``: one ``lax.scan`` over positions, ``vmap`` over chains; the rows are
  computed per chain and position (the models are arbitrary), the draw is the Markov engine's
  (one 31-bit uniform per chain-step from ``_engine.chain_bits``, integer thresholds, binary
  search). With the same rows it draws the same tokens as ``specjax._engine.simulate``.
* ``exact_models``: for two ``FiniteStateModel``s on one state space, the forward recursion of
  ``specjax._exact`` with the state ``s`` in place of the previous token: the law
  ``pi_n[j, s] = P(phase j, state s after x_n)`` is pushed through ``next_state`` by a
  scatter-add, ``O(S V)`` per position and phase.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import _engine
from specjax import _rules
from specjax import _verify
from specjax._engine import DecodingTrace
from specjax._exact import ExactDecoding
from specjax.models import FiniteStateModel
from specjax.models import is_autoregressive_model

_HIGHEST = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------- validation


def _check_protocol_model(name: str, model) -> None:
    """Raise ``ValueError`` unless ``model`` follows the protocol: a JAX pytree whose
    ``probs(init_state())`` is a float ``(V,)`` law (values checked when concrete)."""
    if not is_autoregressive_model(model):
        raise ValueError(
            f"{name} must be a specjax.MarkovChain or an autoregressive model (num_states, "
            f"init_state(), probs(state), update(state, token); see specjax.models), got "
            f"{type(model).__name__}")
    leaves = jax.tree_util.tree_leaves(model)
    if any(leaf is model for leaf in leaves):
        raise ValueError(
            f"{name} must be a JAX pytree (e.g. a class registered with "
            f"jax.tree_util.register_pytree_node_class, arrays as leaves), got an unregistered "
            f"{type(model).__name__}")
    num_states = model.num_states
    _checks.check_positive_int(f"{name}.num_states", num_states)
    try:
        row = jax.eval_shape(lambda m: m.probs(m.init_state()), model)
    except Exception as error:  # a user's model: report what failed, naming the argument
        raise ValueError(f"{name}.probs(init_state()) failed: {error}") from error
    if row.shape != (num_states,) or not jnp.issubdtype(row.dtype, jnp.floating):
        raise ValueError(
            f"{name}.probs(state) must return a float array of shape (num_states,) = "
            f"({num_states},), got shape {row.shape} and dtype {row.dtype}")
    if all(_checks.is_concrete(leaf) for leaf in leaves):
        _checks.check_probabilities(f"{name}.probs(init_state())",
                                    model.probs(model.init_state()))


def check_models(draft, target) -> None:
    """Raise ``ValueError`` unless both follow the protocol with the same ``V``."""
    for name, model in (("draft", draft), ("target", target)):
        _check_protocol_model(name, model)
    if draft.num_states != target.num_states:
        raise ValueError(
            f"draft and target must have the same number of states V, got "
            f"{draft.num_states} (draft) and {target.num_states} (target)")


def model_dtype(model):
    """The float dtype of a model's probabilities (a ``MarkovChain``'s, or the protocol's)."""
    if hasattr(model, "trans"):
        return model.trans.dtype
    return model.probs(model.init_state()).dtype


def check_shared_states(draft, target) -> None:
    """Raise ``ValueError`` unless both are ``FiniteStateModel``s on one state space (same ``V``,
    ``S``, start and ``next_state``; the values are compared when concrete)."""
    for name, model in (("draft", draft), ("target", target)):
        if not isinstance(model, FiniteStateModel):
            raise ValueError(
                f"{name} must be a specjax.models.FiniteStateModel (e.g. "
                f"NGramModel.as_finite_state()), got {type(model).__name__}")
    check_models(draft, target)
    if draft.num_contexts != target.num_contexts or draft.start != target.start:
        raise ValueError(
            f"draft and target must share their state space: S = {draft.num_contexts} and "
            f"{target.num_contexts}, start = {draft.start} and {target.start}")
    a, b = draft.next_state, target.next_state
    if a is not b and _checks.is_concrete(a) and _checks.is_concrete(b) \
            and not np.array_equal(np.asarray(a), np.asarray(b)):
        raise ValueError("draft and target must share next_state (the same state space); "
                         "lift both to one context length, e.g. as_finite_state(3)")


def _resolve(rule, lookahead, horizon) -> int:
    _checks.check_positive_int("horizon", horizon)
    if rule == _rules.AUTOREGRESSIVE:
        if lookahead not in (None, 0):
            raise ValueError(f"lookahead must be 0 or None for autoregressive decoding, got "
                             f"{lookahead!r}")
        return 0
    return _rules.resolve_lookahead(lookahead, horizon)


# ----------------------------------------------------------------------------- Monte Carlo


def _outcome_masses(p, q, rule, extra, lookahead: int, phase):
    """The ``2V`` masses (accepted | rejected) of one chain's position in phase ``j``."""
    if lookahead == 0:  # autoregressive: every position is the target's own draw
        law = _verify.bonus_law(q)
        return jnp.concatenate([law.accepted, law.rejected])
    root, verify = _rules.laws(rule, p, q, extra)
    rows = jnp.stack([jnp.concatenate([law.accepted, law.rejected])
                      for law in (root, verify, _verify.bonus_law(q))])
    kind = jnp.where(phase == lookahead, _engine.BONUS,
                     jnp.where(phase == 0, _engine.ROOT, _engine.VERIFY))
    return rows[kind]


def _chain_step(draft, target, rule, extra, lookahead: int, carry, u):
    """One position of one chain: the same outcome and phase logic as ``_engine._chain_step``,
    with the law built from the chain's own rows and both states updated with the token."""
    draft_state, target_state, j, num_rejections, num_calls = carry
    q = target.probs(target_state)
    num_states = q.shape[-1]
    masses = _outcome_masses(draft.probs(draft_state), q, rule, extra, lookahead, j)
    thresholds = _engine.categorical_thresholds(masses)
    outcome = _engine._search(lambda i: thresholds[i], u, thresholds.shape[-1])
    rejected = outcome >= num_states
    token = jnp.where(rejected, outcome - num_states, outcome)
    next_j = jnp.where(rejected | (j == lookahead), 0, j + 1)
    new_call = j == 0
    carry = (draft.update(draft_state, token), target.update(target_state, token), next_j,
             num_rejections + rejected, num_calls + new_call)
    return carry, (token, rejected, new_call)


@functools.partial(jax.jit, static_argnames=("num_chains", "horizon", "rule", "lookahead"))
def _simulate(key, draft, target, extra, *, num_chains, horizon, rule, lookahead):
    key_init, key_steps = jax.random.split(key)
    draft_start, target_start = draft.init_state(), target.init_state()

    init_thr = _engine.categorical_thresholds(target.probs(target_start))
    u0 = _engine._int31(_engine.chain_bits(key_init, 0, num_chains))
    x0 = jax.vmap(lambda u: _engine._search(lambda i: init_thr[i], u, init_thr.shape[-1]))(u0)
    draft_states = jax.vmap(draft.update, in_axes=(None, 0))(draft_start, x0)
    target_states = jax.vmap(target.update, in_axes=(None, 0))(target_start, x0)
    token_dtype = _engine._small_int_dtype(target.num_states)

    step = functools.partial(_chain_step, draft, target, rule, extra, lookahead)

    def scan_step(carry, n):
        u = _engine._int31(_engine.chain_bits(jax.random.fold_in(key_steps, n), 0, num_chains))
        carry, (token, rejected, new_call) = jax.vmap(step)(carry, u)
        return carry, (token.astype(token_dtype), rejected, new_call)

    zeros = jnp.zeros((num_chains,), jnp.int32)
    carry0 = (draft_states, target_states, zeros, zeros, zeros)
    carry, (tokens, rejected, new_call) = jax.lax.scan(scan_step, carry0, jnp.arange(horizon))
    num_rejections, num_calls = carry[3], carry[4]
    tokens = jnp.concatenate([x0[:, None], tokens.T.astype(jnp.int32)], axis=1)
    return DecodingTrace(tokens=tokens, rejected=rejected.T, num_rejections=num_rejections,
                         num_calls=num_calls, new_call=new_call.T)


def simulate_models(key, draft, target, num_chains: int, *, horizon: int, rule, lookahead,
                    extra=()) -> DecodingTrace:
    """Runs ``num_chains`` chains of ``rule`` for any two models of the protocol.

    Args:
      key: a JAX PRNG key.
      draft: the draft model ``p`` (``specjax.models.AutoregressiveModel``).
      target: the target model ``q``, with the same ``V``; ``x_0`` is drawn from its
        ``probs(init_state())``.
      num_chains: ``C`` (static).
      horizon: ``T``, the number of decoded tokens ``x_1..x_T`` (static).
      rule: a rule tuple of ``specjax._rules`` (static): ``SPECULATIVE``, ``batch(M)``, the
        ``rule`` of ``biased(...)`` or ``general(...)``, or ``AUTOREGRESSIVE``.
      lookahead: ``K`` (static): ``None`` or ``K >= T`` is the paper's ``K = T``; ignored
        (must be ``None`` or 0) for ``AUTOREGRESSIVE``.
      extra: the rule's traced parameters (``(epsilon,)`` for biased SD).

    Returns:
      ``DecodingTrace`` with the fields of the Markov samplers: ``tokens (C, T + 1)``,
      ``rejected (C, T)``, ``num_rejections (C,)``, ``num_calls (C,)``, ``new_call (C, T)``.
      Chain ``c`` uses element ``c`` of each position's random bits, as the Markov engine: for
      models whose rows equal a ``MarkovChain``'s (``FiniteStateModel.from_markov_chain``), the
      tokens are those of the Markov sampler with the same key.

    References:
      Algorithms 1, 2 and 4 of the paper, for autoregressive models beyond its Markov chains.
    """
    _checks.check_key(key)
    check_models(draft, target)
    _checks.check_positive_int("num_chains", num_chains)
    if num_chains > 2**32:
        raise ValueError(f"num_chains must be at most 2**32 (chains are numbered with 32 bits), "
                         f"got {num_chains}")
    return run_models(key, draft, target, num_chains, horizon=horizon, rule=rule,
                      lookahead=_resolve(rule, lookahead, horizon), extra=extra)


def run_models(key, draft, target, num_chains: int, *, horizon: int, rule, lookahead: int,
               extra=()) -> DecodingTrace:
    """``simulate_models`` for arguments validated already (``specjax.samplers``' plans, with
    ``lookahead`` resolved); only the memory bound of drafts without replacement is checked."""
    if rule[0] == "batch_wor":  # every chain's root law is enumerated at once
        _verify.check_without_replacement_size(rule[1], target.num_states, num_chains)
    return _simulate(key, draft, target, tuple(extra), num_chains=num_chains, horizon=horizon,
                     rule=rule, lookahead=lookahead)


# ----------------------------------------------------------------------------- exact


def _vecmat(x, a):
    return jnp.dot(x, a, precision=_HIGHEST)


@functools.partial(jax.jit, static_argnames=("horizon", "rule", "lookahead"))
def _exact(draft, target, extra, *, horizon, rule, lookahead):
    next_state = target.next_state
    num_contexts, num_states = next_state.shape
    q = target.table
    dtype = jnp.result_type(draft.table, q)
    flat_next = next_state.reshape(-1)

    def push(mass):  # (..., S, V) -> (..., S): mass of (s, x) moves to next_state[s, x]
        lead = mass.shape[:-2]
        flat = mass.reshape(lead + (num_contexts * num_states,))
        return jnp.zeros(lead + (num_contexts,), dtype).at[..., flat_next].add(flat)

    x0_law = q[draft.start]
    pi0 = push(jnp.zeros((num_contexts, num_states), dtype).at[draft.start].set(x0_law))

    in_call_only = lookahead >= horizon
    one_phase = lookahead == 0 or (in_call_only and _rules.same_root(rule))
    if lookahead == 0:
        root = verify = _verify.bonus_law(q)
    else:
        root, verify = _rules.laws(rule, draft.table, q, extra)
    root_total, verify_total = root.accepted + root.rejected, verify.accepted + verify.rejected

    def outer(pi, law):  # pi (S,), law (S, V) -> (S, V) joint mass of (state, token)
        return pi[:, None] * law

    # The (S, V) products are rematerialised under grad: the stored residuals are the carries.
    @functools.partial(jax.checkpoint, prevent_cse=False)
    def step(pi, _):
        if one_phase:  # pi: (S,)
            rejected = _vecmat(pi, root.rejected)
            return push(outer(pi, root_total)), (rejected, _vecmat(pi, root_total), jnp.sum(pi))
        if in_call_only:  # pi: (2, S) = (root, in-call)
            rejected = _vecmat(pi[0], root.rejected) + _vecmat(pi[1], verify.rejected)
            token = _vecmat(pi[0], root_total) + _vecmat(pi[1], verify_total)
            new_pi = push(jnp.stack([
                outer(pi[0], root.rejected) + outer(pi[1], verify.rejected),
                outer(pi[0], root.accepted) + outer(pi[1], verify.accepted),
            ]))
            return new_pi, (rejected, token, jnp.sum(pi[0]))
        # pi: (K + 1, S): root, K - 1 in-call phases, bonus.
        inside = jnp.sum(pi[1:lookahead], axis=0)
        bonus = pi[lookahead]
        rejected = _vecmat(pi[0], root.rejected) + _vecmat(inside, verify.rejected)
        token = _vecmat(pi[0], root_total) + _vecmat(inside, verify_total) + _vecmat(bonus, q)
        new_pi = push(jnp.concatenate([
            (outer(pi[0], root.rejected) + outer(inside, verify.rejected)
             + outer(bonus, q))[None],
            outer(pi[0], root.accepted)[None],
            pi[1:lookahead, :, None] * verify.accepted[None],
        ]))
        verified = jnp.minimum(jnp.sum(pi[:lookahead]), 1)
        return new_pi, (rejected, token, jnp.sum(pi[0]), verified)

    if one_phase:
        carry0 = pi0
    else:
        num_phases = 2 if in_call_only else lookahead + 1
        carry0 = jnp.zeros((num_phases, num_contexts), dtype).at[0].set(pi0)
    _, outputs = jax.lax.scan(step, carry0, None, length=horizon)
    rejected, marginals, new_call = outputs[:3]
    if lookahead == 0:  # every position is a call and a bonus token, nothing is verified
        new_call = jnp.ones((horizon,), dtype)
        verified = jnp.zeros((horizon,), dtype)
        rejected = jnp.zeros_like(rejected)
    elif one_phase:  # K >= T: a call at n = 1 and right after every rejection
        rate = jnp.sum(rejected, axis=-1)
        new_call = jnp.concatenate([jnp.ones((1,), dtype), rate[:-1]])
        verified = jnp.ones((horizon,), dtype)
    elif in_call_only:
        verified = jnp.ones((horizon,), dtype)
    else:
        verified = outputs[3]
    return ExactDecoding(rejected=rejected, new_call=new_call,
                         marginals=jnp.concatenate([x0_law[None], marginals]),
                         verified=verified)


def exact_models(draft: FiniteStateModel, target: FiniteStateModel, *, horizon: int, rule,
                 lookahead, extra=()) -> ExactDecoding:
    """Exact per-position statistics of ``rule`` for two finite-state models on one state space.

    The forward recursion of ``specjax._exact`` over ``(state, phase)``: the law of the state
    after ``x_n`` in each phase is pushed through the shared ``next_state`` (a scatter-add,
    ``O(S V)`` per position and phase), and every expected count is a sum of masses. Float64
    under ``jax_enable_x64``, differentiable in both tables (``jit``-safe; gradients finite at
    ``p = q``, disjoint supports and exhausted residuals, as the laws are).

    Args:
      draft: the draft ``FiniteStateModel`` ``p``.
      target: the target ``FiniteStateModel`` ``q``; same ``V``, ``S``, start and
        ``next_state`` as ``draft`` (e.g. two n-grams lifted with ``as_finite_state(L)``).
      horizon: ``T`` (static).
      rule: a rule tuple of ``specjax._rules`` (static), as for ``simulate_models``.
      lookahead: ``K`` (static), as for ``simulate_models``.
      extra: the rule's traced parameters.

    Returns:
      ``ExactDecoding``: ``rejected (T, V)`` = ``P(x_n = x, R_n = 1)``, ``new_call (T,)``,
      ``verified (T,)``, ``marginals (T + 1, V)`` (the law of ``x_n``); with
      ``.expected_rejections`` and ``.expected_calls`` the means of ``simulate_models``'s
      ``num_rejections`` and ``num_calls``.

    References:
      Theorems 1 and 3 (``E[N_rej]`` as a sum of per-position rejection masses), for
      finite-state models beyond the paper's Markov chains.
    """
    check_shared_states(draft, target)
    return run_exact(draft, target, horizon=horizon, rule=rule, lookahead=lookahead, extra=extra)


def run_exact(draft, target, *, horizon: int, rule, lookahead, extra=()) -> ExactDecoding:
    """``exact_models`` for models validated already (``specjax.theory``)."""
    lookahead = _resolve(rule, lookahead, horizon)
    return _exact(draft, target, tuple(extra), horizon=horizon, rule=rule, lookahead=lookahead)
