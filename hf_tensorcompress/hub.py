"""Model cards for compressed models, and ``push_to_hub`` with a clear error when the Hub refuses.

The card is rendered from ``model_cards/compressed_model.md`` (Jinja, via ``ModelCard.from_template``) out of what
the model knows (``config.compression_config``, ``compression_report``) plus what only the caller knows, a
``CardInfo``: base model, datasets, a recipe's ``results.json``, limitations. ``save_pretrained`` writes the card
(and ``tensorcompress_card.json``, the ``CardInfo`` it came from) and ``model.push_to_hub`` uploads it, through the
save hook the library gives the classes it makes (``saving.save_extras``). A model loaded with ``trust_remote_code``
alone has no hook and keeps transformers' card handling.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from huggingface_hub import HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HfHubHTTPError
from torch import nn

from .core.metrics import compression_report
from .core.registry import record
from .reporting import markdown_table, metric_names, results_table, summary_headers, summary_rows
from .runtime.modeling_tensorcompress import CLASS_PREFIX, CompressedModelMixin

TEMPLATE = Path(__file__).parent / "model_cards" / "compressed_model.md"
CARD_INFO_FILE = "tensorcompress_card.json"


#: Hub pipeline tag by the model class's task suffix.
PIPELINE_TAGS = {"ForCausalLM": "text-generation", "ForPrediction": "time-series-forecasting"}


class PushError(RuntimeError):
    """The Hub refused a push (bad token, no rights on the namespace, missing repo); nothing local changed."""


@dataclass
class CardInfo:
    """What a model card says that the model itself cannot know.

    Args:
        base_model: Hub id of the model this one was compressed from (card metadata ``base_model``).
        datasets: names or Hub ids of the evaluation data (metadata ``datasets``).
        dataset_note: one line describing the evaluation data, e.g. that it substitutes for a paper's dataset.
        results: a recipe's ``results.json`` (``{"dataset", "runs": [{"name", "metrics", ...}]}``).
        run: the ``results.json`` run this model is, highlighted in the card's table.
        tokens: rows/tokens per forward used for the FLOPs and energy figures.
        limitations: extra bullet points (e.g. dequantised 4-bit weights).
        license: a Hub license id.
    """

    base_model: str | None = None
    datasets: list[str] = field(default_factory=list)
    dataset_note: str | None = None
    results: dict | None = None
    run: str | None = None
    tokens: int = 1
    limitations: list[str] = field(default_factory=list)
    license: str | None = None

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> CardInfo:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def to_json_file(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")


def set_card_info(model: nn.Module, info: CardInfo) -> None:
    """Attach ``info`` to ``model``; ``save_pretrained`` / ``push_to_hub`` render it into the card."""
    model.card_info = info


def _pipeline_tag(base_name: str) -> str | None:
    return next((tag for suffix, tag in PIPELINE_TAGS.items() if base_name.endswith(suffix)), None)


def _limitations(model: nn.Module, info: CardInfo) -> list[str]:
    method = model.config.compression_config["method"]
    items = [
        f"The `{method}` layers approximate the dense weights: outputs differ from the dense model's; check the "
        "metrics above on data like yours before relying on it.",
        "FLOPs, storage and energy are computed from the layers' shapes, not measured on hardware.",
    ]
    if info.dataset_note:
        items.append(f"Evaluation data: {info.dataset_note}.")
    return items + list(info.limitations)


def model_card(model: nn.Module, info: CardInfo | None = None, repo_id: str | None = None) -> ModelCard:
    """The card of a compressed ``model`` (``apply_compression``'d or loaded), validated locally by ``ModelCard``."""
    compression = getattr(model.config, "compression_config", None)
    if not compression:
        raise ValueError(f"{type(model).__name__} is not compressed (config has no compression_config)")
    info = info or getattr(model, "card_info", None) or CardInfo()
    base_name = type(model).__name__.removeprefix(CLASS_PREFIX)
    method = compression["method"]
    report = compression_report(model, tokens=info.tokens)
    results = info.results or {}
    datasets = list(info.datasets) or ([str(results["dataset"])] if results.get("dataset") else [])
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=_pipeline_tag(base_name),
        base_model=info.base_model,
        datasets=datasets or None,
        metrics=metric_names(results) or None,
        license=info.license,
        tags=["hf_tensorcompress", "compressed", method, getattr(model.config, "model_type", None), "custom_code"],
    )
    card_data.tags = [tag for tag in card_data.tags if tag]
    headers, rows = results_table(results, highlight=info.run) if results.get("runs") else ([], [])
    modules = list(compression.get("modules", {}))
    leaf_names = sorted({name.rsplit(".", 1)[-1] for name in modules})
    settings = [
        (key, json.dumps(value) if isinstance(value, (list, dict)) else value)
        for key, value in compression.items()
        if key not in ("modules", "version")
    ]
    card = ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        title=repo_id.split("/")[-1] if repo_id else f"{CLASS_PREFIX}{base_name} ({method})",
        architecture=f"A `{base_name}`",
        hub_url="https://huggingface.co",
        target_summary=", ".join(f"`{name}`" for name in leaf_names) + " modules",
        method=method,
        method_description=record(method).description,
        settings=settings,
        module_count=len(modules),
        cost_table=markdown_table(summary_headers(report), summary_rows(report)),
        metrics_table=markdown_table(headers, rows) if rows else "",
        dense_note=any(row[0] == "dense" for row in rows),
        dataset_description=info.dataset_note or ", ".join(datasets) or "the data in `results.json`",
        repo_id=repo_id or "<your-name>/<repo>",
        auto_class=next((name for name in getattr(model.config, "auto_map", {}) if name != "AutoModel"), "AutoModel"),
        limitations=_limitations(model, info),
    )
    return ModelCard(str(card))  # re-parse: the rendered YAML must load back as valid card metadata


