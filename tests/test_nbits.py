"""core/nbits.py's graphs compute the file's own codes: Q4_1 (centred on a zero point, plus the rests times the block
sums) and Q8_0 (zero point 128), within the rounding of 8-bit activations per block of 32 (onnxruntime and onnx:
requirements.txt)."""

import pytest
import torch

from routerlab.core.weights import Codes, quantize_int4

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _product(codes, x):
    from routerlab.core.nbits import NBits

    return NBits(codes, 1).mm(x)


def test_q4_1_and_q8_0_codes_give_their_weights_product():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=g) * 0.05
    x = torch.randn(3, 96, generator=g)
    q41 = quantize_int4(w)  # Q4_1's layout: w = q * d + m per block of 32
    ref = x @ q41.dequantize().T
    assert float((_product(q41, x) - ref).norm() / ref.norm()) < 0.02
    q = torch.randint(-128, 128, (64, 96), generator=g).to(torch.int16)
    d = torch.rand(64, 3, generator=g) * 0.01
    hi, lo = ((q + 128) // 16).to(torch.uint8), ((q + 128) % 16).to(torch.uint8)
    q80 = Codes(torch.cat([hi, lo], 1), torch.cat([16 * d, d], 1), torch.cat([-128 * d, 0 * d], 1), 32, tiles=2, source="Q8_0")
    ref = x @ q80.dequantize().T
    assert float((_product(q80, x) - ref).norm() / ref.norm()) < 0.02
    wrong = Codes(q80.codes, q80.scale * 2, q80.minimum * 2, 32, tiles=2)
    assert float((_product(wrong, x) - ref).norm() / ref.norm()) > 0.5


@pytest.mark.parametrize("shift", [0.0, 1.0, -1.0])
def test_q4_1_blocks_of_one_sign_keep_their_minimum(shift):
    """A block whose weights all share a sign has no zero point within its codes (-m / d outside 0..15): its minimum
    rides on the rest, which must carry it whole. Ten times the spread away from zero, the product still holds."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 96, generator=g) * 0.05 + shift * 0.5
    x = torch.randn(3, 96, generator=g)
    q41 = quantize_int4(w)
    ref = x @ q41.dequantize().T
    assert float((_product(q41, x) - ref).norm() / ref.norm()) < 0.02


def test_a_rows_product_is_its_own_tensor_on_every_thread_in_and_out_of_inference_mode():
    """One row reuses its thread's bound buffers: each call still returns a tensor of its own (an earlier result is
    not overwritten), in the input's dtype, the same as that row among others, whichever thread calls."""
    import threading

    from routerlab.core.nbits import NBits

    g = torch.Generator().manual_seed(1)
    product = NBits(quantize_int4(torch.randn(64, 96, generator=g) * 0.05), 1)
    x = torch.randn(4, 96, generator=g)
    first = product.mm(x[:1])
    with torch.inference_mode():
        second = product.mm(x[1:2].to(torch.bfloat16))
    assert first.dtype == torch.float32 and second.dtype == torch.bfloat16
    assert torch.equal(first, product.mm(x)[:1]) and torch.equal(product.mm(x[:1]), first)  # not overwritten since
    assert torch.equal(second, product.mm(x[:2].to(torch.bfloat16))[1:])
    seen = {}

    def worker(i):
        seen[i] = [product.mm(x[i : i + 1]) for _ in range(50)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    together = product.mm(x)
    assert all(torch.equal(r, together[i : i + 1]) for i in range(4) for r in seen[i])
