"""The command line on the real embedded model: JSON shape, streaming, and clean errors."""

import json
import math

import pytest

from routerlab.__main__ import main


def test_generate_json_has_the_promised_fields(embedded, capsys):
    code = main(["generate", "--prompt", "Name a colour.", "--max-new-tokens", "6", "--threshold", "0.5",
                 "--kv-policy", "drop", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("text", "tokens", "skip_rate", "decode_tokens_per_second", "kv_policy", "granularity", "threshold"):
        assert key in out
    assert out["kv_policy"] == "drop" and out["threshold"] == 0.5 and out["granularity"] == "attention-token"
    generated = [t for t in out["tokens"] if not t["is_prompt"]]
    assert 1 <= len(generated) <= 6 and "".join(t["text"] for t in generated).strip() == out["text"].strip()
    routed = [s for s in out["tokens"][0]["scores"] if s is not None]
    assert routed and all(0 <= s <= 1 for s in routed)
    assert math.isfinite(out["decode_tokens_per_second"]) and 0 <= out["skip_rate"] <= 1


def test_generate_decodes_through_the_start_up_choice_and_names_it(embedded, capsys):
    """The command line takes the path the start-up measured (as the app does) unless --decode forces one, and
    --json says which: the choice with its measurement, and the path this run's steps took."""
    from routerlab.core.graph.step_graph import DECODES

    common = ["generate", "--prompt", "Name a colour.", "--max-new-tokens", "4", "--no-quality", "--json"]
    assert main(common + ["--threshold", "0.5", "--kv-policy", "kv"]) == 0
    out = json.loads(capsys.readouterr().out)
    choice = out["decode_choice"]
    assert choice["decode"] in ("torch", "graph") and choice["why"]
    assert out["decode"] == DECODES if choice["decode"] == "graph" else out["decode"].startswith("torch ops")
    assert main(common + ["--decode", "torch"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decode_choice"]["why"] == "--decode torch" and out["decode"] == "torch ops"
    assert main(["generate", "--prompt", "Name a colour.", "--max-new-tokens", "2", "--no-quality", "--decode", "graph"]) == 0
    err = capsys.readouterr().err
    assert "decode steps: the step graph" in err and DECODES in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "  "], "prompt is empty"),
        (["--prompt", "hi", "--threshold", "nan"], "outside [0, 1]"),
        (["--prompt", "hi", "--threshold", "2"], "outside [0, 1]"),
        (["--prompt", "hi", "--kv-policy", "fast"], "Unknown KV policy"),
        (["--prompt", "hi", "--granularity", "layer-token"], "Unknown granularity"),
        (["--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens=0"),
    ],
)
def test_bad_arguments_end_with_one_clear_line(args, message, capsys):
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_a_folder_that_is_not_a_checkpoint_is_refused(embedded, tmp_path, capsys):
    assert main(["generate", "--prompt", "hi", "--routers", str(tmp_path)]) == 2
    assert "not a router checkpoint" in capsys.readouterr().err


def test_prompt_longer_than_the_context_is_refused(embedded, capsys):
    assert main(["generate", "--prompt", "word " * 9000, "--max-new-tokens", "4"]) == 2
    assert "exceeds the model's context" in capsys.readouterr().err


def test_train_refuses_a_gate_outside_0_1_before_loading_anything(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "r"), "--gate", "1.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "outside [0, 1]" in err and not (tmp_path / "r").exists()
