"""A device's outcomes, its reliability score and quarantine.

DESIGN.md "Reliability score": recomputed on every outcome, in the caller's
transaction, and periodically for the uptime part; "Spot checks": quarantine is
judged whenever a failure is recorded. The formula is ``hosts.scoring`` (pure);
``device_score_inputs`` is the one read of what it is computed from, used by the
outcome, the periodic recompute and the machine page alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection, transaction
from django.utils import timezone

from ballast.writes import insert_sql, update_then, write_then_read

from ..models import Device, DeviceOutcome
from ..scoring import (
    WINDOW,
    quarantine_after_failure,
    quarantine_release,
    score_round,
    score_unrounded,
)
from .trust import device_quarantine
from .uptime import device_online_fraction

TTFT_WINDOW = timedelta(hours=1)
SPOT_CHECKS_JUDGED = 20


@dataclass
class ScoreInputs:
    """What a device's score is computed from (DESIGN.md "Reliability score").

    ``outcomes``/``successes``: counts in its last 50 outcomes; ``online``: the
    online fraction 0..1; ``model_id``: the model whose latency counts ('' when
    none); ``model_median``/``device_median``: first-token medians (ms, last hour,
    of the model over all devices / of this device; None when unknown).
    """

    outcomes: int
    successes: int
    online: Decimal
    model_id: str
    model_median: float | None
    device_median: float | None

    @property
    def score(self) -> int:
        """The score these inputs give, 0..100 (``hosts.scoring``)."""
        return score_round(
            score_unrounded(
                outcomes=self.outcomes,
                successes=self.successes,
                online_fraction=self.online,
                model_median_ttft_ms=self.model_median,
                device_ttft_ms=self.device_median,
            )
        )


# the device's last outcomes, newest first (as ``DeviceOutcome.Meta.ordering``):
# its own and its machine's retired devices' (a device renamed by its agent
# continues its predecessor's record: fresh-eyes review 3, a refuser renamed
# its device to start again at 60); ``{besides}`` leaves out the outcome being
# recorded (``claimed``), counted apart as the newest
_LAST_OUTCOMES = (
    "SELECT success FROM hosts_deviceoutcome WHERE device_id IN ("
    "SELECT d.id FROM hosts_device d WHERE d.id = %s OR (d.retired_at IS NOT NULL"
    " AND d.machine_id = (SELECT machine_id FROM hosts_device WHERE id = %s))){besides}"
    " ORDER BY created_at DESC, id DESC LIMIT {limit}"
)
_LAST_OUTCOMES_SQL = _LAST_OUTCOMES.format(besides="", limit=WINDOW)
# the rows of the inputs' read, told apart by the first column: (0, success as
# 0/1, NULL) for each of the device's last outcomes; (1, NULL, the model's
# median first-token time since a time) and (2, NULL, the device's), computed by
# the database (``_MEDIAN``), not sent as rows: a model's hour holds every
# device's successes
_LAST_ROWS = "SELECT 0, CASE WHEN success THEN 1 ELSE 0 END, CAST(NULL AS INTEGER)"
# the successes of a model with a first-token time: its params the model, then
# (``{since}``) a time
_HOUR = (
    "SELECT device_id, ttft_ms FROM {table}"
    " WHERE model_id = %s AND success AND ttft_ms IS NOT NULL{since}"
)
# ``statistics.median`` of ``{hour}``'s ttft_ms (``{mine}``: of one device's
# rows, the device's id a param after the hour's), NULL for none: the middle
# value by rank, or the mean of the two middle ones; window functions, on
# PostgreSQL and SQLite alike
_MEDIAN = (
    "SELECT {part}, NULL, AVG(ttft_ms) FROM (SELECT ttft_ms,"
    " ROW_NUMBER() OVER (ORDER BY ttft_ms) AS r, COUNT(*) OVER () AS n"
    " FROM ({hour}) AS h{mine}) AS m WHERE r IN ((n + 1) / 2, (n + 2) / 2)"
)


def _medians(hour: str) -> str:
    """The model's and the device's median rows over ``hour`` (its params
    twice, the device's id after the second)."""
    return (
        _MEDIAN.format(part=1, hour=hour, mine="")
        + " UNION ALL "
        + _MEDIAN.format(part=2, hour=hour, mine=" WHERE device_id = %s")
    )


_INPUTS_SQL = f"{_LAST_ROWS} FROM ({_LAST_OUTCOMES_SQL}) AS last UNION ALL " + _medians(
    _HOUR.format(table="hosts_deviceoutcome", since=" AND created_at >= %s")
)
# the same read with the outcome being recorded (``claimed``) as the newest,
# the model's part only with a model (``device_score_inputs``' ``recorded``)
_BESIDES = " AND id <> (SELECT id FROM claimed)"
_RECORDED_LAST_SQL = (
    f"{_LAST_ROWS} FROM claimed UNION ALL {_LAST_ROWS} FROM ("
    + _LAST_OUTCOMES.format(besides=_BESIDES, limit=WINDOW - 1)
    + ") AS last"
)
_RECORDED_INPUTS_SQL = f"{_RECORDED_LAST_SQL} UNION ALL " + _medians(
    _HOUR.format(table="claimed", since="")
    + " UNION ALL "
    + _HOUR.format(
        table="hosts_deviceoutcome", since=" AND created_at >= %s" + _BESIDES
    )
)
# what the inputs' read needs of the outcome it records (``write_then_read``)
_RECORDED_COLUMNS = ("id", "device_id", "success", "model_id", "ttft_ms")


def device_score_inputs(
    *,
    device_id: int,
    now: datetime,
    model_id: str = "",
    recorded: DeviceOutcome | None = None,
    device: Device | None = None,
) -> ScoreInputs:
    """Read the device's score inputs at ``now`` (``ScoreInputs``).

    The last 50 outcomes (newest first) of the device and of its machine's
    retired devices (a renamed device's record goes on); the online fraction
    (``device_online_fraction``); for ``model_id`` — '' means the model of the
    device's latest outcome that names one — ``statistics.median`` of the
    first-token times of the successful outcomes of the hour before ``now``, over
    all devices and over this one (computed by the database, ``_MEDIAN``, in
    the same statement as the last outcomes). Four queries at most
    with ``model_id``, five without. ``recorded``: an unsaved outcome of the
    device, stored by the read's statement and counted as its newest
    (``ballast.writes.write_then_read``). ``device``: its row with its machine
    and the machine's lease, when the caller read them in this transaction
    (else read here: one query more). Raises Device.DoesNotExist.
    """
    if device is None:
        device = Device.objects.select_related("machine", "machine__lease").get(
            id=device_id
        )
    if not model_id:
        model_id = (
            device.outcomes.exclude(model_id="")
            .values_list("model_id", flat=True)
            .first()
        ) or ""
    since = connection.ops.adapt_datetimefield_value(now - TTFT_WINDOW)
    # fixed statements: every outcome reads them; the last outcomes and the
    # hour's first tokens in one
    if recorded is not None:
        rows = _inputs_recorded(recorded, device_id, model_id, since)
    else:
        with connection.cursor() as cursor:
            if model_id:
                hour = [model_id, since]
                cursor.execute(
                    _INPUTS_SQL, [device_id, device_id, *hour, *hour, device_id]
                )
                rows = cursor.fetchall()
            else:
                cursor.execute(_LAST_OUTCOMES_SQL, [device_id, device_id])
                rows = [(0, success, None) for (success,) in cursor.fetchall()]
    last = [bool(success) for part, success, _ in rows if part == 0]
    medians = {part: _ms(median) for part, _, median in rows if part != 0}
    return ScoreInputs(
        outcomes=len(last),
        successes=sum(last),
        online=device_online_fraction(device=device, now=now),
        model_id=model_id,
        model_median=medians.get(1),
        device_median=medians.get(2),
    )


def _ms(median) -> float | None:
    """A median the database computed (PostgreSQL: a Decimal), as a float."""
    return None if median is None else float(median)


def _inputs_recorded(
    recorded: DeviceOutcome, device_id: int, model_id: str, since
) -> list[tuple]:
    """The inputs' rows (as ``_INPUTS_SQL``'s) with ``recorded`` stored in the
    same statement as the newest outcome."""
    insert, params = insert_sql(recorded)
    columns = ", ".join(_RECORDED_COLUMNS)
    write = (f"{insert} RETURNING {columns}", params)
    if model_id:
        hour = [model_id, model_id, since]
        read = (_RECORDED_INPUTS_SQL, [device_id, device_id, *hour, *hour, device_id])
    else:
        read = (_RECORDED_LAST_SQL, [device_id, device_id])
    return write_then_read(write, _RECORDED_COLUMNS, read)


def _score_write(
    *,
    device_id: int,
    score: int,
    slot_free: bool = False,
    recent: tuple[str, int | None] | None = None,
) -> None:
    """Store the device's score; with ``slot_free`` give back one of its slots in
    the same write (never below zero); with ``recent`` (model id, ms or None)
    its median first-token time on that model, on its device-model row when it
    moved (one statement on PostgreSQL: ``ballast.writes.update_then``). The device
    row before its device-model row, the order of the claim (which locks the
    device, then moves the row's tie-break key): no lock cycle."""
    write = (_SCORE_SLOT_SQL if slot_free else _SCORE_SQL, [score, device_id])
    if recent is None:
        with connection.cursor() as cursor:  # fixed: every outcome writes one
            cursor.execute(*write)
        return
    model_id, ms = recent
    update_then(
        (write[0] + " RETURNING id", write[1]),
        ("id",),
        [(_RECENT_SQL, [ms, model_id, ms])],
    )


_SCORE_SQL = "UPDATE hosts_device SET score = %s WHERE id = %s"
_SCORE_SLOT_SQL = (
    "UPDATE hosts_device SET score = %s,"
    " slots_used = CASE WHEN slots_used > 0 THEN slots_used - 1 ELSE 0 END"
    " WHERE id = %s"
)
# the device's median on a model, written only when it moved (ms are > 0)
_RECENT_SQL = (
    "UPDATE hosts_devicemodel SET ttft_ms_recent = %s"
    " WHERE device_id = (SELECT id FROM claimed) AND model_id = %s"
    " AND COALESCE(ttft_ms_recent, -1) <> COALESCE(%s, -1)"
)


@transaction.atomic(savepoint=False)  # usually inside an attempt's end
def device_outcome_record(
    *,
    device_id: int,
    success: bool,
    source: str = DeviceOutcome.Source.ATTEMPT,
    reason: str = "",
    model_id: str = "",
    ttft_ms: int | None = None,
    now: datetime | None = None,
    slot_free: bool = False,
    job_ref: str = "",
    detail: str = "",
    device: Device | None = None,
) -> int:
    """Record one outcome for the device and recompute its score; return the score.

    DESIGN.md "Reliability score": the score is recomputed on every outcome, in
    the caller's transaction (the end of a job records it with the charge). With
    ``model_id`` and a ``ttft_ms`` (ms, a success's first token), the device's
    median first-token time for the model (last hour) is stored on its
    device-model row when it moved. ``slot_free``: also give back one of the
    device's slots (the ended attempt's) in the same write as the score.
    ``job_ref``: the job's id (text) the outcome was about; ``detail``: why, in
    words (cut to 300 characters), kept on the row for staff. A
    failure is judged for quarantine at once (``device_quarantine_judge``). A
    renter's cancel is never passed here. Raises Device.DoesNotExist for an
    unknown device. ``device``: as ``device_score_inputs``' (its row, machine
    and lease read by the caller in this transaction).
    """
    now = now or timezone.now()
    recorded = DeviceOutcome(
        device_id=device_id,
        source=source,
        success=success,
        reason=reason,
        model_id=model_id,
        ttft_ms=ttft_ms,
        job_ref=str(job_ref or ""),
        detail=detail[:300],
    )
    inputs = device_score_inputs(
        device_id=device_id,
        model_id=model_id,
        now=now,
        recorded=recorded,
        device=device,
    )
    score = inputs.score
    recent = None
    if model_id and ttft_ms is not None:
        median = inputs.device_median
        recent = (model_id, round(median) if median is not None else None)
    _score_write(device_id=device_id, score=score, slot_free=slot_free, recent=recent)
    if not success:
        device_quarantine_judge(device_id=device_id, score=score, now=now)
    return score


def device_score_recompute(
    *, device_id: int, now: datetime | None = None, model_id: str = ""
) -> int:
    """Recompute and store the device's score; return it (0..100).

    DESIGN.md "Reliability score" (run periodically for the uptime part).
    Without ``model_id`` the latency part uses the model the device served last.
    Raises Device.DoesNotExist for an unknown device.
    """
    now = now or timezone.now()
    score = device_score_inputs(device_id=device_id, model_id=model_id, now=now).score
    _score_write(device_id=device_id, score=score)
    return score


def spot_checks_recent(*, device_id: int) -> list[bool]:
    """The device's last 20 judged spot checks, newest first (True = passed)."""
    return list(
        DeviceOutcome.objects.filter(
            device_id=device_id, source=DeviceOutcome.Source.SPOT_CHECK
        ).values_list("success", flat=True)[:SPOT_CHECKS_JUDGED]
    )


def device_quarantine_judge(
    *, device_id: int, score: int, now: datetime | None = None
) -> bool:
    """Quarantine the device if a just-recorded failure calls for it; True if it did.

    DESIGN.md "Spot checks": score under 50 or 3 failed spot checks among the last
    20. A quarantined device gets only spot checks, one marked due now
    (``trust.device_quarantine``; a device held as new to its machine then
    needs 3 passes in a row too).
    """
    now = now or timezone.now()
    if not quarantine_after_failure(
        score=score, recent_checks=spot_checks_recent(device_id=device_id)
    ):
        return False
    return device_quarantine(
        device_id=device_id, reason=Device.QuarantineReason.FAILURES, now=now
    )


def device_quarantine_release_judge(*, device_id: int) -> bool:
    """Release a quarantined device once its last spot checks passed in a row:
    3, or 1 for a device new to its machine (``Device.quarantine_passes_needed``).
    True if released."""
    device = Device.objects.filter(id=device_id, quarantined=True).first()
    if device is None or not quarantine_release(
        recent_checks=spot_checks_recent(device_id=device_id),
        passes=device.quarantine_passes_needed,
    ):
        return False
    return bool(
        Device.objects.filter(
            id=device_id, quarantined=True, quarantine_reason=device.quarantine_reason
        ).update(quarantined=False, quarantined_at=None, quarantine_reason="")
    )
