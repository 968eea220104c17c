"""The search over forms: per Linear of a dense model, dense, a full-rank low-bit weight, low-rank or CP factors at a
width, or a Biprop mask, chosen by the RL agent under a byte budget as stored; every form trains in the precision it
is stored in; the model saves each Linear packed in its form (``method="mixed"``) and loads back scoring the same."""

from __future__ import annotations

import random

import pytest
import torch
from smartformer_fixtures import assert_forecasts_in_new_processes, dense_patchtst, search_trainer, sines
from transformers import TrainerCallback, TrainingArguments

from hf_tensorcompress import CompressionConfig, apply_compression
from hf_tensorcompress.core.metrics import linear_bytes
from hf_tensorcompress.loading import load_model
from hf_tensorcompress.search import SearchConfig
from hf_tensorcompress.search.allocators import (
    allocation_bytes,
    greedy_allocation,
    measure_form_sensitivity,
    random_allocation,
    uniform_forms,
)
from hf_tensorcompress.search.form_swap import change_forms, prepare_for_forms
from hf_tensorcompress.search.forms import FORM_KINDS, Form, form_bytes, form_spec, linear_slots, pareto_front
from hf_tensorcompress.search.mdp import RankSearch
from hf_tensorcompress.search.trainer import SmartformerTrainer

FORMS = dict(forms=FORM_KINDS, factor_widths=(8, 4, 2, "ternary"), keep_ratios=(0.5,), weight_group_sizes=(16,))


def search_config(budget: float, **overrides) -> SearchConfig:
    options = dict(interval=2, consecutive_actions=2, max_actions_per_layer=3, byte_budget=budget, **FORMS)
    return SearchConfig(**{**options, **overrides})


def test_every_form_costs_what_its_layer_stores():
    """The bytes the budget counts are those of the layer the form builds (apply_compression of that form)."""
    model = dense_patchtst(layers=1)
    slots = linear_slots(model, search_config(1 / 8))
    kinds = {form.kind for slot in slots for form in slot.actions}
    assert kinds == set(FORM_KINDS)
    cp_slots = {slot.name for slot in slots if any(form.kind == "cp" for form in slot.actions)}
    assert cp_slots and all(name.endswith(("q_proj", "k_proj", "v_proj")) for name in cp_slots)  # cp: attention only
    for slot in slots:
        forms = {form.kind: form for form in slot.actions}  # one form of each kind
        for form in forms.values():
            options = form.options(slot.factor_group_size, 2)
            if options is None:
                assert slot.bytes_at(form) == slot.dense_bytes
                continue
            built = apply_compression(
                dense_patchtst(layers=1), CompressionConfig(method="mixed", forms={slot.name: options})
            )
            layer = built.get_submodule(slot.name)
            assert slot.bytes_at(form) == layer.storage_bits() / 8 == linear_bytes(built)["modules"][slot.name]["disk"]
            seeded = ("sign_seed", "sign_check", "save_scores")  # biprop's per-layer seed; scores kept while training
            assert {k: v for k, v in layer.spec().items() if k not in seeded} == {
                k: v for k, v in form_spec(slot, form).items() if k not in seeded
            }


def test_config_checks_the_form_fields():
    with pytest.raises(ValueError, match="forms=\\['quantized'\\]"):
        SearchConfig(forms=("quantized",))
    with pytest.raises(ValueError, match="byte_budget, not param_budget"):
        SearchConfig(forms=("lowbit",), factor_widths=(4,), param_budget=0.5)
    with pytest.raises(ValueError, match="factor_widths"):
        SearchConfig(forms=("lowbit",))
    with pytest.raises(ValueError, match="keep_ratios"):
        SearchConfig(forms=("biprop",), keep_ratios=(0.0,))


