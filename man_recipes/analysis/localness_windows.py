"""The centres and windows a trained localness model predicts (``man-localness-windows``; the localness
paper's Figures 2-3): per attention, layer, head and query; its TSV, tables and figures. What it
measures in full and the options: :mod:`man_recipes.cli.localness_windows`."""

import os
from collections import defaultdict

import torch

import man_fairseq  # noqa: F401  (registers the archs before the checkpoint is loaded)
from man_recipes.analysis.utils import attention_modules
from man_recipes.logging_setup import pyplot
from man_fairseq.modules.localness import LocalnessBias
from man_recipes.tables import markdown_table, slug

COLUMNS = ["sample_id", "attention", "layer", "head", "query_position", "length", "centre", "window"]


def localness_modules(model):
    """[(attention type, layer, module)] of every localness bias of the model, in order."""
    return attention_modules(model, LocalnessBias, "localness")


def windows_of_batch(rec, query_pad):
    """Rows (sample index in batch, head, query position, length, centre, window) for real queries."""
    centre = rec["centre"].squeeze(-1)  # (B, H, T)
    shape = centre.shape
    window = rec["window"].squeeze(-1).expand(shape)
    length = rec["length"].squeeze(-1).expand(shape)
    real = ~query_pad  # (B, T)
    first = query_pad.long().argmin(-1)  # index of the first real token (0 without padding)
    t_index = torch.arange(shape[2])[None, :] - first[:, None]  # (B, T) position from first real token
    b_idx, h_idx, t_idx = torch.nonzero(real[:, None, :].expand(shape), as_tuple=True)
    return torch.stack([
        b_idx.double(), h_idx.double(), t_index[b_idx, t_idx].double(),
        length[b_idx, h_idx, t_idx].double(), centre[b_idx, h_idx, t_idx].double(),
        window[b_idx, h_idx, t_idx].double(),
    ], dim=1)


def collect(model, task, args, use_cuda):
    from fairseq import utils

    from man_recipes.analysis.utils import Progress

    modules = localness_modules(model)
    if not modules:
        raise SystemExit("the model has no localness bias (is it a transformer_localness model with localness layers?)")
    for _, _, module in modules:
        module.record = True
    dataset = task.dataset(args.gen_subset)
    itr = task.get_batch_iterator(
        dataset=dataset, max_tokens=args.max_tokens, max_sentences=args.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, num_workers=args.num_workers,
    ).next_epoch_itr(shuffle=False)
    pad = task.source_dictionary.pad()
    rows = defaultdict(list)  # (kind, layer) -> [tensor (N, 7)]
    progress = Progress(f"localness windows of split {args.gen_subset}", len(itr), getattr(args, "log_interval", 10))
    for batch_index, sample in enumerate(itr, 1):
        if use_cuda:
            sample = utils.move_to_cuda(sample)
        net_input = sample["net_input"]
        with torch.no_grad():
            model(**net_input)
        src_pad = net_input["src_tokens"].eq(pad).cpu()
        tgt_pad = net_input["prev_output_tokens"].eq(task.target_dictionary.pad()).cpu()
        ids = sample["id"].cpu().double()
        for kind, layer, module in modules:
            rec = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in module.last_windows.items()}
            batch_rows = windows_of_batch(rec, src_pad if kind == "encoder_self" else tgt_pad)
            batch_rows[:, 0] = ids[batch_rows[:, 0].long()]
            rows[(kind, layer)].append(batch_rows)
        progress.step(batch_index, len(sample["id"]))
    for _, _, module in modules:
        module.record = False
        module.last_windows = None
    return {key: torch.cat(parts) for key, parts in rows.items()}


def per_head_means(rows, order):
    """(kind, layer) -> [mean D of head h over its real queries] (heads present in the rows)."""
    means = {}
    for key in order:
        r = rows[key]
        heads = int(r[:, 1].max()) + 1
        means[key] = [float(r[r[:, 1] == h, 5].mean()) for h in range(heads)]
    return means


def _subsample(n: int, limit: int, seed: int = 0):
    if n <= limit:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:limit]


SCATTER_POINTS = 4000  # per layer: enough to see the shape, few enough to stay readable


