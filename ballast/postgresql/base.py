"""Django's PostgreSQL backend whose connection pool checks connections cheaply.

Django builds each process's psycopg pool with either no check or psycopg_pool's
round-trip check (``CONN_HEALTH_CHECKS``), and passes ``check`` itself, so the
pool options cannot name another. This backend builds the pool the same way
(same connection parameters, autocommit, Django's ``configure``, the
``OPTIONS["pool"]`` settings) with ``ballast.dbpool.connection_check``.
"""

from __future__ import annotations

from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base

from ballast.dbpool import connection_check


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        if self.alias not in self._connection_pools:
            from psycopg_pool import ConnectionPool

            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django's: it sets its own later
            options = {} if pool_options is True else dict(pool_options)
            pool = ConnectionPool(
                kwargs=connect_kwargs,
                open=False,
                configure=self._configure_connection,
                check=connection_check,
                **options,
            )
            self._connection_pools.setdefault(self.alias, pool)
        return self._connection_pools[self.alias]
