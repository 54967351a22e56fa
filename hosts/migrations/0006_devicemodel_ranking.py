"""The ranking key on ``hosts_devicemodel``: the device's score copied, a random
tie-break, one index that serves the pick, and the triggers that keep them.

DESIGN.md "Picking a device": score, then the device's median first-token time
for the model (unknown last), then random. With the three keys on one row an
index walk finds the best eligible device after reading about one entry, at any
fleet size (docs/performance.md "Claim (helper)").

Triggers, not Python, keep the copy: a device's score is written by the score
services, by staff in the admin and by bulk updates, and a device-model row is
made by the heartbeat; the database sees every one of them.

PostgreSQL: a partial index on (model_id, score DESC, ttft_ms_recent NULLS LAST,
tiebreak) WHERE loaded, BEFORE triggers on the row. SQLite (the embedded
default, small fleets): no NULLS LAST in an index, so a plain index on the
same columns; AFTER triggers that update the row (SQLite cannot assign NEW).
"""

from django.db import migrations, models

# A row entering a tie group (same model, score and first-token time) restarts at
# the group's lowest key plus a fresh draw: Exp(1) on PostgreSQL; SQLite has no
# guaranteed ln(), so a uniform draw on (0, 2) (the same mean) there.
PG_FORWARD = """
CREATE INDEX devicemodel_ranking ON hosts_devicemodel
    (model_id, score DESC, ttft_ms_recent ASC NULLS LAST, tiebreak) WHERE loaded;

CREATE FUNCTION hosts_devicemodel_rank() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    lowest double precision;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT d.score INTO NEW.score FROM hosts_device d WHERE d.id = NEW.device_id;
    END IF;
    IF NEW.ttft_ms_recent IS NULL THEN
        SELECT t.tiebreak INTO lowest FROM hosts_devicemodel t
        WHERE t.model_id = NEW.model_id AND t.loaded AND t.score = NEW.score
          AND t.ttft_ms_recent IS NULL AND t.id <> NEW.id
        ORDER BY t.score DESC, t.ttft_ms_recent ASC NULLS LAST, t.tiebreak LIMIT 1;
    ELSE
        SELECT t.tiebreak INTO lowest FROM hosts_devicemodel t
        WHERE t.model_id = NEW.model_id AND t.loaded AND t.score = NEW.score
          AND t.ttft_ms_recent = NEW.ttft_ms_recent AND t.id <> NEW.id
        ORDER BY t.score DESC, t.ttft_ms_recent ASC NULLS LAST, t.tiebreak LIMIT 1;
    END IF;
    NEW.tiebreak := COALESCE(lowest, 0) - ln(1 - random());
    RETURN NEW;
END
$$;

CREATE TRIGGER hosts_devicemodel_rank_insert BEFORE INSERT ON hosts_devicemodel
    FOR EACH ROW EXECUTE FUNCTION hosts_devicemodel_rank();

CREATE TRIGGER hosts_devicemodel_rank_update
    BEFORE UPDATE OF score, ttft_ms_recent, loaded ON hosts_devicemodel
    FOR EACH ROW WHEN (
        OLD.score IS DISTINCT FROM NEW.score
        OR OLD.ttft_ms_recent IS DISTINCT FROM NEW.ttft_ms_recent
        OR (NEW.loaded AND NOT OLD.loaded)
    ) EXECUTE FUNCTION hosts_devicemodel_rank();

CREATE FUNCTION hosts_device_score_copy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE hosts_devicemodel SET score = NEW.score WHERE device_id = NEW.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER hosts_device_score_copy AFTER UPDATE OF score ON hosts_device
    FOR EACH ROW WHEN (OLD.score IS DISTINCT FROM NEW.score)
    EXECUTE FUNCTION hosts_device_score_copy();

UPDATE hosts_devicemodel dm SET score = d.score FROM hosts_device d
    WHERE d.id = dm.device_id;
"""

