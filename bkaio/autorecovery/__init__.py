"""Autorecovery: the auditor, replication workers and the admin recover/decommission actions.

Imports the ledger client's public pieces (connections, placement, recovery) and `bkaio.meta`;
never `journal` or `entrylog`. See docs/autorecovery.md.
"""

from __future__ import annotations

from .admin import (
    RecoveryProgress,
    RecoveryReport,
    decommission_bookie,
    is_autorecovery_enabled,
    list_under_replicated,
    recover_bookie,
    set_autorecovery_enabled,
    who_is_auditor,
)
from .auditor import Auditor, AuditReport
from .fragments import Fragment, ReplicationError
from .metrics import AutorecoveryMetrics
from .replicator import LedgerReplication, Outcome, Replicator
from .service import AutorecoveryService, run_autorecovery
from .worker import ReplicationWorker

__all__ = [
    "AuditReport",
    "Auditor",
    "AutorecoveryMetrics",
    "AutorecoveryService",
    "Fragment",
    "LedgerReplication",
    "Outcome",
    "RecoveryProgress",
    "RecoveryReport",
    "ReplicationError",
    "ReplicationWorker",
    "Replicator",
    "decommission_bookie",
    "is_autorecovery_enabled",
    "list_under_replicated",
    "recover_bookie",
    "run_autorecovery",
    "set_autorecovery_enabled",
    "who_is_auditor",
]