def test_fp16_biases_cost_half_in_every_lowbit_form_and_the_searched_model_stores_them_so(tmp_path):
    half, plain = (
        linear_slots(dense_patchtst(layers=1), search_config(1 / 8, bias_dtype=d)) for d in ("float16", "model")
    )
    for slot, model_slot in zip(half, plain):
        for form in slot.actions:
            saved = 2 * slot.out_features if form.kind == "lowbit" and slot.bias else 0  # fp16: 2 bytes, not 4
            assert model_slot.bytes_at(form) - slot.bytes_at(form) == saved
    trainer = train_search(tmp_path / "run", 1 / 8, forms=("lowbit",), bias_dtype="float16")
    trainer.train()
    forms = trainer.model.config.compression_config["forms"]
    assert forms and all(form["bias_dtype"] == "float16" for form in forms.values())
    trainer.model.save_pretrained(tmp_path / "saved")
    loaded = load_model(tmp_path / "saved")
    assert {loaded.get_submodule(name).bias.dtype for name in forms} == {torch.float16}
    with pytest.raises(ValueError, match="bias_dtype='bf16'"):
        search_config(1 / 8, bias_dtype="bf16")
    with pytest.raises(ValueError, match="bias_dtype='bf16'"):
        SearchConfig(bias_dtype="bf16")  # refused without forms too, not ignored


def train_search(folder, budget: float, steps: int = 40, save_steps: int | None = None, **overrides):
    """A short search over forms on a tiny dense PatchTST (``eval_dataset``: held-out sines)."""
    return search_trainer(folder, search_config(budget, **overrides), steps, save_steps)


def test_search_over_forms_meets_its_budget_and_saves_every_linear_packed(tmp_path):
    trainer = train_search(tmp_path / "run", 1 / 8)
    trainer.train()
    search = trainer.search
    assert search.done
    model = trainer.model
    rows = linear_bytes(model)["modules"]
    names = [slot.name for slot in search.groups]
    assert sum(rows[name]["disk"] for name in names) <= sum(rows[name]["dense"] for name in names) / 8
    recorded = model.config.compression_config
    assert recorded["method"] == "mixed"
    for slot in search.groups:  # every Linear holds the form the search decided, and the config records it
        form = search.chosen[slot.name]
        layer = model.get_submodule(slot.name)
        assert getattr(layer, "layer_type", "dense") == form.kind
        assert recorded["forms"].get(slot.name) == form.options(slot.factor_group_size, slot.cp_iterations) or (
            form.kind == "biprop" and recorded["forms"][slot.name]["save_scores"] is False
        )
        assert rows[slot.name]["disk"] == slot.bytes_at(form)
    model.eval()
    past = sines(200, seed=3)[0]["past_values"][None]
    with torch.no_grad():
        expected = model(past_values=past).prediction_outputs
    model.save_pretrained(tmp_path / "saved")
    loaded = load_model(tmp_path / "saved").eval()
    for name in recorded["modules"]:  # packed in RAM: no fp32 weight behind a low-bit one, no Biprop scores
        layer = loaded.get_submodule(name)
        assert getattr(layer, "stored", True) and getattr(layer, "trainable", False) is False
    with torch.no_grad():
        assert torch.allclose(loaded(past_values=past).prediction_outputs, expected, atol=1e-5)
    torch.save({"past": past, "expected": expected}, tmp_path / "io.pt")


def test_a_form_change_keeps_the_optimizer_in_the_models_order(tmp_path):
    """After the search swapped layers, the optimizer holds exactly the model's trainable parameters, in the model's
    order (what a resumed run's fresh optimizer holds), and the bias of a swapped Linear kept its Adam state."""
    trainer = train_search(tmp_path / "run", 1 / 8, steps=12)
    trainer.train()
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    held = [p for group in optimizer.param_groups for p in group["params"]]
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    assert {id(p) for p in held} == {id(p) for p in trainable} and len(held) == len(trainable)
    order = {id(p): i for i, p in enumerate(trainable)}
    for group in optimizer.param_groups:
        positions = [order[id(p)] for p in group["params"]]
        assert positions == sorted(positions)
    changed = [s for s in trainer.search.groups if trainer.search.chosen[s.name] != Form("dense")]
    assert changed
    bias = trainer.model.get_submodule(changed[0].name).bias
    assert bias is not None and optimizer.state[bias]["step"] == 12


@pytest.mark.slow
def test_searched_forms_load_in_a_new_process_natively_and_with_remote_code(tmp_path):
    test_search_over_forms_meets_its_budget_and_saves_every_linear_packed(tmp_path)
    assert_forecasts_in_new_processes(tmp_path)


