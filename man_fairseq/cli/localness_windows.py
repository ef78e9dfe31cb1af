"""Dump the predicted localness centres and window sizes of a trained model on a data set.

For every attention with a localness bias (encoder self, decoder self, encoder-decoder), every
layer, head and real query token of the chosen subset, with teacher forcing on the reference,
writes to ``--windows-output-dir``:

* ``windows.tsv``: ``sample_id attention layer head query_position length centre window``
  (positions 0-based from the first real token; ``length`` is ``I``, the key length the query
  sees; ``window`` is ``D``, so ``sigma = D/2``);
* ``windows.md``: a Markdown table of window-size statistics per attention type and layer;
* ``windows_<attention>.png``: the distribution of window sizes per layer (the paper's
  Figures 2-3), one panel per layer.

Takes fairseq-generate's data/model options::

    man-localness-windows data-bin/wmt14 --path ckpt.pt --gen-subset test \\
        --batch-size 64 --windows-output-dir windows/
    # or: python -m man_fairseq.cli.localness_windows ... (same options)
"""

import os
import re
from collections import defaultdict

import torch

import man_fairseq  # noqa: F401  (registers the archs before the checkpoint is loaded)
from man_fairseq.modules.localness import LocalnessBias

MODULE_NAME = re.compile(r"(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn)\.bias_module$")
COLUMNS = ["sample_id", "attention", "layer", "head", "query_position", "length", "centre", "window"]


def localness_modules(model):
    """[(attention type, layer, module)] of every localness bias of the model, in order."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, LocalnessBias):
            m = MODULE_NAME.search(name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", ""))
            if m is None:
                raise RuntimeError(f"unexpected localness module location {name}")
            side, layer, which = m.groups()
            kind = "encoder_self" if side == "encoder" else ("decoder_self" if which == "self_attn" else "cross")
            found.append((kind, int(layer), module))
    return found


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
    for sample in itr:
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
    for _, _, module in modules:
        module.record = False
        module.last_windows = None
    return {key: torch.cat(parts) for key, parts in rows.items()}


def write_outputs(rows, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    order = sorted(rows, key=lambda key: (["encoder_self", "decoder_self", "cross"].index(key[0]), key[1]))
    with open(os.path.join(out_dir, "windows.tsv"), "w") as f:
        f.write("\t".join(COLUMNS) + "\n")
        for kind, layer in order:
            for r in rows[(kind, layer)].tolist():
                f.write(f"{int(r[0])}\t{kind}\t{layer}\t{int(r[1])}\t{int(r[2])}\t{int(r[3])}\t{r[4]:.4f}\t{r[5]:.4f}\n")

    lines = [
        "| attention | layer | queries x heads | mean D | median D | std D | mean D/I | mean abs(P - t) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, layer in order:
        r = rows[(kind, layer)]
        window, length, centre, pos = r[:, 5], r[:, 3], r[:, 4], r[:, 2]
        lines.append(
            f"| {kind} | {layer} | {len(r)} | {window.mean():.2f} | {window.median():.2f} | "
            f"{window.std() if len(r) > 1 else 0.0:.2f} | {(window / length).mean():.3f} | "
            f"{(centre - pos).abs().mean():.2f} |"
        )
    with open(os.path.join(out_dir, "windows.md"), "w") as f:
        f.write("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for kind in dict.fromkeys(k for k, _ in order):
        layers = [layer for k, layer in order if k == kind]
        fig, axes = plt.subplots(1, len(layers), figsize=(3.2 * len(layers), 2.8), squeeze=False, sharey=True)
        for ax, layer in zip(axes[0], layers):
            window = rows[(kind, layer)][:, 5].numpy()
            ax.hist(window, bins=30, density=True, color="tab:blue")
            ax.set_title(f"{kind} layer {layer}")
            ax.set_xlabel("window size D")
        axes[0][0].set_ylabel("density")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"windows_{kind}.png"), dpi=100)
        plt.close(fig)
    return order


def main(args):
    from fairseq import checkpoint_utils, tasks, utils

    utils.import_user_module(args)
    use_cuda = torch.cuda.is_available() and not args.cpu
    task = tasks.setup_task(args)
    models, _ = checkpoint_utils.load_model_ensemble(
        utils.split_paths(args.path), arg_overrides=eval(args.model_overrides), task=task
    )
    model = models[0].eval()
    if use_cuda:
        model.cuda()
    task.load_dataset(args.gen_subset)
    rows = collect(model, task, args, use_cuda)
    order = write_outputs(rows, args.windows_output_dir)
    print(f"wrote windows of {len(order)} attention layers to {args.windows_output_dir}")
    with open(os.path.join(args.windows_output_dir, "windows.md")) as f:
        print(f.read())


def cli_main():
    from fairseq import options

    parser = options.get_generation_parser()
    group = parser.add_argument_group("localness windows")
    group.add_argument("--windows-output-dir", required=True,
                       help="folder for windows.tsv, windows.md and windows_<attention>.png")
    args = options.parse_args_and_arch(parser)
    main(args)


if __name__ == "__main__":
    cli_main()
