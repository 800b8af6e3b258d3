"""Postgres: models, migrations runner, idempotent writers with a durable outbox."""
