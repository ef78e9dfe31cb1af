"""How the core calls ``torch.nn.attention.flex_attention`` (``--attention-backend flex``, chosen by
:func:`~.attention_backend.choose_kernel`): the score/mask mods of one call, bucketed shapes and
the compiled runner.
"""

import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor

from .attention_backend import HALF_DTYPES

# flex lengths are padded up to a multiple of this (flex's own block size) when compiled
FLEX_BUCKET = 128

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass
class FlexMods:
    """What one attention call adds to flex_attention: additive score terms and boolean masks.

    Every callable indexes only small tensors (per query, per key, per head, a distance table),
    padded to the bucketed :class:`FlexShape` the core passes to ``flex_mods``.
    """

    score_mods: List[ScoreMod] = field(default_factory=list)
    mask_mods: List[MaskMod] = field(default_factory=list)

    def extend(self, other: "FlexMods") -> "FlexMods":
        self.score_mods.extend(other.score_mods)
        self.mask_mods.extend(other.mask_mods)
        return self

    def score_mod(self) -> Optional[ScoreMod]:
        mods = list(self.score_mods)
        if not mods:
            return None

        def score_mod(score, b, h, q_idx, kv_idx):
            for mod in mods:
                score = mod(score, b, h, q_idx, kv_idx)
            return score

        return score_mod

    def mask_mod(self) -> Optional[MaskMod]:
        mods = list(self.mask_mods)
        if not mods:
            return None

        def mask_mod(b, h, q_idx, kv_idx):
            keep = mods[0](b, h, q_idx, kv_idx)
            for mod in mods[1:]:
                keep = keep & mod(b, h, q_idx, kv_idx)
            return keep

        return mask_mod


