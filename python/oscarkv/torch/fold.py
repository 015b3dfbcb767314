"""The value rotation folded into the output projection, so attention over pages can return its
output in the rotated value basis (no unrotation in the decode / extend launch).

Pages hold values rotated per KV head h, v' = v R_h (kernels/include/oscarkv/kernels/rotation.h:
rows rotated on the right). Attention of query head j (KV head h = j // (Hq / H)) in that basis
gives o'_j = o_j R_h, and o_j = o'_j R_h^T. The output projection y = sum_j o_j W_j^T (W_j: the
columns j*d..(j+1)*d of W_o [hidden, Hq*d]) is then

    y = sum_j o'_j R_h^T W_j^T = sum_j o'_j (W_j R_h)^T,

so W_o' = W_o * blockdiag(R_h(0), ..., R_h(Hq-1)) takes the rotated output as it is. The fold is
computed in float64 and rounded once to the weight's dtype.

    w2 = fold_value_rotation(w_o, codec.matrices[layer, 1], num_q_heads)     # a new tensor
    cache.decode(layer, q, unrotate=False) @ w2.T  ==  cache.decode(layer, q) @ w_o.T
"""
from typing import Any, Optional

import torch

# The attribute an attention module carries once fold_model_value_rotations folded its o_proj:
# (rotation digest of the codec, the R_V [kv_heads, d, d] f32 CPU tensor used).
FOLD_ATTR = "oscarkv_value_fold"


def fold_value_rotation(weight: torch.Tensor, rotations_v: torch.Tensor, num_q_heads: int,
                        inverse: bool = False) -> torch.Tensor:
    """W_o [out, Hq*d] -> W_o * blockdiag(R) (inverse: * blockdiag(R^T), which undoes a fold),
    R = rotations_v[j // (Hq / H)] for query head j; rotations_v [H, d, d]. Returns a new
    tensor of weight's dtype and device."""
    if rotations_v.dim() != 3 or rotations_v.shape[1] != rotations_v.shape[2]:
        raise ValueError("rotations_v must be [kv_heads, d, d]")
    h, d = rotations_v.shape[0], rotations_v.shape[1]
    if weight.dim() != 2 or weight.shape[1] != num_q_heads * d or num_q_heads % h:
        raise ValueError("weight [out, %d] for %d query heads of %d over %d KV heads"
                         % (num_q_heads * d, num_q_heads, d, h))
    r = rotations_v.to(weight.device, torch.float64)
    if inverse:
        r = r.transpose(1, 2)
    r = r.repeat_interleave(num_q_heads // h, 0)  # [Hq, d, d]: query head j's R
    w = weight.to(torch.float64).view(weight.shape[0], num_q_heads, d)
    folded = torch.einsum("ojd,jde->oje", w, r)
    return folded.reshape(weight.shape).to(weight.dtype)


def _attention_modules(model: Any):
    """(layer index, module with o_proj) of a transformers model's attention layers."""
    for m in model.modules():
        idx = getattr(m, "layer_idx", None)
        o = getattr(m, "o_proj", None)
        if isinstance(idx, int) and isinstance(getattr(o, "weight", None), torch.Tensor):
            yield idx, m


def fold_model_value_rotations(model: Any, codec: Any, digest: Optional[bytes] = None) -> int:
    """Folds codec's R_V of each layer into that layer's o_proj (in place) and marks the module
    (FOLD_ATTR) so the "oscarkv" attention returns rotated outputs for it. A module folded with
    another codec is unfolded first; one already folded with this codec is left as it is.
    Returns the number of modules folded with this codec. The model then computes correctly
    only through oscarkv's attention with this codec (unfold_model_value_rotations undoes it)."""
    digest = codec.rotation_digest() if digest is None else digest
    hq = model.config.num_attention_heads
    n = 0
    with torch.no_grad():
        for idx, m in _attention_modules(model):
            if not 0 <= idx < codec.num_layers:
                continue
            have = getattr(m, FOLD_ATTR, None)
            if have is not None and have[0] == digest:
                n += 1
                continue
            _unfold(m, hq)
            rv = codec.matrices[idx, 1].clone()
            w = m.o_proj.weight
            w.copy_(fold_value_rotation(w, rv, hq))
            setattr(m, FOLD_ATTR, (digest, rv))
            n += 1
    return n


def _unfold(m: Any, hq: int) -> None:
    have = getattr(m, FOLD_ATTR, None)
    if have is None:
        return
    w = m.o_proj.weight
    w.copy_(fold_value_rotation(w, have[1], hq, inverse=True))
    delattr(m, FOLD_ATTR)


def unfold_model_value_rotations(model: Any) -> int:
    """Undoes fold_model_value_rotations (o_proj back in the model's value basis, up to the
    weight dtype's rounding of the two products); returns the number of modules unfolded."""
    hq = model.config.num_attention_heads
    n = 0
    with torch.no_grad():
        for _, m in _attention_modules(model):
            if getattr(m, FOLD_ATTR, None) is not None:
                _unfold(m, hq)
                n += 1
    return n


def folded_digest(module: Any) -> Optional[bytes]:
    """The rotation digest module's o_proj is folded with, or None."""
    have = getattr(module, FOLD_ATTR, None)
    return None if have is None else have[0]
