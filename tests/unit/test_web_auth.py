"""skewwatch.web_auth: the access rules on a real aiohttp app (in-process server), the token's sources, the
refusal to listen beyond loopback without one; and the worker API's per-model publish limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from skewwatch.errors import ConfigProblem
from skewwatch.kafka_security import Secret
from skewwatch.web_auth import AccessPolicy, auth_middleware, check_bind, load_token

TOKEN = "t0ken-for-tests"


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"path": request.path})


def app_with(policy: AccessPolicy) -> web.Application:
    app = web.Application(middlewares=[auth_middleware(policy)])
    for path in ("/healthz", "/readyz", "/api/v1/weights"):
        app.router.add_get(path, _ok)
    app.router.add_post("/api/v1/update_weights", _ok)
    return app


@pytest.fixture
async def loopback() -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(app_with(AccessPolicy(Secret(TOKEN), beyond_loopback=False)))) as client:
        yield client


@pytest.fixture
async def exposed() -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(app_with(AccessPolicy(Secret(TOKEN), beyond_loopback=True)))) as client:
        yield client


BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def test_on_loopback_reads_are_open_and_changes_need_the_token(loopback: TestClient) -> None:
    assert (await loopback.get("/api/v1/weights")).status == 200
    response = await loopback.post("/api/v1/update_weights")
    assert response.status == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await loopback.post("/api/v1/update_weights", headers={"Authorization": "Bearer nope"})).status == 401
    assert (await loopback.post("/api/v1/update_weights", headers={"Authorization": TOKEN})).status == 401
    assert (await loopback.post("/api/v1/update_weights", headers=BEARER)).status == 200


async def test_beyond_loopback_everything_but_healthz_needs_the_token(exposed: TestClient) -> None:
    assert (await exposed.get("/healthz")).status == 200
    for path in ("/readyz", "/api/v1/weights"):
        assert (await exposed.get(path)).status == 401
        assert (await exposed.get(path, headers=BEARER)).status == 200
    assert (await exposed.post("/healthz", headers=BEARER)).status == 405  # a write to /healthz is not public


async def test_unknown_paths_and_wrong_methods_keep_404_and_405(exposed: TestClient) -> None:
    assert (await exposed.get("/nothing")).status == 404
    assert (await exposed.put("/api/v1/update_weights")).status == 405


async def test_without_a_token_changes_are_refused_unless_writes_are_open() -> None:
    closed = AccessPolicy(None, beyond_loopback=False, token_hint="set SKEWWATCH_WEB_TOKEN")
    async with TestClient(TestServer(app_with(closed))) as client:
        response = await client.post("/api/v1/update_weights")
        assert response.status == 401 and "SKEWWATCH_WEB_TOKEN" in (await response.json())["error"]
    ingest = AccessPolicy(None, beyond_loopback=False, open_writes_without_token=True)
    async with TestClient(TestServer(app_with(ingest))) as client:
        assert (await client.post("/api/v1/update_weights")).status == 200


def test_the_token_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert load_token(str(path), "T", "web", env={"T": "from-env"}) == "from-file"  # the file wins
    assert load_token(None, "T", "web", env={"T": " from-env "}) == "from-env"
    assert load_token(None, "T", "web", env={}) is None
    assert repr(load_token(None, "T", "web", env={"T": "x"})) == "Secret('***')"  # never printed
    with pytest.raises(ConfigProblem, match="web.token_file: cannot read"):
        load_token(str(tmp_path / "absent"), "T", "web", env={})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigProblem, match="is empty"):
        load_token(str(tmp_path / "empty"), "T", "web", env={})


def test_beyond_loopback_without_a_token_is_refused() -> None:
    check_bind("127.0.0.1", None, False, "the API", "set one")
    check_bind("0.0.0.0", Secret(TOKEN), False, "the API", "set one")
    check_bind("0.0.0.0", None, True, "the API", "set one")  # --insecure-no-auth
    with pytest.raises(ConfigProblem, match="beyond loopback") as refused:
        check_bind("10.0.0.5", None, False, "the API", "set one")
    assert refused.value.exit_code == 2
    with pytest.raises(ConfigProblem):
        check_bind("worker.example.com", None, False, "the API", "set one")  # a name may resolve anywhere
