"""The decoder protocol: what a decoder must provide so that every entry point can run it.

A decoder is a small immutable value (a frozen dataclass registered as a JAX pytree by
``decoder_dataclass``): its static settings (lookahead, number of drafts, a residual's name, a
user's functions) are the pytree's metadata, so ``jit`` specialises on them, and its numeric
parameters (biased SD's ``epsilon``) are leaves, so they can be traced and differentiated.
``specjax.decode``, ``specjax.exact``, ``specjax.decoding_statistics``,
``specjax.accepted_length`` and the tuning objectives are written once against this protocol;
adding a decoder never edits them.

Every member of the protocol is declared on the base classes below with its default, and the
entry points read the members, never probe for them: a capability is a class-level flag
(``same_root``, ``has_root_scale``, ``uses_draft``, ...), a hook a method whose default is the
behaviour of a decoder without it. ``PROTOCOL`` lists the members of each base class.

**Every decoder** (``Decoder``) provides or inherits

* ``model_kinds``: the model kinds it supports beyond ``MarkovChain`` (``"finite_state"``:
  exact values on ``FiniteStateModel``s; ``"protocol"``: Monte Carlo on any autoregressive model);
* ``uses_draft`` (default ``True``): ``False`` for a decoder that never reads the draft
  (``Autoregressive``: the draft may be ``None``);
* ``lossless`` (default ``True``): ``False`` for a rule whose output is not the target's (biased,
  lenient, top-k and typical acceptance): estimates from target rollouts refuse it; ``None`` when
  only the rows can tell (a ``RejectionRule``);
* ``varies_lookahead`` (default ``False``; ``True`` for every token-wise decoder, block
  verification and parallel drafters) and ``with_lookahead(K)``: the same decoder with another
  ``lookahead`` (what ``best_lookahead`` sweeps and a recording's rates are keyed by);
* ``recording_reads``: what an estimate from target rollouts needs of the decoder (``"emitted"``,
  ``"rows"``, ``"path_rows"``, ``"nothing"``, or ``"off_path"``: refused);
* ``verifies_jointly`` (default ``False``) and ``given_tree()`` (default ``None``): what the
  given-drafts kernels verify (a block jointly; the tree of ``specjax.verify_tree``), and
  ``over_acceptance`` (default 0): biased SD's ``eps``, for the tuning objectives;
* ``validate()`` (default: nothing): refuse invalid numeric settings (values only when concrete),
  before any work;
* ``check(num_states, num_rows)`` (default: nothing): refuse a setting too large for the models;
* ``probe(draft, target, kind)`` (default: nothing): refuse the decoder's own functions when they
  misbehave on the models' rows (a user's rule: ``RejectionRule``);
* ``label``: a short name for tables; ``example_cases()`` (default ``{}``: not registered): its
  representative settings by name, run by the tests and tabled in the docs (``registry``).

There are two kinds of decoder; the entry points dispatch on the two classes.

**Token-wise** (``TokenwiseDecoder``): every token is the outcome of one verification step whose
law depends on the draft row ``p`` and the target row ``q`` of the current context, and on the
*phase* of the call (its root, a later draft inside it, or the bonus token after ``K`` accepted
drafts). A token-wise decoder provides

* ``laws(p, q) -> (root, verify)``: two ``VerificationLaw``s over ``(..., V)`` rows, the joint law
  of (token, rejected?) at the root of a call and at every later draft of the call (the bonus
  law is always the target's row);
* ``lookahead`` (default ``None``): ``None`` (the paper's ``K = T``) or ``K``;
  ``resolve_lookahead(T)`` gives the static ``K`` the engines use (0 for autoregressive decoding:
  every token a bonus);
* ``num_drafts`` (default 1): the sequences drafted per call (``call_work``'s cost; a decoder
  with more than one is refused by the given-drafts kernel);
* optionally ``same_root`` (default ``True``: the root law equals the in-call law, the exact
  recursion needs one phase fewer) and ``has_root_scale`` with ``root_scale(p, q)`` (for unbiased
  rules whose rejected mass is ``[q - S p]_+``: a faster exact recursion);
* optionally ``acceptance(p, q)``: the acceptance probabilities ``b`` of Algorithm 2 (for the
  ``"tradeoff"`` objective and, with ``reads_draft_probs = False``, the given-drafts test
  ``u < b(x)`` of a rule that ignores the draft's probabilities); ``has_acceptance`` says whether
  the decoder gives it (a subclass that defines ``acceptance`` has it);
* optionally ``residual_given_draft(p, q, x)``: the masses a token is drawn from after draft
  ``x`` is rejected, for a rule whose residual depends on the rejected draft (SGLang's threshold
  verification; the given-drafts kernel); ``has_residual_given_draft`` says whether the decoder
  gives it (a subclass that defines it has it);
* optionally, for a law that depends on the position and on the whole models (a policy solved
  by backward induction: ``OptimalMultiDraft(sequence_optimal=True)``; then
  ``binds_models = True``), ``bind(p, q)`` on the Markov transitions ``(T, V, V)`` returning the
  decoder to run, and ``laws_at(n, p, q)`` with the positions ``n`` (``0..T-1``, broadcasting
  against the rows' leading axes) of the rows. The engines call ``decoder.bind(...)`` once per
  run (per chunk in ``decoding_statistics``) and ``laws_at`` wherever they call ``laws``;
  the defaults are ``self`` and ``laws(p, q)``;
* ``call_work(depth)``: what a call that drafts ``depth`` tokens costs under
  ``specjax.CostModel`` (default: ``depth`` passes, ``num_drafts * depth + 1`` tokens scored).

Speculative decoding, batch SD with and without replacement, biased SD and any user rule of the
paper's Algorithm 2 are token-wise. The Monte Carlo engine draws each chain's (token, rejected)
from these laws, the exact recursion sums the same masses, so the two cannot disagree.

**Call-level** (``CallDecoder``): a target call drafts a block (or a tree) and verifies it
jointly; its outcome is a run of kept drafts and one last token. A call-level decoder provides

* ``lookahead``: ``K``, the most drafts a call keeps (a call emits at most ``K + 1`` tokens; no
  default); ``truncate(K')`` the decoder the sampler runs when at most ``K'`` drafts fit;
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
* optionally ``uses_position``, ``drafted_call_law_from`` (with ``has_drafted_call_law``) and
  call states (``num_call_states``, ``initial_call_state``, ``next_call_state``): see
  ``CallDecoder``;
* optionally ``call_work(depth) -> (draft passes, tokens scored)``, what a call that drafts
  ``depth`` levels costs under ``specjax.CostModel`` (default: one chain, ``depth`` and
  ``depth + 1``);
* optionally ``check_exact(num_states, horizon)`` (default: nothing): refuse an exact law that
  cannot be built for ``V`` tokens and horizon ``T``;
* optionally ``stationary_form()`` (default: itself): the decoder as the long run on a
  stationary chain reads it (a ``ThresholdTable`` policy: its one row, refused unless every
  row is the same).
* optionally ``depth_plan(T) -> DepthPlan`` (with ``has_depth_plan``): a decoder whose every
  choice is read on the emitted path (adaptive lengths, the schedule) is estimated from target
  rollouts by the call-depth filter (``specjax.pairs.adaptive``).

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

from specjax._pytree import array_field  # noqa: F401 - re-exported for decoder authors
from specjax._pytree import pytree_dataclass
from specjax.decoders.members import CallLaw  # noqa: F401 - served from here
from specjax.decoders.members import DepthPlan  # noqa: F401 - served from here
from specjax.decoders.members import FieldDefault
from specjax.decoders.members import check_lookahead  # noqa: F401 - served from here
from specjax.decoders.members import flag_defined_hooks
from specjax.numerics import HIGHEST

__all__ = [
    "CallDecoder",
    "CallLaw",
    "Decoder",
    "FieldDefault",
    "PROTOCOL",
    "TokenwiseDecoder",
    "check_decoder",
    "check_lookahead",
    "decoder_dataclass",
]

decoder_dataclass = pytree_dataclass


# ---------------------------------------------------------------------------------------------
# The two protocols.


class Decoder:
    """Base class of every decoder (see the module docstring for the protocol)."""

    #: Model kinds the decoder supports beyond ``MarkovChain`` (which every decoder supports):
    #: ``"finite_state"`` (exact values on ``FiniteStateModel``s) and ``"protocol"`` (Monte Carlo
    #: on any autoregressive model of the protocol).
    model_kinds: ClassVar[tuple] = ()
    #: Whether the decoder reads the draft (``Autoregressive`` does not: its draft may be
    #: ``None``).
    uses_draft: ClassVar[bool] = True
    #: Whether the output law is the target's (``False``: a lossy rule, refused by estimates
    #: from target rollouts, whose law is not the decoder's output law; ``None``: not known
    #: before the rows are seen, as for a ``RejectionRule``'s functions, whose laws an estimate
    #: checks on the recorded rows).
    lossless: ClassVar[bool | None] = True
    #: Whether ``with_lookahead`` gives the decoder with another ``lookahead`` field.
    varies_lookahead: ClassVar[bool] = False
    #: What an estimate from a recording of target rollouts reads for this decoder:
    #: ``"emitted"`` (the emitted tokens' probabilities ``p_t(x_t)``, ``q_t(x_t)`` alone: SD),
    #: ``"rows"`` (a token-wise rule's rates from the full rows along the path, kept or
    #: recorded: the default of token-wise decoders), ``"path_rows"`` (a call-level decoder
    #: whose calls read only rows along the emitted path: static token trees, adaptive draft
    #: lengths and the schedule, whose choices are read on the path), ``"nothing"``
    #: (autoregressive decoding) or ``"off_path"`` (the default of call-level decoders: rows off
    #: the path, such as a block's rejected drafts' contexts; refused by estimates).
    recording_reads: ClassVar[str] = "off_path"
    #: Whether given drafts are verified jointly, as one block (``block.block_levels``'s
    #: backward pass: ``BlockVerification``), not one position at a time by ``laws``.
    verifies_jointly: ClassVar[bool] = False

    @property
    def over_acceptance(self):
        """The ``eps`` of an over-acceptance ``b = min(1, (q + eps) / p)`` (biased SD's
        ``epsilon``, a leaf); 0 for a decoder that does not over-accept."""
        return 0.0

    def given_tree(self):
        """The ``TokenTree`` its call verifies, for ``specjax.verify_tree`` (a token tree: itself;
        batch SD with finite ``M``, ``K``: ``(M, 1, ..., 1)``); ``None``: no given-tree form."""
        return None

    def with_lookahead(self, lookahead) -> "Decoder":
        """The same decoder with ``lookahead`` (``None``: draft to the horizon) when
        ``varies_lookahead``; ``ValueError`` naming the decoder otherwise."""
        if not self.varies_lookahead:
            raise ValueError(f"decoder: {type(self).__name__} has no lookahead to vary (its "
                             f"draft length is set by its own settings)")
        if lookahead == self.lookahead:
            return self
        return dataclasses.replace(self, lookahead=lookahead)

    def validate(self) -> None:
        """Raise ``ValueError`` when a numeric setting is invalid (its values checked only when
        concrete). Called by every entry point before any work."""

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

    @classmethod
    def example_cases(cls) -> dict:
        """Representative settings by case name (``specjax.decoders.registry``); ``{}``: none."""
        return {}


class TokenwiseDecoder(Decoder):
    """A decoder whose every token is one verification step: provide ``laws`` and
    ``lookahead``."""

    model_kinds: ClassVar[tuple] = ("finite_state", "protocol")
    varies_lookahead: ClassVar[bool] = True
    recording_reads: ClassVar[str] = "rows"
    #: ``None`` (``K = T``) or ``K``; a decoder declares it as a dataclass field.
    lookahead = FieldDefault(None)
    #: The sequences drafted per call (a multi-draft decoder's ``num_drafts`` field).
    num_drafts = FieldDefault(1)
    #: Whether the root law equals the in-call law (everything but multi-draft roots).
    same_root: ClassVar[bool] = True
    #: Whether ``root_scale`` is available (rejected mass ``[q - S p]_+``, accepted ``q`` minus it).
    has_root_scale: ClassVar[bool] = False
    #: Whether ``acceptance`` is available (set for a subclass that defines it).
    has_acceptance: ClassVar[bool] = False
    #: Whether the acceptance test reads the draft's probabilities: ``False`` for a rule whose
    #: test is ``u < b(x)`` (typical acceptance, SGLang's thresholds; needs ``acceptance``).
    reads_draft_probs: ClassVar[bool] = True
    #: Whether ``residual_given_draft`` is available (set for a subclass that defines it).
    has_residual_given_draft: ClassVar[bool] = False
    #: Whether the laws depend on the whole models (``bind`` returns another decoder and
    #: ``laws_at`` reads the position): such a decoder has no law of its rows alone.
    binds_models: ClassVar[bool] = False

    #: Whether ``probe`` evaluates the laws on probe rows before any work: ``True`` for a
    #: decoder whose laws are new (a class that defines ``laws``, ``acceptance`` or
    #: ``lossless``, a ``RejectionRule``'s functions); ``False`` for specjax's own, which the
    #: conformance suite checks against independent implementations.
    probes_laws: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        flag_defined_hooks(cls, {
            "acceptance": "has_acceptance",
            "residual_given_draft": "has_residual_given_draft"})
        if "probes_laws" not in cls.__dict__ and any(
                hook in cls.__dict__ for hook in ("laws", "acceptance", "root_scale", "lossless")):
            cls.probes_laws = True  # new laws (a user's subclass of a library decoder too)

    def probe(self, draft, target, kind: str) -> None:
        """The laws evaluated on probe rows of the models' ``V`` before any work when
        ``probes_laws`` (``specjax.decoders.probe.probe_laws``): one clear error for a decoder
        whose laws are not laws (or not lossless when declared so), from every entry point."""
        del draft, kind
        if not self.probes_laws:
            return
        from specjax.decoders.probe import probe_laws, rows_dtype  # noqa: PLC0415

        probe_laws(self, target.num_states, rows_dtype(target))

    def laws(self, p, q):
        """``(root, verify)`` ``VerificationLaw``s for draft rows ``p`` and target rows ``q``."""
        raise NotImplementedError

    def root_scale(self, p, q):
        """The root's ``S`` as ``(..., 1)`` when ``has_root_scale``."""
        raise NotImplementedError

    def acceptance(self, p, q):
        """The acceptance probabilities ``b`` ``(..., V)`` when ``has_acceptance``."""
        raise NotImplementedError(f"{type(self).__name__} has no acceptance probabilities")

    def residual_given_draft(self, p, q, x):
        """The masses ``(..., V)`` the token is drawn from after the drafted ``x`` is rejected,
        when ``has_residual_given_draft`` (otherwise the rejected mass of ``laws``)."""
        raise NotImplementedError(f"{type(self).__name__} has no residual_given_draft")

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
        return horizon if self.lookahead is None else min(self.lookahead, horizon)

    def call_work(self, depth: int) -> tuple[int, int]:
        """``(draft passes, tokens the target scores)`` of a call that drafts ``depth`` tokens
        per sequence (``min(K, T - n + 1)`` at position ``n``), for ``specjax.CostModel``:
        ``depth`` passes and ``M depth + 1`` tokens (the root and ``M = num_drafts`` drafted
        sequences)."""
        if self.num_drafts == math.inf:
            raise ValueError(f"{type(self).__name__} with num_drafts=math.inf drafts infinitely "
                             "many sequences per call: its calls have no finite cost")
        return depth, int(self.num_drafts) * depth + 1


