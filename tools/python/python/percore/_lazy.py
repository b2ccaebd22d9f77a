"""Connection settings plus a client opened lazily, in each process."""

from __future__ import annotations

from ._native import Client


class LazyClient:
    """Holds how to connect and opens the client on first use. A client
    pickles as its settings, keys included (spawned DataLoader workers
    reconnect with them); forked workers keep the client, which reconnects
    on its own after a fork."""

    def __init__(self, client: Client | None = None, endpoint=None, access_key=None,
                 secret_key=None):
        self._client = client
        if endpoint is None and client is not None:
            endpoint = client.endpoint
        self._args = (endpoint, access_key, secret_key)

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(*self._args)
        return self._client