def bucket_length(n: int, multiple: int = FLEX_BUCKET) -> int:
    """Smallest length >= n in the bucket set: 16, 32, 64, then multiples of ``multiple``.

    Short lengths (incremental decoding has one query) get small power-of-two buckets instead
    of a whole block; beyond ``multiple`` the waste is below one block per sequence.
    """
    if n < 1:
        raise ValueError(f"length must be >= 1, got {n}")
    for small in (16, 32, 64):
        if n <= small and small < multiple:
            return small
    return -(-n // multiple) * multiple


def bucket_batch(n: int) -> int:
    """Smallest power of two >= n: the batch sizes of static flex kernels (at most 2x the rows,
    and the padded rows' blocks are skipped, their keys all masked)."""
    if n < 1:
        raise ValueError(f"batch size must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class FlexShape:
    """The sizes one flex call's q/k/v and the mods' small tensors are padded to: ``batch``
    sentences, ``q`` queries and ``kv`` keys (each the real size where nothing is bucketed)."""

    batch: int
    q: int
    kv: int


def pad_dims(x: Tensor, lengths: Dict[int, int], value=0) -> Tensor:
    """``x`` padded with ``value`` at the end of each dim up to its length in ``lengths``
    (``{dim: length}``; unchanged where it is that long already)."""
    for dim, length in lengths.items():
        extra = length - x.size(dim)
        if extra < 0:
            raise ValueError(f"cannot pad dim {dim} of size {x.size(dim)} down to {length}")
        if extra:
            shape = list(x.shape)
            shape[dim] = extra
            x = torch.cat([x, x.new_full(shape, value)], dim=dim)
    return x


def small_dtype(q: Tensor) -> torch.dtype:
    """dtype of the score-mod tensors: float32 for half q (flex computes scores in fp32)."""
    return torch.float32 if q.dtype in HALF_DTYPES else q.dtype


class FlexRunner:
    """Calls ``flex_attention``: eagerly, or through one ``torch.compile`` with counted shapes.

    Compiled with dynamo's automatic dynamic shapes (``dynamic=None``): the first call compiles a
    static kernel, a call with another batch size or bucket recompiles once with that dimension
    symbolic, and later sizes reuse it. Bucketing keeps the lengths to a few values either way (and
    the padded blocks full). ``signatures`` holds the distinct (q shape, k shape, dtype) seen;
    :meth:`recompiles` reads dynamo's own counter of compiled graphs (the measured number).
    Every distinct score/mask-mod structure (DMAN, a localness window, a static window, causal,
    padding) and every dtype and train/eval mode is a graph of its own on top of that.

    If the dynamic-shape compilation fails in the backend compiler (torch 2.13's CPU inductor
    flex template does, with a C++ error, when a second batch size arrives; torch 2.11's CUDA
    inductor did too on MAN's encoder, with a LoweringException, results/gpu/2026-11-29-h200.md),
    the runner warns once and compiles static kernels from then on: one compilation per (batch
    bucket, length bucket, mod structure, dtype), the batch padded to a power of two
    (:func:`bucket_batch`) since a training run meets dozens of batch sizes. Anything else (an error while tracing a
    score mod, out of memory) is raised as it is. Past :attr:`recompile_limit` compilations of
    one function dynamo would silently run it eagerly (unfused, with the (B,H,T,S) scores);
    here that raises ``FailOnRecompileLimitHit`` instead.
    """

    def __init__(self):
        self._compiled = None
        self._compiled_block_mask = None
        self.dynamic: Optional[bool] = None  # torch.compile's ``dynamic``
        self.compile = torch.compile
        self.signatures = set()
        self.calls = 0
        # None: bucket lengths exactly when compiled; True/False force it (tests, benchmarks)
        self.bucketing: Optional[bool] = None
        # None: compiled on CUDA only; True/False force it (tests of the compiled path on CPU)
        self.compiling: Optional[bool] = None
        # None: pad the batch to a power of two once kernels are static; True/False force it (tests)
        self.batch_bucketing: Optional[bool] = None
        # compilations of one function (flex_attention, create_block_mask) allowed before a call
        # fails. Static kernels need one per (batch bucket, length buckets) key and mod structure:
        # an epoch of CNN/DM (40k pairs, max-tokens 8192) makes 12 encoder, 18 decoder and 28
        # cross-attention keys (results/speed/README.md), so MAN's two encoder and two decoder
        # self-attention structures need 88 kernels in training alone, and validation (no grad)
        # more; dynamo's default (8) and the earlier 64 would stop such a run
        self.recompile_limit = 256

    def compiled_for(self, device_type: str) -> bool:
        # flex's compiled kernels are the point on CUDA; on CPU the eager (unfused) path is used
        return device_type == "cuda" if self.compiling is None else self.compiling

    def bucketed_for(self, device_type: str) -> bool:
        return self.compiled_for(device_type) if self.bucketing is None else self.bucketing

    def batch_bucketed_for(self, device_type: str) -> bool:
        if self.batch_bucketing is not None:
            return self.batch_bucketing
        return self.compiled_for(device_type) and self.dynamic is False

    def shape_for(self, batch: int, q_len: int, kv_len: int, device_type: str) -> FlexShape:
        """The padded sizes of a call on ``batch`` sentences of ``q_len`` queries, ``kv_len`` keys."""
        if self.bucketed_for(device_type):
            q_len, kv_len = bucket_length(q_len), bucket_length(kv_len)
        if self.batch_bucketed_for(device_type):
            batch = bucket_batch(batch)
        return FlexShape(batch, q_len, kv_len)

    def _limits(self):
        import torch._dynamo

        config = torch._dynamo.config
        return config.patch(recompile_limit=self.recompile_limit, fail_on_recompile_limit_hit=True,
                            accumulated_recompile_limit=max(config.accumulated_recompile_limit, self.recompile_limit))

    def __call__(self, q, k, v, score_mod, block_mask, scale, compiled: bool):
        from torch._dynamo.exc import BackendCompilerFailed
        from torch.nn.attention.flex_attention import flex_attention

        self.calls += 1
        if not compiled:
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
        if self._compiled is None:
            self._compiled = self.compile(flex_attention, dynamic=self.dynamic)
        self.signatures.add((tuple(q.shape), tuple(k.shape), q.dtype))
        try:
            with self._limits():
                return self._compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
        except BackendCompilerFailed as e:
            if self.dynamic is False or isinstance(e.inner_exception, torch.OutOfMemoryError):
                raise
            first_line = (str(e.inner_exception).strip().splitlines() or [""])[0][:300]
            warnings.warn(f"flex_attention: dynamic-shape compilation failed ({type(e.inner_exception).__name__}: "
                          f"{first_line}); compiling static kernels per shape from now on")
            self.dynamic = False
            self._compiled = self.compile(flex_attention, dynamic=False)
            with self._limits():
                return self._compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    def block_mask(self, mask_mod, batch: int, q_len: int, kv_len: int, device, compiled: bool):
        from torch.nn.attention.flex_attention import create_block_mask

        if not compiled:
            return create_block_mask(mask_mod, batch, None, q_len, kv_len, device=device)
        if self._compiled_block_mask is None:
            self._compiled_block_mask = self.compile(create_block_mask)
        with self._limits():
            return self._compiled_block_mask(mask_mod, batch, None, q_len, kv_len, device=device)

    @staticmethod
    def recompiles() -> int:
        """Graphs compiled by dynamo in this process so far (all compiled functions)."""
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])


