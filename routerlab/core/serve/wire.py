"""What crosses between the web process and the engine process (core/serve/remote.py, core/serve/engine_process.py) that pickle
alone would not carry well: router sets (by value, with a content key so the engine caches shipped sets), errors
(a RouterLabError keeps its problem and its fix), the quality meter's later updates of Steps already sent (patches),
and `trace.meta` changes (sent as differences). The message set itself is in core/serve/remote.py's docstring.

Knows nothing about pipes, processes or the UI.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import threading
import weakref
from collections import OrderedDict

import torch

from routerlab.core.base.config import RoutingConfig
from routerlab.core.base.errors import RouterLabError
from routerlab.core.records.trace import Step, Trace
from routerlab.core.routing.router import Calibration, RouterSet

SENT_KEYS = 32  # router sets the web side remembers having sent to the engine (sent again once forgotten)
CACHED_SETS = 64  # router sets the engine keeps: more than SENT_KEYS, and both see the same keys in the same order, so
# (LRU's inclusion property) every key the web side remembers is still cached in the engine


def pack_routers(routers: RouterSet | None) -> tuple[str, bytes] | None:
    """A router set as (content key, bytes): its config, shapes, calibration and weights (a few hundred KB at most).

    Packed once per set and state: a room's visitors send the same shipped set with every Generate, and serialising it
    (torch.save, then a hash) took about a millisecond of the web process each time. The cached packing is reused while
    the set holds the very same tensors (kept referenced by the cache, so their identity cannot pass to new ones), none
    changed in place (a tensor's version counter: an optimizer's step, `load_state_dict`'s copy) and the calibration is
    the same."""
    if routers is None:
        return None
    tensors = (*routers.parameters(), *routers.buffers())
    state = routers.state()
    with _packed_lock:
        hit = _packed.get(routers)
        if hit is not None and hit[1] == state:
            return hit[2]
    packed = _pack(routers)
    with _packed_lock:
        _packed[routers] = (tensors, state, packed)
    return packed


_packed: "weakref.WeakKeyDictionary[RouterSet, tuple]" = weakref.WeakKeyDictionary()  # set -> (tensors, state, packing)
_packed_lock = threading.Lock()


def _pack(routers: RouterSet) -> tuple[str, bytes]:
    c = routers.config
    buf = io.BytesIO()
    torch.save({"target": c.target, "level": c.level, "layers": list(c.layers), "n_layers": routers.n_layers,
                "hidden_size": routers.hidden_size, "standin_rank": routers.standin_rank,
                "calibration": [routers.calibration.scale, routers.calibration.shift],
                "state": {k: v.detach().cpu() for k, v in routers.state_dict().items()}}, buf)
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest(), data


def unpack_routers(data: bytes, device=None) -> RouterSet:
    d = torch.load(io.BytesIO(data), weights_only=True)
    routers = RouterSet(RoutingConfig(d["target"], d["level"], tuple(d["layers"])), d["n_layers"], d["hidden_size"], d["standin_rank"])
    routers.load_state_dict(d["state"], assign=True)  # assign: each tensor keeps the dtype it was sent with
    routers.calibration = Calibration(*d["calibration"])
    return routers.eval().to(device) if device is not None else routers.eval()


class RouterCache:
    """The engine's router sets by content key, least recently used dropped first (CACHED_SETS)."""

    def __init__(self, size: int = CACHED_SETS):
        self.size, self._sets = size, OrderedDict()

    def get(self, key: str | None, data: bytes | None, device=None) -> RouterSet | None:
        if key is None:
            return None
        if key not in self._sets:
            if data is None:
                raise RouterLabError("The engine lost this router set.", "Press Generate again.")
            self._sets[key] = unpack_routers(data, device)
        self._sets.move_to_end(key)
        while len(self._sets) > self.size:
            self._sets.popitem(last=False)
        return self._sets[key]


class SentKeys:
    """The web side's record of the keys the engine holds (see CACHED_SETS): `touch` says whether to send the bytes."""

    def __init__(self, size: int = SENT_KEYS):
        self.size, self._keys = size, OrderedDict()

    def touch(self, key: str) -> bool:
        """True when the engine may not have `key` yet (send the set's bytes)."""
        new = key not in self._keys
        self._keys[key] = True
        self._keys.move_to_end(key)
        while len(self._keys) > self.size:
            self._keys.popitem(last=False)
        return new

    def clear(self) -> None:
        self._keys.clear()


# -- errors ----------------------------------------------------------------------------------------
def pack_error(err: BaseException):
    """An exception as something that unpickles into the same kind of error on the other side."""
    if isinstance(err, RouterLabError):
        return ("routerlab", err.problem, err.fix)
    try:
        pickle.loads(pickle.dumps(err))
        return ("pickled", err)
    except Exception:
        return ("text", type(err).__name__, str(err))


def unpack_error(packed) -> BaseException:
    kind = packed[0]
    if kind == "routerlab":
        return RouterLabError(packed[1], packed[2])
    if kind == "pickled":
        return packed[1]
    return RuntimeError(f"{packed[1]}: {packed[2]}")


# -- a trace as it grows ---------------------------------------------------------------------------
class TraceWatch:
    """The engine side of one request's trace: what was sent of it, and `changes()` since then (quality patches of
    sent Steps, meta differences, and the run's Control state the UI reads)."""

    def __init__(self, trace: Trace, control):
        self.trace, self.control = trace, control
        self.sent = 0  # Steps sent, in trace order
        self.unscored: list[int] = []  # indexes of sent generated Steps whose kl_full is not in yet
        self.meta: dict = {}  # meta as last sent (one level copied)
        self.state = None

    def sent_step(self, step: Step) -> None:
        if not step.is_prompt and step.kl_full is None:
            self.unscored.append(self.sent)
        self.sent += 1

    def changes(self) -> list[tuple]:
        """("patch", index, kl_full, full_top_token, full_top_text) for each newly scored Step, ("meta", set, extend)
        and ("state", sharing, measuring, scoring, quality_chunks, prompt_tokens, prompt_read), each only when
        something changed."""
        out = []
        steps = self.trace.steps
        if self.unscored:
            waiting = []
            for i in self.unscored:
                s = steps[i]
                if s.kl_full is None:  # the meter sets kl_full last: once it is there, the top token is too
                    waiting.append(i)
                else:
                    out.append(("patch", i, s.kl_full, s.full_top_token, s.full_top_text))
            self.unscored = waiting
        changed, extended = {}, {}
        for key, value in list(self.trace.meta.items()):  # a copy: the loop thread adds keys meanwhile
            before = self.meta.get(key, _MISSING)
            if isinstance(value, list) and isinstance(before, list) and value[: len(before)] == before:
                if len(value) > len(before):
                    extended[key] = value[len(before):]
                    self.meta[key] = list(value)
            elif value != before:
                changed[key] = value
                self.meta[key] = value.copy() if isinstance(value, (dict, list)) else value
        if changed or extended:
            out.append(("meta", changed, extended))
        c = self.control
        state = (c.sharing, c.measuring, c.scoring, c.quality_chunks, c.prompt_tokens, c.prompt_read)
        if state != self.state:
            self.state = state
            out.append(("state", *state))
        return out


_MISSING = object()


class MeterView:
    """What the web side knows of a run's quality meter in the engine process: the fields `Control.measuring`,
    `Control.scoring` and `Control.quality_chunks` read (ui/state/stream.py paces frames with them)."""

    def __init__(self, measuring: bool = False, scoring: bool = False, chunks: int = 0):
        self.full_forward = True if measuring else None  # Control.measuring: "a full-depth pass exists"
        self.scoring, self.chunks = scoring, chunks


def apply_change(trace: Trace, control, change: tuple) -> None:
    """The web side of `TraceWatch.changes`: the same fields written onto the web process's trace and Control."""
    kind = change[0]
    if kind == "patch":
        _, i, kl, token, text = change
        step = trace.steps[i]
        step.full_top_token, step.full_top_text = token, text
        step.kl_full = kl  # last, as the meter does: a reader that sees the KL sees the top token
    elif kind == "meta":
        _, changed, extended = change
        trace.meta.update(changed)
        for key, tail in extended.items():
            trace.meta.setdefault(key, []).extend(tail)
    elif kind == "state":
        _, sharing, measuring, scoring, chunks, prompt_tokens, prompt_read = change
        control.meter = MeterView(measuring, scoring, chunks)
        control.sharing = sharing
        control.prompt_tokens, control.prompt_read = prompt_tokens, prompt_read  # a long prompt's progress
