"""A Train-tab job end to end on the embedded model (prompts without answers are answered by the full model first,
then routers train, are calibrated, compared and saved); answering within the job's time budget (prompts cut to the
training window, the rest left out when the budget's share for it is spent), Stop while answering, a job abandoned
by a closed tab; and the one-at-a-time line of the training runner. Time bounds are generous (a shared 2-core
machine); the measured figures are in docs/operators.md."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from routerlab.core.base.errors import RouterLabError
from routerlab.tuning.job import JobSettings, TrainJob
from routerlab.tuning.runner import TrainingRunner
from routerlab.tuning.user_data import parse_user_data


def test_a_job_answers_its_prompts_trains_compares_and_saves(embedded, tmp_path):
    from routerlab.tuning.checkpoint import load_routers, shipped_routers

    rows = [{"prompt": f"Name one animal that lives in the {w}."} for w in ("sea", "desert", "forest", "arctic", "jungle", "river", "mountains", "city")]
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = parse_user_data(path=tmp_path / "mine.jsonl")
    assert data.to_answer == len(rows)
    settings = JobSettings(minutes=10, max_steps=2, batch_size=2, max_tokens=64, answer_tokens=8, checkpoints=0)  # the steps end it, not the budget
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
    nan, inf = float("nan"), float("inf")
    for key in ("skip", "minutes", "lr", "kd_weight", "lm_weight", "max_steps"):
        for value in (nan, inf, -inf):
            with pytest.raises(RouterLabError, match="must be a finite number"):
                JobSettings(**{key: value})
    assert JobSettings().label == "mine: attention-token, 3 min" and replace(JobSettings(), minutes=2.5).label.endswith("2.5 min")


def _prompts(tmp_path, n: int, long: int = 0):
    rows = [{"prompt": f"Question {k}: name one thing about the number {k}."} for k in range(n)]
    rows += [{"prompt": "Summarise this. " + "The quick brown fox jumps over the lazy dog. " * long}] if long else []
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return parse_user_data(path=tmp_path / "prompts.jsonl")


def _run(job, timeout: float = 240) -> float:
    t0 = time.perf_counter()
    worker = threading.Thread(target=job.run, daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"the job did not end in {timeout} s ({job.snapshot()['phase']})"
    return time.perf_counter() - t0


def test_cut_prompt_keeps_a_prompt_within_the_training_window(embedded):
    from routerlab.tuning.data import cut_prompt, prompt_tokens

    tok = embedded.tokenizer
    short = ({"role": "user", "content": "Name a colour."},)
    assert cut_prompt(short, tok, 160) == (short, False)
    long = ({"role": "user", "content": "Read this. " + "The quick brown fox jumps over the lazy dog. " * 400},)
    (messages, cut) = cut_prompt(long, tok, 160)
    assert cut and prompt_tokens(messages, tok) <= 160 and messages[0]["content"].startswith("Read this. The quick")
    assert messages[0]["content"].endswith(" …")


def test_answering_counts_against_the_budget_and_too_many_prompts_end_with_a_message(embedded, tmp_path):
    """400 short prompts and one of ~4,000 tokens with the shortest budget: answering stops at its share of the
    budget (40% of 15 s), the long prompt is cut, and the job ends soon after its budget either trained on what
    was answered or failed saying how many were answered; never still answering."""
    data = _prompts(tmp_path, 400, long=400)
    job = TrainJob(embedded.model, embedded.tokenizer, JobSettings(minutes=0.25, checkpoints=0), tmp_path / "out", data=data)
    took = _run(job)
    snap = job.snapshot()
    assert snap["answer_until"] == pytest.approx(6.0) and 0 < snap["answered"] < snap["to_answer"] <= 401
    assert snap["phase"] in ("done", "failed"), snap["message"]
    assert f"answered {snap['answered']} of your 401 prompts in the 6 s of the time budget set aside for answering" in snap["message"]
    if snap["phase"] == "done":
        assert "the rest were left out" in snap["message"] and "1 prompt longer than 160 tokens was cut to fit" in snap["message"]
        assert snap["result"]["examples"] < 401
    assert took < 15 + 60, took  # the budget, plus a generous bound for the evaluation's reserve on a busy machine


def test_stop_while_answering_ends_at_once_and_a_closed_tab_deletes_the_jobs_folder(embedded, tmp_path):
    data = _prompts(tmp_path, 200)
    job = TrainJob(embedded.model, embedded.tokenizer, JobSettings(minutes=10), tmp_path / "out", data=data)
    worker = threading.Thread(target=job.run, daemon=True)
    worker.start()
    end = time.monotonic() + 120
    while job.phase != "answering" and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(1.0)  # mid-batch: the first batch of answers takes several seconds
    asked = time.perf_counter()
    job.stop()
    worker.join(60)
    took = time.perf_counter() - asked
    snap = job.snapshot()
    assert snap["phase"] == "stopped" and snap["message"] == "Stopped while answering: nothing was trained yet."
    assert took < 10, took  # one generated token after the flag (measured: well under a second, docs/operators.md)
    # abandoned (the tab closed) while running: it ends as Stop does, saves nothing and deletes its folder
    ended = threading.Event()
    job = TrainJob(embedded.model, embedded.tokenizer, JobSettings(minutes=10), tmp_path / "gone", data=data)
    (tmp_path / "gone").mkdir()
    worker = threading.Thread(target=job.run, daemon=True)
    worker.start()
    while job.phase != "answering" and worker.is_alive():
        time.sleep(0.05)
    job.abandon(then=ended.set)
    assert ended.wait(60) and job.phase == "stopped" and not (tmp_path / "gone").exists()
    # abandoned while waiting in line: cancelled and cleaned up at once
    ended.clear()
    waiting = TrainJob(embedded.model, embedded.tokenizer, JobSettings(), tmp_path / "never", data=data)
    waiting.abandon(then=ended.set)
    assert ended.is_set() and waiting.phase == "cancelled"
