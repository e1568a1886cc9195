"""The Quix platform's broker connection, asked of its Portal API.

On Quix Cloud a deployment gets no broker variables besides an optional
``Quix__Broker__Address``: quixstreams (and so the Quix sink) fetches the workspace's
librdkafka settings from the Portal API with the deployment's ``Quix__Sdk__Token``:

    GET {Quix__Portal__Api}/workspaces/{Quix__Workspace__Id}/broker/librdkafka
    Authorization: Bearer <token>, X-Version: 2.0

and decodes the base64 ``ssl.ca.cert`` it may hold. lakesink's Quix surface does the
same, once at start, and maps the librdkafka settings to the Java client's
(:func:`java_settings`). The password reaches the config only as an environment
variable (``LAKESINK_SOURCE__KAFKA__SASL__PASSWORD``), never as a setting, so
``--print-config`` and the logs never show it. ``Quix__Broker__Address`` wins over the
token, as in quixstreams.
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from lakesink.errors import ConfigError, SourceError

DEFAULT_PORTAL_API = "https://portal-api.platform.quix.io/"
PASSWORD_ENV = "LAKESINK_SOURCE__KAFKA__SASL__PASSWORD"
#: librdkafka settings of the Portal's answer with the same name and meaning in Java
_SAME = ("connections.max.idle.ms", "metadata.max.age.ms", "request.timeout.ms",
         "client.id")
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def fetch(env: Mapping[str, str], *, timeout_s: float = 30) -> dict[str, Any]:
    """The workspace's librdkafka settings from the Portal API (``Quix__Sdk__Token``)."""
    token = (env.get("Quix__Sdk__Token") or "").strip()
    workspace = (env.get("Quix__Workspace__Id") or "").strip()
    if not workspace:
        raise ConfigError("Quix__Workspace__Id", "the Portal API's broker settings are per "
                          "workspace: set Quix__Workspace__Id (or Quix__Broker__Address / "
                          "KAFKA_BOOTSTRAP_SERVERS)")
    portal = (env.get("Quix__Portal__Api") or DEFAULT_PORTAL_API).strip()
    url = urllib.parse.urljoin(portal if portal.endswith("/") else portal + "/",
                               f"workspaces/{urllib.parse.quote(workspace)}/broker/librdkafka")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https" and not (parts.scheme == "http" and parts.hostname in (
            "127.0.0.1", "localhost", "::1")):
        raise ConfigError("Quix__Portal__Api", f"{portal}: the token is sent only over "
                          "https (http only to this machine)")
    request = urllib.request.Request(url, headers={
        "Authorization": f"Bearer {token}", "X-Version": "2.0", "Accept": "application/json"})
    opener = urllib.request.build_opener(_NoRedirect)  # the token stays with this host
    try:
        with opener.open(request, timeout=timeout_s) as answer:
            data = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise ConfigError("Quix__Sdk__Token", f"the Quix Portal API at {portal} refused "
                              f"the token (HTTP {exc.code})") from None
        raise SourceError(f"Quix__Portal__Api: {url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"Quix__Portal__Api: cannot reach {portal}: {reason}") from None
    except ValueError:
        raise SourceError(f"Quix__Portal__Api: {url} did not answer JSON") from None
    if not isinstance(data, dict) or not data.get("bootstrap.servers"):
        raise SourceError(f"Quix__Portal__Api: {url} gave no bootstrap.servers")
    return data


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error (urllib would send the bearer token to its target)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401, ARG002
        return None


def java_settings(rdkafka: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str],
                                                        list[str]]:
    """(``source.kafka`` settings, environment variables for its secrets, the settings
    not carried over) for librdkafka settings as the Portal gives them."""
    rd = {str(k): "" if v is None else str(v) for k, v in rdkafka.items()}
    kafka: dict[str, Any] = {"bootstrap_servers": rd.pop("bootstrap.servers")}
    options: dict[str, str] = {}
    env: dict[str, str] = {}
    protocol = rd.pop("security.protocol", "").upper()
    if protocol:
        if protocol not in _PROTOCOLS:
            raise SourceError(f"Quix__Portal__Api: security.protocol {protocol!r} is not "
                              f"one of {', '.join(_PROTOCOLS)}")
        options["security.protocol"] = protocol
    mechanism = (rd.pop("sasl.mechanism", "") or rd.pop("sasl.mechanisms", "")).upper()
    rd.pop("sasl.mechanisms", None)
    username, password = rd.pop("sasl.username", ""), rd.pop("sasl.password", "")
    if protocol.startswith("SASL") or mechanism or username:
        if (mechanism or "PLAIN") not in _MECHANISMS:
            raise SourceError(f"Quix__Portal__Api: SASL mechanism {mechanism!r} is not "
                              f"supported ({', '.join(_MECHANISMS)})")
        kafka["sasl"] = {"mechanism": mechanism or "PLAIN", "username": username or None}
        if password:
            env[PASSWORD_ENV] = password
    ca = rd.pop("ssl.ca.cert", "") or rd.pop("ssl.ca.pem", "")
    rd.pop("ssl.ca.pem", None)
    if ca:
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.certificates"] = _pem(ca)
    if rd.pop("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        options["ssl.endpoint.identification.algorithm"] = ""
    for key in _SAME:
        if rd.get(key):
            options[key] = rd.pop(key)
    if options:
        kafka["options"] = options
    return kafka, env, sorted(rd)


def _pem(value: str) -> str:
    """The CA as PEM text: the Portal gives it base64-encoded (quixstreams decodes it)."""
    if "-----BEGIN" in value:
        return value
    try:
        text = base64.b64decode(value, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        raise SourceError("Quix__Portal__Api: ssl.ca.cert is neither PEM nor base64 "
                          "PEM") from None
    if "-----BEGIN" not in text:
        raise SourceError("Quix__Portal__Api: ssl.ca.cert is not a PEM certificate")
    return text
