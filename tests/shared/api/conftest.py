"""A real twinserve server on loopback, one per engine, shared by the whole api suite."""
from __future__ import annotations

import openai
import pytest

from tests.server_util import ENGINES, Server, start_server, stop_server


@pytest.fixture(scope="session", params=ENGINES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           default_model_dir: str):
    # default_model_dir: the model is fetched before the server's start-up timeout runs.
    log_path = tmp_path_factory.mktemp(f"server-{request.param}") / "server.log"
    srv = start_server(request.param, log_path)
    yield srv
    code = stop_server(srv)
    assert code == 0, f"server exited with {code}: {log_path.read_text()[-3000:]}"


ORIGIN = "https://app.example"
FAULT_SEED = 424242


@pytest.fixture(scope="session", params=ENGINES)
def edge_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                default_model_dir: str):
    """A server with CORS on, the debug endpoints left at their default (off), at most 8
    connections at once, and requests seeded FAULT_SEED failing inside the core."""
    log_path = tmp_path_factory.mktemp(f"edge-{request.param}") / "server.log"
    srv = start_server(request.param, log_path, "--allowed-origins", f'["{ORIGIN}"]',
                       "--allowed-methods", "GET,POST", "--allow-credentials",
                       "--no-enable-debug-endpoints", "--limit-concurrency", "8",
                       "--debug-fail-request-seed", str(FAULT_SEED))
    yield srv
    assert stop_server(srv) == 0, log_path.read_text()[-3000:]


@pytest.fixture()
def client(server: Server):
    with server.client() as c:
        yield c


@pytest.fixture()
def oai(server: Server) -> openai.OpenAI:
    """The official openai client on the server."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key, max_retries=0,
                         timeout=60)


@pytest.fixture()
def served_model(oai: openai.OpenAI) -> str:
    """The served model's id, as a client finds it."""
    return oai.models.list().data[0].id
