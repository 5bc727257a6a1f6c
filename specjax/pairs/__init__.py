"""Real model pairs: record target rollouts once, estimate what any lossless decoder costs.

``calls``: the filter over the phase of a call given the output (``call_structure``).
"""

from specjax.pairs.calls import CallStructure
from specjax.pairs.calls import call_structure
from specjax.pairs.calls import rejection_rate

__all__ = ["CallStructure", "call_structure", "rejection_rate"]
