"""KServe v2 front ends (HTTP and gRPC) with Triton's shared-memory extensions.

Layering: ``server -> host``. Codecs turn wire requests into :mod:`stubhost.server.types`
values; the apps run them through :class:`stubhost.host.server.Server`.
"""
