"""The shipped long documents (assets/documents): texts of 1,500-3,000 tokens, each with a task, for long contexts.

Owns `Document` (a text and its task), `load_documents` (documents.json, checked: a bad entry is left out with a
warning) and `cut_to_tokens` (a prompt of about N tokens: documents joined and cut, the task after them, for
`bench context`). Pure Python: knows nothing about tensors, the engine or the UI; a tokenizer is passed in.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from routerlab.core.base.paths import ASSETS

log = logging.getLogger(__name__)

DOCUMENTS_DIR = ASSETS / "documents"


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str
    task: str
    source: str = ""
    licence: str = ""

    @property
    def prompt(self) -> str:
        """The document, then its task: what the app puts in the prompt box."""
        return f"{self.text.strip()}\n\n{self.task.strip()}"


def load_documents(folder: Path = DOCUMENTS_DIR) -> list[Document]:
    """The documents listed in `folder`/documents.json, in its order; [] when there is none."""
    try:
        items = json.loads((folder / "documents.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        log.warning("no long documents: %s", err)
        return []
    found = []
    for item in items if isinstance(items, list) else []:
        try:
            text = (folder / Path(str(item["file"])).name).read_text()  # a name in this folder, never a path elsewhere
            found.append(Document(str(item["id"]), str(item["title"]), text, str(item["task"]),
                                  str(item.get("source", "")), str(item.get("licence", ""))))
        except (OSError, KeyError, TypeError) as err:
            log.warning("skipping a long document (%r): %s", item, err)
    return found


def cut_to_tokens(documents: list[Document], tokens: int, encode: Callable[[str], list[int]], task: str) -> str:
    """A prompt whose encoding (`encode`: text -> ids, chat template and `task` included) has about `tokens` ids: the
    documents' texts joined (repeated when they are shorter), cut at a word boundary, then `task`. Within a few tokens
    of `tokens`, never over it."""
    words = " ".join(" ".join(d.text.split()) for d in documents).split(" ")
    if not words or not words[0]:
        raise ValueError("no document text to cut")

    def prompt(n: int) -> str:
        body = " ".join(words[i % len(words)] for i in range(n))
        return f"{body}\n\n{task}"

    low, high = 1, 1
    while len(encode(prompt(high))) <= tokens:  # words needed grow about linearly: double, then bisect
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if len(encode(prompt(mid))) <= tokens else (low, mid)
    return prompt(low)
