"""core/kernels/low_paths.py: which kernel each kind of map multiplies one row with. The choice rule, when it does not measure,
and the embedded model's decode with the head through onnxruntime's copy of the file's own Q8_0 codes (a fixed
choice, so the test does not depend on a timing): the same products to the rounding of 8-bit activations, the same
greedy tokens, rows of a batch the same as a row alone, and the label that says so."""

import pytest
import torch

from routerlab.core.decode.engine import Engine
from routerlab.core.kernels import low_paths
from routerlab.core.kernels.nbits import NBits
from routerlab.core.model.models import tiny_model
from routerlab.core.ops.forward import forward
from routerlab.core.routing.gates import Plan


def test_choose_takes_onnxruntime_only_where_it_wins_by_the_margin():
    times = {"head": (1.40, 0.60), "qkv": (0.58, 1.11), "down": (1.0, 0.81), "o": (1.0, 0.80)}
    assert low_paths.choose(times) == {"head", "o"}
    assert low_paths.choose(times, margin=1.0) == {"head", "o", "down"}


def test_an_onnxruntime_that_fails_leaves_torchs_kernel_and_says_why(embedded, monkeypatch):
    engine = Engine(embedded.model, embedded.tokenizer, embedded.name, embedded.lowbit)
    monkeypatch.setenv(low_paths.ENV, "auto")
    monkeypatch.setattr(low_paths.nbits, "available", lambda: True)

    class Broken(NBits):
        def __init__(self, *args, **kwargs):
            raise RuntimeError("no MatMulNBits in this build")

    monkeypatch.setattr(low_paths.nbits, "NBits", Broken)
    result = low_paths.tune(engine.anatomy)
    assert result["onnxruntime"] == [] and "onnxruntime failed (RuntimeError: no MatMulNBits in this build)" in result["skipped"]
    assert low_paths.chosen(engine.anatomy) == [] and "onnxruntime" not in engine.weights


def test_no_measurement_without_file_codes_or_when_told_not_to(monkeypatch):
    engine = Engine(tiny_model("llama", 0))
    monkeypatch.setenv(low_paths.ENV, "auto")
    assert "no file codes" in low_paths.tune(engine.anatomy)["skipped"]
    monkeypatch.setenv(low_paths.ENV, "torch")
    result = low_paths.tune(engine.anatomy)
    assert result["skipped"] == f"{low_paths.ENV}=torch" and "torch's int4 kernel for every map" in low_paths.describe(result)


@pytest.fixture(scope="module")
def head_through_onnxruntime(embedded):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    mp = pytest.MonkeyPatch()
    mp.setenv(low_paths.ENV, "auto")
    mp.setattr(low_paths, "choose", lambda times, margin=low_paths.MARGIN: {"head"})  # fixed: no timing decides
    mp.setattr(low_paths, "confirm", lambda an, shortlist, copies, times, rounds=0: (set(shortlist), {}))
    try:
        engine = Engine.from_loaded(embedded)
    finally:
        mp.undo()
    return engine


@torch.inference_mode()
def _logits(engine, ids, fed):
    """The next-token logits after each token of `fed` (decode steps, one token each, after a prefill of `ids`)."""
    caches = engine.new_caches(len(ids) + len(fed) + 1)
    forward(engine.anatomy, torch.tensor([ids]), torch.arange(len(ids)), caches, Plan(None))
    out = []
    for k, token in enumerate(fed):
        position = len(ids) + k
        logits, _ = forward(engine.anatomy, torch.tensor([[token]]), torch.tensor([position]), caches, Plan(None), top=position)
        out.append(logits[0, -1].float())
    return out


def test_the_head_through_onnxruntime_computes_the_same_logits_and_tokens(embedded, head_through_onnxruntime):
    ours = head_through_onnxruntime
    assert low_paths.chosen(ours.anatomy) == ["head"] and isinstance(ours.anatomy.head.one_low, NBits)
    assert "one row of the head through onnxruntime's MatMulNBits" in ours.weights and "Q8_0" in ours.anatomy.head.one_low.label
    assert set(ours.kernels["one_row_ms"]) >= {"head", "qkv", "gate_up", "down"}  # every kind measured, the choice fixed
    theirs = Engine(embedded.model, embedded.tokenizer, embedded.name, embedded.lowbit)  # torch's int4 kernel throughout
    assert low_paths.chosen(theirs.anatomy) == [] and "onnxruntime" not in theirs.weights
    # the head's Q8_0 codes as 8-bit codes (and fp32 scales) read fewer bytes than as two 4-bit halves (and bf16 ones)
    saved = theirs.anatomy.decode_weight_bytes() - ours.anatomy.decode_weight_bytes()
    assert 0 < saved == theirs.anatomy.head.low.nbytes - ours.anatomy.head.one_low.nbytes
    tok = embedded.tokenizer
    ids = tok("The history of computing is a story of", add_special_tokens=False)["input_ids"]
    fed = tok(" layers. Early machines were wired by hand for each problem; stored programs turned wiring into data",
              add_special_tokens=False)["input_ids"]
    clear = 0
    for x, y in zip(_logits(ours, ids, fed), _logits(theirs, ids, fed)):
        # 8-bit activations per block of 32 against bf16 ones: up to 0.0206 on an AVX-512 EPYC (12-06), whose
        # onnxruntime kernel (AVX-512 VNNI) rounds the activations its own way; below 0.02 on an AMX Xeon
        assert float((x - y).norm() / y.norm()) < 0.03
        top2 = y.topk(2).values
        if top2[0] - top2[1] > 0.25:  # not a near tie: the same greedy token
            clear += 1
            assert int(x.argmax()) == int(y.argmax())
    assert clear >= len(fed) // 2


