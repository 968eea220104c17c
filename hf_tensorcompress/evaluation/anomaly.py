"""Anomaly thresholds and scores: peaks over threshold (POT), point-adjusted precision/recall/F1."""

from __future__ import annotations

import numpy as np
from scipy.stats import genpareto


def pot_threshold(scores: np.ndarray, risk: float, initial_quantile: float) -> float:
    """Peaks over threshold (Siffer et al. 2017): fit a generalised Pareto to the excesses over an initial
    threshold ``t`` and return the score exceeded with probability ``risk``: ``t + σ/γ ((risk·n/N_t)^(-γ) − 1)``."""
    initial = float(np.quantile(scores, initial_quantile))
    excesses = scores[scores > initial] - initial
    gamma, _, sigma = genpareto.fit(excesses, floc=0.0)
    ratio = risk * len(scores) / len(excesses)
    if abs(gamma) < 1e-6:
        return initial - sigma * np.log(ratio)
    return initial + sigma / gamma * (ratio ** (-gamma) - 1.0)


def point_adjust(predicted: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """If any point of a true anomaly segment is flagged, the whole segment counts as detected."""
    adjusted = predicted.copy()
    edges = np.flatnonzero(np.diff(np.concatenate([[0], labels, [0]])))
    for begin, end in zip(edges[::2], edges[1::2]):
        if adjusted[begin:end].any():
            adjusted[begin:end] = True
    return adjusted


def detection_scores(predicted: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    adjusted = point_adjust(predicted.astype(bool), labels.astype(int))
    tp = int((adjusted & (labels == 1)).sum())
    precision = tp / max(int(adjusted.sum()), 1)
    recall = tp / max(int((labels == 1).sum()), 1)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def threshold_scores(
    validation: np.ndarray, test: np.ndarray, labels: np.ndarray, manual_tau: float, pot_risk: float, pot_level: float
) -> dict[str, float]:
    """F1 etc. at two thresholds from the validation scores: the top ``manual_tau`` quantile, and POT."""
    manual = float(np.quantile(validation, 1.0 - manual_tau))
    pot = float(pot_threshold(validation, pot_risk, pot_level))
    metrics = {f"manual_{k}": v for k, v in detection_scores(test > manual, labels).items()}
    metrics |= {f"pot_{k}": v for k, v in detection_scores(test > pot, labels).items()}
    return metrics | {"manual_threshold": manual, "pot_threshold": pot}
