"""The windows a trained differentiable-window model draws (``man-diffwin-windows``): per attention, layer
and query, the expected left and right boundary, the expected width and the mask's mass; its TSV,
summary, heat maps and width plots. What it measures in full and the options:
:mod:`man_recipes.cli.diffwin_windows`."""

import json
import logging
import os
from collections import defaultdict
from typing import Dict, List

import torch
from torch import Tensor

from man_recipes.analysis.utils import (
    ATTENTION_KINDS as KINDS, Progress, arch_name, attention_modules, batch_iterator, checkpoint_folder, load_checkpoint,
    model_labels,
)
from man_recipes.logging_setup import pyplot
from man_recipes.tables import markdown_table, slug

logger = logging.getLogger("man_fairseq.diffwin_windows")


COLUMNS = ["sample_id", "attention", "layer", "query_position", "expected_left", "expected_right",
           "expected_width", "mask_sum", "mask_at_query"]


def window_modules(model):
    """[(attention kind, layer, module)] of every differentiable window of the model."""
    from man_fairseq.modules.diff_window import WindowPointers

    found = attention_modules(model, WindowPointers, "differentiable-window")
    return sorted(found, key=lambda x: (KINDS.index(x[0]), x[1]))


def expected_abs_difference(phi_left: Tensor, phi_right: Tensor) -> Tensor:
    """E|r - l| for independent l ~ phi_left, r ~ phi_right over the last axis (positions 0..S-1).

    Σ_i phi_L[i] Σ_j phi_R[j] |i - j| with the inner sum from prefix sums of phi_R and j phi_R:
    Σ_j phi_R[j] |i - j| = i F(i) - G(i) + (G(S-1) - G(i)) - i (1 - F(i)),
    F(i) = Σ_{j<=i} phi_R[j], G(i) = Σ_{j<=i} j phi_R[j] (``1`` is the total mass of phi_R).
    """
    pos = torch.arange(phi_left.size(-1), dtype=phi_left.dtype, device=phi_left.device)
    f = phi_right.cumsum(-1)
    g = (phi_right * pos).cumsum(-1)
    total_f, total_g = f[..., -1:], g[..., -1:]
    inner = pos * f - g + (total_g - g) - pos * (total_f - f)
    return (phi_left * inner).sum(-1)


def window_rows(rec: Dict[str, Tensor], query_pad: Tensor, key_pad: Tensor, self_attention: bool) -> Tensor:
    """(N, 7) rows ``(batch index, query position, E[l], E[r], E|r-l|+1, Σ m, m[t, t])`` of the real
    queries (``m[t, t]`` is nan without ``self_attention``).

    ``query_pad`` (B, T), ``key_pad`` (B, S): True at pads. Positions count from the first real token.
    """
    phi_left, phi_right, mask = (rec[k].double().cpu() for k in ("phi_left", "phi_right", "mask"))
    key_real = (~key_pad).double()[:, None, :]
    key_first = key_pad.long().argmin(-1).double()  # index of the first real key
    pos = torch.arange(phi_left.size(-1), dtype=torch.float64)
    left = (phi_left * pos).sum(-1) - key_first[:, None]
    right = (phi_right * pos).sum(-1) - key_first[:, None]
    width = expected_abs_difference(phi_left, phi_right) + 1
    mask_sum = (mask * key_real).sum(-1)
    q_first = query_pad.long().argmin(-1)
    q_pos = torch.arange(query_pad.size(1))[None, :] - q_first[:, None]
    b, t = (~query_pad).nonzero(as_tuple=True)
    # self-attention: queries and keys are the same padded sequence, so the query's own key is index t
    own = mask[b, t, t] if self_attention else torch.full_like(left[b, t], float("nan"))
    return torch.stack([b.double(), q_pos[b, t].double(), left[b, t], right[b, t], width[b, t], mask_sum[b, t],
                        own], 1)


