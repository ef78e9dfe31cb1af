"""Export the attention-calibration analysis of a trained ``transformer_calibrated_*`` model.

For every sentence of a data split (teacher-forced on the reference translation, as in the
paper's analysis, Figures 6-7) it writes

* ``masks.pt``: ``{sentence id: {"mask": m (layers, heads, tgt_len, src_len) float32,
  "src": [tokens], "tgt": [tokens]}}`` -- ``m`` is the perturbation model's mask, i.e. the
  saliency of each source token for each output token (pads removed);
* ``heatmaps/<id>.png`` for the first ``--num-heatmaps`` sentences (head-averaged ``m`` per layer);
* ``calibration_stats.md`` / ``.json`` / ``.png``: per decoder layer the Jensen-Shannon divergence
  (base 2, in [0, 1]) between the original cross-attention ``a`` and the fused calibrated weights,
  the entropies (bits) of both and their change, and the mean mask. Averages run over every real
  (target token, head) row. The ``anneal`` and ``fixed`` (the authors' ``a + lambda a^c``) fusions
  do not produce distributions; they are renormalised over the real source keys for JSD/entropy.

Usage::

    man-export-calibration DATA_BIN --path checkpoint_best.pt --gen-subset test \\
        --output-dir calib_analysis --num-heatmaps 20
"""

import argparse
import json
import logging
import os
from typing import Dict, List

import torch

logger = logging.getLogger("man_fairseq.export_calibration")


