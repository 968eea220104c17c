"""Perplexity from summed negative log-likelihoods, as an ``evaluate`` metric module.

evaluate's own hub "perplexity" metric downloads gpt2 and runs it itself; this one only aggregates what the
caller's model produced: each added example is one evaluation window's summed NLL (nats) and its number of
predicted tokens. PPL = exp(Σ nll / Σ tokens), so windows of any length combine exactly.
"""

import math

import datasets
import evaluate

_DESCRIPTION = "Corpus perplexity exp(sum NLL / sum tokens) from per-window NLL sums (natural log)."
_INPUTS = """
Args:
    nll_sum: list of float, the summed negative log-likelihood (nats) of the predicted tokens of each window.
    token_count: list of int, the number of predicted tokens of each window.
Returns:
    perplexity: exp of the mean NLL per token; ln_perplexity: the mean NLL per token; tokens: total tokens.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class Perplexity(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"nll_sum": datasets.Value("float64"), "token_count": datasets.Value("int64")}),
        )

    def _compute(self, nll_sum, token_count):
        tokens = int(sum(token_count))
        if tokens <= 0:
            raise ValueError("perplexity needs at least one predicted token (token_count sums to 0)")
        mean = float(sum(nll_sum)) / tokens
        return {"perplexity": math.exp(mean), "ln_perplexity": mean, "tokens": tokens}
