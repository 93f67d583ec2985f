"""Input components whose bad values are refused with a message naming the field, before Gradio reads them.

The fields' own checks (`_Field`: fields.py says what each takes) on sliders, number boxes, text boxes, check boxes;
the choices of a menu (`_Checked`); Compare's threshold boxes that also take a ladder as a string (`LadderNumber`).

Gradio checks a file field's value against its data model (`FileData`) and an example list's against its samples
before any handler runs; a value of the wrong kind (a number, a string, a list where a file goes; an example index
out of range) raised a pydantic or index error there, which a client saw as `{"error": null}`. These components say
what is wrong instead (a `gr.Error`, which Gradio sends as it is): `UploadedFile` (a file field: one file, or a
list), `ExamplePrompts` (the Explore tab's example list; `examples.click` loads one into the prompt box).
Knows nothing about runs or models.
"""

from __future__ import annotations

import functools

import gradio as gr
from gradio.data_classes import FileData, ListFiles

from routerlab.core.base.errors import RouterLabError
from routerlab.ui.figures import safe
from routerlab.ui.state import fields


class _Checked:
    """An input component whose refusals of a bad value (out of bounds, not one of the choices) are expected bad input:
    the client gets the message, shown as text (Gradio renders an error's message as HTML and the value is the
    client's), and the server's log gets no traceback (Gradio prints one for every gr.Error unless told not to)."""

    def preprocess(self, payload):
        try:
            return super().preprocess(payload)
        except gr.Error as err:  # named by the component's label: "KV policy: Value: 'fast' is not in the list of choices"
            raise refused(f"{self.label}: {err.message}" if self.label else err.message) from None


def refused(message: str) -> gr.Error:
    """The gr.Error for an input the app refuses: escaped, no traceback in the log."""
    return gr.Error(safe.text(message), print_exception=False)


class _Field(_Checked):
    """An input component whose payload its field checks (fields.py) before Gradio sees it: a string, a list, a
    boolean, NaN or a value out of range is refused with the field's message (naming the field, what is allowed),
    the same message its handler gives for the same value. `field`: set by `checked` (an attribute, not a
    constructor parameter, which Gradio would send to the browser with the component's config)."""

    field = None

    def preprocess(self, payload):
        field = self.field if self.field is not None else self.default_field()
        if field is not None:
            try:
                payload = field.check(payload)
            except RouterLabError as err:
                raise refused(str(err)) from None
        return super().preprocess(payload)

    def default_field(self):
        return None


def checked(component, field):
    """`component` (a _Field) checked by `field`."""
    component.field = field
    return component


class NumberSlider(_Field, gr.Slider):
    """A Slider that answers a non-number from the API with a clear message (gr.Slider raises a bare
    TypeError on a string, None or a list, which a client sees only as "the app raised an exception")."""

    def default_field(self):
        return fields.Number(self.label or "Value", self.minimum, self.maximum)

    def get_block_name(self) -> str:
        return "slider"  # the browser draws it with gr.Slider's own component


def field_slider(field: fields.Number, **kwargs) -> NumberSlider:
    """A NumberSlider over `field`'s range, labelled as the field (so its messages name what the visitor sees)."""
    return checked(NumberSlider(field.minimum, field.maximum, label=field.label, **kwargs), field)


class CheckedDropdown(_Checked, gr.Dropdown):
    def get_block_name(self) -> str:
        return "dropdown"


class CheckedRadio(_Checked, gr.Radio):
    def get_block_name(self) -> str:
        return "radio"


class CheckedNumber(_Field, gr.Number):
    def get_block_name(self) -> str:
        return "number"


def field_number(field: fields.Number, value, **kwargs) -> CheckedNumber:
    """A number box over `field`'s range, labelled as the field."""
    return checked(CheckedNumber(value, label=field.label, minimum=field.minimum, maximum=field.maximum,
                                 precision=0 if field.whole else None, **kwargs), field)


class CheckedCheckbox(_Field, gr.Checkbox):
    """A checkbox that takes only true or false from the API ("<img>" or 1 is refused, not counted as true)."""

    def get_block_name(self) -> str:
        return "checkbox"


