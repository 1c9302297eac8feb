"""The peer side of the side-by-side run (scripts/peer-redis): AWS Lambda
Powertools' idempotent_function with its Redis persistence layer, against the
same Redis as idem-tests/benches/peer_redis.rs.

    python peer-redis-powertools.py HOST PORT CALLS
    python peer-redis-powertools.py HOST PORT CALLS fill

Warms up, then makes CALLS first calls (fresh arguments each: claim, run,
complete) and CALLS replays (the same arguments again), alternating, and
prints one JSON object: {"first": [µs, ...], "replay": [µs, ...],
"handler_calls": n, "version": "..."}. The handler is a no-op, as on the idem
side. Needs AWS_DEFAULT_REGION set (any value).

With `fill` (idem-tests/benches/record_bytes.rs): CALLS first calls only, no warm-up,
and {"handler_calls": n, "version": "...", "pattern": "..."}, the pattern
matching every key they wrote, for the bench to delete them.
"""

import json
import sys
import time
import uuid
import warnings

from aws_lambda_powertools.shared.version import VERSION
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

host, port, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fill_only = sys.argv[4:] == ["fill"]

# 3.x warns that its own CachePersistenceLayer alias will be renamed.
warnings.filterwarnings("ignore", category=DeprecationWarning)

layer = CachePersistenceLayer(host=host, port=port, ssl=False)
config = IdempotencyConfig(expires_after_seconds=900)
handler_calls = 0


@idempotent_function(data_keyword_argument="args", persistence_store=layer, config=config)
def charge(args: dict):
    global handler_calls
    handler_calls += 1
    return {"receipt": "r_" + args["card"], "amount_cents": args["amount_cents"]}


class Context:
    function_name = "peer_redis"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:us-east-1:1:function:peer_redis"
    aws_request_id = "peer"

    def get_remaining_time_in_millis(self):
        return 300000


config.register_lambda_context(Context())


def fresh():
    return {"card": "c_" + uuid.uuid4().hex, "amount_cents": 1999, "currency": "usd"}


if fill_only:
    for _ in range(calls):
        charge(args=fresh())
    pattern = layer.function_name + "#*"
    print(json.dumps({"handler_calls": handler_calls, "version": VERSION, "pattern": pattern}))
    sys.exit(0)


def timed(args):
    t = time.perf_counter()
    charge(args=args)
    return (time.perf_counter() - t) * 1e6


same = fresh()
for _ in range(300):
    timed(fresh())
    timed(same)
first, replay = [], []
for _ in range(calls):
    first.append(timed(fresh()))
    replay.append(timed(same))
print(json.dumps({"first": first, "replay": replay, "handler_calls": handler_calls, "version": VERSION}))
