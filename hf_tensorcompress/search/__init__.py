"""The Smartformer reinforcement-learning rank search (paper §4 and Algorithm 1)."""

from .agent import ActorCritic
from .config import SearchConfig
from .encoder import StateEncoder
from .greedy import greedy_forms
from .importance import TaylorImportance
from .mdp import RankSearch
from .plot import plot_trace
from .reward import accuracy_reward, loss_reward
from .space import AttentionGroup, attention_groups, candidate_ranks

__all__ = [
    "ActorCritic",
    "AttentionGroup",
    "RankSearch",
    "SearchConfig",
    "StateEncoder",
    "TaylorImportance",
    "accuracy_reward",
    "attention_groups",
    "candidate_ranks",
    "greedy_forms",
    "loss_reward",
    "plot_trace",
]
