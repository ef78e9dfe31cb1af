"""What fairseq-train's simple log says: losses (NaN and inf included), validation points,
parameters, epoch times and update speed.

fairseq prints ``loss=9.93,`` in the per-update (``train_inner``) lines and ``| loss 9.93 |`` in
the epoch summaries (``train``, ``valid on 'valid' subset``). A digits-only pattern skips ``nan``
and ``inf`` silently; ``nll_loss`` does not match (no word boundary) nor does fp16's ``loss scale
to: 64``.
"""

import datetime
import re
from pathlib import Path
from typing import List

VALUE = r"(-?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|nan|inf))\b"
LOSS_RE = re.compile(r"\bloss[= ]" + VALUE, re.I)
TRAIN_INNER_RE = re.compile(r"\| train_inner \| .*?\bloss=" + VALUE, re.I)
VALID_RE = re.compile(r"valid on '[^']+' subset \| loss " + VALUE, re.I)


def losses(text: str) -> List[float]:
    """Every loss fairseq printed: per-update, epoch and validation."""
    return [float(v) for v in LOSS_RE.findall(text)]


def train_inner_losses(text: str) -> List[float]:
    return [float(v) for v in TRAIN_INNER_RE.findall(text)]


def valid_losses(text: str) -> List[float]:
    return [float(v) for v in VALID_RE.findall(text)]


class LogError(ValueError):
    """The log lacks what was asked of it (fairseq-train did not start, or logged too little)."""


VALID_POINT_RE = re.compile(r"valid on 'valid' subset \| loss ([0-9.]+) .*?\| num_updates (\d+)")
PARAMS_RE = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")
# "wall" is cumulative; "train_wall" (also on the line) is per interval: match ", wall=" exactly
INNER_RE = re.compile(r"epoch (\d+):\s+(\d+) / (\d+) .*?num_updates=(\d+).*?, wall=([0-9.]+)")
STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| INFO \| "
EPOCH_RE = re.compile(STAMP + r"(?:fairseq\.trainer \| (begin) training epoch|fairseq_cli\.train \| (end) of epoch) (\d+)",
                      re.M)
# a start (the config dump fairseq-train writes first; a resumed run appends to the same log), an
# epoch's begin, a checkpoint saved, an epoch's end
EVENT_RE = re.compile(STAMP + r"(?:fairseq_cli\.train \| (\{)'_name'|fairseq\.trainer \| (begin) training epoch \d+"
                      r"|fairseq\.checkpoint_utils \| (Saved) checkpoint|fairseq_cli\.train \| (end) of epoch \d+)", re.M)


def _curve(train_log, pattern):
    """[(num_updates, value)] of each match of ``pattern`` (groups: value, num_updates); a resumed run
    appends to the same log, so the last line of an update count wins."""
    text = Path(train_log).read_text(errors="replace") if Path(train_log).is_file() else ""
    return sorted({int(m.group(2)): float(m.group(1)) for m in pattern.finditer(text)}.items())


def valid_curve(train_log):
    """[(num_updates, valid loss)] from a fairseq-train log."""
    return _curve(train_log, VALID_POINT_RE)


def train_curve(train_log, stat="loss"):
    """[(num_updates, the epoch's mean training ``stat``)] of each epoch's summary line in a
    fairseq-train log; [] where the log has no such statistic. ``loss`` (label-smoothed, dropout on,
    as trained) beside :func:`valid_curve` says how far a run overfits: its dev loss at a given
    training loss; ``mask_mean`` (calibration's criterion) whether its mask stayed below 1."""
    pattern = re.compile(rf"\| train \| epoch \d+ \|(?:.*? \|)? {re.escape(stat)} ([0-9.]+) .*?\| num_updates (\d+)")
    return _curve(train_log, pattern)


VALID_EPOCH_RE = re.compile(r"epoch (\d+) \| valid on 'valid' subset \| loss ([0-9.]+) .*?\| num_updates (\d+)")
EARLY_STOP = "early stop since valid performance hasn't improved"


