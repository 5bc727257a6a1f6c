"""Draft tuning: draft families, exact differentiable objectives (a decoder and a quantity) and
an optax tuner."""

from specjax import _moved
from specjax.tuning.families import ContextFreeDraft
from specjax.tuning.families import DraftFamily
from specjax.tuning.families import FullDraft
from specjax.tuning.families import LowRankDraft
from specjax.tuning.families import StationaryDraft
from specjax.tuning.families import draft_family
from specjax.tuning.objectives import Objective
from specjax.tuning.objectives import biased_tradeoff
from specjax.tuning.objectives import kl_divergence
from specjax.tuning.objectives import make_objective
from specjax.tuning.objectives import objective
from specjax.tuning.tuner import TuneResult
from specjax.tuning.tuner import kl_fit
from specjax.tuning.tuner import tune_draft

__all__ = [
    "ContextFreeDraft",
    "DraftFamily",
    "FullDraft",
    "LowRankDraft",
    "Objective",
    "StationaryDraft",
    "TuneResult",
    "biased_tradeoff",
    "draft_family",
    "kl_divergence",
    "kl_fit",
    "make_objective",
    "objective",
    "tune_draft",
]

# Conveniences that only repeat an entry point: deprecated, served by specjax.compat.
__getattr__ = _moved.moved(__name__, dict.fromkeys((
    "batch_rejections",
    "sd_rejections",
    "target_calls",
), _moved.COMPAT))
