"""Every value a visitor or an API client sends, checked by type and range in one place.

Owns the field kinds (`Number`: a finite number in a range, or a whole count; `Flag`: true or false; `Choice`: one of
the allowed strings; `Text`: a string up to a length), the app's fields (`THRESHOLD`, `MAX_NEW_TOKENS`, the Train
tab's settings, ...) and `FieldError`. A field's `check(value)` returns the value as the handler uses it, or raises a
FieldError whose message names the field by the label the visitor sees, quotes the value (core.base.errors.quote) and
says what is allowed. The page's components check their payload with their field (layout.py) and the handlers check
their arguments with the same fields, so a browser, a script and a test get the same answer.

Strict by design: a number field takes an int or a float, never a string ("0.5"), a list, a dict or a boolean
(true is not 1); NaN and infinities are refused; a count refuses fractions (2.5) and a boolean; -0.0 becomes 0.0.
A flag takes only true or false ("<img>" is not true). Knows nothing about Gradio, engines or the page's layout.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from routerlab.core.base.config import GRANULARITIES, KV_POLICIES
from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.errors import quote as shown


class FieldError(RouterLabError):
    """A value a field refuses: the message names the field (`label`) and quotes the value as sent (`quoted`)."""

    def __init__(self, label: str, problem: str, fix: str, quoted: str | None = None):
        super().__init__(f"{label}: {problem}", fix, quoted=(quoted,) if quoted else ())
        self.label = label


def _what(value) -> str:
    """What a client sent instead of a number, in words."""
    if isinstance(value, bool):
        return "a yes/no value, not a number"
    if isinstance(value, str):
        return "text, not a number"
    if isinstance(value, (list, tuple)):
        return "a list, not a number"
    if isinstance(value, dict):
        return "an object, not a number"
    return "not a number"


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


@dataclass(frozen=True)
class Number:
    """A finite number from `minimum` to `maximum` (both allowed); `whole`: a count (an int, or a float with no
    fraction, returned as an int). `optional`: None (a blank box) is returned as None."""

    label: str
    minimum: float
    maximum: float
    whole: bool = False
    optional: bool = False

    def range(self) -> str:
        kind = "a whole number" if self.whole else "a number"
        return f"{kind} from {_num(self.minimum)} to {_num(self.maximum)}"

    def within(self, minimum: float | None = None, maximum: float | None = None) -> "Number":
        """The same field with this server's bounds (a cap from the environment)."""
        return dataclasses.replace(self, minimum=self.minimum if minimum is None else minimum,
                                   maximum=self.maximum if maximum is None else maximum)

    def _refuse(self, value, problem: str) -> FieldError:
        return FieldError(self.label, f"{shown(value)} {problem}.", f"Use {self.range()}.", shown(value))

    def check(self, value) -> float | int | None:
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._refuse(value, "is " + _what(value))
        if isinstance(value, float) and not math.isfinite(value):
            raise self._refuse(value, "is not a number" if math.isnan(value) else "is infinite, not a number")
        if self.whole and isinstance(value, float) and not value.is_integer():
            raise self._refuse(value, "is not a whole number")
        if not self.minimum <= value <= self.maximum:  # an int of any size compares exactly
            raise self._refuse(value, "is out of range")
        return int(value) if self.whole else float(value) + 0.0  # + 0.0: -0.0 becomes 0.0


@dataclass(frozen=True)
class Flag:
    """True or false, nothing else (a string, 1 or a list is refused); None: `default` (a parameter left out)."""

    label: str
    default: bool = True

    def check(self, value) -> bool:
        if value is None:
            return self.default
        if not isinstance(value, bool):
            raise FieldError(self.label, f"{shown(value)} is not true or false.", "Send true or false.", shown(value))
        return value


@dataclass(frozen=True)
class Choice:
    """One of `choices` (strings, compared exactly)."""

    label: str
    choices: tuple[str, ...]

    def check(self, value) -> str:
        if not isinstance(value, str) or value not in self.choices:
            listed = ", ".join(repr(c) for c in self.choices[:8]) + (", …" if len(self.choices) > 8 else "")
            raise FieldError(self.label, f"{shown(value)} is not one of the choices.", f"Choose one of: {listed}.", shown(value))
        return value


@dataclass(frozen=True)
class Text:
    """A string of at most `max_chars` characters; None: "" (an empty box)."""

    label: str
    max_chars: int

    def within(self, max_chars: int) -> "Text":
        return dataclasses.replace(self, max_chars=max_chars)

    def check(self, value) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise FieldError(self.label, f"{shown(value)} is not text.", "Send a string.", shown(value))
        if len(value) > self.max_chars:
            raise FieldError(self.label, f"{len(value)} characters; this server takes up to {self.max_chars}.", "Shorten it.")
        return value


# -- the app's fields: the labels are the page's ----------------------------------------------------------------------
PROMPT = Text("Prompt", 16_000)  # .within(limits.max_prompt_chars)
THRESHOLD = Number("Threshold", 0.0, 1.0)
RUNGS = tuple(Number(f"Threshold {k + 1}", 0.0, 1.0, optional=True) for k in range(3))  # Compare's ladder
KV_POLICY = Choice("KV policy", tuple(KV_POLICIES))
MAX_NEW_TOKENS = Number("Max new tokens", 1, 256, whole=True)  # .within(maximum=limits.max_new_tokens)
TEMPERATURE = Number("Temperature", 0.0, 1.5)
MEASURE_QUALITY = Flag("Measure quality (full-model pass)", default=True)

# the Train tab
GRANULARITY = Choice("What to route", tuple(GRANULARITIES))
SKIP_TARGET = Number("Skip target (% of routed cells)", 5, 50)
MINUTES = Number("Time budget (minutes)", 0.5, 10.0)  # .within(maximum=limits.training_minutes)
LEARNING_RATE = Number("Learning rate", 1e-5, 1.0)
KD_WEIGHT = Number("Distillation weight", 0.0, 100.0)
LM_WEIGHT = Number("LM-loss weight", 0.0, 100.0)
MAX_STEPS = Number("Most steps", 1, 10_000, whole=True)
TRAIN_TEXT = Text("Your text", 1_000_000)  # .within(limits.training_max_chars)
