"""A Train-tab job end to end on the embedded model (prompts without answers are answered by the full model first,
then routers train, are calibrated, compared and saved), and the one-at-a-time line of the training runner."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest

from routerlab.core.errors import RouterLabError
from routerlab.tuning.job import JobSettings, TrainJob
from routerlab.tuning.runner import TrainingRunner
from routerlab.tuning.user_data import parse_user_data


def test_a_job_answers_its_prompts_trains_compares_and_saves(embedded, tmp_path):
    from routerlab.tuning.checkpoint import load_routers, shipped_routers

    rows = [{"prompt": f"Name one animal that lives in the {w}."} for w in ("sea", "desert", "forest", "arctic", "jungle", "river", "mountains", "city")]
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = parse_user_data(path=tmp_path / "mine.jsonl")
    assert data.to_answer == len(rows)
    settings = JobSettings(minutes=1, max_steps=2, batch_size=2, max_tokens=64, answer_tokens=8, checkpoints=0)
    job = TrainJob(embedded.model, embedded.tokenizer, settings, tmp_path / "out", data=data,
                   shipped=shipped_routers().get("attention-token"))
    job.run()
    snap = job.snapshot()
    assert snap["phase"] == "done", snap["message"]
    assert snap["answered"] == len(rows) and len(snap["rows"]) == 2
    assert snap["trainable"]["routers"] == len(snap["layers"]) * 576
    result = snap["result"]
    assert set(result["heldout"]["rows"]) >= {"mine at 0.5", "shipped at its default", "random at my share"}
    assert result["settings"]["max_steps"] == 2 and result["data"].startswith("mine.jsonl (JSONL)")
    routers, config = load_routers(tmp_path / "out", embedded.model)
    assert config["threshold"] == 0.5 and config["kv_policy"] == "kv"
    card = (tmp_path / "out" / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card


class _Job:
    """Stands in for a TrainJob in the runner: runs until released."""

    def __init__(self, name):
        self.settings = type("S", (), {"label": name})()
        self.release, self.started = threading.Event(), threading.Event()
        self._phase = "queued"

    @property
    def phase(self):
        return self._phase

    def stop(self):
        if self._phase == "queued":
            self._phase = "cancelled"
        self.release.set()

    def run(self):
        if self._phase == "cancelled":
            return
        self._phase = "training"
        self.started.set()
        self.release.wait(60)
        self._phase = "done"


def test_the_runner_runs_one_at_a_time_in_order_and_a_waiting_job_can_be_cancelled():
    runner = TrainingRunner(nice=0)
    a, b, c = _Job("a"), _Job("b"), _Job("c")
    assert runner.submit(a) == 0
    assert a.started.wait(30)
    assert runner.submit(b) == 1 and runner.submit(c) == 2
    assert runner.phase() == "training" and runner.position(a) == 0
    b.stop()  # cancelled while waiting: c moves up
    assert b.phase == "cancelled" and runner.position(c) == 1
    a.release.set()
    assert c.started.wait(30) and not b.started.is_set()
    c.release.set()


def test_job_settings_are_checked():
    for bad in (dict(skip=0.95), dict(minutes=0.1), dict(lr=5.0), dict(kd_weight=0, lm_weight=0), dict(granularity="head-token")):
        with pytest.raises(RouterLabError):
            JobSettings(**bad)
    assert JobSettings().label == "mine: attention-token, 3 min" and replace(JobSettings(), minutes=2.5).label.endswith("2.5 min")