class CheckedTextbox(_Field, gr.Textbox):
    """A textbox that takes only a string from the API (gr.Textbox turns a number or a list into its str())."""

    def get_block_name(self) -> str:
        return "textbox"


class LadderNumber(_Checked, gr.Number):
    """A Compare threshold box that also takes a string from the API, such as "0.3, 0.5, 0.7" (the ladder in one
    argument), or any other value: `ladder_thresholds` reads it or answers what is wrong, naming the box
    (gr.Number compares a string with its bounds and raises a bare TypeError)."""

    def preprocess(self, payload):
        if isinstance(payload, (int, float)) and not isinstance(payload, bool) and 0.0 <= payload <= 1.0:
            return super().preprocess(payload)
        return payload  # None (no column), a string of thresholds, or a bad value the handler names

    def api_info(self) -> dict:
        return {"anyOf": [{"type": "number"}, {"type": "string"}, {"type": "null"}]}

    def get_block_name(self) -> str:
        return "number"  # the browser draws it with gr.Number's own component


def _kind(value) -> str:
    if isinstance(value, bool):
        return "a yes/no value"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object without a file's path"
    return type(value).__name__


def _is_file(value) -> bool:
    return isinstance(value, FileData) or isinstance(value, dict) and isinstance(value.get("path"), str)


@functools.lru_cache(maxsize=32)
def _checked_models(label: str) -> tuple[type, type]:
    """FileData and ListFiles that refuse anything but files, in a message naming `label`."""
    what = f"{label} takes a file uploaded to this app (the path its upload route answered)"

    class CheckedFile(FileData):
        @classmethod
        def model_validate(cls, obj, *args, **kwargs):  # where Gradio checks a value (a validator's error would be pydantic's)
            if not _is_file(obj):
                raise refused(f"{what}, not {_kind(obj)}.")
            return super().model_validate(obj, *args, **kwargs)

    class CheckedFiles(ListFiles):
        @classmethod
        def model_validate(cls, obj, *args, **kwargs):
            items = obj if isinstance(obj, list) else [obj]
            bad = next((v for v in items if not _is_file(v)), None)
            if bad is not None or not items:
                raise refused(f"{what}: one or a list of them, not {_kind(bad) if items else 'an empty list'}.")
            return super().model_validate(items, *args, **kwargs)

    CheckedFile.__name__ = CheckedFile.__qualname__ = "FileData"  # the API's schema names it as Gradio does
    CheckedFiles.__name__ = CheckedFiles.__qualname__ = "ListFiles"
    return CheckedFile, CheckedFiles


class UploadedFile(gr.File):
    """`gr.File` whose value must be an uploaded file (or a list of them, with `file_count="multiple"`). Its data
    model is a property, not set in an `__init__` of its own: Gradio builds a component's config from its
    constructor's signature, which must stay gr.File's."""

    @property
    def data_model(self):
        one, many = _checked_models(str(getattr(self, "label", None) or "This file field"))  # read while gr.File builds it too
        return many if getattr(self, "file_count", "single") in ("multiple", "directory") else one

    @data_model.setter
    def data_model(self, value):  # gr.File's constructor sets its own: this property answers instead
        pass

    def get_block_name(self) -> str:
        return "file"  # the browser draws it with gr.File's own component


class ExamplePrompts(gr.Dataset):
    """The example prompts as a list to click (`examples(prompts, prompt_box)` makes one, `type="index"`): an index
    that is not one of them is refused by name."""

    def preprocess(self, payload):
        n = len(self.raw_samples)
        if isinstance(payload, bool) or not isinstance(payload, int) or not 0 <= payload < n:
            shown = repr(payload)[:40]
            raise refused(f"{self.label or 'Example prompts'}: {shown} is not one of the {n} examples (an index from 0 to {n - 1}).")
        return payload

    def prompt(self, index: int) -> str:
        return self.raw_samples[index][0]

    def get_block_name(self) -> str:
        return "dataset"


def examples(prompts: list[str], prompt_box, **kwargs) -> ExamplePrompts:
    """The example list for `prompt_box`; `examples.click(examples.prompt, ...)` loads one."""
    return ExamplePrompts(components=[prompt_box], samples=[[p] for p in prompts], type="index", **kwargs)
