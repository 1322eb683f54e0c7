"""amlhpc.jobs.runtime.blob.blobhttp: staging's Blob reads on http.client, against Azurite and a recording server."""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from collections import namedtuple

import pytest

from amlhpc.jobs.runtime.blob import blobhttp, blobio
from tests.faultproxy import FaultProxy

FAST = blobio.RetrySettings.fast()


def reader_for(azurite, container_name: str, connection_string: str | None = None, retry=FAST) -> blobhttp.Reader:
    env = {blobio.CONNECTION_STRING_VARIABLE: connection_string or azurite.connection_string}
    url, auth = blobhttp.auth_from_env(container_name, None, env)
    return blobhttp.Reader(url, auth, retry)


@pytest.mark.azurite
class TestOnAzurite:
    def test_ranges_metadata_and_one_connection_for_many_requests(self, azurite, container):
        container.upload_blob("a/b.bin", bytes(range(256)) * 100, metadata={"amlhpc_size": "25600"})
        reader = reader_for(azurite, container.container_name)
        for offset in range(0, 25600, 2560):
            data, headers = reader.get("a/b.bin", offset, 2560)
            assert data == (bytes(range(256)) * 100)[offset:offset + 2560]
        assert reader.head("a/b.bin")["x-ms-meta-amlhpc_size"] == "25600"
        assert len(reader._all) == 1  # one thread, one keep-alive connection
        reader.close()

    def test_errors_name_the_blob_and_never_the_sas(self, azurite, container):
        reader = reader_for(azurite, container.container_name)
        with pytest.raises(blobhttp.BlobReadError) as caught:
            reader.get("missing.bin", 0, 10)
        assert caught.value.status == 404 and "blob 'missing.bin'" in str(caught.value)
        assert "sig=" not in str(caught.value) and azurite.key not in str(caught.value)

    def test_a_wrong_key_is_access_denied_without_the_key(self, azurite, container):
        wrong = azurite.connection_string.replace(azurite.key, "d3Jvbmcta2V5LXdyb25nLWtleQ==")
        reader = reader_for(azurite, container.container_name, wrong)
        with pytest.raises(blobhttp.BlobReadError) as caught:
            reader.list_page("")
        assert caught.value.status == 403 and "access denied" in str(caught.value)
        assert "d3Jvbmc" not in str(caught.value)

    def test_a_changed_blob_fails_its_etag_condition(self, azurite, container):
        container.upload_blob("c.bin", b"one", overwrite=True)
        first = container.get_blob_client("c.bin").get_blob_properties().etag
        container.upload_blob("c.bin", b"two", overwrite=True)
        with pytest.raises(blobhttp.BlobReadError, match="changed while it was being staged"):
            reader_for(azurite, container.container_name).get("c.bin", 0, 3, etag=first)

    def test_busy_answers_and_dropped_connections_are_retried(self, azurite, container):
        container.upload_blob("r.bin", b"x" * 50_000)
        with FaultProxy(azurite.port, seed=3, drop=0.3, busy=0.3, max_per_request=2) as proxy:
            reader = reader_for(azurite, container.container_name, proxy.connection_string(azurite))
            for _ in range(10):
                assert reader.get("r.bin", 0, 50_000)[0] == b"x" * 50_000
        assert proxy.counts["busy"] > 0 and proxy.counts["drop"] > 0

    def test_a_truncated_body_is_asked_for_again(self, azurite, container):
        """A range whose body breaks off is read again on a new connection: one reset costs
        that range, not the whole file's attempt."""
        container.upload_blob("t.bin", b"y" * 100_000)
        with FaultProxy(azurite.port, seed=1, truncate=1.0, max_faults=1) as proxy:
            reader = reader_for(azurite, container.container_name, proxy.connection_string(azurite))
            assert reader.get("t.bin", 0, 100_000)[0] == b"y" * 100_000
            assert proxy.counts["truncate"] == 1

    def test_a_body_that_keeps_breaking_off_is_transient_after_the_read_budget(self, azurite, container):
        container.upload_blob("t.bin", b"y" * 100_000)
        retry = dataclasses.replace(FAST, read=2)
        with FaultProxy(azurite.port, seed=1, truncate=1.0, max_per_request=100) as proxy:
            reader = reader_for(azurite, container.container_name, proxy.connection_string(azurite), retry)
            with pytest.raises(blobhttp.TransientError, match="broke off|reading the body failed"):
                reader.get("t.bin", 0, 100_000)
            assert proxy.counts["truncate"] == 1 + retry.read

    def test_nobody_listening_gives_up_after_the_budget(self):
        from amlhpc.jobs.local.azurite import free_port

        url = f"http://127.0.0.1:{free_port()}/acct/data"
        reader = blobhttp.Reader(url, blobhttp.SasAuth("acct", "a2V5", "data"),
                                 blobio.RetrySettings(total=2, connect=2, initial_backoff_s=0.01, max_backoff_s=0.02))
        with pytest.raises(blobhttp.TransientError, match=r"listing http://127.0.0.1:\d+/acct/data: gave up after 3"):
            reader.list_page("")


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self):  # noqa: N802 - the http.server API
        self.seen.append(dict(self.headers))
        body = b"12345"
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_azure_reads_carry_a_fresh_token_and_a_date():
    """The managed identity's token goes in the Authorization header and is renewed before it expires."""
    Token = namedtuple("Token", "token expires_on")

    class Credential:
        calls = 0

        def get_token(self, scope):
            assert scope == "https://storage.azure.com/.default"
            Credential.calls += 1
            return Token(f"token-{Credential.calls}", time.time() + (60 if Credential.calls == 1 else 3600))

    auth = blobhttp.BearerAuth(Credential())
    first, second = {}, {}
    assert auth.apply(first) == "" and auth.apply(second) == ""  # a token adds no query
    # The first token expires within 5 minutes: renewed before the second request.
    assert first["Authorization"] == "Bearer token-1" and second["Authorization"] == "Bearer token-2"
    assert first["x-ms-date"].endswith("GMT")


def test_a_token_is_never_sent_over_plain_http():
    """http:// with a bearer token is refused before any connection: from the stack's account URL and
    when a Reader is built directly; nothing reaches the server."""
    class Credential:
        def get_token(self, scope):
            raise AssertionError("no token may be fetched for an http:// URL")

    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/acct"
    try:
        with pytest.raises(blobio.BlobConfigError, match="never sent over plain http"):
            blobhttp.auth_from_env("data", url, {})
        with pytest.raises(blobio.BlobConfigError, match="never sent over plain http"):
            blobhttp.Reader(f"{url}/data", blobhttp.BearerAuth(Credential()), FAST)
    finally:
        server.shutdown()
        server.server_close()
    assert _Recorder.seen == []


def test_the_deadline_stops_retries():
    reader = blobhttp.Reader("http://127.0.0.1:9/acct/data", blobhttp.SasAuth("acct", "a2V5", "data"),
                             blobio.RetrySettings(total=100, connect=100, initial_backoff_s=0.2, max_backoff_s=0.2))
    started = time.monotonic()
    with pytest.raises(blobhttp.DeadlineExceeded, match="deadline of 1s"):
        reader.get("x", 0, 5, deadline=blobhttp.Deadline(1.0))
    assert time.monotonic() - started < 3


def test_an_http_account_url_from_the_environment_is_refused_with_the_fix():
    with pytest.raises(blobio.BlobConfigError, match="must start with https://: an Entra ID token is never sent.*Azurite: set"):
        blobhttp.auth_from_env("data", "http://acct.blob.core.windows.net/", {})
