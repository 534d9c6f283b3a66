"""``multi+kmeans``: the k-means control as the code channel of the same multi-route retrieval."""

from __future__ import annotations

from retrieval.eval.locomo import load_locomo
from retrieval.eval.results import read_questions
from retrieval.eval.run import EvalModels, EvaluationSettings, evaluate
from tests.test_evaluate import HashEmbedder, fingerprinter_dirs, fingerprinters, write_locomo  # noqa: F401

CONFIGS = ["multi", "multi+code", "multi+kmeans"]


def _found(out) -> dict[str, list[list[str]]]:
    rows = read_questions(out / "questions.jsonl")
    return {name: [row.found[name] for row in rows] for name in CONFIGS}


def test_multi_kmeans_is_multi_code_with_the_controls_codebook(tmp_path, fingerprinters):  # noqa: F811
    """Swapping the two fingerprinters swaps multi+code and multi+kmeans question for question,
    and leaves multi (no code channel) as it was: the configuration's code channel is the control's."""
    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    swapped = {"trained": fingerprinters["kmeans"], "kmeans": fingerprinters["trained"]}
    runs = {}
    for label, pair in (("as given", fingerprinters), ("swapped", swapped)):
        out = tmp_path / label
        results = evaluate(conversations, EvalModels(pair, HashEmbedder()), out,
                           EvaluationSettings(CONFIGS, 1, 1, progress=False))
        assert all(results.configs[name].overall.mean_retrieved == 2.0 for name in CONFIGS)
        runs[label] = _found(out)
    assert runs["swapped"]["multi+kmeans"] == runs["as given"]["multi+code"]
    assert runs["swapped"]["multi+code"] == runs["as given"]["multi+kmeans"]
    assert runs["swapped"]["multi"] == runs["as given"]["multi"]
    assert runs["as given"]["multi+code"] != runs["as given"]["multi+kmeans"]  # the two codebooks differ here
