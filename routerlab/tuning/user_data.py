"""A visitor's own training text (the Train tab): read it, check it, split it, say what to fix.

Accepted: pasted text or an uploaded `.txt` / `.jsonl` file.
- JSONL (every non-blank line a JSON object): chat `messages`, `instruction` (+ `input`) with or without
  an `output`, a bare `prompt`, or plain `text`. A row with a prompt and no answer (no assistant turn, no
  `output`) is *to be answered*: the full model answers it before training, as `data build` does.
- Anything else is plain text: each paragraph (split at blank lines; one under MIN_CHARS joins the next, one
  over 2 x CHUNK characters is cut near CHUNK) is an example with no prompt, every token a response token.

A held-out slice (1 in 5 by a hash of the text, at least one example) is set aside and never trained on.
Problems come back as RouterLabError naming what to fix (and the file by its name only): empty, not text, half a
character (an unpaired surrogate, pasted or as a JSON escape), too long, a bad or too deeply nested JSONL line, too
few examples. Knows nothing about models or the UI.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from routerlab.core.base.errors import RouterLabError
from routerlab.tuning.data import Record, json_lines, record_from_row, split_of

CHUNK = 1200  # characters: a paragraph longer than twice this is cut into pieces of about this size
MIN_CHARS = 40  # a plain-text chunk shorter than this is too little to learn from
MIN_EXAMPLES = 6  # at least 5 to train on and 1 held out
MAX_CHARS = 1_000_000  # default cap; operators set ROUTERLAB_TRAINING_MAX_CHARS


@dataclass(frozen=True)
class UserData:
    """The records of a visitor's text, split; `to_answer`: records whose response the full model must write first."""

    train: tuple[Record, ...]
    heldout: tuple[Record, ...]
    source: str  # "pasted text", or the file's name
    layout: str  # "plain text" or "JSONL"

    @property
    def to_answer(self) -> int:
        return sum(1 for r in (*self.train, *self.heldout) if not r.response)

    def describe(self) -> str:
        answered = f"; {self.to_answer} prompts to be answered by the full model first" if self.to_answer else ""
        return (f"{self.source} ({self.layout}): {len(self.train)} training examples, "
                f"{len(self.heldout)} held out{answered}")


def read_text(pasted: str | None, path: str | Path | None, max_chars: int = MAX_CHARS) -> tuple[str, str]:
    """(text, source name) of an uploaded file (it wins) or of pasted text; checks it is text of a sane size."""
    if path:
        path = Path(path)
        if path.suffix.lower() not in (".txt", ".jsonl", ".json", ".md"):
            raise RouterLabError(f"{path.name} is not a .txt or .jsonl file.", "Upload plain text (.txt) or JSON lines (.jsonl).")
        if not path.is_file():  # a full server makes room by deleting the oldest uploads (ui/state/uploads.py)
            raise RouterLabError(f"{path.name} is no longer on the server: uploads are deleted to make room when the server is full.",
                                 "Upload it again, then press Start.")
        size = path.stat().st_size
        if size > 4 * max_chars:
            raise RouterLabError(f"{path.name} is {size / 1e6:.1f} MB; this server trains on at most {max_chars:,} characters.",
                                 "Upload a shorter file (a few hundred examples are plenty for routers).")
        raw = path.read_bytes()
        if b"\x00" in raw[:65536]:
            raise RouterLabError(f"{path.name} looks like a binary file, not text.", "Upload a .txt or .jsonl file saved as UTF-8 text.")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise RouterLabError(f"{path.name} is not UTF-8 text (byte {err.start}).", "Save it as UTF-8 and upload it again.") from None
        source = path.name
    else:
        text, source = pasted or "", "pasted text"
    _check_text(text, f"The {'file ' + source if path else 'pasted text'}")
    if not text.strip():
        raise RouterLabError(f"The {'file ' + source if path else 'pasted text'} is empty.",
                             "Paste some text (paragraphs separated by blank lines) or upload a .txt / .jsonl file.")
    if len(text) > max_chars:
        raise RouterLabError(f"{source} has {len(text):,} characters; this server trains on at most {max_chars:,}.",
                             "Use a shorter text (a few hundred examples are plenty for routers).")
    return text, source


