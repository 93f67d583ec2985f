"""A streaming handler's frames as the page receives them, made in the handler's own thread.

Gradio postprocesses each output of each frame (a component's `postprocess`, then a pydantic dump) by handing it to
its thread pool and back, one hand-off per output: frames of Explore's ten outputs cost 2.6-2.8 ms of the web
process each, against 1.0-1.4 ms when the handler gives them ready (`python -m routerlab.bench.frames`: a Gradio app
with the same outputs, 300 frames to one client, two rounds each way; a 2-core Xeon). In a room every visitor's
frames are drawn on the machine that decodes, so an event bound with `postprocess=False` yields
`ready(outputs, values)`: the same components' own `postprocess`, called here, and their models dumped, as Gradio
would have; an update (`gr.update(...)`, or a component instance) keeps its properties and gets its value
postprocessed the same way. `gr.skip()` passes as it is. Knows nothing about runs, traces or tensors.
"""

from __future__ import annotations

from typing import Any, Sequence

from gradio.blocks import Block
from gradio.data_classes import GradioModel, GradioRootModel


def ready(outputs: Sequence, values: Sequence) -> tuple:
    """`values` (one per output component) as Gradio sends them when it postprocesses them itself."""
    if len(values) != len(outputs):
        raise ValueError(f"{len(values)} values for {len(outputs)} outputs")
    return tuple(_ready(component, value) for component, value in zip(outputs, values))


def _ready(component, value: Any) -> Any:
    if isinstance(value, Block):  # a component as an update: its constructor's arguments are the properties it sets
        value = {**value.constructor_args, "__type__": "update"}
    if isinstance(value, dict) and value.get("__type__") == "update":
        if "value" not in value:
            return value
        return {**value, "value": _dumped(component.postprocess(value["value"]))}
    return _dumped(component.postprocess(value))


def _dumped(value: Any) -> Any:
    return value.model_dump() if isinstance(value, (GradioModel, GradioRootModel)) else value