def save_window_figure(path, kind, layers, rows, strategy, subset):
    """P2 Figure 3: upper row centre P vs window D (scatter), lower row histogram of D; per layer."""
    plt = pyplot()
    fig, axes = plt.subplots(2, len(layers), figsize=(3.4 * len(layers) + 0.6, 6.4), squeeze=False)
    for col, layer in enumerate(layers):
        r = rows[(kind, layer)]
        window, centre = r[:, 5], r[:, 4]
        pick = _subsample(len(r), SCATTER_POINTS)
        ax = axes[0, col]
        heads = r[pick, 1].long()
        colours = plt.get_cmap("tab10")
        for h in heads.unique().tolist():  # one colour per head
            sel = pick[heads == h]
            ax.scatter(centre[sel].numpy(), window[sel].numpy(), s=5, alpha=0.35, color=colours(h % 10),
                       linewidths=0, label=f"head {h}")
        ax.set_title(f"{kind}, layer {layer}", fontsize=10)
        ax.set_xlabel("predicted centre P (token position)")
        ax.set_ylabel("window size D")
        ax = axes[1, col]
        ax.hist(window.numpy(), bins=30, color="tab:blue")
        ax.set_xlabel("window size D")
        ax.set_ylabel("(query, head) pairs")
    axes[0, -1].legend(fontsize=7, markerscale=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    shown = "all" if max(len(rows[(kind, l)]) for l in layers) <= SCATTER_POINTS else f"{SCATTER_POINTS} random"
    fig.suptitle(f"Localness windows, {strategy} strategy, split {subset} (layers 0-based)\n"
                 f"one point / count per (real query, head); scatter: {shown} points per layer", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save_head_figure(path, kind, layers, rows, strategy, subset):
    """P2 Figure 2: the window of every head per layer, one colour per head (heads side by side,
    so two heads with close D stay two marks); error bars: std over queries (0 for ``head``)."""
    plt = pyplot()
    num_heads = max(int(rows[(kind, l)][:, 1].max()) + 1 for l in layers)
    colours = plt.get_cmap("tab10" if num_heads <= 10 else "tab20")
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(layers) + 3.5), 3.8))
    spread = 0.7
    for h in range(num_heads):
        xs, ys, errs = [], [], []
        for i, layer in enumerate(layers):
            r = rows[(kind, layer)]
            d = r[r[:, 1] == h, 5]
            if len(d) == 0:
                continue
            xs.append(i + (h - (num_heads - 1) / 2) * spread / max(num_heads, 1))
            ys.append(float(d.mean()))
            errs.append(float(d.std()) if len(d) > 1 else 0.0)
        ax.errorbar(xs, ys, yerr=errs, fmt="o", color=colours(h), markersize=6, capsize=2, label=f"head {h}")
    ax.set_xticks(range(len(layers)))
    ax.set_xticklabels([str(l) for l in layers])
    ax.set_xlabel("layer (0-based)")
    ax.set_ylabel("window size D")
    what = "learned D^m per head" if strategy == "head" else "mean D per head (bars: std over queries)"
    ax.set_title(f"{kind}: {what}, split {subset}", fontsize=10)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def write_outputs(rows, out_dir, strategy="query", subset="valid"):
    os.makedirs(out_dir, exist_ok=True)
    order = sorted(rows, key=lambda key: (["encoder_self", "decoder_self", "cross"].index(key[0]), key[1]))
    with open(os.path.join(out_dir, "windows.tsv"), "w") as f:
        f.write("\t".join(COLUMNS) + "\n")
        for kind, layer in order:
            for r in rows[(kind, layer)].tolist():
                f.write(f"{int(r[0])}\t{kind}\t{layer}\t{int(r[1])}\t{int(r[2])}\t{int(r[3])}\t{r[4]:.4f}\t{r[5]:.4f}\n")

    cells = []
    for kind, layer in order:
        r = rows[(kind, layer)]
        window, length, centre, pos = r[:, 5], r[:, 3], r[:, 4], r[:, 2]
        cells.append([kind, f"{layer}", f"{len(r)}", f"{window.mean():.2f}", f"{window.median():.2f}",
                      f"{window.std() if len(r) > 1 else 0.0:.2f}", f"{(window / length).mean():.3f}",
                      f"{(centre - pos).abs().mean():.2f}"])
    lines = markdown_table(["attention", "layer", "queries x heads", "mean D", "median D", "std D", "mean D/I",
                            "mean abs(P - t)"], cells)
    with open(os.path.join(out_dir, "windows.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    head_means = per_head_means(rows, order)
    num_heads = max(len(v) for v in head_means.values())
    lines = ["Mean window size D per head over the real queries (layers and heads 0-based; for "
             "`--localness-window head` this is the head's learned D^m = N sigmoid(z^m)):", ""]
    lines += markdown_table(["attention", "layer"] + [f"head {h}" for h in range(num_heads)],
                            [[kind, f"{layer}"] + [f"{d:.2f}" for d in head_means[(kind, layer)]]
                             for kind, layer in order])
    with open(os.path.join(out_dir, "heads.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    for kind in dict.fromkeys(k for k, _ in order):
        layers = [layer for k, layer in order if k == kind]
        save_window_figure(os.path.join(out_dir, f"windows_{kind}.png"), kind, layers, rows, strategy, subset)
        save_head_figure(os.path.join(out_dir, f"heads_{kind}.png"), kind, layers, rows, strategy, subset)
    return order


def main(args):
    from fairseq import checkpoint_utils, tasks, utils

    from man_recipes.analysis.utils import (
        checkpoint_folder, checkpoint_load_errors, model_labels, parse_model_overrides,
    )

    overrides = parse_model_overrides(args.model_overrides)  # before any work: bad input fails fast
    utils.import_user_module(args)
    use_cuda = torch.cuda.is_available() and not args.cpu
    task = tasks.setup_task(args)
    task.load_dataset(args.gen_subset)
    # "a.pt,b.pt": several models analysed one after the other, each in <output dir>/<folder name>
    paths = [p for p in args.path.split(",") if p]
    labels = model_labels(paths, [checkpoint_folder(p) for p in paths], None)
    for path, label in zip(paths, labels):
        out_dir = args.windows_output_dir if len(paths) == 1 else os.path.join(
            args.windows_output_dir, slug(label))
        files = utils.split_paths(path)
        with checkpoint_load_errors(path, args.data, files):
            models, _ = checkpoint_utils.load_model_ensemble(files, arg_overrides=overrides, task=task)
        model = models[0].eval()
        if use_cuda:
            model.cuda()
        rows = collect(model, task, args, use_cuda)
        strategy = localness_modules(model)[0][2].window
        order = write_outputs(rows, out_dir, strategy, args.gen_subset)
        print(f"{label}: wrote windows of {len(order)} attention layers to {out_dir}")
        for name in ("windows.md", "heads.md"):
            with open(os.path.join(out_dir, name)) as f:
                print(f.read())
