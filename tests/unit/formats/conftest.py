"""The drafter tests' fixtures (a tiny target, one drafter per method, one torch thread)."""

from tests.unit.drafters.conftest import drafter, one_thread, target  # noqa: F401
