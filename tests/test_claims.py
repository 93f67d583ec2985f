"""slides/claims.py: each claim of the lesson is a check that can fail, and a missing figure is reported, not raised."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from routerlab.slides.claims import CLAIMS, check

RECORD = json.loads((Path(__file__).resolve().parent.parent / "assets" / "workshop" / "numbers.json").read_text())


def _failed(record: dict) -> list[str]:
    return [c.says for c, ok, _ in check(record) if not ok]


def test_the_shipped_run_holds_every_claim():
    assert _failed(RECORD) == []


def test_a_run_whose_skipping_falls_with_the_threshold_fails_the_ladder_claims():
    record = copy.deepcopy(RECORD)
    rows = record["figures"]["ladder"]["rows"]
    rows[1]["skip_rate"], rows[3]["skip_rate"] = rows[3]["skip_rate"], rows[1]["skip_rate"]  # 0.3 and 0.7 swapped
    failed = _failed(record)
    assert "the share skipped rises with the threshold" in failed and "0.70 skips several times as much as 0.50" in failed


def test_kv_and_mask_writing_different_texts_fails_and_a_fast_policy_fails_the_speed_claim():
    record = copy.deepcopy(RECORD)
    policies = record["figures"]["kv"]["policies"]
    policies["mask"]["text"], policies["kv"]["text"] = "The sky is blue.", "The sky is blue and more."
    policies["drop"]["speedup"] = 1.3
    failed = _failed(record)
    assert "the same text as mask" in failed and "none of the three decoded more than 10% faster than the full model" in failed


def test_a_run_without_a_figure_reports_its_claims_as_not_measured():
    record = copy.deepcopy(RECORD)
    del record["figures"]["layers"]
    results = {c.says: (ok, measured) for c, ok, measured in check(record)}
    layer_claims = [c.says for c in CLAIMS if c.exercise == 3]
    assert layer_claims and all(not results[s][0] and "not measured" in results[s][1] for s in layer_claims)
