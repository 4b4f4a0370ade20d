"""End-of-run artefacts: a PNG of the training curves, summary.json and summary.md."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from reasonrl.config import Config
from reasonrl.reward.custom import VERIFIER_TERM

# (title, metric keys drawn on that panel)
PANELS: list[tuple[str, list[str]]] = [
    ("reward", ["reward/mean"]),
    ("accuracy", ["reward/accuracy", "eval/accuracy"]),
    ("response length (tokens)", ["rollout/response_length"]),
    ("policy entropy (nats/token)", ["policy/entropy"]),
    ("clip fractions", ["policy/clip_frac_high", "policy/clip_frac_low"]),
    ("critic value loss", ["critic/value_loss"]),
    ("critic explained variance", ["critic/explained_variance"]),
    ("seconds per step", ["perf/step_seconds"]),
]
CRITIC_PANELS: list[tuple[str, list[str]]] = [
    ("critic value loss", ["critic/value_loss"]),
    ("critic explained variance", ["critic/explained_variance"]),
    ("values vs returns", ["critic/value_mean", "critic/return_mean"]),
]


def plot_metrics(
    records: list[dict[str, Any]], path: Path, title: str, panels: list[tuple[str, list[str]]] = PANELS
) -> None:
    """Draw every panel that has data, metric vs step, into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, keys) for name, keys in panels if any(r.get(k) is not None for r in records for k in keys)]
    columns = 3
    rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False)
    for ax, (name, keys) in zip(axes.flat, panels, strict=False):
        for key in keys:
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=key)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """``summary.json`` (machine-readable) and ``summary.md`` (for people)."""
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    before, after = summary.get("accuracy_before"), summary.get("accuracy_after")
    command = ["reasonrl", "train", summary["preset"], *summary.get("overrides", [])]
    lines = [
        f"# {summary['preset']} on {summary['model']}",
        "",
        _accuracy_line(summary["eval_prompts"], before, after, summary.get("accuracy_means", "")),
        f"- rollout steps: {summary['steps']}; wall time {summary['wall_seconds'] / 60:.1f} min; "
        f"peak RSS {summary['peak_rss_gb']:.2f} GB",
        f"- curves: `{summary['plot']}`; metrics: `metrics.jsonl`; TensorBoard: `tensorboard/`",
        *(
            [
                f"- value pretraining: {summary['value_pretrain_steps']} steps, final explained variance "
                f"{_number(summary.get('value_pretrain_explained_variance'))} (`value_pretrain.png`, "
                "`value_pretrain.jsonl`; critic saved in `critic_pretrained/`)"
            ]
            if "value_pretrain_steps" in summary
            else []
        ),
        f"- trained model (Hugging Face format): `{summary['final_model']}`",
        "",
        f"Reproduce: `{shlex.join(command)}`",  # each setting quoted as a shell needs it: lists, spaces
    ]
    (run_dir / "summary.md").write_text("\n".join(lines) + "\n")


def accuracy_meaning(cfg: Config) -> str:
    """What a run's accuracy counts (``reward/accuracy``, ``eval/accuracy``), as its summary and the command line
    say it: a verdict (the verifier's, a reward function's), an environment's success, or a reward above 0.5."""
    functions = cfg.reward.functions
    if cfg.rollout.multiturn in ("env", "tool"):
        return "episodes solved: the verifier's verdict where it scores, else a function's, else a positive return"
    if cfg.rollout.multiturn in ("pag", "direct"):
        return "the verifier's verdict on the last attempt"
    if functions and VERIFIER_TERM not in functions:
        return "a reward function's verdict (verl's acc) where one gives it, else the summed reward above 0.5"
    return "the verifier's verdict (a judge's or reward model's score above 0.5 for the prompts they score)"


def _accuracy_line(prompts: int, before: float | None, after: float | None, meaning: str = "") -> str:
    """The held-out accuracy before and after, over the ``prompts`` held-out prompts evaluated (none: not measured),
    and what it counts (``accuracy_meaning``)."""
    if not prompts:
        return "- held-out accuracy: not measured (no held-out prompt was evaluated)"
    change = f" ({(after - before) * 100:+.1f} points)" if before is not None and after is not None else ""
    counted = f"; accuracy = {meaning}" if meaning else ""
    return (
        f"- held-out accuracy (greedy, {prompts} prompts): {_pct(before)} before → {_pct(after)} after{change}{counted}"
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