def get_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", help="fairseq binarized data directory")
    p.add_argument("--path", required=True, help="checkpoint of a transformer_calibrated_* model")
    p.add_argument("--gen-subset", default="test", help="data split (default: test)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--source-lang", default=None)
    p.add_argument("--target-lang", default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-sentences", type=int, default=None, help="stop after this many sentences")
    p.add_argument("--num-heatmaps", type=int, default=10, help="PNG heat maps for the first N sentences")
    p.add_argument("--cpu", action="store_true")
    return p


def entropy_bits(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.log2(p.clamp_min(1e-30))).sum(-1)


def jsd_bits(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    mid = 0.5 * (p + q)

    def kl(x, y):
        return (x * (torch.log2(x.clamp_min(1e-30)) - torch.log2(y.clamp_min(1e-30)))).sum(-1)

    return 0.5 * kl(p, mid) + 0.5 * kl(q, mid)


def layer_statistics(captured: List[Dict[str, torch.Tensor]], src_real: torch.Tensor, tgt_real: torch.Tensor):
    """Sums over real (sentence, target token, head) rows, per layer:
    jsd, entropy of a, entropy of fused, mean m; plus the row count."""
    rows = []
    key_mask = src_real[:, None, None, :].double()  # (B,1,1,S)
    row_mask = tgt_real[:, None, :].expand(-1, captured[0]["attn"].size(1), -1)  # (B,H,T)
    for c in captured:
        a = c["attn"].double() * key_mask
        fused = c["calibrated"].double() * key_mask
        a = a / a.sum(-1, keepdim=True).clamp_min(1e-30)
        fused = fused / fused.sum(-1, keepdim=True).clamp_min(1e-30)
        m_mean = c["m"].double().sum(-1) / key_mask.sum(-1)
        stats = {
            "jsd": jsd_bits(a, fused),
            "entropy_original": entropy_bits(a),
            "entropy_calibrated": entropy_bits(fused),
            "mask_mean": m_mean,
        }
        rows.append({k: float(v[row_mask].sum()) for k, v in stats.items()})
    return rows, int(row_mask.sum())


def save_heatmap(path, mask: torch.Tensor, src: List[str], tgt: List[str]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = mask.size(0)
    fig, axes = plt.subplots(1, layers, figsize=(max(4, 0.35 * len(src) + 1.5) * layers, 0.35 * len(tgt) + 2),
                             squeeze=False)
    for layer in range(layers):
        ax = axes[0, layer]
        image = ax.imshow(mask[layer].mean(0).numpy(), vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(src)))
        ax.set_xticklabels(src, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tgt)))
        ax.set_yticklabels(tgt, fontsize=7)
        ax.set_title(f"layer {layer}: mask m (head mean)", fontsize=9)
    fig.colorbar(image, ax=axes.ravel().tolist())
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def save_stats_plot(path, table: List[Dict[str, float]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [r["layer"] for r in table]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax1.bar(layers, [r["jsd"] for r in table])
    ax1.set_xlabel("decoder layer")
    ax1.set_ylabel("JSD(original, calibrated) [bits]")
    ax2.plot(layers, [r["entropy_original"] for r in table], "o-", label="original")
    ax2.plot(layers, [r["entropy_calibrated"] for r in table], "s-", label="calibrated")
    ax2.set_xlabel("decoder layer")
    ax2.set_ylabel("attention entropy [bits]")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.set_xticks(layers)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args):
    import man_fairseq  # noqa: F401  (registers the models before the checkpoint is read)
    from fairseq import checkpoint_utils, utils

    from man_fairseq.modules.calibration import CALIBRATED, calibration_mode, calibration_modules

    overrides = {"data": args.data}
    if args.source_lang:
        overrides["source_lang"] = args.source_lang
    if args.target_lang:
        overrides["target_lang"] = args.target_lang
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([args.path], arg_overrides=overrides)
    model = models[0]
    if not calibration_modules(model):
        raise SystemExit(f"{args.path} is not a transformer_calibrated_* model")
    use_cuda = torch.cuda.is_available() and not args.cpu
    model.eval()
    if use_cuda:
        model.cuda()
    task.load_dataset(args.gen_subset)
    dataset = task.dataset(args.gen_subset)
    itr = task.get_batch_iterator(
        dataset=dataset, max_sentences=args.batch_size, max_positions=utils.resolve_max_positions(
            task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, num_workers=0,
    ).next_epoch_itr(shuffle=False)

    os.makedirs(os.path.join(args.output_dir, "heatmaps"), exist_ok=True)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    pad = tgt_dict.pad()
    masks: Dict[int, Dict] = {}
    sums, rows_total, heatmaps = None, 0, 0
    for sample in itr:
        if use_cuda:
            sample = utils.move_to_cuda(sample)
        with torch.no_grad(), calibration_mode(model, CALIBRATED) as cm:
            model(**sample["net_input"])
        src_tokens = sample["net_input"]["src_tokens"]
        src_real = src_tokens.ne(src_dict.pad())
        tgt_real = sample["target"].ne(pad)
        layer_rows, n_rows = layer_statistics(cm.captured, src_real, tgt_real)
        sums = layer_rows if sums is None else [{k: s[k] + r[k] for k in s} for s, r in zip(sums, layer_rows)]
        rows_total += n_rows
        stacked = torch.stack([c["m"] for c in cm.captured], 1).float().cpu()  # (B, L, H, T, S)
        for b, sid in enumerate(sample["id"].tolist()):
            src_idx = src_real[b].nonzero().squeeze(-1).cpu()
            tgt_len = int(tgt_real[b].sum())
            mask = stacked[b][:, :, :tgt_len].index_select(-1, src_idx).contiguous()
            src = [src_dict[i] for i in src_tokens[b][src_real[b]].tolist()]
            tgt = [tgt_dict[i] for i in sample["target"][b][:tgt_len].tolist()]
            masks[sid] = {"mask": mask, "src": src, "tgt": tgt}
            if heatmaps < args.num_heatmaps:
                save_heatmap(os.path.join(args.output_dir, "heatmaps", f"{sid}.png"), mask, src, tgt)
                heatmaps += 1
        if args.max_sentences is not None and len(masks) >= args.max_sentences:
            break

    torch.save(masks, os.path.join(args.output_dir, "masks.pt"))
    table = [
        {"layer": i, **{k: v / max(rows_total, 1) for k, v in s.items()}} for i, s in enumerate(sums or [])
    ]
    for r in table:
        r["entropy_change"] = r["entropy_calibrated"] - r["entropy_original"]
    fusion = calibration_modules(model)[0].fusion
    lines = [
        f"Attention calibration analysis: `{args.path}`, split `{args.gen_subset}`, "
        f"{len(masks)} sentences, {rows_total} (target token, head) rows per layer, fusion `{fusion}`.",
        "",
        "| layer | JSD(a, a_cal) [bits] | H(a) [bits] | H(a_cal) [bits] | ΔH [bits] | mean m |",
        "|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['layer']} | {r['jsd']:.4f} | {r['entropy_original']:.3f} | {r['entropy_calibrated']:.3f} "
            f"| {r['entropy_change']:+.3f} | {r['mask_mean']:.3f} |"
        )
    with open(os.path.join(args.output_dir, "calibration_stats.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.output_dir, "calibration_stats.json"), "w") as f:
        json.dump({"sentences": len(masks), "rows_per_layer": rows_total, "fusion": fusion, "layers": table}, f, indent=2)
    save_stats_plot(os.path.join(args.output_dir, "calibration_stats.png"), table)
    print("\n".join(lines))
    return table


def cli_main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # font-manager debug noise
    main(get_parser().parse_args())


if __name__ == "__main__":
    cli_main()
