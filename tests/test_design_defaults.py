"""The defaults docs/design.md states, pinned: the tests elsewhere build their settings from the
same constants, so a changed default would pass them all. A change here is a change of the science,
made in the design doc and the shipped configs together."""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta
from pathlib import Path

import yaml

from isq.config import ISQConfig
from isq.quantizer import EMAQuantizer
from retrieval.consolidation import config as consolidation
from retrieval.consolidation.prefix import strip_prefix, time_prefix
from retrieval.multi_route import params

ROOT = Path(__file__).resolve().parent.parent
ISQ = {"num_codes": 1024, "code_dim": 256, "kernel_size": 3, "ema_decay": 0.99, "ema_eps": 1e-5, "beta": 0.10,
       "lambda_vq": 1.0, "lambda_ent": 0.01, "entropy_temperature": 1.0, "revive_every": 20,
       "revive_threshold": 1.0, "kmeans_init": False, "lambda_rec": 0.0, "lambda_nce": 0.0}
"""§1: the paper's codebook and loss (and the two terms this project adds, off)."""


def test_the_codebook_defaults_are_the_papers():
    config = ISQConfig()
    assert {name: getattr(config, name) for name in ISQ} == ISQ
    quantizer = inspect.signature(EMAQuantizer).parameters
    assert {name: quantizer[name].default for name in quantizer if name in ISQ} == {
        name: ISQ[name] for name in quantizer if name in ISQ}


def test_the_paper_config_trains_with_the_papers_values():
    block = yaml.safe_load((ROOT / "configs" / "isq_t5base_dailydialog.yaml").read_text())["model"]["isq"]
    given = [name for name in ISQ if name in block]
    assert {name: block[name] for name in given} == {name: ISQ[name] for name in given}
    assert set(ISQ) - {"lambda_rec", "lambda_nce"} <= set(block)


def test_the_retrieval_constants_are_table_14s_and_appendix_c4s():
    assert (params.PLAN_DEPTH, params.RRF_KAPPA, params.MAX_ROUTE_QUOTA) == (15, 60.0, 4)
    assert (params.S_BEST, params.S_ROUTE) == (0.82, 0.18)
    assert (params.MMR_RELEVANCE, params.MMR_SIMILARITY) == (0.75, 0.25)
    assert [params.record_budget(k) for k in (5, 20)] == [30, 60]
    assert [params.turn_budget(k) for k in (5, 30)] == [20, 30]
    assert [params.temporal_budget(k) for k in (5, 20)] == [100, 200]
    assert [params.rerank_limit(k) for k in (5, 40)] == [100, 160]
    quotas = [params.route_quota(k, routes) for k, routes in ((5, 2), (16, 2), (100, 1), (1, 3))]
    assert quotas == [2, 4, 4, 1]
    assert params.final_top_k(5) == 15 and params.final_top_k(20) == 20
    weights = params.ChannelWeights()
    assert weights.weight("temporal", "temporal") == weights.weight("aggregate", "nodes") == 2.0
    assert {weights.weight("single", channel) for channel in params.CHANNELS} == {1.0}


def test_the_consolidation_defaults_are_the_design_docs():
    assert (consolidation.OFFLINE_THRESHOLD, consolidation.LLM_THRESHOLD) == (0.10, 0.25)
    assert (consolidation.WINDOW_DAYS, consolidation.PREFIX_MIN_SPAN_MINUTES) == (30.0, 60.0)
    config = consolidation.ConsolidationConfig()
    assert (config.linkage, config.window_days, config.prefix_min_span_minutes) == ("complete", 30.0, 60.0)


def test_a_merge_spanning_exactly_the_minimum_gets_no_prefix_and_a_minute_more_does():
    start, span = datetime(2023, 5, 8, 10, 0), timedelta(minutes=consolidation.PREFIX_MIN_SPAN_MINUTES)
    assert time_prefix(start, start + span, span) == ""
    longer = time_prefix(start, start + span + timedelta(minutes=1), span)
    assert longer == "[2023-05-08 10:00 to 2023-05-08 11:01] "


def test_a_prefix_before_the_year_1000_writes_four_digits_and_is_stripped_again():
    prefix = time_prefix(datetime(523, 5, 8, 10), datetime(523, 6, 1, 10), timedelta(hours=1))
    assert prefix == "[0523-05-08 to 0523-06-01] " and strip_prefix(prefix + "Ann lives in Paris.") == \
        "Ann lives in Paris."
    assert time_prefix(datetime(9, 5, 8, 10), datetime(9, 5, 8, 12), timedelta(hours=1)) == \
        "[0009-05-08 10:00 to 0009-05-08 12:00] "
