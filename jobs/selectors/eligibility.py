"""Which devices may take a job: rules 1–6 of DESIGN.md "Picking a device" (the
numbered rules are marked below), as querysets (``devices_live``,
``model_loaded``, ``placement_filter``, ``features_filter``, ``devices_rented``)
and as the SQL twins one dispatch runs (``model_loaded_sql``, ``placement_sql``,
``features_sql``, the WHERE of ``devices_eligible``, ``device_pick_sql`` and
``devices_eligible_count``); the ranking (``RANKING``, ``tiebreak_step``).
"""

from __future__ import annotations

import random
import re
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet

from ballast.db import skip_locked
from catalog.models import CatalogModel
from hosts.liveness import live_q, live_sql
from hosts.models import Device, DeviceModel, vram_need_mb

from ..models import Attempt, Job, Rental


def devices_live(*, now: datetime) -> QuerySet[Device]:
    """Devices whose machine is connected with a heartbeat under 30 s old (rule 1,
    ``hosts.liveness.live_q``: recorded heartbeat or a process lease), and that
    its latest ``hello`` declared (not retired)."""
    return Device.objects.filter(
        live_q(now, prefix="machine__"), retired_at__isnull=True
    )


def model_loaded(model: CatalogModel) -> Exists:
    """Exists() of the device's row of ``model``, loaded (rule 3) with the
    catalog's weights (rule 6, ``CatalogModel.weights_match``)."""
    rows = DeviceModel.objects.filter(
        device=OuterRef("pk"), model_id=model.id, loaded=True
    )
    if model.weights_sha256:
        rows = rows.filter(weights_sha256=model.weights_sha256)
    return Exists(rows)


def model_loaded_sql(device: str = "d", model: str = "c") -> str:
    """``model_loaded`` as SQL, for a fixed statement: EXISTS of the row of
    device ``device`` (an alias of ``hosts_device``) for catalog entry
    ``model`` (an alias of its catalog table), loaded (rule 3) with the
    entry's weights when it pins any (rule 6, ``CatalogModel.weights_match``).
    The same rule as ``model_loaded``; the same text on PostgreSQL and
    SQLite."""
    return (
        f"EXISTS (SELECT 1 FROM hosts_devicemodel ml WHERE ml.device_id = {device}.id"
        f" AND ml.model_id = {model}.id AND ml.loaded AND ({model}.weights_sha256 = ''"
        f" OR ml.weights_sha256 = {model}.weights_sha256))"
    )


def placement_filter(placement: dict, *, model_id: str) -> Q:
    """The Q on devices of the request's placement requirements (rule 6):
    ``gpu`` and ``min_vram_gb`` by what was measured of the device on
    ``model_id`` (``Device.placement_meets``, the one rule; ``placement_sql``
    is the same as SQL), ``region`` (case ignored)."""
    q = Q()
    gpu, min_vram_gb = placement.get("gpu"), placement.get("min_vram_gb")
    if gpu or min_vram_gb is not None:
        need_mb = vram_need_mb(min_vram_gb) if min_vram_gb is not None else 0
        q &= Q(kind=Device.Kind.GPU, vram_total_mb__gte=need_mb) & Exists(
            DeviceModel.objects.filter(
                device=OuterRef("pk"),
                model_id=model_id,
                placed_name=OuterRef("name"),
                placed_vram_mb__gte=need_mb,
            ).exclude(placed_name="")
        )
    if gpu:
        q &= Q(name__icontains=gpu)
    if placement.get("region"):
        q &= Q(machine__region__iexact=placement["region"])
    return q


