"""The Compare tab's threshold ladder (ui/tabs/compare.py) on a tiny random model with a character tokenizer.

The full model and up to three thresholds decode one token each in turn; a test that acts on the
running ladder holds one of its runs (tests/holding.py), and since one thread advances every run
in turn, holding one holds them all (each within a token of the held one).
"""

from __future__ import annotations

import math

import pytest
from test_ui import RANDOM, tiny_resources, run_all

from routerlab import ui
from routerlab.core.base.errors import RouterLabError
from routerlab.core.records.trace import Step, Trace
from routerlab.ui.tabs.compare import lockstep_speeds, shared_tokens, step_seconds

LADDER = [0.3, 0.5, 0.7]


@pytest.fixture(scope="module")
def res():
    return tiny_resources()


def ladder(res, session, thresholds=LADDER, max_new=24, prompt="Hello there"):
    return ui.compare_run(res, prompt, thresholds, RANDOM, "kv", max_new, 0.0, res.default_model, session)


def pull_until_held(gen, held, tokens: int) -> list:
    """Pull frames until the held run has `tokens` generated tokens (it is held right after appending the
    last one, so the frame that shows it is the last before the hold); every other run has at least
    tokens - 1 then, as one thread advances them all in turn."""
    outs = []
    for out in gen:
        outs.append(out)
        if held.trace is not None and len(held.trace.generated_steps) >= tokens:
            break
    held.wait()
    return outs


def test_ladder_streams_every_column_each_at_its_threshold(res):
    session = ui.Session()
    with res.engine.hold(after=3, threshold=0.7) as held:
        gen = ladder(res, session)
        streamed = pull_until_held(gen, held, 3)
        assert streamed[-1][-1].startswith("▶") and not any("(no tokens yet)" in c for c in streamed[-1][:4]), "all four columns stream before the end"
    outs = streamed + run_all(gen)
    assert all(len(o) == 7 for o in outs)
    *columns, table, heat, status = outs[-1]
    assert status.startswith("✓ Done")
    full, *rungs = session.compare
    assert full.meta["granularity"] == "full" and full.skip_rate() == 0.0 and full.mean_kl() == 0.0
    assert [r.meta["threshold_start"] for r in rungs] == LADDER
    for rung, t in zip(rungs, LADDER):
        assert {s.threshold for s in rung.steps} == {t} and rung.meta["granularity"] == "attention-token"
        assert rung.mean_kl() is not None, "the quality pass scored every column"
    assert rungs[0].skip_rate() < rungs[1].skip_rate() < rungs[2].skip_rate(), "higher threshold, more skipped"
    assert "Full model" in columns[0] and all(f"Threshold {t:.2f}" in c for c, t in zip(columns[1:], LADDER))
    assert all(f"threshold {t:.2f}" in table for t in LADDER) and "speedup vs full" in table and "mean KL" in table


def test_speedups_are_ratios_of_the_same_runs_speeds(res):
    session = ui.Session()
    run_all(ladder(res, session, thresholds="0.3, 0.7"))
    full, *rungs = session.compare
    rows = ui.ladder_rows(full, rungs)
    assert [r["threshold"] for r in rows] == [None, 0.3, 0.7] and rows[0]["speedup"] == 1.0
    f_tps, *speeds = lockstep_speeds([full, *rungs], shared_tokens([full, *rungs]))
    assert rows[0]["tokens_per_second"] == f_tps > 0
    for row, tps in zip(rows[1:], speeds):
        assert row["tokens_per_second"] == tps > 0
        assert row["speedup"] == pytest.approx(tps / f_tps)
        assert f"{row['speedup']:.2f}×" in ui.ladder_html(full, rungs)


def test_decode_speed_takes_out_the_quality_pass():
    steps = [Step(0, 1, "a", True, [None], [None], 0.5, 0.1)] + [Step(p, 1, "a", False, [None], [None], 0.5, 0.5) for p in (1, 2, 3, 4)]
    trace = Trace(1, steps, {"quality_seconds_in_steps": 1.0})
    assert trace.decode_tokens_per_second() == pytest.approx(4 / 2.0)
    assert ui.decode_speed(trace) == pytest.approx(4 / 1.0)


def _steps(seconds: list[float]) -> list[Step]:
    return [Step(0, 1, "a", True, [None], [None], 0.5, 0.1)] + [Step(p + 1, 1, "a", False, [None], [None], 0.5, s) for p, s in enumerate(seconds)]


def test_decode_speed_over_some_tokens_takes_out_only_their_quality_pass():
    trace = Trace(1, _steps([0.5, 0.5, 0.5, 0.5]), {"quality_seconds_by_step": [0.25, 0.0, 0.5, 0.0], "quality_seconds_in_steps": 0.75})
    assert ui.decode_speed(trace, 2) == pytest.approx(2 / (1.0 - 0.25))
    assert ui.decode_speed(trace) == pytest.approx(4 / (2.0 - 0.75))


