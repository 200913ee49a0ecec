"""CORS on the app (``cors_origins`` in the server's state; ``ServeOptions.cors_origins``).

The known answer is the Fetch standard's: an allowed origin is echoed (``*`` for any),
a preflight is answered with the methods and the headers it asked for, without the API
key; a request from another origin or without ``Origin`` gets no CORS headers.
"""

from __future__ import annotations

from modelc.server.app import create_app
from modelc.server.state import ServerState
from tests import net

SITE = "https://chat.example.com"


def _app(origins: list[str]):  # type: ignore[no-untyped-def]
    # no model is needed: these routes never reach one
    state = ServerState(None, api_key="k", cors_origins=origins)  # type: ignore[arg-type]
    return create_app(state).test_client()


async def test_preflight_without_key_and_allowed_origin() -> None:
    client = _app([SITE])
    r = await client.options(
        "/v1/messages",
        headers={
            "Origin": SITE,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "x-api-key, content-type, anthropic-version",
        },
    )
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == SITE
    assert "POST" in r.headers["Access-Control-Allow-Methods"]
    assert r.headers["Access-Control-Allow-Headers"] == "x-api-key, content-type, anthropic-version"
    # an actual request: the origin is echoed, also on an error (here: no key, 401)
    r = await client.get("/openapi.json", headers={"Origin": SITE})
    assert r.status_code == 401 and r.headers["Access-Control-Allow-Origin"] == SITE
    r = await client.get("/api/version", headers={"Origin": "https://other.example"})
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers


async def test_any_origin_and_off_by_default() -> None:
    r = await _app(["*"]).get("/api/version", headers={"Origin": SITE})
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    r = await _app([]).get("/api/version", headers={"Origin": SITE})
    assert "Access-Control-Allow-Origin" not in r.headers


def test_cors_origins_flag_on_a_real_server() -> None:
    """``modelc run --cors-origins``: a browser's preflight and request to the running server
    get the Fetch standard's answer; another origin gets no CORS headers."""

    from tests.assets import smollm2_gguf
    from tests.server_fixtures import start

    srv = start(str(smollm2_gguf()), "--cors-origins", f"{SITE}, https://b.example")
    try:
        pre = net.options(
            f"{srv.url}/v1/chat/completions",
            headers={"Origin": SITE, "Access-Control-Request-Method": "POST"},
        )
        assert pre.status_code == 200 and pre.headers["Access-Control-Allow-Origin"] == SITE
        r = net.get(f"{srv.url}/v1/models", headers={"Origin": "https://b.example"})
        assert r.headers["Access-Control-Allow-Origin"] == "https://b.example"
        r = net.get(f"{srv.url}/v1/models", headers={"Origin": "https://other.example"})
        assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
    finally:
        srv.stop()