class StopAt(TrainerCallback):
    """Ends training after optimizer step ``step``: a run of ``max_steps`` interrupted there (its learning-rate
    schedule is that of the whole run, which a shorter ``max_steps`` would not be)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = control.should_training_stop or state.global_step == self.step


@pytest.mark.slow
@pytest.mark.parametrize(
    "start,scales", [("dense", ("rounded",)), ("lowbit:2/g16", ("rounded",)), ("lowbit:2/g16/learned", ("learned",))]
)
def test_search_over_forms_resumes_from_a_checkpoint_where_it_stopped(tmp_path, start, scales):
    """A checkpoint inside the search holds every Linear in its current form (Biprop with its scores); resuming
    rebuilds those forms, from dense or from the start form, and continues with the same decisions, and the same
    training, as an uninterrupted run (learned scales: read back from the checkpoint with the weights behind them)."""
    whole = train_search(tmp_path / "whole", 1 / 8, steps=20, start=start, weight_scales=scales)
    whole.train()
    first = train_search(tmp_path / "part", 1 / 8, steps=20, save_steps=8, start=start, weight_scales=scales)
    first.add_callback(StopAt(8))
    first.train()
    assert not first.search.done and any(f.label() != start for f in first.search.chosen.values())
    assert any(f.label() == start for f in first.search.chosen.values())  # undecided Linears still in the start form
    resumed = train_search(tmp_path / "part", 1 / 8, steps=20, save_steps=8, start=start, weight_scales=scales)
    resumed.train(resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-8"))
    assert resumed.search.chosen == whole.search.chosen
    assert [r["chosen"] for r in resumed.search.trace] == [r["chosen"] for r in whole.search.trace]
    assert [r["metric"] for r in resumed.search.trace] == [r["metric"] for r in whole.search.trace]


@pytest.mark.parametrize(("policy", "replay"), [("argmax", 0), ("sample", 0), ("argmax", 3)])
def test_the_search_state_round_trips_every_draw_and_update(tmp_path, policy, replay):
    """``RankSearch.save`` / ``load`` carry the agent (weights and Adam), its random draws, the pending action,
    the layer being searched and the transitions replay refits on: a search stopped after any stage and loaded into
    a fresh one makes the decisions of one that never stopped (drawing from π, or replaying, too)."""
    slots = linear_slots(dense_patchtst(layers=1), search_config(1 / 8))
    # exploring: every stage draws from the RNG
    config = search_config(1 / 8, epsilon_end=0.5, policy=policy, replay_epochs=replay)
    metrics = [0.9 - 0.05 * stage + 0.03 * (stage % 3) for stage in range(12)]

    def search() -> RankSearch:
        return RankSearch(slots, {}, config, chosen={slot.name: Form("dense") for slot in slots})

    whole = search()
    expected = [whole.end_stage(stage, metric) for stage, metric in enumerate(metrics)]
    for stop in (3, 6):
        first = search()
        for stage in range(stop):
            first.end_stage(stage, metrics[stage])
        first.save(str(tmp_path))
        resumed = search()
        resumed.load(str(tmp_path))
        records = [resumed.end_stage(stage, metrics[stage]) for stage in range(stop, len(metrics))]
        assert records == expected[stop:] and resumed.chosen == whole.chosen


def test_allocators_over_forms_stay_within_their_bytes():
    """One form everywhere at the most bytes that fit, random forms and the greedy allocation: each within the bytes
    it is given; a form that cannot take every Linear (cp: the attention's q/k/v only) has no uniform allocation."""
    slots = linear_slots(dense_patchtst(layers=1), search_config(1 / 8))
    budget = sum(slot.dense_bytes for slot in slots) / 8  # the tiny model's biases: 2-bit weights cost 1/6
    lowbit = uniform_forms(slots, 2 * budget, "lowbit")
    assert {form.kind for form in lowbit.values()} == {"lowbit"} and allocation_bytes(slots, lowbit) <= 2 * budget
    assert len({(form.bits, form.group) for form in lowbit.values()}) == 1
    svd = uniform_forms(slots, 2 * budget, "svd")  # any rank, not only the candidates
    assert {form.kind for form in svd.values()} == {"svd"}
    assert sum(form_bytes(s, svd[s.name]) for s in slots) <= 2 * budget
    assert uniform_forms(slots, budget, "cp") is None
    assert uniform_forms(slots, budget, "lowbit") is None  # nothing that small
    for draw in range(5):
        assert allocation_bytes(slots, random_allocation(slots, budget, random.Random(draw))) <= budget
    # greedy: every form free on one Linear, costly everywhere else: that Linear takes the cheapest form
    free = slots[-1].name
    sensitivity = {
        slot.name: {form: 0.0 if slot.name == free else 1.0 / slot.bytes_at(form) for form in slot.actions}
        for slot in slots
    }
    greedy = greedy_allocation(slots, budget, sensitivity)
    assert allocation_bytes(slots, greedy) <= budget
    assert greedy[free] == min(slots[-1].actions, key=slots[-1].bytes_at)


def test_sensitivity_is_the_loss_increase_of_one_linear_in_each_form():
    model = dense_patchtst(layers=1).eval()
    slots = linear_slots(model, search_config(1 / 8, forms=("dense", "lowbit", "biprop")))
    batch = sines(200, seed=1)[0]
    inputs = {key: value[None] for key, value in batch.items()}

    def loss(m):
        return float(m(**inputs).loss)

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    sensitivity = measure_form_sensitivity(model, slots[:2], loss)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())  # the model is as it was
    for slot in slots[:2]:
        assert sensitivity[slot.name][Form("dense")] == 0.0
        for form in slot.actions:
            if form.kind == "dense":
                continue
            changed = apply_compression(
                dense_patchtst(layers=1).eval(),
                CompressionConfig(method="mixed", forms={slot.name: form.options(slot.factor_group_size, 12)}),
            )
            assert sensitivity[slot.name][form] == pytest.approx(loss(changed) - loss(model), abs=1e-6)


