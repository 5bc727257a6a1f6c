"""Exact quantities: ``exact`` and ``accepted_length`` for any decoder (the forward recursions
over a decoder's state), closed forms, output laws, sequence KL and the Pareto front."""

from specjax import _moved
from specjax.theory.adaptive import OptimalStopping
from specjax.theory.adaptive import optimal_stopping
from specjax.theory.stationary import OptimalRate
from specjax.theory.stationary import StationaryRate
from specjax.theory.stationary import optimal_rate
from specjax.theory.stationary import stationary_rate
from specjax.theory.cost import CostModel
from specjax.theory.cost import DecodingTime
from specjax.theory.cost import LookaheadChoice
from specjax.theory.cost import TreeBudgetChoice
from specjax.theory.cost import best_lookahead
from specjax.theory.cost import best_tree_budget
from specjax.theory.cost import decoding_time
from specjax.theory.cost import expected_time
from specjax.theory.serving import BatchPolicy
from specjax.theory.serving import DraftAllocation
from specjax.theory.serving import ServingCost
from specjax.theory.serving import ServingRate
from specjax.theory.serving import SlotWork
from specjax.theory.serving import allocate_drafts
from specjax.theory.serving import batch_lookahead
from specjax.theory.serving import goodput
from specjax.theory.serving import goodput_grid
from specjax.theory.serving import request_policy
from specjax.theory.serving import roofline
from specjax.theory.serving import serving_rate
from specjax.theory.serving import slot_work
from specjax.theory.serving import stationary_slot_work
from specjax.theory.serving import threshold_decoder
from specjax.theory.block import exact_joint_accepted_length
from specjax.theory.block import exact_tokenwise_accepted_length
from specjax.theory.values import accepted_length
from specjax.theory.values import batch_expected_rejections
from specjax.theory.values import exact
from specjax.theory.values import expected_calls
from specjax.theory.values import expected_rejections
from specjax.theory.laws import ParetoFront
from specjax.theory.metrics import EngineMetrics
from specjax.theory.metrics import engine_metrics
from specjax.theory.laws import biased_output_chain
from specjax.theory.laws import marginals
from specjax.theory.laws import output_chain
from specjax.theory.laws import pareto_front
from specjax.theory.laws import sequence_kl
from specjax.theory.recursion import ExactDecoding
from specjax.theory.trees import best_token_tree
from specjax.theory.trees import positional_acceptance
from specjax.theory.tree_shapes import SequoiaChoice
from specjax.theory.tree_shapes import sequoia_hardware_tree
from specjax.theory.tree_shapes import sequoia_tree

__all__ = [
    "OptimalStopping",
    "optimal_stopping",
    "OptimalRate",
    "StationaryRate",
    "optimal_rate",
    "stationary_rate",
    "CostModel",
    "DecodingTime",
    "LookaheadChoice",
    "TreeBudgetChoice",
    "best_lookahead",
    "best_tree_budget",
    "decoding_time",
    "expected_time",
    "BatchPolicy",
    "DraftAllocation",
    "ServingCost",
    "ServingRate",
    "SlotWork",
    "allocate_drafts",
    "batch_lookahead",
    "goodput",
    "goodput_grid",
    "request_policy",
    "roofline",
    "serving_rate",
    "slot_work",
    "stationary_slot_work",
    "threshold_decoder",
    "best_token_tree",
    "positional_acceptance",
    "SequoiaChoice",
    "sequoia_hardware_tree",
    "sequoia_tree",
    "EngineMetrics",
    "engine_metrics",
    "ExactDecoding",
    "ParetoFront",
    "accepted_length",
    "batch_expected_rejections",
    "biased_output_chain",
    "exact",
    "exact_joint_accepted_length",
    "exact_tokenwise_accepted_length",
    "expected_calls",
    "expected_rejections",
    "marginals",
    "output_chain",
    "pareto_front",
    "sequence_kl",
]

# Conveniences that only repeat an entry point: deprecated, served by specjax.compat.
__getattr__ = _moved.moved(__name__, dict.fromkeys((
    "exact_batch_speculative_decoding",
    "exact_biased_speculative_decoding",
    "exact_rejection_decoding",
    "exact_speculative_decoding",
    "exact_block_accepted_length",
    "exact_block_expected_calls",
), _moved.COMPAT))
