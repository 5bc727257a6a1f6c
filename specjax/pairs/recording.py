"""Recordings of target rollouts: what the estimators need, per sequence and position.

A ``Recording`` holds ``B`` sequences ``x_0..x_T`` drawn from the target and, at each position
``t = 1..T``, the draft's and the target's probability of the emitted token, ``p_t(x_t)`` and
``q_t(x_t)`` (SD's rejection rate needs nothing else), optional per-sequence ``weights``, and

* for multi-draft roots or any other token-wise rule, the rates ``r_t`` of the decoders named at
  record time (``decoders=``): ``P(rejected, x_t) / q_t(x_t)`` at a call's root and inside a
  call, from the decoder's own ``laws`` on the full rows, computed once and kept as ``(B, T)``
  arrays (a decoder's rates do not depend on its lookahead, so one entry serves every ``K``);
* or the full rows ``(B, T, V)`` (``keep_rows=True``; by default ``from_arrays`` keeps rows of at
  most ``KEEP_ROWS_BYTES``, so that a small dump serves every token-wise decoder), from
  which any token-wise decoder's rates are computed at estimate time.

Statistics instead of rows keep a recording small: at ``V = 32,000``, ``T = 256`` and 1,000
sequences it is 3 MB (the rows would be 65 GB).

**The ``.npz`` layout** (``Recording.save``, ``Recording.load``), written by NumPy alone::

    tokens        int   (B, T + 1)   x_0..x_T of each sequence
    draft_prob    float (B, T)       p_t(x_t), t = 1..T  (index t - 1)
    target_prob   float (B, T)       q_t(x_t)
    weights       float (B,)         optional
    lengths       int   (B,)         optional: emitted tokens per sequence (ragged requests)
    draft_probs   float (B, T, V)    optional full rows (then draft_prob/target_prob may be
    target_probs  float (B, T, V)    left out: they are read off the rows)
    root_rejection/<label>, rejection/<label>   float (B, T)   optional rates of a decoder,
                                     <label> its ``repr`` with ``lookahead=None`` (functions
                                     as ``module.qualname``: ``recording_files.rate_label``)

``save`` writes atomically (a temporary file in the same folder, renamed over the destination) and
adds ``.npz`` to a name without it; ``load`` reads ``path`` or ``path + ".npz"`` and checks what it
reads as ``from_arrays`` checks its arguments (``specjax.pairs.recording_files``).

**What every constructor checks.** At least one sequence and one position; tokens in ``[0, V)``
(int32 ids); probabilities in ``[0, 1]``; a *positive* target probability of every recorded token
of a sequence of positive weight (target rollouts emit only tokens the target can emit: a zero is
the mark of a dump misaligned by a position, or of the wrong model's rows); weights finite,
non-negative, not all zero, stored divided by their largest (the estimates are weighted means,
which do not depend on the weights' scale; this keeps float32 sums from overflowing or
underflowing).

A PyTorch user writes ``np.savez(path, tokens=..., draft_prob=..., target_prob=...)`` from the
gathered probabilities of the emitted tokens (``torch.gather`` on the softmaxes), or the full rows
for a small vocabulary.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import _memory
from specjax._progress import Progress
from specjax.decoders.autoregressive import Autoregressive
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.planning import resolve_decoder
from specjax.models.autoregressive import probs_block
from specjax.models.logits import as_probability_model
from specjax.models.logits import process_logits
from specjax.models.markov import MarkovChain
from specjax.models.static_leaves import with_static_leaves
from specjax.numerics import safe_ratio
from specjax.sampling import sharding as _sharding

#: Working memory (bytes) one chunk's rows may take when scoring or reading rows.
CHUNK_BYTES = 1 << 28
#: ``from_arrays`` keeps the rows by default when both take at most this many bytes.
KEEP_ROWS_BYTES = 1 << 30
#: Rows (V entries) alive per chain and step while a chunk of rollouts runs (measured about 10 at
#: V = 32,000: a run of 1,000 chains peaked 1.29 GB above the process's start).
ROLLOUT_COPIES = 12


class DecoderRates(NamedTuple):
    """A decoder's rejection rates along the recorded tokens.

    Attributes:
      decoder: the decoder, with ``lookahead=None`` (its rates do not depend on ``K``).
      root_rejection: ``(B, T)``, ``P(rejected, x_t) / q_t(x_t)`` of its root law.
      rejection: ``(B, T)``, the same of its in-call law.
    """

    decoder: TokenwiseDecoder
    root_rejection: jax.Array  # shape=(B, T)
    rejection: jax.Array  # shape=(B, T)


def rate_key(decoder):
    """``decoder`` with ``lookahead=None``: the key its rates are stored under."""
    return decoder.with_lookahead(None) if decoder.varies_lookahead else decoder


def check_estimable(decoder) -> None:
    """Raise ``ValueError`` unless ``decoder`` is a lossless decoder whose calls read only rows
    along the recorded path (``recording_reads``): a token-wise decoder whose laws depend on the
    rows of the recorded positions only, or a static token tree."""
    resolve_decoder(decoder)  # the decoder's own settings, as every entry point checks them
    name = type(decoder).__name__
    if decoder.recording_reads == "off_path":
        raise ValueError(
            f"decoder: {name} is a call-level decoder whose calls read the draft's rows off the "
            f"recorded path (blocks' rejected drafts, dynamic trees, adaptive or scheduled draft "
            f"lengths), which a recording of target rollouts does not hold; estimate token-wise "
            f"decoders (Speculative, BatchSpeculative, OptimalMultiDraft, KSequential, ...) or "
            f"static token trees (TokenTree), or use specjax.decode on the models")
    if decoder.lossless is False:
        raise ValueError(
            f"decoder: {name} is a lossy rule (its output is not the target's), so target "
            f"rollouts do not have its output law and cannot estimate its cost; use "
            f"specjax.decode or specjax.exact on the models")
    if not isinstance(decoder, TokenwiseDecoder):
        return
    if decoder.binds_models or "protocol" not in decoder.model_kinds:
        raise ValueError(
            f"decoder: {decoder!r} reads the whole models (a policy solved over the horizon), "
            f"not only the recorded rows: use specjax.exact or specjax.decode on the models")


def probs_at(rows, tokens) -> jax.Array:
    """``rows[..., t, tokens[..., t]]``: each ``(..., T, V)`` row's entry at the token ``(..., T)``
    it emitted."""
    return jnp.take_along_axis(rows, tokens[..., None], axis=-1)[..., 0]


def decoder_rates(decoder, p, q, tokens):
    """``(root_rejection, rejection, loss)`` of a token-wise ``decoder`` on rows ``p``, ``q``
    ``(..., T, V)`` at ``tokens`` ``(..., T)``: its rates and the largest
    ``|accepted + rejected - q|`` of its laws (0 for a lossless rule)."""
    root, verify = decoder.laws(p, q)
    q_x = probs_at(q, tokens)

    def rate(mass):
        return jnp.clip(safe_ratio(probs_at(mass, tokens), q_x, 0), 0, 1)

    loss = jnp.maximum(jnp.max(jnp.abs(root.accepted + root.rejected - q)),
                       jnp.max(jnp.abs(verify.accepted + verify.rejected - q)))
    return rate(root.rejected), rate(verify.rejected), loss


def lossless_tolerance(dtype) -> float:
    """How far ``accepted + rejected`` may be from ``q`` for a lossless rule (rounding)."""
    return 1e-9 if jnp.dtype(dtype) == jnp.float64 else 1e-4


@functools.partial(jax.jit, static_argnames=("decoders", "keep_rows"))
def _statistics(p, q, tokens, *, decoders, keep_rows):
    """Per-position statistics of rows ``p``, ``q`` ``(c, T, V)`` at ``tokens`` ``(c, T)``."""
    draft_prob, target_prob = probs_at(p, tokens), probs_at(q, tokens)
    rates = tuple(decoder_rates(d, p, q, tokens) for d in decoders)
    rows = (p, q) if keep_rows else None
    return draft_prob, target_prob, rates, rows


class Recording(NamedTuple):
    """Target rollouts with the per-position statistics the estimators need (module docstring).

    Build one with ``Recording.from_arrays`` (an engine's dump), ``Recording.from_statistics``
    (the emitted tokens' probabilities only), ``Recording.load`` or ``specjax.record``.

    Attributes:
      tokens: ``(B, T + 1)`` int32, ``x_0..x_T``.
      draft_prob: ``(B, T)``, ``p_t(x_t)`` at index ``t - 1``.
      target_prob: ``(B, T)``, ``q_t(x_t)``.
      weights: ``(B,)`` non-negative weights of the sequences, or ``None`` (all equal).
      rates: ``DecoderRates`` of the decoders asked for at record time.
      draft_probs: ``(B, T, V)`` full draft rows when kept, else ``None``.
      target_probs: ``(B, T, V)`` full target rows when kept, else ``None``.
      lengths: ``(B,)`` int32, the emitted tokens of each sequence (ragged requests: entries
        past ``lengths[b]`` are padding, set to token 0 and probability 1 and never read), or
        ``None``: every sequence has ``T``.
    """

    tokens: jax.Array  # shape=(B, T + 1), dtype=int32
    draft_prob: jax.Array  # shape=(B, T)
    target_prob: jax.Array  # shape=(B, T)
    weights: jax.Array | None = None  # shape=(B,)
    rates: tuple = ()
    draft_probs: jax.Array | None = None  # shape=(B, T, V)
    target_probs: jax.Array | None = None  # shape=(B, T, V)
    lengths: jax.Array | None = None  # shape=(B,), dtype=int32

    @property
    def num_sequences(self) -> int:
        """``B``."""
        return self.tokens.shape[0]

    @property
    def horizon(self) -> int:
        """``T``."""
        return self.tokens.shape[1] - 1

    def rates_of(self, decoder):
        """The recorded ``DecoderRates`` of ``decoder`` (any lookahead), or ``None``."""
        key = rate_key(decoder)
        for entry in self.rates:
            if entry.decoder == key:
                return entry
        return None

    @classmethod
    def from_arrays(cls, tokens, draft_probs, target_probs, *, weights=None, lengths=None,
                    eos=None, logits=False, processing=None, decoders=(),
                    keep_rows=None) -> "Recording":
        """A recording from arrays, e.g. an engine's dump of target rollouts.

        Args:
          tokens: ``(B, T + 1)`` ints, ``x_0..x_T`` of ``B`` target rollouts.
          draft_probs: ``(B, T, V)``: at index ``t - 1`` the draft's law of ``x_t`` given
            ``x_0..x_{t-1}`` (logits with ``logits=True``).
          target_probs: ``(B, T, V)``: the target's, likewise.
          weights: ``(B,)`` non-negative weights (not all zero), or ``None``: the estimates are
            weighted means (with every sequence enumerated and weighted by its target
            probability they are exact).
          lengths: ``(B,)`` ints in ``[1, T]``, or ``None``: sequence ``b`` emitted
            ``lengths[b]`` tokens and ended (an end-of-sequence token, the engine's limit);
            the entries past it (tokens, rows) are padding, never read (NaN is fine).
          eos: an end-of-sequence id instead of ``lengths``: a sequence ends at its first
            ``eos`` among ``x_1..x_T`` (included), else at ``T``.
          logits: ``True`` when the arrays are logits: they are turned into the laws an engine
            samples from by ``specjax.process_logits`` with the keywords ``processing`` (a dict:
            ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``order``; default softmax).
          processing: those keywords (only with ``logits=True``).
          decoders: token-wise decoders whose rates to compute from the rows now (multi-draft
            roots, a ``RejectionRule``); SD needs none.
          keep_rows: keep the full rows (any token-wise decoder can then be estimated later);
            default ``None``: keep them when both take at most ``KEEP_ROWS_BYTES`` (1 GiB).

        Returns:
          ``Recording``.

        Raises:
          ValueError: shapes that do not match, tokens out of ``[0, V)``, rows that are not laws
            (negative, not summing to one), bad weights, ``processing`` without ``logits``, a
            decoder that cannot be estimated, or one whose laws are not lossless on these rows.

        Example:
          >>> import jax.numpy as jnp, specjax
          >>> q = jnp.array([[[0.5, 0.5], [0.9, 0.1]]])  # B = 1, T = 2, V = 2
          >>> p = jnp.array([[[0.8, 0.2], [0.5, 0.5]]])
          >>> rec = specjax.Recording.from_arrays(jnp.array([[0, 1, 0]]), p, q)
          >>> print(*[round(float(v), 3) for v in rec.draft_prob[0]])
          0.2 0.5
        """
        _checks.check_bool("logits", logits)
        if keep_rows is not None:
            _checks.check_bool("keep_rows", keep_rows)
        if processing is not None and not logits:
            raise ValueError("processing (process_logits keywords) applies to logits: pass "
                             "logits=True with it")
        p, q = jnp.asarray(draft_probs), jnp.asarray(target_probs)
        for name, x in (("draft_probs", p), ("target_probs", q)):
            if x.ndim != 3:
                raise ValueError(f"{name} must have shape (B, T, V), got {x.shape}")
        if p.shape != q.shape:
            raise ValueError(f"draft_probs and target_probs must have the same shape (B, T, V), "
                             f"got {p.shape} and {q.shape}")
        num, horizon, num_states = q.shape
        check_sizes("draft_probs and target_probs", num, horizon)
        tokens, lengths, live = check_lengths(tokens, lengths, eos, num, horizon)
        if live is not None:  # padding: logits 0 (uniform rows), probabilities uniform
            fill = 0.0 if logits else 1.0 / num_states
            p, q = (jnp.where(live[..., None], x, jnp.asarray(fill, x.dtype)) for x in (p, q))
        if logits:
            settings = dict(processing or {})
            p = process_logits(p, **settings)
            q = process_logits(q, **settings)
        tokens = check_tokens(tokens, num, horizon, num_states)
        weights = check_weights(weights, num)
        _checks.check_probabilities("draft_probs", p)
        _checks.check_probabilities("target_probs", q)
        decoders = check_decoders(decoders)
        dtype = jnp.result_type(p.dtype, q.dtype)
        p, q = p.astype(dtype), q.astype(dtype)
        if keep_rows is None:
            keep_rows = 2 * p.size * p.dtype.itemsize <= KEEP_ROWS_BYTES
        elif keep_rows:
            _memory.check_fits(2 * p.size * p.dtype.itemsize, argument="keep_rows=True",
                               what="the full rows", remedy="keep statistics (keep_rows=False)")
        chunk = rows_chunk(horizon, num_states, dtype, num, decoders)
        parts = [_statistics(p[i:i + chunk], q[i:i + chunk], tokens[i:i + chunk, 1:],
                             decoders=decoders, keep_rows=False)
                 for i in range(0, num, chunk)]
        return assemble(tokens, weights, decoders, parts, rows=(p, q) if keep_rows else None,
                        lengths=lengths)

    @classmethod
    def from_statistics(cls, tokens, draft_prob, target_prob, *, weights=None, lengths=None,
                        eos=None) -> "Recording":
        """A recording from the emitted tokens' probabilities alone, ``p_t(x_t)`` and
        ``q_t(x_t)`` (``(B, T)``, index ``t - 1``): all SD needs, for any vocabulary size.
        ``weights``, ``lengths`` and ``eos`` as ``from_arrays``'s.

        Raises:
          ValueError: shapes that do not match, values outside ``[0, 1]``, bad weights or
            lengths, a recorded token of target probability 0.
        """
        draft_prob, target_prob = jnp.asarray(draft_prob), jnp.asarray(target_prob)
        if draft_prob.ndim == 2 and draft_prob.shape == target_prob.shape:
            tokens, lengths, live = check_lengths(tokens, lengths, eos, *target_prob.shape)
            if live is not None:  # padding: probability 1 (never read)
                draft_prob, target_prob = (jnp.where(live, x, jnp.ones((), x.dtype))
                                           for x in (draft_prob, target_prob))
        for name, x in (("draft_prob", draft_prob), ("target_prob", target_prob)):
            if x.ndim != 2 or not jnp.issubdtype(x.dtype, jnp.floating):
                raise ValueError(f"{name} must be a float array of shape (B, T), got "
                                 f"{x.shape} {x.dtype}")
            values = np.asarray(x)
            if not ((values >= 0) & (values <= 1)).all():
                bad = values[~((values >= 0) & (values <= 1))].ravel()[0]
                raise ValueError(f"{name} must hold probabilities in [0, 1], got {bad!r}")
        if draft_prob.shape != target_prob.shape:
            raise ValueError(f"draft_prob and target_prob must have the same shape, got "
                             f"{draft_prob.shape} and {target_prob.shape}")
        num, horizon = target_prob.shape
        check_sizes("draft_prob and target_prob", num, horizon)
        tokens = check_tokens(tokens, num, horizon, None)
        weights = check_weights(weights, num)
        check_recorded_tokens("target_prob", target_prob, weights)
        dtype = jnp.result_type(draft_prob.dtype, target_prob.dtype)
        return cls(tokens, draft_prob.astype(dtype), target_prob.astype(dtype), weights,
                   lengths=lengths)

    def save(self, path) -> str:
        """Writes the recording to ``path`` in the ``.npz`` layout of the module docstring,
        atomically: a temporary file in the same folder renamed over ``path``, so a save that
        fails midway leaves an existing file whole. ``.npz`` is added to a name without it
        (``save("rec")`` writes ``rec.npz``, which ``load("rec")`` reads).

        Returns:
          the file written.

        Raises:
          ValueError: ``path`` names a folder or a missing folder; the recording's arrays span
            several processes (``record`` under ``jax.distributed``): gather it first, on every
            process, with ``specjax.sampling.sharding.gather(recording)``, and save that; two
            decoders' rates under one label.
        """
        from specjax.pairs import recording_files  # noqa: PLC0415

        return recording_files.save(self, path)

    @classmethod
    def load(cls, path, *, decoders=(), keep_rows=None) -> "Recording":
        """Reads a recording written in the ``.npz`` layout (by ``save`` or by NumPy alone),
        checking what it reads as ``from_arrays`` and ``from_statistics`` check their arguments.

        Args:
          path: the file (``path + ".npz"`` is read when ``path`` does not exist).
          decoders: decoders whose stored rates to read back (matched by
            ``recording_files.rate_label``: the ``repr`` with ``lookahead=None``, functions by
            module and name), or to compute now from stored rows.
          keep_rows: keep stored rows (default: when the file has them).

        Raises:
          ValueError (naming the file): no such file, a folder, a ``.npy`` file, a truncated or
            damaged archive; a file without ``tokens``, or without either the statistics
            (``draft_prob``, ``target_prob``) or the rows; arrays that ``from_arrays`` or
            ``from_statistics`` refuse; stored rates not of shape ``(B, T)``, not finite or
            outside ``[0, 1]``; a decoder neither stored nor computable.
        """
        from specjax.pairs import recording_files  # noqa: PLC0415

        return recording_files.load(cls, path, decoders=decoders, keep_rows=keep_rows)


def check_lengths(tokens, lengths, eos, num: int, horizon: int):
    """``(tokens, lengths, live)``: ``lengths`` ``(B,)`` int32 (read off ``eos`` when given) and
    ``live`` ``(B, T)`` bool (``t < lengths[b]``), with the tokens' padding set to 0; or the
    tokens as given and ``(None, None)`` when neither is given."""
    if lengths is None and eos is None:
        return tokens, None, None
    if lengths is not None and eos is not None:
        raise ValueError("lengths and eos: give one of them (eos reads the lengths off the "
                         "tokens)")
    tokens = np.array(tokens)  # a copy: its padding is overwritten
    if not np.issubdtype(tokens.dtype, np.integer) or tokens.shape != (num, horizon + 1):
        raise ValueError(f"tokens must be integers of shape (B, T + 1) = ({num}, "
                         f"{horizon + 1}), got {tokens.shape} {tokens.dtype}")
    if eos is not None:
        _checks.check_static_non_negative_int("eos", eos)
        lengths = stop_lengths(tokens, (eos,))
    else:
        if isinstance(lengths, jax.core.Tracer):
            raise ValueError("lengths must be concrete (it sets which entries are read)")
        lengths = np.asarray(lengths)
        if lengths.shape != (num,) or not np.issubdtype(lengths.dtype, np.integer):
            raise ValueError(f"lengths must be ints of shape (B,) = ({num},), got "
                             f"{lengths.shape} {lengths.dtype}")
        if (lengths < 1).any() or (lengths > horizon).any():
            raise ValueError(f"lengths must lie in [1, T] = [1, {horizon}] (emitted tokens per "
                             f"sequence), got {int(lengths.min())} .. {int(lengths.max())}")
    live = np.arange(horizon)[None] < lengths[:, None]
    tokens[:, 1:] = np.where(live, tokens[:, 1:], 0)
    return tokens, jnp.asarray(lengths, jnp.int32), live


def check_sizes(names: str, num: int, horizon: int) -> None:
    """Refuse a recording without sequences or positions (its estimates would be NaN)."""
    if num == 0:
        raise ValueError(f"{names} hold no sequences (B = 0): a recording needs at least one")
    if horizon == 0:
        raise ValueError(f"{names} hold no positions (T = 0): a recording needs at least one "
                         f"emitted token per sequence")


def check_recorded_tokens(name: str, target_prob, weights) -> None:
    """Refuse a target probability 0 of a recorded token (in a sequence of positive weight)."""
    if not _checks.is_concrete(target_prob):
        return
    if isinstance(target_prob, jax.Array) and not target_prob.is_fully_addressable:
        # Under jax.distributed (record's global arrays, no weights): each process checks the
        # sequences it holds.
        zero = np.concatenate([np.asarray(shard.data).reshape(-1, target_prob.shape[1]) <= 0
                               for shard in target_prob.addressable_shards])
    else:
        zero = np.asarray(target_prob) <= 0
    if weights is not None:
        zero &= np.asarray(weights)[:, None] > 0
    if zero.any():
        b, t = (int(i) for i in np.argwhere(zero)[0])
        raise ValueError(
            f"{name}: the target gives the recorded token of sequence {b} at position t = "
            f"{t + 1} probability 0 ({int(zero.sum())} such tokens in all), but target rollouts "
            f"emit only tokens the target can emit: is the dump misaligned by one position (the "
            f"row at index t - 1 must be the law of x_t given x_0..x_(t-1)), or the rows "
            f"another model's?")


def check_tokens(tokens, num: int, horizon: int, num_states: int | None):
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be integers, got dtype {tokens.dtype}")
    if tokens.shape != (num, horizon + 1):
        raise ValueError(f"tokens must have shape (B, T + 1) = ({num}, {horizon + 1}) (x_0..x_T "
                         f"of each sequence), got {tokens.shape}")
    if (tokens < 0).any() or (num_states is not None and (tokens >= num_states).any()):
        raise ValueError("tokens must lie in [0, V)"
                         + ("" if num_states is None else f" = [0, {num_states})"))
    if tokens.size and tokens.max() > np.iinfo(np.int32).max:
        raise ValueError(f"tokens must be int32 ids, below 2**31, got {int(tokens.max())}")
    return jnp.asarray(tokens, jnp.int32)


def check_weights(weights, num: int):
    if weights is None:
        return None
    w = np.asarray(weights)  # on the host: a float64 1e300 stays finite here
    if w.shape != (num,) or not np.issubdtype(w.dtype, np.floating):
        raise ValueError(f"weights must be a float array of shape (B,) = ({num},), got "
                         f"{w.shape} {w.dtype}")
    values = w.astype(np.float64)
    if not np.isfinite(values).all() or (values < 0).any():
        raise ValueError("weights must be finite and non-negative")
    if values.max() <= 0:
        raise ValueError("weights must not all be zero")
    # Divided by the largest (module docstring): the estimates do not depend on the scale, and
    # the float32 sums of weights of 1e37 or 1e-44 neither overflow nor underflow.
    return _checks.device_array(values / values.max()).astype(
        jax.dtypes.canonicalize_dtype(w.dtype))


def check_decoders(decoders) -> tuple:
    """``decoders`` as a tuple of estimable decoders keyed with ``lookahead=None``."""
    if isinstance(decoders, TokenwiseDecoder) or not isinstance(decoders, (tuple, list)):
        raise ValueError(f"decoders must be a tuple of decoders, got {decoders!r}"[:300])
    for decoder in decoders:
        check_estimable(decoder)
        if decoder.recording_reads == "path_rows":
            raise ValueError(f"decoders: {decoder!r} has no per-position rates to record (a "
                             f"tree's node changes what is read); keep the rows instead "
                             f"(keep_rows=True) and estimate it from them")
    keys = []
    for decoder in decoders:
        key = rate_key(decoder)
        if key not in keys and decoder.recording_reads != "nothing":
            keys.append(key)
    return tuple(keys)


def rows_chunk(horizon: int, num_states: int, dtype, num: int, decoders) -> int:
    """Sequences per chunk so that a chunk's rows and laws stay within ``CHUNK_BYTES``."""
    copies = 3 + 6 * len(decoders)
    per_sequence = horizon * num_states * jnp.dtype(dtype).itemsize * copies
    return int(max(1, min(num, CHUNK_BYTES // max(per_sequence, 1))))


def assemble(tokens, weights, decoders, parts, rows=None, lengths=None) -> Recording:
    """A ``Recording`` from the chunks' ``_statistics`` (checking each decoder's laws); with
    ``lengths``, the statistics' padding set to probability 1."""
    draft_prob = jnp.concatenate([part[0] for part in parts])
    target_prob = jnp.concatenate([part[1] for part in parts])
    if lengths is not None:
        live = jnp.arange(draft_prob.shape[1])[None] < lengths[:, None]
        draft_prob, target_prob = (jnp.where(live, x, jnp.ones((), x.dtype))
                                   for x in (draft_prob, target_prob))
    check_recorded_tokens("target_probs", target_prob, weights)
    rates = []
    for i, decoder in enumerate(decoders):
        loss = max(float(part[2][i][2]) for part in parts)
        if not loss <= lossless_tolerance(draft_prob.dtype):
            raise ValueError(
                f"decoders: {decoder!r} is not lossless on these rows (its accepted and "
                f"rejected masses miss the target's row by {loss:.3g}), so its output is not "
                f"the target's and target rollouts cannot estimate its cost")
        rates.append(DecoderRates(decoder,
                                  jnp.concatenate([part[2][i][0] for part in parts]),
                                  jnp.concatenate([part[2][i][1] for part in parts])))
    p, q = (None, None) if rows is None else rows
    return Recording(tokens, draft_prob, target_prob, weights, tuple(rates), p, q, lengths)


# ---------------------------------------------------------------------------------------------
# Recording JAX models.


def _model_rows(model, tokens):
    """``(c, T, V)``: the model's law of ``x_t`` given ``x_0..x_{t-1}`` along ``tokens``
    ``(c, T + 1)``: a ``MarkovChain``'s transitions, or a protocol model's rows scored in one
    batched evaluation per sequence (``probs_block``, or a scan of ``probs``)."""
    if isinstance(model, MarkovChain):
        positions = jnp.arange(tokens.shape[1] - 1)
        return model.trans[positions[None], tokens[:, :-1]]

    def one(sequence):
        state = model.update(model.init_state(), sequence[0])
        return probs_block(model, state, sequence[1:-1])

    return jax.vmap(one)(tokens)


@functools.partial(jax.jit, static_argnames=("decoders", "keep_rows"))
def _score_chunk(draft, target, tokens, *, decoders, keep_rows):
    p, q = _model_rows(draft, tokens), _model_rows(target, tokens)
    return _statistics(p, q, tokens[:, 1:], decoders=decoders, keep_rows=keep_rows)


def record(key, draft, target, num_sequences: int, *, horizon: int | None = None,
           decoders=(), keep_rows: bool = False, chunk_size: int | None = None,
           sharding=None, progress: bool = False, stop_tokens=None) -> Recording:
    """Records ``num_sequences`` target rollouts of JAX models, with the draft's and the
    target's probabilities of every emitted token (and the rates of ``decoders``).

    The rollouts are ``specjax.decode(key, Autoregressive(), None, target, num_sequences)``'s
    tokens (sharded as ``decode`` is), run in chunks of chains so that only one chunk's rows are
    in memory at a time; both models then score each sequence in one batched evaluation
    (``probs_block`` where the model has it, else a scan of ``probs``), in chunks of sequences,
    keeping only the statistics (module docstring).

    Args:
      key: a JAX PRNG key.
      draft, target: ``MarkovChain``s, ``FiniteStateModel``s or any models of the protocol
        (models that give logits are turned into probabilities as ``decode`` does).
      num_sequences: ``B``, a positive int.
      horizon: ``T``; required for models other than ``MarkovChain``.
      decoders: token-wise decoders whose rates to record (multi-draft roots, a
        ``RejectionRule``): a tuple.
      keep_rows: keep the full rows ``(B, T, V)`` (small models only).
      chunk_size: sequences scored at once (default: rows of about 256 MiB).
      sharding: as ``decode``'s (``specjax.chain_sharding()``); ``num_sequences`` and the chunk
        size must be multiples of the number of shards. Under ``jax.distributed`` (a mesh over
        several processes) the recording's arrays are global: each process holds its own
        sequences (``specjax.sampling.sharding``).
      progress: show a progress bar over the chunks.
      stop_tokens: ``None``, or end-of-sequence ids (as ``decode``'s): each rollout ends at
        its first one, and the recording is ragged (``lengths``).

    Returns:
      ``Recording``.

    Raises:
      ValueError: what ``decode`` raises for the target; a bad draft, ``decoders`` or
        ``chunk_size``; a decoder that is not lossless on the rows met.

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> rec = specjax.record(jax.random.key(0), draft, target, 64)
      >>> rec.tokens.shape, rec.draft_prob.shape
      ((64, 51), (64, 50))
    """
    from specjax.models.checks import model_kind  # noqa: PLC0415
    from specjax.sampling.decoding import plan  # noqa: PLC0415
    from specjax.sampling.decoding import replicate  # noqa: PLC0415
    from specjax.sampling.decoding import run_chunk  # noqa: PLC0415

    _checks.check_positive_int("num_sequences", num_sequences)
    _checks.check_positive_int("chunk_size", chunk_size, allow_none=True)
    decoders = check_decoders(decoders)
    same = draft is target
    target = with_static_leaves(as_probability_model(target))
    draft = target if same else with_static_leaves(as_probability_model(draft))
    model_kind(draft, target)
    _checks.check_bool("keep_rows", keep_rows)
    run = replicate(plan(key, Autoregressive(), None, target, num_sequences, horizon=horizon,
                         sharding=sharding, stop_tokens=stop_tokens))
    horizon, num_states = run.horizon, target.num_states
    dtype = jnp.result_type(float)
    shards = _sharding.num_shards(run.sharding)
    # The rollouts, in chunks of chains: each chunk is chains start .. start + n - 1 of the one
    # run decode(key, Autoregressive(), ...) would make (the same tokens), and only a chunk's
    # rows are alive at a time (about ROLLOUT_COPIES of them per chain and step). The offset is
    # an np.uint32, as decode passes it: a Python int (weakly typed int32) compiled a second
    # program for the run decode compiles.
    roll = max(1, CHUNK_BYTES // (num_states * jnp.dtype(dtype).itemsize * ROLLOUT_COPIES))
    roll = min(num_sequences, max(shards, roll // shards * shards))
    tokens = jnp.concatenate([
        run_chunk(key, run, np.uint32(start), min(roll, num_sequences - start))[0].tokens
        for start in range(0, num_sequences, roll)])
    lengths = None
    if run.stop_tokens and not tokens.is_fully_addressable:
        raise ValueError("stop_tokens: a ragged recording under jax.distributed (a mesh over "
                         "several processes) is not supported yet; record on one process")
    if run.stop_tokens:  # ragged: each rollout ends at its first stop token
        tokens, lengths, _ = check_lengths(
            tokens, jnp.asarray(stop_lengths(np.asarray(tokens), run.stop_tokens)), None,
            num_sequences, horizon)
        tokens = jnp.asarray(tokens, jnp.int32)
    if keep_rows:
        _memory.check_fits(2 * num_sequences * horizon * num_states * jnp.dtype(dtype).itemsize,
                           argument="keep_rows=True", what="the full rows",
                           remedy="keep statistics (keep_rows=False)")
    chunk = chunk_size or rows_chunk(horizon, num_states, dtype, num_sequences, decoders)
    if shards > 1:
        chunk = max(shards, chunk // shards * shards)
        if num_sequences % shards or chunk % shards:
            raise ValueError(f"chunk_size must be a multiple of the {shards} shards, got {chunk}")
    parts = []
    starts = range(0, num_sequences, chunk)
    with Progress(len(starts), enabled=progress) as bar:
        for start in starts:
            block = tokens[start:start + chunk]
            if shards > 1:
                block = jax.device_put(block, _sharding.along_chains(run.sharding, 2))
            parts.append(_score_chunk(draft, target, block, decoders=decoders,
                                      keep_rows=keep_rows))
            bar.step(f"{min(start + chunk, num_sequences):,} of {num_sequences:,} sequences")
    rows = None
    if keep_rows:
        rows = tuple(jnp.concatenate([part[3][i] for part in parts]) for i in range(2))
    return assemble(tokens, None, decoders, parts, rows=rows, lengths=lengths)


def stop_lengths(tokens: np.ndarray, stop_tokens) -> np.ndarray:
    """``(B,)``: the position of each sequence's first stop token among ``x_1..x_T`` (``T``
    where there is none)."""
    hit = np.isin(tokens[:, 1:], np.asarray(stop_tokens))
    return np.where(hit.any(axis=1), np.argmax(hit, axis=1) + 1, tokens.shape[1] - 1)
