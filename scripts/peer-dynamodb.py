"""The side-by-side run on DynamoDB (scripts/peer-dynamodb): idem's
DynamoDbStore (src/bin/peer_dynamodb.rs) and AWS Lambda Powertools'
DynamoDBPersistenceLayer, against the same emulator, in one run, through one
counting HTTP proxy.

    python peer-dynamodb.py EMULATOR_URL CALLS IDEM_BINARY

The proxy forwards every request to the emulator and counts it by its
X-Amz-Target (GetItem, PutItem, UpdateItem, ...): the round trips each side
needs, per first call, per replay and per in-progress repeat (a repeat while
the first call's handler still runs, from another instance, as a second
Lambda would send it). Then both tables are read straight from the emulator
and each record's size is taken by DynamoDB's own rule (attribute names'
bytes plus values': a string's UTF-8 bytes, a binary's bytes, a number's
significant digits / 2 + 1, a boolean 1), which is what a write unit and
storage are charged on. Prints the table for BENCHMARKS.md, and the raw
counts as JSON.
"""

import http.client
import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
import warnings

import boto3
from aws_lambda_powertools.shared.version import VERSION
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
)

emulator, calls, idem_binary = sys.argv[1], int(sys.argv[2]), sys.argv[3]
target = urllib.parse.urlparse(emulator)
warnings.filterwarnings("ignore", category=DeprecationWarning)

COUNTS = {}
LOCK = threading.Lock()


class Proxy(http.server.BaseHTTPRequestHandler):
    """Forwards a request to the emulator, counting it by its target."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        # /__counts: what was sent so far, for the idem side.
        with LOCK:
            body = json.dumps(COUNTS).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        op = self.headers.get("X-Amz-Target", "?").split(".")[-1]
        with LOCK:
            COUNTS[op] = COUNTS.get(op, 0) + 1
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        headers["Host"] = f"{target.hostname}:{target.port}"
        conn.request("POST", self.path, body=body, headers=headers)
        reply = conn.getresponse()
        data = reply.read()
        self.send_response(reply.status)
        for k, v in reply.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        conn.close()


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
threading.Thread(target=server.serve_forever, daemon=True).start()
proxy = f"http://127.0.0.1:{server.server_address[1]}"


def snapshot():
    with LOCK:
        return dict(COUNTS)


def diff(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def client(endpoint):
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


# --- Powertools ---------------------------------------------------------
direct = client(emulator)
pt_table = "powertools-" + uuid.uuid4().hex[:8]
direct.create_table(
    TableName=pt_table,
    KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
    AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
    BillingMode="PAY_PER_REQUEST",
)
layer = DynamoDBPersistenceLayer(table_name=pt_table, boto3_client=client(proxy))
config = IdempotencyConfig(expires_after_seconds=900)
release = threading.Event()
handler_calls = 0


@idempotent_function(data_keyword_argument="args", persistence_store=layer, config=config)
def charge(args: dict):
    global handler_calls
    handler_calls += 1
    if args.get("hold"):
        release.wait(30)
    return {"receipt": "r_" + args["card"], "amount_cents": args["amount_cents"]}


class Context:
    function_name = "peer_dynamodb"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:us-east-1:1:function:peer_dynamodb"
    aws_request_id = "peer"

    def get_remaining_time_in_millis(self):
        return 300000


config.register_lambda_context(Context())


def fresh(hold=False):
    return {"card": "c_" + uuid.uuid4().hex, "amount_cents": 1999, "currency": "usd", "hold": hold}


def measured(fn):
    before = snapshot()
    fn()
    return diff(before, snapshot())


def per_call(diffs):
    total = {}
    for d in diffs:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return {k: v / len(diffs) for k, v in sorted(total.items())}


charge(args=fresh())  # the client's first connection, not measured
args = [fresh() for _ in range(calls)]
pt = {"first": [], "replay": [], "in_progress": []}
for a in args:
    pt["first"].append(measured(lambda: charge(args=a)))
for a in args:
    pt["replay"].append(measured(lambda: charge(args=a)))
for _ in range(min(calls, 20)):
    release.clear()
    held = fresh(hold=True)
    first = threading.Thread(target=lambda: charge(args=held))
    first.start()
    time.sleep(0.2)  # the first call's claim is written and its handler waits

    def repeat():
        try:
            charge(args=held)
            raise SystemExit("the repeat ran: expected IdempotencyAlreadyInProgressError")
        except IdempotencyAlreadyInProgressError:
            pass

    pt["in_progress"].append(measured(repeat))
    release.set()
    first.join()

# --- idem -----------------------------------------------------------------
idem_table = "idem-peer-" + uuid.uuid4().hex[:8]
out = subprocess.run(
    [idem_binary, proxy, f"{proxy}/__counts", idem_table, str(calls)],
    check=True,
    capture_output=True,
    text=True,
).stdout
idem = json.loads(out.strip().splitlines()[-1])


# --- bytes per record ---------------------------------------------------------
def number_size(n):
    digits = n.lstrip("-").replace(".", "").strip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def value_size(v):
    (kind, x), = v.items()
    if kind == "S":
        return len(x.encode())
    if kind == "N":
        return number_size(x)
    if kind == "B":
        return len(x)
    if kind in ("BOOL", "NULL"):
        return 1
    raise ValueError(kind)


def item_size(item):
    return sum(len(k.encode()) + value_size(v) for k, v in item.items())


def sizes(table, keep):
    items, start = [], None
    while True:
        page = direct.scan(TableName=table, **({"ExclusiveStartKey": start} if start else {}))
        items += [i for i in page["Items"] if keep(i)]
        start = page.get("LastEvaluatedKey")
        if not start:
            return [item_size(i) for i in items]


pt_sizes = sizes(pt_table, lambda i: i.get("status", {}).get("S") == "COMPLETED")
idem_sizes = sizes(idem_table, lambda i: i["sk"]["B"][:1] == b"r" and i.get("st", {}).get("N") == "1")
direct.delete_table(TableName=pt_table)
direct.delete_table(TableName=idem_table)


def total(d):
    return sum(d.values())


def cell(d):
    ops = ", ".join(f"{k} {v:g}" for k, v in d.items())
    return f"{total(d):g} ({ops})"


rows = [
    ("first call", per_call(idem["first"]), per_call(pt["first"])),
    ("replay", per_call(idem["replay"]), per_call(pt["replay"])),
    ("in-progress repeat, another instance", per_call(idem["in_progress"]), per_call(pt["in_progress"])),
]
print(f"Powertools {VERSION}, boto3 {boto3.__version__}; {calls} calls a path "
      f"({min(calls, 20)} in-progress repeats); handler runs: Powertools {handler_calls}, idem {idem['handler_runs']}")
print()
print("| path | idem (DynamoDbStore) | Powertools (DynamoDBPersistenceLayer) |")
print("| --- | --- | --- |")
for name, i, p in rows:
    print(f"| {name}: round trips | {cell(i)} | {cell(p)} |")
print(f"| in-progress repeat, same instance: round trips | {cell(per_call(idem['in_progress_same']))} | (no such path) |")
avg = lambda xs: sum(xs) / len(xs)
print(f"| bytes per COMPLETED record (DynamoDB's item size) | {avg(idem_sizes):.0f} | {avg(pt_sizes):.0f} |")
print()
print(json.dumps({"idem": {k: per_call(v) for k, v in idem.items() if isinstance(v, list)},
                  "powertools": {k: per_call(v) for k, v in pt.items()},
                  "bytes": {"idem": avg(idem_sizes), "powertools": avg(pt_sizes)}}))
server.shutdown()
