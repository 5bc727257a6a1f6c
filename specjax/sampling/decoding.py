"""``decode``: any decoder, any model kind it supports, any device layout, one entry point.

A run is planned before any work: the key, the decoder, the models (their kind: two
``MarkovChain``s, two ``FiniteStateModel``s, or any protocol models), ``num_chains``, the horizon
and the sharding are checked and the decoder's static settings resolved (``lookahead=None`` is
``K = T``). The plan then runs on the engine of the decoder's kind:

* token-wise decoders on ``MarkovChain``s: the law-table engine (``specjax.sampling.engine``);
* token-wise decoders on any other autoregressive model: ``specjax.sampling.models``;
* call-level decoders (block verification): ``specjax.sampling.calls``;
* ``batched_scoring=True`` on protocol models: ``specjax.sampling.blocks`` (drafts ``K`` tokens
  per call and scores them with one target evaluation, as serving engines do).

Every engine numbers chains by a 32-bit counter and draws chain ``c``'s numbers from ``c``
alone, so a run can be cut into chunks and laid out over devices without changing a token
(``decoding_statistics`` does both).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from specjax import _checks
from specjax import _memory
from specjax.decoders.base import CallDecoder
from specjax.decoders.planning import MAX_COUNTER
from specjax.decoders.planning import plan_run
from specjax.models.base import ModelKind
from specjax.models.base import as_model
from specjax.models.static_leaves import with_static_leaves
from specjax.models.logits import as_probability_model
from specjax.models.prompt import PromptedModel
from specjax.decoders.given_drafts import check_given_decoder
from specjax.sampling import blocks
from specjax.sampling import calls
from specjax.sampling import engine
from specjax.sampling import models
from specjax.sampling import sharding as _sharding
from specjax.sampling import tables as _tables
from specjax.sampling.engine import DecodingTrace

__all__ = [
    "Plan",
    "RunBytes",
    "check_batched_scoring",
    "check_fits",
    "check_same_prompt",
    "counters_per_chain",
    "decode",
    "plan",
    "replicate",
    "run_bytes",
    "run_chunk",
    "table_plan",
]


class Plan(NamedTuple):
    """A validated run (no key): the decoder with its settings resolved, the models and their
    kind, and the static sizes."""

    decoder: object
    draft: object
    target: object
    num_chains: int
    lookahead: int  # the resolved K (0 for autoregressive decoding)
    models: str  # the engine's ModelKind: MARKOV, or PROTOCOL (finite-state models too)
    horizon: int
    sharding: NamedSharding | None
    stop_tokens: tuple = ()  # sorted ids; the chains end at the first one (engine.stop_trace)
    batched_scoring: bool = False  # protocol models, one target evaluation per call (blocks)


def check_same_prompt(draft, target) -> None:
    """Refuses two ``PromptedModel``s whose prompts end in different tokens: ``x_0`` is drawn
    from the target, so the draft's own last prompt token would be silently replaced."""
    if isinstance(draft, PromptedModel) and isinstance(target, PromptedModel) \
            and _checks.is_concrete(draft.prompt) and _checks.is_concrete(target.prompt) \
            and int(draft.prompt[-1]) != int(target.prompt[-1]):
        raise ValueError(
            f"draft and target were given prompts that end in different tokens "
            f"({int(draft.prompt[-1])} and {int(target.prompt[-1])}); x_0 is the prompt's last "
            f"token and both models condition on it: give both the same prompt (with_prompt)")


def counters_per_chain(decoder, lookahead: int = 0, batched_scoring: bool = False) -> int:
    """How many 32-bit counters one chain uses per step of the engine: 1, or the uniforms of one
    call of a call-level decoder (of one position where it walks its calls) or of batched
    scoring (its chains' counters are ``c U .. c U + U - 1``)."""
    if batched_scoring:
        return blocks.uniforms_per_call(lookahead)
    if not isinstance(decoder, CallDecoder):
        return 1
    return decoder.walk_uniforms if decoder.has_walk else decoder.num_uniforms


def check_batched_scoring(batched_scoring, decoder, kind: str, lookahead: int) -> bool:
    """``batched_scoring`` as a bool, refused for runs it cannot serve (before any work)."""
    if not isinstance(batched_scoring, (bool, np.bool_)):
        raise ValueError(f"batched_scoring is a static setting: pass True or False, got "
                         f"{batched_scoring!r}")
    if not batched_scoring:
        return False
    if kind == ModelKind.MARKOV:
        raise ValueError(
            "batched_scoring=True runs protocol models (FiniteStateModel, NGramModel, your own "
            "model); a MarkovChain's engine reads its transition tables directly. Lift the "
            "chains with specjax.models.FiniteStateModel.from_markov_chain to score calls in a "
            "batch")
    try:
        check_given_decoder(decoder)
    except ValueError as error:
        raise ValueError(f"batched_scoring=True: {error}") from None
    if lookahead < 1:
        raise ValueError(f"batched_scoring=True needs a decoder that drafts (lookahead >= 1); "
                         f"{decoder!r} calls the target at every token")
    return True


