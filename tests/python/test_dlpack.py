"""Array interchange: mfa_native.attention and attention_backward on numpy arrays, torch tensors,
MLX arrays and any DLPack producer, against the float64 reference; results of the caller's kind,
inputs read and results written in place (the addresses libmfa receives are checked against the
producers' own); memory libmfa cannot reach refused before anything is written; keyword names
of other libraries answered with mfa's; and `import mfa_native` importing neither torch nor
MLX."""

import os
import subprocess
import sys

import mfa_native
import ml_dtypes
import numpy as np
import pytest
import reference
from _backends import DTYPES, Case, check_backward, check_forward, record_addresses
from mfa_native import _arrays, _attention

CASE = Case(9, 13, 16, 8, query_heads=4, kv_heads=2, causal=True, window=(5, None))


class Producer:
    """A DLPack producer that is none of the known kinds: it forwards to a numpy array, and
    can pretend to live elsewhere, or speak only legacy DLPack (no max_version)."""

    def __init__(self, array, device=(_arrays.CPU, 0), legacy=False):
        self.array, self.device, self.legacy = array, device, legacy

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        if self.legacy and kwargs:
            raise TypeError("__dlpack__() takes no keyword arguments")
        return self.array.__dlpack__(**kwargs)


class LegacyProducer(Producer):
    def __init__(self, array):
        super().__init__(array, legacy=True)


@pytest.fixture
def addresses(monkeypatch):
    """The first-element address of every array handed to libmfa, call by call."""
    return record_addresses(monkeypatch)


def numpy_inputs(case=CASE):
    rng = case.rng()
    return (*case.inputs(rng), case.output_gradient(rng))


def numpy_address(array):
    return array.__array_interface__["data"][0]


# ---- producers: numpy, torch, MLX, another DLPack producer ------------------------------------


def _torch():
    return pytest.importorskip("torch")


def _mlx():
    return pytest.importorskip("mlx.core")


