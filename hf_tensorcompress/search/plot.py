"""The paper's Appendix E figure: rank of every attention layer and the reward over training steps."""

from __future__ import annotations

from ..core.extras import require


def plot_trace(trace: list[dict], path: str) -> None:
    """Top: each layer's rank at every stage end; bottom: the reward of each completed action (needs the
    ``plots`` extra: matplotlib)."""
    matplotlib = require("matplotlib", "plotting the Smartformer search trace")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (ranks_axis, reward_axis) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    steps = [record["step"] for record in trace]
    for name in trace[0]["ranks"] if trace else []:
        ranks_axis.step(steps, [record["ranks"][name] for record in trace], where="post", label=name)
    ranks_axis.set_ylabel("rank")
    ranks_axis.legend(fontsize="x-small", loc="best")
    rewarded = [record for record in trace if "reward" in record]
    reward_axis.plot([r["step"] for r in rewarded], [r["reward"] for r in rewarded], marker="o")
    reward_axis.axhline(0.0, color="grey", linewidth=0.5)
    reward_axis.set_ylabel("reward")
    reward_axis.set_xlabel("training step")
    figure.suptitle("Smartformer rank search")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
