"""A deterministic point forecast for autoregressive distribution forecasters (Informer, Time Series Transformer).

``generate`` draws ``num_parallel_samples`` paths: at each step it samples the next value from the predicted
distribution and feeds the SAMPLE back; the point forecast is the mean over paths, random and costly. Mean feedback
decodes one path and feeds back the distribution's MEAN instead:

    ŷ_k = E[y_k | context, y_1 = ŷ_1, …, y_{k-1} = ŷ_{k-1}]

It is what the exported ONNX Informer gives (``deploy.onnx.runner``). It is not the mean of ``generate``'s samples:
for a nonlinear model the mean of the next-step distribution given sampled paths (averaged over paths) differs from
the next-step mean given the mean path, and ``generate``'s estimate carries sampling noise on top.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def mean_feedback_forecast(
    model: torch.nn.Module,
    past_values: torch.Tensor,
    past_time_features: torch.Tensor,
    future_time_features: torch.Tensor,
    past_observed_mask: torch.Tensor | None = None,
    static_categorical_features: torch.Tensor | None = None,
    static_real_features: torch.Tensor | None = None,
) -> torch.Tensor:
    """(batch, prediction_length[, input_size]) mean-feedback forecast: ``generate``'s loop (the encoder once, the
    decoder over the steps so far) with each step's distribution mean in place of a sample."""
    outputs = model(
        past_values=past_values,
        past_time_features=past_time_features,
        past_observed_mask=past_observed_mask,
        static_categorical_features=static_categorical_features,
        static_real_features=static_real_features,
        future_time_features=future_time_features,
        future_values=None,
        use_cache=True,
    )
    loc, scale = outputs.loc, outputs.scale
    scaled_past = (past_values - loc) / scale
    static = outputs.static_features.unsqueeze(1).expand(-1, future_time_features.shape[1], -1)
    features = torch.cat((static, future_time_features), dim=-1)
    decoder, steps = model.model.get_decoder(), []
    for k in range(model.config.prediction_length):
        lagged = model.model.get_lagged_subsequences(sequence=scaled_past, subsequences_length=1 + k, shift=1)
        decoder_input = torch.cat((lagged.reshape(*lagged.shape[:2], -1), features[:, : k + 1]), dim=-1)
        hidden = decoder(inputs_embeds=decoder_input, encoder_hidden_states=outputs.encoder_last_hidden_state)
        params = model.parameter_projection(hidden.last_hidden_state[:, -1:])
        mean = model.output_distribution(params, loc=loc, scale=scale).mean
        scaled_past = torch.cat((scaled_past, (mean - loc) / scale), dim=1)
        steps.append(mean)
    return torch.cat(steps, dim=1)