def test_pareto_front_keeps_the_forms_nothing_beats_in_bytes_and_loss():
    slot = linear_slots(dense_patchtst(layers=1), search_config(1 / 8, forms=("dense", "lowbit", "biprop")))[1]
    losses = {form: 1.0 / slot.bytes_at(form) for form in slot.actions}  # more bytes, less loss: all efficient
    by_bytes = sorted({slot.bytes_at(f) for f in slot.actions})
    assert {slot.bytes_at(slot.actions[i]) for i in pareto_front(slot, losses)} == set(by_bytes)
    worst = max(slot.actions, key=slot.bytes_at)
    losses[worst] = 10.0  # the costliest form loses the most: dominated
    assert slot.actions.index(worst) not in pareto_front(slot, losses)


def test_front_only_search_chooses_on_each_linears_front(tmp_path):
    trainer = train_search(tmp_path / "run", 1 / 2, front_only=True, reward="validation_loss")  # a loose wall
    trainer.train()
    search = trainer.search
    assert search.done and set(search.front) == {slot.name for slot in search.groups}
    for slot in search.groups:
        front = {slot.actions[i] for i in search.front[slot.name]}
        taken = {action for action in search.actions[slot.name]}
        assert len(front) < len(slot.actions) and taken <= front


def test_pacing_spends_the_budget_across_the_linears(tmp_path):
    """Paced, every Linear's form costs about its share of the bytes left, so the search ends near its budget; with
    the wall alone it may end far below it (whatever the first actions took)."""
    spent = {}
    for pace in (None, 0.25):
        trainer = train_search(tmp_path / f"run-{pace}", 1 / 4, steps=60, pace=pace)  # time to decide every Linear
        trainer.train()
        search = trainer.search
        assert search.done
        budget = sum(slot.dense_bytes for slot in search.groups) / 4
        spent[pace] = allocation_bytes(search.groups, search.chosen) / budget
        for record in search.trace:
            if pace is not None and "action" in record:  # every action within ± pace of its share (or the closest)
                assert (
                    record.get("share") is None
                    or abs(record["cost"] / record["share"] - 1) <= pace + 1e-9
                    or (record["closest"])
                )
    assert 1 - 0.25 - 0.1 <= spent[0.25] <= 1.0 and spent[0.25] >= spent[None]


