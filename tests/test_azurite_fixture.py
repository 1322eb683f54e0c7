"""The Azurite fixture is a real Blob server: a blob written is read back byte for byte."""


def test_round_trip_through_real_azurite(container):
    data = bytes(range(256)) * 1000
    container.upload_blob("a/b.bin", data, metadata={"kind": "probe"})
    blob = container.get_blob_client("a/b.bin")
    assert blob.download_blob().readall() == data
    assert blob.get_blob_properties().metadata == {"kind": "probe"}
