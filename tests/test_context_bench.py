"""`bench context` (bench/context.py) on a tiny model: its curve's arithmetic, its report section and its figure."""

import math

import pytest
import torch

from routerlab.bench.context import context_point
from routerlab.bench.results.report import context_curve_markdown
from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.documents import Document, cut_to_tokens, load_documents
from routerlab.core.decode.engine import Engine
from routerlab.core.model.models import tiny_model
from routerlab.core.routing.router import RouterSet
from routerlab.ui.figures.tradeoff_plots import context_curve

COSTS = {"attention_full": 2e-4, "attention_kv_only": 5e-5, "mlp": 3e-4, "head": 1e-3, "step": 1e-2, "routing": 0.0,
         "overhead": 0.0, "context": 16.0, "per_token": {"attention_full": 1e-6, "attention_kv_only": 0.0, "step": 3e-5},
         "long_context": 64.0}


def test_cut_to_tokens_is_about_the_length_asked_and_ends_with_the_task():
    docs = [Document("a", "A", "one two three four five six seven", "task")]
    encode = lambda text: text.split()  # noqa: E731  (a word tokenizer: a token per word)
    for n in (3, 10, 40):  # 40: longer than the text, which repeats
        prompt = cut_to_tokens(docs, n, encode, "Summarise.")
        assert prompt.endswith("\n\nSummarise.") and n - 1 <= len(encode(prompt)) <= n
    assert len(load_documents()) >= 2


def test_a_context_point_times_every_case_in_lockstep_and_scores_it():
    model = tiny_model("llama")
    engine = Engine(model)
    rs = RouterSet.zeros(model, RoutingConfig.from_granularity("attention-token", [1, 2]))
    g = torch.Generator().manual_seed(0)
    for r in rs.routers.values():
        r.proj.weight.data = torch.randn(r.proj.weight.shape, generator=g) * 3.0
    ids = [(5 * j + 1) % 128 for j in range(40)]
    point = context_point(engine, ids, rs, [(0.5, "kv"), (0.7, "drop")], COSTS, new_tokens=8)
    assert point["context"] == 40 and point["full_tokens_per_second"] > 0 and len(point["runs"]) == 2
    for run in point["runs"]:
        assert run["speedup"] > 0 and run["ideal_speedup"] >= 1.0 and 0 < run["skip_rate"] < 1
        assert run["mean_kl"] is not None and 0 <= run["agreement"] <= 1
        assert run["quality_seconds_while_timed"] == 0.0  # scored after the timed steps, never inside one
    assert point["runs"][1]["skip_rate"] > point["runs"][0]["skip_rate"]  # a higher threshold skips more


RESULT = {"model": "m", "device": "cpu", "threads": 2, "routers": "attention-token", "new_tokens": 64, "quick": False, "seconds": 600.0,
          "task": "Summarise.", "command": "python -m routerlab bench context", "costs": COSTS,
          "points": [{"context": c, "full_tokens_per_second": 50.0 - c / 100, "runs": [
              {"threshold": 0.7, "kv_policy": p, "speedup": s, "ideal_speedup": s + 0.05, "skip_rate": 0.3, "mean_kl": 0.2,
               "agreement": 0.8} for p, s in (("kv", 1.0 + c / 10000), ("drop", 1.1 + c / 5000))]} for c in (128, 2048)],
          "sets": [{"set": "attention-token", "threshold": 0.5, "kv_policy": "kv",
                    **{k: {"kl_full": 0.1, "agreement": 0.9, "skip_rate": 0.05, "skip_rate_prompt": 0.04, "tokens": 96, "examples": 3,
                           "prompt_tokens": 5000} for k in ("long", "short")}}], "sets_answer_tokens": 32}


def test_the_report_section_shows_every_point_and_set():
    text = "\n".join(context_curve_markdown(RESULT))
    assert "| 2048 | 29.5 | 0.70 | drop | 30.0% | 1.51x | 1.56x | 97% | 0.200 | 80.0% |" in text
    assert "| attention-token | 0.50 | kv | 0.100 | 90.0% | 5.0% | 4.0% |" in text and "5,000 prompt tokens" in text


def test_the_trade_off_tab_draws_the_curve_or_says_what_is_missing():
    fig = context_curve(RESULT)
    measured = [t for t in fig.data if t.name.endswith("measured")]
    assert len(measured) == 2 and list(measured[1].x) == [128, 2048] and measured[1].y[1] == pytest.approx(1.5096)
    assert fig.layout.xaxis.type == "log"
    empty = context_curve(None)
    assert not empty.data and "make context" in str(empty.layout)
    assert not math.isnan(fig.data[1].y[0])
