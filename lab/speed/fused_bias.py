"""One encoder layer's forward + backward on the fused-bias-grad path (issue 74), or with ``--sman`` on the
banded path (issue 80), against the other paths.

``python -m lab.speed.fused_bias [--threads 1] [--batch 20] [--length 400] [--repeats 5] [--sman]``

A micro-measurement, not a record: one layer at the CNN/DM CPU study's width (d = 256, 4 heads, pre-norm;
MAN's encoder layer ``dman,san,ffn`` with FFN 512, the Transformer's fairseq layer with FFN 1024, as the
study's configs), random inputs of ``batch x length`` tokens, interleaved repeats in one process for the
times (median, and each variant's ratio to the Transformer layer of the same repeat), and peak memory as
the rise of the resident set's high-water mark over one forward + backward in a fresh process per
variant (``/proc/self/clear_refs``, Linux). Variants:

* ``transformer``: fairseq's ``TransformerEncoderLayerBase``;
* ``man:auto``: MAN's layer on the fused-bias-grad path (``--attention-backend auto``);
* ``man:sdpa``: PyTorch's dispatcher, which sends a bias that needs a gradient to its math kernel
  (``auto``'s path for DMAN before issue 74);
* ``man:explicit``: the written-out softmax;
* ``man-nobias:auto``: MAN's layer with its DMAN sublayer a plain self-attention (``san,san,ffn``): what
  the layer would cost if DMAN's bias were free, the floor of any DMAN bias path;
* ``man:auto@N``: the fused-bias-grad path with ``BLOCK_ELEMENTS = N`` (``--blocks``; the block rule);
* with ``--sman``: ``window:...``, one self-attention sublayer with SMAN2's window (b = 4) on the banded
  path (``auto`` where the band is cheaper), ``sdpa`` (every key, the window as a float mask: ``auto``'s
  path before issue 80) and ``explicit``, ``plain:auto`` the sublayer without a window; ``sman2:...``,
  MAN's layer ``sman2,san,ffn`` (FFN 512: the studies' SMAN2 config) on ``auto`` and ``sdpa``,
  ``sman1:...`` the same with SMAN1's window, ``man-nobias:auto`` the layer ``san,san,ffn``;
* ``aw:...`` with ``--diffwin``: one self-attention sublayer with diffwin's additive window (AW) on
  the same paths, ``plain``: the sublayer without a bias, ``aw:predictors``: the window's bias
  module alone (pointers, soft mask, local logits) forward + backward.

``--precision``: instead, the float32 error of the output and of every gradient against float64 on
each path (the largest absolute error over the largest absolute float64 value, per tensor group).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

from lab.bounds import repeats
from man_recipes.interrupt import one_line_on_ctrl_c, run_child
from man_recipes.options import comma_items, number, workers


# batch x length² attention scores a head: 2^26 (1 GiB of float32, 2 of float64 for --precision), 20 x the
# default 20 x 400² and 16 x the CNN/DM CPU study's largest batches (16 sentences of 512 tokens)
MAX_SCORES = 1 << 26


def layer_config(ffn):
    from fairseq.models.transformer import TransformerConfig

    cfg = TransformerConfig()
    for side in (cfg.encoder, cfg.decoder):
        side.embed_dim, side.attention_heads, side.ffn_embed_dim, side.normalize_before = 256, 4, ffn, True
    cfg.dropout, cfg.attention_dropout, cfg.activation_dropout = 0.1, 0.0, 0.0
    cfg.attention_head_activation, cfg.dman_max_relative_distance, cfg.dman_init = "none", 256, "normal"
    cfg.static_mask_window = 4
    return cfg


def build(variant, dtype=torch.float32):
    """``(module, run)``: ``run(x, pad)`` one training forward of the variant's module."""
    from man_fairseq.modules import fused_bias_grad

    torch.manual_seed(0)
    family, _, backend = variant.partition(":")
    module, run = _build(family, backend.split("@")[0], dtype)
    elements = int(backend.split("@")[1]) if "@" in backend else fused_bias_grad.BLOCK_ELEMENTS

    def run_with_blocks(x, pad):
        fused_bias_grad.BLOCK_ELEMENTS = elements  # this variant's block rule (the variants share the module)
        return run(x, pad)

    return module, run_with_blocks


