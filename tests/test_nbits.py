"""core/kernels/nbits.py's graphs compute the file's own codes: Q4_1 (centred on a zero point, plus the rests times the block
sums) and Q8_0 (zero point 128), within the rounding of 8-bit activations per block of 32 (onnxruntime and onnx:
requirements.txt)."""

import pytest
import torch

from routerlab.core.kernels.weights import Codes, quantize_int4

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _product(codes, x):
    from routerlab.core.kernels.nbits import NBits

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


def _same_row(alone: torch.Tensor, among: torch.Tensor) -> bool:
    """A row alone against the same row among others: to the bit where this machine's MatMulNBits takes one kernel for
    every M (nbits.rows_independent), else within the rounding of summing the same products in another order."""
    from routerlab.core.kernels.nbits import rows_independent

    if rows_independent():
        return torch.equal(alone, among)
    return alone.dtype == among.dtype and _apart(alone, among) < (1e-2 if alone.dtype == torch.bfloat16 else 1e-4)


def _apart(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative distance: the same sums in another order differ in last bits (~1e-7), which can move a later product's
    8-bit activation by one step (a few 1e-4 on one output) or a bf16 rounding (4e-3 on one output); a row that read
    another row's input, or the wrong weights, is ~1 away."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def test_a_rows_product_is_its_own_tensor_on_every_thread_in_and_out_of_inference_mode():
    """One row reuses its thread's bound buffers: each call still returns a tensor of its own (an earlier result is
    not overwritten), in the input's dtype, the same bits whichever thread calls, and the same as that row among
    others (to the bit where MatMulNBits is row-invariant, else within the rounding of another summing order)."""
    import threading

    from routerlab.core.kernels.nbits import NBits

    g = torch.Generator().manual_seed(1)
    product = NBits(quantize_int4(torch.randn(64, 96, generator=g) * 0.05), 1)
    x = torch.randn(4, 96, generator=g)
    first = product.mm(x[:1])
    with torch.inference_mode():
        second = product.mm(x[1:2].to(torch.bfloat16))
    assert first.dtype == torch.float32 and second.dtype == torch.bfloat16
    assert torch.equal(product.mm(x[:1]), first)  # not overwritten since
    assert _same_row(first, product.mm(x)[:1]) and _same_row(second, product.mm(x[:2].to(torch.bfloat16))[1:])
    alone = [product.mm(x[i : i + 1]) for i in range(4)]
    seen = {}

    def worker(i):
        seen[i] = [product.mm(x[i : i + 1]) for _ in range(50)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    together = product.mm(x)
    assert all(torch.equal(r, alone[i]) for i in range(4) for r in seen[i])
    assert all(_same_row(alone[i], together[i : i + 1]) for i in range(4))


def test_the_row_invariance_probe_says_what_the_products_do():
    """nbits.rows_independent, probed on a small product, holds for the products the engine builds: where it says True,
    every row of a larger map alone is that row among others to the bit; where False, some row differs (AVX2's M = 1
    kernel sums in another order) but by no more than rounding."""
    from routerlab.core.kernels.nbits import NBits, rows_independent

    g = torch.Generator().manual_seed(4)
    product = NBits(quantize_int4(torch.randn(576, 576, generator=g) * 0.05), 1)
    x = torch.randn(6, 576, generator=g)
    together = product.mm(x)
    alone = torch.cat([product.mm(x[i : i + 1]) for i in range(6)])
    assert torch.equal(alone, together) == rows_independent()
    assert _apart(alone, together) < 1e-4 and _apart(alone[:1], together[1:2]) > 0.5
