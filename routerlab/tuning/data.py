"""Training and evaluation data: read records, tokenize them, and build the offline self-distilled default.

A record is a prompt (chat messages, possibly none) plus the response whose tokens carry the loss:
- chat JSONL: `{"messages": [{"role": ..., "content": ...}, ...]}` -> the last assistant turn is the
  response, everything before it the prompt;
- instruction JSONL: `{"instruction", "input"?, "output"}` -> user turn = instruction (+ input);
- plain JSONL: `{"text"}` -> no prompt, every token is a response token;
- a Hugging Face dataset name (needs `datasets` and the network) with any of those columns.

The offline default (`assets/data/selfdistill.jsonl`) answers the team's prompts
(`assets/data/prompts.jsonl`) with the full-depth embedded model itself, greedily, through the
engine with no routers: training then teaches routers to keep what the full model would have said.
Its train / held-out split is fixed by a hash of each prompt, so adding prompts never moves old ones.

Knows nothing about routers, losses or the training loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from routerlab.core.base.errors import RouterLabError
from routerlab.core.base.paths import ASSETS

log = logging.getLogger(__name__)

DATA_DIR = ASSETS / "data"
PROMPTS = DATA_DIR / "prompts.jsonl"
DEFAULT = DATA_DIR / "selfdistill.jsonl"
HELDOUT_EVERY = 5  # 1 prompt in 5 (by hash) is held out
SPLITS = ("train", "heldout", "all")
DOCUMENTS = "documents"  # load_records: the shipped long documents as held-out text


@dataclass(frozen=True)
class Record:
    """One example as text: the chat turns before the response, and the response itself."""

    messages: tuple[dict, ...]  # prompt turns (empty for plain text)
    response: str
    split: str = "train"


@dataclass(frozen=True)
class Example:
    """One tokenized example: `ids` (prompt + response) and where the response starts."""

    ids: tuple[int, ...]
    start: int  # index of the first response token; the loss covers ids[start:]

    @property
    def n_response(self) -> int:
        return len(self.ids) - self.start


def split_of(prompt: str) -> str:
    """Deterministic train / held-out assignment by a hash of the prompt text."""
    h = int(hashlib.sha256(prompt.strip().encode()).hexdigest(), 16)
    return "heldout" if h % HELDOUT_EVERY == 0 else "train"


# -- reading -------------------------------------------------------------------------------------
def record_from_row(row: dict, where: str = "") -> Record:
    """Normalise one JSON row (messages / instruction+output / text) into a Record."""
    split = row.get("split") if row.get("split") in ("train", "heldout") else None
    if isinstance(row.get("messages"), list) and row["messages"]:
        msgs = [m for m in row["messages"] if isinstance(m, dict) and "role" in m and "content" in m]
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
        if last is None:
            raise RouterLabError(f"{where}: the messages have no assistant turn to learn from.",
                                 "Each chat row needs at least one message with role 'assistant'.")
        prompt = tuple({"role": m["role"], "content": str(m["content"])} for m in msgs[:last])
        user = next((m["content"] for m in prompt if m["role"] == "user"), str(msgs[last]["content"]))
        return Record(prompt, str(msgs[last]["content"]), split or split_of(user))
    if "instruction" in row and "output" in row:
        text = str(row["instruction"]) + (f"\n\n{row['input']}" if row.get("input") else "")
        return Record(({"role": "user", "content": text},), str(row["output"]), split or split_of(text))
    if isinstance(row.get("text"), str):
        return Record((), row["text"], split or split_of(row["text"]))
    keys = str(sorted(row)[:6])  # the visitor's own keys, quoted whole (no path is cut out of them)
    raise RouterLabError(f"{where}: a row has none of the known layouts (keys: {keys}).",
                         "Use chat `messages`, `instruction`/`input`/`output`, or plain `text`.", quoted=(keys,))


def json_lines(lines, where):
    """(line number, object) for each non-blank line; a RouterLabError naming the line otherwise.
    `where(n)` starts the message, e.g. "data.jsonl:3 is" or "pasted text, line 3:"."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise RouterLabError(f"{where(n)} not valid JSON ({err.msg}).", "Each line must be one JSON object.") from None
        except RecursionError:  # the parser recurses once per level of nesting
            raise RouterLabError(f"{where(n)} nested too deeply to be a training example.",
                                 "Each line must be one flat JSON object (messages / instruction / prompt / text).") from None
        if not isinstance(row, dict):
            raise RouterLabError(f"{where(n)} not a JSON object.", "Each line must be one JSON object.")
        yield n, row


