"""`roq pipeline report`: the statistics pipeline's Parquet → a PNG chart and a text summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse


def load(path: Path) -> Any:
    import pyarrow.parquet as pq
    files = committed(path)
    if files is None:  # written by a batch job (--once): every file is the dataset
        files = sorted(str(f) for f in path.glob("*.parquet")) if path.exists() else []
    if not files:
        return None
    return pq.read_table(files).to_pandas().sort_values("window_start")


def committed(path: Path) -> list[str] | None:
    """The files a streaming query committed, from its `_spark_metadata` log (None: no log). A
    micro-batch stopped halfway may leave a partial file beside them, which only this log tells."""
    log = path / "_spark_metadata"
    if not log.is_dir():
        return None
    added, deleted = set(), set()
    for entry in log.iterdir():
        if not entry.name.split(".")[0].isdigit():  # N and N.compact; not Hadoop's .N.tmp / .N.crc
            continue
        for line in entry.read_text().splitlines()[1:]:  # the first line is the log's version
            if line.strip():
                record = json.loads(line)
                (added if record.get("action") == "add" else deleted).add(record["path"])
    return sorted(unquote(urlparse(uri).path) for uri in added - deleted)


def summary(exchanges: Any, hosts: Any) -> str:
    lines = []
    if exchanges is None or exchanges.empty:
        return "no closed windows yet: let the pipeline run longer than two windows"
    exchanges = exchanges.fillna({"drops": 0, "publishers": 0})
    per_window = exchanges.groupby(["queue", "window_start"]).agg(
        msgs=("msgs_in_per_s", "sum"), peak=("msgs_in_per_s_peak", "sum"), p99=("latency_p99_ms", "max"),
        publishers=("publishers", "sum"), drops=("drops", "max"))
    first, last = exchanges["window_start"].min(), exchanges["window_end"].max()
    lines.append(f"{len(per_window)} queue-windows from {first} to {last}")
    for queue, rows in per_window.groupby(level=0):
        p99 = rows["p99"].max()
        latency = f"p99 publish latency up to {p99:.2f} ms" if p99 == p99 else "no latency samples"  # NaN: idle
        lines.append(f"queue {queue}: mean {rows['msgs'].mean():,.0f} msg/s in, peak {rows['peak'].max():,.0f} msg/s, "
                     f"{latency}, up to {rows['publishers'].max():.0f} publishers, drops {rows['drops'].max():.0f}")
    if hosts is not None and not hosts.empty:
        for host, rows in hosts.groupby("host"):
            lines.append(f"host {host}: CPU mean {rows['cpu_percent'].mean():.0f}% (peak "
                         f"{rows['cpu_percent_peak'].max():.0f}%), memory {rows['memory_percent'].mean():.0f}%")
    return "\n".join(lines)


def chart(exchanges: Any, hosts: Any, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    if exchanges is not None and not exchanges.empty:
        per_queue = exchanges.groupby(["window_start", "queue"]).agg(
            msgs=("msgs_in_per_s", "sum"), p99=("latency_p99_ms", "max")).reset_index()
        for queue, rows in per_queue.groupby("queue"):
            axes[0].plot(rows["window_start"], rows["msgs"], marker="o", label=queue)
            axes[1].plot(rows["window_start"], rows["p99"], marker="o", label=queue)
    if hosts is not None and not hosts.empty:
        for host, rows in hosts.groupby("host"):
            axes[2].plot(rows["window_start"], rows["cpu_percent"], marker="o", label=host)
    for ax, title in zip(axes, ("msgs/s in per queue", "p99 publish latency (ms)", "host CPU %")):
        ax.set_title(title, fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def report(input_dir: str, out: str) -> str:
    base = Path(input_dir)
    exchanges, hosts = load(base / "exchanges"), load(base / "hosts")
    chart(exchanges, hosts, Path(out))
    return summary(exchanges, hosts)