def test_form_labels_and_a_search_that_starts_from_low_bit_weights(tmp_path):
    labels = ("dense", "lowbit:2/row", "lowbit:ternary/g32", "lowbit:2/g8/learned", "lowbit:1/g128", "svd:r8:4")
    labels += ("svd:r8:1", "cp:r3:None")
    for label in (*labels, "biprop:0.5"):
        assert Form.from_label(label).label() == label
    assert Form.from_label("lowbit:2/g8/learned") == Form("lowbit", 2, group=8, scales="learned")
    wrong = ("lowbit:2", "lowbit:None/row", "lowbit:5/g32", "lowbit:2/g8/", "lowbit:2/g8/lsq", "svd:r8", "svd:8:4")
    for label in (*wrong, "dense:", "int4", ""):
        with pytest.raises(ValueError, match="e.g. lowbit:2/row"):
            Form.from_label(label)
    with pytest.raises(ValueError, match="start='lowbit:2/row': a form of one of forms=\\['svd'\\]"):
        SearchConfig(forms=("svd",), factor_widths=(2,), start="lowbit:2/row")
    with pytest.raises(ValueError, match="start='lowbit:2/row': options of the search over forms; pass forms"):
        SearchConfig(start="lowbit:2/row")
    with pytest.raises(ValueError, match="start must be a form label"):
        SearchConfig(forms=("lowbit",), factor_widths=(2,), start=2)
    with pytest.raises(ValueError, match="e.g. lowbit:2/row"):
        train_search(tmp_path / "bad", 1 / 6, start="lowbit:2")
    with pytest.raises(ValueError, match="start from 'dense' or one of: .*lowbit:2/g16"):  # 3 bits: not a listed width
        train_search(tmp_path / "bad", 1 / 6, start="lowbit:3/g16")
    trainer = train_search(tmp_path / "run", 1 / 6, start="lowbit:4/g16", steps=2)
    assert {type(trainer.model.get_submodule(s.name)).__name__ for s in trainer.search.groups} == {"LowBitLinear"}
    assert trainer.model.config.compression_config["forms"][trainer.search.groups[0].name]["weight_bits"] == 4
    trainer.train()  # the agent's first action moves one Linear away from the start form
    first = trainer.search.trace[0]
    assert first["previous_bits"] == 4 and first["form_changes"] == {first["layer"]: first["action"]}


def test_a_search_over_learned_scales_gives_the_optimizer_each_widths_new_scales_and_saves_them(tmp_path):
    """With ``weight_scales=("learned",)`` every low-bit form trains its scales; a width change replaces them (in the
    optimizer too, in the model's order), and the saved model scores as the trained one did."""
    with pytest.raises(ValueError, match="weight_scales=\\['lsq'\\]: distinct values among"):
        search_config(1 / 6, weight_scales=("lsq",))
    trainer = train_search(
        tmp_path / "run", 1 / 6, steps=24, forms=("lowbit",), weight_scales=("learned",), start="lowbit:8/g16/learned"
    )
    slots = trainer.search.groups
    assert all(form.scales == "learned" for slot in slots for form in slot.actions)
    trainer.train()
    assert any(record["previous_bits"] != record["chosen"] for record in trainer.search.trace)
    model = trainer.model
    layers = [model.get_submodule(slot.name) for slot in slots]
    assert all(layer.learned_scales for layer in layers)
    assert {layer.bits for layer in layers} != {8}  # widths changed in place, each with new scales
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    held = [p for group in optimizer.param_groups for p in group["params"]]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in held} == {id(p) for p in trainable} and len(held) == len(trainable)
    order = {id(p): i for i, p in enumerate(trainable)}
    for group in optimizer.param_groups:  # each group in the model's order
        positions = [order[id(p)] for p in group["params"]]
        assert positions == sorted(positions)
    steps = [int(optimizer.state[layer.scale]["step"]) if layer.scale in optimizer.state else 0 for layer in layers]
    changed = [step for step, layer in zip(steps, layers) if layer.bits != 8]
    assert max(changed) > 0 and all(step < 24 for step in changed)  # new scales, trained since their change
    assert all(step == 24 for step, layer in zip(steps, layers) if layer.bits == 8)
    assert model.config.compression_config["forms"][slots[0].name]["weight_scales"] == "learned"
    model.eval()
    past = sines(200, seed=3)[0]["past_values"][None]
    with torch.no_grad():
        expected = model(past_values=past).prediction_outputs
    model.save_pretrained(tmp_path / "saved")
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path / "saved")(past_values=past).prediction_outputs, expected)