def placement_sql(placement: dict) -> tuple[list[str], list]:
    """The WHERE terms (over ``d`` the device, ``dm`` its row of the job's
    model, ``m`` its machine) of the request's placement requirements (rule 6)
    and their parameters: ``Device.placement_meets`` (gpu and min_vram_gb by
    what was measured) as SQL, and ``region``. ``gpu`` is a substring (LIKE's
    wildcards escaped)."""
    where: list[str] = []
    params: list = []
    gpu, min_vram_gb = placement.get("gpu"), placement.get("min_vram_gb")
    if gpu or min_vram_gb is not None:
        need_mb = vram_need_mb(min_vram_gb) if min_vram_gb is not None else 0
        where += [
            "d.kind = %s",
            "dm.placed_name <> ''",
            "dm.placed_name = d.name",
            "dm.placed_vram_mb >= %s",
            "d.vram_total_mb >= %s",
        ]
        params += [Device.Kind.GPU.value, need_mb, need_mb]
    if gpu:
        where.append("UPPER(d.name) LIKE %s ESCAPE '\\'")
        params.append("%" + _like_escaped(str(gpu).upper()) + "%")
    if placement.get("region"):
        where.append("UPPER(m.region) = %s")
        params.append(str(placement["region"]).upper())
    return where, params


def features_filter(features) -> Q:
    """The Q of devices whose machine declared every one of ``features``
    (rule 6: what the request's output needs of the engine), as
    ``Machine.serves``: a name among the space-separated ``features``."""
    q = Q()
    for feature in features:
        q &= Q(machine__features__regex=rf"(^| ){re.escape(feature)}( |$)")
    return q


def features_sql(features, machine: str = "m") -> tuple[list[str], list]:
    """``features_filter`` as SQL: the WHERE terms over machine ``machine``
    (an alias of ``hosts_machine``) declaring every one of ``features``, and
    their parameters (a name among its space-separated ``features``; the
    known names are lower-case words, which LIKE matches as the Q's regex
    does)."""
    term = f"(' ' || {machine}.features || ' ') LIKE %s ESCAPE '\\'"
    return [term] * len(features), [f"% {_like_escaped(f)} %" for f in features]


def devices_rented() -> Exists:
    """Exists() of an open (pending or live) rental on the device (rule 5)."""
    return Exists(
        Rental.objects.filter(
            device=OuterRef("pk"),
            status__in=Rental.OPEN_STATUSES,
        )
    )


def _eligible_where(
    *, job: Job, model: CatalogModel, now: datetime
) -> tuple[str, list]:
    """FROM/WHERE of the eligible devices of ``job``, and its parameters.

    One SQL text for PostgreSQL and SQLite, rule by rule (DESIGN.md "Picking a
    device"). Raw SQL because this runs on every dispatch: building the same query
    through the ORM cost ~5 ms of Python per claim (bench/claim_profile.py).
    """
    live, live_params = live_sql(now)  # rule 1 (hosts.liveness)
    job_pk = Attempt._meta.get_field("job").get_db_prep_value(job.id, connection)
    where = [
        # rule 1: websocket open and a heartbeat under 30 s old; the device in
        # the machine's latest hello
        live,
        "d.retired_at IS NULL",
        # rule 2: not paused (staff, owner, agent)
        "NOT d.paused",
        "NOT m.paused",
        "NOT m.host_paused",
        # rule 3: a free slot by the coordinator's own claims; the model loaded
        "d.slots_used < d.slots_total",
        # ... and none while it scores a verification sent on this connection
        # (its engine is busy: a job offered now would miss its first-token
        # deadline, an honest host's failure; docs/design-notes.md rule 3)
        "NOT EXISTS (SELECT 1 FROM jobs_verification v WHERE v.verifier_id = d.id"
        " AND v.status = 'offered' AND v.sent_at >= m.connected_at)",
        "dm.model_id = %s",
        "dm.loaded",
        # rule 4: under the temperature limit; free VRAM for one request
        "(d.temp_c IS NULL OR d.temp_c < %s)",
        "d.vram_free_mb >= %s",
        # rule 6: never the same device twice for one job
        "NOT EXISTS (SELECT 1 FROM jobs_attempt a WHERE a.job_id = %s"
        " AND a.device_id = d.id)",
    ]
    params: list = [
        *live_params,
        model.id,
        settings.BALLAST_MAX_GPU_TEMP_C,
        model.vram_per_request_mb,
        job_pk,
    ]
    if model.weights_sha256:  # rule 6: the catalog's weights (weights_match)
        where.append("dm.weights_sha256 = %s")
        params.append(model.weights_sha256)
    if job.target_device_id:  # a spot check or a rental: its one device
        where.append("d.id = %s")
        params.append(job.target_device_id)
    if not job.is_spot_check:  # spot checks reach quarantined and rented devices
        where.append("NOT d.quarantined")  # rule 2
        if not job.rental_id:  # rule 5: serverless, owner and agent; not rented
            where += [
                "m.accepts_serverless",
                "m.agent_accepts_serverless",
                "NOT EXISTS (SELECT 1 FROM jobs_rental r WHERE r.device_id = d.id"
                " AND r.status IN ('pending', 'live'))",
            ]
    features, features_params = features_sql(job.features_needed)  # rule 6
    where += features
    params += features_params
    placed, placed_params = placement_sql(job.placement or {})  # rule 6
    where += placed
    params += placed_params
    sql = (
        " FROM hosts_devicemodel dm"
        " JOIN hosts_device d ON d.id = dm.device_id"
        " JOIN hosts_machine m ON m.id = d.machine_id"
        " WHERE " + " AND ".join(where)
    )
    return sql, params


