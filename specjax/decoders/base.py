"""The decoder protocol: what a decoder must provide so that every entry point can run it.

A decoder is a small immutable value (a frozen dataclass registered as a JAX pytree by
``decoder_dataclass``): its static settings (lookahead, number of drafts, a residual's name, a
user's functions) are the pytree's metadata, so ``jit`` specialises on them, and its numeric
parameters (biased SD's ``epsilon``) are leaves, so they can be traced and differentiated.
``specjax.decode``, ``specjax.exact``, ``specjax.decoding_statistics``,
``specjax.accepted_length`` and the tuning objectives are written once against this protocol;
adding a decoder never edits them.

There are two kinds of decoder.

**Token-wise** (``TokenwiseDecoder``): every token is the outcome of one verification step whose
law depends on the draft row ``p`` and the target row ``q`` of the current context, and on the
*phase* of the call (its root, a later draft inside it, or the bonus token after ``K`` accepted
drafts). A token-wise decoder provides

* ``laws(p, q) -> (root, verify)``: two ``VerificationLaw``s over ``(..., V)`` rows, the joint law
  of (token, rejected?) at the root of a call and at every later draft of the call (the bonus
  law is always the target's row);
* ``lookahead``: ``None`` (the paper's ``K = T``) or ``K``; ``resolve_lookahead(T)`` gives the
  static ``K`` the engines use (0 for autoregressive decoding: every token a bonus);
* optionally ``check(num_states, num_rows)`` (refuse a setting too large for the models),
  ``same_root`` (root law equals the in-call law: the exact recursion needs one phase fewer) and
  ``root_scale(p, q)`` (for unbiased rules whose rejected mass is ``[q - S p]_+``: a faster exact
  recursion);
* optionally, for a law that depends on the position and on the whole models (a policy solved
  by backward induction: ``OptimalMultiDraft(sequence_optimal=True)``), ``bind(p, q)`` on the
  Markov transitions ``(T, V, V)`` returning the decoder to run, and ``laws_at(n, p, q)`` with the
  positions ``n`` (``0..T-1``, broadcasting against the rows' leading axes) of the rows. The
  engines call ``decoder.bind(...)`` once per run (per chunk in ``decoding_statistics``) and
  ``laws_at`` wherever they call ``laws``;
  the defaults are ``self`` and ``laws(p, q)``.

Speculative decoding, batch SD with and without replacement, biased SD and any user rule of the
paper's Algorithm 2 are token-wise. The Monte Carlo engine draws each chain's (token, rejected)
from these laws, the exact recursion sums the same masses, so the two cannot disagree.

**Call-level** (``CallDecoder``): a target call drafts a block (or a tree) and verifies it
jointly; its outcome is a run of kept drafts and one last token. A call-level decoder provides

* ``lookahead``: ``K``, the most drafts a call keeps (a call emits at most ``K + 1`` tokens);
* ``num_uniforms``: how many 31-bit uniforms one call of one chain consumes;
* ``prepare(draft, target)``: per-run tables (e.g. the draft's thresholds), built once;
* ``sample_call(tables, n, prev, u) -> (tokens (K + 1,), num_kept, last_rejected)``: one call
  from position ``n`` after token ``prev``; the call emits ``tokens[:num_kept + 1]``;
* ``call_law(p_rows, q_rows, bonus_row, with_bonus) -> CallLaw``: the exact law of a call's
  outcome for every previous token (``p_rows``, ``q_rows``: ``(K', V, V)``, the rows of the
  positions the call may fill; ``bonus_row``: the target row after them), used by the exact
  forward recursion over call starts;
* optionally ``call_law_from(start, p_rows, q_rows, bonus_row, with_bonus)``: the same law for
  a previous token of (un-normalised) law ``start`` (``(V,)``; fields ``(K', V)``), which the
  exact recursion calls once per position. The default contracts ``call_law``; a decoder that
  can push ``start`` through its call directly (a token tree: ``O(nodes V^2)`` instead of
  ``O(classes V^3)``) overrides it;
* optionally ``call_work(depth) -> (draft passes, tokens scored)``, what a call that drafts
  ``depth`` levels costs under ``specjax.CostModel`` (default: one chain, ``depth`` and
  ``depth + 1``);
* optionally ``check(num_states, num_rows)`` and ``check_exact(num_states, horizon)``.

Block verification is call-level; token trees and optimal multi-draft verification fit the same
protocol. ``docs/guides/new-decoder.md`` builds a decoder from scratch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax import _checks
from specjax.models.checks import model_kind

from specjax._pytree import array_field  # noqa: E402,F401 - re-exported for decoder authors
from specjax._pytree import pytree_dataclass  # noqa: E402

decoder_dataclass = pytree_dataclass

_HIGHEST = jax.lax.Precision.HIGHEST


def matmul_highest(a, b):
    """``a @ b`` at full precision (no TF32/bfloat16 passes on accelerators), for the exact laws
    that push a reach vector or matrix through ``(V, V)`` rows."""
    return jnp.matmul(a, b, precision=_HIGHEST)

# ---------------------------------------------------------------------------------------------
# The two protocols.


class Decoder:
    """Base class of every decoder (see the module docstring for the protocol)."""

    #: ``"tokenwise"`` or ``"call"``: which engines run the decoder.
    kind: ClassVar[str] = ""
    #: Model kinds the decoder supports beyond ``MarkovChain`` (which every decoder supports):
    #: ``"finite_state"`` (exact values on ``FiniteStateModel``s) and ``"protocol"`` (Monte Carlo
    #: on any autoregressive model of the protocol).
    model_kinds: ClassVar[tuple] = ()

    def check(self, num_states: int, num_rows: int) -> None:
        """Raise ``ValueError`` when the decoder cannot run on ``V = num_states`` tokens with
        ``num_rows`` rows evaluated at once (e.g. an enumeration that would not fit)."""
        del num_states, num_rows

    def probe(self, draft, target, kind: str) -> None:
        """Raise ``ValueError`` when the decoder's own functions misbehave on the models' rows
        (a user's rule: ``RejectionRule``). Called before any work, with concrete models of
        ``kind`` (``"markov"``, ``"finite_state"`` or ``"protocol"``)."""
        del draft, target, kind

    @property
    def label(self) -> str:
        """A short name for tables."""
        return repr(self)


class TokenwiseDecoder(Decoder):
    """A decoder whose every token is one verification step: provide ``laws`` and
    ``lookahead``."""

    kind: ClassVar[str] = "tokenwise"
    model_kinds: ClassVar[tuple] = ("finite_state", "protocol")
    #: Whether the root law equals the in-call law (everything but multi-draft roots).
    same_root: ClassVar[bool] = True
    #: Whether ``root_scale`` is available (rejected mass ``[q - S p]_+``, accepted ``q`` minus it).
    has_root_scale: ClassVar[bool] = False

    def laws(self, p, q):
        """``(root, verify)`` ``VerificationLaw``s for draft rows ``p`` and target rows ``q``."""
        raise NotImplementedError

    def root_scale(self, p, q):
        """The root's ``S`` as ``(..., 1)`` when ``has_root_scale``."""
        raise NotImplementedError

    def bind(self, p, q):
        """The decoder to run on Markov transitions ``p``, ``q`` ``(T, V, V)`` (traced): ``self``
        unless its laws depend on the whole models (see the module docstring)."""
        del p, q
        return self

    def laws_at(self, n, p, q):
        """``laws(p, q)`` for rows at positions ``n`` (``0..T-1``, broadcasting against the rows'
        leading axes; position ``n`` draws token ``x_{n+1}``)."""
        del n
        return self.laws(p, q)

    def resolve_lookahead(self, horizon: int) -> int:
        """The static ``K`` the engines use: ``None`` means ``T``, larger values act as ``T``
        (one compilation for all of them)."""
        lookahead = getattr(self, "lookahead", None)
        return horizon if lookahead is None else min(lookahead, horizon)

    def call_work(self, depth: int) -> tuple[int, int]:
        """``(draft passes, tokens the target scores)`` of a call that drafts ``depth`` tokens
        per sequence (``min(K, T - n + 1)`` at position ``n``), for ``specjax.CostModel``:
        ``depth`` passes and ``M depth + 1`` tokens (the root and ``M`` drafted sequences; a
        decoder with a ``num_drafts`` field drafts that many, the others one)."""
        num_drafts = getattr(self, "num_drafts", 1)
        if num_drafts == math.inf:
            raise ValueError(f"{type(self).__name__} with num_drafts=math.inf drafts infinitely "
                             "many sequences per call: its calls have no finite cost")
        return depth, int(num_drafts) * depth + 1


class CallLaw(NamedTuple):
    """The exact law of one call of a call-level decoder, for every previous token ``a``.

    A call from position ``n`` keeps ``i`` drafts (``x_n .. x_{n+i-1}``) and emits one last token
    at ``n + i``, drawn after a rejection or as the target's bonus token.

    Attributes:
      kept: ``[i, a, x]`` = P(the call keeps at least ``i + 1`` drafts and draft ``i + 1`` is x).
      rejected: ``[i, a, y]`` = P(the call keeps exactly ``i`` drafts, then ``y`` after a
        rejection).
      bonus: ``[i, a, y]`` = P(the call keeps exactly ``i`` drafts, then ``y`` as a bonus token).
        The rows of ``bonus`` at ``i = K'`` may sum to less than ``P(keep all)`` when the call
        reaches the end of the horizon: the sequence then ends.
    """

    kept: jax.Array  # shape=(K', V, V)
    rejected: jax.Array  # shape=(K' + 1, V, V)
    bonus: jax.Array  # shape=(K' + 1, V, V)


class CallDecoder(Decoder):
    """A decoder that verifies a whole drafted block per call: see the module docstring.

    Two optional hooks, for decoders whose call depends on more than the previous token:

    * ``uses_position = True``: ``call_law`` and ``call_law_from`` also receive the call's
      1-based start ``position=n`` (a keyword; an int, traced inside the exact recursion's scan;
      e.g. a stopping policy whose thresholds depend on the position,
      ``specjax.AdaptiveSpeculative``).
    * ``drafted_call_law_from(start, p_rows, q_rows, bonus_row, *, with_bonus, position)``: for
      a decoder whose number of drafts is random, ``(call_law_from(...), drafted)`` from one
      pass over the call, ``drafted`` ``(K' + 1,)`` the mass of calls from previous-token law
      ``start`` that draft exactly ``d`` tokens. ``specjax.decoding_time`` and
      ``specjax.engine_metrics`` then price and count the drafts from it instead of
      ``call_work``'s fixed depth.
    * ``num_call_states > 1``: a call depends on a *call state* carried from one call to the
      next (HuggingFace's draft-length schedule, ``specjax.HeuristicSchedule``). The decoder
      gives ``initial_call_state``, ``next_call_state(state, kept)`` (ints or arrays: the state
      after a call that kept ``kept`` drafts), and takes ``state=`` as a keyword in
      ``sample_call``, ``call_law``, ``call_law_from`` and ``drafted_call_law_from`` (an int32
      scalar, traced: the exact recursion vectorises the law over the states, one compilation,
      and carries the mass of call starts per state and previous token).
    """

    kind: ClassVar[str] = "call"
    model_kinds: ClassVar[tuple] = ()
    uses_position: ClassVar[bool] = False
    num_call_states: ClassVar[int] = 1
    initial_call_state: ClassVar[int] = 0

    def next_call_state(self, state, kept):
        """The call state after a call that kept ``kept`` drafts (stateless: unchanged)."""
        del kept
        return state

    @property
    def num_uniforms(self) -> int:
        raise NotImplementedError

    def prepare(self, draft, target):
        """Per-run tables for ``sample_call`` (computed once per run, under ``jit``)."""
        return (draft.trans, target.trans)

    def sample_call(self, tables, n, prev, u):
        raise NotImplementedError

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        raise NotImplementedError

    def call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        """``call_law`` for a previous token of (un-normalised) law ``start`` (``(V,)``):
        each field summed over ``a`` with weights ``start[a]``, shapes ``(K', V)`` and
        ``(K' + 1, V)``. Override it where pushing ``start`` through the call is cheaper."""
        law = self.call_law(p_rows, q_rows, bonus_row, with_bonus=with_bonus)
        return CallLaw(*(jnp.einsum("a,iay->iy", start, x, precision=_HIGHEST) for x in law))

    def call_work(self, depth: int) -> tuple[int, int]:
        """``(draft passes, tokens the target scores)`` of a call that drafts at most ``depth``
        levels (``min(K, T - n + 1)`` at position ``n``), for ``specjax.CostModel``. The
        default is one chain: ``depth`` passes, ``depth + 1`` tokens (the root and the
        drafts)."""
        return depth, depth + 1

    def check_exact(self, num_states: int, horizon: int) -> None:
        """Raise ``ValueError`` when the exact call law cannot be built for ``V`` tokens and
        horizon ``T`` (e.g. an enumeration that would not fit)."""
        del num_states, horizon

    def resolve_lookahead(self, horizon: int) -> int:
        return min(self.lookahead, horizon)

    def truncate(self, lookahead: int) -> "CallDecoder":
        """The decoder the sampler runs when at most ``lookahead`` (``<= K``) drafts fit in the
        horizon: by default the same decoder with that ``lookahead`` field. A decoder whose
        ``sample_call`` already stops at the horizon (a token tree) returns itself."""
        if lookahead == self.lookahead:
            return self
        return dataclasses.replace(self, lookahead=lookahead)


def check_decoder(decoder) -> None:
    """Raise ``ValueError`` unless ``decoder`` is a decoder value."""
    if not isinstance(decoder, (TokenwiseDecoder, CallDecoder)):
        raise ValueError(
            "decoder must be a specjax decoder such as specjax.Speculative() or "
            "specjax.BatchSpeculative(4) (a TokenwiseDecoder or CallDecoder), got "
            f"{decoder!r}")


def resolve_run(decoder, draft, target):
    """What every entry point checks first: the decoder (and its numeric settings when
    concrete), then the models and their kind. ``draft`` may be ``None`` for a decoder that does
    not use it (``Autoregressive``). Returns ``(draft, kind)``; ``check_horizon(kind, target,
    horizon)`` gives ``T``."""
    check_decoder(decoder)
    if hasattr(decoder, "validate"):
        decoder.validate()
    if draft is None and not getattr(decoder, "uses_draft", True):
        draft = target
    kind = model_kind(draft, target)
    if all(_checks.is_concrete(leaf) for leaf in jax.tree_util.tree_leaves((draft, target))):
        decoder.probe(draft, target, kind)
    return draft, kind


def check_lookahead(lookahead, *, allow_none: bool = True) -> None:
    """``lookahead`` is a static positive int (or ``None``): refuse a traced or array value with
    a hint, as for every static setting."""
    _checks.check_static_int("lookahead", lookahead, allow_none=allow_none)
