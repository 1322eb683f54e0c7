"""Running the platform on one machine: Azurite for Blob and the local job rehearsal."""