def as_torch(array):
    torch = _torch()
    # torch.from_numpy knows no ml_dtypes.bfloat16: through float32, exactly.
    return torch.from_numpy(array.astype(np.float32)).to(
        {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[
            array.dtype.name
        ]
    )


def as_mlx(array):
    mx = _mlx()
    converted = mx.array(array.astype(np.float32)).astype(
        {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[array.dtype.name]
    )
    mx.eval(converted)
    return converted


def torch_to_numpy(tensor):
    return tensor.float().numpy()


def mlx_to_numpy(array):
    mx = _mlx()
    return np.array(array.astype(mx.float32))


def torch_address(tensor):
    return tensor.data_ptr()


def mlx_address(array):
    return _arrays.read_array("x", array).address


# name -> (convert a numpy array, convert a result back, the result's type, its address)
PRODUCERS = {
    "numpy": (lambda a: a, np.asarray, lambda: np.ndarray, numpy_address),
    "torch": (as_torch, torch_to_numpy, lambda: _torch().Tensor, torch_address),
    "mlx": (as_mlx, mlx_to_numpy, lambda: _mlx().array, mlx_address),
    "dlpack": (Producer, np.asarray, lambda: np.ndarray, numpy_address),
    "legacy-dlpack": (LegacyProducer, np.asarray, lambda: np.ndarray, numpy_address),
}


def source_address(name, converted):
    """Where the producer keeps the data of a converted input."""
    if name in ("dlpack", "legacy-dlpack"):
        return numpy_address(converted.array)
    return PRODUCERS[name][3](converted)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_forward_and_backward_on_every_producer(producer, dtype, addresses):
    convert, back, result_type, address = PRODUCERS[producer]
    case = Case(**{**CASE.__dict__, "dtype": dtype})
    q, k, v, dout = numpy_inputs(case)
    if producer in ("dlpack", "legacy-dlpack") and dtype == "bf16":
        pytest.skip("numpy arrays of ml_dtypes.bfloat16 export no DLPack")
    inputs = [convert(array) for array in (q, k, v)]
    out, lse = mfa_native.attention(*inputs, **case.options, return_lse=True)
    assert isinstance(out, result_type()) and isinstance(lse, result_type())
    check_forward(case, back(out), back(lse), q, k, v)
    # Read in place, written in place: the addresses libmfa got are the producers' own.
    (forward,) = addresses
    assert forward == [source_address(producer, x) for x in inputs] + [address(out), address(lse)]

    given_dout = convert(dout)
    gradients = mfa_native.attention_backward(given_dout, *inputs, out, lse, **case.options)
    assert all(isinstance(gradient, result_type()) for gradient in gradients)
    check_backward(case, [back(g) for g in gradients], dout, q, k, v, back(out))
    backward = addresses[1]
    expected = [source_address(producer, x) for x in inputs]
    expected += [address(out), source_address(producer, given_dout), address(lse)]
    assert backward == expected + [address(g) for g in gradients]


def test_strided_views_of_every_kind_are_read_in_place(addresses):
    """Transposed [B, N, H, D] memory viewed as [B, H, N, D]: no copy, and the right numbers."""
    torch, mx = _torch(), _mlx()
    q, k, v, _ = numpy_inputs()
    bshd = [np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (q, k, v)]
    expected, _ = reference.attention_forward(q, k, v, **CASE.options)
    mlx_originals = [mx.array(x) for x in bshd]
    views = {
        "numpy": [np.swapaxes(x, 1, 2) for x in bshd],
        "torch": [torch.from_numpy(x).transpose(1, 2) for x in bshd],
        "mlx": [x.transpose(0, 2, 1, 3) for x in mlx_originals],
    }
    for kind, arrays in views.items():
        addresses.clear()
        out = mfa_native.attention(*arrays, **CASE.options)
        np.testing.assert_allclose(PRODUCERS[kind][1](out), expected, atol=1e-5)
        assert addresses[0][:3] == [_arrays.read_array("x", x).address for x in arrays], kind
    # The MLX transposes are views too: they start where their originals do.
    assert [_arrays.read_array("x", x).address for x in views["mlx"]] == [
        _arrays.read_array("x", x).address for x in mlx_originals
    ]


@pytest.mark.parametrize("producer", ["numpy", "torch", "dlpack"])
def test_out_of_another_kind_is_written_in_place(producer, addresses):
    q, k, v, _ = numpy_inputs()
    convert, back, _, _ = PRODUCERS[producer]
    target = convert(np.full((1, 4, 9, 8), 1234.5, np.float32))
    result = mfa_native.attention(q, k, v, **CASE.options, out=target)
    assert result is target
    assert addresses[0][3] == source_address(producer, target)
    expected, _ = reference.attention_forward(q, k, v, **CASE.options)
    written = back(target.array if producer == "dlpack" else target)
    np.testing.assert_allclose(written, expected, atol=1e-5)


def test_results_follow_q_when_kinds_are_mixed():
    torch = _torch()
    q, k, v, _ = numpy_inputs()
    assert isinstance(mfa_native.attention(torch.from_numpy(q), k, v), torch.Tensor)
    assert isinstance(mfa_native.attention(q, torch.from_numpy(k), v), np.ndarray)


def test_bfloat16_arrives_through_dlpack_which_numpy_cannot_read():
    """numpy's from_dlpack rejects bfloat16; mfa reads the DLPack tensor itself."""
    mx = _mlx()
    array = as_mlx(np.ones((2, 3, 4, 5), ml_dtypes.bfloat16))
    with pytest.raises(RuntimeError):
        np.from_dlpack(array)
    view = _arrays.read_array("q", array)
    assert view.dtype == DTYPES["bf16"] and view.shape == (2, 3, 4, 5)
    assert isinstance(mfa_native.attention(array, array, array), mx.array)


# ---- refused before anything is written ------------------------------------------------------


def test_metal_memory_is_refused_off_the_metal_backend_never_copied():
    q, k, v, _ = numpy_inputs()
    metal = [Producer(x, device=(_arrays.METAL, 0)) for x in (q, k, v)]
    with pytest.raises(NotImplementedError, match="Metal memory .* only the metal backend reads"):
        mfa_native.attention(*metal)
    out, lse = mfa_native.attention(q, k, v, return_lse=True)
    dout = np.ones_like(out)
    with pytest.raises(NotImplementedError, match="only the metal backend reads"):
        mfa_native.attention_backward(
            *(Producer(x, device=(_arrays.METAL, 0)) for x in (dout, q, k, v, out, lse))
        )


def test_memory_of_other_devices_is_refused():
    q, k, v, _ = numpy_inputs()
    with pytest.raises(ValueError, match="^k is in CUDA memory; mfa reads CPU memory"):
        mfa_native.attention(q, Producer(k, device=(2, 0)), v)


def test_arrays_of_one_call_must_share_a_device():
    q, k, v, _ = numpy_inputs()
    with pytest.raises(ValueError, match="^v is in Metal memory but q is in CPU memory"):
        mfa_native.attention(q, k, Producer(v, device=(_arrays.METAL, 0)))
    out = np.full((1, 4, 9, 8), 1234.5, np.float32)
    with pytest.raises(ValueError, match="^out is in Metal memory"):
        mfa_native.attention(q, k, v, out=Producer(out, device=(_arrays.METAL, 0)))
    assert np.all(out == 1234.5)


def test_read_only_exports_cannot_be_written():
    """MLX exports its arrays read-only (they are values), as does numpy for read-only arrays."""
    mx = _mlx()
    q, k, v, _ = numpy_inputs()
    frozen = np.full((1, 4, 9, 8), 1234.5, np.float32)
    frozen.flags.writeable = False
    mlx_target = as_mlx(frozen)
    for target in (Producer(frozen), mlx_target):
        with pytest.raises(ValueError, match="^out must be writable"):
            mfa_native.attention(q, k, v, out=target)
    assert np.all(frozen == 1234.5)
    assert mx.all(mlx_target == 1234.5).item()


@pytest.mark.parametrize("dtype, name", [("float64", "torch.float64"), ("int32", "int32")])
def test_dtype_errors_name_the_producers_dtype(dtype, name):
    torch = _torch()
    q, k, v, _ = numpy_inputs()
    bad = torch.zeros(q.shape, dtype=getattr(torch, dtype))
    with pytest.raises(
        TypeError, match=f"^q.dtype must be float32, float16 or bfloat16 .*got {name}"
    ):
        mfa_native.attention(bad, k, v)
    with pytest.raises(TypeError, match="^k.dtype must be float32, got float64"):
        mfa_native.attention(q, Producer(k.astype(np.float64)), v)


def test_tensors_that_require_grad_are_refused_not_detached():
    torch = _torch()
    q, k, v, _ = numpy_inputs()
    tracked = torch.from_numpy(q).requires_grad_()
    with pytest.raises(TypeError, match="^q requires grad.*mfa_native.torch.attention"):
        mfa_native.attention(tracked, k, v)
    with torch.no_grad():  # no graph to lose
        assert isinstance(mfa_native.attention(tracked, k, v), torch.Tensor)


def test_misaligned_dlpack_data_is_refused():
    q, k, v, _ = numpy_inputs()
    storage = np.zeros(k.size * 4 + 1, np.uint8)
    misaligned = np.frombuffer(storage, np.float32, count=k.size, offset=1).reshape(k.shape)
    with pytest.raises(ValueError, match="^k must be aligned to its itemsize 4"):
        mfa_native.attention(q, Producer(misaligned), v)


# ---- keyword names of other libraries --------------------------------------------------------


@pytest.mark.parametrize(
    "keyword, value, mfa_name",
    [
        ("is_causal", True, "causal="),
        ("softmax_scale", 0.5, "scale="),
        ("window_size", (4, 0), "window="),
        ("attn_mask", None, "mask="),
        ("return_attn_probs", True, "return_lse="),
        ("enable_gqa", True, "grouped-query attention applies"),
    ],
)
def test_other_libraries_keywords_get_mfas_name(keyword, value, mfa_name):
    q, k, v, dout = numpy_inputs()
    with pytest.raises(
        TypeError,
        match=f"^attention\\(\\) got an unexpected keyword argument '{keyword}': .*{mfa_name}",
    ):
        mfa_native.attention(q, k, v, **{keyword: value})
    out, lse = mfa_native.attention(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match=f"^attention_backward\\(\\) .*'{keyword}'.*{mfa_name}"):
        mfa_native.attention_backward(dout, q, k, v, out, lse, **{keyword: value})


def test_unknown_keywords_are_named_without_a_hint():
    q, k, v, _ = numpy_inputs()
    with pytest.raises(TypeError, match="^attention\\(\\) got an unexpected keyword argument 'x'$"):
        mfa_native.attention(q, k, v, x=1)


def test_the_wrapped_signature_is_visible():
    import inspect

    assert "causal_alignment" in inspect.signature(mfa_native.attention).parameters
    assert mfa_native.attention.__doc__.startswith("Exact attention")
    assert _attention.attention.__wrapped__.__name__ == "attention"


# ---- optional dependencies stay optional -----------------------------------------------------


def _run_python(script):
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=float(os.environ.get("MFA_TEST_TIMEOUT", "600")),
    )
    assert result.returncode == 0, result.stderr


def test_importing_mfa_native_imports_neither_torch_nor_mlx_nor_ml_dtypes():
    # ml_dtypes takes a second to import (0.7): mfa_native imports it at its first bfloat16.
    _run_python(
        "import sys, numpy as np, mfa_native\n"
        "q = np.ones((1, 2, 3, 4), np.float32)\n"
        "mfa_native.attention(q, q, q)\n"
        "deferred = ('torch', 'mlx', 'mlx.core', 'ml_dtypes')\n"
        "loaded = sorted(m for m in deferred if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )


# A fresh interpreter in which ml_dtypes is not imported before mfa_native meets a bfloat16
# array of `make` (numpy, torch or MLX, from float32 values; as_float64 reads one back): the
# result must be bfloat16 and agree with the float64 reference within bf16's rounding of the
# output (2^-8 relative, values below 4) and of the probabilities (as much again).
_BFLOAT16_FIRST = """
import sys
import numpy as np
import mfa_native
values = np.random.default_rng(5).standard_normal((1, 2, 16, 8)).astype(np.float32)
{make}
out = mfa_native.attention(q, q, q)
assert "ml_dtypes" in sys.modules
assert {is_bfloat16}, out.dtype
x = as_float64(q)
scores = x @ x.swapaxes(-1, -2) / np.sqrt(8)
p = np.exp(scores - scores.max(-1, keepdims=True))
expected = (p / p.sum(-1, keepdims=True)) @ x
error = np.abs(as_float64(out) - expected).max()
assert error < 2.0**-5, error
"""
_BFLOAT16_MAKERS = {
    "numpy": (
        "import ml_dtypes\nq = values.astype(ml_dtypes.bfloat16)\n"
        "as_float64 = lambda a: a.astype(np.float64)",
        "out.dtype.name == 'bfloat16'",
    ),
    "torch": (
        "import torch\nq = torch.from_numpy(values).to(torch.bfloat16)\n"
        "as_float64 = lambda a: a.double().numpy()\n"
        "assert 'ml_dtypes' not in sys.modules",
        "out.dtype == torch.bfloat16",
    ),
    "mlx": (
        "import mlx.core as mx\nq = mx.array(values).astype(mx.bfloat16)\n"
        "as_float64 = lambda a: np.asarray(a.astype(mx.float32), np.float64)\n"
        "assert 'ml_dtypes' not in sys.modules",
        "out.dtype == mx.bfloat16",
    ),
}


@pytest.mark.parametrize("producer", sorted(_BFLOAT16_MAKERS))
def test_a_first_bfloat16_array_of_any_kind_is_read(producer):
    if producer != "numpy":
        pytest.importorskip({"torch": "torch", "mlx": "mlx.core"}[producer])
    make, is_bfloat16 = _BFLOAT16_MAKERS[producer]
    _run_python(_BFLOAT16_FIRST.format(make=make, is_bfloat16=is_bfloat16))
