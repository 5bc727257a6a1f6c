"""Recording JAX models: ``record`` runs target rollouts of models and keeps the statistics of
``specjax.pairs.recording``'s layout."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax import _checks
from specjax import _memory
from specjax._progress import Progress
from specjax.decoders.autoregressive import Autoregressive
from specjax.models.autoregressive import probs_block
from specjax.models.logits import as_probability_model
from specjax.models.markov import MarkovChain
from specjax.models.static_leaves import with_static_leaves
from specjax.pairs.recording import CHUNK_BYTES
from specjax.pairs.recording import ROLLOUT_COPIES
from specjax.pairs.recording import Recording
from specjax.pairs.recording import _statistics
from specjax.pairs.recording import assemble
from specjax.pairs.recording import check_decoders
from specjax.pairs.recording import check_lengths
from specjax.pairs.recording import rows_chunk
from specjax.pairs.recording import stop_lengths
from specjax.sampling import sharding as _sharding

__all__ = ["record"]


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
