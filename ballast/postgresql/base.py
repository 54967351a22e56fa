"""Django's PostgreSQL backend whose connection pool replaces dead connections
at once and checks healthy ones without a round trip (``ballast.dbpool``).

Django builds each process's psycopg pool itself (a ``ConnectionPool`` with
either no check or psycopg_pool's round-trip check, ``CONN_HEALTH_CHECKS``), so
the pool options cannot name another class or check. This backend builds the
pool the same way (same connection parameters, autocommit, Django's
``configure``, the ``OPTIONS["pool"]`` settings) as a ``CheckedPool``.
"""

from __future__ import annotations

from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base

from ballast.dbpool import CheckedPool


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        if self.alias not in self._connection_pools:
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django's: it sets its own later
            options = {} if pool_options is True else dict(pool_options)
            pool = CheckedPool(
                kwargs=connect_kwargs,
                open=False,
                configure=self._configure_connection,
                check=None,  # CheckedPool.getconn checks, without backoff
                **options,
            )
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]