def save_heatmap(path, per_layer: List[Dict[str, Tensor]], layers: List[int], kind: str, queries: List[str],
                 keys: List[str], title: str):
    """Rows: layers; columns: phi_L, phi_R (shared colour scale 0..max), m (0..max(1, max m))."""
    plt = pyplot()
    cols = [("phi_left", "left boundary φ_L"), ("phi_right", "right boundary φ_R"), ("mask", "soft window mask m")]
    cell = 0.3
    w = max(2.6, cell * len(keys) + 1.2)
    h = max(2.2, cell * len(queries) + 1.4)
    fig, axes = plt.subplots(len(layers), 3, figsize=(3 * w + 1.5, h * len(layers) + 0.6), squeeze=False)
    phi_max = max(float(torch.maximum(x["phi_left"].max(), x["phi_right"].max())) for x in per_layer)
    mask_max = max(1.0, max(float(x["mask"].max()) for x in per_layer))
    for row, (layer, rec) in enumerate(zip(layers, per_layer)):
        for col, (key, name) in enumerate(cols):
            ax = axes[row, col]
            vmax = mask_max if key == "mask" else phi_max
            image = ax.imshow(rec[key].numpy(), vmin=0, vmax=vmax, cmap="viridis", aspect="auto")
            ax.set_xticks(range(len(keys)))
            ax.set_xticklabels(keys, rotation=90, fontsize=7)
            ax.set_yticks(range(len(queries)))
            ax.set_yticklabels(queries, fontsize=7)
            ax.set_title(f"layer {layer}: {name}", fontsize=9)
            if col == 0:
                ax.set_ylabel("query token")
            if row == len(layers) - 1:
                ax.set_xlabel("key token")
            if row == 0 and col in (1, 2):
                label = "probability" if col == 1 else "m"
                fig.colorbar(image, ax=axes[:, col if col == 2 else slice(0, 2)].ravel().tolist(), label=label,
                             shrink=0.8)
    decoder = "" if kind == "encoder_self" else "; decoder positions labelled by their input token"
    fig.suptitle(f"{title}\n{kind} attention, layers 0-based{decoder}", fontsize=9)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def analyse_checkpoint(path, label, args, use_cuda, model_dir):
    from fairseq import utils

    model, cfg, task = load_checkpoint(path, args.data, args.source_lang, args.target_lang)
    modules = window_modules(model)
    if not modules:
        raise SystemExit(f"{path}: the model has no differentiable window (a transformer_diffwin_* model "
                         "with --diffwin-layers > 0 and a mode other than none?)")
    if use_cuda:
        model.cuda()
    itr = batch_iterator(task, model, args.gen_subset, args.batch_size, input_pairs=args.input_pairs)
    where = args.input_pairs or f"split {args.gen_subset}"
    progress = Progress(f"{label}: differentiable windows of {where}", len(itr), args.log_interval)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    rows = defaultdict(list)
    os.makedirs(os.path.join(model_dir, "heatmaps"), exist_ok=True)
    heatmaps = 0
    for _, _, module in modules:
        module.record = True
    try:
        for batch_index, sample in enumerate(itr, 1):
            ids = sample["id"]
            if args.max_sentences is not None:
                if not bool((ids < args.max_sentences).any()):
                    progress.step(batch_index, 0)
                    continue
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            net_input = sample["net_input"]
            with torch.no_grad():
                model(**net_input)
            src_pad = net_input["src_tokens"].eq(src_dict.pad()).cpu()
            tgt_pad = net_input["prev_output_tokens"].eq(tgt_dict.pad()).cpu()
            pads = {"encoder_self": (src_pad, src_pad), "decoder_self": (tgt_pad, tgt_pad), "cross": (tgt_pad, src_pad)}
            keep = torch.ones(len(ids), dtype=torch.bool) if args.max_sentences is None else ids.cpu() < args.max_sentences
            records = {}
            for kind, layer, module in modules:
                rec = module.last_window
                if rec is None or rec["phi_left"].size(1) != pads[kind][0].size(1):
                    raise RuntimeError(f"{kind} layer {layer}: no window recorded for this batch")
                records[(kind, layer)] = rec
                batch_rows = window_rows(rec, *pads[kind], self_attention=kind != "cross")
                batch_rows = batch_rows[keep[batch_rows[:, 0].long()]]
                batch_rows[:, 0] = ids.cpu().double()[batch_rows[:, 0].long()]
                rows[(kind, layer)].append(batch_rows)
            for b, sid in enumerate(ids.tolist()):
                if sid >= args.num_heatmaps or not keep[b]:
                    continue
                src_real, tgt_real = ~src_pad[b], ~tgt_pad[b]
                tokens = {
                    "src": [src_dict[i] for i in net_input["src_tokens"][b].cpu()[src_real].tolist()],
                    "tgt": [tgt_dict[i] for i in net_input["prev_output_tokens"][b].cpu()[tgt_real].tolist()],
                }
                for kind in dict.fromkeys(k for k, _, _ in modules):
                    q_real, k_real = (src_real, src_real) if kind == "encoder_self" else (
                        (tgt_real, tgt_real) if kind == "decoder_self" else (tgt_real, src_real))
                    layers = [layer for k, layer, _ in modules if k == kind]
                    per_layer = [{key: records[(kind, layer)][key][b].cpu().float()[q_real][:, k_real]
                                  for key in ("phi_left", "phi_right", "mask")} for layer in layers]
                    queries = tokens["src"] if kind == "encoder_self" else tokens["tgt"]
                    keys = tokens["tgt"] if kind == "decoder_self" else tokens["src"]
                    save_heatmap(os.path.join(model_dir, "heatmaps", f"{sid}_{kind}.png"), per_layer, layers, kind,
                                 queries, keys, f"{label}: differentiable windows of sentence {sid} ({where})")
                heatmaps += 1
            progress.step(batch_index, int(keep.sum()))
    finally:
        for _, _, module in modules:
            module.record = False
            module.last_window = None
    rows = {key: torch.cat(parts) for key, parts in rows.items()}
    write_model_outputs(rows, model_dir, label, where)
    return {"label": label, "path": path, "arch": arch_name(cfg), "rows": rows, "heatmaps": heatmaps}


