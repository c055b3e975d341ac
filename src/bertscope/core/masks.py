"""The one place where the padding-mask convention is converted.

Shape legend: B batch, T tokens (keys), H heads.

bertscope's API takes BERT's convention: ``attention_mask`` is (B, T) with
1 = a real token and 0 = PAD (S4).

Inside attention the mask becomes an *additive bias* of shape (B, 1, 1, T): 0.0 where a key
may be attended and the dtype's most negative finite number where it may not. Added to the
scores before softmax, exp() of that bias underflows to exactly 0, so a PAD key gets weight
exactly 0 and contributes nothing. The finite minimum (rather than -inf) keeps a row whose
keys are all PAD from turning into NaN.

Polarity warning: PyTorch's ``nn.MultiheadAttention(key_padding_mask=...)`` takes a boolean
mask where True means "ignore this key" -- the opposite of BERT's 1 = keep. Use
:func:`to_key_padding_mask` to convert; never flip a mask by hand elsewhere.
"""

from __future__ import annotations

import torch

from ..errors import InputError, InputTypeError

__all__ = ["check_attention_mask", "mask_to_bias", "to_key_padding_mask"]


def check_attention_mask(attention_mask: torch.Tensor, batch: int, tokens: int) -> None:
    """Raise InputError (a ValueError) unless the mask is (B, T) and holds only 0s and 1s, as
    integers or floats: a boolean mask is refused, since HF reads True as a token and PyTorch's
    key_padding_mask reads it as PAD, and reading it the wrong way round gives wrong numbers
    without an error."""
    if not isinstance(attention_mask, torch.Tensor):
        _check_kind(attention_mask)  # its one-line type error
    if tuple(attention_mask.shape) != (batch, tokens):
        raise InputError(
            f"attention_mask must have shape (B, T) = ({batch}, {tokens}), "
            f"got {tuple(attention_mask.shape)}"
        )
    _refuse_bool(attention_mask)
    _refuse_other_values(attention_mask)


def _check_kind(attention_mask: object) -> None:
    """A (B, T) tensor, else a one-line error (not torch's AttributeError eight frames down)."""
    if not isinstance(attention_mask, torch.Tensor):
        raise InputTypeError(f"attention_mask must be a torch.Tensor (B, T) of 1 (token) and 0 (PAD), "
                             f"got {type(attention_mask).__name__}")
    if attention_mask.dim() != 2:
        raise InputError(f"attention_mask must have shape (B, T), got {tuple(attention_mask.shape)}")


def _refuse_other_values(attention_mask: torch.Tensor) -> None:
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise InputError("attention_mask must hold only 1 (token) and 0 (PAD)")


def _refuse_bool(attention_mask: torch.Tensor) -> None:
    if attention_mask.dtype == torch.bool:  # True means "token" to HF but "PAD" to PyTorch
        raise InputError("attention_mask is boolean, and the two conventions for it are opposite: give "
                         "integers, 1 = token and 0 = PAD (mask.long() for HF's True = token, "
                         "(~mask).long() for PyTorch's key_padding_mask, True = PAD)")


def mask_to_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1 = token / 0 = PAD  ->  additive bias (B, 1, 1, T): 0 keep, dtype-min drop."""
    _check_kind(attention_mask)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InputError(f"dtype must be a floating-point torch.dtype (the scores' dtype), got {dtype!r}")
    _refuse_bool(attention_mask)
    _refuse_other_values(attention_mask)  # a 2 is neither convention: refused, as the model refuses it
    keep = attention_mask.to(torch.bool)[:, None, None, :]  # (B, 1, 1, T)
    bias = torch.zeros(keep.shape, dtype=dtype, device=attention_mask.device)
    return bias.masked_fill(~keep, torch.finfo(dtype).min)  # (B, 1, 1, T)


def to_key_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """BERT's (B, T) 1 = token  ->  PyTorch's boolean key_padding_mask, True = PAD (ignore)."""
    _check_kind(attention_mask)
    _refuse_bool(attention_mask)
    _refuse_other_values(attention_mask)  # a 2 is neither convention: refused, as the model refuses it
    return attention_mask == 0  # (B, T)
