"""A step-by-step driver for tests that act on a generation while it runs: hold it, act, release it.

The UI decodes in a worker thread, so "move the slider after 3 tokens, before the end" is a race
between threads unless the run waits for the test. `Holding` wraps an Engine (everything but
`generate` is forwarded) and lets a test arm a `Hold` on the next run that matches:

    with engine.hold(after=3, max_new_tokens=30) as held:
        ...start the run (a handler, an HTTP request)...
        held.wait()                     # the run has exactly 3 generated tokens, and waits
        ...move the threshold, stop, cancel...
    # leaving the block releases the run (also when the test failed), so nothing stays held

The engine reads `control.threshold` and `control.stop_requested` at the start of each step
(core/decode/engine.py `_steps`), so whatever the test does while the run is held applies from the next
token on: a move to token after+1 (unless that is the run's last token, which keeps the threshold
it had), a stop before it. `after=0` holds right after the prefill; `release(until=n)` lets the run
go on to n tokens and hold again. A held run also lets go by itself when it is asked to stop (Stop,
a cancelled stream, a closed tab all end in `Control.request_stop`), so a test that stops a held
run through a blocking API call cannot deadlock. A held run streams no new frames, and Gradio acts
on a cancel or a closed tab only at a frame: see test_reliability.py for the one extra token that
takes. The timeouts below only guard against a hang; no assertion depends on how fast a thread runs.
"""

from __future__ import annotations

import threading
import time

WAIT_S = 120.0  # the most a test waits for a run to reach its hold (a guard against hangs, not a pace)
HOLD_LIMIT_S = 600.0  # the most a run stays held if a test never releases it (a guard for the decoder thread)
POLL_S = 0.01  # how often a held run looks at its stop flag


class Hold:
    """One run, held after its `after`-th generated token (0: after the prefill, before any token is
    sampled, so even a run that would end at once is held) until `release()` or a stop request."""

    def __init__(self, holding: "Holding", after: int, match: dict):
        if after < 0:
            raise ValueError("hold after 0 (the prefill) or more generated tokens")
        self._holding = holding
        self.after: int | None = after
        self.match = match
        self.control = None  # the run's Control, once a run was claimed
        self.tokens = 0  # generated tokens the run has produced so far
        self.held = False  # the run is waiting now
        self.held_at: int | None = None  # generated tokens when it was last held
        self.ended = False  # the run's step iterator finished (or was closed)
        self.let_go_by: str | None = None  # "release", "stop" or "timeout": what ended the last wait
        self._cond = threading.Condition()

    # -- the test's side -------------------------------------------------------------------------
    @property
    def was_held(self) -> bool:
        return self.held_at is not None

    def _reached(self) -> bool:
        return self.held_at is not None and self.after is not None and self.held_at >= self.after

    def wait(self, timeout: float = WAIT_S) -> None:
        """Block until the run is held at `after` tokens; fail clearly if it ended first or never got there."""
        with self._cond:
            self._cond.wait_for(lambda: self._reached() or self.ended, timeout)
            reached, ended, tokens, claimed = self._reached(), self.ended, self.tokens, self.control is not None
        if reached:
            return
        if ended:
            raise AssertionError(f"the run ended after {tokens} generated tokens, before its hold at {self.after}")
        if not claimed:
            raise AssertionError(f"no run matching {self.match} started within {timeout:.0f} s")
        raise AssertionError(f"the run was not held at {self.after} tokens within {timeout:.0f} s (it has {tokens})")

    def wait_ended(self, timeout: float = WAIT_S) -> None:
        """Block until the run's step iterator finished; fail clearly if it did not."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.ended, timeout):
                raise AssertionError(f"the run did not end within {timeout:.0f} s (it has {self.tokens} tokens)")

    def release(self, until: int | None = None) -> None:
        """Let the run go on: to the end, or until it has `until` generated tokens (then `wait()` again)."""
        with self._cond:
            self.after = until
            self._cond.notify_all()

    @property
    def trace(self):
        return self.control.trace if self.control is not None else None

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, *exc) -> None:
        self._holding.disarm(self)
        self.release()

    # -- the run's side (the decoder thread) --------------------------------------------------------
    def _drive(self, steps, control):
        """Pass the run's steps through, waiting once the trace holds the prompt and `after` generated tokens."""
        try:
            for step in steps:
                if not step.is_prompt:
                    self._maybe_wait(control, generated=True)
                elif step.position == control.trace.meta["prompt_tokens"] - 1:  # the prefill's last step
                    self._maybe_wait(control, generated=False)
                yield step
        finally:
            steps.close()  # a closed consumer (cancelled stream) closes the engine's loop too
            with self._cond:
                self.ended, self.held = True, False
                self._cond.notify_all()

    def _maybe_wait(self, control, generated: bool) -> None:
        with self._cond:
            self.tokens += generated
            if self.after is None or self.tokens < self.after:
                return
            self.held, self.held_at = True, self.tokens
            self._cond.notify_all()
            give_up = time.monotonic() + HOLD_LIMIT_S
            while True:
                if self.after is None or self.tokens < self.after:
                    self.let_go_by = "release"
                    break
                if control.stop_requested:  # Stop / cancel / closed tab: let the engine see it
                    self.let_go_by = "stop"
                    break
                if time.monotonic() > give_up:  # nobody released it: run free from here on
                    self.let_go_by, self.after = "timeout", None
                    break
                self._cond.wait(POLL_S)
            self.held = False


class Holding:
    """An Engine whose runs a test can hold (see `Hold`); everything else is the wrapped Engine's."""

    def __init__(self, engine):
        self._engine = engine
        self._armed: list[Hold] = []
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def hold(self, after: int, **match) -> Hold:
        """Arm a hold on the next run started whose prompt / GenerateConfig fields equal `match`
        (e.g. `max_new_tokens=30`, `threshold=0.2`, `prompt="..."`). Each hold takes one run."""
        held = Hold(self, after, match)
        with self._lock:
            self._armed.append(held)
        return held

    def disarm(self, held: Hold) -> None:
        with self._lock:
            if held in self._armed:
                self._armed.remove(held)

    def _claim(self, prompt, config) -> Hold | None:
        with self._lock:
            for held in self._armed:
                if all((prompt if key == "prompt" else getattr(config, key)) == value for key, value in held.match.items()):
                    self._armed.remove(held)
                    return held
        return None

    def generate(self, prompt, routers, config, control=None):
        from routerlab.core.decode.engine import Control

        control = control or Control(config.threshold)
        steps = self._engine.generate(prompt, routers, config, control)  # bad input raises here, before any step
        held = self._claim(prompt, config)
        if held is None:
            return steps
        held.control = control
        return held._drive(steps, control)
