"""The attention-calibration analysis (``man-export-calibration``; Lu et al. 2021, Figures 2, 6, 7 and
Table 5): per decoder layer, JSD and entropies of the original and calibrated cross-attention, the
mask, and Kendall-τ against gradient-based importance; its tables, plots and masks. What it measures
in full and the options: :mod:`man_recipes.cli.export_calibration`."""

import json
import os
from typing import Dict, List

import torch
from torch import Tensor

from man_recipes.analysis.utils import (
    Progress, arch_name, batch_iterator, checkpoint_folder, load_checkpoint, model_labels,
)
from man_recipes.analysis.calibration_plots import save_binned_plot, save_heatmap, save_kendall_plot, save_stats_plot
from man_recipes.analysis.calibration_stats import (
    SERIES_NAMES, BinnedJSD, KendallSums, layer_statistics, normalised_rows, source_importance,
)
from man_recipes.tables import markdown_table, slug


class CrossAttentionRecorder:
    """Per-head cross-attention weights of every decoder layer of a model without calibration.

    A forward hook re-runs the attention's own ``forward`` with ``need_head_weights=True`` (eval
    mode: same weights as the model's pass), as :class:`attention_locality.AttentionRecorder`.
    """

    def __init__(self, model):
        from fairseq.modules.multihead_attention import MultiheadAttention

        from man_fairseq.modules.biased_attention import BiasedMultiheadAttention

        self.probs: List[Tensor] = []
        self.handles = []
        for layer in model.decoder.layers:
            attn = getattr(layer, "encoder_attn", None)
            if attn is None:
                raise SystemExit(f"decoder layer {type(layer).__name__} has no encoder_attn")
            plain = isinstance(attn, MultiheadAttention) and not isinstance(attn, BiasedMultiheadAttention)
            self.handles.append(attn.register_forward_hook(self._hook(plain), with_kwargs=True))

    def _hook(self, plain_fairseq: bool):
        def hook(module, args, kwargs, output):
            rerun = dict(kwargs, need_weights=True, need_head_weights=True)
            if plain_fairseq:
                rerun["incremental_state"] = {}  # fairseq's explicit path, per-head weights
            with torch.no_grad():
                _, probs = module.forward(*args, **rerun)
            self.probs.append(probs.transpose(0, 1).detach())  # (B, H, T, S)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


class CalibrationTables:
    """What a calibrated model's batches add up to: per-layer JSD / entropy / mask sums over the real
    (sentence, target token, head) rows, the JSD binned by the shape of ``a``, each sentence's mask
    (``masks.pt``) and the heat maps of the first ``num_heatmaps`` sentences."""

    def __init__(self, num_layers, src_dict, tgt_dict, model_dir, num_heatmaps, title):
        self.src_dict, self.tgt_dict = src_dict, tgt_dict
        self.model_dir, self.num_heatmaps, self.title = model_dir, num_heatmaps, title
        self.sums, self.rows_total, self.heatmaps = None, 0, 0
        self.binned = BinnedJSD(num_layers)
        self.masks: Dict[int, Dict] = {}
        os.makedirs(os.path.join(model_dir, "heatmaps"), exist_ok=True)

    def add(self, captured, sample, src_real, tgt_real):
        layer_rows, n_rows = layer_statistics(captured, src_real, tgt_real)
        sums = self.sums
        self.sums = layer_rows if sums is None else [{k: s[k] + r[k] for k in s} for s, r in zip(sums, layer_rows)]
        self.rows_total += n_rows
        row_mask = tgt_real[:, None, :].expand(-1, captured[0]["attn"].size(1), -1)
        for layer, c in enumerate(captured):
            a, fused = normalised_rows(c, src_real)
            self.binned.add(layer, a, fused, row_mask)
        stacked = torch.stack([c["m"] for c in captured], 1).float().cpu()  # (B, L, H, T, S)
        src_tokens = sample["net_input"]["src_tokens"]
        for b, sid in enumerate(sample["id"].tolist()):
            src_idx = src_real[b].nonzero().squeeze(-1).cpu()
            tgt_len = int(tgt_real[b].sum())
            mask = stacked[b][:, :, :tgt_len].index_select(-1, src_idx).contiguous()
            src = [self.src_dict[i] for i in src_tokens[b][src_real[b]].tolist()]
            tgt = [self.tgt_dict[i] for i in sample["target"][b][:tgt_len].tolist()]
            self.masks[sid] = {"mask": mask, "src": src, "tgt": tgt}
            if self.heatmaps < self.num_heatmaps:
                save_heatmap(os.path.join(self.model_dir, "heatmaps", f"{sid}.png"), mask, src, tgt,
                             f"{self.title}, sentence {sid}")
                self.heatmaps += 1

    def result(self, fusion) -> Dict:
        """The model's entries of calibration_stats.json; writes ``masks.pt``."""
        torch.save(self.masks, os.path.join(self.model_dir, "masks.pt"))
        rows = max(self.rows_total, 1)
        table = [{"layer": i + 1, **{k: v / rows for k, v in s.items()}} for i, s in enumerate(self.sums or [])]
        for r in table:
            r["entropy_change"] = r["entropy_calibrated"] - r["entropy_original"]
        return dict(fusion=fusion, rows_per_layer=self.rows_total, layers=table,
                    entropy_change_all=sum(r["entropy_change"] for r in table) / max(len(table), 1),
                    jsd_bins=self.binned.tables())


