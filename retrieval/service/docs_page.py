"""The browsable API page, ``/docs``: FastAPI's Swagger UI page with its script, style and icon
served by this server from the ``swagger-ui-bundle`` package, so that it works on a machine
without internet (FastAPI's own page loads them from a CDN and stays blank offline)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from retrieval.service.metrics import NamedMount

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"


def add_docs_page(app: FastAPI) -> None:
    """Serve ``/docs`` and its files (the app is made with ``docs_url=None``)."""
    app.router.routes.append(NamedMount(ASSETS_PATH, StaticFiles(directory=swagger_ui_path)))

    @app.get(DOCS_PATH, include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=str(app.openapi_url), title=f"{app.title} - API",
                                   swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS_PATH}/favicon-32x32.png")