class CallDecoder(Decoder):
    """A decoder that verifies a whole drafted block per call: see the module docstring.

    Optional hooks, for decoders whose call depends on more than the previous token:

    * ``uses_position = True``: ``call_law`` and ``call_law_from`` also receive the call's
      1-based start ``position=n`` (a keyword; an int, traced inside the exact recursion's scan;
      e.g. a stopping policy whose thresholds depend on the position,
      ``specjax.AdaptiveSpeculative``).
    * ``has_drafted_call_law = True`` with ``drafted_call_law_from(start, p_rows, q_rows,
      bonus_row, *, with_bonus, position)``: for a decoder whose number of drafts is random,
      ``(call_law_from(...), drafted)`` from one pass over the call, ``drafted`` ``(K' + 1,)``
      the mass of calls from previous-token law ``start`` that draft exactly ``d`` tokens.
      ``specjax.theory.decoding_time`` and ``specjax.theory.engine_metrics`` then price and count
      the drafts from it instead of ``call_work``'s fixed depth. (A subclass that defines
      ``drafted_call_law_from`` has it.)
    * ``num_call_states > 1``: a call depends on a *call state* carried from one call to the
      next (HuggingFace's draft-length schedule, ``specjax.HeuristicSchedule``). The decoder
      gives ``initial_call_state``, ``next_call_state(state, kept)`` (ints or arrays: the state
      after a call that kept ``kept`` drafts), and takes ``state=`` as a keyword in
      ``sample_call``, ``call_law``, ``call_law_from`` and ``drafted_call_law_from`` (an int32
      scalar, traced: the exact recursion vectorises the law over the states, one compilation,
      and carries the mass of call starts per state and previous token).
    * ``has_walk = True`` with ``walk_uniforms``, ``walk_start()``, ``walk_tables(draft, target,
      row)`` and ``walk_step(tables, prev, state, u)``: a call that is a walk down a tree, one
      node per position (a token tree). The Monte Carlo engine then advances every chain one
      position per step instead of one call (``specjax.sampling.calls``): ``walk_tables`` are
      the laws of 0-based position ``row`` (traced) built once for all chains, ``walk_start()``
      the state of a chain at the root of a call (a pytree of arrays), and ``walk_step`` draws
      one position of one chain from ``walk_uniforms`` 31-bit uniforms ``u``: ``(token, state,
      rejected, new_call, bonus)``, ``new_call`` whether the position opens a call (the chain
      was at a root), ``bonus`` whether the token is the target's at a leaf. (A subclass that
      defines ``walk_step`` has it.)
    """

    model_kinds: ClassVar[tuple] = ()
    #: ``K``, the most drafts of a call: a field or property of every call-level decoder.
    lookahead: int
    uses_position: ClassVar[bool] = False
    #: Whether ``drafted_call_law_from`` is available (set for a subclass that defines it).
    has_drafted_call_law: ClassVar[bool] = False
    num_call_states: ClassVar[int] = 1
    initial_call_state: ClassVar[int] = 0
    #: Whether the sampler walks a call one position at a time (set for a subclass that defines
    #: ``walk_step``).
    has_walk: ClassVar[bool] = False
    #: 31-bit uniforms one position of one chain consumes when ``has_walk``.
    walk_uniforms: ClassVar[int] = 0
    #: Whether ``depth_plan`` is available (set for a subclass that defines it).
    has_depth_plan: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        flag_defined_hooks(cls, {"drafted_call_law_from": "has_drafted_call_law",
                                  "walk_step": "has_walk", "depth_plan": "has_depth_plan"})

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

    def walk_start(self):
        """The walk state of a chain at the root of a call, when ``has_walk``."""
        raise NotImplementedError(f"{type(self).__name__} samples whole calls: it has no walk")

    def walk_tables(self, draft, target, row):
        """The laws every chain's walk reads at 0-based position ``row``, when ``has_walk``."""
        raise NotImplementedError(f"{type(self).__name__} samples whole calls: it has no walk")

    def walk_step(self, tables, prev, state, u):
        """One position of one chain's walk: ``(token, state, rejected, new_call, bonus)``."""
        raise NotImplementedError(f"{type(self).__name__} samples whole calls: it has no walk")

    def call_law(self, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        raise NotImplementedError

    def call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool) -> CallLaw:
        """``call_law`` for a previous token of (un-normalised) law ``start`` (``(V,)``):
        each field summed over ``a`` with weights ``start[a]``, shapes ``(K', V)`` and
        ``(K' + 1, V)``. Override it where pushing ``start`` through the call is cheaper."""
        law = self.call_law(p_rows, q_rows, bonus_row, with_bonus=with_bonus)
        return CallLaw(*(jnp.einsum("a,iay->iy", start, x, precision=HIGHEST) for x in law))

    def drafted_call_law_from(self, start, p_rows, q_rows, bonus_row, *, with_bonus: bool,
                              **extra) -> tuple[CallLaw, jax.Array]:
        """``(call_law_from(...), drafted)`` when ``has_drafted_call_law`` (see the class
        docstring)."""
        raise NotImplementedError(f"{type(self).__name__} drafts a fixed number of tokens: it "
                                  "has no drafted_call_law_from")

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

    def depth_plan(self, horizon: int) -> DepthPlan:
        """The static plan of the call-depth filter over ``horizon`` positions (``DepthPlan``),
        when ``has_depth_plan``: the decoder's every choice is then read on the emitted path."""
        raise NotImplementedError(f"{type(self).__name__} has no depth plan")

    def stationary_form(self) -> "CallDecoder":
        """The decoder as the long run on a stationary chain (no position) reads it: itself, at
        position 1, by default; ``ValueError`` when its calls differ by position (a table)."""
        return self

    def resolve_lookahead(self, horizon: int) -> int:
        return min(self.lookahead, horizon)

    def truncate(self, lookahead: int) -> "CallDecoder":
        """The decoder the sampler runs when at most ``lookahead`` (``<= K``) drafts fit in the
        horizon: by default the same decoder with that ``lookahead`` field. A decoder whose
        ``sample_call`` already stops at the horizon (a token tree) returns itself."""
        if lookahead == self.lookahead:
            return self
        return dataclasses.replace(self, lookahead=lookahead)


