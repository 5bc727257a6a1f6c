"""Verification of given drafts, in the shape serving engines use.

A serving engine's rejection sampler (vLLM, SGLang, FlashInfer, HuggingFace, keras-hub) sees, per
request, ``K`` drafted token ids, the draft's probabilities at those ``K`` positions (or none, for
greedy and n-gram drafts), the target's probabilities at ``K + 1`` positions (the ``K`` drafted
positions and the one after them), and random numbers; it returns the accepted prefix and one
more token, recovered after a rejection or the bonus token after ``K`` acceptances.

* ``verify_drafts(key, decoder, draft_tokens, draft_probs, target_probs)`` does exactly that for
  a batch of requests with their own ``K`` (``num_drafts``, ragged, ``0`` included), with a key or
  with the random numbers themselves (``uniforms``), so a kernel using the same convention can be
  compared token for token.
* ``verify_drafts_law(decoder, draft_tokens, draft_probs, target_probs)`` is the exact law of that
  output over the random numbers: ``P(n drafts accepted, last token y)`` per request.

Both read the decoder's verification law (``decoder.laws(p, q)``, the one written in
``specjax.decoders.verification``), so SD, biased SD and any ``RejectionRule`` of the paper's
Algorithm 2 verify given drafts through the same code that samples and enumerates them elsewhere.
``BlockVerification(K)`` (its ``K`` is ignored: ``K_b`` comes from the drafts) verifies the block
jointly with the sampler's own rule (``specjax.decoders.block.block_levels``), Sun et al.'s
Algorithm 2: weights ``w_0 = 1``, ``w_i = min(1, w_{i-1} q_{i-1}(x_i) / p_{i-1}(x_i))`` (0 where
``p_{i-1}(x_i) = 0``: such a draft is never kept), residuals ``r_i = [w_i q_i - p_i]_+`` (rows
``0..K_b - 1``), and ``h_i = |r_i| / (|r_i| + 1 - w_i)`` for ``i < K_b`` (1 where that is
``0 / 0``), ``h_{K_b} = w_{K_b}``. Level ``i`` (``1..K_b``) is kept iff ``u_{i-1} < h_i``; ``tau``
is the largest kept level (the backward pass; 0 if none), and the last token is the inverse CDF of
``r_tau`` (of ``q_{K_b}`` at ``tau = K_b``; of ``q_tau`` if ``r_tau`` has no mass) at ``v_tau``.
Token trees have their own form, ``specjax.verify_tree``.

**The convention** (what a kernel must do to agree token for token). Row ``j`` of a request
(``0 <= j < K_b``) verifies draft ``x_j`` with the accept uniform ``u_j`` and the sample uniform
``v_j``; the bonus uses ``v_{K_b}``.

* Accept ``x_j`` iff ``u_j * p_j(x_j) < a_j(x_j)``, where ``a_j`` is the decoder's accepted mass
  (``min(p, q)`` for SD: accept iff ``u * p(x) < q(x)``, i.e. ``u < q(x) / p(x)``). A draft with
  ``p_j(x_j) = 0`` is therefore rejected (as in vLLM), and a token with ``q_j(x_j) = 0`` is never
  accepted, ``u = 0`` included. A rule whose test ignores the draft's probabilities
  (``TypicalAcceptance``, ``ThresholdVerification``) accepts iff ``u_j < b(x_j)``. Greedy and n-gram drafts (``draft_probs=None``) are scored with the
  one-hot of the drafted token: accept iff ``u < q(x)``.
* At the first rejection ``j`` the last token is the inverse CDF of the decoder's rejected mass
  (``[q_j - p_j]_+`` for SD; the target's row ``q_j`` if that mass is zero, which only rounding
  can make happen; for a rule whose residual depends on the rejected draft, such as
  ``ThresholdVerification``, its ``residual_given_draft(p_j, q_j, x_j)``) at ``v_j``: the smallest ``y`` with ``v_j * W < cumsum(w)[y]`` (``W`` the
  total), computed without division, so a token of zero mass is never drawn. After ``K_b``
  acceptances the bonus is the inverse CDF of ``q_{K_b}`` at ``v_{K_b}``.
* ``u`` and ``v`` are uniform on ``[0, 1)``. With a key, ``u = uniform(k1, (B, K))`` and
  ``v = uniform(k2, (B, K + 1))`` in the computation's dtype, ``k1, k2 = split(key)``: the
  probabilities' dtype, float32 at least (float16 and bfloat16 rows are upcast; their uniforms
  would be too coarse).

Engines draw the recovered token differently (vLLM v1: an exponential race over the vocabulary;
HuggingFace: ``torch.multinomial``), so token-for-token agreement is available for the accept
decisions of any engine and for the whole output of a kernel that uses inverse CDFs; for the
others, compare laws with ``specjax.compare_outputs``.

Padding: only the first ``K_b`` drafts and ``K_b + 1`` target rows of request ``b`` are read
(values beyond may be anything finite: ``-1`` ids, zero rows); outputs are padded with ``-1``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax.decoders import verification
from specjax.decoders.draws import mass_or_target as _mass_or_target
from specjax.decoders.given_drafts import PAD
from specjax.decoders.given_drafts import Verified
from specjax.decoders.given_drafts import Inputs
from specjax.decoders.given_drafts import accept_test
from specjax.decoders.given_drafts import block_rows
from specjax.decoders.given_drafts import drafted_rows
from specjax.decoders.given_drafts import residual_rows
from specjax.decoders.given_drafts import verify_given
from specjax.decoders.given_drafts import check_given_decoder
from specjax.decoders.probe import probe_decoder
from specjax.numerics import safe_ratio

__all__ = ["Verified", "DraftsLaw", "verify_drafts", "verify_drafts_law", "PAD"]

class DraftsLaw(NamedTuple):
    """The exact law of ``verify_drafts``'s output over its random numbers, per request.

    Attributes:
      outcome: ``(B, K + 1, V)``; ``P(the output has n + 1 tokens, the last one y)``. The tokens
        before the last are the given drafts, so this is the law of the whole output. Without
        stop tokens and with the bonus, it is ``P(n drafts accepted, then the token y)``; a stop
        token or a dropped bonus makes some outputs end on a draft (``y = x_n``).
      num_accepted: ``(B, K + 1)``; ``P(verification accepts n drafts)`` (zero for ``n > K_b``),
        before a stop token or a dropped bonus shortens the output.
      acceptance: ``(B, K)``; ``P(draft j accepted | drafts before it accepted)`` (zero for
        ``j >= K_b``).
    """

    outcome: jax.Array  # shape=(B, K + 1, V)
    num_accepted: jax.Array  # shape=(B, K + 1)
    acceptance: jax.Array  # shape=(B, K)


# ---------------------------------------------------------------------------------------------
# Validation.


def _float_array(name, x, ndim):
    x = _checks.host_or_device(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must hold floating-point probabilities, got dtype {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {x.shape}")
    return x


def check_valid_rows(checks, batched):
    """Probability checks on the rows ``x[valid]`` of each ``(name, x, valid)`` of ``checks``
    (concrete arrays only), in order; an error names the first bad row by its place in ``x``
    (``target_probs[b, j]``). Large arrays are screened together by one compiled program
    (``_checks.suspect_rows`` of the rows ``valid`` marks, which flags every one that may fail)
    and only the flagged rows are checked exactly, as small ones are checked whole: the same
    errors, and on a CPU only the rows the computation reads are screened, each read once."""
    checks = [(name, x, np.asarray(valid)) for name, x, valid in checks
              if _checks.is_concrete(x)]
    large = [x.size >= _checks.FUSED_CHECK_ENTRIES for _, x, _ in checks]
    screened = iter(_checks.suspect_rows(
        [x for (_, x, _), big in zip(checks, large) if big],
        [_checks.row_sum_tolerance(x.dtype) for (_, x, _), big in zip(checks, large) if big],
        [valid for (_, _, valid), big in zip(checks, large) if big]) if any(large) else ())
    for (name, x, valid), big in zip(checks, large):
        tol = _checks.row_sum_tolerance(x.dtype)
        if big:
            where = np.argwhere(next(screened) & valid)
            if not where.size:
                continue
            values = np.asarray(x)[where[:, 0], where[:, 1]]
        else:
            where, values = None, np.asarray(x)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values).all(-1) | (values < 0).any(-1) \
                | (np.abs(values.sum(-1, dtype=np.float64) - 1) > tol)
        if where is None:
            bad &= valid
        if bad.any():
            b, j = np.argwhere(bad)[0] if where is None else where[np.flatnonzero(bad)[0]]
            place = f"{name}[{b}, {j}]" if batched else f"{name}[{j}]"
            _checks.check_probabilities(place, np.asarray(x)[b, j])


def check_num_drafts(num_drafts, num_requests: int, lookahead: int, batched: bool) -> jax.Array:
    """``num_drafts`` as int32 counts ``(B,)`` (``K`` for every request when ``None``): integers of
    shape ``(B,)`` (``()`` for one request), in ``[0, K]`` when concrete."""
    if num_drafts is None:
        return np.full((num_requests,), lookahead, np.int32)
    counts = _checks.host_or_device(num_drafts)
    if not jnp.issubdtype(counts.dtype, jnp.integer):
        raise ValueError(f"num_drafts must hold integers, got dtype {counts.dtype}")
    if counts.shape != ((num_requests,) if batched else ()):
        raise ValueError(f"num_drafts must have shape {(num_requests,) if batched else ()} "
                         f"(one K_b per request), got {counts.shape}")
    counts = counts.reshape(num_requests).astype(np.int32)
    if _checks.is_concrete(counts):
        bad = np.flatnonzero((np.asarray(counts) < 0) | (np.asarray(counts) > lookahead))
        if bad.size:
            raise ValueError(f"num_drafts must lie in [0, K] = [0, {lookahead}], got "
                             f"{int(np.asarray(counts)[bad[0]])} at request {bad[0]}")
    return counts


def check_token_ids(ids: np.ndarray, num_tokens: int) -> None:
    """The drafted ids a verification reads (``ids``, NumPy) lie in ``[0, V)``."""
    if ids.size and (ids.min() < 0 or ids.max() >= num_tokens):
        bad = ids[(ids < 0) | (ids >= num_tokens)][0]
        raise ValueError(f"draft_tokens must be ids in [0, V) = [0, {num_tokens}) within "
                         f"each request's num_drafts, got {int(bad)}")


def check_inputs(draft_tokens, draft_probs, target_probs, num_drafts) -> Inputs:
    """Shapes, dtypes and (when concrete) values of the given-drafts arguments."""
    tokens = _checks.host_or_device(draft_tokens)
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"draft_tokens must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.ndim not in (1, 2):
        raise ValueError(f"draft_tokens must have shape (K,) or (B, K), got {tokens.shape}")
    batched = tokens.ndim == 2
    if not batched:
        tokens = tokens[None]
    num_requests, lookahead = tokens.shape
    target = _float_array("target_probs", target_probs, 3 if batched else 2)
    target = target if batched else target[None]
    if target.shape[:2] != (num_requests, lookahead + 1):
        raise ValueError(
            f"target_probs must have shape {'(B, K + 1, V)' if batched else '(K + 1, V)'} "
            f"with B, K = {num_requests}, {lookahead} from draft_tokens, got "
            f"{jnp.shape(target_probs)}")
    num_tokens = target.shape[-1]
    if num_tokens < 1:
        raise ValueError("target_probs must have at least one token on its last axis")
    draft = None
    if draft_probs is not None:
        draft = _float_array("draft_probs", draft_probs, 3 if batched else 2)
        draft = draft if batched else draft[None]
        if draft.shape != (num_requests, lookahead, num_tokens):
            raise ValueError(
                f"draft_probs must have shape {(num_requests, lookahead, num_tokens)[-3 + (not batched):]}"
                f" (the rows the drafts were drawn from, V = {num_tokens} as in target_probs), "
                f"got {jnp.shape(draft_probs)}; pass None for greedy or n-gram drafts")
    counts = check_num_drafts(num_drafts, num_requests, lookahead, batched)
    positions = np.arange(lookahead)
    if _checks.is_concrete(tokens) and _checks.is_concrete(counts):
        valid = positions[None] < np.asarray(counts)[:, None]
        check_token_ids(np.asarray(tokens)[valid], num_tokens)
        checks = [("target_probs", target,
                   np.arange(lookahead + 1)[None] <= np.asarray(counts)[:, None])]
        if draft is not None:
            checks.append(("draft_probs", draft, valid))
        check_valid_rows(checks, batched)
    return Inputs(*computation_arrays(tokens, draft, target), counts, batched)


def computation_arrays(tokens, draft, target):
    """``(tokens, draft, target)`` as the kernels compute with them: ids clipped into ``[0, V)``
    as int32 (the padding is never read), rows in their common dtype, float32 at least
    (uniforms drawn in float16 or bfloat16 are multiples of 2^-11 or 2^-8, far from uniform on
    the scale of small probabilities)."""
    dtype = jnp.promote_types(jnp.result_type(target.dtype, *(() if draft is None else (
        draft.dtype,))), jnp.float32)
    return (_checks.array_module(tokens).clip(tokens, 0, target.shape[-1] - 1).astype(np.int32),
            None if draft is None else draft.astype(dtype), target.astype(dtype))


def check_endings(stop_tokens, bonus, num_tokens):
    """``stop_tokens`` (``None`` or ids in ``[0, V)``) as an int32 array, and ``bonus`` (a bool:
    static, it changes the outputs' shape of events)."""
    if not isinstance(bonus, (bool, np.bool_)):
        raise ValueError(f"bonus is a static setting: pass True or False, got {bonus!r}")
    if stop_tokens is None:
        return np.zeros((0,), np.int32), bool(bonus)
    stop = _checks.host_or_device(stop_tokens)
    if stop.ndim == 0:
        stop = stop[None]
    if stop.ndim != 1 or not jnp.issubdtype(stop.dtype, jnp.integer):
        raise ValueError(f"stop_tokens must be token ids (an int or a 1-D int array), got dtype "
                         f"{stop.dtype} and shape {stop.shape}")
    if _checks.is_concrete(stop) and stop.size \
            and (int(stop.min()) < 0 or int(stop.max()) >= num_tokens):
        raise ValueError(f"stop_tokens must be ids in [0, V) = [0, {num_tokens}), got "
                         f"{np.asarray(stop).tolist()}")
    return stop.astype(np.int32), bool(bonus)


def _check_uniforms(uniforms, num_requests, widths, batched, dtype):
    """The pair ``(accept, sample)`` of given uniforms, of widths ``widths`` per request, in
    the computation's dtype."""
    if not isinstance(uniforms, (tuple, list)) or len(uniforms) != 2:
        raise ValueError(f"uniforms must be a pair (accept, sample) of arrays of shapes "
                         f"(B, {widths[0]}) and (B, {widths[1]})")
    out = []
    for name, raw, width in zip(("accept", "sample"), uniforms, widths):
        x = _checks.host_or_device(raw)
        shape = (num_requests, width) if batched else (width,)
        if not jnp.issubdtype(x.dtype, jnp.floating) or x.shape != shape:
            raise ValueError(f"uniforms[{name!r}] must be a float array of shape {shape}, got "
                             f"dtype {x.dtype} and shape {x.shape}")
        cast = x.reshape(num_requests, width).astype(dtype)
        if _checks.is_concrete(x):  # checked in the computation's dtype: 1 - 1e-9 rounds to 1
            values = np.asarray(cast)
            if not np.all((values >= 0) & (values < 1)):
                given = np.asarray(raw)
                raise ValueError(
                    f"uniforms[{name!r}] must lie in [0, 1) in the computation's dtype "
                    f"{jnp.dtype(dtype).name}, got values in [{given.min()}, {given.max()}] "
                    f"({values.min()}, {values.max()} once rounded)")
        out.append(cast)
    return out


def uniforms_or_key(key, uniforms, num_requests, widths, batched, dtype):
    """``(u, v)``: the given uniforms (checked), or drawn from ``key``
    (``uniform(k1, (B, widths[0]))``, ``uniform(k2, (B, widths[1]))``, ``k1, k2 = split(key)``)."""
    if uniforms is not None:
        if key is not None:
            raise ValueError("pass key=None with uniforms: the random numbers are given")
        return _check_uniforms(uniforms, num_requests, widths, batched, dtype)
    if key is None:
        raise ValueError("key must be a PRNG key (or None with uniforms given)")
    _checks.check_key(key)
    return _draw_uniforms(key, ((num_requests, widths[0]), (num_requests, widths[1])),
                          np.dtype(dtype))


@functools.partial(jax.jit, static_argnames=("shapes", "dtype"))
def _draw_uniforms(key, shapes, dtype):
    """``uniform(k1, shapes[0])``, ``uniform(k2, shapes[1])``, ``k1, k2 = split(key)``: one
    program (eagerly, the split and each draw compile their own)."""
    k1, k2 = jax.random.split(key)
    return jax.random.uniform(k1, shapes[0], dtype), jax.random.uniform(k2, shapes[1], dtype)


# ---------------------------------------------------------------------------------------------
# The kernel and its law (one verification rule: the decoder's law).


@functools.partial(jax.jit, static_argnames=("with_bonus", "batched"))
def _law(decoder, inputs: Inputs, stop, with_bonus, batched) -> DraftsLaw:
    """The law of each request (``batched``), or of the one request (``batched=False``)."""
    return unbatch(_batched_law(decoder, inputs, stop, with_bonus), batched)


def _batched_law(decoder, inputs: Inputs, stop, with_bonus) -> DraftsLaw:
    tokens, q, counts = inputs.tokens, inputs.target_probs, inputs.num_drafts
    num_requests, lookahead = tokens.shape
    inside = jnp.arange(lookahead)[None] < counts[:, None]
    if decoder.verifies_jointly:
        return _law_block(inputs, stop, with_bonus)
    if lookahead:
        p, q_drafted = drafted_rows(inputs)
        law = decoder.laws(p, q_drafted)[1]
        # P(u p(x) < a(x)) for u ~ U[0, 1): a(x) / p(x), and 0 where p(x) = 0 (then a(x) = 0).
        scale, mass = accept_test(decoder, law, p, q_drafted, tokens)
        accept = safe_ratio(mass, scale, 0)
        accept = jnp.where(inside, jnp.clip(accept, 0, 1), 0)
        rejected = residual_rows(decoder, p, q_drafted, tokens, law.rejected)
        residual = jax.vmap(jax.vmap(_mass_or_target))(rejected, q_drafted)
        last_rows = jnp.concatenate([verification.safe_normalize(residual), q[:, -1:]], axis=1)
    else:
        accept = jnp.zeros((num_requests, 0), q.dtype)
        last_rows = q
    # Row n < K_b: the law after a rejection at n; row K_b: the bonus row q_{K_b}.
    bonus_row = jnp.arange(lookahead + 1)[None] == counts[:, None]
    last_rows = jnp.where(bonus_row[..., None], q, last_rows)
    reach = jnp.cumprod(jnp.concatenate([jnp.ones((num_requests, 1), q.dtype), accept], axis=1),
                        axis=1)
    num_accepted = reach * (1 - jnp.concatenate([accept, jnp.zeros((num_requests, 1), q.dtype)],
                                                axis=1))
    outcome = _end_law(num_accepted[..., None] * last_rows, reach, tokens, counts, stop,
                       with_bonus)
    return DraftsLaw(outcome, num_accepted, accept)


def _law_block(inputs: Inputs, stop, with_bonus) -> DraftsLaw:
    """The exact law of ``_verify_block``: ``P(tau = n) = h_n prod_{j > n} (1 - h_j)``."""
    tokens, q, counts = inputs.tokens, inputs.target_probs, inputs.num_drafts
    num_requests, lookahead = tokens.shape
    if not lookahead:
        return DraftsLaw(q, jnp.ones((num_requests, 1), q.dtype),
                         jnp.zeros((num_requests, 0), q.dtype))
    h, last_rows = block_rows(inputs)
    h0 = jnp.concatenate([jnp.ones((num_requests, 1), h.dtype), h], axis=1)  # level 0: always
    after = jnp.cumprod((1 - h0)[:, ::-1], axis=1)[:, ::-1]  # prod_{j >= n} (1 - h_j)
    after = jnp.concatenate([after[:, 1:], jnp.ones((num_requests, 1), h.dtype)], axis=1)
    num_accepted = h0 * after  # P(tau = n), n = 0..K
    reach = jnp.cumsum(num_accepted[:, ::-1], axis=1)[:, ::-1]  # P(tau >= n)
    outcome = _end_law(num_accepted[..., None] * verification.safe_normalize(last_rows), reach,
                       tokens, counts, stop, with_bonus)
    acceptance = safe_ratio(reach[:, 1:], reach[:, :-1], 0)
    return DraftsLaw(outcome, num_accepted, acceptance)


def _end_law(outcome, reach, tokens, counts, stop, with_bonus):
    """The law of the outputs after the endings, from ``outcome[b, n, y]`` (``n`` drafts
    accepted, then ``y``) and ``reach[b, n]`` (``P(at least n accepted)``): outputs that pass
    their first stop draft ``s`` end there (mass ``P(n > s)`` moved to ``(s, x_s)``); without
    the bonus, the all-accepted outputs end on ``x_{K_b - 1}``."""
    num_requests, lookahead = tokens.shape
    rows = jnp.arange(num_requests)
    if not lookahead:
        return outcome
    first = counts
    if stop.shape[0]:  # static, as in end_outputs
        inside = jnp.arange(lookahead)[None] < counts[:, None]
        is_stop = jnp.isin(tokens, stop) & inside
        first = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1), counts)
        outcome = outcome * (jnp.arange(lookahead + 1)[None] <= first[:, None])[..., None]
        at = jnp.minimum(first, lookahead - 1)
        passed = jnp.where(first < counts, reach[rows, first + 1], 0)
        outcome = outcome.at[rows, at, tokens[rows, at]].add(passed)
    if not with_bonus:
        move = (counts > 0) & (first == counts)
        last = jnp.maximum(counts - 1, 0)
        mass = jnp.where(move, outcome[rows, counts].sum(-1), 0)
        outcome = outcome.at[rows, counts].multiply(jnp.where(move, 0, 1)[:, None])
        outcome = outcome.at[rows, last, tokens[rows, last]].add(mass)
    return outcome


