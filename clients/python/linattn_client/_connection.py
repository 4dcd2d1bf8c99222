"""How a Client connects: TLS files and the API key (not part of the API).

The same rules as the command-line clients' connection flags
(clients/common/connection.h): the TLS files are PEM, a client certificate
and its key go together, and the key is sent as `authorization: Bearer KEY`
on every call, over TLS or plaintext alike.
"""
import collections
import os

import grpc

API_KEY_ENV = "LINATTN_API_KEY"
AUTHORIZATION_METADATA = "authorization"

# PEM files and keys are small; the bound keeps a path such as /dev/zero
# given by mistake from being read without end.
_MAX_FILE_BYTES = 1 << 20


def read_pem(name, path):
    """The bytes of the PEM file path, given as the keyword name. Raises
    OSError (naming name and path) when it cannot be read, ValueError when it
    is empty, too large or not PEM: a file that is not PEM would otherwise
    fail only at the handshake, as an opaque UNAVAILABLE."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE_BYTES + 1)
    except OSError as e:
        raise type(e)(e.errno, f"{name}: {e.strerror}", path) from None
    if not data:
        raise ValueError(f"{name}: {path} is empty")
    if len(data) > _MAX_FILE_BYTES:
        raise ValueError(f"{name}: {path} is larger than {_MAX_FILE_BYTES} bytes, "
                         "which no certificate or key is")
    if b"-----BEGIN " not in data:
        raise ValueError(f"{name}: {path} is not PEM (no -----BEGIN line)")
    return data


def check_api_key(key, source):
    """Raises ValueError unless key arrives unchanged as an HTTP header value:
    gRPC refuses metadata outside printable ASCII, and an HTTP peer (a proxy
    in front of the server) drops a leading space. The key itself is never
    part of the message."""
    for i, c in enumerate(key):
        if not " " <= c <= "~":
            raise ValueError(f"{source}: the API key has a character an HTTP header value "
                             f"cannot carry at position {i} (a key is printable ASCII)")
    if key.startswith(" "):
        raise ValueError(f"{source}: the API key starts with a space, which HTTP would drop")


def resolve_api_key(api_key):
    """The key to send: api_key as given ("" = none), or with None the
    environment's LINATTN_API_KEY (trailing whitespace removed; unset or
    empty = none)."""
    if api_key is None:
        api_key = os.environ.get(API_KEY_ENV, "").rstrip()
        source = API_KEY_ENV
    else:
        source = "api_key"
    if not isinstance(api_key, str):
        raise TypeError(f"api_key: expected a str, got {type(api_key).__name__}")
    check_api_key(api_key, source)
    return api_key


class _CallDetails(
        collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                "wait_for_ready", "compression")),
        grpc.ClientCallDetails):
    """A call's details with other metadata (grpc.ClientCallDetails is only
    an interface)."""


class BearerInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer KEY` to the metadata of every call.

    An interceptor rather than grpc.access_token_call_credentials: gRPC
    refuses call credentials on a plaintext channel, and a key must also work
    over plaintext to a server on loopback."""

    def __init__(self, api_key):
        self._entry = (AUTHORIZATION_METADATA, f"Bearer {api_key}")

    def _details(self, details):
        metadata = list(details.metadata or ())
        metadata.append(self._entry)
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def open_channel(target, *, credentials, options, tls_ca, tls_cert, tls_key, tls_server_name,
                 api_key):
    """The channel a Client uses: see Client's docstring for the rules."""
    tls = any(x is not None for x in (tls_ca, tls_cert, tls_key, tls_server_name))
    if tls and credentials is not None:
        raise ValueError("credentials and tls_ca/tls_cert/tls_key/tls_server_name are "
                         "exclusive: pass grpc.ChannelCredentials or the TLS files, not both")
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together: a client certificate needs its "
                         "private key, and a key its certificate")
    options = list(options)
    if tls:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read_pem("tls_ca", tls_ca) if tls_ca is not None else None,
            private_key=read_pem("tls_key", tls_key) if tls_key is not None else None,
            certificate_chain=read_pem("tls_cert", tls_cert) if tls_cert is not None else None)
        if tls_server_name is not None:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
    key = resolve_api_key(api_key)
    if credentials is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        channel = grpc.secure_channel(target, credentials, options=options)
    if key:
        # The intercepted channel closes the one beneath it, so it is the only
        # channel a Client keeps.
        channel = grpc.intercept_channel(channel, BearerInterceptor(key))
    return channel
