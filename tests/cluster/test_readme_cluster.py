"""The README's cluster section as the CLI prints it today: three brokers on etcd, the section's own
``topics create`` and ``topics describe`` commands through the ``copyless`` console script, then kill -9 of
partition 0's leader and ``topics describe`` through a live broker. Placement starts at a random broker, so
broker ids are compared as a shape (every non-zero digit of a table row is one wildcard): the lines, the
columns and their widths, the epochs and offsets are the README's exactly. A surviving broker's data dir
holds only files docs/on-disk.md names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.on_disk import listed_names, unlisted
from tests.support.polling import wait_until

COPYLESS = str(Path(sys.executable).parent / "copyless")
README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _cluster_blocks() -> tuple[str, str, str]:
    """The section's commands block's create line, and its two describe outputs (indented blocks)."""
    section = README[README.index("## The cluster"):README.index("Where faults overlap")]
    blocks = ["\n".join(line[4:] for line in block.splitlines())
              for block in re.findall(r"(?<=\n\n)((?:    .*\n)+)", section)]
    [create] = [line for block in blocks for line in block.splitlines() if line.startswith("copyless topics create")]
    described = [block for block in blocks if "PARTITION  LEADER" in block]
    assert len(described) == 2, blocks
    return create, described[0], described[1]


def _shape(text: str) -> list[str]:
    return [re.sub(r"[1-9]", "N", line) if line[:1].isdigit() else line for line in text.strip().splitlines()]


def _cli(*args: str) -> str:
    done = subprocess.run([COPYLESS, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{args}: {done.stderr}"
    return done.stdout


def _rows(text: str) -> dict[int, list[str]]:
    return {int(line.split()[0]): line.split() for line in text.splitlines() if line[:1].isdigit()}


def test_the_readmes_cluster_section_is_what_the_cli_prints(cluster_factory):
    create, fresh, after_kill = _cluster_blocks()
    cluster = cluster_factory(3)
    first = cluster.brokers[1].bootstrap
    args = create.split()[1:]
    args[args.index("-b") + 1] = first
    assert _cli(*args).strip() == "created payments"
    cluster.wait_for_isr("payments", 3, 3)
    described = _cli("topics", "describe", "payments", "-b", first)
    assert _shape(described) == _shape(fresh), described
    rows = _rows(described)
    assert all(row[1] == row[3].split(",")[0] for row in rows.values()), described  # each leads where preferred

    leader = int(rows[0][1])
    cluster.brokers[leader].kill()
    live = next(b for n, b in cluster.brokers.items() if n != leader).bootstrap

    def moved() -> str | None:
        text = _cli("topics", "describe", "payments", "-b", live)
        now = _rows(text)
        done = now[0][1] != str(leader) and all(str(leader) not in row[4].split(",") for row in now.values())
        return text if done else None

    described = wait_until(moved, what=f"partition 0 led elsewhere and broker {leader} out of every ISR",
                           timeout_s=60, interval_s=0.5)
    table = described[described.index("PARTITION"):]
    assert _shape(table) == _shape(after_kill), described
    assert _rows(described)[0][2] == "1"  # the new leader's epoch

    survivor = cluster.brokers[int(_rows(described)[0][1])].data_dir
    names = listed_names(survivor)
    assert {"broker-incarnation.json", "meta.properties", "leader-epoch-checkpoint"} <= names, names
    assert not unlisted(names), f"docs/on-disk.md does not list {sorted(unlisted(names))}"
