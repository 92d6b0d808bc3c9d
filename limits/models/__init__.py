"""The limits app's tables, a module per wing (the app label, the tables and the
migrations are one). Imported whole here, so that Django finds every model."""

from limits.models.ledger import (
    LEDGER_OUTCOME_CODES,
    LEDGER_OUTCOMES,
    LedgerBatch,
    LedgerCount,
    LedgerEntry,
    LedgerKind,
    OutcomeField,
)
from limits.models.people import (
    Preference,
    PreferenceChange,
    PreferenceLock,
    Suppression,
    SuppressionChange,
    SuppressionLock,
)
from limits.models.policy import (
    Authored,
    Cap,
    Holdout,
    QuietHours,
    QuotaReset,
    Rule,
    SettingChange,
    Topic,
)
from limits.models.privacy import ErasedPerson, Erasure, ErasureKey
from limits.models.stream import StreamBatch, WebhookDelivery, WebhookEndpoint
from limits.models.studies import (
    EventSeen,
    Experiment,
    ExperimentArm,
    StudyCell,
    StudyDay,
    StudyEvent,
    StudyMember,
)

__all__ = [
    "LEDGER_OUTCOMES",
    "LEDGER_OUTCOME_CODES",
    "Authored",
    "Cap",
    "ErasedPerson",
    "Erasure",
    "ErasureKey",
    "EventSeen",
    "Experiment",
    "ExperimentArm",
    "Holdout",
    "LedgerBatch",
    "LedgerCount",
    "LedgerEntry",
    "LedgerKind",
    "OutcomeField",
    "Preference",
    "PreferenceChange",
    "PreferenceLock",
    "QuietHours",
    "QuotaReset",
    "Rule",
    "SettingChange",
    "StreamBatch",
    "StudyCell",
    "StudyDay",
    "StudyEvent",
    "StudyMember",
    "Suppression",
    "SuppressionChange",
    "SuppressionLock",
    "Topic",
    "WebhookDelivery",
    "WebhookEndpoint",
]