def unbatch(result, batched):
    """``result`` as it is (``batched``), or its first request (under ``jit``: eagerly, taking
    each field's first row compiles a program per field)."""
    return result if batched else jax.tree_util.tree_map(lambda x: x[0], result)


@functools.partial(jax.jit, static_argnames=("with_bonus", "batched"))
def _verify(decoder, inputs: Inputs, u, v, stop, with_bonus, batched) -> Verified:
    return unbatch(verify_given(decoder, inputs, u, v, stop, with_bonus), batched)


def verify_drafts(key, decoder, draft_tokens, draft_probs, target_probs, *, num_drafts=None,
                  uniforms=None, stop_tokens=None, bonus: bool = True) -> Verified:
    """Verify given drafts as a serving engine's rejection sampler does, for a batch of requests.

    Args:
      key: a PRNG key, or ``None`` when ``uniforms`` are given.
      decoder: a token-wise decoder with one draft per position: ``specjax.Speculative()`` (its
        ``lookahead`` is ignored: ``K`` comes from the drafts), ``specjax.BiasedSpeculative``,
        a ``specjax.RejectionRule``; or ``specjax.BlockVerification(K)`` (the block jointly;
        its ``K`` is ignored too).
      draft_tokens: ``(B, K)`` int drafted ids (or ``(K,)`` for one request).
      draft_probs: ``(B, K, V)``, row ``j`` the law draft ``j`` was drawn from; ``None`` for
        greedy or n-gram drafts (scored with their one-hot).
      target_probs: ``(B, K + 1, V)``, the target's rows at the ``K`` drafted positions and
        after them.
      num_drafts: ``(B,)`` ints in ``[0, K]``, each request's own ``K_b`` (ragged batches;
        ``0``: the request only takes the target's token). Default: ``K`` for all.
      uniforms: ``(accept (B, K), sample (B, K + 1))`` in ``[0, 1)``: the random numbers
        themselves (see the module's convention), instead of ``key``.
      stop_tokens: ids that end a sequence (end-of-sequence tokens): the output ends at the
        first one it emits, an accepted draft or the last token (HuggingFace, keras-hub).
      bonus: ``False`` drops the bonus token after ``K_b >= 1`` accepted drafts (vLLM's
        ``disable_bonus_tokens``); a request with ``K_b = 0`` still emits the target's token.

    Returns:
      ``Verified(tokens (B, K + 1), num_accepted, bonus, num_emitted, stopped)``, each ``(B,)``.

    Raises:
      ValueError: a bad key, decoder, shape, dtype, id, probability row (of the rows read),
        ``num_drafts`` or uniform; before any work. Under the caller's ``jit`` only the shape
        and dtype checks run (values are tracers).

    Example:
      >>> import jax, jax.numpy as jnp, specjax
      >>> p = jnp.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
      >>> q = jnp.array([[0.4, 0.4, 0.2], [0.1, 0.1, 0.8], [1.0, 0.0, 0.0]])
      >>> out = specjax.verify_drafts(None, specjax.Speculative(), jnp.array([1, 2]), p, q,
      ...                             uniforms=(jnp.array([0.5, 0.9]), jnp.array([0.0, 0.0, 0.0])))
      >>> out.tokens.tolist(), int(out.num_accepted), bool(out.bonus)
      ([1, 2, 0], 2, True)
    """
    check_given_decoder(decoder)
    inputs = check_inputs(draft_tokens, draft_probs, target_probs, num_drafts)
    probe_decoder(decoder, inputs.target_probs.shape[-1], inputs.target_probs.dtype)
    stop, with_bonus = check_endings(stop_tokens, bonus, inputs.target_probs.shape[-1])
    num_requests, lookahead = inputs.tokens.shape
    u, v = uniforms_or_key(key, uniforms, num_requests, (lookahead, lookahead + 1),
                           inputs.batched, inputs.target_probs.dtype)
    return _verify(decoder, inputs._replace(batched=None), u, v, stop, with_bonus,
                   inputs.batched)


