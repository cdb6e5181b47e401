"""Autorecovery: the auditor, replication workers and the admin recover/decommission actions.

Imports the ledger client's public pieces (connections, placement, recovery) and `bkaio.meta`;
never `journal` or `entrylog`. See docs/autorecovery.md.
"""

from __future__ import annotations

from .admin import (
    AutorecoveryStatus,
    LostBookieDelay,
    UnknownBookieError,
    autorecovery_status,
    get_lost_bookie_delay,
    is_autorecovery_enabled,
    list_decommissioned,
    list_under_replicated,
    mark_age_seconds,
    recommission_bookie,
    set_autorecovery_enabled,
    set_lost_bookie_delay,
    trigger_audit,
    who_is_auditor,
)
from .auditor import Auditor, AuditReport
from .checker import LedgerCheck, LedgerChecker
from .drain import (
    BookieAliveError,
    LedgerFailure,
    PlannedFragment,
    PlannedLedger,
    RecoveryPlan,
    RecoveryProgress,
    RecoveryReport,
    decommission_bookie,
    plan_recovery,
    recover_bookie,
)
from .fragments import (
    EntrySourcesUnavailableError,
    EntryUnreadableError,
    Fragment,
    ReplicationError,
)
from .metrics import AutorecoveryMetrics
from .replicator import LedgerReplication, Outcome, Replicator
from .service import AutorecoveryService, run_autorecovery
from .worker import ReplicationWorker

__all__ = [
    "AuditReport",
    "Auditor",
    "AutorecoveryMetrics",
    "AutorecoveryService",
    "AutorecoveryStatus",
    "BookieAliveError",
    "EntrySourcesUnavailableError",
    "EntryUnreadableError",
    "Fragment",
    "LedgerCheck",
    "LedgerChecker",
    "LedgerFailure",
    "LedgerReplication",
    "LostBookieDelay",
    "Outcome",
    "PlannedFragment",
    "PlannedLedger",
    "RecoveryPlan",
    "RecoveryProgress",
    "RecoveryReport",
    "ReplicationError",
    "ReplicationWorker",
    "Replicator",
    "UnknownBookieError",
    "autorecovery_status",
    "decommission_bookie",
    "get_lost_bookie_delay",
    "is_autorecovery_enabled",
    "list_decommissioned",
    "list_under_replicated",
    "mark_age_seconds",
    "plan_recovery",
    "recommission_bookie",
    "recover_bookie",
    "run_autorecovery",
    "set_autorecovery_enabled",
    "set_lost_bookie_delay",
    "trigger_audit",
    "who_is_auditor",
]