def test_a_ladders_speeds_are_timed_over_the_tokens_every_column_decoded():
    """The full model stopped after 2 tokens; the rung decoded 2 more, fast, after it had ended: those are not
    compared with anything the full model did, so the speedup is that of the first two tokens (2x, not 3.5x)."""
    full = Trace(1, _steps([1.0, 1.0]), {})
    rung = Trace(1, _steps([0.5, 0.5, 0.1, 0.1]), {"threshold_start": 0.5})
    rows = ui.ladder_rows(full, [rung])
    assert rows[1]["timed_tokens"] == 2 and rows[1]["speedup"] == pytest.approx(2.0)
    assert "first 2 generated tokens" in ui.ladder_html(full, [rung])
    assert "2.00×" in ui.column_html(rung, full, 0.5)


def test_a_column_whose_text_ended_early_shortens_only_its_own_comparison():
    """The 0.7 column ended after 2 tokens; the 0.3 column ran on with the full model for 5 rounds, at half its step in
    the first two and a third of it in the last three. The 0.3 column is timed over the 5 rounds it shared with the
    full model (median ratio 3x, where the first two alone said 2x), the 0.7 column over its 2; the table and each
    column's header say the same, and the note names the column that was timed over fewer tokens."""
    full = Trace(1, _steps([1.0, 1.0, 1.0, 1.0, 1.0]), {})
    low = Trace(1, _steps([0.5, 0.5, 1 / 3, 1 / 3, 1 / 3]), {"threshold_start": 0.3})
    high = Trace(1, _steps([0.25, 0.25]), {"threshold_start": 0.7})
    rows = ui.ladder_rows(full, [low, high])
    assert [r["timed_tokens"] for r in rows] == [5, 5, 2]
    assert rows[1]["speedup"] == pytest.approx(3.0) and rows[2]["speedup"] == pytest.approx(4.0)
    assert "3.00×" in ui.column_html(low, full, 0.3) and "4.00×" in ui.column_html(high, full, 0.7)
    assert "first 5 generated tokens (threshold 0.70: 2, where its text ended)" in ui.ladder_html(full, [low, high])


def test_every_rung_records_its_quality_pass_per_step(res):
    session = ui.Session()
    run_all(ladder(res, session, thresholds="0.3, 0.7"))
    for rung in session.compare[1:]:
        per_step = rung.meta["quality_seconds_by_step"]
        assert len(per_step) == len(rung.generated_steps) and sum(per_step) == pytest.approx(rung.meta["quality_seconds_in_steps"])


def test_the_quick_sweep_decodes_its_runs_side_by_side_over_the_same_tokens(res):
    from routerlab.ui.tabs.tradeoff_tab import HEADERS, tradeoff_sweep

    fig, table, status = tradeoff_sweep(res, "Hello there", RANDOM, "kv", res.default_model, progress=lambda *a, **k: None)
    assert status.startswith("✓") and "side by side" in status and "first " in status
    speedups = [float(str(v).rstrip("×x")) for v in table[HEADERS["speedup"]]]
    assert len(table) == 8 and speedups[0] == 1.0 and all(s > 0 for s in speedups)


def test_first_difference_from_the_full_model_is_marked(res):
    session = ui.Session()
    *columns, table, _, _ = run_all(ladder(res, session, max_new=32))[-1]
    full, *rungs = session.compare
    found = [ui.figures.plots.first_divergence(full, r) for r in rungs]
    assert any(j is not None for j in found), "0.7 skips most cells of these routers: its text departs from the full model's"
    for j, column in zip(found, columns[1:]):
        if j is None:
            assert "rl-diverge" not in column
        else:
            assert column.count("rl-diverge") == 1 and f"token {j + 1}:" in table
    assert "rl-diverge" not in columns[0]


def test_stop_ends_every_column(res):
    session = ui.Session()
    with res.engine.hold(after=3, threshold=0.7) as held:
        gen = ladder(res, session, max_new=60)
        pull_until_held(gen, held, 3)
        assert "Stopping" in ui.stop_run(session)
    outs = run_all(gen)
    assert outs[-1][-1].startswith("■ Stopped")
    assert len(session.compare) == 4
    for trace in session.compare:
        assert trace.meta["stop_reason"] == "stopped" and len(trace.generated_steps) <= 4


def test_one_threshold_is_the_full_vs_routed_view(res):
    session = ui.Session()
    *columns, table, heat, status = run_all(ladder(res, session, thresholds=[None, 0.5, ""]))[-1]
    assert len(session.compare) == 2 and status.startswith("✓")
    assert "Threshold 0.50" in columns[1] and "(no threshold)" in columns[2] and "(no threshold)" in columns[3]