PG_BACKWARD = """
DROP TRIGGER IF EXISTS hosts_device_score_copy ON hosts_device;
DROP FUNCTION IF EXISTS hosts_device_score_copy();
DROP TRIGGER IF EXISTS hosts_devicemodel_rank_update ON hosts_devicemodel;
DROP TRIGGER IF EXISTS hosts_devicemodel_rank_insert ON hosts_devicemodel;
DROP FUNCTION IF EXISTS hosts_devicemodel_rank();
DROP INDEX IF EXISTS devicemodel_ranking;
"""

SQLITE_REBASE = """
    UPDATE hosts_devicemodel SET tiebreak = COALESCE((
        SELECT MIN(t.tiebreak) FROM hosts_devicemodel t, hosts_devicemodel n
        WHERE n.id = NEW.id AND t.model_id = n.model_id AND t.loaded
          AND t.score = n.score AND t.ttft_ms_recent IS n.ttft_ms_recent
          AND t.id <> n.id
    ), 0) + (random() % 1000000 + 1000000) / 1000000.0
    WHERE id = NEW.id;
"""

SQLITE_FORWARD = [
    "CREATE INDEX devicemodel_ranking ON hosts_devicemodel"
    " (model_id, loaded, score DESC, ttft_ms_recent, tiebreak)",
    "CREATE TRIGGER hosts_devicemodel_rank_insert AFTER INSERT ON hosts_devicemodel"
    " BEGIN"
    " UPDATE hosts_devicemodel SET score = ("
    "SELECT d.score FROM hosts_device d WHERE d.id = NEW.device_id) WHERE id = NEW.id;"
    + SQLITE_REBASE
    + " END",
    "CREATE TRIGGER hosts_devicemodel_rank_update"
    " AFTER UPDATE OF score, ttft_ms_recent, loaded ON hosts_devicemodel"
    " WHEN OLD.score IS NOT NEW.score"
    " OR OLD.ttft_ms_recent IS NOT NEW.ttft_ms_recent"
    " OR (NEW.loaded AND NOT OLD.loaded)"
    " BEGIN" + SQLITE_REBASE + " END",
    "CREATE TRIGGER hosts_device_score_copy AFTER UPDATE OF score ON hosts_device"
    " WHEN OLD.score IS NOT NEW.score"
    " BEGIN"
    " UPDATE hosts_devicemodel SET score = NEW.score WHERE device_id = NEW.id;"
    " END",
    "UPDATE hosts_devicemodel SET score = ("
    "SELECT d.score FROM hosts_device d WHERE d.id = hosts_devicemodel.device_id)",
]

SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS hosts_device_score_copy",
    "DROP TRIGGER IF EXISTS hosts_devicemodel_rank_update",
    "DROP TRIGGER IF EXISTS hosts_devicemodel_rank_insert",
    "DROP INDEX IF EXISTS devicemodel_ranking",
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        statements = statements_by_vendor.get(vendor)
        if statements is None:
            raise NotImplementedError(f"no ranking triggers for {vendor}")
        if isinstance(statements, str):
            statements = [statements]
        for sql in statements:
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("hosts", "0005_db_defaults"),
    ]

    operations = [
        migrations.AddField(
            model_name="devicemodel",
            name="score",
            field=models.PositiveSmallIntegerField(
                db_default=60,
                default=60,
                help_text="copy of the device's score (trigger)",
            ),
        ),
        migrations.AddField(
            model_name="devicemodel",
            name="tiebreak",
            field=models.FloatField(
                db_default=0.0,
                default=0.0,
                help_text="random tie-break key (see above)",
            ),
        ),
        migrations.RunPython(
            _run({"postgresql": PG_FORWARD, "sqlite": SQLITE_FORWARD}),
            _run({"postgresql": PG_BACKWARD, "sqlite": SQLITE_BACKWARD}),
        ),
    ]
