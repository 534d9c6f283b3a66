"""The report's figures, as bare matplotlib Figures (shared with the analysis notebook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from isq.analysis import PCA2D, FingerprintLengths, Stability

LOSS_PANELS = {
    "prediction loss": ("loss", "ce_loss"),
    "quantiser loss terms": ("commitment_loss", "codebook_loss", "entropy_loss"),
}
CODE_COLUMNS = ("train/codes_used", "val/codes_used", "train/dead_codes", "train/revived_codes")
PERPLEXITY_COLUMNS = ("train/perplexity", "val/codebook_perplexity")


def _axes(columns: int, width: float = 5.0, height: float = 3.6) -> tuple[Figure, list[Axes]]:
    # A bare Figure (no pyplot): nothing global, shows inline in notebooks and saves with Agg.
    figure = Figure(figsize=(width * columns, height), layout="constrained")
    return figure, list(np.atleast_1d(figure.subplots(1, columns)))


def usage_figure(counts: np.ndarray) -> Figure:
    """Tokens per used code (log bins) and the rank-frequency curve against uniform use."""
    figure, (hist, rank) = _axes(2)
    used = counts[counts > 0]
    bins = np.logspace(0, np.log10(max(used.max(), 2)), 40).tolist()
    hist.hist(used, bins=bins, color="tab:blue")
    hist.set(xscale="log", xlabel="tokens per code", ylabel="codes",
             title=f"{used.size} of {counts.size} codes used, {counts.size - used.size} dead")
    share = np.sort(counts)[::-1] / counts.sum()
    ranks = np.arange(1, counts.size + 1)
    rank.loglog(ranks[share > 0], share[share > 0], color="tab:blue", label="sample")
    rank.axhline(1 / counts.size, color="grey", linestyle="--", label="uniform")
    rank.set(xlabel="code rank", ylabel="share of tokens", title="rank-frequency")
    rank.legend()
    return figure


def norms_figure(norms: np.ndarray, counts: np.ndarray, z_norms: np.ndarray, errors: np.ndarray) -> Figure:
    """Code-vector norms (used vs dead codes), token ||z|| and per-token quantisation error."""
    figure, (codes, tokens, error) = _axes(3)
    codes.hist([norms[counts > 0], norms[counts == 0]], bins=40, stacked=True,
               color=["tab:blue", "tab:grey"], label=["used", "dead"])
    codes.set(xlabel="||e_j||", ylabel="codes", title="code-vector norms")
    codes.legend()
    tokens.hist(z_norms, bins=40, color="tab:green")
    tokens.set(xlabel="||z_t||", ylabel="tokens", title="projected token norms")
    error.hist(errors, bins=40, color="tab:red")
    error.set(xlabel="||z_t - e_k||²", ylabel="tokens",
              title=f"quantisation error (mean {errors.mean():.3g})")
    return figure


def distances_figure(pairwise: np.ndarray, nearest: np.ndarray) -> Figure:
    """Histograms of all pairwise code distances and of nearest-neighbour distances."""
    figure, (pairs, neighbours) = _axes(2)
    pairs.hist(pairwise, bins=80, color="tab:purple")
    pairs.set(xlabel="||e_i - e_j||", ylabel="pairs",
              title=f"pairwise distances (median {np.median(pairwise):.3g})")
    neighbours.hist(nearest, bins=40, color="tab:orange")
    neighbours.set(xlabel="distance to nearest other code", ylabel="codes",
                   title=f"nearest-neighbour distances (mean {nearest.mean():.3g})")
    return figure


def pca_figure(pca: PCA2D, counts: np.ndarray) -> Figure:
    """Codes on the first two principal axes; marker area grows with usage, dead codes as crosses."""
    figure, (axis,) = _axes(1, width=6.0, height=5.0)
    used = counts > 0
    sizes = 4 + 300 * counts[used] / counts.max()
    (x_used, y_used), (x_dead, y_dead) = pca.coordinates[used].T, pca.coordinates[~used].T
    axis.scatter(x_used, y_used, s=sizes, alpha=0.5, color="tab:blue", label="used (area ~ tokens)")
    axis.scatter(x_dead, y_dead, s=8, marker="x", color="tab:grey", label="dead")
    ratio = pca.explained_variance_ratio
    axis.set(xlabel=f"PC1 ({100 * ratio[0]:.1f}% of variance)", ylabel=f"PC2 ({100 * ratio[1]:.1f}%)",
             title="codebook PCA")
    axis.legend()
    return figure


def lengths_figure(lengths: FingerprintLengths) -> Figure:
    """Distributions of L, |S_fp| and |U_fp|, and |S_fp|, |U_fp| against L."""
    figure, (hist, scatter) = _axes(2)
    top = int(lengths.tokens.max())
    bins: int | list[float] = (np.arange(0, top + 2) - 0.5).tolist() if top <= 80 else 40
    for values, label in ((lengths.tokens, "L"), (lengths.sequence, "|S_fp|"), (lengths.distinct, "|U_fp|")):
        hist.hist(values, bins=bins, histtype="step", linewidth=1.5, label=label)
    hist.set(xlabel="length", ylabel="texts", title="fingerprint lengths")
    hist.legend()
    scatter.scatter(lengths.tokens, lengths.sequence, s=6, alpha=0.4, label="|S_fp|")
    scatter.scatter(lengths.tokens, lengths.distinct, s=6, alpha=0.4, label="|U_fp|")
    scatter.plot([0, top], [0, top], color="grey", linestyle="--", linewidth=1, label="= L")
    scatter.set(xlabel="L (tokens)", ylabel="codes", title="compression against text length")
    scatter.legend()
    return figure


def stability_figure(results: Mapping[str, Stability]) -> Figure:
    """Share of unchanged token codes per edit, over all positions and over unedited tokens."""
    figure, (axis,) = _axes(1, width=5.0)
    names = list(results)
    x = np.arange(len(names))
    axis.bar(x - 0.2, [results[n].share for n in names], width=0.4, label="all positions")
    axis.bar(x + 0.2, [results[n].share_unedited for n in names], width=0.4, label="unedited tokens")
    axis.set_xticks(x, [f"{n}\n({results[n].compared} texts)" for n in names])
    axis.set(ylim=(0, 1.25), ylabel="identical token codes", title="stability under small edits")
    axis.legend(loc="upper center", ncols=2)
    return figure


def degree_figure(degree: np.ndarray, counts: np.ndarray) -> Figure:
    """Topology degree (distinct co-occurring codes) of the codes that occur in the sample."""
    figure, (axis,) = _axes(1, width=5.0)
    present = degree[counts > 0]
    axis.hist(present, bins=40, color="tab:cyan")
    axis.set(xlabel="degree (codes co-occurring with it)", ylabel="codes",
             title=f"topology degree of {present.size} occurring codes (mean {present.mean():.1f})")
    return figure


def training_figures(log: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Figure]:
    """Loss terms, code counts and codebook perplexity over training steps; absent columns are skipped."""
    figures: dict[str, Figure] = {}
    panels: dict[str, list[str]] = {}
    for title, names in LOSS_PANELS.items():
        columns = [f"{split}/{name}" for name in names for split in ("train", "val")]
        if present := [column for column in columns if column in log]:
            panels[title] = present
    if panels:
        figure, axes = _axes(len(panels))
        for axis, (title, columns) in zip(axes, panels.items(), strict=True):
            _plot_series(axis, log, columns, title)
        figures["training_losses"] = figure
    # train/ counts one batch's tokens, val/ the whole validation split's: a smaller sample uses
    # fewer codes, so the two differ without any gap between the splits
    scope = " (train: per batch; val: whole split)"
    for name, wanted, title in (("training_codes", CODE_COLUMNS, "codes alive, dead and revived" + scope),
                                ("training_perplexity", PERPLEXITY_COLUMNS, "codebook perplexity" + scope)):
        present = [column for column in wanted if column in log]
        if present:
            figure, (axis,) = _axes(1, width=6.0)
            _plot_series(axis, log, present, title)
            figures[name] = figure
    return figures


def _plot_series(axis: Axes, log: Mapping[str, tuple[np.ndarray, np.ndarray]], columns: Sequence[str],
                 title: str) -> None:
    names = list(dict.fromkeys(column.split("/", 1)[-1] for column in columns))
    for column in columns:
        steps, values = log[column]
        # one colour per quantity; validation is logged rarely, so dashed with markers
        validation = column.startswith("val/")
        axis.plot(steps, values, label=column, color=f"C{names.index(column.split('/', 1)[-1])}",
                  marker="o" if validation else None, linestyle="--" if validation else "-")
    axis.set(xlabel="step", title=title)
    axis.legend(fontsize="small")
