"""Classification accuracy, as an ``evaluate`` metric module shipped with hf_tensorcompress.

``evaluate.load("accuracy")`` fetches its script from the Hub; this copy loads offline by path. Each row is one
predicted class id and its true class id; the score is the share of rows where they agree.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Accuracy: the fraction of examples whose predicted class equals the true class."
_KWARGS_DESCRIPTION = """
Args:
    predictions: one predicted class id (int) per example.
    references: the true class id (int) per example.
Returns:
    accuracy: mean of (prediction == reference).
Examples:
    >>> accuracy = evaluate.load("hf_tensorcompress/evaluation/metrics/accuracy")
    >>> accuracy.compute(predictions=[0, 1, 1, 2], references=[0, 1, 2, 2])
    {'accuracy': 0.75}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        predictions, references = np.asarray(predictions), np.asarray(references)
        if predictions.size == 0:
            raise ValueError("no examples to score")
        return {"accuracy": float(np.mean(predictions == references))}
