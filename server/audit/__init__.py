"""The accuracy promise watched on live traffic (ADR 0024): sampled plans' devices upload their raw
input after the answer, the float model's top-1 is compared with the answer given off the hot
path, and an anytime-valid confidence sequence on the disagreement rate of each (model, version,
level) is exported for alerts."""

from qpart.server.audit.audits import Audits
from qpart.server.audit.book import AuditBook, Ticket
from qpart.server.audit.live import CurrentCS, LiveDisagreement, reference_bound, window_alpha
from qpart.server.audit.worker import AuditJob, AuditWorker, KeptInputs

__all__ = ["AuditBook", "AuditJob", "AuditWorker", "Audits", "CurrentCS", "KeptInputs", "LiveDisagreement",
           "Ticket", "reference_bound", "window_alpha"]
