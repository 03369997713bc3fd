"""/docs works offline (issue 37): Swagger UI from the fastapi-offline package, its script and style served by the
app itself (no CDN), public like /openapi.json; without the package, a static page of every endpoint and schema."""

import re

import pytest
from fastapi.testclient import TestClient

from engine import Engine
from frontends.server import app as server_app
from frontends.server.app import create_app


@pytest.fixture(scope="module")
def app(tiny_model_dir):
    return create_app(Engine.load(str(tiny_model_dir), dtype="float32"), model_name="tiny", api_key="k")


def test_docs_is_swagger_ui_served_from_the_package(app):
    assert server_app.swagger_ui_dir() is not None, "fastapi-offline is not installed (the serve extra)"
    with TestClient(app) as client:
        page = client.get("/docs")  # public, as /openapi.json: no API key
        assert page.status_code == 200 and "SwaggerUIBundle" in page.text and "/openapi.json" in page.text
        assert not re.search(r"(src|href)=['\"]?https?:", page.text)  # every asset from this server: works offline
        for name, kind in (
            ("swagger-ui-bundle.js", "javascript"),
            ("swagger-ui.css", "text/css"),
            ("favicon.png", "image/png"),
        ):
            asset = client.get(f"/docs/{name}")
            assert asset.status_code == 200 and kind in asset.headers["content-type"] and asset.content, name
            assert f"/docs/{name}" in page.text
        assert len(client.get("/docs/swagger-ui-bundle.js").content) > 500_000  # the real bundle, not a stub
        assert client.get("/docs/index.html", headers={"Authorization": "Bearer k"}).status_code == 404
        assert client.get("/docs/..%2Fapp.py", headers={"Authorization": "Bearer k"}).status_code == 404
        assert client.get("/docs/index.html").status_code == 401  # anything else asks for the key
        assert client.get("/openapi.json").json()["paths"]["/v1/score"]


def test_without_the_package_docs_lists_every_endpoint_with_its_schemas(app, monkeypatch):
    monkeypatch.setattr(server_app, "swagger_ui_dir", lambda: None)
    with TestClient(app) as client:
        page = client.get("/docs")
        schema = client.get("/openapi.json").json()
        assert client.get("/docs/swagger-ui-bundle.js").status_code == 404
    assert page.status_code == 200 and "<script" not in page.text.lower()
    for path, ops in schema["paths"].items():
        for method in ops:
            assert f"<h2>{method.upper()} {path}</h2>" in page.text
    assert "ScoreBody" in page.text and "<h3>400: " in page.text
