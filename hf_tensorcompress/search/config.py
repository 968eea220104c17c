"""``SearchConfig``: every knob of the Smartformer rank search, validated, with a JSON round trip."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..core.json_config import JsonConfig
from ..methods.lowbit.config import BIAS_DTYPES, WEIGHT_SCALES
from ..runtime.marker import FACTOR_WIDTHS, INPUT_ROTATIONS, check_rotation_block

INTERVAL_UNITS = ("steps", "epochs")
#: The forms the search over forms chooses among for a Linear (``forms.FORM_KINDS``; here without torch).
FORM_KINDS = ("dense", "lowbit", "svd", "cp", "biprop")
REWARDS = ("loss", "accuracy", "validation_loss")
#: The paper's tolerances: ε = 1.125 for the loss reward (14), ε = 0.1 for the accuracy reward (13); the
#: validation-loss reward is (14) on held-out batches, with the same ε.
DEFAULT_TOLERANCE = {"loss": 1.125, "accuracy": 0.1, "validation_loss": 1.125}
#: What each undecided Linear's share of the bytes left (``pace``) is proportional to: its fp32 bytes, or its bytes in
#: the greedy allocation by measured sensitivity.
SHARE_BY = ("fp32_bytes", "sensitivity")
#: What an action's loss is compared with (``reward_baseline``).
REWARD_BASELINES = ("previous_stage", "same_weights")
#: How the agent picks an action when it does not explore (``policy``): the actor's most probable, or a draw from it.
POLICIES = ("argmax", "sample")
#: ``start``: every searched Linear starts in the greedy allocation by measured sensitivity (at the first stage end).
GREEDY_START = "greedy"


def _positive_int(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _probability(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


@dataclass
class SearchConfig(JsonConfig):
    """How the reinforcement-learning rank search runs while a ``SmartformerTrainer`` trains.

    Args:
        interval: length of a stage (the paper's E): optimizer steps or epochs between two actions.
        interval_unit: ``"steps"`` (optimizer steps) or ``"epochs"``.
        warmup: optimizer steps (or epochs, with ``interval_unit="epochs"``) the model trains in its start forms
            before the first stage begins. From 0 (the paper's) the agent acts on a barely trained model, whose loss
            falls after any action and whose layers are all equally insensitive; after a warmup its rewards and
            ``front_only``'s measurements are of a trained model (the sensitivity a greedy allocator reads).
        max_candidates: the action space holds every rank when a layer has at most this many candidate ranks,
            otherwise this many ranks at evenly spaced parameter ratios 1/n … 1 of the dense layer.
        reward: ``"loss"`` (paper eq. 14, for forecasting) or ``"accuracy"`` (eq. 13, for classification; the
            accuracy of the training batches' ``logits`` against ``labels``), or ``"validation_loss"``: eq. 14 on
            the loss of the same ``validation_batches`` batches of the trainer's ``eval_dataset`` at every stage
            end (not the training batches, which differ from stage to stage and reward mini-batch luck).
        validation_batches: batches of ``eval_dataset`` behind the validation-loss reward (its first ones, in order).
        tolerance: ε of the reward; ``None`` takes the paper's value (1.125 for loss, 0.1 for accuracy).
        epsilon_start: ε-greedy exploration at the first action; after ``t`` actions
            ``ε_t = max(epsilon_end, epsilon_start · epsilon_decay**t)``, compared with a *uniform* draw.
        epsilon_end: the floor of ε.
        epsilon_decay: the factor ε shrinks by per action.
        policy: what the agent does when it does not explore: ``"argmax"`` (the paper's ε-greedy) takes the actor's
            most probable action, so a layer is decided after k actions unless a reward moves the actor's argmax
            within them; ``"sample"`` draws from π, as actor-critic acts on-policy, so a layer's allowed forms are
            tried in proportion to the probability the rewards give them and a layer whose k actions do not agree
            is decided at ``max_actions_per_layer`` by the actor's most probable form (without a cap, only k
            agreeing draws decide it).
        consecutive_actions: k, a layer is decided when its last k actions chose the same rank (paper: 5).
        max_actions_per_layer: a safeguard the paper lacks: after this many actions without k agreeing, the
            layer is decided at the agent's greedy rank, so the search always ends. ``None`` disables it.
        param_budget: optional fraction in (0, 1] of the dense parameters (weights + biases) of all searched projections that the
            compressed ones may keep in the end. Enforced as AMC's action wall: a rank is only offered if the
            budget can still be met with every other undecided layer at its smallest rank.
        byte_budget: optional fraction in (0, 1] of the fp32 bytes (weights + biases) of all searched layers that
            they may take as stored in the end (factor codes, scales and biases), the same AMC wall in bytes; the
            reward is unchanged (the loss), the budget decides which (rank, width) actions exist. Not with
            ``param_budget``.
        factor_widths: the factor bit widths the agent chooses among for every searched layer besides its rank
            (each of 16, 8, 4, 3, 2, ``"ternary"``, 1, or ``None`` for fp32 factors: what ``factor_bits`` stores, 16 as
            bfloat16, ternary as BitNet b1.58's three levels per group, five codes a byte); the factors then
            train quantization-aware at the width currently chosen (straight-through, rounded as that width stores)
            and the final model saves them packed with per-layer ``factor_bits``. ``None``: ranks only, factors as they are. Needs SVD layers.
        factor_group_size: group size of the low-bit factors' scales (rows that it does not divide use one group).
        forms: the search over forms (``search.forms``): for every targeted Linear of a *dense* model, the agent
            chooses among these forms: ``"dense"``; ``"lowbit"`` (the full weight at each of ``factor_widths`` and
            ``weight_group_sizes``); ``"svd"`` (each candidate rank, factors at each width); ``"cp"`` (the same, for
            the attention's q/k/v projections); ``"biprop"`` (a 1-bit mask at each of ``keep_ratios``, started from
            the trained weights, the Linear's bias kept). Every form trains in the precision it is stored in; the
            model records the chosen forms as ``method="mixed"`` and saves each Linear packed. ``None``: the rank
            (and width) search over the attention groups of a ``cp``/``svd`` model.
        target_modules: the Linears the search over forms acts on (names, suffixes or a regex); ``None``: every
            Linear but a language model's output head.
        keep_ratios: the keep ratios of the ``"biprop"`` form.
        weight_group_sizes: the group sizes of the ``"lowbit"`` form's weights (input columns per scale); larger
            groups cost fewer bytes (2 bits in groups of 32: 3 bits a weight; of 128: 2.25).
        weight_scales: how the ``"lowbit"`` form's group scales are set (``LowBitConfig.weight_scales``), each
            offered at every width and group size: ``"rounded"`` (from the weights at every step) and/or
            ``"learned"`` (trained with the weights, started from the rounded ones; a width change starts them
            afresh, and the optimizer takes the new ones). The bytes are the same.
        input_rotations: how the ``"lowbit"`` form's inputs are rotated before the weight
            (``LowBitConfig.input_rotation``), each offered at every width, group size and way of setting the scales:
            ``"none"``, ``"hadamard"`` and/or ``"randomized-hadamard"``. A Linear whose inputs ``rotation_block`` does
            not divide takes its low-bit forms unrotated. The signs cost one bit an input.
        rotation_block: the inputs a rotation mixes (``LowBitConfig.rotation_block``), a power of two.
        bias_dtype: the ``"lowbit"`` form's bias (``LowBitConfig.bias_dtype``): ``"model"`` (as the model holds it)
            or ``"float16"`` (trained and stored in fp16: half an fp32 bias's bytes, left to the weights). The other
            forms keep their biases as the model holds them.
        start: the form every searched Linear starts in (a ``Form`` label: ``"dense"``, ``"lowbit:2/g32"``,
            ``"biprop:0.5"``, ...); the agent then moves each one to the form it chooses. ``"dense"`` is the model as
            given; any other start must be a form the search may choose for every searched Linear (one of ``forms``
            at a listed width, group size or keep ratio), since a Linear left undecided keeps it. Starting from a
            form that trains well at few bytes (a 2-bit weight) lets the reward, measured a stage after each change,
            compare the cheaper forms with it instead of with the dense layer. ``"greedy"``: the Linears train as given
            until the first stage ends; there every Linear alone is put in each of its forms and scored on the
            ``validation_batches`` (as ``share_by="sensitivity"`` measures them, once for both), and every Linear moves
            to its form in the greedy allocation by those losses within ``byte_budget`` (``greedy_forms``' rule). The
            agent first acts a stage later, its first reward measured against greedy's forms, so the search refines a
            greedy allocation instead of building one from dense. Needs ``byte_budget`` and the trainer's
            ``eval_dataset``.
        pace: budget pacing in the search over forms (with ``byte_budget``): a Linear's forms are offered only where
            they cost within ± ``pace`` of its share of the bytes left (the budget not yet spent, split over the
            undecided Linears by their fp32 bytes; the closest form where none is), so the search spends its budget
            across the model instead of ending far below it with whatever the first actions took. ``None``: the
            budget wall alone.
        share_by: with ``pace``, what each undecided Linear's share of the bytes left is proportional to:
            ``"fp32_bytes"`` (its size) or ``"sensitivity"``: when the agent first acts, every Linear alone is put in
            each of its forms, built from the weights it has then, and scored on the ``validation_batches`` (no
            training); the greedy allocation by those losses (``greedy_forms``' rule) gives each Linear its bytes, so
            the pace centres every Linear on the bytes its sensitivity earns (a sensitive head is not held to its
            size's part of the budget) and the agent explores around them. Needs the trainer's ``eval_dataset``;
            with ``front_only`` the fronts come from the same measurements.
        front_only: per-layer sensitivity in the search over forms: when the agent first acts on a Linear, each of
            its forms is built from the weights it has then and scored on the ``validation_batches`` (no training),
            and the agent chooses only among the forms no other form beats in both bytes and that loss (the
            Linear's Pareto front; the budget wall still applies, and ``pace`` picks among the front's forms: the
            one closest to the Linear's share where none is within it). Needs the trainer's ``eval_dataset``.
        reward_baseline: what the loss after an action is compared with in the reward. ``"previous_stage"`` (the
            paper's): the stage metric before the action, so a stage of training (the loss falling, SGD noise) is in
            every reward beside the form's effect. ``"same_weights"`` (the search over forms): a stage after the
            action, the Linear's previous form is rebuilt from the weights it has then and scored on the same
            ``validation_batches``, so the stage's training is common to both sides and cancels; each side's bytes are
            priced at the greedy allocation's marginal loss per byte (the last move ``greedy_forms``' rule makes to
            meet ``byte_budget``, from the measurements ``share_by="sensitivity"`` takes, once for both), so a form
            that spends more bytes must buy more loss than the budget's going rate. Needs ``forms``, ``byte_budget``,
            ``reward="validation_loss"`` and the trainer's ``eval_dataset``.
        shared: cross-layer sharing in the search over forms (as ALBERT shares its layers' weights):
            ``{module: source}``, each Linear ``module`` computing with searched Linear ``source``'s weights in whatever
            form the search gives ``source`` (``method="mixed"``'s ``{"method": "shared"}`` form). The trainer installs
            the shares before the search starts (a shared Linear's own weights are dropped), every form is measured and
            trained through every use, and the shared Linears are not searched and store nothing: ``byte_budget`` is a
            fraction of what the searched Linears store dense. ``None``: no sharing.
        episodes: passes of the search over every searched layer. The first decides every layer from the start form
            (the paper's Algorithm 1); each later pass takes the layers up again, one at a time, with every other
            layer in the form it holds, so the agent, trained on every reward so far, may move a layer where the
            others' forms make another form better, the budget wall counting those forms as they are. ``1``: one pass.
        gamma: the actor-critic's discount (paper: 0.95).
        learning_rate: the actor-critic's learning rate (paper: 1e-3).
        replay_epochs: after each reward's own A2C step (the paper's), this many more Adam steps, each on the mean
            loss of every transition the search has seen (``0``: none, the paper's). With one step of about the
            learning rate a reward, a search of a few dozen actions leaves the actor near its first argmax;
            replaying them lets each reward turn it (the actor's term is then advantage-weighted likelihood of past
            actions, not an on-policy gradient).
        hidden_units: units of each of the actor-critic's two hidden layers (paper: 40).
        embedding_dim: the state encoder's token embedding size.
        lstm_units: the units of the state encoder's 1-layer bidirectional LSTM.
        als_iterations: ALS sweeps of a CP re-decomposition at a rank change.
        seed: seeds the agent's weights and its exploration draws (independent of the training seed).
        trace_file: JSON trace of all decisions, written to the Trainer's ``output_dir`` (``None``: not written).
        plot_file: figure of rank per layer and reward over training, written when training ends.
    """

    interval: int = 10
    interval_unit: str = "steps"
    warmup: int = 0
    max_candidates: int = 10
    reward: str = "loss"
    validation_batches: int = 4
    tolerance: float | None = None
    epsilon_start: float = 0.5
    epsilon_end: float = 0.02
    epsilon_decay: float = 0.85
    policy: str = "argmax"
    consecutive_actions: int = 5
    max_actions_per_layer: int | None = 15
    param_budget: float | None = None
    byte_budget: float | None = None
    factor_widths: tuple[int | str | None, ...] | None = None
    factor_group_size: int | None = 32
    forms: tuple[str, ...] | None = None
    target_modules: list[str] | str | None = None
    keep_ratios: tuple[float, ...] = (0.5,)
    weight_group_sizes: tuple[int | None, ...] = (32,)
    weight_scales: tuple[str, ...] = ("rounded",)
    input_rotations: tuple[str, ...] = ("none",)
    rotation_block: int = 128
    bias_dtype: str = "model"
    start: str = "dense"
    pace: float | None = 0.5
    share_by: str = "fp32_bytes"
    front_only: bool = False
    reward_baseline: str = "previous_stage"
    shared: dict[str, str] | None = None
    episodes: int = 1
    gamma: float = 0.95
    learning_rate: float = 1e-3
    replay_epochs: int = 0
    hidden_units: int = 40
    embedding_dim: int = 16
    lstm_units: int = 64
    als_iterations: int = 12
    seed: int = 0
    trace_file: str | None = "smartformer_trace.json"
    plot_file: str | None = "smartformer_trace.png"

    def __post_init__(self) -> None:
        for name in ("factor_widths", "forms", "keep_ratios", "weight_group_sizes", "weight_scales", "input_rotations"):
            if getattr(self, name) is not None:
                setattr(self, name, tuple(getattr(self, name)))  # a JSON round trip gives a list
        if self.tolerance is None and self.reward in DEFAULT_TOLERANCE:
            self.tolerance = DEFAULT_TOLERANCE[self.reward]
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the wrong field and what would be right."""
        _positive_int(self.interval, "interval")
        if self.interval_unit not in INTERVAL_UNITS:
            raise ValueError(f"interval_unit={self.interval_unit!r}; choose one of {list(INTERVAL_UNITS)}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(
                f"warmup={self.warmup!r}: the {self.interval_unit} trained before the first stage, an int >= 0"
            )
        _positive_int(self.max_candidates, "max_candidates")
        if self.reward not in REWARDS:
            raise ValueError(
                f"reward={self.reward!r}; choose 'loss' (forecasting), 'accuracy' (classification) or "
                "'validation_loss' (the loss on held-out batches; the trainer needs an eval_dataset)"
            )
        if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float)):
            raise ValueError(
                f"tolerance must be a number (paper: 1.125 for loss, 0.1 for accuracy), got {self.tolerance!r}"
            )
        _positive_int(self.validation_batches, "validation_batches")
        if self.reward in ("loss", "validation_loss") and self.tolerance < 1.0:
            raise ValueError(
                f"tolerance={self.tolerance} for the loss reward is a factor on the previous loss and must be >= 1 "
                "(paper: 1.125; larger favours compression)"
            )
        if self.reward == "accuracy" and not 0.0 <= self.tolerance <= 1.0:
            raise ValueError(
                f"tolerance={self.tolerance} for the accuracy reward is an accuracy drop in [0, 1] (paper: 0.1)"
            )
        for name in ("epsilon_start", "epsilon_end", "epsilon_decay", "gamma"):
            _probability(getattr(self, name), name)
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r}: one of {list(POLICIES)}")
        if self.epsilon_end > self.epsilon_start:
            raise ValueError(
                f"epsilon_end={self.epsilon_end} exceeds epsilon_start={self.epsilon_start}; ε only decays"
            )
        _positive_int(self.consecutive_actions, "consecutive_actions")
        _positive_int(self.episodes, "episodes")
        if self.max_actions_per_layer is not None:
            _positive_int(self.max_actions_per_layer, "max_actions_per_layer")
            if self.max_actions_per_layer < self.consecutive_actions:
                raise ValueError(
                    f"max_actions_per_layer={self.max_actions_per_layer} is below consecutive_actions="
                    f"{self.consecutive_actions}: no layer could ever converge; raise it or use None"
                )
        if self.param_budget is not None and (
            isinstance(self.param_budget, bool)
            or not isinstance(self.param_budget, (int, float))
            or not 0.0 < self.param_budget <= 1.0
        ):
            raise ValueError(
                f"param_budget={self.param_budget!r} must be a fraction in (0, 1] of the dense parameters, or None"
            )
        if self.byte_budget is not None and (
            isinstance(self.byte_budget, bool)
            or not isinstance(self.byte_budget, (int, float))
            or not 0.0 < self.byte_budget <= 1.0
        ):
            raise ValueError(
                f"byte_budget={self.byte_budget!r} must be a fraction in (0, 1] of the fp32 bytes, e.g. 1/16, or None"
            )
        if self.byte_budget is not None and self.param_budget is not None:
            raise ValueError("pass param_budget or byte_budget, not both")
        if self.factor_widths is not None:
            wrong = [w for w in self.factor_widths if w is not None and (isinstance(w, bool) or w not in FACTOR_WIDTHS)]
            if wrong or not self.factor_widths or len(set(self.factor_widths)) != len(self.factor_widths):
                raise ValueError(
                    f"factor_widths={list(self.factor_widths)}: distinct values among {list(FACTOR_WIDTHS)} and None "
                    "(fp32 factors), at least one"
                )
        if self.factor_group_size is not None:
            _positive_int(self.factor_group_size, "factor_group_size")
        self._validate_forms()
        if (
            isinstance(self.learning_rate, bool)
            or not isinstance(self.learning_rate, (int, float))
            or self.learning_rate <= 0
        ):
            raise ValueError(f"learning_rate must be > 0 (paper: 1e-3), got {self.learning_rate!r}")
        if isinstance(self.replay_epochs, bool) or not isinstance(self.replay_epochs, int) or self.replay_epochs < 0:
            raise ValueError(
                f"replay_epochs must be an int >= 0 (0: the paper's one step a reward), got {self.replay_epochs!r}"
            )
        for name in ("hidden_units", "embedding_dim", "lstm_units", "als_iterations"):
            _positive_int(getattr(self, name), name)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")

    def _validate_forms(self) -> None:
        if self.bias_dtype not in BIAS_DTYPES:
            raise ValueError(f"bias_dtype={self.bias_dtype!r} is not supported; choose one of {list(BIAS_DTYPES)}")
        if not isinstance(self.start, str):
            raise ValueError(f"start must be a form label such as 'dense' or 'lowbit:2/row', got {self.start!r}")
        if self.forms is None:
            options = {
                "front_only": False,
                "start": "dense",
                "share_by": "fp32_bytes",
                "shared": None,
                "reward_baseline": "previous_stage",
            }
            given = [
                f"{name}={getattr(self, name)!r}" for name, value in options.items() if getattr(self, name) != value
            ]
            if given:
                raise ValueError(f"{', '.join(given)}: options of the search over forms; pass forms=(...) too")
            return
        wrong = [form for form in self.forms if form not in FORM_KINDS]
        if wrong or not self.forms or len(set(self.forms)) != len(self.forms):
            raise ValueError(f"forms={list(self.forms)}: distinct values among {list(FORM_KINDS)}, at least one")
        if self.param_budget is not None:
            raise ValueError("the search over forms counts bytes: pass byte_budget, not param_budget")
        if set(self.forms) & {"lowbit", "svd", "cp"} and not [w for w in self.widths if w is not None]:
            raise ValueError(
                f"forms={list(self.forms)} store weights or factors in factor_widths; pass some, e.g. (4, 2, 'ternary')"
            )
        for keep in self.keep_ratios:
            _probability(keep, "keep_ratios")
            if keep == 0:
                raise ValueError("keep_ratios: a biprop mask keeps a fraction in (0, 1] of the weights, not 0")
        for group in self.weight_group_sizes:
            if group is not None:
                _positive_int(group, "weight_group_sizes")
        scales = list(self.weight_scales)
        if not scales or len(set(scales)) != len(scales) or set(scales) - set(WEIGHT_SCALES):
            raise ValueError(f"weight_scales={scales}: distinct values among {list(WEIGHT_SCALES)}, at least one")
        rotations = list(self.input_rotations)
        if not rotations or len(set(rotations)) != len(rotations) or set(rotations) - set(INPUT_ROTATIONS):
            raise ValueError(
                f"input_rotations={rotations}: distinct values among {list(INPUT_ROTATIONS)}, at least one"
            )
        check_rotation_block(self.rotation_block)
        kind = self.start.partition(":")[0]
        if self.start not in ("dense", GREEDY_START) and kind not in self.forms:
            raise ValueError(
                f"start={self.start!r}: a form of one of forms={list(self.forms)} (a Linear left undecided keeps its "
                f"start form), 'dense' (the model as given) or {GREEDY_START!r} (the greedy allocation by measured "
                "sensitivity)"
            )
        if self.start == GREEDY_START and self.byte_budget is None:
            raise ValueError(
                f"start={GREEDY_START!r} allocates byte_budget greedily by measured sensitivity: pass byte_budget=..."
            )
        if self.pace is not None and (
            isinstance(self.pace, bool) or not isinstance(self.pace, (int, float)) or self.pace < 0
        ):
            raise ValueError(f"pace={self.pace!r}: a fraction >= 0 around each Linear's share of the budget, or None")
        if self.share_by not in SHARE_BY:
            raise ValueError(f"share_by={self.share_by!r}: one of {list(SHARE_BY)}")
        if self.share_by == "sensitivity" and (self.pace is None or self.byte_budget is None):
            raise ValueError(
                "share_by='sensitivity' sets each Linear's share of the byte budget that pace keeps it near: pass "
                f"byte_budget=... and a pace (got byte_budget={self.byte_budget!r}, pace={self.pace!r})"
            )
        if not isinstance(self.front_only, bool):
            raise ValueError(f"front_only must be True or False, got {self.front_only!r}")
        self._validate_reward_baseline()
        self._validate_shared()

    def _validate_reward_baseline(self) -> None:
        if self.reward_baseline not in REWARD_BASELINES:
            raise ValueError(f"reward_baseline={self.reward_baseline!r}: one of {list(REWARD_BASELINES)}")
        if self.reward_baseline == "same_weights" and (self.byte_budget is None or self.reward != "validation_loss"):
            raise ValueError(
                "reward_baseline='same_weights' scores the previous form on the validation batches and prices bytes "
                f"at the byte budget's going rate: pass reward='validation_loss' and byte_budget=... (got "
                f"reward={self.reward!r}, byte_budget={self.byte_budget!r})"
            )

    def _validate_shared(self) -> None:
        """``shared`` maps module names to module names, none to itself and none to a Linear that is itself shared."""
        if self.shared is None:
            return
        names = [*self.shared.items()] if isinstance(self.shared, dict) else []
        if not isinstance(self.shared, dict) or not all(isinstance(name, str) for pair in names for name in pair):
            raise ValueError(f"shared={self.shared!r}: a dict of {{module name: the searched Linear it shares}}")
        for name, source in self.shared.items():
            if name == source or source in self.shared:
                raise ValueError(
                    f"shared[{name!r}] = {source!r}: a Linear shares a searched Linear that is not itself shared "
                    "(nor itself); name the source directly"
                )

    @property
    def widths(self) -> tuple[int | str | None, ...]:
        """The factor widths actions choose among (``(None,)``: ranks only, fp32 factors)."""
        return self.factor_widths or (None,)

    @property
    def budget(self) -> float | None:
        """The budget fraction, whichever unit it is in (``byte_budget`` when set)."""
        return self.byte_budget if self.byte_budget is not None else self.param_budget

    def epsilon(self, actions_taken: int) -> float:
        """Exploration probability after ``actions_taken`` actions."""
        return max(self.epsilon_end, self.epsilon_start * self.epsilon_decay**actions_taken)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown SearchConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**data)
