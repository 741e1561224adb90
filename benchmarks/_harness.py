"""The benchmark harness: command line, progress, result rows, tables, JSON and the chart.

Owns what every ``python -m benchmarks.<name> [--quick] --out DIR`` has in common, so a benchmark module
contains only its measurement:

    bench = Benchmark("storage", "one-line description", argv)
    with bench.progress(total, "appends") as bar:
        ...; bar.advance(n)
    bench.row(batch_bytes=1024, method="mmap", mb_per_s=812.3)
    bench.note("disk has 12 GB free: scaled 1 GB files down to 512 MB")
    bench.finish(ratios={...}, extra={...}, chart=lambda fig: ..., columns=[...])

Output format, ``DIR/<name>.json`` (one object, UTF-8, indented)::

    {"name", "description", "quick", "tiny", "started_at", "duration_s", "argv",
     "machine": {"cores", "cores_usable", "cpu_model", "memory", "memory_bytes", "kernel", "platform", "python",
                 "packages": {dist: version}, "librdkafka", "filesystem", "loadavg_at_start"},
     "columns": [...], "rows": [{...}, ...], "ratios": {...}, "notes": [...],
     "tables": [{"title", "columns", "rows"}, ...],       # side tables, e.g. the article's figures
     ...extra}

and ``DIR/<name>.png``, drawn by the benchmark's ``chart(fig)`` on a matplotlib ``Figure`` rendered with
the Agg backend (no display, no pyplot global state). NaN and infinite floats are written as null.

Sizes: ``--quick`` must finish well under a minute. The environment variable ``COPYLESS_BENCH_TINY=1`` (or
the undocumented ``--tiny`` flag) selects still smaller sizes so the test suite can run every benchmark in a
few seconds; it implies ``--quick``. ``Benchmark.pick(full, quick, tiny)`` chooses by mode.

The harness never measures anything itself and has no opinion on units; it does offer the small helpers
every benchmark needs (``percentile``, ``median_interval`` with its confidence interval, ``cpu_seconds`` of
another process, ``disk_scale`` before writing big files, ``scratch_dir`` that is always removed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Benchmark",
    "MedianInterval",
    "Progress",
    "TINY_ENV",
    "cpu_seconds",
    "format_bytes",
    "format_table",
    "format_value",
    "machine_description",
    "median_interval",
    "percentile",
]

TINY_ENV = "COPYLESS_BENCH_TINY"

# Distributions whose versions explain a figure (the event loop, the Kafka clients, the codecs).
_PACKAGES = (
    "copyless",
    "kio",
    "crc32c",
    "cramjam",
    "uvloop",
    "confluent-kafka",
    "aiokafka",
    "kafka-python",
    "matplotlib",
    "numpy",
)

_GIB = 1 << 30


# ----------------------------------------------------------------------------------------------------------
# Machine description


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _cpu_model() -> str | None:
    for line in _read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _memory_bytes() -> int | None:
    for line in _read_text("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _filesystem_of(path: Path) -> dict[str, Any] | None:
    """Mount point and type of the filesystem holding ``path`` (longest matching mount in /proc/mounts)."""
    try:
        target = str(path.resolve())
    except OSError:
        return None
    best: tuple[str, str, str] | None = None
    for line in _read_text("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount_point, fs_type = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) > len(best[1])):
            best = (device, mount_point, fs_type)
    if best is None:
        return None
    usage = shutil.disk_usage(best[1])
    return {"device": best[0], "mount": best[1], "type": best[2], "free_bytes": usage.free,
            "total_bytes": usage.total}


def _package_versions() -> dict[str, str]:
    from importlib import metadata

    versions: dict[str, str] = {}
    for dist in _PACKAGES:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _librdkafka_version() -> str | None:
    try:
        import confluent_kafka
    except Exception:  # not installed, or a broken native library: the description just omits it
        return None
    return confluent_kafka.libversion()[0]


def machine_description(out_dir: Path | None = None) -> dict[str, Any]:
    """What a reader needs to compare a figure with theirs: cores, memory, kernel, Python, versions.

    Cheap (reads /proc, importlib.metadata); safe to call once per benchmark run.
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    try:
        loadavg = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        loadavg = None
    memory = _memory_bytes()
    return {
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "cpu_model": _cpu_model(),
        "memory": format_bytes(memory) if memory else None,
        "memory_bytes": memory,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "packages": _package_versions(),
        "librdkafka": _librdkafka_version(),
        "filesystem": _filesystem_of(out_dir) if out_dir is not None else None,
        "loadavg_at_start": loadavg,
    }