def summary(rows: Dict) -> List[Dict]:
    out = []
    for (kind, layer), r in rows.items():
        width = r[:, 4]
        out.append({"attention": kind, "layer": layer, "queries": len(r),
                    "mean_width": float(width.mean()) if len(r) else None,
                    "median_width": float(width.median()) if len(r) else None,
                    "std_width": float(width.std()) if len(r) > 1 else 0.0,
                    "mean_mask_sum": float(r[:, 5].mean()) if len(r) else None,
                    "mean_left_offset": float((r[:, 2] - r[:, 1]).mean()) if len(r) else None,
                    "mean_right_offset": float((r[:, 3] - r[:, 1]).mean()) if len(r) else None,
                    "mean_mask_at_query": float(r[:, 6].mean()) if len(r) and kind != "cross" else None})
    return out


def write_model_outputs(rows, out_dir, label, where):
    with open(os.path.join(out_dir, "windows.tsv"), "w") as f:
        f.write("\t".join(COLUMNS) + "\n")
        for (kind, layer), r in rows.items():
            for x in r.tolist():
                f.write(f"{int(x[0])}\t{kind}\t{layer}\t{int(x[1])}\t{x[2]:.4f}\t{x[3]:.4f}\t{x[4]:.4f}\t{x[5]:.4f}"
                        f"\t{x[6]:.4f}\n")
    table = summary(rows)
    lines = [
        f"Differentiable windows of `{label}` on {where}: per attention and layer (0-based), over every real "
        "query; width = E|r - l| + 1 under φ_L ⊗ φ_R; Σm = soft window mask summed over the real keys; "
        "offsets = E[l] - t and E[r] - t (positions from the first real token); m[t,t] = the mask at the query's "
        "own token (self-attention).",
        "",
    ] + markdown_table(
        ["attention", "layer", "queries", "mean width", "median width", "std width", "mean Σm", "mean E[l]-t",
         "mean E[r]-t", "mean m[t,t]"],
        [[f"{x['attention']}", f"{x['layer']}", f"{x['queries']}", f"{x['mean_width']:.2f}", f"{x['median_width']:.2f}",
          f"{x['std_width']:.2f}", f"{x['mean_mask_sum']:.2f}", f"{x['mean_left_offset']:+.2f}",
          f"{x['mean_right_offset']:+.2f}",
          "–" if x["mean_mask_at_query"] is None else f"{x['mean_mask_at_query']:.2f}"] for x in table])
    with open(os.path.join(out_dir, "windows.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "windows.json"), "w") as f:
        json.dump({"label": label, "data": where, "layers": table}, f, indent=2)
    return lines


def save_width_plot(path, results, where):
    """One panel per attention kind; per layer a histogram of E|r-l|+1 (step outlines), per model a colour."""
    plt = pyplot()
    kinds = [k for k in KINDS if any(key[0] == k for r in results for key in r["rows"])]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.6 * len(kinds) + 1.2, 3.8), squeeze=False)
    styles = ["-", "--", ":", "-."]
    colours = plt.get_cmap("tab10")
    for ax, kind in zip(axes[0], kinds):
        values = torch.cat([r["rows"][key][:, 4] for r in results for key in r["rows"] if key[0] == kind])
        low, high = float(values.min()), float(values.max())
        edges = torch.linspace(low, max(high, low + 1e-6), 26).numpy()  # the same bins for every layer
        for mi, r in enumerate(results):
            layers = sorted(layer for k, layer in r["rows"] if k == kind)
            for li, layer in enumerate(layers):
                width = r["rows"][(kind, layer)][:, 4].numpy()
                if len(width) == 0:
                    continue
                label = f"layer {layer}" if len(results) == 1 else f"{r['label']}, layer {layer}"
                colour = colours(li % 10) if len(results) == 1 else colours(mi % 10)
                style = "-" if len(results) == 1 else styles[li % len(styles)]
                ax.hist(width, bins=edges, histtype="step", linewidth=1.5, color=colour, linestyle=style,
                        density=True, label=label)
        ax.set_title(f"{kind}", fontsize=10)
        ax.set_xlabel("expected window width E|r - l| + 1 [tokens]")
        ax.set_ylabel("density over real queries")
        ax.legend(fontsize=7)
    fig.suptitle(f"Differentiable-window widths per layer (0-based), {where}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args):
    from fairseq import utils

    utils.import_user_module(args)
    paths = utils.split_paths(args.path, separator=",")
    for p in paths:
        if not os.path.isfile(p):
            raise SystemExit(f"checkpoint not found: {p}")
    labels = model_labels(paths, [checkpoint_folder(p) for p in paths], args.labels)
    use_cuda = torch.cuda.is_available() and not args.cpu
    os.makedirs(args.output_dir, exist_ok=True)
    results = []
    for path, label in zip(paths, labels):
        model_dir = args.output_dir if len(paths) == 1 else os.path.join(
            args.output_dir, slug(label))
        os.makedirs(model_dir, exist_ok=True)
        results.append(analyse_checkpoint(path, label, args, use_cuda, model_dir))
    where = args.input_pairs or f"split {args.gen_subset}"
    save_width_plot(os.path.join(args.output_dir, "widths.png"), results, where)
    for r in results:
        with open(os.path.join(args.output_dir if len(results) == 1 else os.path.join(
                args.output_dir, slug(r["label"])),
                "windows.md")) as f:
            print(f.read())
    return results
