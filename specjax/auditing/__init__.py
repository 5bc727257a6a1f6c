"""Audits of verification code: single-step rules (Monte Carlo and exact, with example rules),
and engines' rejection samplers on given drafts (verification, its exact law, comparison)."""

from specjax.auditing.audit import AuditReport
from specjax.auditing.audit import audit
from specjax.auditing.audit import audit_exact
from specjax.auditing.compare import EngineComparison
from specjax.auditing.compare import compare_outputs
from specjax.auditing.given import DraftsLaw
from specjax.auditing.given import Verified
from specjax.auditing.given import verify_drafts
from specjax.auditing.given import verify_drafts_law
from specjax.auditing.given_tree import TreeLaw
from specjax.auditing.given_tree import VerifiedTree
from specjax.auditing.given_tree import verify_tree
from specjax.auditing.given_tree import verify_tree_law

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
    "TreeLaw",
    "VerifiedTree",
    "verify_tree",
    "verify_tree_law",
]
