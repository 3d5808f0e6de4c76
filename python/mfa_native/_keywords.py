"""TypeErrors that name the right keyword when a caller uses another library's name for it."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

__all__ = ["keyword_hints", "MFA_NAMES"]

F = TypeVar("F", bound=Callable[..., Any])

# The names PyTorch (scaled_dot_product_attention), flash-attn and MLX use, and what
# mfa_native.attention / attention_backward take instead.
MFA_NAMES = {
    "is_causal": (
        "mfa_native's name for it is causal= (PyTorch's is_causal anchors the diagonal "
        "top-left: causal=True, causal_alignment='top_left')"
    ),
    "softmax_scale": "mfa_native's name for it is scale=",
    "window_size": (
        "mfa_native's name for it is window= (the same (left, right) pair; -1 or None leaves "
        "a side unbounded)"
    ),
    "attn_mask": (
        "mfa_native's name for it is mask= (boolean: True keeps a pair, as in PyTorch; or additive)"
    ),
    "return_attn_probs": (
        "mfa_native's name for returning the log-sum-exp is return_lse=; probabilities are "
        "never materialised"
    ),
    "return_softmax_lse": "mfa_native's name for it is return_lse=",
    "enable_gqa": (
        "mfa_native needs no such flag: grouped-query attention applies whenever the query "
        "heads are a multiple of the key/value heads"
    ),
    "deterministic": "mfa_native needs no such flag: its backward pass is always deterministic",
    "dropout_p": "mfa_native has no dropout",
    "return_dsinks": "only the backward functions return dsinks",
    "k_new": "mfa_native's name for the new keys is k= (attention_with_kvcache)",
    "v_new": "mfa_native's name for the new values is v= (attention_with_kvcache)",
    "query": "mfa_native's name for it is q (positional)",
    "key": "mfa_native's name for it is k (positional)",
    "value": "mfa_native's name for it is v (positional)",
}


def keyword_hints(hints: dict[str, str]) -> Callable[[F], F]:
    """Decorate a function so that an unexpected keyword argument raises a TypeError that
    names it and, where ``hints`` knows it, the function's own name for it.

    The wrapper costs one call on success; the hint is worked out only once Python has
    refused the arguments, which it does before the function's body runs.
    """

    def decorate(function: F) -> F:
        accepted = frozenset(inspect.signature(function).parameters)
        title = function.__name__

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except TypeError:
                unknown = [name for name in kwargs if name not in accepted]
                if not unknown:
                    raise
                name = unknown[0]
                message = f"{title}() got an unexpected keyword argument {name!r}"
                if name in hints:
                    message += f": {hints[name]}"
                raise TypeError(message) from None

        return wrapper  # type: ignore[return-value]

    return decorate
