"""When a streamed frame is due (ui/stream.Pacer), on a fake clock: no threads, no timing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from routerlab.ui.state.stream import MEASURED_PLOT_SLACK, POLL, Pacer


def run(measuring=True, scoring=False, chunks=0):
    return SimpleNamespace(measuring=measuring, scoring=scoring, quality_chunks=chunks)


def test_text_and_plot_frames_follow_the_clock_when_nothing_is_measured():
    p = Pacer(text_every=0.5, plot_every=2.0)
    assert p.due(0.0, 10, started=True) is True  # the first frame draws everything
    assert p.due(0.1, 12) is None  # text not due yet
    assert p.due(0.6, 12) is False  # text only
    assert p.due(1.2, 12) is None  # nothing new
    assert p.due(2.1, 14) is True  # the plot's turn
    assert p.wait(2.1) == pytest.approx(0.5)


def test_no_frame_while_a_quality_pass_runs_and_the_plot_right_after_it():
    p, r = Pacer(text_every=0.5, plot_every=2.0), run()
    assert p.due(0.0, 10, [r]) is True
    r.scoring = True
    assert p.due(1.0, 20, [r]) is None  # text was due: held while the pass runs
    assert p.due(1.5, 24, [r]) is None
    assert p.wait(1.5) == POLL  # a held frame is looked at again soon
    r.scoring, r.quality_chunks = False, 1
    assert p.due(1.6, 24, [r]) is True  # the strip has new scores: the plot now, not at 2.0
    assert p.due(2.2, 30, [r]) is False  # text only


def test_the_clock_draws_a_measured_run_only_after_a_long_wait_for_its_next_pass():
    p, r = Pacer(text_every=0.5, plot_every=2.0), run()
    assert p.due(0.0, 10, [r]) is True
    assert p.due(2.5, 40, [r]) is False  # a plain run would redraw here; this one waits for its pass
    late = MEASURED_PLOT_SLACK * 2.0
    assert p.due(late - 0.1, 50, [r]) is False
    assert p.due(late + 0.1, 60, [r]) is True  # no pass for that long (a slow machine): the clock draws


def test_a_finished_pass_redraws_even_without_new_tokens():
    p, r = Pacer(text_every=0.5, plot_every=2.0), run()
    assert p.due(0.0, 10, [r]) is True
    r.quality_chunks = 1  # e.g. scored while the run was held: same steps, new scores
    assert p.due(0.1, 10, [r]) is True
    assert p.due(0.2, 10, [r]) is None



def test_frames_come_less_often_for_each_visitor_as_a_room_grows():
    """Up to SHARED_ROWS_PER_PACE generations sharing a step: the usual pace; 8 sharing: twice the intervals."""
    from routerlab.ui.state.stream import SHARED_ROWS_PER_PACE

    alone, shared = SimpleNamespace(measuring=False, scoring=False, quality_chunks=0, sharing=SHARED_ROWS_PER_PACE), \
        SimpleNamespace(measuring=False, scoring=False, quality_chunks=0, sharing=2 * SHARED_ROWS_PER_PACE)
    for r, factor in ((alone, 1.0), (shared, 2.0)):
        p = Pacer(text_every=0.5, plot_every=2.0)
        assert p.due(0.0, 1, [r]) is True
        assert p.next_text == 0.5 * factor and p.next_plot == 2.0 * factor


def test_the_first_generated_token_shows_at_once_whatever_the_rooms_pace():
    """32 sharing a step: text every 4 s, but the frame with the first generated token is not held for the pace."""
    r = SimpleNamespace(measuring=False, scoring=False, quality_chunks=0, sharing=32)
    p = Pacer(text_every=0.5, plot_every=2.0)
    assert p.due(0.0, 40, [r]) is True  # the prompt's frame; the next text waits 4 s
    assert p.due(0.3, 41, [r], started=True) is False  # the first token: text now
    assert p.due(0.6, 43, [r], started=True) is None  # later tokens keep the pace
    assert p.due(4.4, 60, [r], started=True) is False


def test_the_next_look_comes_soon_until_the_first_generated_token_was_shown():
    """The prompt's frame sets the next text half a second away; the first token must not wait for it (a visitor
    alone saw the first token 0.8 s after pressing Generate, with 17 tokens already decoded)."""
    p = Pacer(text_every=0.5, plot_every=2.0)
    assert p.due(0.0, 40, started=False) is True  # the prompt read: its frame
    assert p.wait(0.0) == POLL  # look again soon: the first token is due at once
    assert p.due(0.05, 41, started=True) is False  # there it is: its text now
    assert p.wait(0.05) == pytest.approx(0.5)  # then the usual pace
