"""Data: the three JSONL layouts, the deterministic split, tokenization, offline errors, the built-in set."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from routerlab.core.base.errors import RouterLabError
from routerlab.tuning.data import DATA_DIR, DEFAULT, PROMPTS, Record, encode, encode_all, examples_of, load_records, long_examples, read_jsonl, read_prompts, record_from_row, split_of


class _Tok:
    """A whitespace tokenizer with a chat template, enough to check where responses start."""

    chat_template = "x"
    eos_token_id = 0
    bos_token_id = 1

    def __init__(self):
        self.vocab = {}

    def _ids(self, text):
        return [self.vocab.setdefault(w, len(self.vocab) + 2) for w in text.split()]

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self._ids(text)}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + " <assistant>"


def test_three_layouts_become_records():
    chat = record_from_row({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    inst = record_from_row({"instruction": "Add", "input": "2 and 3", "output": "5"})
    text = record_from_row({"text": "plain words"})
    assert chat.messages == ({"role": "user", "content": "hi"},) and chat.response == "hello"
    assert inst.messages[0]["content"] == "Add\n\n2 and 3" and inst.response == "5"
    assert text.messages == () and text.response == "plain words"
    with pytest.raises(RouterLabError, match="none of the known layouts"):
        record_from_row({"question": "?"})
    with pytest.raises(RouterLabError, match="no assistant turn"):
        record_from_row({"messages": [{"role": "user", "content": "hi"}]})


def test_split_is_deterministic_and_holds_out_about_a_fifth():
    prompts = [f"prompt number {i}" for i in range(1000)]
    assert [split_of(p) for p in prompts] == [split_of(p) for p in prompts]
    assert 150 < sum(split_of(p) == "heldout" for p in prompts) < 250


def test_encode_puts_the_loss_on_the_response_and_end_of_turn():
    tok = _Tok()
    ex = encode(Record(({"role": "user", "content": "a b"},), "c d"), tok)
    assert ex.n_response == 3 and ex.ids[-1] == tok.eos_token_id  # "c", "d", end of turn
    plain = encode(Record((), "x y z"), tok)
    assert plain.start == 1 and plain.ids[0] == tok.bos_token_id


def test_long_examples_join_records_into_chats_cut_at_the_length_with_the_loss_on_the_second_half():
    tok = _Tok()
    records = [Record(({"role": "user", "content": f"about n{i}"},), " ".join(f"r{i}w{j}" for j in range(10))) for i in range(40)]
    out = long_examples(records, tok, 64, seed=0)
    words = {v: k for k, v in tok.vocab.items()}
    chats = [[words[t] for t in e.ids] for e in out]
    assert len(out) == 8 and all(len(e.ids) == 64 and e.start == 32 for e in out)  # 14 tokens a record: 5 records a chat
    asked = [w for chat in chats for w in chat if w.startswith("n")]
    assert len(asked) == len(set(asked)) == 40, "every record in one chat, none twice"
    assert all(chat.count("<user>") == 5 and chat[0] == "<user>" for chat in chats), "turn after turn, each chat from its start"
    assert [e.ids for e in long_examples(records, tok, 64, seed=0)] == [e.ids for e in out]
    assert asked != [w for e in long_examples(records, tok, 64, seed=1) for w in (words[t] for t in e.ids) if w.startswith("n")]
    assert examples_of(records, tok, 64) == out and examples_of(records, tok) == encode_all(records, tok)  # what --long picks
    with pytest.raises(RouterLabError, match="too short"):
        long_examples(records, tok, 10)
    with pytest.raises(RouterLabError, match="fewer than 4096 tokens"):
        long_examples(records, tok, 4096)


def test_the_shipped_documents_are_held_out_plain_text():
    from routerlab.core.base.documents import load_documents

    docs = load_records("documents", "heldout")
    assert [r.response for r in docs] == [d.text for d in load_documents()] and len(docs) >= 2
    assert all(r.messages == () and r.split == "heldout" for r in docs)
    assert load_records("documents", "train") == [], "nothing trains on them"


def test_bad_files_and_offline_hub_names_fail_cleanly(tmp_path, monkeypatch):
    with pytest.raises(RouterLabError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(RouterLabError, match="bad.jsonl:2"):
        read_jsonl(bad)
    import routerlab.core.model.models

    monkeypatch.setattr(routerlab.core.model.models, "_hub_reachable", lambda *a, **k: False)
    with pytest.raises(RouterLabError, match="offline|needs `datasets`"):
        load_records("someone/some-dataset")


def test_built_in_prompts_are_many_and_diverse_and_answered():
    prompts = read_prompts(PROMPTS)
    assert len(prompts) >= 300 and len({p["prompt"] for p in prompts}) == len(prompts)
    assert len(Counter(p["category"] for p in prompts)) >= 8
    records = read_jsonl(DEFAULT)  # `data build` resumes where it stopped: answered prompts are a prefix-free subset
    assert len(records) >= 150 and {r.messages[0]["content"] for r in records} <= {p["prompt"] for p in prompts}
    splits = Counter(r.split for r in records)
    assert splits["heldout"] >= 30 and splits["train"] >= 100
    assert all(r.split == split_of(r.messages[0]["content"]) for r in records)
    assert sum(bool(r.response.strip()) for r in records) >= 0.95 * len(records)
    rows = [json.loads(line) for line in DEFAULT.read_text().splitlines()]
    assert all(row["messages"][-1]["role"] == "assistant" for row in rows)


def test_extra_prompts_are_new_and_answered_with_the_same_split_rule():
    """assets/data/*_extra.jsonl: 720 more prompts, none in the built-in set, answered by `data build --prompts/--out`."""
    extra = read_prompts(DATA_DIR / "prompts_extra.jsonl")
    built_in = {p["prompt"].strip().lower() for p in read_prompts(PROMPTS)}
    assert len(extra) == 720 and not {p["prompt"].strip().lower() for p in extra} & built_in
    records = read_jsonl(DATA_DIR / "selfdistill_extra.jsonl")
    assert [r.messages[0]["content"] for r in records] == [p["prompt"] for p in extra]
    assert all(r.split == split_of(r.messages[0]["content"]) for r in records)
    assert Counter(r.split for r in records)["heldout"] >= 100


def test_a_missing_or_malformed_prompts_file_is_refused_cleanly(tmp_path):
    with pytest.raises(RouterLabError, match="does not exist"):
        read_prompts(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"category": "x"}\n')
    with pytest.raises(RouterLabError, match=r"bad.jsonl:2 has no \"prompt\""):
        read_prompts(bad)


def test_build_samples_when_asked_seeded_and_only_the_split_asked(embedded, tmp_path):
    from routerlab.tuning.data import build_default

    rows = [{"category": "c", "prompt": f"Name a colour number {i}."} for i in range(10, 16)]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = [r["prompt"] for r in rows if split_of(r["prompt"]) == "heldout"]
    assert held and len(held) < len(rows)

    def build(name, **kw):
        out = build_default(embedded, prompts=prompts, out=tmp_path / name, max_new_tokens=12, batch_size=4, **kw)
        return read_jsonl(out)

    greedy, again = build("g.jsonl"), build("g2.jsonl")
    assert [r.response for r in greedy] == [r.response for r in again] and len(greedy) == 6
    a, b, c = (build(f"s{i}.jsonl", temperature=1.0, seed=s) for i, s in enumerate((0, 0, 1)))
    assert [r.response for r in a] == [r.response for r in b] != [r.response for r in c]
    assert [r.response for r in a] != [r.response for r in greedy]
    only = build("h.jsonl", split="heldout")
    assert [r.messages[0]["content"] for r in only] == held
    with pytest.raises(RouterLabError, match="temperature"):
        build("bad.jsonl", temperature=-1.0)


def test_a_build_never_mixes_greedy_and_sampled_answers_in_one_file(embedded, tmp_path):
    from routerlab.tuning.data import build_default

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say hello {i}."}) + "\n" for i in range(3)))

    def build(name, limit=None, **kw):
        return build_default(embedded, prompts=prompts, out=tmp_path / name, max_new_tokens=6, batch_size=4,
                             limit=limit, **kw)

    greedy = build("g.jsonl", limit=2)
    before = greedy.read_text()
    with pytest.raises(RouterLabError, match=r"greedy decoding; this build asks for sampling at temperature 1.0"):
        build("g.jsonl", temperature=1.0, seed=0)
    assert greedy.read_text() == before  # refused before anything was written
    sampled = build("s.jsonl", limit=2, temperature=1.0, seed=0)
    with pytest.raises(RouterLabError, match=r"seed 0\); this build asks for sampling at temperature 1.0 \(seed 1\)"):
        build("s.jsonl", temperature=1.0, seed=1)
    with pytest.raises(RouterLabError, match="new --out"):
        build("s.jsonl")
    first = read_jsonl(sampled)
    resumed = read_jsonl(build("s.jsonl", temperature=1.0, seed=0))  # same decoding: resumes, answers the third
    assert [r.response for r in resumed[:2]] == [r.response for r in first] and len(resumed) == 3
