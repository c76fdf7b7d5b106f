"""The quantized matmul kernels (minillm.kernels.quant_matmul) against their references
(minillm.quant.matmul_reference). On inputs chosen so that every sum either side computes is exact
(power-of-two scales, inputs on a coarse grid), the kernels must give the reference's result bit
for bit, rounded once to the output dtype: every row count on both paths, with one input slice and
with several, shapes whose output width is off the block sizes, every int4 group size, with and
without bias. On random quantized weights and random signed inputs, they must stay within the
rounding that fp32 sums allow (`tolerance`). Without a GPU they run in Triton's CPU interpreter
(conftest sets TRITON_INTERPRET=1): fp32 and fp16, no bf16."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

from minillm.kernels import quant_gemv  # noqa: E402
from minillm.kernels.ops import load_ops  # noqa: E402
from minillm.kernels.quant_matmul import GEMV_MAX_ROWS, int4_matmul, int8_matmul, pick_path  # noqa: E402
from minillm.kernels.quant_tiles import word_level_offset  # noqa: E402
from minillm.layers.quant_linear import QuantLinear, quantize_model  # noqa: E402
from minillm.quant.int4 import dequantize_int4, pack_int4, quantize_int4  # noqa: E402
from minillm.quant.int8 import dequantize_int8, quantize_int8  # noqa: E402
from minillm.quant.matmul_reference import int4_matmul_ref, int8_matmul_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
ROWS = (1, 3, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1)
# (in_features K, out_features N): no N is a multiple of the 64 (gemv) or 128 (gemm) channel blocks,
# and 200 spans several blocks of both; K = 96 is not a multiple of the gemm's 64-input tiles.
SHAPES = ((64, 48), (96, 40), (128, 96), (256, 40), (256, 200))
# The engine's group sizes on every shape (32 is also the kernels' smallest), and one wider than a
# tile (256: a group spans several tiles) on one shape.
GROUP_CASES = [(k, n, g) for k, n in SHAPES for g in (32, 64, 128) if k % g == 0] + [(256, 40, 256)]
KERNELS = {"int8": (int8_matmul, int8_matmul_ref), "int4": (int4_matmul, int4_matmul_ref)}
# half an ulp: the relative rounding of a result to the output dtype
UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tolerance(method: str, dtype: torch.dtype, k: int, rows: int) -> float:
    """The relative error (norm-wise) that rounding allows a kernel against the fp32 reference on
    random signed inputs. The result rounds once to its dtype (UNIT_ROUNDOFF). Before that both sides
    sum in fp32, the kernels over terms that carry the level offset (`quant_tiles.py`): up to
    `offset + level` times an input, where the result's terms are |level - zero| times it, about 4
    (int4's 16 levels) or 36 (int8 on a Gaussian row) on average. K roundings of random sign, each
    at most 2^-23 of its partial sum (2^-24 and a bit for tensor cores' truncating accumulators),
    give a random walk of about 2^-23 * sqrt(K) times the ratio of those sizes, relative to the
    result, itself a sum of random signs. Offsets: fp16 1024 (+ 128 for int8's shift); bf16 int4
    128 on the tensor cores; fp32 int4 16; int8 in fp32 and bf16 only the one-row kernel's 384.
    16-bit int4 inputs at one row are summed in packed arithmetic (`quant_half2.py`): each lane
    rounds its sum of 4 products to the inputs' dtype four times, errors of random sign, so about
    one more rounding of the result (bf16 on a GPU only: the interpreter keeps the fp32 loop)."""
    half = dtype == torch.float16
    if method == "int4":
        largest_term = word_level_offset(dtype) + 15
    else:
        largest_term = 1152 + 127 if half else 384 + 127
    typical_level = 4 if method == "int4" else 36
    half2 = UNIT_ROUNDOFF[dtype] if method == "int4" and dtype != torch.float32 and rows == 1 else 0.0
    return UNIT_ROUNDOFF[dtype] + half2 + 2.0 ** -23 * math.sqrt(k) * largest_term / typical_level


def random_weight(k: int, n: int, seed: int) -> torch.Tensor:
    """Rows of different magnitudes, groups off centre: every scale and zero point differs."""
    g = generator(seed)
    rows = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 2
    offsets = torch.randn(n, k // 32, 1, generator=g).expand(-1, -1, 32).reshape(n, k)
    return rows + offsets


def quantized(method: str, k: int, n: int, dtype: torch.dtype, group_size: int = 0, seed: int = 0) -> tuple:
    """The weight arguments of the method's kernel, in the model dtype (as QuantLinear holds them)."""
    w = random_weight(k, n, seed).to(dtype)
    return quantize_int8(w) if method == "int8" else (*quantize_int4(w, group_size), group_size)


def exactly_summed(method: str, k: int, n: int, dtype: torch.dtype, group_size: int = 0, seed: int = 0) -> tuple:
    """Weight arguments whose sums with `grid_inputs` are exact in fp32 on every path: random levels
    and zero points, scales that are powers of two (2^-3 .. 1), so that no product or partial sum
    needs more than fp32's 24 bits, whatever the order or the level offset."""
    g = generator(seed)

    def powers_of_two(*shape: int) -> torch.Tensor:
        return (2.0 ** -torch.randint(0, 4, shape, generator=g)).to(dtype)

    if method == "int8":
        return torch.randint(-127, 128, (n, k), generator=g).to(torch.int8), powers_of_two(n)
    levels = torch.randint(0, 16, (n, k), generator=g)
    zeros = torch.randint(0, 16, (n, k // group_size), generator=g).to(dtype)
    return pack_int4(levels), powers_of_two(n, k // group_size), zeros, group_size


def grid_inputs(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Signed multiples of 1/16 in [-2, 2]: exact in fp16 and bf16, and with the weights above every
    kernel sum (at most 768 inputs x (1152 + 127) x 2, in units of 1/16) stays below 2^24. In bf16 only
    up to 1/4: the one-row int4 kernel sums 4 products in bf16 itself (`quant_half2.py`), each a
    multiple of 1/256, and a sum of them, at most 4 x 15/16 x 1/4 = 240/256, keeps within bf16's 8
    bits (fp16's 11 hold 4 x 15/16 x 2 = 1920/256)."""
    limit = 4 if dtype == torch.bfloat16 else 32
    return (torch.randint(-limit, limit + 1, shape, generator=generator(seed)) / 16).to(dtype)


def as_fp32(args: tuple) -> tuple:
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def as_fp64(args: tuple) -> tuple:
    return tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def to_device(args: tuple) -> tuple:
    return tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


PATHS = (("gemv", 1), ("gemv", 3), ("gemm", None))  # gemv with one input slice and with several, gemm


def check_exact_on_every_row_count_and_path(method: str, weight_args: tuple, k: int, n: int, dtype: torch.dtype,
                                            seed: int) -> None:
    kernel, reference = KERNELS[method]
    weight_args = to_device(weight_args)
    bias = grid_inputs(n, dtype=dtype, seed=seed + 1).to(DEVICE)
    for i, rows in enumerate(ROWS):
        x = grid_inputs(rows, k, dtype=dtype, seed=seed + 2 + rows).to(DEVICE)
        for j, (path, split_k) in enumerate(PATHS):
            b = bias if (i + j) % 2 else None  # with and without bias by turns
            out = kernel(x, *weight_args, b, path=path, split_k=split_k)
            ref = reference(x.double(), *as_fp64(weight_args), None if b is None else b.double())
            assert out.dtype == dtype and out.shape == (rows, n)
            assert torch.equal(out, ref.to(dtype)), (rows, path, split_k, b is not None,
                                                     (out.double() - ref).abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("k,n", SHAPES)
def test_int8_is_exact(k, n, dtype):
    args = exactly_summed("int8", k, n, dtype, seed=k + n)
    check_exact_on_every_row_count_and_path("int8", args, k, n, dtype, seed=k)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("k,n,group_size", GROUP_CASES)
def test_int4_is_exact(k, n, group_size, dtype):
    args = exactly_summed("int4", k, n, dtype, group_size, seed=k + n + group_size)
    check_exact_on_every_row_count_and_path("int4", args, k, n, dtype, seed=k + group_size)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float32], ids=dtype_name)
def test_the_one_row_kernel_is_exact_without_packed_arithmetic_too(dtype, monkeypatch):
    """The one-row kernel takes int4 products of 16-bit inputs in packed arithmetic (HALF2); the fp32
    loop without it (what `scripts/quant_gemv_sweep.py` compares) sums the same."""
    kernel = quant_gemv._gemv_row_kernel
    launches = []

    class Without:
        def __getitem__(self, grid):
            launches.append(grid)
            return lambda *args, **kwargs: kernel[grid](*args, **{**kwargs, "HALF2": False})

    monkeypatch.setattr(quant_gemv, "_gemv_row_kernel", Without())
    kernel_of, reference = KERNELS["int4"]
    k, n = 768, 40  # 6 tiles of two groups of 64: each of two slices holds several
    args = to_device(exactly_summed("int4", k, n, dtype, 64, seed=3))
    x = grid_inputs(1, k, dtype=dtype, seed=4).to(DEVICE)
    for split_k in (1, 2):
        ref = reference(x.double(), *as_fp64(args), None)
        assert torch.equal(kernel_of(x, *args, None, split_k=split_k), ref.to(dtype))
    assert len(launches) == 2


@pytest.fixture
def row_launches(monkeypatch) -> list[dict]:
    """The keyword arguments (constexprs) of every launch of the one-row kernel, which still runs."""
    launches, kernel = [], quant_gemv._gemv_row_kernel

    class Recorded:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(kwargs) or kernel[grid](*args, **kwargs)

    monkeypatch.setattr(quant_gemv, "_gemv_row_kernel", Recorded())
    return launches


@pytest.mark.parametrize("subtiles", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_one_row_int4_tiles_of_several_groups_are_exact(subtiles, dtype, monkeypatch, row_launches):
    """The one-row int4 kernel's tiles may span several groups side by side (ONE_ROW_INT4_GROUPS),
    each with its own scale and zero point: every group size, one slice and several, and inputs
    that a tile of several groups does not divide (which take one group a tile)."""
    monkeypatch.setattr(quant_gemv, "ONE_ROW_INT4_GROUPS", subtiles)
    for k, n, group_size in ((512, 40, 32), (512, 72, 64), (1024, 40, 128), (768, 40, 128), (384, 40, 128)):
        args = to_device(exactly_summed("int4", k, n, dtype, group_size, seed=k + group_size))
        x = grid_inputs(1, k, dtype=dtype, seed=k + 1).to(DEVICE)
        ref = int4_matmul_ref(x.double(), *as_fp64(args), None)
        for split_k in (1, 2):
            assert torch.equal(int4_matmul(x, *args, None, split_k=split_k), ref.to(dtype)), (k, group_size, split_k)
    # 768 inputs are 3 tiles of 2 groups of 128, not of 4; 384 inputs take one group a tile
    assert [launch["BLOCK_K"] // launch["SUB_K"] for launch in row_launches] == [subtiles] * 6 + [2, 2] + [1, 1]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_int4_tiles_of_two_groups_on_the_tensor_cores_are_exact(dtype, monkeypatch):
    """2 to 16 rows take one group's tile at a time; `scripts/quant_gemv_sweep.py` also times tiles
    of two groups side by side (their loads issued together), which must sum the same."""
    shipped = quant_gemv.gemv_tiles
    monkeypatch.setattr(quant_gemv, "gemv_tiles", lambda target, rows, *args: (64, 256, 4) if rows > 1 else
                        shipped(target, rows, *args))
    k, n = 768, 72  # 3 tiles of two groups of 128
    args = to_device(exactly_summed("int4", k, n, dtype, 128, seed=11))
    for rows in (3, GEMV_MAX_ROWS):
        x = grid_inputs(rows, k, dtype=dtype, seed=rows).to(DEVICE)
        ref = int4_matmul_ref(x.double(), *as_fp64(args), None)
        for split_k in (1, 2):
            out = int4_matmul(x, *args, None, path="gemv", split_k=split_k)
            assert torch.equal(out, ref.to(dtype)), (rows, split_k)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_one_row_that_starts_at_an_odd_element_is_exact(dtype, row_launches):
    """The packed step reads 16-bit inputs two at a time, as int32 (`quant_half2.input_pairs`); a
    row that starts at an odd element of its buffer, which such a read would fault on a GPU, takes
    the fp32 loop and sums the same."""
    k, n = 256, 40
    args = to_device(exactly_summed("int4", k, n, dtype, 64, seed=5))
    buffer = grid_inputs(1, k + 1, dtype=dtype, seed=6).to(DEVICE)
    for x in (buffer[:, :k], buffer[:, 1:]):
        ref = int4_matmul_ref(x.double(), *as_fp64(args), None)
        assert torch.equal(int4_matmul(x, *args, None), ref.to(dtype))
    packs = quant_gemv.packs(dtype, quant_gemv.launch_target(buffer.device))
    assert [launch["HALF2"] for launch in row_launches] == [packs, False]


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_random_weights_and_inputs_within_rounding(method, dtype):
    k, n = 256, 40
    kernel, reference = KERNELS[method]
    weight_args = to_device(quantized(method, k, n, dtype, 128, seed=7))
    bias = torch.randn(n, generator=generator(8)).to(dtype).to(DEVICE)
    cases = ((1, "gemv", 3, bias), (3, "gemv", 1, None), (GEMV_MAX_ROWS + 1, "gemm", None, bias))
    for rows, path, split_k, b in cases:
        x = torch.randn(rows, k, generator=generator(9 + rows)).to(dtype).to(DEVICE)
        ref = reference(x.float(), *as_fp32(weight_args), None if b is None else b.float())
        err = relative_error(kernel(x, *weight_args, b, path=path, split_k=split_k), ref)
        assert err < tolerance(method, dtype, k, rows), (rows, path, split_k, err)


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
def test_unpacking_and_dequantization_in_the_kernel_are_exact(method, dtype):
    """x = identity gives y = W.T with one product per output: any difference from the reference's
    dequantized weight (a swapped nibble, a wrong group's scale or zero point, a scale applied
    before the zero point is subtracted) shows, rounding cannot hide it. Single one-hot rows check
    the gemv path's one-row case the same way."""
    k, n, group_size = 128, 80, 32
    weight_args = to_device(quantized(method, k, n, dtype, group_size))
    dequantized = dequantize_int8(*weight_args) if method == "int8" else dequantize_int4(*weight_args)
    kernel = KERNELS[method][0]
    identity = torch.eye(k, dtype=dtype, device=DEVICE)
    for path in ("gemv", "gemm"):
        assert torch.equal(kernel(identity, *weight_args, path=path).T, dequantized), path
    for i in (0, 1, 31, 32, k - 1):  # both nibbles of a byte, both sides of a group boundary, the last input
        assert torch.equal(kernel(identity[i], *weight_args, path="gemv"), dequantized[:, i]), i


@pytest.fixture
def launches(monkeypatch) -> list[str]:
    """The names of the Triton kernels launched (under the interpreter, or on the GPU)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    names = []
    for cls in (InterpretedFunction, JITFunction):
        run = cls.run

        def counted(self, *args, _run=run, **kwargs):
            names.append(self.__name__)
            return _run(self, *args, **kwargs)

        monkeypatch.setattr(cls, "run", counted)
    return names


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_split_k_is_one_deterministic_launch_that_leaves_its_counters_at_zero(method, launches):
    from minillm.kernels import quant_gemv

    k, n = 768, 40  # 3 tiles of the one-row int8 kernel's 256 inputs, 6 of int4's 128
    weight_args = to_device(exactly_summed(method, k, n, torch.float16, 128, seed=1))
    kernel, reference = KERNELS[method]
    bias = grid_inputs(n, dtype=torch.float16, seed=2).to(DEVICE)
    for rows in (1, 3):
        x = grid_inputs(rows, k, dtype=torch.float16, seed=3).to(DEVICE)
        launches.clear()
        out = kernel(x, *weight_args, bias, split_k=3)
        assert len(launches) == 1, launches
        assert torch.equal(out, reference(x.double(), *as_fp64(weight_args), bias.double()).to(torch.float16))
        assert not quant_gemv.split_counters(x.device, 1).any()
        assert torch.equal(kernel(x, *weight_args, bias, split_k=3), out)


def test_auto_path_follows_the_row_count_and_leading_dims_are_kept():
    assert [pick_path(rows) for rows in ROWS] == ["gemv", "gemv", "gemv", "gemm"]
    k, n = 128, 96
    weight_args = to_device(quantized("int4", k, n, torch.float32, 64))
    x = torch.randn(2, 10, k, generator=generator(3)).to(DEVICE)  # 20 rows: gemm
    out = int4_matmul(x, *weight_args)
    assert out.shape == (2, 10, n) and torch.equal(out, int4_matmul(x.view(20, k), *weight_args, path="gemm")
                                                   .view(2, 10, n))
    assert torch.equal(int4_matmul(x[0, :3], *weight_args), int4_matmul(x[0, :3], *weight_args, path="gemv"))
    one = int4_matmul(x[0, 0], *weight_args)
    assert one.shape == (n,) and torch.equal(one, int4_matmul(x[0, :1], *weight_args)[0])
    # Rows with a stride other than K (a slice of columns) give the same as a contiguous copy.
    wide = torch.randn(5, 2 * k, generator=generator(4)).to(DEVICE)
    assert torch.equal(int4_matmul(wide[:, :k], *weight_args), int4_matmul(wide[:, :k].contiguous(), *weight_args))


def test_gemm_with_several_row_blocks():
    k, n, rows = 128, 200, 150  # 3 blocks of 64 rows, 2 of 128 channels
    weight_args = to_device(quantized("int8", k, n, torch.float32))
    x = torch.randn(rows, k, generator=generator(5)).to(DEVICE)
    error = relative_error(int8_matmul(x, *weight_args), int8_matmul_ref(x, *weight_args))
    assert error < tolerance("int8", torch.float32, k, rows)


@pytest.fixture
def kernel_calls(monkeypatch) -> list:
    """Every call that reaches the Triton launcher (int8_matmul and int4_matmul both go through it)."""
    from minillm.kernels import quant_matmul

    calls, launch = [], quant_matmul._quant_matmul

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return launch(*args, **kwargs)

    monkeypatch.setattr(quant_matmul, "_quant_matmul", counted)
    return calls


def test_quant_linear_runs_the_kernel_it_is_given(kernel_calls):
    torch.manual_seed(0)
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(128, 96), nn.Linear(96, 64, bias=False)]).to(DEVICE)
    x = torch.randn(3, 128, device=DEVICE)
    with torch.no_grad():
        expected = model.layers[1](model.layers[0](x))
        for method, limit in (("int8", 0.02), ("int4", 0.2)):
            layers = [QuantLinear(layer, method, 32) for layer in model.layers]
            torch_out = layers[1](layers[0](x))
            assert not kernel_calls
            for layer in layers:
                layer.ops = load_ops("triton")
            triton_out = layers[1](layers[0](x))
            assert len(kernel_calls) == 2
            kernel_calls.clear()
            assert relative_error(triton_out, torch_out) < 1e-5
            assert relative_error(torch_out, expected) < limit, method


def test_quantize_model_gives_the_layers_the_kernels_of_the_model(kernel_calls):
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(64, 48)]).to(DEVICE)
    model.ops = load_ops("triton")  # as a model built by an engine has
    quantize_model(model, "int4", 32)
    assert isinstance(model.layers[0], QuantLinear) and model.layers[0].ops is model.ops
    x = torch.randn(2, 64, device=DEVICE)
    assert relative_error(model.layers[0](x), int4_matmul_ref(
        x, model.layers[0].qweight, model.layers[0].scales, model.layers[0].zeros, 32, model.layers[0].bias)) < 1e-5
    assert len(kernel_calls) == 1
    plain = nn.Module()
    plain.layers = nn.ModuleList([nn.Linear(64, 48)])
    assert quantize_model(plain, "int8").layers[0].kernel == "torch"  # a model without ops: the references


def bad_calls():
    k, n = 64, 48
    q8, s8 = quantized("int8", k, n, torch.float32)
    packed, s4, z4, _ = quantized("int4", k, n, torch.float32, 32)
    x = torch.randn(2, k)
    calls = [
        (lambda: int8_matmul(x, q8.t().contiguous().t(), s8), ValueError, r"contiguous int8 \[out, in\].*not contig"),
        (lambda: int8_matmul(x, q8.float(), s8), ValueError, r"contiguous int8 \[out, in\] tensor, got torch\.float32"),
        (lambda: int8_matmul(x, q8, s8[:, None]), ValueError, r"one per output row, \[48\]"),
        (lambda: int8_matmul(x[:, :32], q8, s8), ValueError, r"input features, got shape \(2, 32\)"),
        (lambda: int8_matmul(x.half(), q8, s8), TypeError, r"scales must be in x's dtype torch\.float16"),
        (lambda: int8_matmul(x.long(), q8, s8), TypeError, r"x must be one of"),
        (lambda: int8_matmul(x, q8, s8, torch.zeros(n + 1)), ValueError, r"bias must be a contiguous \[48\]"),
        (lambda: int8_matmul(x, q8, s8, torch.zeros(n, 2)[:, 0]), ValueError, r"with stride \(2,\)"),
        (lambda: int8_matmul(x, q8, s8, path="gemm2"), ValueError, r"path must be one of"),
        (lambda: int8_matmul(x, q8, s8, split_k=0), ValueError, r"split_k must be at least 1"),
        (lambda: int4_matmul(x, packed.view(torch.int8), s4, z4, 32), ValueError, r"uint8 \[out, in // 2\]"),
        (lambda: int4_matmul(x, unpacked_by_mistake(packed), s4, z4, 32), ValueError,
         r"end in the weight's 128 input features"),
        (lambda: int4_matmul(x, packed, s4, z4, 24), ValueError, r"power of two of at least 32, got 24"),
        (lambda: int4_matmul(x, packed, s4, z4, 16), ValueError, r"power of two of at least 32, got 16"),
        (lambda: int4_matmul(torch.randn(2, 32), packed[:, :16].contiguous(), s4, z4, 64), ValueError,
         r"in_features 32 is not a multiple of group_size 64"),
        (lambda: int4_matmul(x, packed, s4.t(), z4, 32), ValueError, r"int4 scales must be \[out, in // group_size\]"),
        (lambda: int4_matmul(x, packed, s4, z4[:, :1], 32), ValueError, r"int4 zeros must be .* got \(48, 1\)"),
    ]
    return [pytest.param(call, error, message, id=message) for call, error, message in calls]


def unpacked_by_mistake(packed: torch.Tensor) -> torch.Tensor:
    """One int4 value per byte, the width of an int8 weight: the packed width no longer matches x."""
    return torch.cat([packed & 0xF, packed >> 4], dim=1)


@pytest.mark.parametrize("call,error,message", bad_calls())
def test_wrong_layouts_and_arguments_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_engine_on_the_triton_kernels_generates_what_the_references_do(hf_checkpoint, method, kernel_calls):
    # Every quantized matmul of a model (and its attention) on Triton, against the PyTorch path.
    from minillm import LLM, SamplingParams

    _, path = hf_checkpoint("llama_gqa_tied")
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompts = [{"prompt_token_ids": [1, 5, 9, 2, 7]}, {"prompt_token_ids": [3, 3, 8]}]
    outputs = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(path), skip_tokenizer_init=True, quantization=method, quant_group_size=32,
                  attention_backend=backend, device=DEVICE)
        assert {m.kernel for m in llm.llm_engine.model.modules() if isinstance(m, QuantLinear)} == {backend}
        outputs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert bool(kernel_calls) == (backend == "triton")
    assert outputs["triton"] == outputs["torch"]