def plan(key, decoder, draft, target, num_chains, *, horizon=None, sharding=None,
         stop_tokens=None, batched_scoring=False) -> Plan:
    """Validates a run of ``decoder`` before any work and resolves its settings."""
    _checks.check_key(key)
    same = draft is target
    target = as_probability_model(target)  # a model that gives logits: softmax
    draft = target if same else as_probability_model(draft)
    check_same_prompt(draft, target)
    # leaves that are not arrays (an equinox module's functions) travel as static data
    target = with_static_leaves(target)
    draft = target if same else with_static_leaves(draft)
    decoder, draft, target, mc_kind, horizon, lookahead = plan_run(
        decoder, draft, target, engine="monte_carlo", horizon=horizon, num_chains=num_chains)
    resolved_sharding = _sharding.resolve(sharding, num_chains)
    batched_scoring = check_batched_scoring(batched_scoring, decoder, mc_kind, lookahead)
    per_chain = counters_per_chain(decoder, lookahead, batched_scoring)
    if num_chains * per_chain > MAX_COUNTER:
        limit = "2**32" if per_chain == 1 else f"2**32 / {per_chain} ({per_chain} uniforms " \
            f"per chain and call)"
        raise ValueError(f"num_chains must be at most {limit}: chains are numbered with 32 bits; "
                         f"got {num_chains}")
    stop_tokens = _checks.check_stop_tokens(stop_tokens, target.num_states)
    _sharding.check_same_key(key, resolved_sharding)  # last: the one check that communicates
    return Plan(decoder, draft, target, num_chains, lookahead, mc_kind, horizon,
                resolved_sharding, stop_tokens, batched_scoring)


class RunBytes(NamedTuple):
    """Estimated peak bytes of a run's chains, split by what sets them (``run_bytes``)."""

    chains: int  # per-chain arrays: the trace (or counts), the state, the random numbers
    tables: int  # the law tables and their temporaries (Markov engine), or per-step laws
    devices: int  # how many devices share the chains; the tables are on each of them

    @property
    def total(self) -> int:
        """The bytes of the whole run, all devices together."""
        return self.chains + self.devices * self.tables

    @property
    def per_device(self) -> int:
        """The bytes of one device: its share of the chains and its copy of the tables."""
        return self.chains // self.devices + self.tables


def _probability_bytes(model) -> int:
    """Bytes of one of the model's probabilities (its declared ``dtype``)."""
    return jnp.dtype(as_model(model).dtype).itemsize


def run_bytes(run: Plan, num_chains: int, *, keep_tokens: bool = True) -> RunBytes:
    """Estimates the peak memory of ``num_chains`` chains of a planned run, before any work.

    Counted: what XLA allocates for the chains (the ``(C, T + 1)`` tokens, the ``(C, T)`` flags
    and the per-position outputs they are transposed from, or only counts with
    ``keep_tokens=False`` on the Markov engine) and for the laws (the Markov engine's law table,
    ``specjax.sampling.tables.table_bytes``; the per-chain laws of the other engines). Not
    counted: the models themselves (already allocated) and JAX's own footprint. Calibrated
    against ``memory_analysis()`` of the compiled runs: within a factor of 2, above it.
    """
    horizon, num_states = run.horizon, run.target.num_states
    devices = _sharding.num_shards(run.sharding)
    width = _tables.table_width(num_states)
    if isinstance(run.decoder, CallDecoder):
        tokens = num_chains * ((horizon + 1) * 4 + 3 * horizon)
        per_call = num_chains * (run.lookahead + 1) * width * 4
        tables = 2 * horizon * num_states * width * 4
        return RunBytes(2 * tokens + per_call + 64 * num_chains, tables, devices)
    if run.models == ModelKind.PROTOCOL:
        tokens = engine.trace_bytes(num_chains, horizon, num_states) + num_chains * horizon
        per_step = num_chains * (3 * width * 4 + 4 * num_states * 4)
        if run.batched_scoring:  # a call's rows: K draft and K + 1 target rows, and temporaries
            per_step += num_chains * blocks.call_words(run.lookahead, num_states) * 4
        return RunBytes(tokens + per_step, 0, devices)
    plan = table_plan(run)
    tables = _tables.table_bytes(plan, num_states, horizon, _probability_bytes(run.target))
    chains = (engine.trace_bytes if keep_tokens else engine.counts_bytes)(
        num_chains, horizon, num_states)
    return RunBytes(chains, tables, devices)


