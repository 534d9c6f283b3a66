"""``results.md`` and the pictures of an evaluation, from its :class:`Results`; every table goes
through :func:`isq.markdown.markdown_table`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from isq.markdown import markdown_table
from isq.topology import TopologyParams
from retrieval.eval.curves import CURVES_FILE, plot_curves
from retrieval.eval.forest import FOREST_FILE, comparisons, write_forest
from retrieval.eval.results import Recommended, Results, RetrievalSummary, Summary, SweepRow


def pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _metric_table(configs: Mapping[str, Summary], metric: str, categories: Sequence[str]) -> str:
    """One row per configuration: ``metric`` overall and per category, in percent."""
    rows = [[name, pct(getattr(summary.overall, metric))]
            + [pct(getattr(summary.by_category[c], metric)) if c in summary.by_category else "–"
               for c in categories]
            for name, summary in configs.items()]
    return markdown_table(["configuration", "overall", *categories], rows,
                          align=["l"] + ["r"] * (len(categories) + 1))


def _codebook_table(results: Results) -> str:
    headers = ["codebook", "size", "codes used", "utilisation", "codes/AMU", "codes/query",
               "mean AMU share per code", "codes in ≥50% of AMUs"]
    rows = [[name, str(d.codebook_size), str(d.codes_used), f"{pct(d.utilisation)}%",
             f"{d.mean_codes_per_amu:.1f}", f"{d.mean_codes_per_query:.1f}",
             f"{pct(d.mean_amu_share_per_code)}%", f"{d.codes_in_half_the_amus:.1f}"]
            for name, d in results.codebooks.items()]
    return markdown_table(headers, rows, align=["l"] + ["r"] * (len(headers) - 1))


def _cost_table(configs: Mapping[str, RetrievalSummary]) -> str:
    """Mean items, mean tokens of retrieved text and median latency per configuration."""
    def number(value: float | None, form: str) -> str:
        return "–" if value is None else format(value, form)

    rows = [[name, number(s.overall.mean_retrieved, ".1f"), number(s.overall.mean_tokens, ".0f"),
             number(s.overall.latency_ms, ".1f")] for name, s in configs.items()]
    return markdown_table(["configuration", "mean items", "mean tokens", "median latency (ms)"], rows,
                          align=["l", "r", "r", "r"])


def _multi_lines(results: Results) -> list[str]:
    """The multi-route section: planner, reranker, plans, nodes, bank construction."""
    multi = results.multi
    assert multi is not None
    types = ", ".join(f"{name} {count}" for name, count in sorted(multi.question_types.items()))
    nodes = "; ".join(f"{cid}: " + ", ".join(f"{kind} {n}" for kind, n in counts.items())
                      for cid, counts in multi.nodes.items())
    banks = ", ".join(f"{cid} {seconds:.1f} s" for cid, seconds in multi.bank_seconds.items())
    return ["## Multi-route retrieval", "",
            f"- planner: {multi.planner}{_made_by(multi.planner, multi.plans_by)}; "
            f"reranker: {multi.reranker}",
            f"- question types: {types}; mean routes per plan {multi.mean_routes:.2f}",
            f"- evidence nodes with active records: {nodes}",
            f"- route banks built in: {banks}", ""]


def _made_by(planner: str, plans_by: dict[str, int] | None) -> str:
    """`` (plans made by: llm:m 300, rule 4)`` where another planner than ``planner`` made plans
    (the rule planner, for an LLM planner's fallbacks)."""
    if plans_by is None or set(plans_by) <= {planner}:
        return ""
    made = ", ".join(f"{name} {count}" for name, count in sorted(plans_by.items()))
    return f" (plans made by: {made})"


def render_markdown(results: Results, sweep_rows: Sequence[SweepRow]) -> str:
    """``results.md``: tables per configuration and category, construction, codebooks, sweep, answers."""
    configs = results.configs
    first = next(iter(configs.values()))
    categories = list(first.by_category)
    counts = ", ".join(f"{c} {first.by_category[c].n}" for c in categories)
    settings = results.settings
    lines = ["# LoCoMo retrieval evaluation", ""]
    for key in ("command", "locomo", "fingerprinter", "kmeans_fingerprinter", "embedder"):
        if value := getattr(settings, key):
            lines.append(f"- {key}: `{value}`")
    lines += [f"- conversations: {', '.join(settings.conversations)}; questions: "
              f"{first.overall.n} ({counts})",
              f"- topology: {TopologyParams(**settings.topology.model_dump()).label()}", "",
              "## Evidence recall@k (%)", "", _metric_table(configs, "recall", categories), "",
              "## Evidence hit@k (%): at least one evidence turn retrieved", "",
              _metric_table(configs, "hit", categories), "",
              "## All evidence retrieved (%)", "", _metric_table(configs, "complete", categories), "",
              "## Cost per query", "", _cost_table(configs), "",
              "Tokens: whitespace words x 1.3 of the retrieved items' text (records, raw turns). Latency: "
              "median wall time of one retrieval (planning included; "
              "question and route-query vectors and codes are computed beforehand in one batch for every "
              "configuration).",
              "Code/BM25 path hits tied with that path's last score (so ranked by AMU order, not score): "
              + ", ".join(f"{name} {pct(s.overall.tied_at_cut)}%" for name, s in configs.items()
                          if s.overall.tied_at_cut is not None) + ".", ""]
    if results.multi is not None:
        lines += _multi_lines(results)
    block = results.consolidation
    if block is not None:
        before, after = block.recall_ceiling_before.overall.recall, block.recall_ceiling_after.overall.recall
        lines += ["## Consolidation", "",
                  f"Operator {', '.join(block.operator)} (distance threshold "
                  f"{', '.join(map(str, block.threshold))}): "
                  f"active AMUs {block.amus_before} -> {block.amus_active_after}, {block.clusters} clusters, "
                  f"{block.archived} archived into {block.created} merged AMUs ("
                  + (", ".join(f"{op} {n}" for op, n in block.operations.items()) or "none")
                  + f"); {block.count_sensitive} held back as count-sensitive; "
                    f"{block.lost_turns} source turns "
                  f"lost; {block.seconds:.1f} s, {block.llm_calls} LLM calls, {block.tokens} tokens. Recall "
                  f"ceiling {pct(before)}% before, {pct(after)}% after.", ""]
    gap = results.lexical_gap
    if gap is not None and gap.recall:
        lines += ["## Lexical-gap subset", "",
                  f"{gap.questions} questions ({pct(gap.share)}%) whose evidence turns share no content-word "
                  "stem with the question; evidence recall@k (%) on them:", "",
                  markdown_table(("configuration", "recall"),
                                 [(name, pct(value)) for name, value in gap.recall.items()],
                                 align=("l", "r")), ""]
    evidence = results.evidence
    lines += ["## Evidence", "",
              f"{evidence.questions} questions scored, {evidence.evidence_ids} evidence ids; skipped: "
              + (", ".join(f"{n} of category {k}" for k, n in evidence.skipped_categories.items()) or "none")
              + f"; {evidence.questions_without_evidence} questions without usable evidence"
              + (f" ({', '.join(evidence.unscored_questions)})" if evidence.unscored_questions else "")
              + f"; {len(evidence.repaired_items)} items repaired, "
              f"{len(evidence.unparsed_items)} unparsable, {len(evidence.unknown_ids)} ids naming no turn.",
              "Recall ceiling (evidence turns that some AMU points to): "
              f"{pct(evidence.recall_ceiling.overall.recall)}%.", ""]
    for key in ("repaired_items", "unparsed_items", "unknown_ids"):
        if items := getattr(evidence, key):
            lines.append(f"- {key}: " + "; ".join(items[:20]))
    c = results.construction
    lines += ["", "## Construction", "",
              f"- {c.amus} AMUs from {c.segments} segments (extractor {c.extractor}); "
              f"{c.llm_calls} LLM calls, {c.tokens} tokens",
              f"- construction {c.seconds:.1f} s (ingestion {c.ingest_seconds:.1f} s, summed over the runs "
              "that built the store, + AMU embedding, trained-codebook indexing and route banks of this run; "
              "on a reused store the cached embeddings make the last three cheap)"
              + (f"; not recorded for {', '.join(c.unrecorded)}, built outside the evaluation "
                 "(retrieval.ingest, a server): their ingestion is in no sum here" if c.unrecorded else ""),
              "- this run: " + ", ".join(f"{k} {v}" for k, v in c.this_run.items()),
              *(["- per conversation: "
                 + ", ".join(f"{cid} {s:.1f} s" for cid, s in c.per_conversation.items())]
                if c.per_conversation else []),
              f"- wall time of this run: {results.wall_seconds:.1f} s", "",
              "## Codebooks", "", _codebook_table(results)]
    if sweep_rows and results.sweep is not None:
        lines += ["", *render_sweep(sweep_rows, results.sweep.recommended)]
    answers = results.answers
    lines += ["", "## Answer stage", ""]
    if answers.status == "done":
        lines += [f"Model `{answers.model}`; query tokens {answers.query_tokens} "
                  f"({answers.query_tokens_per_question:.0f} per answered question); "
                  f"failures {answers.failed}.",
                  "", "LoCoMo F1 (%):", "", _metric_table(answers.configs, "f1", categories), "",
                  "LLM judge, CORRECT (%):", "", _metric_table(answers.configs, "judge", categories)]
    else:
        lines.append(f"Skipped: {answers.note}.")
    lines += ["", "![recall per configuration and category](recall.png)", ""]
    if results.recall_curves is not None:
        lines += ["Recall@k for k = 5 ... 100, one retrieval per configuration at the largest k, cut "
                  "(`retrieval/eval/curves.py`):", "", f"![recall@k curves]({CURVES_FILE})", ""]
    if comparisons(settings.configs, settings.k_dense + settings.k_code):
        lines += ["Paired differences per category and on the lexical-gap subset, mean and 95% bootstrap "
                  "interval (`python -m retrieval.paired`'s statistics):", "",
                  f"![paired differences]({FOREST_FILE})", ""]
    return "\n".join(lines)


def render_sweep(rows: Sequence[SweepRow], recommended: Recommended) -> list[str]:
    """The sweep as a table (overall and multi-hop recall per swept configuration), best first."""
    names = list(rows[0].configs)
    primary = recommended.config

    def multi(summary: RetrievalSummary) -> str:
        block = summary.by_category.get("multi-hop")
        return pct(block.recall) if block else "–"

    ordered = sorted(rows, key=lambda r: -r.configs[primary].overall.recall)
    table = markdown_table(
        ["H_r", "α", "self", "aggregate",
         *(f"{n} {group}" for n in names for group in ("overall", "multi-hop"))],
        [[str(row.max_hops), str(row.alpha), "on" if row.self_term else "off", row.aggregate,
          *(cell for n in names for cell in (pct(row.configs[n].overall.recall), multi(row.configs[n])))]
         for row in ordered],
        align=["r", "r", "l", "l"] + ["r", "r"] * len(names))
    return ["## Topology sweep (evidence recall@k, %)", "",
            f"Recommended for {primary}: H_r={recommended.max_hops}, α={recommended.alpha}, self term "
            f"{'on' if recommended.self_term else 'off'}, aggregate {recommended.aggregate} "
            f"(overall {pct(recommended.overall.recall)}%).", "", table]


def write_pictures(results: Results, out_dir: Path) -> None:
    """The pictures ``results.md`` links, beside it: recall per category (``recall.png``), the
    recall@k curves and the forest plot of paired differences (from ``questions.jsonl``)."""
    plot_recall(results, out_dir / "recall.png")
    if results.recall_curves is not None:
        plot_curves(results.recall_curves, out_dir / CURVES_FILE)
    settings = results.settings
    write_forest(out_dir / "questions.jsonl", settings.configs, settings.k_dense + settings.k_code,
                 out_dir / FOREST_FILE)


def plot_recall(results: Results, path: Path) -> None:
    """Grouped bars: evidence recall per category (and overall), one bar per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = results.configs
    first = next(iter(configs.values()))
    groups = ["overall", *first.by_category]
    counts = [first.overall.n] + [first.by_category[g].n for g in groups[1:]]
    width = 0.8 / max(len(configs), 1)
    figure, axes = plt.subplots(figsize=(2 + 1.6 * len(groups), 5))
    positions = np.arange(len(groups))
    for i, (name, summary) in enumerate(configs.items()):
        values = [summary.overall.recall] + [summary.by_category[g].recall for g in groups[1:]]
        axes.bar(positions + (i - (len(configs) - 1) / 2) * width, [100 * v for v in values], width,
                 label=name)
    axes.set_xticks(positions, [f"{g}\n(n={n})" for g, n in zip(groups, counts, strict=True)])
    axes.set_ylabel("evidence recall@k (%)")
    axes.set_ylim(0, 100)
    axes.set_title("LoCoMo evidence recall per configuration")
    # below the axes, so that no bar hides behind it
    axes.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
