"""The node's `Device` object writer: GET, merge, POST when absent or PUT when changed (409/429: again).

The same read-modify-write as the NodeResourceTopology writer (`kube/reportwriters.py`), on
`/apis/scheduling.koordinator.sh/v1alpha1/devices/<node>`; counted in `koordqos_report_*{kind="Device"}`.
"""

from __future__ import annotations

import asyncio

from koordqos.kube.reportwriters import ClientSource, NRTWriter, Sleep

DEVICES_PATH = "/apis/scheduling.koordinator.sh/v1alpha1/devices"


class DeviceWriter(NRTWriter):
    """Creates this node's Device and keeps its devices, labels and annotations current."""

    kind = "Device"

    def __init__(
        self, client: ClientSource, node_name: str, *, attempts: int = 5, sleep: Sleep = asyncio.sleep
    ) -> None:
        super().__init__(client, node_name, attempts=attempts, sleep=sleep)
        self.collection = DEVICES_PATH
        self.path = f"{DEVICES_PATH}/{node_name}"