def _build(family, backend, dtype):
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    from man_fairseq.modules.biased_attention import AttentionContext, BiasedMultiheadAttention
    from man_fairseq.modules.diff_window import AdditiveWindow
    from man_fairseq.modules.man_layers import MANEncoderLayer
    from man_fairseq.modules.mask_bias import StaticWindowBias

    if family == "transformer":
        module = TransformerEncoderLayerBase(layer_config(1024))
        run = lambda x, pad: module(x, pad)  # noqa: E731
    elif family in ("man", "man-nobias", "sman1", "sman2"):
        sublayers = [{"man": "dman", "man-nobias": "san"}.get(family, family), "san", "ffn"]
        module = MANEncoderLayer(layer_config(512), sublayers, attention_backend=backend)
        run = lambda x, pad: module(x, pad)  # noqa: E731
    elif backend == "predictors":
        module = AdditiveWindow(256)

        def run(x, pad):
            q = x.new_empty(x.size(1), 4, x.size(0), 64)
            ctx = AttentionContext(query=x, key=x, q=q, k=q, key_padding_mask=pad, query_start=0,
                                   incremental_state=None, self_attention=True)
            return module(ctx)
    else:
        bias = {"plain": lambda: None, "aw": lambda: AdditiveWindow(256), "window": lambda: StaticWindowBias(4)}[family]()
        module = BiasedMultiheadAttention(256, 4, self_attention=True, bias_module=bias,
                                          attention_backend="auto" if family == "plain" else backend)
        run = lambda x, pad: module(x, x, x, key_padding_mask=pad, need_weights=False)[0]  # noqa: E731
    return module.to(dtype).train(), run


