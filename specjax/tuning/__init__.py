"""Draft tuning: draft families, exact differentiable objectives (a decoder and a quantity) and
an optax tuner."""

from specjax.tuning.families import ContextFreeDraft
from specjax.tuning.families import DraftFamily
from specjax.tuning.families import FullDraft
from specjax.tuning.families import LowRankDraft
from specjax.tuning.families import StationaryDraft
from specjax.tuning.families import draft_family
from specjax.tuning.objectives import Objective
from specjax.tuning.objectives import batch_rejections
from specjax.tuning.objectives import biased_tradeoff
from specjax.tuning.objectives import kl_divergence
from specjax.tuning.objectives import make_objective
from specjax.tuning.objectives import objective
from specjax.tuning.objectives import sd_rejections
from specjax.tuning.objectives import target_calls
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
    "batch_rejections",
    "biased_tradeoff",
    "draft_family",
    "kl_divergence",
    "kl_fit",
    "make_objective",
    "objective",
    "sd_rejections",
    "target_calls",
    "tune_draft",
]
