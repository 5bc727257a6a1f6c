"""Audits of single-step verification code: Monte Carlo and exact, with example rules."""

from specjax.auditing.audit import AuditReport
from specjax.auditing.audit import audit
from specjax.auditing.audit import audit_exact

__all__ = [
    "AuditReport",
    "audit",
    "audit_exact",
]