def write_model_card(model: nn.Module, folder: str | os.PathLike, repo_id: str | None = None) -> None:
    """Write ``README.md`` (and ``tensorcompress_card.json`` if a ``CardInfo`` is attached) into ``folder``.

    Tags already in ``folder/README.md`` (``push_to_hub(tags=...)`` puts them there) are kept.
    """
    folder = Path(folder)
    card = model_card(model, repo_id=repo_id)
    existing = folder / "README.md"
    if existing.exists():
        previous = ModelCard(existing.read_text(encoding="utf-8"), ignore_metadata_errors=True).data.tags or []
        card.data.tags = list(dict.fromkeys([*card.data.tags, *previous]))
    card.save(existing)
    info = getattr(model, "card_info", None)
    if info is not None:
        info.to_json_file(folder / CARD_INFO_FILE)


def check_token(token: str | None = None) -> str:
    """The user name the Hub knows ``token`` (or the configured one) by, or a ``PushError`` saying what to do."""
    api = HfApi(token=token)
    try:
        return api.whoami()["name"]
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        raise PushError(
            f"The Hub at {api.endpoint} rejected the token (HTTP {status}). Set HF_TOKEN (or pass token=) to a token "
            "with write access, e.g. from `hf auth login`."
        ) from None
    except Exception as error:  # no token configured, or the Hub is unreachable
        raise PushError(f"Cannot authenticate with the Hub at {api.endpoint}: {error}") from None


def push_to_hub(
    model: nn.Module,
    repo_id: str,
    info: CardInfo | None = None,
    *,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    tokenizer=None,
) -> str:
    """Push a compressed model with its remote code and model card (and ``tokenizer``, if given, in a second
    commit); returns the URL of the model's commit.

    The token is checked first, and any refusal by the Hub becomes a ``PushError`` naming the repo and the reason;
    the model itself is not modified either way.
    """
    if not isinstance(model, CompressedModelMixin):
        raise ValueError(f"{type(model).__name__} is not a compressed model; run apply_compression first")
    check_token(token)
    if info is not None:
        set_card_info(model, info)
    try:
        commit = model.push_to_hub(
            repo_id, token=token, private=private, commit_message=commit_message or "Upload compressed model"
        )
        if tokenizer is not None:
            tokenizer.push_to_hub(repo_id, token=token, commit_message="Upload tokenizer")
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        reason = str(error).strip().splitlines()
        raise PushError(
            f"Could not push to {repo_id!r} (HTTP {status}): {reason[-1] if reason else error}. Check that the repo "
            "id is <your user or org>/<name> and that your token may write there."
        ) from None
    return str(commit.commit_url if hasattr(commit, "commit_url") else commit)
