"""hf_tensorcompress.data on the real Appliances Energy data: split, standardisation, windows, user inputs, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import default_collate
from transformers import (
    AutoformerConfig,
    AutoformerForPrediction,
    InformerConfig,
    InformerForPrediction,
    PatchTSTConfig,
    PatchTSTForPrediction,
)

from hf_tensorcompress.assets import appliances_energy_csv
from hf_tensorcompress.data import (
    NUM_TIME_FEATURES,
    describe_source,
    forecasting_windows,
    load_appliances_energy,
    load_forecasting_csv,
    load_forecasting_dataset,
    prepare_forecasting,
    standardization_of,
)


@pytest.fixture(scope="module")
def raw() -> pd.DataFrame:
    return pd.read_csv(appliances_energy_csv())


@pytest.fixture(scope="module")
def appliances():
    return load_appliances_energy()


def patchtst_config(channels: int = 26, context: int = 32, horizon: int = 8) -> PatchTSTConfig:
    return PatchTSTConfig(
        num_input_channels=channels,
        context_length=context,
        prediction_length=horizon,
        patch_length=8,
        patch_stride=8,
        d_model=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        ffn_dim=32,
    )


def seq2seq_config(config_class, channels: int = 26, **overrides):
    kwargs = dict(
        input_size=channels,
        context_length=24,
        prediction_length=8,
        lags_sequence=[1, 2, 4],
        num_time_features=NUM_TIME_FEATURES,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
    )
    return config_class(**{**kwargs, **overrides})


def test_split_sizes_order_and_columns(appliances, raw):
    assert {name: len(split) for name, split in appliances.items()} == {
        "train": 13814,
        "validation": 1974,
        "test": 3947,
    }
    assert sum(len(split) for split in appliances.values()) == len(raw)
    channels = [c for c in raw.columns if c not in ("date", "rv1", "rv2")]
    assert appliances["train"].column_names == ["date", *channels]
    assert len(channels) == 26
    dates = {name: split.with_format("pandas")["date"] for name, split in appliances.items()}
    assert str(appliances["train"].features["date"].dtype).startswith("timestamp")
    for name in appliances:
        assert dates[name].is_monotonic_increasing
    assert dates["train"].iloc[-1] < dates["validation"].iloc[0] < dates["validation"].iloc[-1] < dates["test"].iloc[0]
    assert dates["train"].iloc[0] == pd.Timestamp(raw["date"].iloc[0])
    assert dates["test"].iloc[-1] == pd.Timestamp(raw["date"].iloc[-1])


def test_standardised_with_training_statistics_only(appliances, raw):
    stats = standardization_of(appliances)
    train_raw = raw.iloc[:13814][list(stats.columns)].to_numpy(dtype=np.float64)
    np.testing.assert_allclose(stats.mean, train_raw.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(stats.std, train_raw.std(axis=0), rtol=1e-10)
    train = appliances["train"].to_pandas()[list(stats.columns)].to_numpy(dtype=np.float64)
    np.testing.assert_allclose(train.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(train.std(axis=0), 1, atol=1e-4)
    test = appliances["test"].to_pandas()[list(stats.columns)].to_numpy(dtype=np.float64)
    test_raw = raw.iloc[-3947:][list(stats.columns)].to_numpy(dtype=np.float64)
    assert np.abs(test.mean(axis=0)).max() > 0.1  # test data is not re-centred with its own statistics
    np.testing.assert_allclose(stats.inverse(test), test_raw, rtol=1e-4, atol=1e-3)
    assert standardization_of(appliances["test"]) == stats


def test_patchtst_windows_feed_forward_pass(appliances):
    config = patchtst_config()
    windows = forecasting_windows(appliances["validation"], config, stride=10)
    assert len(windows) == len(range(0, 1974 - 40 + 1, 10))
    item = windows[3]
    assert item["past_values"].shape == (32, 26) and item["future_values"].shape == (8, 26)
    values = appliances["validation"].with_format("numpy")
    np.testing.assert_allclose(item["past_values"][0].numpy()[0], values["Appliances"][30])
    np.testing.assert_allclose(item["future_values"][0].numpy()[0], values["Appliances"][62])
    output = PatchTSTForPrediction(config)(**default_collate([windows[i] for i in range(4)]))
    assert output.prediction_outputs.shape == (4, 8, 26) and torch.isfinite(output.loss)


@pytest.mark.parametrize(
    "config_class,model_class", [(AutoformerConfig, AutoformerForPrediction), (InformerConfig, InformerForPrediction)]
)
def test_seq2seq_windows_feed_forward_pass(appliances, config_class, model_class):
    config = seq2seq_config(config_class)
    windows = forecasting_windows(appliances["test"], config, stride=100)
    item = windows[0]
    assert item["past_values"].shape == (28, 26)  # context 24 + max lag 4
    assert item["past_time_features"].shape == (28, NUM_TIME_FEATURES)
    assert item["future_time_features"].shape == (8, NUM_TIME_FEATURES)
    assert item["past_observed_mask"].all()
    assert item["past_time_features"].abs().max() <= 0.5
    # 10-minute data: minute-of-hour changes every step, the next step's feature follows on
    assert not torch.equal(item["past_time_features"][0], item["past_time_features"][1])
    model = model_class(config)
    batch = default_collate([windows[i] for i in range(3)])
    assert torch.isfinite(model(**batch).loss)


def test_univariate_seq2seq_windows_are_flat(appliances):
    data = load_appliances_energy(columns=["Appliances"])
    config = seq2seq_config(AutoformerConfig, channels=1)
    item = forecasting_windows(data["train"], config, stride=500)[0]
    assert item["past_values"].shape == (28,) and item["future_values"].shape == (8,)
    assert torch.isfinite(AutoformerForPrediction(config)(**default_collate([item, item])).loss)


def test_windows_work_as_trainer_dataset(appliances, tmp_path):
    from transformers import Trainer, TrainingArguments

    config = patchtst_config()
    model = PatchTSTForPrediction(config)
    before = [p.detach().clone() for p in model.parameters()]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=forecasting_windows(appliances["train"], config, stride=500)).train()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_csv_input_and_missing_values(tmp_path):
    stamps = pd.date_range("2024-01-01", periods=200, freq="h")
    frame = pd.DataFrame({"when": stamps, "load": np.arange(200.0), "temp": np.sin(np.arange(200.0)), "site": "a"})
    frame.loc[5, "temp"] = np.nan
    frame = frame.iloc[::-1]  # rows out of order: the split must still be chronological
    path = tmp_path / "series.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"\['site'\] are not numeric"):  # a text column is never dropped silently
        load_forecasting_csv(path, timestamp_column="when", sort_timestamps=True)
    with pytest.raises(ValueError, match="not in time order"):  # nor are rows reordered silently
        load_forecasting_csv(path, timestamp_column="when", drop_columns=["site"])
    options = dict(timestamp_column="when", drop_columns=["site"], sort_timestamps=True)
    data = load_forecasting_csv(path, **options)
    assert {n: len(s) for n, s in data.items()} == {"train": 140, "validation": 20, "test": 40}
    assert data["train"].column_names == ["when", "load", "temp"]
    stats = standardization_of(data)
    assert stats.mean[0] == pytest.approx(69.5)  # mean of 0..139: training rows only
    config = patchtst_config(channels=2, context=16, horizon=8)
    windows = forecasting_windows(data["train"], config)
    assert not windows[0]["past_observed_mask"][5, 1] and windows[0]["past_values"][5, 1] == 0
    assert load_forecasting_dataset(str(path), **options)["test"][0] == data["test"][0]


def test_datasets_inputs(appliances, tmp_path):
    import datasets

    table = datasets.Dataset.from_pandas(pd.read_csv(appliances_energy_csv()).iloc[:1000])
    from_dataset = prepare_forecasting(table, drop_columns=["rv1", "rv2"])
    assert len(from_dataset["train"]) == 700 and from_dataset["train"].column_names[0] == "date"
    single = prepare_forecasting(datasets.DatasetDict({"train": table}), drop_columns=["rv1", "rv2"])
    assert single["test"][0] == from_dataset["test"][0]
    # an already split DatasetDict keeps its splits; statistics come from its train split
    resplit = prepare_forecasting(appliances)
    assert {n: len(s) for n, s in resplit.items()} == {n: len(s) for n, s in appliances.items()}
    folder = tmp_path / "saved"
    from_dataset.save_to_disk(str(folder))
    reloaded = load_forecasting_dataset(str(folder))
    assert len(reloaded["validation"]) == 100
    csv_folder = tmp_path / "csvs"
    csv_folder.mkdir()
    pd.read_csv(appliances_energy_csv()).iloc[:500].to_csv(csv_folder / "part.csv", index=False)
    assert len(load_forecasting_dataset(str(csv_folder), drop_columns=["rv1", "rv2"])["train"]) == 350


def test_built_in_names_load_their_data_and_a_local_path_of_that_name_wins(tmp_path, monkeypatch):
    electricity = load_forecasting_dataset("electricity")
    assert {name: len(split) for name, split in electricity.items()} == {
        "train": 18412,
        "validation": 2632,
        "test": 5260,
    }
    assert list(standardization_of(electricity["train"]).columns) == ["y"]
    first, last = electricity["train"][0]["ts"], electricity["test"][-1]["ts"]
    assert (str(first), str(last)) == ("2012-01-01 00:00:00", "2014-12-31 23:00:00")
    assert describe_source("electricity").startswith("hourly electricity (built in")
    bikes = load_forecasting_dataset("bikesharing")
    stats = standardization_of(bikes["train"])
    assert (list(stats.target_columns), list(stats.columns)) == (["count"], ["count", "tmin", "tmax", "pn"])
    assert sum(len(split) for split in bikes.values()) == 78421
    assert load_forecasting_dataset("bikesharing", columns=["count"])["train"].column_names == ["ts", "count"]
    assert describe_source(None).startswith("UCI Appliances Energy")
    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"when": pd.date_range("2024-01-01", periods=40, freq="h"), "v": np.arange(40.0)}).to_csv(
        tmp_path / "local.csv", index=False
    )
    (tmp_path / "electricity").mkdir()
    (tmp_path / "local.csv").rename(tmp_path / "electricity" / "part.csv")
    local = load_forecasting_dataset("electricity")  # the user's folder, not the built-in
    assert sum(len(split) for split in local.values()) == 40
    assert describe_source("electricity") == "electricity"


def test_error_cases(appliances, tmp_path):
    frame = pd.DataFrame({"date": pd.date_range("2024-01-01", periods=50, freq="D"), "name": ["x"] * 50})
    with pytest.raises(ValueError, match="no numeric columns"):
        prepare_forecasting(frame)
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['nope'\]"):
        load_appliances_energy(columns=["Appliances", "nope"])
    with pytest.raises(ValueError, match="not numeric"):
        prepare_forecasting(frame.assign(v=1.0), columns=["name"])
    with pytest.raises(ValueError, match="timestamp_column='when' is not a column"):
        prepare_forecasting(frame.assign(v=1.0), timestamp_column="when")
    with pytest.raises(ValueError, match="too few to split"):
        prepare_forecasting(pd.DataFrame({"v": [1.0, 2.0, 3.0]}))
    with pytest.raises(ValueError, match="split_ratios"):
        prepare_forecasting(frame.assign(v=1.0), split_ratios=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="fewer than one window needs"):
        forecasting_windows(appliances["validation"], patchtst_config(context=2000))
    with pytest.raises(ValueError, match="num_input_channels=26"):
        forecasting_windows(appliances["train"], patchtst_config(channels=3))
    with pytest.raises(ValueError, match=f"num_time_features={NUM_TIME_FEATURES}"):
        forecasting_windows(appliances["train"], seq2seq_config(InformerConfig, num_time_features=2))
    with pytest.raises(ValueError, match="stride"):
        forecasting_windows(appliances["train"], patchtst_config(), stride=0)
    no_time = prepare_forecasting(pd.DataFrame({"v": np.arange(300.0)}))
    with pytest.raises(ValueError, match="no timestamp column"):
        forecasting_windows(no_time["train"], seq2seq_config(AutoformerConfig, channels=1))
    with pytest.raises(ValueError, match="carries no standardisation"):
        import datasets

        forecasting_windows(datasets.Dataset.from_dict({"v": [1.0] * 100}), patchtst_config(channels=1))
    with pytest.raises(ValueError, match="not a CSV"):
        (tmp_path / "x.json").write_text("{}")
        load_forecasting_dataset(str(tmp_path / "x.json"))
    with pytest.raises(ValueError, match="model_type='bert'"):
        from transformers import BertConfig

        forecasting_windows(appliances["train"], BertConfig())
