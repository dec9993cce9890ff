"""Logging set-up: in the JSON format every line on stderr is a JSON object, the standard library's too
(#32 5e: kubernetes-asyncio's plain-text lines landed among the agent's JSON lines)."""

from __future__ import annotations

import json
import subprocess
import sys

SNIPPET = """
import logging
import structlog
from koordqos.logging import configure_logging

configure_logging("json", "info")
structlog.get_logger("koordqos.x").info("ours", n=1)
logging.getLogger("kubernetes_asyncio.config.kube_config").warning("Config not found: %s", "/nope")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=True)
logging.getLogger("aiohttp.access").info("below the stdlib threshold: not shown")
"""


def test_every_line_of_the_json_format_is_a_json_object() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SNIPPET], capture_output=True, text=True, check=True, timeout=60
    )
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert [(d["event"], d["level"]) for d in lines] == [
        ("ours", "info"),
        ("Config not found: /nope", "warning"),
        ("Task exception was never retrieved", "error"),
    ]
    assert lines[1]["logger"] == "kubernetes_asyncio.config.kube_config"
    assert lines[2]["exception"][0]["exc_type"] == "ZeroDivisionError"
    assert all("timestamp" in d for d in lines)