def verify_drafts_law(decoder, draft_tokens, draft_probs, target_probs, *, num_drafts=None,
                      stop_tokens=None, bonus: bool = True) -> DraftsLaw:
    """The exact law of ``verify_drafts``'s output over its random numbers, given the drafts.

    Arguments as ``verify_drafts`` (without ``key`` and ``uniforms``), ``stop_tokens`` and
    ``bonus`` included.

    Returns:
      ``DraftsLaw(outcome (B, K + 1, V), num_accepted (B, K + 1), acceptance (B, K))``.
      Averaged over drafts drawn from ``draft_probs`` (and target rows that follow the drafted
      prefix), the emitted tokens continued by the target are distributed as the target's
      sequence for SD; for biased SD and other rules, as the rule's output law.

    Example:
      >>> import jax.numpy as jnp, specjax
      >>> p = jnp.array([[0.5, 0.5, 0.0]])
      >>> q = jnp.array([[0.4, 0.4, 0.2], [1.0, 0.0, 0.0]])
      >>> law = specjax.verify_drafts_law(specjax.Speculative(), jnp.array([1]), p, q)
      >>> round(float(law.num_accepted[1]), 3), int(law.outcome[0].argmax())  # residual: token 2
      (0.8, 2)
    """
    check_given_decoder(decoder)
    inputs = check_inputs(draft_tokens, draft_probs, target_probs, num_drafts)
    probe_decoder(decoder, inputs.target_probs.shape[-1], inputs.target_probs.dtype)
    stop, with_bonus = check_endings(stop_tokens, bonus, inputs.target_probs.shape[-1])
    return _law(decoder, inputs._replace(batched=None), stop, with_bonus, inputs.batched)
