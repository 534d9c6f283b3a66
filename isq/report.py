"""Codebook report: the analysis figures as PNG files plus a Markdown summary.

    python -m isq.report DIR --texts FILE --out REPORT_DIR [--log metrics.csv] [--sample N]

``DIR`` is an exported fingerprinter; ``FILE`` holds one text per line, or is a DailyDialog
``dialogues_*.txt`` file (detected by its ``__eou__`` separators, split into utterances).
``--log`` adds the training-time view from a Lightning CSVLogger ``metrics.csv``.
The figure and table functions are shared with ``notebooks/codebook_analysis.ipynb``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import numpy as np
import scipy.sparse as sp
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from isq.analysis import (
    EDITS,
    PCA2D,
    Association,
    CodeConcordance,
    FingerprintLengths,
    LexicalConsistency,
    SampleCodes,
    Stability,
    UsageStats,
    code_counts,
    code_norms,
    collect,
    concordance,
    degrees,
    edited_texts,
    fingerprint_lengths,
    frequent_words,
    lexical_consistency,
    nearest_neighbour_distances,
    pairwise_distances,
    pca_2d,
    sample_texts,
    stability,
    top_associations,
    usage_stats,
    word_codes,
)
from isq.fingerprint import Fingerprinter

if TYPE_CHECKING:
    from retrieval.topology import CooccurrenceTopology

EOU = "__eou__"
DEFAULT_WORDS = 8
"""Without ``--words``, the codes of this many of the sample's most frequent words are listed."""
LOSS_PANELS = {
    "prediction loss": ("loss", "ce_loss"),
    "quantiser loss terms": ("commitment_loss", "codebook_loss", "entropy_loss"),
}
MIN_SOURCE_UNITS = 5
"""Association tables list source codes seen in at least this many texts."""
CODE_COLUMNS = ("train/codes_used", "val/codes_used", "train/dead_codes", "train/revived_codes")
PERPLEXITY_COLUMNS = ("train/perplexity", "val/codebook_perplexity")


class InputError(ValueError):
    """Bad command-line input; the message names the file."""


# ---------------------------------------------------------------------------- inputs


