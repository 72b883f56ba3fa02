from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .helpers import Server, postgres


@pytest.fixture
def server(tmp_path) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    srv = Server(str(tmp_path / "data")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    with postgres() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_url(request, tmp_path, pg_url) -> str:  # type: ignore[no-untyped-def]
    """Each metadata test runs on both engines; PostgreSQL gets a fresh schema per test."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/meta.db"
    import sqlalchemy as sa

    schema = f"t_{abs(hash(str(tmp_path))) % 10**9}"
    engine = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {schema}"))
    engine.dispose()
    return pg_url.rsplit("/", 1)[0] + f"/{schema}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (the portal's tests)."""
    from playwright.sync_api import sync_playwright

    from .test_portal import ARGS, CHROMIUM

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()
