"""A visitor's own training text: what is read, how it is split, and the message for each kind of bad input."""

from __future__ import annotations

import json

import pytest

from routerlab.core.base.errors import RouterLabError
from routerlab.tuning.user_data import MIN_EXAMPLES, parse_user_data

PARAGRAPH = "The lighthouse keeper climbed the stairs at dusk, counting each step as his father had taught him. {}"


def _text(n):
    return "\n\n".join(PARAGRAPH.format(f"Night {k}.") for k in range(n))  # each paragraph ~110 characters


def test_plain_text_becomes_examples_with_a_held_out_slice_never_trained_on():
    data = parse_user_data(_text(12))
    assert data.layout == "plain text" and data.source == "pasted text"
    assert len(data.train) + len(data.heldout) == 12 and data.heldout
    assert not set(data.train) & set(data.heldout)
    assert all(not r.messages and r.response for r in data.train)
    assert data.describe().startswith("pasted text (plain text): ") and "held out" in data.describe()


def test_short_paragraphs_join_the_next_and_long_ones_are_cut():
    data = parse_user_data("Hi.\n\n" + _text(6) + "\n\n" + "word " * 1000)
    records = [*data.train, *data.heldout]
    assert len(records) == 6 + 4  # "Hi." joined the first paragraph; 5,000 characters cut into 3 pieces of ~1,200 + the rest
    assert any(r.response.startswith("Hi.") for r in records) and max(len(r.response) for r in records) <= 2400


def test_jsonl_reads_every_layout_and_marks_prompts_without_answers(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": f"a{k}"}]} for k in range(3)]
    rows += [{"instruction": f"Explain {k}.", "output": f"Because {k}."} for k in range(3)]
    rows += [{"prompt": f"Name a colour {k}."} for k in range(2)] + [{"instruction": "Say hi."}]
    rows += [{"messages": [{"role": "user", "content": "Only a question?"}]}, {"text": "A plain line of text, long enough."}]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    data = parse_user_data(path=str(path))
    assert data.layout == "JSONL" and data.source == "mine.jsonl"
    assert len(data.train) + len(data.heldout) == len(rows)
    assert data.to_answer == 4 and "4 prompts to be answered" in data.describe()


@pytest.mark.parametrize("make, problem", [
    (lambda p: p.write_text("   \n\n "), "is empty"),
    (lambda p: p.write_bytes(b"\x00\x01\x02binary" * 10), "binary"),
    (lambda p: p.write_bytes(b"caf\xe9 au lait " * 10), "not UTF-8"),
    (lambda p: p.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"oops": 1}\n'), "line 2"),
    (lambda p: p.write_text('{"text": "fine"}\n{not json}\n'), "line 2: not valid JSON"),
    (lambda p: p.write_text(_text(3)), f"at least {MIN_EXAMPLES}"),
    (lambda p: p.write_text("x" * 5000), "at most 4,000"),
    (lambda p: p.write_text('{"text": "fine"}\n' + "{\"text\": " + "[" * 1900 + "]" * 1900 + "}\n"), "line 2: nested too deeply"),
    (lambda p: p.write_text('{"prompt": "fine"}\n{"prompt": "half \\ud800 a character"}\n'), "line 2 holds half a character"),
    (lambda p: p.write_text('{"prompt": "fine"}\n{"instruction": "x", "output": "half \\udc00"}\n'), "line 2"),
])
def test_bad_files_get_a_message_that_says_what_to_fix(tmp_path, make, problem):
    path = tmp_path / "data.txt"
    make(path)
    with pytest.raises(RouterLabError) as err:
        parse_user_data(path=str(path), max_chars=4000)
    assert problem in str(err.value) and err.value.fix


def test_wrong_file_types_and_empty_paste_are_refused(tmp_path):
    pdf = tmp_path / "paper.pdf"
    pdf.write_bytes(b"%PDF-1.7")
    with pytest.raises(RouterLabError, match="not a .txt or .jsonl"):
        parse_user_data(path=str(pdf))
    with pytest.raises(RouterLabError, match="pasted text is empty"):
        parse_user_data("  ")


def test_a_lone_surrogate_in_pasted_text_is_a_text_problem_that_says_where():
    text = _text(8)
    with pytest.raises(RouterLabError) as err:
        parse_user_data(text[:50] + "\ud83d" + text[50:])
    assert "pasted text holds half a character" in str(err.value) and "U+D83D) at character 51" in str(err.value)


def test_an_upload_deleted_to_make_room_is_said_so(tmp_path):
    import pytest

    from routerlab.core.base.errors import RouterLabError
    from routerlab.tuning.user_data import read_text

    with pytest.raises(RouterLabError, match="no longer on the server.*Upload it again"):
        read_text(None, tmp_path / "gone.txt")
