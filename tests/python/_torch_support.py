"""What the torch-facing tests share: conversions between the numpy cases and torch tensors,
an explicit float64 attention in torch (independent of mfa and of PyTorch's SDPA kernels), and a
tiny causal language model whose attention is pluggable, for training through the adapters.

Import it only after pytest.importorskip("torch")."""

import numpy as np
import torch
from torch import nn

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def to_torch(array):
    """A numpy array of a storage dtype as a torch tensor of the same dtype and values
    (through float32, which holds every f16 and bf16 value exactly)."""
    name = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[array.dtype.name]
    return torch.from_numpy(np.asarray(array, np.float32)).to(TORCH_DTYPES[name])


def to_numpy(tensor):
    """Any float tensor as float64 numpy, for comparing with the reference."""
    return tensor.detach().to(torch.float64).numpy()


def to_layout(tensor, layout):
    """[B, H, N, D] <-> [B, N, H, D] (its own inverse): a view."""
    return tensor if layout == "bhsd" else tensor.transpose(1, 2)


def alibi_bias(slopes, num_queries, num_keys):
    """flash-attn's ALiBi, -slope |i + Nk - Nq - j|, as [B or 1, H, Nq, Nk] from slopes [H] or
    [B, H]."""
    positions = torch.arange(num_queries)[:, None] + num_keys - num_queries
    distance = (positions - torch.arange(num_keys)[None, :]).abs().to(slopes.dtype)
    slopes = slopes if slopes.dim() == 2 else slopes[None]
    return -slopes[:, :, None, None] * distance


def visible(num_queries, num_keys, *, causal, bottom_right, window=None):
    """Boolean [Nq, Nk] visibility, as flash-attn and mfa define it."""
    offset = num_keys - num_queries if bottom_right else 0
    positions = torch.arange(num_queries)[:, None] + offset
    keys = torch.arange(num_keys)[None, :]
    mask = torch.ones(num_queries, num_keys, dtype=torch.bool)
    if causal:
        mask &= keys <= positions
    left, right = window if window is not None else (-1, -1)
    if left >= 0:
        mask &= keys >= positions - left
    if right >= 0:
        mask &= keys <= positions + right
    return mask


def explicit_attention(q, k, v, mask, scale=None, softcap=None, bias=None):
    """softmax(scale q k^T, capped, plus bias, masked) v over [B, H, N, D] tensors,
    materialised, differentiable, with k and v repeated for grouped-query attention and rows
    without keys set to 0: softcap * tanh(s / softcap) right after scaling, then the bias."""
    group = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(group, dim=-3)
    v = v.repeat_interleave(group, dim=-3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v


class TinyLanguageModel(nn.Module):
    """Embedding, two causal self-attention blocks with grouped-query attention and residual
    connections, and a head predicting the next token. ``attention(q, k, v)`` takes and returns
    [B, H, N, D] tensors (k and v with fewer heads) and must apply the causal mask."""

    def __init__(self, attention, vocabulary=17, width=24, heads=4, kv_heads=2, layers=2):
        super().__init__()
        self.attention = attention
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.embedding = nn.Embedding(vocabulary, width)
        self.queries = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        kv_width = 2 * kv_heads * self.head_dim
        self.keys_values = nn.ModuleList(nn.Linear(width, kv_width) for _ in range(layers))
        self.outputs = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.head = nn.Linear(width, vocabulary)

    def forward(self, tokens):
        x = self.embedding(tokens)
        batch, length, width = x.shape
        for queries, keys_values, outputs in zip(self.queries, self.keys_values, self.outputs):
            q = queries(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
            kv = keys_values(x).view(batch, length, 2, self.kv_heads, self.head_dim)
            k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            mixed = self.attention(q, k, v)
            x = x + outputs(mixed.transpose(1, 2).reshape(batch, length, width))
        logits = self.head(x)
        return nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )


def reference_causal_attention(q, k, v):
    mask = visible(q.shape[-2], k.shape[-2], causal=True, bottom_right=False)
    return explicit_attention(q, k, v, mask)


def train_alongside_reference(attention, steps=3, seed=0):
    """Train a float32 TinyLanguageModel using `attention` and its float64 twin using the
    explicit reference attention, from the same weights on the same batch, with SGD; after
    every backward compare each parameter's gradient. Returns the float32 model's loss before
    and after training.

    Tolerance: the float32 model's gradients differ from the float64 ones by rounding errors,
    a few units of 2^-24 relative per operation, accumulated over some hundred operations
    (two layers, sums of up to 24 terms) and grown by the steps' diverging weights; 1e-4 of each
    parameter's largest gradient bounds that with a wide margin, while a wrong attention
    gradient (a missing term, a mask or scale error, a group not summed) is off by O(10%)."""
    torch.manual_seed(seed)
    model = TinyLanguageModel(attention)
    twin = TinyLanguageModel(reference_causal_attention).double()
    twin.load_state_dict(model.state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, twin)]
    tokens = torch.randint(0, 17, (3, 19), generator=torch.Generator().manual_seed(seed))
    before = loss_of(model, tokens)
    for step in range(steps):
        for m, optimizer in zip((model, twin), optimizers):
            optimizer.zero_grad()
            m(tokens).backward()
        for (name, parameter), twin_parameter in zip(model.named_parameters(), twin.parameters()):
            expected = twin_parameter.grad
            error = (parameter.grad.double() - expected).abs().max().item()
            allowed = 1e-4 * expected.abs().max().item() + 1e-7
            assert error <= allowed, (
                f"step {step}, {name}: gradient off by {error:.3g} (allowed {allowed:.3g})"
            )
        for optimizer in optimizers:
            optimizer.step()
    return before, loss_of(model, tokens)


def loss_of(model, tokens):
    with torch.no_grad():
        return model(tokens).item()
