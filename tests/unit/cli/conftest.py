"""The stream tests' clients (fake bookies, a real SQLite metadata file) for the CLI's tests."""

from tests.unit.stream.conftest import fake_bookies, make_client

__all__ = ["fake_bookies", "make_client"]