def _json_objects(path: Path, missing: str, fix: str):
    """(line number, object) for each non-blank line of a JSONL file; RouterLabError naming the line otherwise."""
    if not path.is_file():
        raise RouterLabError(missing, fix)
    with path.open() as f:
        yield from json_lines(f, lambda n: f"{path}:{n} is")


def read_jsonl(path: str | Path) -> list[Record]:
    path = Path(path)
    records = [record_from_row(row, f"{path}:{n}") for n, row in _json_objects(
        path, f"Data file {path} does not exist.", "Pass a JSONL file, or omit --data for the built-in set.")]
    if not records:
        raise RouterLabError(f"{path} holds no examples.", "Add JSONL rows, or omit --data for the built-in set.")
    return records


def read_hub(name: str, split: str = "train", limit: int | None = None) -> list[Record]:
    """Rows of a Hugging Face dataset (online only)."""
    try:
        import datasets  # optional: not needed offline
    except ImportError:
        raise RouterLabError(f"{name!r} is not a local file, and loading a Hugging Face dataset needs `datasets`.",
                             "pip install datasets (online), or pass a local JSONL file.") from None
    from routerlab.core.model.models import _hub_reachable

    if not _hub_reachable():
        raise RouterLabError(f"{name!r} is not a local file and the Hugging Face Hub cannot be reached (offline).",
                             "Pass a local JSONL file, or omit --data for the built-in self-distilled set.")
    rows = datasets.load_dataset(name, split=split)
    if limit:
        rows = rows.select(range(min(limit, len(rows))))
    return [record_from_row(dict(r), f"{name}[{i}]") for i, r in enumerate(rows)]


def load_records(source: str | Path | None = None, split: str = "all") -> list[Record]:
    """Records from a JSONL path, a hub dataset name, (None) the built-in self-distilled set, or `documents`: the
    shipped long documents' texts (assets/documents, human-written, tuned on by nothing), as held-out plain text."""
    if split not in SPLITS:
        raise RouterLabError(f"Unknown split {split!r}.", f"Choose one of: {', '.join(SPLITS)}.")
    if str(source) == DOCUMENTS:
        from routerlab.core.base.documents import load_documents

        return [Record((), d.text, "heldout") for d in load_documents() if split in ("heldout", "all")]
    if source is None:
        if not DEFAULT.is_file():
            raise RouterLabError(f"The built-in data {DEFAULT} has not been built yet.",
                                 "Run `python -m routerlab data build` (about 15 minutes on 2 CPU cores).")
        source = DEFAULT
    if Path(source).exists() or str(source).endswith((".jsonl", ".json")):
        records = read_jsonl(source)
    else:
        records = read_hub(str(source))
    return [r for r in records if split == "all" or r.split == split]