def _like_escaped(text: str) -> str:
    """``text`` for a LIKE pattern with ``ESCAPE '\\'``: its ``\\``, ``%`` and ``_``
    match themselves (as ``placement_filter``'s ``icontains`` does)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# The ranking of DESIGN.md "Picking a device" on the device-model row: the
# device's score (copied there by a trigger), the device's median first-token
# time for the model (unknown last), the random tie-break key. It is the order of
# the index ``devicemodel_ranking`` (hosts.0006), so ``LIMIT 1`` reads about one
# entry whatever the fleet size; the rules above filter rows as the walk goes.
RANKING = " ORDER BY dm.score DESC, dm.ttft_ms_recent ASC NULLS LAST, dm.tiebreak"


def tiebreak_step() -> float:
    """The amount (> 0) a claim adds to the claimed row's tie-break key: Exp(1).

    Each tied row's key is then the next event of its own Poisson clock, and by
    memorylessness the next claim among tied rows takes each with the same chance
    (a uniform redraw instead would settle on one device: the lowest key is the
    one just drawn). Keys only grow; a row entering a tie group is re-based by
    the trigger of hosts.0006.
    """
    return random.expovariate(1.0)


def devices_eligible(*, job: Job, model: CatalogModel, now: datetime) -> list[Device]:
    """Eligible devices for ``job``, in ranking order (best first).

    Rules 1–6 of DESIGN.md "Picking a device"; ranking: score, then the device's
    median time to first token for the model over the last hour (unknown last),
    then random (``RANKING``). A spot check runs on its target device whatever its
    quarantine or rental; a rental's job only on the rented device.
    """
    where, params = _eligible_where(job=job, model=model, now=now)
    return list(Device.objects.raw("SELECT d.*" + where + RANKING, params))


def device_pick_sql(
    *, job: Job, model: CatalogModel, now: datetime, offset: str = "0"
) -> tuple[str, list]:
    """The SELECT of the id of the best eligible device for ``job`` after the
    first ``offset`` (SQL: how many to leave to older queued jobs; its params
    follow the returned ones), locked for the claim: ``(sql, params)``.

    Rules 1–6 and the ranking (``RANKING``) of DESIGN.md "Picking a device";
    the row is locked with ``ballast.db.skip_locked`` (PostgreSQL: concurrent
    claims pass over each other's device rows).
    """
    where, params = _eligible_where(job=job, model=model, now=now)
    sql = f"SELECT d.id{where}{RANKING} LIMIT 1 OFFSET {offset}{skip_locked('d')}"
    return sql, params


def devices_eligible_count(*, job: Job, model: CatalogModel, now: datetime) -> int:
    """How many devices are eligible for ``job`` (locked rows included)."""
    where, params = _eligible_where(job=job, model=model, now=now)
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*)" + where, params)
        return cursor.fetchone()[0]
