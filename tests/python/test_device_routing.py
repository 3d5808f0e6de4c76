"""The routing of framework tensors in device memory (torch MPS tensors, MLX arrays on an Apple
GPU), run on Linux through metal-sim's device buffers: a stand-in tensor kind whose storage is a
DeviceBuffer takes the code path an MPS tensor takes on a Mac (read as buffer plus
storage_offset x itemsize, results allocated in the same memory by the caller's kind, the
producer synchronised once the results exist and before the library call, results of the
caller's kind), checked against the float64 reference; merges of partial states in device
buffers through the core's host merge. What needs torch's MPS allocator and stream or a GPU is
left to a Mac. Skipped without metal-sim."""

import mfa_native
import numpy as np
import pytest
import reference
from _backends import Case, check_forward
from mfa_native import _arrays

pytestmark = pytest.mark.skipif(
    "metal-sim" not in mfa_native.available_backends(), reason="no metal-sim backend"
)

CASE = Case(9, 17, 16, 8, query_heads=4, kv_heads=2, causal=True, dtype="f16")


@pytest.fixture(scope="module")
def context():
    with mfa_native.Context("metal-sim", num_threads=2) as ctx:
        yield ctx


class StorageTensor:
    """A stand-in for an MPS tensor: a C-contiguous view `storage_offset` elements into a
    DeviceBuffer (its storage)."""

    def __init__(self, storage, dtype, shape, storage_offset):
        self.storage, self.dtype, self.shape = storage, np.dtype(dtype), tuple(shape)
        self.storage_offset = storage_offset

    @classmethod
    def of(cls, context, array, storage_offset=5):
        item = array.dtype.itemsize
        storage = mfa_native.DeviceBuffer((array.size + storage_offset) * item, backend=context)
        start = storage_offset * item
        storage.contents[start : start + array.nbytes] = array.view(np.uint8).ravel()
        return cls(storage, array.dtype, array.shape, storage_offset)

    def numpy(self):
        return self.storage.array(
            self.dtype, self.shape, byte_offset=self.storage_offset * self.dtype.itemsize
        ).numpy()


class StorageKind:
    """What _arrays' torch kind does for MPS tensors, with DeviceBuffers for torch's MPS
    allocator; synchronize records what the results held when it ran (torch.mps.synchronize
    on a Mac)."""

    name = "storage"
    device_results = True

    def __init__(self):
        self.results = []  # the results allocated, in order
        self.synchronized = []  # the results' bytes at each synchronize

    def read(self, name, tensor, dtype):
        return _arrays.ArrayView(
            self,
            _arrays.DEVICE_BUFFER,
            tensor.storage.handle,
            tensor.storage_offset * tensor.dtype.itemsize,
            tensor.dtype,
            tensor.shape,
            _arrays._contiguous_strides(tensor.shape),
            True,
            tensor,
        )

    def empty(self, specs, like):
        context = like.keepalive.storage.context
        created = []
        for shape, dtype in specs:
            tensor = StorageTensor.of(context, np.full(shape, np.nan, dtype), storage_offset=3)
            self.results.append(tensor)
            created.append((tensor, self.read("result", tensor, dtype)))
        return created

    def synchronize(self):
        self.synchronized.append([r.numpy().copy() for r in self.results])


@pytest.fixture
def kind(monkeypatch):
    kind = StorageKind()
    monkeypatch.setitem(_arrays._KINDS, StorageTensor, kind)
    return kind


def test_results_are_allocated_in_the_callers_device_memory_then_synchronized(context, kind):
    q, k, v = CASE.inputs(CASE.rng())
    tensors = [StorageTensor.of(context, x) for x in (q, k, v)]
    out, lse = mfa_native.attention(*tensors, **CASE.options, return_lse=True, backend=context)
    assert kind.results == [out, lse]
    # Synchronised once, after both results existed and before the library wrote them.
    (seen,) = kind.synchronized
    assert all(np.isnan(result).all() for result in seen)
    check_forward(CASE, out.numpy(), lse.numpy(), q, k, v)


def test_a_kind_that_cannot_allocate_device_memory_needs_every_output(context, kind):
    q, k, v = CASE.inputs(CASE.rng())
    tensors = [StorageTensor.of(context, x) for x in (q, k, v)]
    kind.device_results = False
    with pytest.raises(ValueError, match="pass every output .* only for torch tensors and MLX"):
        mfa_native.attention(*tensors, backend=context)
    assert kind.results == [] and kind.synchronized == []


def test_metal_memory_without_the_metal_backend_names_the_argument():
    # The DLPack route of MPS tensors and MLX GPU arrays: data is the id<MTLBuffer>.
    q = np.zeros((1, 2, 4, 8), np.float32)

    class Metal:
        def __dlpack_device__(self):
            return (_arrays.METAL, 0)

        def __dlpack__(self, **kwargs):
            return q.__dlpack__(**kwargs)

    with pytest.raises(NotImplementedError, match="^q is in Metal memory .* not 'metal-sim'"):
        mfa_native.attention(Metal(), Metal(), Metal(), backend="metal-sim")


@pytest.mark.parametrize("in_place", [False, True], ids=["fresh", "in_place"])
def test_merge_in_device_buffers(context, in_place):
    """mfa_attention_merge of states in metal-sim buffers (the core's host merge over the
    buffers' contents), against the float64 merge of the reference."""
    rng = np.random.default_rng(7)
    shape = (1, 2, 5, 8)
    outs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    lses = [rng.standard_normal(shape[:3]).astype(np.float32) for _ in range(3)]
    lses[1][0, 1, 2] = -np.inf  # a part that saw no key for one row
    parts_out = [StorageTensor.of(context, x) for x in outs]
    parts_lse = [StorageTensor.of(context, x) for x in lses]
    device = [p.storage.array(np.float32, shape, byte_offset=20) for p in parts_out]
    device_lse = [p.storage.array(np.float32, shape[:3], byte_offset=20) for p in parts_lse]
    if in_place:
        out, lse = device[0], device_lse[0]
    else:
        out = mfa_native.DeviceBuffer(4 * int(np.prod(shape)), backend=context).array(
            np.float32, shape
        )
        lse = mfa_native.DeviceBuffer(4 * int(np.prod(shape[:3])), backend=context).array(
            np.float32, shape[:3]
        )
    mfa_native.merge_attention_states(device, device_lse, out=out, lse=lse, backend=context)
    expected_out, expected_lse = reference.merge_states(outs, lses)
    # float32 storage of a float64 merge: a few ulps of the weighted sums.
    np.testing.assert_allclose(out.numpy(), expected_out, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(lse.numpy(), expected_lse, rtol=2e-6, atol=2e-6)
