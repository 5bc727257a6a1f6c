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

What every constructor checks (ids, probabilities, a positive target probability of every
recorded token, weights, ragged lengths): ``specjax.pairs.recording_checks``.

A PyTorch user writes ``np.savez(path, tokens=..., draft_prob=..., target_prob=...)`` (the guide
"HuggingFace, vLLM and SGLang dumps" has the recipes).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import _memory
from specjax.decoders.base import TokenwiseDecoder
from specjax.decoders.planning import resolve_decoder
from specjax.models.logits import process_logits
from specjax.numerics import safe_ratio
from specjax.pairs.recording_checks import check_lengths
from specjax.pairs.recording_checks import check_recorded_tokens
from specjax.pairs.recording_checks import check_sizes
from specjax.pairs.recording_checks import check_tokens
from specjax.pairs.recording_checks import check_weights
from specjax.pairs.recording_checks import stop_lengths

__all__ = ["CHUNK_BYTES", "DecoderRates", "KEEP_ROWS_BYTES", "ROLLOUT_COPIES", "Recording",
           "assemble", "check_decoders", "check_estimable", "decoder_rates",
           "lossless_tolerance", "probs_at", "rate_key", "rows_chunk"]

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
            f"recorded path (blocks' rejected drafts, dynamic trees), which a recording of "
            f"target rollouts does not hold; estimate token-wise decoders, static token trees "
            f"(TokenTree) or adaptive draft lengths, or use specjax.decode on the models")
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
                        eos=None, log=False) -> "Recording":
        """A recording from the emitted tokens' probabilities alone, ``p_t(x_t)`` and
        ``q_t(x_t)`` (``(B, T)``, index ``t - 1``): all SD needs, for any vocabulary size (an
        engine's top-``k`` log-probabilities always hold the sampled token's: that is enough).
        ``weights``, ``lengths`` and ``eos`` as ``from_arrays``'s; ``log=True``: the arrays are
        natural log-probabilities (``-inf`` for probability 0).

        Raises:
          ValueError: shapes that do not match, values outside ``[0, 1]``, bad weights or
            lengths, a recorded token of target probability 0.
        """
        _checks.check_bool("log", log)
        if log:  # in float64 on the host, then the canonical dtype
            draft_prob, target_prob = (_checks.host_array(np.exp(np.asarray(x, np.float64)))
                                       for x in (draft_prob, target_prob))
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

    @classmethod
    def concatenate(cls, recordings, *, weights=None) -> "Recording":
        """One recording of the sequences of ``recordings`` (built in chunks), in order.

        Rows are kept when every part kept them; a decoder's rates when every part holds them;
        ragged lengths where any part has them (``T`` for the others).

        Args:
          recordings: a non-empty sequence of ``Recording``s of one horizon ``T``.
          weights: ``(B,)`` weights of all the sequences. Required when a part has weights:
            each part's were divided by its own largest (``from_arrays``), so their relative
            scale across parts is lost.

        Raises:
          ValueError: no recordings, another type, horizons or vocabularies that differ,
            weighted parts without ``weights``, bad ``weights``.
        """
        if isinstance(recordings, Recording) or not isinstance(recordings, (list, tuple)) \
                or not recordings or not all(isinstance(r, Recording) for r in recordings):
            raise ValueError("recordings must be a non-empty list or tuple of Recordings")
        horizons = {r.horizon for r in recordings}
        if len(horizons) > 1:
            raise ValueError(f"recordings must share one horizon T, got {sorted(horizons)}")
        if weights is None and any(r.weights is not None for r in recordings):
            raise ValueError("weights: some recordings are weighted, and each part's weights "
                             "were divided by its own largest; give the weights of all the "
                             "sequences (weights=...)")
        cat = jnp.concatenate
        rows = all(r.draft_probs is not None for r in recordings)
        if rows and len({r.target_probs.shape[-1] for r in recordings}) > 1:
            raise ValueError("recordings must share one vocabulary V to keep their rows")
        keys = [e.decoder for e in recordings[0].rates
                if all(r.rates_of(e.decoder) is not None for r in recordings)]
        rates = tuple(DecoderRates(key, cat([r.rates_of(key).root_rejection for r in recordings]),
                                   cat([r.rates_of(key).rejection for r in recordings]))
                      for key in keys)
        lengths = None
        if any(r.lengths is not None for r in recordings):
            lengths = cat([jnp.full((r.num_sequences,), r.horizon, jnp.int32)
                           if r.lengths is None else r.lengths for r in recordings])
        num = sum(r.num_sequences for r in recordings)
        return cls(cat([r.tokens for r in recordings]), cat([r.draft_prob for r in recordings]),
                   cat([r.target_prob for r in recordings]), check_weights(weights, num), rates,
                   cat([r.draft_probs for r in recordings]) if rows else None,
                   cat([r.target_probs for r in recordings]) if rows else None, lengths)

    @classmethod
    def from_chunks(cls, chunks, **kwargs) -> "Recording":
        """A recording built chunk by chunk: each chunk a dict of ``from_arrays``'s arguments
        (``tokens``, ``draft_probs``, ``target_probs`` and optionally ``weights``, ``lengths``),
        e.g. from a generator reading an engine's dump file by file. Only the statistics (and the
        rates of ``decoders``) of each chunk are kept, so memory peaks near one chunk's rows.

        Args:
          chunks: an iterable of dicts.
          **kwargs: ``from_arrays``'s other keywords (``eos``, ``logits``, ``processing``,
            ``decoders``; ``keep_rows`` defaults to ``False`` here).
        """
        kwargs.setdefault("keep_rows", False)
        parts, raw_weights = [], []
        for i, chunk in enumerate(chunks):
            if not isinstance(chunk, dict) or not {"tokens", "draft_probs",
                                                   "target_probs"} <= set(chunk):
                raise ValueError(f"chunks: chunk {i} must be a dict with tokens, draft_probs and "
                                 f"target_probs (from_arrays's arguments)")
            chunk = dict(chunk)
            if chunk.get("weights") is not None:
                raw_weights.append(np.asarray(chunk["weights"], np.float64))
            parts.append(cls.from_arrays(**chunk, **kwargs))
        if not parts:
            raise ValueError("chunks: no chunk was given")
        if raw_weights and len(raw_weights) != len(parts):
            raise ValueError("chunks: give weights in every chunk or in none")
        return cls.concatenate(parts, weights=np.concatenate(raw_weights) if raw_weights
                               else None)

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


def check_decoders(decoders) -> tuple:
    """``decoders`` as a tuple of estimable decoders keyed with ``lookahead=None``."""
    if isinstance(decoders, TokenwiseDecoder) or not isinstance(decoders, (tuple, list)):
        raise ValueError(f"decoders must be a tuple of decoders, got {decoders!r}"[:300])
    for decoder in decoders:
        check_estimable(decoder)
        if decoder.recording_reads == "path_rows":
            raise ValueError(f"decoders: {decoder!r} has no per-position rates to record (a "
                             f"tree's node or a call's depth changes what is read); keep the "
                             f"rows instead (keep_rows=True) and estimate it from them")
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


