"""moto's server, with every request handled under one lock.

DynamoDB makes each conditional write atomic: two PutItems on one key with
`attribute_not_exists(pk)` never both succeed. moto's server handles each
request on a thread of its own and evaluates a condition, then writes,
with no lock between: under concurrency two conditional writes can both
pass (seen: two claims of one key both won). A stub kinder or crueler than
what it stands for hides bugs or invents them, so the emulator serializes
its requests here, as the real service's per-item atomicity does (moto's
own `moto_server`, with the same handler, otherwise).

    python scripts/dynamodb-emulator-serve.py HOST PORT
"""

import sys
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    inner = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serialized(environ, start_response):
        with lock:
            # The whole response is produced under the lock.
            return list(inner(environ, start_response))

    run_simple(
        host, port, serialized, threaded=True, request_handler=MotoRequestHandler
    )


if __name__ == "__main__":
    main()
