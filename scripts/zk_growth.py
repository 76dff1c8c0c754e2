"""ZooKeeper transaction-log growth of an idle local cluster (an idle cluster should write next to nothing).

Starts the cluster of `roq cluster up` with its defaults (1 ZooKeeper, 2 GCMs, 2 HCMs; roq/tools/cluster.py
LocalCluster) in a scratch directory, creates `--queues` queues (1 exchange each), waits until they
run, lets it settle, then leaves it idle for `--minutes` and reports, per minute and in total:

* transactions: the difference of the server's zxid (four-letter word `srvr`; no session is held
  open while measuring, so the measurement itself writes nothing);
* log bytes: the bytes the transaction log files (`<dataDir>/version-2/log.*`) hold, read record by
  record (ZooKeeper preallocates those files in 64 MB steps, so their size says little); their
  allocated size is reported too;
* which znodes the transactions touched, by operation and path pattern (names replaced by `*`),
  read from the log records written during the idle window.

    .venv/bin/python scripts/zk_growth.py --minutes 10 [--json out.json]

The code measured is the one this script's checkout holds (its parent directory goes first on
sys.path and on PYTHONPATH for the daemons), so a second worktree of an older commit can be
measured with its own copy of this script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

from roq.client.admin import Admin  # noqa: E402
from roq.config import Config, load_config  # noqa: E402
from roq.paths import Paths  # noqa: E402
from roq.state import read_live  # noqa: E402
from roq.tools.cluster import LocalCluster  # noqa: E402
from roq.tools.zkserver import four_letter  # noqa: E402
from roq.zk import start_client, stop_client  # noqa: E402

TXN_TYPES = {1: "create", 2: "delete", 5: "setData", 7: "setACL", 13: "check", 14: "multi", 15: "create",
             16: "reconfig", 19: "create", 20: "delete", 21: "create", -10: "createSession",
             -11: "closeSession", -1: "error"}
PATH_TXNS = {1, 2, 5, 7, 13, 15, 19, 20, 21}  # their record starts with the path
LITERALS = {"gcm", "election", "epoch", "leader", "requests", "hosts", "queues", "exchanges", "assignments",
            "live", "replicas", "relocations"}


def zxid(host: str, port: int) -> int:
    text = four_letter(host, port, "srvr", timeout=5.0)
    found = re.search(r"Zxid:\s*0x([0-9a-fA-F]+)", text)
    if not found:
        raise RuntimeError(f"no Zxid in the srvr answer: {text!r}")
    return int(found.group(1), 16)


def read_string(data: bytes, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from(">i", data, offset)
    offset += 4
    return data[offset:offset + max(length, 0)].decode(errors="replace"), offset + max(length, 0)


def pattern(path: str, root: str) -> str:
    rest = path[len(root):] if path.startswith(root + "/") else path
    parts = [p if p in LITERALS else "*" for p in rest.strip("/").split("/")]
    return root + "/" + "/".join(parts)


def describe(txn_type: int, body: bytes, offset: int, root: str) -> list[str]:
    """'setData /roq/live/*/*' for each operation of one transaction (a multi gives several)."""
    name = TXN_TYPES.get(txn_type, f"type{txn_type}")
    if txn_type in PATH_TXNS:
        path, _ = read_string(body, offset)
        return [f"{name} {pattern(path, root)}"]
    if txn_type == 14:  # MultiTxn: vector<Txn{int type, buffer data}>
        (count,) = struct.unpack_from(">i", body, offset)
        offset += 4
        ops = []
        for _ in range(max(count, 0)):
            inner, length = struct.unpack_from(">ii", body, offset)
            offset += 8
            ops += describe(inner, body[offset:offset + length], 0, root) if inner in PATH_TXNS \
                else [TXN_TYPES.get(inner, f"type{inner}")]
            offset += max(length, 0)
        return ops
    return [name]


def read_log(path: Path, root: str) -> tuple[int, list[tuple[int, list[str]]]]:
    """(bytes used, [(zxid, operations)]) of one transaction log file."""
    data = path.read_bytes()
    offset, records = 16, []  # FileHeader: magic, version, dbid
    while offset + 12 <= len(data):
        _crc, length = struct.unpack_from(">qi", data, offset)
        if length <= 0 or offset + 12 + length + 1 > len(data):
            break
        body = data[offset + 12:offset + 12 + length]
        _client, _cxid, txn_zxid, _time, txn_type = struct.unpack_from(">qiqqi", body, 0)
        try:
            ops = describe(txn_type, body, 32, root)  # after the TxnHeader's 32 bytes
        except (struct.error, IndexError):
            ops = [TXN_TYPES.get(txn_type, f"type{txn_type}") + " (unparsed)"]
        records.append((txn_zxid, ops))
        offset += 12 + length + 1  # the record, then its end marker 'B'
    return offset, records


def log_figures(data_dir: Path, root: str) -> tuple[int, int, list[tuple[int, list[str]]]]:
    """(bytes used, bytes allocated, records) of every transaction log file."""
    used = allocated = 0
    records: list[tuple[int, list[str]]] = []
    for path in sorted((data_dir / "version-2").glob("log.*")):
        size, found = read_log(path, root)
        used += size
        allocated += path.stat().st_size
        records += found
    return used, allocated, records


def measure(minutes: float, queues: int, settle: float, run_dir: Path) -> dict[str, Any]:
    base = Config()  # the defaults of `roq cluster up`
    cluster = LocalCluster(base.replace(cluster={"gcms": 2, "hcms": 2}), run_dir)
    state = cluster.up(progress=lambda text: print(f"  {text}", file=sys.stderr))
    try:
        host, port = state.zk_hosts.rsplit(":", 1)
        config = load_config(cluster.config_path, env={})  # as `roq cluster up` wrote it: seeds included
        root = config.zk.root
        names = [f"idle-{i}" for i in range(1, queues + 1)]
        client = start_client(config)
        try:
            with Admin(config) as admin:
                for name in names:
                    admin.create_queue(name, exchanges=1)
            deadline = time.monotonic() + 60
            paths = Paths(root)
            while sum(len(read_live(client, paths, n)) for n in names) < queues:
                if time.monotonic() > deadline:
                    raise RuntimeError("the queues' exchanges did not all run within 60 s")
                time.sleep(0.2)
        finally:
            stop_client(client)  # no session of ours during the measurement
        print(f"  {queues} queues running; settling for {settle:.0f}s", file=sys.stderr)
        time.sleep(settle)
        data_dir = run_dir / "zookeeper" / "data"
        start_zxid = zxid(host, int(port))
        start_used, start_allocated, _ = log_figures(data_dir, root)
        started = time.monotonic()
        per_minute = []
        last_zxid, last_used = start_zxid, start_used
        for minute in range(1, int(minutes) + 1):
            time.sleep(max(0.0, started + 60 * minute - time.monotonic()))
            now_zxid = zxid(host, int(port))
            used, _, records = log_figures(data_dir, root)
            ops = Counter(op for txn_zxid, found in records if last_zxid < txn_zxid <= now_zxid for op in found)
            load1 = round(os.getloadavg()[0], 2)  # this machine's: its other work moves the hosts' CPU figures
            per_minute.append({"minute": minute, "transactions": now_zxid - last_zxid, "log_bytes": used - last_used,
                               "load1": load1, "operations": dict(ops.most_common())})
            print(f"  minute {minute}: {now_zxid - last_zxid} transactions, {used - last_used} log bytes, "
                  f"load {load1}: {dict(ops.most_common())}", file=sys.stderr)
            last_zxid, last_used = now_zxid, used
        elapsed_min = (time.monotonic() - started) / 60
        end_zxid = zxid(host, int(port))
        end_used, end_allocated, records = log_figures(data_dir, root)
        operations: Counter[str] = Counter()
        for txn_zxid, ops in records:
            if start_zxid < txn_zxid <= end_zxid:
                operations.update(ops)
        transactions = end_zxid - start_zxid
        return {
            "minutes": round(elapsed_min, 2), "queues": queues, "gcms": 2, "hcms": 2,
            "transactions": transactions, "transactions_per_minute": round(transactions / elapsed_min, 1),
            "log_bytes": end_used - start_used, "log_bytes_per_minute": round((end_used - start_used) / elapsed_min),
            "log_bytes_allocated": {"before": start_allocated, "after": end_allocated},
            "per_minute": per_minute,
            "operations": dict(operations.most_common()),
        }
    finally:
        cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="idle window (default 10)")
    parser.add_argument("--queues", type=int, default=5)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds between the queues running and the window")
    parser.add_argument("--run-dir", type=Path, default=None, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    if args.minutes < 1:
        parser.error("--minutes must be at least 1")
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="roq-zk-growth-"))
    # SIGTERM (and SIGINT, which a background job ignores) end the run with the cluster taken down.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(1))
    result = measure(args.minutes, args.queues, args.settle, run_dir.absolute())
    result["code"] = str(REPO)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
