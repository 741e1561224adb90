"""The README stays true: its example config file loads, its command table names every command the CLI has
(and no other), and every link of the README and docs/ leads to a file and heading that exist. The quick
start's commands run in tests/client/test_client_cli.py."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from copyless.broker.config import load_toml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_example_config_file_loads(tmp_path):
    [example] = re.findall(r"```toml\n(.*?)```", README, re.S)
    path = tmp_path / "broker.toml"
    path.write_text(example)
    config = load_toml(path)
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 9092)
    assert (config.advertised_host, config.advertised_port) == ("broker1.example.com", 9092)
    assert config.retention_ms == 72 * 3600_000 and config.flush_mode == "sync" and config.num_partitions == 3
    assert config.metrics_listen == ("0.0.0.0", 9404) and str(config.data_dir) == "/var/lib/copyless"


def test_the_command_table_names_every_command():
    from copyless.broker.cli import build_parser

    table = README[README.index("## Commands"):README.index("## Configuration")]
    listed = set(re.findall(r"^\| `copyless (\w+)", table, re.M))
    [subparsers] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert listed == set(subparsers.choices)


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_of_the_readme_and_docs_resolves():
    broken = []
    for document in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            resolved = Path(os.path.normpath(document.parent / path)) if path else document
            if not resolved.exists():
                broken.append(f"{document.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.*)$", resolved.read_text(), re.M)}
                if anchor not in headings:
                    broken.append(f"{document.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_is_a_product_page():
    assert len(README.splitlines()) <= 300
    # What is not there yet comes before the quick start, not after the figures.
    assert README.index("## Not there yet") < README.index("## Quick start")
