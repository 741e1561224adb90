"""Broker incarnations: which ISR entries a restarted broker may still stand on (Kafka's KIP-903 and KIP-966).

An ISR entry is a promise about one process's log: "this replica had every acknowledged record when it was
admitted, and has kept each since". Each entry therefore names the broker epoch it was admitted under (the
registration's create revision, ``isr_epochs`` in the partition's state key), and a broker whose
registration has another epoch does not inherit it, unless it can vouch that its data is the same:

- a clean shutdown (the storage's clean-shutdown marker): every log was flushed before the process exited;
- a restart in the same boot of the machine (``/proc/sys/kernel/random/boot_id`` unchanged) after a kill
  -9: the page cache, which held whatever was not yet on disk, outlived the process;
- a re-registration of the same process after its lease ran out: nothing was lost at all.

Then it registers with ``previous_epoch`` = the epoch it held before, and the controller carries its ISR
entries of that epoch over to the new one. Anything else (a power loss or an OS crash: a new boot id and
no marker; a wiped or replaced disk: no record; a second restart before the carry-over) registers with
``previous_epoch = -1``: the broker's old entries are void, it is never elected on them (only by unclean
election, where enabled), and it rejoins the ISR only by catching up from a live leader, which proposes
the follower's current epoch (the epoch the follower's fetch names, checked against the leader's image).

The record: ``<data_dir>/broker-incarnation.json`` = ``{"broker_epoch": E, "boot_id": "..."}``, written
(tmp + fsync + rename) after each registration. A record older than the last registration (a crash
before it was rewritten) names an epoch no ISR entry uses after the controller's carry-over, so it can
only cost availability, never vouch for data it does not have.

What this costs: a partition whose every in-sync replica lost power together stays offline (no leader)
until one that kept its data returns, or until unclean election is enabled for it; under the ``async``
flush mode that is the only honest answer, since each of them may lack records the others acknowledged.

Pure, except the marked blocking helpers (worker threads or start-up).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from copyless.broker._files import write_atomically

__all__ = ["Incarnation", "RECORD_FILE", "UNKNOWN_EPOCH", "boot_id", "read_record", "write_record",
           "previous_epoch", "entry_holds"]

log = logging.getLogger("copyless.metadata")

RECORD_FILE = "broker-incarnation.json"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
# An ISR entry whose epoch was never recorded (a state written before entries carried epochs, or a new
# partition's replicas that were not registered when it was created): it holds for whoever is live.
UNKNOWN_EPOCH = 0


@dataclass(frozen=True)
class Incarnation:
    broker_epoch: int
    boot_id: str


def boot_id() -> str:
    """This boot of the machine's id ("" when it cannot be read). Blocking (a /proc read)."""
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""


def read_record(data_dir: Path) -> Incarnation | None:
    """The record of the last registration made from ``data_dir`` (None: none, or unreadable). Blocking."""
    try:
        data = json.loads((Path(data_dir) / RECORD_FILE).read_text())
        return Incarnation(int(data["broker_epoch"]), str(data.get("boot_id", "")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring an unreadable %s: %s", RECORD_FILE, exc)
        return None


def write_record(data_dir: Path, incarnation: Incarnation) -> None:
    """Record a registration (tmp + fsync + rename). Blocking: a worker thread."""
    write_atomically(Path(data_dir) / RECORD_FILE,
                     json.dumps({"broker_epoch": incarnation.broker_epoch, "boot_id": incarnation.boot_id}).encode())


def previous_epoch(record: Incarnation | None, *, clean_shutdown: bool, current_boot_id: str) -> int:
    """The epoch a starting broker may claim to continue (module docstring), or -1."""
    if record is None or record.broker_epoch <= 0:
        return -1
    if clean_shutdown:
        return record.broker_epoch
    if record.boot_id and record.boot_id == current_boot_id:
        return record.broker_epoch
    return -1


def entry_holds(recorded_epoch: int, broker) -> bool:
    """Whether an ISR entry admitted under ``recorded_epoch`` still holds for ``broker`` (a live BrokerInfo):
    the same registration, the one it continues, or an entry whose epoch was never recorded."""
    return recorded_epoch == UNKNOWN_EPOCH or recorded_epoch == broker.epoch or (
        broker.previous_epoch > 0 and recorded_epoch == broker.previous_epoch)


def holding_members(isr, isr_epochs: Mapping[int, int], live: Mapping) -> tuple[int, ...]:
    """The members of ``isr`` whose entries hold for their live registration, in ISR order."""
    return tuple(member for member in isr
                 if member in live and entry_holds(isr_epochs.get(member, UNKNOWN_EPOCH), live[member]))