def _check_text(text: str, what: str) -> None:
    """A RouterLabError when `text` holds half a character (a lone surrogate: pasted, or a JSON "\\ud800" escape),
    which no tokenizer or file can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RouterLabError(f"{what} holds half a character (an unpaired surrogate, U+{ord(text[err.start]):04X}) at "
                             f"character {err.start + 1:,}.", "Remove it, or copy the text again from where it came from.") from None


def _is_jsonl(text: str) -> bool:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return bool(lines) and all(line.startswith("{") for line in lines)


def _jsonl_records(text: str, source: str) -> list[Record]:
    return [_row_record(row, f"{source}, line {n}") for n, row in json_lines(text.splitlines(), lambda n: f"{source}, line {n}:")]


def _row_record(row: dict, where: str) -> Record:
    """A row with an answer as data.record_from_row reads it; a prompt without one as a record to answer."""
    try:
        record = _row_record_unchecked(row, where)
    except UnicodeEncodeError:  # split_of hashes the text's UTF-8 bytes: say where, as _check_text does
        raise RouterLabError(f"{where} holds half a character (an unpaired surrogate, such as a JSON \"\\ud800\" escape).",
                             "Remove it, or copy the text again from where it came from.") from None
    for text in (record.response, *(m["content"] for m in record.messages), *(m["role"] for m in record.messages)):
        _check_text(text, where)
    return record


def _row_record_unchecked(row: dict, where: str) -> Record:
    if isinstance(row.get("prompt"), str) and not any(k in row for k in ("messages", "instruction", "text")):
        row = {"instruction": row["prompt"], **({"output": row["response"]} if isinstance(row.get("response"), str) else {})}
    if "instruction" in row and "output" not in row:
        text = str(row["instruction"]) + (f"\n\n{row['input']}" if row.get("input") else "")
        return Record(({"role": "user", "content": text},), "", split_of(text))
    msgs = row.get("messages")
    if isinstance(msgs, list) and msgs and not any(isinstance(m, dict) and m.get("role") == "assistant" for m in msgs):
        turns = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in msgs
                      if isinstance(m, dict) and "role" in m and "content" in m)
        user = next((m["content"] for m in turns if m["role"] == "user"), "")
        if not user.strip():
            raise RouterLabError(f"{where}: the messages have no user turn.", "Each chat row needs a message with role 'user'.")
        return Record(turns, "", split_of(user))
    record = record_from_row(row, where)
    if not record.response.strip() and not record.messages:
        raise RouterLabError(f"{where}: the text is empty.", "Remove the line or give it some text.")
    return record


def _plain_records(text: str) -> list[Record]:
    """One example per paragraph: a short one (under MIN_CHARS) joins the next, a long one is cut at spaces near CHUNK."""
    paragraphs = [" ".join(p.split()) for p in text.replace("\r\n", "\n").split("\n\n")]
    chunks, carry = [], ""
    for p in (p for p in paragraphs if p):
        p = f"{carry}\n\n{p}" if carry else p
        if len(p) < MIN_CHARS:
            carry = p
            continue
        carry = ""
        while len(p) > 2 * CHUNK:
            cut = p.rfind(" ", 0, CHUNK)
            cut = cut if cut > 0 else CHUNK
            chunks.append(p[:cut])
            p = p[cut:].lstrip()
        chunks.append(p)
    if carry and chunks:
        chunks[-1] = f"{chunks[-1]}\n\n{carry}"
    return [Record((), c, split_of(c)) for c in chunks if len(c) >= MIN_CHARS]


def parse_user_data(pasted: str | None = None, path: str | Path | None = None, max_chars: int = MAX_CHARS) -> UserData:
    """A visitor's text as split records, or a RouterLabError that says what to fix."""
    text, source = read_text(pasted, path, max_chars)
    layout = "JSONL" if _is_jsonl(text) else "plain text"
    records = _jsonl_records(text, source) if layout == "JSONL" else _plain_records(text)
    if len(records) < MIN_EXAMPLES:
        how = ("add more lines" if layout == "JSONL" else
               f"add more paragraphs (separated by blank lines, each at least {MIN_CHARS} characters)")
        raise RouterLabError(f"{source} gives {len(records)} examples; training needs at least {MIN_EXAMPLES} "
                             f"(one in five is held out).", f"Give more text: {how}.")
    heldout = [r for r in records if r.split == "heldout"]
    if not heldout:  # the hash held nothing out: hold out every fifth
        records = [replace(r, split="heldout" if k % 5 == 4 else "train") for k, r in enumerate(records)]
        heldout = [r for r in records if r.split == "heldout"]
    train = [r for r in records if r.split != "heldout"]
    if len(train) < MIN_EXAMPLES - 1:
        train, heldout = train + heldout[1:], heldout[:1]
    return UserData(tuple(train), tuple(heldout), source, layout)