def analyse_batch(model, sample, args, pads, kendall, tables, recorder, embeddings) -> int:
    """One batch teacher-forced: its Kendall-τ sums (sentences with id < ``--kendall-sentences``) and,
    for a calibrated model, its share of ``tables``; returns its number of sentences."""
    from man_fairseq.modules.calibration import CALIBRATED, calibration_mode

    src_tokens = sample["net_input"]["src_tokens"]
    src_real = src_tokens.ne(pads[0])
    tgt_real = sample["target"].ne(pads[1])
    ids = sample["id"].cpu()
    kendall_rows = (ids < args.kendall_sentences)[:, None] & tgt_real.cpu()  # sentences with id < N
    need_kendall = bool(kendall_rows.any())
    embeddings.clear()
    if recorder is not None:
        recorder.probs = []
    with torch.set_grad_enabled(need_kendall), calibration_mode(model, CALIBRATED) as cm:
        net_output = model(**sample["net_input"])
        if need_kendall:
            lprobs = model.get_normalized_probs(net_output, log_probs=True)
            token_lp = lprobs.gather(-1, sample["target"].unsqueeze(-1)).squeeze(-1)
            importance = source_importance(token_lp, embeddings["src"], tgt_real, args.importance)
    if tables is not None:
        series = {"attention": [c["attn"] for c in cm.captured],
                  "calibrated": [c["calibrated"] for c in cm.captured],
                  "mask": [c["m"] for c in cm.captured]}
    else:
        series = {"attention": recorder.probs}
    if need_kendall:
        key_mask = src_real[:, None, None, :].to(series["attention"][0].dtype)
        for name, per_layer in series.items():
            for layer, weights in enumerate(per_layer):
                head_mean = (weights * key_mask).mean(1)  # pads are 0 in a, a_cal and m already
                kendall.add(name, layer, head_mean.double(), importance, src_real, kendall_rows)
    if tables is not None:
        tables.add(cm.captured, sample, src_real, tgt_real)
    return src_tokens.size(0)


def analyse_checkpoint(path: str, label: str, args, use_cuda: bool, model_dir: str) -> Dict:
    from fairseq import utils

    from man_fairseq.modules.calibration import calibration_modules

    model, cfg, task = load_checkpoint(path, args.data, args.source_lang, args.target_lang)
    calibrated = bool(calibration_modules(model))
    if not calibrated and args.kendall_sentences == 0:
        raise SystemExit(f"{path} is not a transformer_calibrated_* model, and with --kendall-sentences 0 "
                         "there is nothing to measure for it")
    if use_cuda:
        model.cuda()
    itr = batch_iterator(task, model, args.gen_subset, args.batch_size, input_pairs=args.input_pairs)
    progress = Progress(f"{label}: calibration analysis of {where(args)}", len(itr), args.log_interval)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    kendall = KendallSums()
    recorder = None if calibrated else CrossAttentionRecorder(model)
    tables = CalibrationTables(len(model.decoder.layers), src_dict, tgt_dict, model_dir, args.num_heatmaps,
                               f"{label}, {where(args)}") if calibrated else None
    embeddings: Dict[str, Tensor] = {}

    def keep_source_embeddings(module, inputs, output):
        embeddings.setdefault("src", output)  # the encoder's lookup comes first (shared tables too)

    emb_handle = model.encoder.embed_tokens.register_forward_hook(keep_source_embeddings)
    sentences = 0
    try:
        for batch_index, sample in enumerate(itr, 1):
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            bsz = analyse_batch(model, sample, args, (src_dict.pad(), tgt_dict.pad()), kendall, tables, recorder,
                                embeddings)
            sentences += bsz
            progress.step(batch_index, bsz)
            if args.max_sentences is not None and sentences >= args.max_sentences:
                break
    finally:
        emb_handle.remove()
        if recorder is not None:
            recorder.remove()

    result = {"label": label, "path": path, "arch": arch_name(cfg), "calibrated": calibrated,
              "sentences": sentences, "kendall": kendall.means() if args.kendall_sentences > 0 else None}
    if calibrated:
        result.update(tables.result(calibration_modules(model)[0].fusion))
    return result


def where(args) -> str:
    return f"the pairs of {args.input_pairs}" if args.input_pairs else f"split {args.gen_subset}"