def test_ladder_thresholds_read_every_form_and_refuse_bad_ones(res):
    assert ui.ladder_thresholds("0.7, 0.3 0.5") == [0.3, 0.5, 0.7]
    assert ui.ladder_thresholds([0.5, None, 0.5]) == [0.5]
    assert ui.ladder_thresholds(0.4) == [0.4]
    assert ui.ladder_thresholds(["0.3, 0.5, 0.7", None, None]) == [0.3, 0.5, 0.7], "/compare's threshold_1 holding the ladder"
    for bad in ([None, "", None], "0.2 0.4 0.6 0.8", [1.5], "half", ["0.3, 0.5", 0.7, 0.9]):
        with pytest.raises(RouterLabError):
            ui.ladder_thresholds(bad)
    out = run_all(ladder(res, ui.Session(), thresholds=[None, None, None]))
    assert len(out) == 1 and out[0][-1].startswith("⚠") and "threshold" in out[0][-1]


@pytest.fixture
def roomed():
    """The app's Resources with a room serving the engine (as app.py runs it): its reader asks every run to stop
    when the run ends by itself, which a ladder must not report as a Stop."""
    from routerlab.core.serve.room import Room

    resources = tiny_resources()
    engine = resources.engine._engine  # the Holding's engine: generate_ids hands requests to its room
    room = engine.room = Room(engine)
    room.start()
    yield resources
    engine.room = None
    room.close()


def test_a_ladder_that_ends_by_itself_says_done_in_a_room(roomed):
    session = ui.Session()
    status = run_all(ladder(roomed, session, max_new=8))[-1][-1]
    assert status.startswith("✓ Done") and "Stopped" not in status
    assert all(t.meta["stop_reason"] != "stopped" for t in session.compare)


def test_a_stopped_ladder_says_stopped_in_a_room(roomed):
    """In a room the loop decodes the columns, not the page's reader: a hold on a reader does not pause them (they can
    all end before a Stop lands). So the loop is paused instead: it waits for the room's lock, held here (re-entrant:
    this thread submits the columns) until Stop is pressed, and every column then sees the Stop before its tokens."""
    session = ui.Session()
    room = roomed.engine._engine.room
    with room._cond:
        gen = ladder(roomed, session, max_new=60)
        first = next(gen)  # the columns are in the room's queue; the loop cannot take them yet
        assert first[-1].startswith("▶")
        ui.stop_run(session)
    assert run_all(gen)[-1][-1].startswith("■ Stopped")
    assert all(t.meta.get("stop_reason") == "stopped" for t in session.compare)


def test_a_ladders_speedup_is_the_median_of_its_rounds_so_a_busy_moment_moves_it_not():
    """Round by round the rung's step takes half the full model's; in one round the machine was busy during the full
    model's step (5 s), in another during the rung's, and one rung step held a quality pass: the speedup stays 2x
    (a sum over the steps would say 8 / 2.5 = 3.2x), and the full model's speed is that of its median step."""
    full = Trace(1, _steps([1.0, 1.0, 5.0, 1.0, 1.0]), {})
    rung = Trace(1, _steps([0.5, 3.0, 0.5, 0.5, 0.75]), {"threshold_start": 0.5, "quality_seconds_by_step": [0, 0, 0, 0, 0.25]})
    f_tps, tps = lockstep_speeds([full, rung], 5)
    assert f_tps == pytest.approx(1.0) and tps == pytest.approx(2.0)
    assert ui.ladder_rows(full, [rung])[1]["speedup"] == pytest.approx(2.0)


def test_step_seconds_leave_out_the_last_token_and_a_quality_pass_known_only_for_the_whole_run():
    trace = Trace(1, _steps([0.5, 0.5, 0.0]), {"quality_seconds_by_step": [0.25, 0.0, 0.0]})
    got = step_seconds(trace)
    assert got[:2] == [0.25, 0.5] and math.isnan(got[2])  # the last token: no forward
    old = Trace(1, _steps([0.5, 0.5]), {"quality_seconds_in_steps": 0.25})
    assert all(math.isnan(s) for s in step_seconds(old)) and lockstep_speeds([old, old]) == [None, None]


def test_a_looping_column_is_flagged_as_explore_flags_it():
    from test_plots import synthetic_trace

    from routerlab.ui.tabs.compare import column_html

    full, looping = synthetic_trace(n_gen=40), synthetic_trace(n_gen=40)
    for k, step in enumerate(looping.generated_steps):
        step.token_id = 1000 + (k % 3 if k >= 10 else k)  # ten tokens, then a 3-token unit back to back
    assert "repeats itself from token 11" in column_html(looping, full, 0.7)
    assert "repeats itself" not in column_html(full, full, 0.3) and "repeats itself" not in column_html(full, None, None)
