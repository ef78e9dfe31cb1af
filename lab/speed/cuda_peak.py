"""``python -m lab.speed.cuda_peak FAIRSEQ-TRAIN-ARGS``: fairseq-train in this process, then one line with
the peak CUDA memory torch allocated over the whole run (n/a without CUDA). fairseq's trainer resets torch's
peak statistics at every logged interval, so each reset here first keeps the peak so far."""

import logging
import os
import sys

from man_recipes.interrupt import one_line_on_ctrl_c

PEAK_LINE = "peak CUDA memory allocated over the run: "


@one_line_on_ctrl_c("python -m lab.speed.cuda_peak")
def main(argv=None):
    import torch

    peak, reset = [0], torch.cuda.reset_peak_memory_stats

    def keep_then_reset(device=None):
        peak[0] = max(peak[0], torch.cuda.max_memory_allocated(device))
        reset(device)

    torch.cuda.reset_peak_memory_stats = keep_then_reset
    sys.argv = ["fairseq-train"] + list(sys.argv[1:] if argv is None else argv)
    from fairseq_cli.train import cli_main

    # fairseq-train's log format (the plugin, imported first here, set up logging before fairseq_cli.train could)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout, force=True)
    try:
        cli_main()
    finally:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak[0] = max(peak[0], torch.cuda.max_memory_allocated())
            print(f"{PEAK_LINE}{peak[0] / 2 ** 20:.1f} MiB", flush=True)
        else:
            print(f"{PEAK_LINE}n/a (no CUDA)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
