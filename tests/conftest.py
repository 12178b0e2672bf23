"""Fixtures shared by the test modules."""

import pytest


@pytest.fixture
def importer_reads(monkeypatch) -> list[str]:
    """The kinds whose reader `import_config` went on to run (after its size check), as it runs them."""
    import estimator.importers as importers
    kinds, real = [], importers._reader
    monkeypatch.setattr(importers, "_reader", lambda kind: kinds.append(kind) or real(kind))
    return kinds
