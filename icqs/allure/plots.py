"""The report's figures (matplotlib, rendered to PNG bytes): metrics per round, F1/AUC vs the number of ICL examples
(the paper's Fig. 3), the t-SNE map of failure modes (Fig. 5) and the cluster ablation (Fig. 6-7)."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SPLITS = ("audit", "holdout", "all")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _get(row: dict, split: str, metric: str) -> float:
    v = row.get(split, {}).get(metric)
    return math.nan if v is None else v


def round_series(rounds: list[dict], metric: str) -> dict[str, list[float]]:
    """The lines of one panel of the rounds figure: a split with data, by name. Without a holdout the audit split
    is all of the items: one line named so, rather than 'all' drawn over 'audit' and hiding it."""
    series = {}
    for split in SPLITS:
        ys = [_get(r, split, metric) for r in rounds]
        if not all(math.isnan(y) for y in ys):
            series[split] = ys
    if "all" in series and series.get("audit") == series["all"]:
        del series["all"]
        series["audit (= all: no holdout)"] = series.pop("audit")
    return series


def rounds_figure(rounds: list[dict]) -> bytes | None:
    if not rounds:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    x = [r["round"] for r in rounds]
    for ax, metric in zip(axes, ("accuracy", "f1", "auc")):
        for k, (split, ys) in enumerate(round_series(rounds, metric).items()):
            ax.plot(x, ys, marker="os^"[k % 3], linestyle=("-", "--", ":")[k % 3], label=split)
        ax.set_title(f"{metric} per round")
        ax.set_xlabel("round")
        ax.set_xticks(x)
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    return _png(fig)


def icl_size_figure(sweep: list[dict], rounds: list[dict]) -> bytes | None:
    """F1 and AUC against the number of ICL examples: the sweep's nested samples, and the rounds."""
    if not sweep and not rounds:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, metric in zip(axes, ("f1", "auc")):
        for split in ("audit", "holdout"):  # a series without data gets no (empty) legend entry
            sweep_ys = [_get(r, split, metric) for r in sweep]
            if sweep and not all(math.isnan(y) for y in sweep_ys):
                ax.plot([r["n"] for r in sweep], sweep_ys, marker="o", label=f"sample of memory, {split}")
            round_ys = [_get(r, split, metric) for r in rounds]
            if rounds and not all(math.isnan(y) for y in round_ys):
                ax.plot([r["n_icl"] for r in rounds], round_ys, marker="s", linestyle="--", label=f"rounds, {split}")
        ax.set_title(f"{metric.upper()} vs number of ICL examples")
        ax.set_xlabel("ICL examples in the prompt")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
    return _png(fig)


def tsne_figure(modes: dict | None) -> bytes | None:
    if not modes or not modes.get("ids"):
        return None
    fig, ax = plt.subplots(figsize=(6.5, 5))
    cmap = plt.get_cmap("tab10")
    for c in sorted(set(modes["cluster"])):
        for kind, marker in (("false_positive", "o"), ("false_negative", "^")):
            pts = [xy for xy, cc, k in zip(modes["xy"], modes["cluster"], modes["error_kind"]) if cc == c and k == kind]
            if pts:
                ax.scatter(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    color=cmap(c % 10),
                    marker=marker,
                    s=40,
                    label=f"{c}: {modes['names'][str(c)]} ({kind.replace('_', ' ')})",
                )
    ax.set_title("t-SNE of ICL examples (MiniLM embeddings), coloured by k-means cluster")
    ax.legend(fontsize=7, loc="best")
    return _png(fig)


def ablation_figure(rows: list[dict]) -> bytes | None:
    """Per ablated cluster: F1/AUC (dashed: no ablation), Cohen's kappa against the full run, error counts."""
    if len(rows) < 2:
        return None
    full, abl = rows[0], rows[1:]
    labels = [str(r["cluster"]) for r in abl]
    x = range(len(abl))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for i, metric in enumerate(("f1", "auc")):
        axes[0].bar(
            [j + 0.4 * i for j in x], [_get(r, "all", metric) for r in abl], width=0.4, label=metric, color=f"C{i}"
        )
        axes[0].axhline(_get(full, "all", metric), color=f"C{i}", linestyle="--")
    axes[0].set_title("F1 / AUC with a cluster ablated (dashed: none)")
    axes[0].set_ylim(0, 1.02)
    axes[0].legend(fontsize=8)
    axes[1].bar(list(x), [r["kappa"] for r in abl], color="C2")
    axes[1].set_title("Cohen's kappa vs the full ICL prompt")
    axes[1].set_ylim(min(0.0, min((r["kappa"] for r in abl if not math.isnan(r["kappa"])), default=0)), 1.02)
    axes[2].bar(list(x), [_get(r, "all", "errors") for r in abl], color="C3")
    axes[2].axhline(_get(full, "all", "errors"), color="k", linestyle="--")
    axes[2].set_title("errors with a cluster ablated (dashed: none)")
    for ax in axes:
        ax.set_xticks([j + (0.2 if ax is axes[0] else 0) for j in x])
        ax.set_xticklabels(labels)
        ax.set_xlabel("ablated cluster")
    return _png(fig)
