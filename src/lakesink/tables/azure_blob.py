"""Small files on Azure written whole, and created only if absent, with the Blob API's
own precondition (``If-None-Match: *``, through azure-storage-blob).

hadoop-azure 3.5's ABFS does not give either on an account without a hierarchical
namespace (its Blob-endpoint client, the one an emulator such as Azurite can serve): its
``create(path, overwrite=false)`` asks whether the name exists, then PUTs an empty blob
and commits the bytes when the stream closes. Two writers can both create one name, and
a reader can find the file empty in between. lakesink's create-if-absent steps (the
writer lease, manifests, the table's identity, journals) and its small JSON files go
through here on ``abfs[s]://``; data files and every other operation go through ABFS.

The credentials are the ones the session's Hadoop configuration holds for the account
(:func:`lakesink.runtime.storage.azure_options` put them there): the account key, a
fixed SAS token, or a service principal; none of them — Azure's default credential
chain (managed identity, environment).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

_URI = re.compile(r"^(abfss?)://([^@/]+)@(([^./]+)\.[^/]+)(?:/(.*))?$")


def parse(uri: str) -> tuple[str, str, str, str, str]:
    """``(scheme, container, host, account, blob name)`` of an ``abfs[s]://`` URI."""
    m = _URI.match(uri)
    if not m:
        raise ValueError(f"not an abfs[s]://container@account.dfs.core.windows.net/… URI: "
                         f"{uri}")
    scheme, container, host, account, name = m.groups()
    return scheme, container, host, account, (name or "").strip("/")


class AzureBlobs:
    """Whole-object puts to the blobs behind ``abfs[s]://`` URIs; ``conf_get`` reads the
    Hadoop configuration (``Configuration.get``)."""

    def __init__(self, conf_get: Callable[[str], str | None]) -> None:
        self._get = conf_get
        self._containers: dict[tuple[str, str, str], Any] = {}

    def put(self, uri: str, data: bytes, *, if_absent: bool) -> bool:
        """Store ``data`` at ``uri`` in one PUT (readers see all of it or nothing); with
        ``if_absent``, only if no blob has that name (False when one had). The client
        retries a PUT whose answer was lost; when the retry finds the name taken by
        exactly these bytes, the first try landed: True (every caller's content is its
        own — attempt ids, uuids, times — or the same whoever wrote it)."""
        from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

        scheme, container, host, account, name = parse(uri)
        client = self._container(scheme, container, host, account)
        try:
            client.upload_blob(name, data, overwrite=not if_absent)
        except ResourceExistsError:
            try:
                return bool(client.download_blob(name).readall() == data)
            except ResourceNotFoundError:  # deleted meanwhile: it was someone's
                return False
        return True

    def _conf(self, key: str, host: str) -> str | None:
        value = self._get(f"{key}.{host}")
        return value if value is not None else self._get(key)

    def _container(self, scheme: str, container: str, host: str, account: str) -> Any:  # noqa: ANN401
        cached = self._containers.get((scheme, container, host))
        if cached is None:
            from azure.storage.blob import ContainerClient

            cached = ContainerClient(self._account_url(scheme, host, account), container,
                                     credential=self._credential(host, account))
            self._containers[(scheme, container, host)] = cached
        return cached

    def _account_url(self, scheme: str, host: str, account: str) -> str:
        """ABFS's own choice of address: an ``fs.azure.abfs.endpoint`` of ``host:port``
        (an emulator) takes ``/<account>`` in the path; https unless the URI is
        ``abfs://`` and ``fs.azure.always.use.https`` is false."""
        plain = scheme == "abfs" and (self._conf("fs.azure.always.use.https", host)
                                      or "true").lower() == "false"
        protocol = "http" if plain else "https"
        endpoint = self._conf("fs.azure.abfs.endpoint", host)
        if endpoint and ":" in endpoint:
            return f"{protocol}://{endpoint}/{account}"
        return f"{protocol}://{account}.blob.{host.split('.', 2)[2]}"

    def _credential(self, host: str, account: str) -> Any:  # noqa: ANN401
        auth = (self._conf("fs.azure.account.auth.type", host) or "SharedKey")
        provider = self._conf("fs.azure.account.oauth.provider.type", host) or ""
        if auth not in ("SharedKey", "SAS", "OAuth") \
                or (auth == "SAS" and not self._conf("fs.azure.sas.fixed.token", host)) \
                or (auth == "OAuth" and not provider.endswith("ClientCredsTokenProvider")):
            from lakesink.errors import ConfigError

            raise ConfigError("storage.azure.options", f"ABFS authentication {auth} "
                              f"{provider} is ABFS's own; lakesink writes its bookkeeping "
                              "through the Blob API with an account key, a fixed SAS token "
                              "or a service principal (client id, secret, tenant)",
                              fix="set storage.azure.account_key, sas_token or client_id + "
                              "client_secret + tenant_id instead")
        key = self._conf("fs.azure.account.key", host)
        if key:
            return {"account_name": account, "account_key": key}
        sas = self._conf("fs.azure.sas.fixed.token", host)
        if sas:
            return sas
        client_id = self._conf("fs.azure.account.oauth2.client.id", host)
        secret = self._conf("fs.azure.account.oauth2.client.secret", host)
        token_url = self._conf("fs.azure.account.oauth2.client.endpoint", host) or ""
        tenant = re.search(r"microsoftonline\.com/([^/]+)/", token_url)
        from azure import identity

        if client_id and secret and tenant:
            return identity.ClientSecretCredential(tenant.group(1), client_id, secret)
        return identity.DefaultAzureCredential()
