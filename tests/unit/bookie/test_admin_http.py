"""Admin HTTP parameter parsing and the token rule: 400 for a bad parameter, 401 without the
token, 403 with a wrong one (or none configured)."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from bkaio.bookie.admin_http import (
    BadRequest,
    check_token,
    json_error,
    query_bool,
    query_choice,
    query_int,
)


def request(query: str = "", authorization: str | None = None) -> web.Request:
    headers = {} if authorization is None else {"Authorization": authorization}
    return make_mocked_request("GET", f"/x?{query}", headers=headers)


def test_query_int() -> None:
    assert query_int(request("ledger_id=5"), "ledger_id") == 5
    assert query_int(request(), "n", default=3) == 3
    for query, message in (
        ("", "required"),
        ("ledger_id=x", "not an integer"),
        ("ledger_id=-1", "outside"),
        (f"ledger_id={2**63}", "outside"),
    ):
        with pytest.raises(BadRequest, match=message):
            query_int(request(query), "ledger_id")


def test_query_bool_and_choice() -> None:
    assert query_bool(request("p=true"), "p") is True
    assert query_bool(request(), "p") is False
    with pytest.raises(BadRequest):
        query_bool(request("p=yes"), "p")
    assert query_choice(request("t=ro"), "t", ("rw", "ro"), default="rw") == "ro"
    with pytest.raises(BadRequest, match="rw, ro"):
        query_choice(request("t=xx"), "t", ("rw", "ro"), default="rw")


def test_token_rule() -> None:
    assert check_token(request(authorization="Bearer s3cret"), "s3cret") is None
    for authorization, token, status in (
        (None, "s3cret", 401),
        ("Bearer wrong", "s3cret", 403),
        ("Basic s3cret", "s3cret", 403),
        ("Bearer anything", "", 403),
    ):
        denied = check_token(request(authorization=authorization), token)
        assert denied is not None and denied.status == status


def test_errors_are_json() -> None:
    response = json_error(400, "bad ledger_id")
    assert response.content_type == "application/json"
    assert response.text is not None
    assert json.loads(response.text) == {"error": "bad ledger_id", "kind": "BadRequest"}