def read_texts(path: Path) -> list[str]:
    """Non-empty lines of ``path``, or its utterances when it is a DailyDialog dialogue file."""
    if not path.is_file():
        raise InputError(f"texts file not found: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err
    if any(EOU in line for line in lines):
        lines = [utterance for line in lines for utterance in line.split(EOU)]
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise InputError(f"texts file has no text: {path}")
    return texts


def read_metrics_log(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each metric column of a Lightning CSV log as (steps, values), skipping empty cells.

    CSVLogger writes one row per logging call with only that call's columns filled, so every
    column is its own sparse series over the ``step`` column.
    """
    if not path.is_file():
        raise InputError(f"training log not found: {path}")
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if "step" not in (reader.fieldnames or []):
            raise InputError(f"{path}: not a Lightning CSV log (no 'step' column)")
        series: dict[str, tuple[list[float], list[float]]] = {}
        for row in reader:
            if not row["step"]:
                continue
            for column, value in row.items():
                if column in ("step", "epoch") or not value:
                    continue
                steps, values = series.setdefault(column, ([], []))
                try:
                    steps.append(float(row["step"]))
                    values.append(float(value))
                except ValueError as err:
                    raise InputError(f"{path}:{reader.line_num}: column {column}: {err}") from err
    return {column: (np.array(steps), np.array(values)) for column, (steps, values) in series.items()}


# ---------------------------------------------------------------------------- analysis


def sample_topology(sample: SampleCodes, identity: Mapping[str, object] | None = None) -> CooccurrenceTopology:
    """The co-occurrence topology (SPEC 3) over the sample, one unit per text, default H_r and alpha."""
    # Imported here: retrieval depends on isq, so isq may only reach retrieval at call time.
    from retrieval.topology import CooccurrenceTopology

    topology = CooccurrenceTopology(num_codes=sample.num_codes, identity=identity)
    topology.add(set(codes.tolist()) for codes in sample.token_codes)
    return topology


@dataclass
class CodebookAnalysis:
    """Every result the report shows, from one fingerprinter and one text sample."""

    fingerprinter: dict[str, object]
    sample: SampleCodes
    counts: np.ndarray
    usage: UsageStats
    norms: np.ndarray
    pairwise: np.ndarray
    nearest: np.ndarray
    pca: PCA2D
    lengths: FingerprintLengths
    stability: dict[str, Stability]
    cooccurrence: sp.csr_matrix
    doc_freq: np.ndarray
    code_scores: np.ndarray
    topology_params: dict[str, float]
    concordance: dict[int, CodeConcordance]
    words: dict[str, tuple[list[str], Counter[tuple[int, ...]]]]
    lexical: LexicalConsistency


def analyse(
    fingerprinter: Fingerprinter, texts: Sequence[str], words: Sequence[str] = (), batch_size: int = 64
) -> CodebookAnalysis:
    """Run every analysis; ``words`` defaults to the sample's most frequent words."""
    sample = collect(fingerprinter, texts, batch_size)
    counts = code_counts(sample.all_codes, sample.num_codes)
    results: dict[str, Stability] = {}
    for name, edit in EDITS.items():
        indices, edited = edited_texts(texts, edit)
        if indices:
            results[name] = stability(sample.select(indices), collect(fingerprinter, edited, batch_size))
    topology = sample_topology(sample, fingerprinter.identity)
    word_table = {}
    for word in list(words) or frequent_words(sample, DEFAULT_WORDS):
        pieces = fingerprinter.tokenizer.tokenize(word)
        word_table[word] = (pieces, word_codes(sample, pieces))
    run = fingerprinter.run_record or {}
    return CodebookAnalysis(
        fingerprinter={"codes": fingerprinter.codebook_size, "code_dim": int(fingerprinter.codebook.shape[1]),
                       "encoder": fingerprinter.config.encoder, "steps": run.get("global_step", "unknown")},
        sample=sample,
        counts=counts,
        usage=usage_stats(counts),
        norms=code_norms(fingerprinter.codebook),
        pairwise=pairwise_distances(fingerprinter.codebook),
        nearest=nearest_neighbour_distances(fingerprinter.codebook)[0],
        pca=pca_2d(fingerprinter.codebook),
        lengths=fingerprint_lengths(sample.token_codes),
        stability=results,
        cooccurrence=topology.cooccurrence,
        doc_freq=topology.doc_freq,
        code_scores=topology.code_scores(),
        topology_params={"units": topology.num_units, "max_hops": topology.max_hops, "alpha": topology.alpha},
        concordance=concordance(sample),
        words=word_table,
        lexical=lexical_consistency(sample),
    )


# ---------------------------------------------------------------------------- figures


def _axes(columns: int, width: float = 5.0, height: float = 3.6) -> tuple[Figure, list[Axes]]:
    # A bare Figure (no pyplot): nothing global, shows inline in notebooks and saves with Agg.
    figure = Figure(figsize=(width * columns, height), layout="constrained")
    return figure, list(np.atleast_1d(figure.subplots(1, columns)))


def usage_figure(counts: np.ndarray) -> Figure:
    """Tokens per used code (log bins) and the rank-frequency curve against uniform use."""
    figure, (hist, rank) = _axes(2)
    used = counts[counts > 0]
    bins = np.logspace(0, np.log10(max(used.max(), 2)), 40)
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
    error.set(xlabel="||z_t - e_k||²", ylabel="tokens", title=f"quantisation error (mean {errors.mean():.3g})")
    return figure


def distances_figure(pairwise: np.ndarray, nearest: np.ndarray) -> Figure:
    """Histograms of all pairwise code distances and of nearest-neighbour distances."""
    figure, (pairs, neighbours) = _axes(2)
    pairs.hist(pairwise, bins=80, color="tab:purple")
    pairs.set(xlabel="||e_i - e_j||", ylabel="pairs", title=f"pairwise distances (median {np.median(pairwise):.3g})")
    neighbours.hist(nearest, bins=40, color="tab:orange")
    neighbours.set(xlabel="distance to nearest other code", ylabel="codes",
                   title=f"nearest-neighbour distances (mean {nearest.mean():.3g})")
    return figure


def pca_figure(pca: PCA2D, counts: np.ndarray) -> Figure:
    """Codes on the first two principal axes; marker area grows with usage, dead codes as crosses."""
    figure, (axis,) = _axes(1, width=6.0, height=5.0)
    used = counts > 0
    sizes = 4 + 300 * counts[used] / counts.max()
    axis.scatter(*pca.coordinates[used].T, s=sizes, alpha=0.5, color="tab:blue", label="used (area ~ tokens)")
    axis.scatter(*pca.coordinates[~used].T, s=8, marker="x", color="tab:grey", label="dead")
    ratio = pca.explained_variance_ratio
    axis.set(xlabel=f"PC1 ({100 * ratio[0]:.1f}% of variance)", ylabel=f"PC2 ({100 * ratio[1]:.1f}%)",
             title="codebook PCA")
    axis.legend()
    return figure


def lengths_figure(lengths: FingerprintLengths) -> Figure:
    """Distributions of L, |S_fp| and |U_fp|, and |S_fp|, |U_fp| against L."""
    figure, (hist, scatter) = _axes(2)
    top = int(lengths.tokens.max())
    bins = np.arange(0, top + 2) - 0.5 if top <= 80 else 40
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
    panels = {title: [f"{split}/{name}" for name in names for split in ("train", "val") if f"{split}/{name}" in log]
              for title, names in LOSS_PANELS.items()}
    panels = {title: columns for title, columns in panels.items() if columns}
    if panels:
        figure, axes = _axes(len(panels))
        for axis, (title, columns) in zip(axes, panels.items(), strict=True):
            _plot_series(axis, log, columns, title)
        figures["training_losses"] = figure
    for name, columns, title in (("training_codes", CODE_COLUMNS, "codes alive, dead and revived"),
                                 ("training_perplexity", PERPLEXITY_COLUMNS, "codebook perplexity")):
        present = [column for column in columns if column in log]
        if present:
            figure, (axis,) = _axes(1, width=6.0)
            _plot_series(axis, log, present, title)
            figures[name] = figure
    return figures


def _plot_series(axis: Axes, log: Mapping[str, tuple[np.ndarray, np.ndarray]], columns: Sequence[str], title: str) -> None:
    names = list(dict.fromkeys(column.split("/", 1)[-1] for column in columns))
    for column in columns:
        steps, values = log[column]
        # one colour per quantity; validation is logged rarely, so dashed with markers
        style = {"marker": "o", "linestyle": "--"} if column.startswith("val/") else {}
        axis.plot(steps, values, label=column, color=f"C{names.index(column.split('/', 1)[-1])}", **style)
    axis.set(xlabel="step", title=title)
    axis.legend(fontsize="small")


# ---------------------------------------------------------------------------- tables


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table; cells are escaped for '|'."""
    def cell(value: object) -> str:
        return (f"{value:.4g}" if isinstance(value, float) else str(value)).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _code_span(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _code_label(code: int, entries: Mapping[int, CodeConcordance]) -> str:
    tokens = entries[code].tokens[:3] if code in entries else []
    return f"{code} ({', '.join(_code_span(t) for t, _ in tokens)})" if tokens else str(code)


def concordance_table(entries: Mapping[int, CodeConcordance], limit: int = 20) -> str:
    """The ``limit`` most used codes with their top tokens and contexts."""
    rows = [
        (entry.code, entry.count,
         ", ".join(f"{_code_span(t)} ×{n}" for t, n in entry.tokens),
         "<br>".join(f"{_code_span(c)} ×{n}" for c, n in entry.contexts[:3]))
        for entry in list(entries.values())[:limit]
    ]
    return markdown_table(("code", "tokens", "top tokens", "top contexts"), rows)


def words_table(words: Mapping[str, tuple[list[str], Counter[tuple[int, ...]]]]) -> str:
    """For each word: its tokens, occurrences and the code sequences it gets."""
    rows = []
    for word, (pieces, found) in words.items():
        codes = ", ".join(f"{'-'.join(map(str, seq))} ×{n}" for seq, n in found.most_common(5))
        rows.append((word, " ".join(_code_span(p) for p in pieces), sum(found.values()), len(found), codes or "-"))
    return markdown_table(("word", "tokens", "occurrences", "distinct codings", "top code sequences"), rows)


def associations_table(associations: Sequence[Association], entries: Mapping[int, CodeConcordance]) -> str:
    """S_code associations with each code labelled by its top tokens."""
    rows = [(_code_label(a.source, entries), _code_label(a.target, entries), a.score, a.cooccurrences)
            for a in associations]
    return markdown_table(("source code", "target code", "S_code", "M_ab"), rows)


def stability_table(results: Mapping[str, Stability]) -> str:
    rows = [(name, r.compared + r.skipped, r.compared, r.skipped, r.share, r.share_unedited)
            for name, r in results.items()]
    return markdown_table(("edit", "texts edited", "compared", "skipped (length changed)",
                           "identical codes", "identical codes, unedited tokens"), rows)


# ---------------------------------------------------------------------------- report


def write_report(
    analysis: CodebookAnalysis,
    out_dir: Path,
    fingerprinter: str,
    source: str,
    log: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> Path:
    """Save every figure as PNG under ``out_dir`` and write ``report.md``; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    a = analysis
    figures = {
        "usage": usage_figure(a.counts),
        "norms": norms_figure(a.norms, a.counts, a.sample.all_z_norms, a.sample.all_errors),
        "distances": distances_figure(a.pairwise, a.nearest),
        "pca": pca_figure(a.pca, a.counts),
        "lengths": lengths_figure(a.lengths),
        "topology_degree": degree_figure(degrees(a.cooccurrence), a.counts),
    }
    if a.stability:
        figures["stability"] = stability_figure(a.stability)
    if log:
        figures.update(training_figures(log))
    for name, figure in figures.items():
        figure.savefig(out_dir / f"{name}.png", dpi=110)

    def image(name: str) -> str:
        return f"![{name}]({name}.png)\n" if name in figures else ""

    usage, lengths = a.usage, a.lengths.summary()
    z_sq = float((a.sample.all_z_norms**2).mean())
    key_numbers = [
        ("texts / tokens", f"{len(a.sample.texts)} / {usage.tokens}"),
        ("codes used / dead (share)", f"{usage.used} / {usage.dead} ({usage.dead_share:.1%})"),
        ("usage perplexity (max N_c)", f"{usage.perplexity:.1f} ({usage.num_codes})"),
        ("usage entropy / log N_c", usage.normalised_entropy),
        ("Gini coefficient of usage", usage.gini),
        ("mean quantisation error ||z - e_k||²", float(a.sample.all_errors.mean())),
        ("... relative to mean ||z||²", float(a.sample.all_errors.mean()) / z_sq if z_sq else float("nan")),
        ("mean code-vector norm", float(a.norms.mean())),
        ("median pairwise / mean nearest-neighbour distance",
         f"{np.median(a.pairwise):.4g} / {a.nearest.mean():.4g}"),
        ("PCA explained variance (PC1, PC2)", f"{a.pca.explained_variance_ratio[0]:.1%}, "
                                              f"{a.pca.explained_variance_ratio[1]:.1%}"),
        ("mean L / S_fp / U_fp", f"{lengths['mean_L']:.1f} / {lengths['mean_S_fp']:.1f} / {lengths['mean_U_fp']:.1f}"),
        ("mean S_fp / L, U_fp / L", f"{lengths['mean_S_fp_over_L']:.2f}, {lengths['mean_U_fp_over_L']:.2f}"),
        ("H(code | token) / H(token | code), bits",
         f"{a.lexical.code_given_token:.2f} / {a.lexical.token_given_code:.2f}"),
    ]
    key_numbers += [(f"stability, {name} edit (all / unedited tokens)", f"{r.share:.3f} / {r.share_unedited:.3f}")
                    for name, r in a.stability.items()]
    params = a.topology_params
    sources = a.doc_freq >= MIN_SOURCE_UNITS
    sections = [
        "# Codebook report\n",
        f"Fingerprinter `{fingerprinter}`: {a.fingerprinter['codes']} codes of dimension "
        f"{a.fingerprinter['code_dim']}, encoder `{a.fingerprinter['encoder']}`, "
        f"{a.fingerprinter['steps']} training steps. Sample: {len(a.sample.texts)} texts from `{source}`.\n",
        "## Key numbers\n", markdown_table(("quantity", "value"), key_numbers) + "\n",
        "## Code usage\n",
        "A code is dead here when no token of the sample maps to it.\n", image("usage"),
        "## Code vectors\n", image("norms"), image("distances"), image("pca"),
        "## Fingerprint lengths\n", "L: tokens; S_fp: codes with consecutive repeats removed; U_fp: distinct codes.\n",
        image("lengths"),
        "## Stability under small edits\n",
        "Each edited text is compared with its original token by token where the token count is unchanged.\n",
        (stability_table(a.stability) + "\n") if a.stability else "No text of the sample could be edited.\n",
        image("stability"),
        "## Co-occurrence topology\n",
        f"Built over the sample with one unit per text ({params['units']} units), "
        f"H_r = {params['max_hops']}, alpha = {params['alpha']}.\n",
        image("topology_degree"),
        f"### Strongest associations (S_code, diagonal excluded, source codes in >= {MIN_SOURCE_UNITS} texts)\n",
        associations_table(top_associations(a.code_scores, a.cooccurrence, 15, sources=sources), a.concordance)
        + "\n",
        "### Strongest multi-hop-only associations (M_ab = 0)\n",
        associations_table(top_associations(a.code_scores, a.cooccurrence, 15, indirect_only=True, sources=sources),
                           a.concordance) + "\n",
        "## Token ↔ code concordance\n", concordance_table(a.concordance) + "\n",
        "### Codes of chosen words\n", words_table(a.words) + "\n",
    ]
    if log:
        sections += ["## Training\n", image("training_losses"), image("training_codes"), image("training_perplexity")]
    path = out_dir / "report.md"
    path.write_text("\n".join(sections), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m isq.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("fingerprinter", type=Path, help="exported fingerprinter directory")
    parser.add_argument("--texts", type=Path, required=True,
                        help="one text per line, or a DailyDialog dialogues_*.txt file")
    parser.add_argument("--out", type=Path, required=True, help="report directory (created)")
    parser.add_argument("--log", type=Path, help="Lightning CSVLogger metrics.csv of the training run")
    parser.add_argument("--sample", type=int, help="analyse a random sample of N texts (seed 0)")
    parser.add_argument("--words", help="comma-separated words whose codes to list (default: frequent words)")
    parser.add_argument("--batch-size", type=int, default=64)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if not (args.fingerprinter / "config.json").is_file():
            raise InputError(f"fingerprinter directory not found (no config.json): {args.fingerprinter}")
        if args.sample is not None and args.sample < 1:
            raise InputError(f"--sample must be positive, got {args.sample}")
        if args.batch_size < 1:
            raise InputError(f"--batch-size must be positive, got {args.batch_size}")
        texts = read_texts(args.texts)
        log = read_metrics_log(args.log) if args.log else None
        try:
            fingerprinter = Fingerprinter.from_pretrained(args.fingerprinter)
        except (OSError, ValueError) as err:
            raise InputError(f"cannot load fingerprinter {args.fingerprinter}: {err}") from err
    except InputError as err:
        print(f"isq.report: error: {err}", file=sys.stderr)
        return 2
    matplotlib.use("Agg")  # files only: no window even if something imports pyplot
    if args.sample:
        texts = sample_texts(texts, args.sample)
    words = [w.strip() for w in args.words.split(",") if w.strip()] if args.words else []
    analysis = analyse(fingerprinter, texts, words, args.batch_size)
    path = write_report(analysis, args.out, str(args.fingerprinter), str(args.texts), log)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
