"""What a Ray bench run's scenarios share: its rounds, request counts, folder and cluster
(a module of its own, so the scenario modules need not import the runner that calls them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from testkit.ray_cluster import LocalCluster


class Ctx:
    def __init__(self, args: argparse.Namespace, base: Path, cluster: LocalCluster) -> None:
        self.rounds = args.rounds or (1 if args.quick else 4)
        self.n = args.n or (8 if args.quick else 16)
        self.cold_rounds = 1 if args.quick else 3
        self.dir = base
        self.cluster = cluster
        self.pinned: dict[str, str] = {}