def valid_epochs(train_log):
    """[(epoch, num_updates, valid loss)] of the end-of-epoch validations of a fairseq-train log (a
    resumed run appends: last wins) and whether fairseq stopped it early (``--patience``)."""
    text = Path(train_log).read_text(errors="replace") if Path(train_log).is_file() else ""
    points = {int(m.group(1)): (int(m.group(3)), float(m.group(2))) for m in VALID_EPOCH_RE.finditer(text)}
    return [(epoch, *points[epoch]) for epoch in sorted(points)], EARLY_STOP in text


def model_params(train_log):
    m = PARAMS_RE.findall(Path(train_log).read_text(errors="replace")) if Path(train_log).is_file() else []
    if not m:
        raise LogError(f"{train_log}: no 'num. model params' line (did fairseq-train start?)")
    return int(m[-1].replace(",", ""))


def epoch_seconds(train_log):
    """(seconds of training the final model went through, fairseq-train starts) from the log.

    Each start's stretch of an epoch counts from its "begin training epoch N" to its "end of epoch
    N", or, where the start was killed before the epoch ended, to its last "Saved checkpoint" in
    that epoch (the next start resumes from there; a run that saves mid-epoch, every
    ``--save-interval-updates``, keeps that part). So a run killed and resumed is timed like one
    that never stopped: the work lost to a kill (after the last save) is not counted, nor is
    start-up. Validation and checkpointing inside an epoch count. Measured from the log because a
    killed launcher never gets to write down its own time.
    """
    text = Path(train_log).read_text(errors="replace") if Path(train_log).is_file() else ""
    seconds, attempts, begun, kept = 0.0, 0, None, None
    for stamp, start, begin, saved, end in EVENT_RE.findall(text):
        t = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp()
        if start or begin:  # a new start, or a new epoch: what the last one kept is counted
            if begun is not None and kept is not None:
                seconds += kept - begun
            begun, kept = (t if begin else None), None
            attempts += bool(start)
        elif saved:
            kept = t
        elif end and begun is not None:
            seconds += t - begun
            begun, kept = None, None
    if begun is not None and kept is not None:
        seconds += kept - begun
    return seconds, attempts


def epochs_ended(train_log):
    """How many epochs the log says ended (each once, however often the run was resumed): the
    validation curve has more points than that when checkpoints are saved mid-epoch."""
    text = Path(train_log).read_text(errors="replace") if Path(train_log).is_file() else ""
    return len({epoch for _, _, end, epoch in EPOCH_RE.findall(text) if end})


def seconds_per_update(train_log):
    """(seconds per update, updates per epoch) from the progress lines of a simple-format log.

    Measured between the first and the last progress line, so model building, data loading and
    the first (slow) updates are left out.
    """
    rows = [(int(u), float(w), int(size)) for _, _, size, u, w in INNER_RE.findall(Path(train_log).read_text(errors="replace"))]
    if len(rows) < 2:
        raise LogError(f"{train_log}: {len(rows)} progress line(s), need two to time updates")
    (u0, w0, size), (u1, w1, _) = rows[0], rows[-1]
    if u1 <= u0:
        raise LogError(f"{train_log}: progress lines do not advance")
    return (w1 - w0) / (u1 - u0), size


INNER_LINE_RE = re.compile(r"\| train_inner \| (.*)$", re.M)
INNER_FIELD_RE = re.compile(r"(\w+)=([^,\s]+)")


def train_intervals(train_log):
    """[{"num_updates", "wps", "wpb", ...}] of every progress line (``train_inner``) of a simple-format
    log, in order: fairseq's numbers for each ``--log-interval`` (``wps``: target tokens per second of
    wall time since the previous line; ``wpb``: target tokens per update)."""
    rows = []
    for line in INNER_LINE_RE.findall(Path(train_log).read_text(errors="replace")):
        fields = dict(INNER_FIELD_RE.findall(line))
        try:
            rows.append({"num_updates": int(fields["num_updates"]), "wps": float(fields["wps"]),
                         "wpb": float(fields["wpb"])})
        except (KeyError, ValueError):
            raise LogError(f"{train_log}: a progress line without num_updates, wps and wpb: {line[:200]}") from None
    return rows