def signed(x: float, digits: int = 4) -> str:
    return f"{'+' if x >= 0 else '-'} {abs(x):.{digits}f}"


def jsd_by_bin(t: Dict) -> List[str]:
    """The table of mean JSD per layer (rows) and bin (columns, by their lower edge; ``-``: no rows)."""
    return markdown_table(["layer"] + [f"{b:g}" for b in t["bin_low"]],
                          [[f"{layer + 1}"] + ["-" if m is None else f"{m:.4f}" for m in means]
                           for layer, means in enumerate(t["mean_jsd"])])


def markdown(results: List[Dict], args) -> str:
    lines = []
    for r in results:
        lines.append(f"## {r['label']}\n\n`{r['path']}` ({r['arch']}), {where(args)}, "
                     f"{r['sentences']} sentences.\n")
        if r["calibrated"]:
            lines += [
                f"Per decoder layer (1-based), means over {r['rows_per_layer']} real (target token, head) rows per "
                f"layer, fusion `{r['fusion']}`. JSD base 2; entropies in bits; ΔH = H(a_cal) - H(a).",
                "",
            ] + markdown_table(
                ["layer", "JSD(a, a_cal) [bits]", "H(a) [bits]", "H(a_cal) [bits]", "ΔH [bits]", "mean m"],
                [[f"{x['layer']}", f"{x['jsd']:.4f}", f"{x['entropy_original']:.3f}", f"{x['entropy_calibrated']:.3f}",
                  f"{x['entropy_change']:+.3f}", f"{x['mask_mean']:.3f}"] for x in r["layers"]])
            lines += ["", "ΔEnt laid out as P3 Table 5 (\"+\": calibrated attention more disperse; "
                          "All = mean over all layers' rows):", ""]
            lines += markdown_table(["layer", "ΔEnt"],
                                    [[f"{x['layer']}", signed(x["entropy_change"])] for x in r["layers"]]
                                    + [["All", signed(r["entropy_change_all"])]]) + [""]
            t = r["jsd_bins"]["by_entropy"]
            lines += ["Mean JSD by entropy of a (P3 Figure 7; rows: layer, columns: bins of "
                      f"{t['bin_width']:g} bits, lower edge; `-`: no rows):", ""] + jsd_by_bin(t)
            t = r["jsd_bins"]["by_max_weight"]
            lines += ["", f"Mean JSD by maximum weight of a (bins of {t['bin_width']:g}, lower edge):", ""] + jsd_by_bin(t)
            lines.append("")
        if r["kendall"]:
            what = "|grad · e_s|" if args.importance == "grad_input" else "‖grad_e_s‖"
            lines += [f"Kendall τ-b between head-averaged weights and {what} of log p(y_t) (P3 Figure 2), "
                      f"sentences with id < {args.kendall_sentences}; mean over real target "
                      "tokens (count; undefined τ left out):", ""]
            first = next(iter(r["kendall"].values()))
            lines += markdown_table(
                ["layer"] + [SERIES_NAMES[s] for s in r["kendall"]],
                [[f"{layer + 1}"] + [("n/a" if v["tau"][layer] is None else f"{v['tau'][layer]:+.3f}")
                                     + f" ({v['target_tokens'][layer]})" for v in r["kendall"].values()]
                 for layer in range(len(first["tau"]))]) + [""]
    return "\n".join(lines)


def main(args):
    from fairseq import utils

    utils.import_user_module(args)
    if args.kendall_sentences < 0:
        raise SystemExit("--kendall-sentences must be >= 0")
    paths = utils.split_paths(args.path, separator=",")
    use_cuda = torch.cuda.is_available() and not args.cpu
    for p in paths:
        if not os.path.isfile(p):
            raise SystemExit(f"checkpoint not found: {p}")
    labels = model_labels(paths, [checkpoint_folder(p) for p in paths], args.labels)
    os.makedirs(args.output_dir, exist_ok=True)
    results = []
    for path, label in zip(paths, labels):
        model_dir = args.output_dir if len(paths) == 1 else os.path.join(args.output_dir, slug(label))
        results.append(analyse_checkpoint(path, label, args, use_cuda, model_dir))
    text = markdown(results, args)
    with open(os.path.join(args.output_dir, "calibration_stats.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.output_dir, "calibration_stats.json"), "w") as f:
        json.dump({"split": None if args.input_pairs else args.gen_subset, "input_pairs": args.input_pairs, "importance": args.importance,
                   "kendall_sentences": args.kendall_sentences, "models": results}, f, indent=2)
    if any(r["calibrated"] for r in results):
        save_stats_plot(os.path.join(args.output_dir, "calibration_stats.png"), results, where(args))
        save_binned_plot(os.path.join(args.output_dir, "jsd_by_entropy.png"), results, where(args))
    if args.kendall_sentences > 0:
        save_kendall_plot(os.path.join(args.output_dir, "kendall_tau.png"), results, where(args), args.importance)
    print(text)
    return results
