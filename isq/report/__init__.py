"""Codebook report: the analysis figures as PNG files plus a Markdown summary.

    python -m isq.report DIR [--texts FILE] --out REPORT_DIR [--log RUN_DIR_OR_CSV] [--sample N]

The figure and table functions are shared with ``notebooks/codebook_analysis.ipynb``.
Modules: ``inputs`` (text sample and training log), ``analyse`` (every result from one
fingerprinter pass), ``figures``, ``tables``, ``document`` (``report.md``) and ``cli``.
"""

from __future__ import annotations

from isq.report.analyse import (
    DEFAULT_WORDS,
    MULTI_HOP,
    CodebookAnalysis,
    analyse,
    multi_hop_scores,
    sample_topology,
)
from isq.report.cli import main
from isq.report.document import MIN_SOURCE_UNITS, write_report
from isq.report.figures import (
    CODE_COLUMNS,
    LOSS_PANELS,
    PERPLEXITY_COLUMNS,
    degree_figure,
    distances_figure,
    lengths_figure,
    norms_figure,
    pca_figure,
    stability_figure,
    training_figures,
    usage_figure,
)
from isq.report.inputs import InputError, default_sample, read_metrics_log, read_texts, repository_root
from isq.report.tables import associations_table, concordance_table, stability_table, words_table

__all__ = [
    "CODE_COLUMNS",
    "DEFAULT_WORDS",
    "LOSS_PANELS",
    "MIN_SOURCE_UNITS",
    "MULTI_HOP",
    "PERPLEXITY_COLUMNS",
    "CodebookAnalysis",
    "InputError",
    "analyse",
    "associations_table",
    "concordance_table",
    "default_sample",
    "degree_figure",
    "distances_figure",
    "lengths_figure",
    "main",
    "multi_hop_scores",
    "norms_figure",
    "pca_figure",
    "read_metrics_log",
    "read_texts",
    "repository_root",
    "sample_topology",
    "stability_figure",
    "stability_table",
    "training_figures",
    "usage_figure",
    "words_table",
    "write_report",
]
