"""The side-by-side run on DynamoDB (scripts/peer-dynamodb): idem's
DynamoDbStore (idem-tests/src/bin/peer_dynamodb.rs) and AWS Lambda Powertools'
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

The proxy also counts capacity units, since the emulator cannot: moto
answers `CapacityUnits: 1.0` for every call whatever the item or the
indexes. It computes them by DynamoDB's documented rules (the developer
guide's "Read/write capacity mode" and "Provisioned throughput
considerations for global secondary indexes"), from each request, the
table's definition and the item before and after the write (read straight
from the emulator, strongly consistent, under a lock that keeps the
counted writes one at a time):

- a PutItem, UpdateItem or DeleteItem: 1 write unit per KB of the larger
  of the item before and after; refused by its condition, 1 per KB of the
  item as it stands (at least 1); in a TransactWriteItems, twice that;
- each global secondary index, for a write that went through: an entry
  added 1 (per KB of the entry), removed 1, its key changed 2 (remove and
  add), the same key with a projected attribute changed 1, otherwise 0;
- a GetItem: 1 read unit per 4 KB of the item (at least 1), half when
  eventually consistent; a BatchGetItem the same for each key; a Query or
  Scan: 1 per 4 KB of the items it returns together (at least 1), half
  when eventually consistent (an index is always).

Both sides run twice: with their local caches off, then on (idem's
`Executor::with_replay_cache`, Powertools' `use_local_cache`).
"""

import base64
import http.client
import http.server
import json
import math
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
from dynamodb_wire import Emulator, wire_item_size, written

emulator, calls, idem_binary = sys.argv[1], int(sys.argv[2]), sys.argv[3]
target = urllib.parse.urlparse(emulator)
warnings.filterwarnings("ignore", category=DeprecationWarning)

COUNTS = {}
LOCK = threading.Lock()
# Writes are forwarded one at a time, so that the item read before and
# after each is the one that write changed.
WRITES = threading.Lock()
EMULATOR = Emulator(emulator)


def raw(op, payload):
    """One request straight to the emulator, not counted."""
    return EMULATOR.call(op, payload)


def table(name):
    """The table's key and its indexes."""
    return EMULATOR.table(name)


def current(name, key):
    return EMULATOR.current(name, key)


def kb(size, unit):
    return max(1, math.ceil(size / unit))


def index_units(name, before, after):
    """Write units of a table write's global secondary indexes."""
    units = 0
    for index in table(name).indexes.values():
        old, new = index.entry(before), index.entry(after)
        if old is None and new is None:
            continue
        if old is None:
            units += kb(wire_item_size(new), 1024)
        elif new is None:
            units += kb(wire_item_size(old), 1024)
        elif any(old[k] != new[k] for k in index.keys):
            units += kb(wire_item_size(old), 1024) + kb(wire_item_size(new), 1024)
        elif old != new:
            units += kb(wire_item_size(new), 1024)
    return units


def item_key(name, request):
    return written(table(name), request)


def read_units(op, request, reply):
    consistent = 1 if request.get("ConsistentRead") else 0.5
    if op == "GetItem":
        return kb(wire_item_size(reply.get("Item")), 4096) * consistent
    if op == "BatchGetItem":
        units = 0
        for name, asked in request["RequestItems"].items():
            half = 1 if asked.get("ConsistentRead") else 0.5
            for item in reply.get("Responses", {}).get(name, []):
                units += kb(wire_item_size(item), 4096) * half
            found = len(reply.get("Responses", {}).get(name, []))
            units += (len(asked["Keys"]) - found) * half
        return units
    if op in ("Query", "Scan"):
        if "IndexName" in request:
            consistent = 0.5
        return kb(sum(wire_item_size(i) for i in reply.get("Items", [])), 4096) * consistent
    return 0


def counted(op, body, forward):
    """Forwards the request; returns (status, reply bytes, write units,
    read units)."""
    request = json.loads(body or b"{}")
    writes = {"PutItem": "Put", "UpdateItem": "Update", "DeleteItem": "Delete"}
    if op in writes or op == "TransactWriteItems":
        with WRITES:
            if op == "TransactWriteItems":
                parts = []
                for t in request["TransactItems"]:
                    (kind, part), = t.items()
                    parts.append((kind, part["TableName"], item_key(part["TableName"], part)))
                factor = 2
            else:
                parts = [(writes[op], request["TableName"], item_key(request["TableName"], request))]
                factor = 1
            before = [current(name, key) for _, name, key in parts]
            status, data = forward()
            after = [current(name, key) for _, name, key in parts]
        ok = status == 200
        wcu = 0
        for (kind, name, _), b, a in zip(parts, before, after):
            if kind == "ConditionCheck":
                wcu += factor * kb(wire_item_size(b), 1024)
            elif ok:
                wcu += factor * kb(max(wire_item_size(b), wire_item_size(a)), 1024)
                wcu += index_units(name, b, a)
            else:
                # Refused (a condition or a cancelled transaction): the
                # item as it stands is charged, nothing is indexed.
                wcu += factor * kb(wire_item_size(b), 1024)
        return status, data, wcu, 0
    status, data = forward()
    rcu = read_units(op, request, json.loads(data or b"{}")) if status == 200 else 0
    return status, data, 0, rcu


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
        got = {}

        def forward():
            conn.request("POST", self.path, body=body, headers=headers)
            reply = conn.getresponse()
            got["reply"] = reply
            return reply.status, reply.read()

        status, data, wcu, rcu = counted(op, body, forward)
        reply = got["reply"]
        with LOCK:
            COUNTS["WCU"] = COUNTS.get("WCU", 0) + wcu
            COUNTS["RCU"] = COUNTS.get("RCU", 0) + rcu
        self.send_response(status)
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



