"""An Azure Blob Storage emulator for the tests: Azurite (npm ``azurite``, installed by
``scripts/setup.sh`` into ``.tools/azurite``), its Blob service on 127.0.0.1, its data in
a temporary directory, one account with a key made for the run. It stands in for Azure,
which cannot run here. Azurite serves the Blob API, not ADLS Gen2's DFS API: lakesink
reaches it as an account without a hierarchical namespace (``storage.azure.endpoint``,
docs/storage.md).
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from lakesink.errors import ServiceError
from lakesink.local.services import LocalService, free_port, port_open, stop_process, tail
from lakesink.runtime.jars import repo_root


def azurite_binary() -> Path:
    path = repo_root() / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if not path.exists():
        raise ServiceError("Azurite is missing: run scripts/setup.sh (needs Node.js and npm)")
    return path


class Azurite(LocalService):
    """``with Azurite(container="lake") as az: ... az.base("t") ... az.storage() ...``"""

    def __init__(self, *, container: str = "lake", account: str = "lakesinkdev",
                 start_timeout_s: float = 60.0) -> None:
        self.container = container
        self.account = account
        self.key = base64.b64encode(secrets.token_bytes(64)).decode()
        self.work_dir = Path(tempfile.mkdtemp(prefix="lakesink-azurite-"))
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.work_dir / "azurite.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def base(self, path: str = "") -> str:
        """The ``abfs://`` URI of ``path`` in the container (plain HTTP, as Azurite)."""
        return f"abfs://{self.container}@{self.account}.dfs.core.windows.net/{path}".rstrip("/")

    def storage(self) -> dict[str, str]:
        """lakesink's ``storage.azure`` section for this server, but the key (a secret:
        :meth:`env`)."""
        return {"account": self.account, "endpoint": self.endpoint}

    def env(self) -> dict[str, str]:
        """The account key, as lakesink takes secrets: from the environment."""
        return {"LAKESINK_STORAGE__AZURE__ACCOUNT_KEY": self.key}

    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={self.account};"
                f"AccountKey={self.key};BlobEndpoint={self.endpoint}/{self.account};")

    def container_client(self) -> Any:  # noqa: ANN401 - azure.storage.blob.ContainerClient
        from azure.storage.blob import ContainerClient

        return ContainerClient(f"{self.endpoint}/{self.account}", self.container,
                               credential={"account_name": self.account,
                                           "account_key": self.key})

    def delta_rs_options(self) -> dict[str, str]:
        """``storage_options`` for delta-rs (``deltalake``) against this server."""
        return {"azure_storage_account_name": self.account,
                "azure_storage_account_key": self.key,
                "azure_storage_endpoint": f"{self.endpoint}/{self.account}",
                "allow_http": "true"}

    def duckdb(self) -> Any:  # noqa: ANN401 - a duckdb connection
        """A DuckDB connection that reads this server (the ``azure`` extension from the
        ``duckdb-ext-azure`` wheel: nothing is downloaded); paths ``az://<container>/…``."""
        import duckdb
        import duckdb_ext

        ext = next(Path(list(duckdb_ext.__path__)[0]).rglob("azure.duckdb_extension"))
        con = duckdb.connect()
        con.execute(f"LOAD '{ext}'")
        con.execute("SET azure_transport_option_type = 'curl'")
        con.execute(f"CREATE SECRET lakesink_az (TYPE azure, "
                    f"CONNECTION_STRING '{self.connection_string()}')")
        return con

    def start(self) -> Azurite:
        if self.process is not None:
            return self
        self.port = self.port or free_port()
        cmd = [str(azurite_binary()), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
               "--location", str(self.work_dir / "data"), "--skipApiVersionCheck", "--loose",
               "--disableTelemetry"]
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{self.account}:{self.key}"}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if port_open(self.port):
                try:
                    client = self.container_client()
                    if not client.exists():
                        client.create_container()
                    return self
                except Exception:  # noqa: BLE001 - not ready yet
                    pass
            time.sleep(0.2)
        self.stop(keep_data=True)
        raise ServiceError(f"Azurite did not start; log {self.log_path}:\n{tail(self.log_path)}")

    def stop(self, *, keep_data: bool = False) -> None:
        proc, self.process = self.process, None
        stop_process(proc, grace_s=10)
        if not keep_data:
            shutil.rmtree(self.work_dir, ignore_errors=True)
