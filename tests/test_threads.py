"""The room's thread count (core/serve/threads.py): chosen from the loop's own step times per batch size, tried again now
and then, and changed when the load changes. Driven with made-up step times: nothing here depends on the machine."""

from __future__ import annotations

from routerlab.core.serve.threads import ThreadTuner


def _tuner(**kw):
    calls = []
    tuner = ThreadTuner(choices=(1, 2), set_threads=calls.append, **kw)
    return tuner, calls


def _run(tuner, steps: int, rows: int, cost: dict[int, float]) -> list[int]:
    used = []
    for _ in range(steps):
        t = tuner.before(rows)
        used.append(t)
        tuner.after(rows, cost[t] * rows)
    return used


def test_both_counts_in_turns_first_then_the_faster_with_short_trials_side_by_side():
    tuner, calls = _tuner(explore_every=20, trial=2)
    used = _run(tuner, 100, 8, {1: 0.010, 2: 0.006})
    assert used[:5] == [1, 2, 1, 2, 2]  # the two counts in turns from the first step (measured side by side), then the faster
    assert used.count(2) >= 90 and 1 in used[20:]  # mostly the faster, the other tried again later
    assert calls[:2] == [1, 2] and len(calls) < 30  # the count is set only when it changes


def test_one_stalled_step_decides_nothing():
    """A count's first step met another process (the web server drawing the first token): its record is the median
    of its recent steps, so the faster count is still kept, and a later trial measures afresh."""
    tuner, _ = _tuner(explore_every=20, trial=3)
    costs = iter([0.030] + [0.006] * 200)  # two threads: one stalled step, then quiet ones
    used = []
    for _ in range(60):
        t = tuner.before(1)
        used.append(t)
        tuner.after(1, next(costs) if t == 2 else 0.010)
    assert tuner.choice(1) == 2 and used[4:].count(2) >= 50


def test_a_trial_forgets_the_counts_older_steps():
    tuner, _ = _tuner(explore_every=10, trial=3)
    _run(tuner, 30, 8, {1: 0.004, 2: 0.009})  # under load: one thread wins, two threads' record is of loaded steps
    assert tuner.choice(8) == 1
    used = _run(tuner, 40, 8, {1: 0.004, 2: 0.003})  # the load went: the next trial of two threads sees it at once
    assert tuner.choice(8) == 2 and used[-10:].count(2) >= 7  # the rest: a trial of one thread


def test_a_change_of_load_changes_the_choice():
    tuner, _ = _tuner(explore_every=10, trial=3)
    _run(tuner, 50, 8, {1: 0.010, 2: 0.006})  # quiet: two threads win
    used = _run(tuner, 60, 8, {1: 0.010, 2: 0.020})  # another process takes a core: two threads stall
    assert tuner.choice(8) == 1 and used[-30:].count(1) >= 20  # the rest: short trials of two threads again


def test_batch_sizes_keep_their_own_records():
    tuner, _ = _tuner(explore_every=1000)
    _run(tuner, 10, 1, {1: 0.010, 2: 0.006})
    _run(tuner, 10, 32, {1: 0.002, 2: 0.004})
    assert tuner.choice(1) == 2 and tuner.choice(32) == 1
    assert set(tuner.summary()) == {"1+ rows", "32+ rows"}


def test_one_choice_never_explores():
    tuner = ThreadTuner(choices=(1,), set_threads=lambda n: None)
    assert _run(tuner, 50, 4, {1: 0.01}) == [1] * 50


def test_long_forwards_get_every_thread_and_the_step_its_own_choice_back():
    tuner, calls = _tuner()
    _run(tuner, 10, 8, {1: 0.004, 2: 0.009})  # under load one thread steps faster
    assert tuner.current == 1
    assert tuner.widest() == 2 and calls[-1] == 2  # a packed prefill or quality pass: both threads
    assert tuner.before(8) == 1 and calls[-1] == 1  # the next step: its own choice again
    before = dict(tuner.per_token)
    tuner.after(8, 0.004 * 8)
    assert set(tuner.per_token) == set(before)  # timed as a 1-thread step, as it ran


def test_trials_come_less_often_while_they_keep_the_choice_and_at_once_when_the_load_changes():
    tuner, _ = _tuner(explore_every=10, trial=2, backoff=4)
    used = _run(tuner, 200, 8, {1: 0.010, 2: 0.006})
    starts = [i for i in range(len(used)) if used[i] == 1 and (i == 0 or used[i - 3:i] == [2, 2, 2])]  # where each trial began
    assert [b - a for a, b in zip(starts, starts[1:])] == [20, 40, 40, 40, 40]  # twice as far apart each time, up to 4 x 10
    used = _run(tuner, 20, 8, {1: 0.010, 2: 0.030})  # another process takes a core: two threads' steps stall
    assert 1 in used[:5] and tuner.choice(8) == 1  # tried within a few steps, not after the 40-step wait
    assert used[3:7] == [1, 2, 1, 2] and used[7:13] == [1] * 6  # side by side, then the new choice
    assert used[13:17] == [2, 1, 2, 1]  # the choice changed: its next trial comes after the shortest wait again (10)
