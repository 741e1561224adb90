"""Benchmarks: every source article's measurement reproduced on this machine, plus the broker end to end.

Each module is runnable as ``python -m benchmarks.<name> [--quick] --out DIR`` and is built on
:mod:`benchmarks._harness` (progress bar, table, ``DIR/<name>.json`` with the machine described, and a
chart ``DIR/<name>.png``). ``python -m benchmarks.report`` runs them all and regenerates
``benchmarks/RESULTS.md``.

Modules: ``zero_copy`` (file -> socket, read+send vs sendfile), ``file_copy`` (four ways to copy a file),
``writev`` (one buffer + write vs gathered writes), ``poll`` (poll vs epoll with idle connections),
``mmap_warmup`` (sparse vs preallocated vs pre-faulted segments), ``throughput`` (broker end to end,
copyless vs Apache Kafka); ``storage``, ``client`` and ``connections`` measure the project's own layers.
"""