def inputs(batch, length, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(length, batch, 256, generator=g, dtype=dtype)
    pad = torch.zeros(batch, length, dtype=torch.bool)
    for i in range(batch):  # left-padded as fairseq's sources, up to a tenth shorter
        pad[i, : (i * length // 10) // max(1, batch - 1)] = True
    return x, pad


def step(run, x, pad):
    x = x.detach().requires_grad_()
    out = run(x, pad)
    out.float().square().mean().backward()


def time_variants(variants, batch, length, repeats, clock=time.perf_counter):
    built = {v: build(v) for v in variants}
    x, pad = inputs(batch, length)
    for _, run in built.values():  # warm-up
        step(run, x, pad)
    times = {v: [] for v in variants}
    for _ in range(repeats):
        for v, (_, run) in built.items():
            start = clock()
            step(run, x, pad)
            times[v].append(clock() - start)
    return times, {v: sorted({m.last_kernel.path for m in module.modules() if getattr(m, "last_kernel", None)})
                   for v, (module, _) in built.items()}


def _hwm_kib():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmHWM"].split()[0]), int(fields["VmRSS"].split()[0])


def peak_memory_child(variant, batch, length):
    """Run in a fresh process: the high-water mark's rise (MiB) over one forward + backward."""
    _, run = build(variant)
    step(run, *inputs(1, 8))  # the first call's lazy allocations (thread pools, kernels' buffers) out of the way
    x, pad = inputs(batch, length)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current resident set
    _, before = _hwm_kib()
    step(run, x, pad)
    hwm, _ = _hwm_kib()
    print(json.dumps({"variant": variant, "peak_rise_mib": (hwm - before) / 1024}))


def peak_memory(variants, batch, length, repeats, threads):
    peaks = {v: [] for v in variants}
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    for _ in range(repeats):
        for v in variants:
            out = run_child([sys.executable, "-m", "lab.speed.fused_bias", "--memory-child", v, "--batch",
                             str(batch), "--length", str(length), "--threads", str(threads)],
                            env=env, check=True, capture_output=True, text=True).stdout
            peaks[v].append(json.loads(out.strip().splitlines()[-1])["peak_rise_mib"])
    return peaks


def precision(variants, batch, length):
    """float32 error against float64, per path: output, inputs' gradient, parameters' gradients."""
    x64, pad = inputs(batch, length, torch.float64)
    rows = {}
    for v in variants:
        results = {}
        for dtype in (torch.float64, torch.float32):
            module, run = build(v, dtype)
            module.eval()  # no dropout, so both precisions see one function; gradients stay on
            x = x64.detach().to(dtype).requires_grad_()
            out = run(x, pad)
            out.square().mean().backward()
            grads = {n: p.grad.double() for n, p in module.named_parameters() if p.grad is not None}
            results[dtype] = {"output": out.detach().double(), "input grad": x.grad.double(), **grads}
        ref, low = results[torch.float64], results[torch.float32]
        # a gradient that is zero up to rounding (the key projection's bias: the softmax ignores a shift
        # shared by all keys) has no relative error to speak of
        rows[v] = {n: ((low[n] - ref[n]).abs().max() / ref[n].abs().max()).item() for n in ref
                   if ref[n].abs().max() > 1e-12}
    return rows


def block_sizes(text):
    """``--blocks``: comma-separated BLOCK_ELEMENTS values, each an int >= 1."""
    parse = number("--blocks", low=1)
    try:
        return [parse(item) for item in comma_items(text)] if text else []
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: {e}") from None


@one_line_on_ctrl_c("python -m lab.speed.fused_bias")
def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m lab.speed.fused_bias", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=workers("--threads"), default=1)
    p.add_argument("--batch", type=number("--batch", low=1), default=20)
    p.add_argument("--length", type=number("--length", low=1), default=400)
    p.add_argument("--repeats", type=repeats("--repeats"), default=5)
    p.add_argument("--memory-repeats", type=repeats("--memory-repeats"), default=2)
    p.add_argument("--blocks", type=block_sizes, default=[],
                   help="comma-separated BLOCK_ELEMENTS values to time on man:auto")
    p.add_argument("--diffwin", action="store_true", help="the AW sublayer's variants instead of MAN's")
    p.add_argument("--sman", action="store_true", help="SMAN's layers (banded against full) instead of MAN's")
    p.add_argument("--precision", action="store_true", help="float32 error against float64 instead of speed")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--cpu-time", action="store_true",
                   help="time each variant by this process's CPU time rather than wall time (on a loaded machine)")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    scores = args.batch * args.length ** 2
    if scores > MAX_SCORES:
        p.error(f"--batch {args.batch} x --length {args.length}²: {scores:,} attention scores a head, at most "
                f"{MAX_SCORES:,} (1 GiB of float32 a head)")
    torch.set_num_threads(args.threads)
    if args.memory_child:
        return peak_memory_child(args.memory_child, args.batch, args.length)
    if args.diffwin:
        variants = ["transformer", "plain:auto", "aw:auto", "aw:sdpa", "aw:explicit", "aw:predictors"]
    elif args.sman:
        variants = ["transformer", "plain:auto", "window:auto", "window:sdpa", "window:explicit", "man-nobias:auto",
                    "sman2:auto", "sman2:sdpa", "sman1:auto", "sman1:sdpa"]
    else:
        variants = ["transformer", "man-nobias:auto", "man:auto", "man:sdpa", "man:explicit"]
        variants += [f"man:auto@{n}" for n in args.blocks]
    if args.precision:
        for v, row in precision([v for v in variants if ":" in v and "predictors" not in v], args.batch,
                                args.length).items():
            bias = max((e for n, e in row.items() if "bias_module" in n), default=None)
            others = max(e for n, e in row.items() if "bias_module" not in n and n != "output")
            print(f"{v}: output {row['output']:.1e}, bias parameters' gradients "
                  f"{'—' if bias is None else f'<= {bias:.1e}'}, other gradients <= {others:.1e}")
        return 0
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch} x {args.length} tokens, "
          f"{args.repeats} interleaved repeats, {'CPU' if args.cpu_time else 'wall'} time")
    times, paths = time_variants(variants, args.batch, args.length, args.repeats,
                                 time.process_time if args.cpu_time else time.perf_counter)
    peaks = {} if args.no_memory else peak_memory(variants, args.batch, args.length, args.memory_repeats, args.threads)
    base = times["transformer"]
    print("| variant | attention paths | forward + backward, ms (min–max) | × transformer layer (min–max) | "
          "peak rise, MiB |")
    print("|---|---|---:|---:|---:|")
    for v, ts in times.items():
        ratios = [t / b for t, b in zip(ts, base)]
        peak = f"{statistics.median(peaks[v]):.0f}" if v in peaks else "—"
        print(f"| {v} | {', '.join(paths[v]) or '—'} | {statistics.median(ts) * 1e3:.0f} ({min(ts) * 1e3:.0f}–{max(ts) * 1e3:.0f}) | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {peak} |")
    print(f"max RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