def check_fits(run: Plan, size: RunBytes, *, chains_argument: str, chains_what: str,
               chains_remedy: str) -> None:
    """Raises ``ValueError`` (``specjax._memory.check_fits``) when a run of estimated ``size``
    cannot fit (on a CPU: all devices in the host's memory; on accelerators: one device's
    share): naming ``chains_argument`` with ``chains_remedy`` when the chains' arrays are the
    larger part, the models' ``num_states`` when the law tables are. Under ``jax.distributed`` a
    host holds only its own devices' share, and an accelerator is checked on a device of this
    process."""
    device = _sharding.local_device(run.sharding)
    on_host = device.platform == "cpu"
    share = _sharding.local_share(run.sharding)
    needed = int(size.total * share) if on_host else size.per_device
    chains = int(size.chains * share) if on_host else size.chains // size.devices
    tables = needed - chains
    fmt = _memory.format_bytes
    if chains >= tables:
        _memory.check_fits(needed, argument=chains_argument, remedy=chains_remedy,
                           what=f"{chains_what}: {fmt(chains)}; laws: {fmt(tables)}",
                           device=None if on_host else device)
        return
    if isinstance(run.decoder, CallDecoder):  # no law table: the per-position laws of calls
        kinds = "per-position laws of the calls"
    elif run.models != ModelKind.MARKOV or table_plan(run).block_rows is not None:
        kinds = "law table of one position"
    else:
        kinds = "law table of all positions"
    _memory.check_fits(
        needed, argument=f"num_states = {run.target.num_states:,} (draft and target, "
                         f"T = {run.horizon:,})",
        remedy="use models with fewer tokens, or a machine (device) with more memory",
        what=f"the {kinds} and its temporaries: {fmt(tables)}; chains: {fmt(chains)}",
        device=None if on_host else device)


def replicate(run: Plan) -> Plan:
    """``run`` with its arrays on every device of its mesh (no-op without a sharding)."""
    decoder, draft, target = _sharding.put_replicated((run.decoder, run.draft, run.target),
                                                      run.sharding)
    return run._replace(decoder=decoder, draft=draft, target=target)


@functools.partial(jax.jit, static_argnames=("num_chains", "lookahead", "sharding", "tables",
                                             "with_verified"))
def _simulate_markov(key, decoder, draft, target, offset, *, num_chains, lookahead, sharding,
                     tables=None, with_verified=False):
    if tables is None:
        tables = _tables.table_plan(decoder, target.num_states, target.horizon, lookahead)
    return engine.simulate_markov(key, decoder, draft.trans, target.trans, target.init,
                                  num_chains, lookahead, tables, offset=offset,
                                  sharding=sharding, with_verified=with_verified)


def table_plan(run: Plan) -> _tables.TablePlan:
    """How the Markov engine builds a planned run's law tables (``tables.table_plan``)."""
    return _tables.table_plan(run.decoder, run.target.num_states, run.horizon, run.lookahead)


@functools.partial(jax.jit, static_argnames=("stop_tokens", "num_states"))
def _stop(trace, verified, *, stop_tokens, num_states):
    return engine.stop_trace(trace, verified, _checks.stop_mask(stop_tokens, num_states))


def run_chunk(key, run: Plan, offset, num_chains: int):
    """Chains ``offset .. offset + num_chains - 1`` of a planned run: ``(trace, verified)``,
    ``verified`` ``None`` for the token-wise Markov engine without stop tokens (its counts path
    keeps it). With stop tokens, each chain ends at the first one (``engine.stop_trace``)."""
    if isinstance(run.decoder, CallDecoder):
        out = calls.simulate_calls(key, run.decoder, run.draft, run.target, offset,
                                   num_chains=num_chains, sharding=run.sharding)
    elif run.batched_scoring:
        out = blocks.simulate_blocks(key, run.decoder, run.draft, run.target, offset,
                                     num_chains=num_chains, horizon=run.horizon,
                                     lookahead=run.lookahead, sharding=run.sharding)
    elif run.models == ModelKind.PROTOCOL:
        out = models.simulate_models(key, run.decoder, run.draft, run.target, offset,
                                     num_chains=num_chains, horizon=run.horizon,
                                     lookahead=run.lookahead, sharding=run.sharding)
    else:  # the stop needs verified; the counts path keeps its own otherwise
        out = _simulate_markov(key, run.decoder, run.draft, run.target, offset,
                               num_chains=num_chains, lookahead=run.lookahead,
                               sharding=run.sharding, tables=table_plan(run),
                               with_verified=bool(run.stop_tokens))
        out = out if run.stop_tokens else (out, None)
    if not run.stop_tokens:
        return out
    return _stop(*out, stop_tokens=run.stop_tokens, num_states=run.target.num_states)