#: Every member of the protocol, by the base class that declares it with its default.
PROTOCOL = {
    Decoder: ("model_kinds", "uses_draft", "lossless", "varies_lookahead", "with_lookahead",
              "recording_reads", "verifies_jointly", "over_acceptance", "given_tree",
              "validate", "check", "probe", "label", "example_cases"),
    TokenwiseDecoder: ("probes_laws", "lookahead", "num_drafts", "same_root",
                       "has_root_scale", "has_acceptance", "reads_draft_probs", "has_residual_given_draft",
                       "binds_models", "laws", "root_scale", "acceptance",
                       "residual_given_draft", "bind", "laws_at", "resolve_lookahead",
                       "call_work"),
    CallDecoder: ("lookahead", "uses_position", "has_drafted_call_law", "num_call_states",
                  "initial_call_state", "next_call_state", "num_uniforms", "prepare",
                  "sample_call", "has_walk", "walk_uniforms", "walk_start", "walk_tables",
                  "walk_step", "call_law", "call_law_from", "drafted_call_law_from",
                  "call_work", "check_exact", "stationary_form", "resolve_lookahead",
                  "truncate"),
}


def check_decoder(decoder) -> None:
    """Raise ``ValueError`` unless ``decoder`` is a decoder value."""
    if not isinstance(decoder, (TokenwiseDecoder, CallDecoder)):
        raise ValueError(
            "decoder must be a specjax decoder such as specjax.Speculative() or "
            "specjax.BatchSpeculative(4) (a TokenwiseDecoder or CallDecoder), got "
            f"{decoder!r}")
