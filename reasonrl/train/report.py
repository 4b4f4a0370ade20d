"""End-of-run artefacts: a PNG of the training curves, summary.json and summary.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    lines = [
        f"# {summary['preset']} on {summary['model']}",
        "",
        f"- held-out accuracy (greedy, {summary['eval_prompts']} prompts): "
        f"{_pct(before)} before → {_pct(after)} after"
        + (f" ({(after - before) * 100:+.1f} points)" if before is not None and after is not None else ""),
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
        f"Reproduce: `{' '.join(['reasonrl train', summary['preset'], *summary.get('overrides', [])])}`",
    ]
    (run_dir / "summary.md").write_text("\n".join(lines) + "\n")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