def decode(key, decoder, draft, target, num_chains: int, *, horizon: int | None = None,
           sharding=None, stop_tokens=None, batched_scoring: bool = False) -> DecodingTrace:
    """Samples ``num_chains`` sequences with ``decoder``: the Monte Carlo entry point.

    Args:
      key: a JAX PRNG key (``jax.random.key(seed)``).
      decoder: any decoder value, e.g. ``specjax.Speculative()``, ``specjax.BatchSpeculative(4)``,
        ``specjax.BlockVerification(3)``, or your own (``docs/guides/new-decoder.md``).
      draft: the draft model ``p`` (``None`` for ``Autoregressive()``).
      target: the target model ``q``; unbiased decoders output exactly its law.
      num_chains: ``C``, the number of independent chains (a static Python int).
      horizon: ``T``; required for models other than ``MarkovChain`` (which carries its own).
      sharding: ``None`` (the default device), a ``jax.sharding.Mesh`` or a ``NamedSharding`` of
        the chain axis (``specjax.chain_sharding()``); ``num_chains`` must be a multiple of the
        number of shards. The tokens equal an unsharded run's with the same key. Under
        ``jax.distributed`` the mesh may span processes: every process makes the same call and
        holds its devices' chains of the global result (``specjax.sampling.sharding``).
      stop_tokens: ``None``, or end-of-sequence ids (an int or a sequence; static): a chain ends
        at its first stop token among ``x_1..x_T`` (the prompt ``x_0`` never ends it), as
        HuggingFace's and keras-hub's generation loops stop. The tokens after it repeat it,
        and nothing after it is rejected or called; ``num_emitted`` says where each chain
        ended. The tokens up to the stop equal a run without stop tokens with the same key:
        the engines run every chain to the horizon and cut it, so a model's rows after a stop
        token must be laws too (they are checked, and their tokens dropped).
      batched_scoring: ``True`` runs protocol models call by call, as serving engines do: the
        draft proposes ``K`` tokens, the target scores them in one evaluation
        (``probs_block(state, tokens) -> (K + 1, V)`` when the model defines it, else a scan of
        ``probs`` and ``update``), and the given-drafts kernel (``specjax.verify_drafts``)
        verifies them. Same output law, other tokens for the same key. For decoders that verify
        one given draft per position (``Speculative``, ``BiasedSpeculative``, a
        ``RejectionRule``, the lossy rules); static. Every call drafts and scores ``K`` tokens
        whatever is left of the horizon, so give a small ``K``: with ``Speculative()``
        (``K = T``) every call costs ``O(T)`` steps.

    Returns:
      ``DecodingTrace``: ``tokens (C, T + 1)``, ``rejected (C, T)``, ``num_rejections (C,)``
      (the paper's ``N_rej``), ``num_calls (C,)``, ``new_call (C, T)``, ``num_emitted (C,)``.

    Raises:
      ValueError: a bad key, decoder, models or setting, a decoder that does not support the
        models' kind, or a run whose estimated memory (the trace and the law tables, see
        ``run_bytes``) exceeds what the machine or device has available; raised before any
        work. Under a caller's own ``jax.jit`` the checks on probability values are skipped
        (shape, setting and size checks still run).

    Example:
      >>> import jax, specjax
      >>> draft, target = specjax.paper_instance()
      >>> trace = specjax.decode(jax.random.key(0), specjax.BatchSpeculative(4), draft, target,
      ...                        1000)
      >>> trace.tokens.shape, bool(trace.num_rejections.mean() < 21)
      ((1000, 51), True)
    """
    run = plan(key, decoder, draft, target, num_chains, horizon=horizon, sharding=sharding,
               stop_tokens=stop_tokens, batched_scoring=batched_scoring)
    check_fits(run, run_bytes(run, num_chains), chains_argument=f"num_chains = {num_chains:,}",
               chains_what=f"tokens and flags of every chain, T = {run.horizon:,}",
               chains_remedy="use specjax.decoding_statistics (counts only, chunked) or fewer "
                             "chains")
    # offset as decoding_statistics passes it (np.uint32; every engine reads it as uint32), so
    # that a chunk of its chains reuses this run's compiled program (a Python 0 is a weakly
    # typed int32 and compiled a second program for the same run)
    return run_chunk(key, replicate(run), np.uint32(0), num_chains)[0]
