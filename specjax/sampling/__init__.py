"""Monte Carlo: ``decode`` runs any decoder over many chains; the engines, sharding, and the
counts-only path ``decoding_statistics``."""

from specjax import _moved
from specjax.sampling.counts import DecodingStatistics
from specjax.sampling.counts import decoding_statistics
from specjax.sampling.decoding import decode
from specjax.sampling.engine import DecodingTrace
from specjax.sampling.samplers import autoregressive_decoding
from specjax.sampling.samplers import batch_speculative_decoding
from specjax.sampling.samplers import biased_speculative_decoding
from specjax.sampling.samplers import rejection_decoding
from specjax.sampling.samplers import speculative_decoding
from specjax.sampling.sharding import chain_sharding

__all__ = [
    "DecodingStatistics",
    "DecodingTrace",
    "autoregressive_decoding",
    "batch_speculative_decoding",
    "biased_speculative_decoding",
    "chain_sharding",
    "decode",
    "decoding_statistics",
    "rejection_decoding",
    "speculative_decoding",
]

# Conveniences that only repeat an entry point: deprecated, served by specjax.compat.
__getattr__ = _moved.moved(__name__, dict.fromkeys((
    "block_verification_decoding",
), _moved.COMPAT))
