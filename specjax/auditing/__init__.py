"""Audits of verification code: single-step rules (Monte Carlo and exact, with example rules),
engines' rejection samplers on given drafts (verification, its exact law, comparison), and the
provenance of given drafts (were they drawn from the declared law?).

The example rules of ``specjax.auditing.rules`` (``speculative_rule``, ``greedy_rule``, the broken
``accept_all``, ``wrong_residual``, ``greedy_scored_with_softmax``, ``accepts_at_zero_uniform``,
each also in uniform form ``*_u``; ``from_uniform``, ``Rule``, ``CORRECT_RULES``,
``BROKEN_RULES``) are first-class names here too: ``specjax.auditing.speculative_rule`` is
``specjax.auditing.rules.speculative_rule``.
"""

from specjax.auditing.audit import AuditReport
from specjax.auditing.audit import audit
from specjax.auditing.audit_exact import audit_exact
from specjax.auditing.compare import EngineComparison
from specjax.auditing.compare import compare_outputs
from specjax.auditing.given import DraftsLaw
from specjax.auditing.history import SequenceFit
from specjax.auditing.history import SequenceLaw
from specjax.auditing.history import history_law
from specjax.auditing.history import sample_history
from specjax.auditing.history import sequence_fit
from specjax.auditing.history import sequence_law
from specjax.auditing.given import Verified
from specjax.auditing.given import verify_drafts
from specjax.auditing.given import verify_drafts_law
from specjax.auditing.given_tree import TreeLaw
from specjax.auditing.given_tree import VerifiedTree
from specjax.auditing.given_tree import verify_tree
from specjax.auditing.given_tree import verify_tree_law
from specjax.auditing.provenance import ProvenanceCheck
from specjax.auditing.provenance import check_provenance
from specjax.auditing.rules import BROKEN_RULES
from specjax.auditing.rules import CORRECT_RULES
from specjax.auditing.rules import Rule
from specjax.auditing.rules import accept_all
from specjax.auditing.rules import accept_all_u
from specjax.auditing.rules import accepts_at_zero_uniform
from specjax.auditing.rules import accepts_at_zero_uniform_u
from specjax.auditing.rules import from_uniform
from specjax.auditing.rules import greedy_rule
from specjax.auditing.rules import greedy_rule_u
from specjax.auditing.rules import greedy_scored_with_softmax
from specjax.auditing.rules import greedy_scored_with_softmax_u
from specjax.auditing.rules import speculative_rule
from specjax.auditing.rules import speculative_rule_u
from specjax.auditing.rules import wrong_residual
from specjax.auditing.rules import wrong_residual_u
from specjax.auditing.traces import EngineTrace
from specjax.auditing.traces import TraceCheck
from specjax.auditing.traces import TraceEstimate
from specjax.auditing.traces import check_trace
from specjax.auditing.traces import counterfactuals
from specjax.auditing.traces import estimate_trace
from specjax.auditing.traces import format_estimates
from specjax.auditing.traces import trace_law

__all__ = [
    "AuditReport",
    "audit",
    "audit_exact",
    "DraftsLaw",
    "EngineComparison",
    "Verified",
    "compare_outputs",
    "verify_drafts",
    "verify_drafts_law",
    "ProvenanceCheck",
    "check_provenance",
    "TreeLaw",
    "VerifiedTree",
    "verify_tree",
    "verify_tree_law",
    # engines' per-call traces (specjax.auditing.traces)
    "EngineTrace",
    "TraceEstimate",
    "TraceCheck",
    "trace_law",
    "estimate_trace",
    "counterfactuals",
    "check_trace",
    "format_estimates",
    # penalties and grammar masks under SD (specjax.auditing.history)
    "SequenceFit",
    "SequenceLaw",
    "history_law",
    "sample_history",
    "sequence_fit",
    "sequence_law",
    # the example rules
    "BROKEN_RULES",
    "CORRECT_RULES",
    "Rule",
    "accept_all",
    "accept_all_u",
    "accepts_at_zero_uniform",
    "accepts_at_zero_uniform_u",
    "from_uniform",
    "greedy_rule",
    "greedy_rule_u",
    "greedy_scored_with_softmax",
    "greedy_scored_with_softmax_u",
    "speculative_rule",
    "speculative_rule_u",
    "wrong_residual",
    "wrong_residual_u",
]