def test_rounded_and_learned_scales_are_separate_actions_and_a_change_between_them_builds_a_new_layer():
    """Offered both ways, each low-bit form is two actions at the same bytes; moving a Linear from rounded to learned
    scales builds a learned layer from the weight the rounded one trains, and the old parameters leave."""
    model = dense_patchtst(layers=1)
    config = search_config(1 / 6, forms=("dense", "lowbit"), factor_widths=(2,), weight_scales=("rounded", "learned"))
    slot = linear_slots(model, config)[1]
    rounded, learned = Form("lowbit", 2, group=16), Form("lowbit", 2, group=16, scales="learned")
    assert set(slot.actions) == {Form("dense"), rounded, learned}
    assert slot.bytes_at(rounded) == slot.bytes_at(learned)
    prepare_for_forms(model, [slot])
    change_forms(model, {slot.name: slot}, {slot.name: rounded})
    before = model.get_submodule(slot.name)
    removed = change_forms(model, {slot.name: slot}, {slot.name: learned})
    after = model.get_submodule(slot.name)
    assert after is not before and after.learned_scales and not before.learned_scales
    assert after.bias is before.bias and [id(p) for p in removed] == [id(before.latent)]  # the bias stays
    torch.testing.assert_close(after.latent, before.latent)
    torch.testing.assert_close(after.weight, before.weight)  # started from the scales the rounded layer used


def test_a_warmup_trains_the_start_forms_before_the_agent_first_acts(tmp_path):
    """With ``warmup`` the first stage ends ``interval`` steps after it, and neither the stage metric nor the
    Taylor importance counts a warmup step: the agent's first reward is of the trained model alone."""
    trainer = train_search(tmp_path / "run", 1 / 8, steps=50, warmup=10, reward="loss")
    counted = {"metric": [], "importance": []}
    add_metric, accumulate = trainer._add_metric, trainer.search.importance.accumulate

    def recording_metric(value):
        counted["metric"].append(trainer.state.global_step)
        add_metric(value)

    def recording_importance(model):
        counted["importance"].append(trainer.state.global_step)
        accumulate(model)

    trainer._add_metric, trainer.search.importance.accumulate = recording_metric, recording_importance
    forms_at_warmup_end = {}

    class Look(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 10:
                forms_at_warmup_end.update(trainer.search.chosen)

    trainer.add_callback(Look())
    trainer.train()
    trace = trainer.search.trace
    assert trace[0]["step"] == 12 and trainer.search.done
    assert set(forms_at_warmup_end.values()) == {Form("dense")}  # the start form throughout the warmup
    assert min(counted["metric"]) == 10 and min(counted["importance"]) == 10  # the 11th step is the first counted


def test_a_warmup_the_run_never_leaves_is_refused_before_the_model_changes(tmp_path):
    with pytest.raises(ValueError, match="warmup"):
        SearchConfig(warmup=-1)
    with pytest.raises(ValueError, match="warmup"):
        SearchConfig(warmup=True)
    model = dense_patchtst(layers=1)
    before = {name: type(module) for name, module in model.named_modules()}
    args = TrainingArguments(str(tmp_path / "run"), max_steps=40, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="warmup=40.*40 steps"):
        SmartformerTrainer(model=model, args=args, train_dataset=sines(400), search=search_config(1 / 8, warmup=40))
    assert {name: type(module) for name, module in model.named_modules()} == before  # no Linear took a form


def test_a_budget_below_every_linears_cheapest_form_is_refused_before_the_model_changes(tmp_path):
    """A search that cannot fit its bytes even with every Linear at its cheapest form would end over the budget
    (and the recipe's note would blame the steps): the trainer refuses it, naming the floor, as greedy_forms does."""
    model = dense_patchtst(layers=1)
    before = {name: type(module) for name, module in model.named_modules()}
    args = TrainingArguments(str(tmp_path / "run"), max_steps=40, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match=r"byte_budget=0.001: the cheapest form of every Linear takes 0\.\d+"):
        SmartformerTrainer(model=model, args=args, train_dataset=sines(400), search=search_config(1 / 1000))
    assert {name: type(module) for name, module in model.named_modules()} == before
