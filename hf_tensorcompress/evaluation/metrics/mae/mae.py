"""Mean absolute error over every forecast value, as an ``evaluate`` metric module shipped with hf_tensorcompress.

Load it offline with ``evaluate.load(str(path_to_this_folder))``. Each row is one forecast window, flattened
(or a single number); the score is the mean over all values of all rows, the usual forecasting MAE.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Mean absolute error, averaged over every value of every forecast window."
_KWARGS_DESCRIPTION = """
Args:
    predictions: one number or one flattened forecast window (list/array of numbers) per row.
    references: the true values, same shapes as predictions. A NaN reference is a missing value: not scored.
Returns:
    mae: mean of |prediction - reference| over all values.
Examples:
    >>> mae = evaluate.load("hf_tensorcompress/evaluate_metrics/mae")
    >>> mae.compute(predictions=[[1.0, 2.0]], references=[[1.0, 4.0]])
    {'mae': 1.0}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Mae(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Sequence(datasets.Value("float32")),
                        "references": datasets.Sequence(datasets.Value("float32")),
                    }
                ),
                datasets.Features({"predictions": datasets.Value("float32"), "references": datasets.Value("float32")}),
            ],
        )

    def _compute(self, predictions, references):
        predictions = np.concatenate([np.atleast_1d(np.asarray(p, dtype=np.float64)) for p in predictions])
        references = np.concatenate([np.atleast_1d(np.asarray(r, dtype=np.float64)) for r in references])
        if predictions.shape != references.shape:
            raise ValueError(f"predictions hold {predictions.size} values but references {references.size}")
        scored = ~np.isnan(references)  # missing values (NaN references) are masked out, never scored against a fill
        if not scored.any():
            raise ValueError("every reference is missing (NaN): nothing to score")
        predictions, references = predictions[scored], references[scored]
        return {"mae": float(np.mean(np.abs(predictions - references)))}
