"""The report on disk: every figure as PNG plus ``report.md``, the Markdown summary that shows them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from isq.analysis import Association, degrees, top_associations
from isq.markdown import markdown_table
from isq.report.analyse import MULTI_HOP, CodebookAnalysis
from isq.report.figures import (
    degree_figure,
    distances_figure,
    lengths_figure,
    norms_figure,
    pca_figure,
    stability_figure,
    training_figures,
    usage_figure,
)
from isq.report.tables import associations_table, concordance_table, stability_table, words_table

MIN_SOURCE_UNITS = 5
"""Association tables list source codes seen in at least this many texts."""


def write_report(
    analysis: CodebookAnalysis,
    out_dir: Path,
    fingerprinter: str,
    source: str,
    log: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> Path:
    """Save every figure as PNG under ``out_dir`` and write ``report.md``; returns its path. The
    figures of a report written there before go first (a report without ``log`` has no training
    figures, and the old ones would stay beside it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    previous = out_dir / "report.md"
    if previous.is_file():
        for name in re.findall(r"\]\(([\w-]+\.png)\)", previous.read_text(encoding="utf-8")):
            (out_dir / name).unlink(missing_ok=True)
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

    def strongest(indirect_only: bool) -> list[Association]:
        sources = a.doc_freq >= MIN_SOURCE_UNITS
        scores = a.multi_hop_scores if indirect_only else a.code_scores
        return top_associations(scores, a.cooccurrence, 15, indirect_only, sources)

    params = a.topology_params
    sections = [
        "# Codebook report\n",
        f"Fingerprinter `{fingerprinter}`: {a.fingerprinter['codes']} codes of dimension "
        f"{a.fingerprinter['code_dim']}, encoder `{a.fingerprinter['encoder']}`, "
        f"{a.fingerprinter['steps']} training steps. Sample: {len(a.sample.texts)} texts from `{source}`.\n",
        "## Key numbers\n", markdown_table(("quantity", "value"), _key_numbers(a)) + "\n",
        "## Code usage\n",
        "A code is dead here when no token of the sample maps to it.\n", image("usage"),
        "## Code vectors\n", image("norms"), image("distances"), image("pca"),
        "## Fingerprint lengths\n",
        "L: tokens; S_fp: codes with consecutive repeats removed; U_fp: distinct codes.\n", image("lengths"),
        "## Stability under small edits\n",
        "Each edited text is compared with its original token by token where the token count is unchanged.\n",
        (stability_table(a.stability) + "\n") if a.stability else "No text of the sample could be edited.\n",
        image("stability"),
        "## Co-occurrence topology\n",
        f"Built over the sample with one unit per text ({params['units']} units), "
        f"H_r = {params['max_hops']}, alpha = {params['alpha']}.\n",
        image("topology_degree"),
        "### Strongest associations (S_code, diagonal excluded, "
        f"source codes in >= {MIN_SOURCE_UNITS} texts)\n",
        associations_table(strongest(indirect_only=False), a.concordance) + "\n",
        f"### Strongest multi-hop-only associations (M_ab = 0, H_r = {max(MULTI_HOP, params['max_hops'])})\n",
        f"Walked at least {MULTI_HOP} steps whatever the H_r above: one step reaches only codes that "
        "co-occur.\n",
        associations_table(strongest(indirect_only=True), a.concordance) + "\n",
        "## Token ↔ code concordance\n", concordance_table(a.concordance) + "\n",
        "### Codes of chosen words\n", words_table(a.words) + "\n",
    ]
    if log:
        sections += ["## Training\n",
                     image("training_losses"), image("training_codes"), image("training_perplexity")]
    path = out_dir / "report.md"
    path.write_text("\n".join(sections), encoding="utf-8")
    return path


def _key_numbers(a: CodebookAnalysis) -> list[tuple[str, object]]:
    """The rows of the "Key numbers" table."""
    usage, lengths = a.usage, a.lengths.summary()
    z_sq = float((a.sample.all_z_norms**2).mean())
    ratio = a.pca.explained_variance_ratio
    rows: list[tuple[str, object]] = [
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
        ("PCA explained variance (PC1, PC2)", f"{ratio[0]:.1%}, {ratio[1]:.1%}"),
        ("mean L / S_fp / U_fp",
         f"{lengths['mean_L']:.1f} / {lengths['mean_S_fp']:.1f} / {lengths['mean_U_fp']:.1f}"),
        ("mean S_fp / L, U_fp / L", f"{lengths['mean_S_fp_over_L']:.2f}, {lengths['mean_U_fp_over_L']:.2f}"),
        ("H(code | token) / H(token | code), bits",
         f"{a.lexical.code_given_token:.2f} / {a.lexical.token_given_code:.2f}"),
    ]
    rows += [(f"stability, {name} edit (all / unedited tokens)", f"{r.share:.3f} / {r.share_unedited:.3f}")
             for name, r in a.stability.items()]
    return rows
