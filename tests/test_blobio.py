"""amlhpc.jobs.runtime.blob.blobio: container clients for Azurite and Azure, retries, no secrets in messages."""

from __future__ import annotations

import pytest

from amlhpc.jobs.runtime.blob import blobio
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.azurite


class TestSafeEndpoint:
    def test_connection_string_shows_endpoint_not_key(self, azurite):
        shown = blobio.safe_endpoint(connection_string=azurite.connection_string)
        assert shown == azurite.blob_endpoint
        assert azurite.key not in shown

    def test_account_name_form(self):
        text = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0;EndpointSuffix=core.windows.net"
        assert blobio.safe_endpoint(connection_string=text) == "https://acct.blob.core.windows.net"

    def test_sas_query_is_dropped(self):
        shown = blobio.safe_endpoint("https://acct.blob.core.windows.net/?sv=2024&sig=c2VjcmV0")
        assert shown == "https://acct.blob.core.windows.net" and "sig" not in shown


class TestContainerClient:
    def test_round_trip_on_azurite(self, azurite, container):
        client = blobio.container_client(container.container_name, connection_string=azurite.connection_string)
        client.upload_blob("a/b.bin", b"hello")
        assert client.download_blob("a/b.bin").readall() == b"hello"

    def test_malformed_connection_string_never_echoes_it(self):
        secret = "AccountKey=c2VjcmV0LXNlY3JldA=="
        with pytest.raises(blobio.BlobConfigError) as caught:
            blobio.container_client("data", connection_string=f"this is not;{secret}")
        assert "c2VjcmV0" not in str(caught.value)
        assert "malformed" in str(caught.value)

    def test_account_url_is_required_without_connection_string(self):
        with pytest.raises(blobio.BlobConfigError, match=r"storage.blobEndpoint.*AMLHPC_BLOB_CONNECTION_STRING"):
            blobio.container_client("data", credential=object())

    def test_account_url_must_be_http(self):
        with pytest.raises(blobio.BlobConfigError, match="must start with https://"):
            blobio.container_client("data", account_url="acct.blob.core.windows.net", credential=object())

    def test_retry_and_transport_settings(self, azurite):
        settings = blobio.RetrySettings(total=7, read=5, status=4, initial_backoff_s=2.0, backoff_factor=3.0,
                                        max_backoff_s=40.0, jitter=0.0)
        client = blobio.container_client("data", connection_string=azurite.connection_string, retry=settings,
                                         max_connections=48)
        policy = next(p for p in client._pipeline._impl_policies if type(p).__name__ == "StagingRetry")
        assert (policy.total_retries, policy.read_retries, policy.status_retries) == (7, 5, 4)
        # 2, 6, 18, then capped at 40 s
        assert [policy.get_backoff_time({"count": k}) for k in range(4)] == [2.0, 6.0, 18.0, 40.0]
        transport = client._pipeline._transport
        assert transport.connection_config.data_block_size == blobio.RESPONSE_READ_BYTES
        adapter = transport.session.get_adapter("http://127.0.0.1")
        assert adapter._pool_maxsize == 48


class TestFromEnv:
    def test_connection_string_variable_means_azurite(self, azurite, mocker):
        credential = mocker.patch.object(blobio, "credential_from_env")
        client = blobio.container_client_from_env("data", env={blobio.CONNECTION_STRING_VARIABLE: azurite.connection_string})
        assert client.url.startswith(azurite.blob_endpoint)
        credential.assert_not_called()

    def test_without_it_the_managed_identity_is_used(self, mocker):
        fake_credential = mocker.Mock(spec=["get_token"])
        credential = mocker.patch.object(blobio, "credential_from_env", return_value=fake_credential)
        client = blobio.container_client_from_env("data", "https://acct.blob.core.windows.net/",
                                                  env={"AZURE_CLIENT_ID": "1111"})
        credential.assert_called_once()
        assert client.credential is fake_credential
        assert client.url == "https://acct.blob.core.windows.net/data"

    def test_credential_picks_the_client_id(self, mocker):
        default = mocker.patch("azure.identity.DefaultAzureCredential")
        blobio.credential_from_env({"AZURE_CLIENT_ID": "2222"})
        assert default.call_args.kwargs["managed_identity_client_id"] == "2222"


class TestBackoff:
    def test_default_curve_grows_and_caps_with_jitter(self):
        import random

        settings = blobio.RetrySettings()
        rng = random.Random(0)
        waits = [settings.backoff_s(k, rng) for k in range(8)]
        for k, wait in enumerate(waits):
            base = min(2.0**k, 30.0)
            assert base * 0.7 <= wait <= base * 1.3


class TestRetries:
    def test_server_busy_and_dropped_connections_are_retried(self, azurite, container):
        """Every request through a proxy that answers 503 or drops half of the time still succeeds."""
        container.upload_blob("blob", b"x" * 100_000)
        with FaultProxy(azurite.port, seed=11, drop=0.25, busy=0.25, max_per_request=3) as proxy:
            client = blobio.container_client(container.container_name, connection_string=proxy.connection_string(azurite),
                                             retry=blobio.RetrySettings.fast())
            for _ in range(10):
                assert client.download_blob("blob").readall() == b"x" * 100_000
        assert proxy.counts["busy"] > 0 and proxy.counts["drop"] > 0

    def test_budget_exhausted_raises(self, azurite, container):
        from azure.core.exceptions import HttpResponseError

        container.upload_blob("blob", b"x")
        settings = blobio.RetrySettings(total=2, status=2, initial_backoff_s=0.01, max_backoff_s=0.02)
        with FaultProxy(azurite.port, seed=1, busy=1.0, max_per_request=100) as proxy:
            client = blobio.container_client(container.container_name, connection_string=proxy.connection_string(azurite),
                                             retry=settings)
            with pytest.raises(HttpResponseError) as caught:
                client.download_blob("blob").readall()
        assert caught.value.status_code == 503
        assert proxy.counts["busy"] == 3  # the first try and two retries
