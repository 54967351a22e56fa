"""Django's PostgreSQL backend with the pool check of ``ballast.dbpool``."""