# -- tokenizing ----------------------------------------------------------------------------------
def encode(record: Record, tokenizer, max_tokens: int = 512) -> Example | None:
    """Token ids of prompt (chat template, as the engine encodes it) + response + end of turn."""
    if record.messages and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(list(record.messages), tokenize=False, add_generation_prompt=True)
        prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        response = list(tokenizer(record.response, add_special_tokens=False)["input_ids"])
    elif record.messages:
        prompt = list(tokenizer("\n".join(m["content"] for m in record.messages) + "\n")["input_ids"])
        response = list(tokenizer(record.response, add_special_tokens=False)["input_ids"])
    else:
        prompt = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
        response = list(tokenizer(record.response, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        response.append(tokenizer.eos_token_id)
    ids = (prompt + response)[:max_tokens]
    if len(ids) - len(prompt) < 1 or len(ids) < 2:
        return None
    return Example(tuple(ids), max(1, len(prompt)))


def encode_all(records: list[Record], tokenizer, max_tokens: int = 512) -> list[Example]:
    out = [e for e in (encode(r, tokenizer, max_tokens) for r in records) if e is not None]
    if not out:
        raise RouterLabError("No usable examples after tokenizing (all empty or too long).", "Check the data file.")
    return out


def long_examples(records: list[Record], tokenizer, tokens: int, seed: int = 0) -> list[Example]:
    """Long inputs from short records: consecutive records (in an order shuffled by `seed`) joined into one chat, turn
    after turn, until it holds about `tokens` tokens (chat template), cut there; the loss covers its second half, so
    every position it trains on reads at least `tokens` / 2 earlier tokens. Each record serves one chat; a last chat
    shorter than `tokens` is left out. For training routers that hold at long contexts (`train --long`)."""
    if tokens < 64:
        raise RouterLabError(f"--long {tokens} is too short for a long input.", "Use 0 (each example alone) or e.g. 1024.")
    order = list(records)
    random.Random(seed).shuffle(order)
    out: list[Example] = []
    turns: list[dict] = []
    for record in order:
        turns += [*record.messages, {"role": "assistant", "content": record.response}]
        text = tokenizer.apply_chat_template(turns, tokenize=False) if getattr(tokenizer, "chat_template", None) else \
            "\n".join(t["content"] for t in turns)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(ids) >= tokens:
            out.append(Example(tuple(ids[:tokens]), tokens // 2))
            turns = []
    if not out:
        raise RouterLabError(f"The data holds fewer than {tokens} tokens in all: no long input could be made.",
                             "Use a smaller --long, or more data.")
    return out


def examples_of(records: list[Record], tokenizer, long: int = 0, max_tokens: int = 512, seed: int = 0) -> list[Example]:
    """The examples train, calibrate and eval read: each record alone (`encode_all`), or, with `long` > 0 (their
    `--long`), the records joined into inputs of about `long` tokens (`long_examples`)."""
    return long_examples(records, tokenizer, long, seed) if long else encode_all(records, tokenizer, max_tokens)


# -- the offline default: the full model answers the team's prompts -------------------------------
def read_prompts(path: Path = PROMPTS) -> list[dict]:
    """The {category, prompt} rows of a prompts file; a clear RouterLabError when it is missing or malformed."""
    path = Path(path)
    rows = []
    for n, row in _json_objects(path, f"Prompts file {path} does not exist.", 'Pass a JSONL file of {"prompt": ...} rows.'):
        if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise RouterLabError(f"{path}:{n} has no \"prompt\" text.", 'Each line needs {"prompt": "...", "category": "..."}.')
        rows.append(row)
    return rows


def _decoding(temperature: float, seed: int) -> dict:
    """How an answer was decoded, as stored on each sampled record (greedy records store nothing)."""
    return {"temperature": temperature, "seed": seed} if temperature > 0 else {}


def _answers_to_resume(out: Path, partial: Path, decoding: dict) -> dict[str, dict]:
    """Answers already in `out` or `<out>.partial`, by prompt; refuses ones decoded differently.

    Resuming a sampled build into a greedy file (or another temperature or seed) would mix two
    kinds of answers in one set, and the perplexity on it would mean neither.
    """
    done = {}
    for existing in (out, partial):
        if not existing.is_file():
            continue
        for line in existing.read_text().splitlines():
            try:
                r = json.loads(line)
                prompt = r["messages"][0]["content"]
            except (json.JSONDecodeError, KeyError, IndexError, TypeError):
                continue  # a line cut by an interruption
            theirs = {k: r[k] for k in ("temperature", "seed") if k in r}
            if theirs.get("temperature", 0) > 0 and "seed" not in theirs:
                theirs["seed"] = None  # written before seeds were stored: cannot be matched
            if theirs != decoding:
                raise RouterLabError(
                    f"{existing} already holds answers decoded with {_describe(theirs)}; this build asks for "
                    f"{_describe(decoding)}.",
                    "Write to a new --out (or delete that file): one set must not mix the two.")
            done[prompt] = r
    return done


def _describe(decoding: dict) -> str:
    if not decoding:
        return "greedy decoding"
    return f"sampling at temperature {decoding['temperature']} (seed {decoding.get('seed')})"


def build_default(loaded=None, *, prompts: Path = PROMPTS, out: Path = DEFAULT, max_new_tokens: int = 100,
                  limit: int | None = None, batch_size: int = 16, split: str = "all", temperature: float = 0.0,
                  seed: int = 0, dtype: str = "float32") -> Path:
    """Answer every prompt (of `split`) with the full-depth model (no routers); resumable.

    Prompts are answered in batches of `batch_size` (left-padded `generate` of the base model: the
    same full-depth model the engine runs with no routers, ~5x the throughput of batch-1 decoding
    on CPU). Greedy by default; with `temperature` > 0, sampled from the model's own distribution
    (no top-k/top-p), seeded: on such answers the expected rise in log-perplexity of a routed
    model is its KL from the full model, which greedy answers understate. Answers are appended to
    `<out>.partial` as they come, so an interrupted build resumes where it stopped; the finished
    file is renamed into place at the end.
    """
    if split not in SPLITS:
        raise RouterLabError(f"split={split!r} is not known.", f"Choose one of: {', '.join(SPLITS)}.")
    if not temperature >= 0:
        raise RouterLabError(f"temperature={temperature!r} must be >= 0.", "0 answers greedily, 1 samples the model as it is.")
    import torch

    from routerlab.core.model.models import load_model

    loaded = loaded or load_model(device="cpu", dtype=dtype)
    model, tok = loaded.model, loaded.tokenizer
    rows = [r for r in read_prompts(prompts) if split == "all" or split_of(r["prompt"]) == split][:limit]
    sampling = {"do_sample": False}
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        torch.manual_seed(seed)  # `generate` samples from torch's global generator
    partial = out.with_suffix(out.suffix + ".partial")
    done = _answers_to_resume(out, partial, _decoding(temperature, seed))
    todo = [r for r in rows if r["prompt"] not in done]
    start, tokens = time.perf_counter(), 0
    with partial.open("a") as f:
        for k, answer, finished, n_tokens in answer_prompts(model, tok, [[{"role": "user", "content": r["prompt"]}] for r in todo],
                                                            max_new_tokens=max_new_tokens, batch_size=batch_size, sampling=sampling):
            row, tokens = todo[k], tokens + n_tokens
            prompt = row["prompt"]
            rec = {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
                   "category": row.get("category", ""), "split": split_of(prompt), "finished": finished}
            rec.update(_decoding(temperature, seed))
            f.write(json.dumps(rec) + "\n")
            f.flush()
            done[prompt] = rec
            if len(done) % batch_size == 0:
                log.info("data build: %d/%d prompts answered, %.1f tokens/s", len(done), len(rows),
                         tokens / max(1e-9, time.perf_counter() - start))
    ordered = [done[r["prompt"]] for r in rows if r["prompt"] in done]
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in ordered))
    os.replace(tmp, out)
    partial.unlink(missing_ok=True)
    return out


def prompt_tokens(messages, tok) -> int:
    """Tokens of chat `messages` as answering and training encode them (chat template, generation prompt)."""
    text = tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def cut_prompt(messages, tok, limit: int) -> tuple[tuple[dict, ...], bool] | None:
    """(messages, cut) with the chat-templated prompt at most `limit` tokens: the longest turn's text is cut (its
    start kept, "…" added) until the prompt fits; None when even that cannot make it fit (too many turns)."""
    messages = tuple(dict(m) for m in messages)
    cut = False
    for _ in range(4):
        n = prompt_tokens(messages, tok)
        if n <= limit:
            return messages, cut
        k = max(range(len(messages)), key=lambda i: len(messages[i]["content"]))
        ids = tok(messages[k]["content"], add_special_tokens=False)["input_ids"]
        keep = len(ids) - (n - limit) - 2  # the ellipsis and a token of slack: cutting text can re-tokenize its end
        if keep < 1:
            return None
        messages = (*messages[:k], {**messages[k], "content": tok.decode(ids[:keep]).rstrip() + " …"}, *messages[k + 1:])
        cut = True
    return None


class _Halt:
    """A `generate` stopping criterion: every sequence ends after the step in which `should_stop()` turns true."""

    def __init__(self, should_stop):
        self.should_stop, self.halted = should_stop, False

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        self.halted = self.halted or bool(self.should_stop())
        return torch.full((input_ids.shape[0],), self.halted, dtype=torch.bool, device=input_ids.device)


def answer_prompts(model, tok, prompts: list[list[dict]], *, max_new_tokens: int = 100, batch_size: int = 16,
                   sampling: dict | None = None, should_stop=None):
    """Answer chat prompts with the full-depth model: yields (index, answer, finished, tokens) as each batch ends.

    Left-padded `generate` of the base model in batches of similar length (the same full-depth model the engine
    runs with no routers, ~5x the throughput of batch-1 decoding on CPU); greedy unless `sampling` says otherwise.
    `should_stop()`, checked after every generated token: once true, the batch in flight ends at once (its answers
    so far are yielded, not finished) and no other batch starts.
    """
    import torch
    from transformers import StoppingCriteriaList

    sampling = sampling or {"do_sample": False}
    encoded = [tok.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda k: len(encoded[k]))  # similar lengths together: little padding
    eos = tok.eos_token_id
    halt = _Halt(should_stop) if should_stop is not None else None
    side, tok.padding_side = tok.padding_side, "left"
    try:
        for b in range(0, len(order), batch_size):
            if halt is not None and (halt.halted or should_stop()):
                return
            batch = order[b : b + batch_size]
            enc = tok([encoded[k] for k in batch], return_tensors="pt", padding=True, add_special_tokens=False)
            extra = {"stopping_criteria": StoppingCriteriaList([halt])} if halt is not None else {}
            with torch.inference_mode():
                gen = model.generate(**enc.to(model.device), max_new_tokens=max_new_tokens, **sampling,
                                     pad_token_id=tok.pad_token_id or eos, eos_token_id=eos, **extra)
            for k, seq in zip(batch, gen[:, enc["input_ids"].shape[1]:].tolist()):
                finished = eos in seq
                seq = seq[: seq.index(eos)] if finished else seq
                yield k, tok.decode(seq, skip_special_tokens=True).strip(), finished, len(seq)
    finally:
        tok.padding_side = side