def test_one_row_takes_onnxruntime_and_a_batch_keeps_the_int4_kernel(embedded, head_through_onnxruntime):
    head = head_through_onnxruntime.anatomy.head
    theirs = Engine(embedded.model, embedded.tokenizer, embedded.name, embedded.lowbit).anatomy.head
    x = torch.randn(8, head.dense.shape[1], generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(head.batch(x), theirs.batch(x))  # 8 rows: the int4 kernel (onnxruntime measured slower there)
    one = head.one(x[:1])
    assert torch.equal(head.batch(x[:1]), one)  # a room's batch of one is a decode step alone
    assert torch.equal(one, head_through_onnxruntime.anatomy.head.one_low.mm(x[:1]).to(one.dtype))
    assert not torch.equal(one, theirs.one(x[:1]))  # really the other kernel


def test_confirm_keeps_a_candidate_only_where_a_steps_products_gain(embedded, monkeypatch):
    """`confirm` on made-up costs (no timing decides): through onnxruntime the head saves most of its cost, q|k|v less
    than STEP_MARGIN of a step; only the head stays. And a layer map's copy gives a row the same product alone as
    among others, the reason a kept layer kind serves batches too."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    an = Engine(embedded.model, embedded.tokenizer, embedded.name, embedded.lowbit).anatomy
    codes, maps = an.lowbit.codes, low_paths._maps(an)
    copies = {kind: [NBits(low_paths.Codes.cat([codes[n] for n in w.names]), 1) for w in maps[kind]] for kind in ("head", "qkv")}
    cost = {("head", False): 1.0, ("head", True): 0.4, ("qkv", False): 0.02, ("qkv", True): 0.0199}
    owner = {id(c): kind for kind, cs in copies.items() for c in cs} | {id(w.low): kind for kind, ws in maps.items() for w in ws}
    monkeypatch.setattr(low_paths, "_run", lambda products: sum(
        cost.get((owner[id(mm.__self__)], isinstance(mm.__self__, NBits)), 0.01) for mm, _ in products))
    times = {"head": (1.0, 0.4), "qkv": (0.6, 0.5)}
    ours, steps = low_paths.confirm(an, {"head", "qkv"}, copies, times)
    assert ours == {"head"} and steps["chosen"] < steps["int4"]
    x = torch.randn(8, maps["qkv"][0].dense.shape[1], generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    together = copies["qkv"][0].mm(x)
    assert all(torch.equal(together[i], copies["qkv"][0].mm(x[i : i + 1])[0]) for i in (0, 5))


def test_layer_maps_through_onnxruntime_decode_alone_and_in_a_room(embedded, monkeypatch):
    """The path a machine whose torch int4 kernel is slow may take (an AVX2-only CPU: not measurable here): every
    layer map and the head through onnxruntime, by a fixed choice. The layers' copies replace `low` (every decode
    product), so a row's products are the same alone and in a batch: the page's example prompts as rows of one room
    write what they write alone, but where bf16's other roundings of a batch (attention over padded rows) meet a
    near-tie, as on torch's kernel (test_room's rule)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from test_room import MAX_GAP, examples_alone_and_in_a_room

    monkeypatch.setenv(low_paths.ENV, "auto")
    layers = {"qkv", "o", "gate_up", "down"}
    monkeypatch.setattr(low_paths, "choose", lambda times, margin=low_paths.MARGIN: layers | {"head"})
    monkeypatch.setattr(low_paths, "confirm", lambda an, shortlist, copies, times, rounds=0: (set(shortlist), {}))
    engine = Engine.from_loaded(embedded)
    an = engine.anatomy
    assert set(low_paths.chosen(an)) == layers | {"head"}
    assert all(isinstance(p.gate_up.low, NBits) and p.gate_up.one_low is None for p in an.layers)
    assert isinstance(an.head.one_low, NBits) and not isinstance(an.head.low, NBits)
    requests, alone, same, margins, room = examples_alone_and_in_a_room(engine, 24)
    assert room.largest == len(requests) and same >= 1
    print(f"[kernels] layer maps through onnxruntime: {same} of {len(requests)} room rows identical to alone")
    assert all(m <= MAX_GAP for m in margins)
    text = engine.tokenizer.decode(alone[0])
    assert len(set(alone[0])) > 5 and text.strip()  # a real answer, not a repeated token
