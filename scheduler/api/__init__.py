"""The synchronous API, ``scheduler.v1.SchedulerService``: one application service (:mod:`.service`)
served over two transports, gRPC (:mod:`.grpc_server`) and HTTP/JSON (:mod:`.http_server`), from the
one protobuf definition in ``proto/scheduler/v1/scheduler.proto``.

Every call is authenticated (:mod:`.auth`, JWT bearer tokens), authorised by role and scoped to the
apps its token names, rate-limited per principal (:mod:`.limits`), and, for creates, triggers and
replays, idempotent under a key (:mod:`.idempotency`). Both transports hand the same request
message to the same method and return the same message, or the same :class:`~.errors.ApiError`.
"""