class Context:
    function_name = "peer_dynamodb"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:us-east-1:1:function:peer_dynamodb"
    aws_request_id = "peer"

    def get_remaining_time_in_millis(self):
        return 300000


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


direct = client(emulator)
handler_calls = 0


# --- Powertools ---------------------------------------------------------
def powertools(use_local_cache):
    """Powertools' three paths on a table of its own; the table's name."""
    global handler_calls
    table_name = "powertools-" + uuid.uuid4().hex[:8]
    direct.create_table(
        TableName=table_name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    layer = DynamoDBPersistenceLayer(table_name=table_name, boto3_client=client(proxy))
    config = IdempotencyConfig(expires_after_seconds=900, use_local_cache=use_local_cache)
    release = threading.Event()

    def instance(persistence):
        """The decorated handler on one instance's layer: the same
        function's name on every instance, as Powertools' key includes it."""

        @idempotent_function(data_keyword_argument="args", persistence_store=persistence, config=config)
        def charge(args: dict):
            global handler_calls
            handler_calls += 1
            if args.get("hold"):
                release.wait(30)
            return {"receipt": "r_" + args["card"], "amount_cents": args["amount_cents"]}

        return charge

    charge = instance(layer)
    config.register_lambda_context(Context())
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

        # Another instance: a layer of its own (its own local cache).
        elsewhere = instance(DynamoDBPersistenceLayer(table_name=table_name, boto3_client=client(proxy)))

        def repeat():
            try:
                elsewhere(args=held)
                raise SystemExit("the repeat answered: expected IdempotencyAlreadyInProgressError")
            except IdempotencyAlreadyInProgressError:
                pass

        pt["in_progress"].append(measured(repeat))
        release.set()
        first.join()
    return pt, table_name


# --- idem -----------------------------------------------------------------
def idem(cache_bytes):
    table_name = "idem-peer-" + uuid.uuid4().hex[:8]
    out = subprocess.run(
        [idem_binary, proxy, f"{proxy}/__counts", table_name, str(calls), str(cache_bytes)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1]), table_name


# 64 MiB: far more than the run's responses; Powertools' cache holds 256
# records by default, also more than one path's calls at the default 200.
runs = {}
for cache in (False, True):
    pt, pt_table = powertools(cache)
    ours, idem_table = idem(64 << 20 if cache else 0)
    runs[cache] = (ours, pt, idem_table, pt_table)


# --- bytes per record ---------------------------------------------------------
def sizes(table_name, keep):
    """Each kept item's size, read in the wire form the proxy sizes."""
    items, start = [], None
    while True:
        _, page = raw("Scan", {"TableName": table_name} | ({"ExclusiveStartKey": start} if start else {}))
        items += [i for i in page["Items"] if keep(i)]
        start = page.get("LastEvaluatedKey")
        if not start:
            return [wire_item_size(i) for i in items]


_, _, idem_table, pt_table = runs[False]
pt_sizes = sizes(pt_table, lambda i: i.get("status", {}).get("S") == "COMPLETED")
idem_sizes = sizes(idem_table, lambda i: base64.b64decode(i["sk"]["B"])[:1] == b"r" and i.get("st", {}).get("N") == "1")
for _, _, a, b in runs.values():
    direct.delete_table(TableName=a)
    direct.delete_table(TableName=b)


def round_trips(d):
    ops = {k: v for k, v in d.items() if k not in ("WCU", "RCU")}
    return f"{sum(ops.values()):g} ({', '.join(f'{k} {v:g}' for k, v in ops.items())})" if ops else "0"


def units(d):
    return f"{d.get('WCU', 0):g} WCU, {d.get('RCU', 0):g} RCU"


avg = lambda xs: sum(xs) / len(xs)
print(f"Powertools {VERSION}, boto3 {boto3.__version__}; {calls} calls a path "
      f"({min(calls, 20)} in-progress repeats); handler runs: Powertools {handler_calls}, "
      f"idem {sum(r[0]['handler_runs'] for r in runs.values())}")
print()
print("| path | local caches | idem: units | Powertools: units | idem: round trips | Powertools: round trips |")
print("| --- | --- | --- | --- | --- | --- |")
for cache, (ours, pt, _, _) in runs.items():
    rows = [
        ("first call", per_call(ours["first"]), per_call(pt["first"])),
        ("replay, same instance", per_call(ours["replay"]), per_call(pt["replay"])),
        ("in-progress repeat, another instance", per_call(ours["in_progress"]), per_call(pt["in_progress"])),
    ]
    on = "on" if cache else "off"
    for name, i, p in rows:
        print(f"| {name} | {on} | {units(i)} | {units(p)} | {round_trips(i)} | {round_trips(p)} |")
    same = per_call(ours["in_progress_same"])
    print(f"| in-progress repeat, same instance | {on} | {units(same)} | (no such path) | {round_trips(same)} | |")
    upkeep = ours["maintenance"]
    print(f"| sweep and purge once leases ended, per record | {on} | {units(upkeep)} | (no sweep; TTL deletes) | "
          f"{round_trips(upkeep)} | |")
print(f"| bytes per COMPLETED record (DynamoDB's item size) | | {avg(idem_sizes):.0f} | {avg(pt_sizes):.0f} | | |")
print()
print(json.dumps({
    ("cache_on" if cache else "cache_off"): {
        "idem": {k: per_call(v) for k, v in ours.items() if isinstance(v, list)} | {"maintenance": ours["maintenance"]},
        "powertools": {k: per_call(v) for k, v in pt.items()},
    } for cache, (ours, pt, _, _) in runs.items()
} | {"bytes": {"idem": avg(idem_sizes), "powertools": avg(pt_sizes)}}))
server.shutdown()