# ----------------------------------------------------------------------------------------------------------
# Small measurement helpers


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ``values`` with linear interpolation between closest ranks.

    Raises ValueError on an empty sequence: a percentile of nothing is a bug in the caller.
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lower = math.floor(rank)
    upper = math.ceil(rank)
    if lower == upper:
        return float(ordered[lower])
    return float(ordered[lower] + (ordered[upper] - ordered[lower]) * (rank - lower))


@dataclass(frozen=True)
class MedianInterval:
    """A median and a distribution-free confidence interval around it (see ``median_interval``)."""

    median: float
    low: float
    high: float
    confidence: float  # the interval's exact coverage, at least the confidence asked for

    def verdict(self, against: float = 1.0) -> str:
        """``above`` or ``below`` when the whole interval lies on that side of ``against``, else ``level``:
        the measurement cannot tell the median from it."""
        if self.low > against:
            return "above"
        if self.high < against:
            return "below"
        return "level"


def median_interval(values: Sequence[float], confidence: float = 0.9) -> MedianInterval | None:
    """The median of ``values`` and the order statistics ``(x_(k), x_(n+1-k))`` around it, with ``k`` the
    largest rank for which ``2 * P(Binomial(n, 1/2) < k) <= 1 - confidence``.

    This is the sign test's interval: for independent draws from any continuous distribution, the chance
    that the true median lies below ``x_(k)`` is the chance that fewer than ``k`` of the ``n`` draws fall
    below it, ``P(Binomial(n, 1/2) < k)``, and the same above. No shape is assumed, which matters here:
    per-round throughput ratios on a shared machine have long one-sided tails (a round that loses its core
    to a neighbour), and a mean with a t interval would follow them. ``confidence`` is the exact coverage
    reached, which steps with ``n``: 5 values give (min, max) at 0.938, 15 give (x_(4), x_(12)) at 0.965.
    Returns None when ``n`` is too small for any interval to reach ``confidence`` (fewer than 5 at 0.9).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} outside (0, 1)")
    ordered = sorted(values)
    n = len(ordered)
    tail = 0.0  # P(Binomial(n, 1/2) < k), grown one rank at a time
    k = 0
    while k < (n + 1) // 2:
        below_next = tail + math.comb(n, k) / 2 ** n
        if 2 * below_next > 1.0 - confidence:
            break
        tail = below_next
        k += 1
    if k == 0:
        return None
    return MedianInterval(median=float(statistics.median(ordered)), low=float(ordered[k - 1]),
                          high=float(ordered[n - k]), confidence=1.0 - 2 * tail)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int | None = None, *, children: bool = False) -> float:
    """User + system CPU seconds consumed so far by process ``pid`` (this process when None).

    Another process is read from /proc/<pid>/stat (clock-tick resolution, 10 ms at 100 Hz), so a
    benchmark can charge a sender and a receiver separately. ``children`` adds reaped children's time.
    """
    if pid is None or pid == os.getpid():
        t = os.times()
        total = t.user + t.system
        return total + (t.children_user + t.children_system if children else 0.0)
    stat = _read_text(f"/proc/{pid}/stat")
    if not stat:
        raise ProcessLookupError(pid)
    # The command name (field 2) may contain spaces and parentheses: split after its closing ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    total = utime + stime + (cutime + cstime if children else 0)
    return total / _CLOCK_TICKS


def settle_writeback() -> None:
    """Write back what earlier measurements left dirty before the next one starts.

    A run that writes a GiB or two leaves it dirty, and the kernel's background writeback of it would
    otherwise land in the next run's timed window, charged to whichever broker or method runs next. For
    an mmap'ed log it costs twice: a page written back is write-protected again, so the next store into it
    faults (benchmarks.storage saw after-roll appends fall to 0.52x of the warm rate in such a run).
    """
    os.sync()


# Free page reporting (virtio-balloon): free guest pages are handed back to the host, which must back them
# again on their next first touch. Measured on this machine: first touch of reported pages costs 2-3 s of
# CPU per GiB against 0.15 s for pages freed moments ago, and the reporter drains about 125 MiB/s (a batch
# every 2 s). So a broker producing right after another run's topic was deleted writes into cheap recycled
# pages, and one producing later into expensive fresh ones: a 2x swing at 10 KB records that has nothing
# to do with either broker. Waiting until the reporter is idle starts every run on the same footing.
_REPORTED_KIB = Path("/sys/module/page_reporting/parameters/reported_kib")
_REPORTING_PERIOD_S = 2.0


def settle_memory(timeout_s: float = 60.0) -> float:
    """Wait until freed memory has been reported to the hypervisor (no change in the reporter's counter
    over one reporting period); returns the seconds waited. Without that counter (most kernels), returns 0
    at once: freed pages stay the guest's and there is nothing to wait for."""
    try:
        last = int(_REPORTED_KIB.read_text())
    except (OSError, ValueError):
        return 0.0
    started = time.monotonic()
    quiet_since = started
    while time.monotonic() - started < timeout_s:
        time.sleep(0.25)
        now = int(_REPORTED_KIB.read_text())
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since > _REPORTING_PERIOD_S + 0.5:
            break
    return time.monotonic() - started


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; binary units, as the kernel and the articles' buffer sizes use them."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_value(value: Any) -> str:
    """A table cell: integers as they are, floats to a sensible precision, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return "-"
        magnitude = abs(value)
        if magnitude >= 100:
            return f"{value:.0f}"
        if magnitude >= 10:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.2f}"
        if magnitude == 0:
            return "0"
        return f"{value:.3g}"
    return str(value)


def _is_numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _columns_of(rows: Iterable[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    return columns


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, *,
                 headers: dict[str, str] | None = None, markdown: bool = False) -> str:
    """Render rows as an aligned text table (or a GitHub markdown table with ``markdown=True``).

    Numbers are right-aligned, text left-aligned; a missing cell prints as '-'.
    """
    columns = list(columns) if columns is not None else _columns_of(rows)
    headers = headers or {}
    titles = [headers.get(c, c) for c in columns]
    cells = [[format_value(row.get(c)) for c in columns] for row in rows]
    numeric = [any(_is_numeric(row.get(c)) for row in rows) for c in columns]
    if markdown:
        lines = ["| " + " | ".join(titles) + " |",
                 "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in cells]
        return "\n".join(lines)
    widths = [max([len(t)] + [len(r[i]) for r in cells]) for i, t in enumerate(titles)]

    def line(values: Sequence[str]) -> str:
        out = []
        for i, v in enumerate(values):
            out.append(v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]))
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(titles), rule] + [line(r) for r in cells])


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


# ----------------------------------------------------------------------------------------------------------
# Progress


class Progress:
    """A progress bar on a terminal, plain milestone lines otherwise (CI logs, pipes).

    ``advance`` is thread-safe: benchmarks with sender and receiver threads may both report. Redraws are
    throttled to 10 per second so a tight loop calling ``advance(1)`` does not measure the terminal.
    """

    _REDRAW_S = 0.1
    _BAR_CELLS = 30

    def __init__(self, total: float, unit: str, *, label: str = "", stream=None, tty: bool | None = None):
        self.total = max(float(total), 0.0)
        self.unit = unit
        self.label = label
        self.done = 0.0
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._lock = threading.Lock()
        self._started = time.perf_counter()
        self._last_draw = 0.0
        self._next_milestone = 0.25
        self._closed = False
        self._drawn = False

    @property
    def tty(self) -> bool:
        return self._tty

    def __enter__(self) -> Progress:
        if not self._tty:
            self._print(f"{self._prefix()}{self._count()} ...")
        else:
            self._draw(force=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(ok=exc_type is None)

    def _prefix(self) -> str:
        return f"{self.label}: " if self.label else ""

    def _count(self) -> str:
        def number(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else format_value(x)

        return f"{number(self.done)}/{number(self.total)} {self.unit}"

    def _print(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()

    def advance(self, n: float = 1) -> None:
        """Record ``n`` more units done."""
        with self._lock:
            self.done += n
            self._update()

    def set(self, done: float) -> None:
        """Record the absolute amount done (for work measured as a position)."""
        with self._lock:
            self.done = done
            self._update()

    def describe(self, label: str) -> None:
        """Change what the bar says it is doing (e.g. the current method)."""
        with self._lock:
            self.label = label
            self._update(force=True)

    def _update(self, force: bool = False) -> None:
        if self._closed:
            return
        if self._tty:
            self._draw(force)
            return
        fraction = self.done / self.total if self.total else 1.0
        if fraction >= self._next_milestone and fraction < 1.0:
            while self._next_milestone <= fraction:
                self._next_milestone += 0.25
            self._print(f"{self._prefix()}{self._count()} ({fraction:.0%}, "
                        f"{time.perf_counter() - self._started:.1f} s)")

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_draw < self._REDRAW_S:
            return
        self._last_draw = now
        fraction = min(self.done / self.total, 1.0) if self.total else 1.0
        filled = int(fraction * self._BAR_CELLS)
        bar = "#" * filled + "-" * (self._BAR_CELLS - filled)
        elapsed = now - self._started
        eta = ""
        if 0 < fraction < 1:
            eta = f" eta {elapsed / fraction - elapsed:.0f} s"
        self._stream.write(f"\r\033[K{self._prefix()}[{bar}] {fraction:4.0%} {self._count()} "
                           f"{elapsed:.1f} s{eta}")
        self._stream.flush()
        self._drawn = True

    def interrupt(self) -> None:
        """Clear the bar's line so another message can be printed (the bar redraws on next advance)."""
        if self._tty and self._drawn and not self._closed:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._last_draw = 0.0

    def close(self, ok: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            elapsed = time.perf_counter() - self._started
            if self._tty:
                self._draw(force=True)
                self._stream.write("\n")
                self._stream.flush()
            else:
                state = "done" if ok else "stopped"
                self._print(f"{self._prefix()}{self._count()} {state} in {elapsed:.1f} s")
            self._closed = True


# ----------------------------------------------------------------------------------------------------------
# The benchmark


def _exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks run: scratch files are removed and brokers a
    benchmark started are stopped even when the benchmark itself is terminated."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def terminate(signum, frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)


class Benchmark:
    """One benchmark run: parsed options, collected rows and notes, and the writer of its results.

    Args:
        name: module name; the results are ``<out>/<name>.json`` and ``<out>/<name>.png``.
        description: one line saying what is measured.
        argv: command-line arguments (``sys.argv[1:]`` when None).
        arguments: optional ``callable(parser)`` adding benchmark-specific options; their values are on
            ``bench.args``.
    """

    def __init__(self, name: str, description: str, argv: Sequence[str] | None = None, *,
                 arguments: Callable[[argparse.ArgumentParser], None] | None = None):
        self.name = name
        self.description = description
        parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=description)
        parser.add_argument("--quick", action="store_true",
                            help="small sizes: finishes well under a minute")
        parser.add_argument("--out", default="bench-out", type=Path,
                            help="directory for <name>.json and <name>.png (default: ./bench-out)")
        parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
        if arguments is not None:
            arguments(parser)
        self.argv = list(argv) if argv is not None else sys.argv[1:]
        self.args = parser.parse_args(self.argv)
        self.tiny = bool(self.args.tiny) or os.environ.get(TINY_ENV, "") not in ("", "0")
        self.quick = bool(self.args.quick) or self.tiny
        self.out: Path = self.args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.tables: list[dict[str, Any]] = []
        self.json_path = self.out / f"{name}.json"
        self.png_path = self.out / f"{name}.png"
        self._started_wall = time.time()
        self._started = time.perf_counter()
        self._progress: Progress | None = None
        self.machine = machine_description(self.out)
        _exit_cleanly_on_sigterm()
        mode = "tiny" if self.tiny else ("quick" if self.quick else "full")
        self.log(f"{name}: {description} [{mode}]")

    # -- sizes ---------------------------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """'full', 'quick' or 'tiny'."""
        return "tiny" if self.tiny else ("quick" if self.quick else "full")

    def settle(self) -> None:
        """Start a measured run from the same memory state as every other: dirty pages written back
        (``settle_writeback``) and the pages earlier runs freed handed back to the host (``settle_memory``).
        Tiny runs (the test suite) skip the second wait, at least 2.5 s each time, for figures nobody reads."""
        settle_writeback()
        if not self.tiny:
            settle_memory()

    def pick(self, full: Any, quick: Any, tiny: Any | None = None) -> Any:
        """The value for the current mode (``tiny`` falls back to ``quick``)."""
        if self.tiny:
            return quick if tiny is None else tiny
        return quick if self.quick else full

    # -- output while running ------------------------------------------------------------------------------

    def log(self, text: str) -> None:
        """A status line on stderr that does not tear the progress bar."""
        if self._progress is not None:
            self._progress.interrupt()
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    @contextlib.contextmanager
    def progress(self, total: float, unit: str, label: str = "") -> Iterator[Progress]:
        """A progress bar for ``total`` units of work; ``bar.advance(n)`` as they complete."""
        bar = Progress(total, unit, label=label or self.name)
        previous, self._progress = self._progress, bar
        try:
            with bar:
                yield bar
        finally:
            self._progress = previous

    # -- results -------------------------------------------------------------------------------------------

    def row(self, **fields: Any) -> dict[str, Any]:
        """Record one result row; returns it (callers may add derived fields before finish)."""
        self.rows.append(fields)
        return fields

    def note(self, text: str) -> None:
        """Record a caveat that belongs with the numbers (what was scaled down, what was missing)."""
        self.notes.append(text)
        self.log(f"note: {text}")

    def table(self, title: str, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
              headers: dict[str, str] | None = None) -> None:
        """Record a side table (the article's figures beside today's, a ratio table); printed by finish."""
        columns = list(columns) if columns is not None else _columns_of(rows)
        self.tables.append({"title": title, "columns": columns, "headers": dict(headers or {}),
                            "rows": [dict(r) for r in rows]})

    # -- disk ----------------------------------------------------------------------------------------------

    def free_bytes(self, path: Path | None = None) -> int:
        return shutil.disk_usage(path or self.out).free

    def disk_scale(self, needed_bytes: int, path: Path | None = None, *, what: str = "the test files",
                   keep_free_bytes: int = 4 * _GIB, max_share: float = 0.5) -> float:
        """How much to scale the data set down so it fits: 1.0 when it fits, else a factor in (0, 1).

        A benchmark may use at most ``max_share`` of the free space and must leave ``keep_free_bytes``
        (others share this disk, and a full disk turns mmap writes into SIGBUS). When scaling is needed a
        note says what and by how much; the caller applies the factor to its sizes.
        """
        path = path or self.out
        free = self.free_bytes(path)
        usable = max(0.0, min(free * max_share, free - keep_free_bytes))
        if needed_bytes <= usable:
            return 1.0
        scale = usable / needed_bytes if needed_bytes else 1.0
        scale = max(scale, 0.0)
        self.note(f"{path} has {format_bytes(free)} free; {what} need {format_bytes(needed_bytes)}: "
                  f"scaled down to {scale:.0%}")
        return scale

    @contextlib.contextmanager
    def scratch_dir(self, parent: Path | None = None) -> Iterator[Path]:
        """A temporary directory (under ``--out`` by default: same disk as the results) removed on exit,
        whether the benchmark succeeds or not."""
        base = parent or self.out
        path = Path(tempfile.mkdtemp(prefix=f".scratch-{self.name}-", dir=base))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    # -- the end -------------------------------------------------------------------------------------------

    def finish(self, ratios: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
               chart: Callable[[Any], None] | None = None, columns: Sequence[str] | None = None,
               headers: dict[str, str] | None = None) -> dict[str, Any]:
        """Print the tables, write ``<name>.json`` and ``<name>.png``; returns the JSON document.

        ``chart(fig)`` draws on a fresh matplotlib Figure (Agg); without one the PNG shows the table.
        ``columns`` orders the main table (default: every key in order of first appearance).
        """
        columns = list(columns) if columns is not None else _columns_of(self.rows)
        ratios = dict(ratios or {})
        duration = time.perf_counter() - self._started
        document: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "quick": self.quick,
            "tiny": self.tiny,
            "mode": self.mode,
            "started_at": _dt.datetime.fromtimestamp(self._started_wall, _dt.UTC)
                          .isoformat(timespec="seconds"),
            "duration_s": round(duration, 3),
            "argv": self.argv,
            "machine": self.machine,
            "columns": columns,
            "headers": dict(headers or {}),
            "rows": self.rows,
            "ratios": ratios,
            "notes": self.notes,
            "tables": self.tables,
        }
        for key, value in (extra or {}).items():
            if key in document:
                raise ValueError(f"extra key {key!r} would overwrite a standard field")
            document[key] = value
        document = _json_safe(document)

        print(self.render_text(document))
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.json_path)
        self._write_chart(chart, columns)
        print(f"\nwrote {self.json_path} and {self.png_path} ({duration:.1f} s)")
        sys.stdout.flush()
        return document

    @staticmethod
    def render_text(document: dict[str, Any]) -> str:
        """The printed report: main table, side tables, ratios, notes."""
        parts = [f"\n== {document['name']}: {document['description']} [{document.get('mode', '')}] =="]
        if document["rows"]:
            parts.append(format_table(document["rows"], document["columns"], headers=document.get("headers")))
        for table in document.get("tables", []):
            parts.append(f"\n{table['title']}")
            parts.append(format_table(table["rows"], table["columns"], headers=table.get("headers")))
        if document["ratios"]:
            parts.append("\nratios")
            parts.extend(f"  {k}: {format_value(v) if not isinstance(v, (dict, list)) else json.dumps(v)}"
                         for k, v in document["ratios"].items())
        if document["notes"]:
            parts.append("\nnotes")
            parts.extend(f"  - {n}" for n in document["notes"])
        return "\n".join(parts)

    def _write_chart(self, chart: Callable[[Any], None] | None, columns: Sequence[str]) -> None:
        import matplotlib

        matplotlib.use("Agg", force=True)
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 6), layout="constrained")
        if chart is not None:
            chart(fig)
        else:
            ax = fig.add_subplot()
            ax.axis("off")
            text = format_table(self.rows, columns) if self.rows else "(no rows)"
            ax.text(0, 1, text, family="monospace", fontsize=8, va="top")
        if fig._suptitle is None:  # keep a chart's own title; otherwise say what it is
            fig.suptitle(f"{self.name}: {self.description}", fontsize=11)
        machine = self.machine
        memory = machine.get("memory_bytes")
        footer = (f"{machine.get('cores')} cores, {format_bytes(memory) if memory else '? memory'}, "
                  f"Linux {machine.get('kernel')}, Python {machine.get('python')} [{self.mode}]")
        if fig._supxlabel is None:
            fig.supxlabel(footer, fontsize=7, color="0.4")
        tmp = self.png_path.with_name(self.png_path.stem + ".tmp.png")
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, self.png_path)