FLEX_RUNNER = FlexRunner()


def flex_attention_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mods: FlexMods,
    scale: float,
    compiled: Optional[bool] = None,
    shape: Optional[FlexShape] = None,
) -> Tensor:
    """flex_attention on (B,H,T,D) q and (B,H,S,D) k/v whose mods index tensors padded to ``shape``.

    q/k/v are zero-padded to it; the caller's mods must already mask the padded keys (and every
    key of a padded sentence). Returns the (B,H,T,D) output of the real sentences and queries.
    """
    runner = FLEX_RUNNER
    if compiled is None:
        compiled = runner.compiled_for(q.device.type)
    bsz, t = q.size(0), q.size(2)
    shape = shape or FlexShape(bsz, t, k.size(2))
    q = pad_dims(q, {0: shape.batch, 2: shape.q})
    k, v = (pad_dims(x, {0: shape.batch, 2: shape.kv}) for x in (k, v))
    mask_mod = mods.mask_mod()
    block_mask = None
    if mask_mod is not None:
        block_mask = runner.block_mask(mask_mod, shape.batch, shape.q, shape.kv, q.device, compiled)
    out = runner(q, k, v, mods.score_mod(), block_mask, scale, compiled)
    return out[:bsz, :, :t]


def additive_table_mod(table: Tensor) -> ScoreMod:
    """score + table[q, kv] for a (T, S) float mask (e.g. a caller's attn_mask)."""

    def mod(score, b, h, q_idx, kv_idx):
        return score + table[q_idx, kv_idx].to(score.dtype)

    return mod


def key_valid_mod(valid: Tensor) -> MaskMod:
    """Keep key ``kv`` of sentence ``b`` where ``valid[b, kv]`` (B, S) is True."""

    def mod(b, h, q_idx, kv_idx):
        return valid[b, kv_idx]

    return mod


def device_scalar(value: int, device) -> Tensor:
    """``value`` as a 0-d long tensor on ``device`` by a fill kernel: ``torch.tensor(value,
    device="cuda")`` is a blocking host-to-device copy. A tensor, not a Python int, so that a
    compiled score/mask mod is not specialised (recompiled) on every decoding step's value."""
    return torch.full((), value, dtype=torch.long, device=device)


def causal_mod(query_start: Tensor) -> MaskMod:
    """Keep keys at or before the query: ``kv <= q + query_start`` (query_start a 0-d tensor)."""

    def mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + query_start

    return mod


def is_future_mask(attn_mask: Tensor, query_start: int) -> bool:
    """True if ``attn_mask`` (T,S) is exactly fairseq's causal mask (``-inf`` above the diagonal,
    0 elsewhere) for queries starting at key ``query_start``."""
    if attn_mask.dim() != 2:
        return False
    t, s = attn_mask.shape
    rows = torch.arange(t, device=attn_mask.device)[:, None] + query_start
    future = torch.arange(s, device=attn_mask.device)[None, :] > rows
    if attn_mask.dtype == torch.bool:
        return bool(torch.equal(attn_mask, future))
    return bool(torch.equal(torch.isneginf(attn_mask), future) and not attn_mask.masked_fill(future, 0).any())
