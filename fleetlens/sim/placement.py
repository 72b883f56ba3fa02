"""Where ranks run: logical node slots filled with physical nodes, spares swapped in on failure.

Rank ``r`` sits on slot ``r // gpus_per_node``, GPU ``r % gpus_per_node``. A physical node ``p``
is in rack ``p // nodes_per_rack``, under leaf switch ``p // nodes_per_switch`` and in NVLink
domain ``p // nodes_per_nvlink_domain``; spares are numbered after the cluster's nodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .model import Cluster

__all__ = ["Placement"]


class Placement:
    def __init__(self, cluster: Cluster, world: int) -> None:
        self.c = cluster
        self.pre = f"{cluster.fleet}-" if cluster.fleet else ""
        self.world = world
        self.gpn = cluster.gpus_per_node
        n_slots = -(-world // self.gpn)
        self.slot_nodes = np.arange(n_slots)
        self.spares = list(range(cluster.nodes, cluster.nodes + cluster.spare_nodes))
        self.n_nodes = cluster.nodes + cluster.spare_nodes
        self.n_gpus = self.n_nodes * self.gpn
        self.rank_slot = (np.arange(world) // self.gpn).astype(np.uint32)
        self.rank_gpu = (np.arange(world) % self.gpn).astype(np.int32)
        self._refresh()

    def name(self, node: int) -> str:
        return f"{self.pre}{self.c.node_prefix}-{node:04d}"

    def rack(self, node: int) -> str:
        return f"{self.pre}rack-{node // self.c.nodes_per_rack:03d}"

    def _refresh(self) -> None:
        self.phys = self.slot_nodes[self.rank_slot] * self.gpn + self.rank_gpu
        self.node_names = [self.name(int(n)) for n in self.slot_nodes]
        self.uuids = [
            f"GPU-{self.pre}sim{int(p) // self.gpn:05d}-{int(p) % self.gpn:02d}" for p in self.phys
        ]

    def replace(self, node: int) -> int | None:
        """Swap physical ``node`` out for a spare; returns the spare, or None if none is left."""
        hit = np.flatnonzero(self.slot_nodes == node)
        if not len(hit) or not self.spares:
            return None
        spare = self.spares.pop(0)
        self.slot_nodes = self.slot_nodes.copy()
        self.slot_nodes[hit[0]] = spare
        self.spares.append(node)  # repaired and back in the spare pool
        self._refresh()
        return spare

    def rank_of_gpu(self, phys_gpu: int) -> int:
        hit = np.flatnonzero(self.phys == phys_gpu)
        return int(hit[0]) if len(hit) else -1

    def records(self, t: float) -> tuple[int, dict[str, Any]]:
        nodes = self.slot_nodes[self.rank_slot]
        c = self.c
        racks = [self.rack(int(n)) for n in nodes]
        switches = [f"{self.pre}leaf-{int(n) // c.nodes_per_switch:03d}" for n in nodes]
        domains = [f"{self.pre}nvl-{int(n) // c.nodes_per_nvlink_domain:04d}" for n in nodes]
        w = self.world
        return w, {
            "time": np.full(w, t),
            "rank": np.arange(w, dtype=np.int32),
            "local_rank": self.rank_gpu,
            "world_size": np.full(w, w, np.int32),
            "node_id": (self.node_names, self.rank_slot),
            "gpu": self.rank_gpu,
            "gpu_uuid": self.uuids,
            "rack": racks,
            "switch": switches,
            "nvlink_domain": domains,
        }
