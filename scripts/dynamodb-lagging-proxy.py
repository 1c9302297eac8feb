"""A proxy in front of the DynamoDB emulator whose global secondary indexes
and eventually consistent reads trail the writes, as DynamoDB's do.

    python scripts/dynamodb-lagging-proxy.py EMULATOR_URL PORT [--index-lag SPEC] [--read-lag SPEC]

moto's indexes are exact: a query of an index sees every write before it.
DynamoDB's global secondary indexes are updated asynchronously (typically
well under a second, occasionally longer), and a read that is not strongly
consistent may be served by a replica behind the latest write. This proxy
sees every write on its way to the emulator and records what it left in
each item it names (a Put's item, a Delete's absence, an Update's new
item as the emulator answers it, or read back strongly consistent in a
transaction; nothing when a condition refused it), and
keeps, per table and per index, the history of those images:

- an index: each write that changes what the index holds of its item (the
  item entering or leaving it, its keys or a projected attribute changing)
  reaches the index only after a delay of its own, drawn from the index
  lag. A `Query` with `IndexName` is answered here, from what has reached
  the index: for each item, the last write (in write order) that has; so an
  entry appears late, a moved entry shows its old key for a while, and one
  item's entry may show before that of an item written earlier. The key
  condition, `Limit`, `ExclusiveStartKey`, `ScanIndexForward`, `Select`
  `COUNT`, the 1 MB page and the index's projection are applied here as
  DynamoDB applies them; a `BETWEEN` whose bounds are reversed, or a
  consistent read of the index, is refused with DynamoDB's
  `ValidationException` (moto answers the first with nothing).
- a read that is not strongly consistent: `GetItem` and `BatchGetItem`
  without `ConsistentRead` are answered here with each item as it stood a
  delay ago, drawn from the read lag for each item (each key of a batch
  may sit on a replica of its own).

Everything else passes through: writes, strongly consistent reads, table
`Query` and `Scan` (idem sends none without `ConsistentRead`), table
management. A feature of a lagged request it does not model (a filter or
projection expression on an index query, PartiQL) is refused with a
`ValidationException` that says so, rather than answered wrong. Every
write must go through the proxy: a table first seen mid-life is read
whole once (as visible everywhere), and a write that went straight to the
emulator after that is never seen by its indexes here.

SPEC is `[MIN_MS..]MAX_MS[,TAIL_P,TAIL_MAX_MS]`: each delay is uniform in
MIN_MS..MAX_MS (MIN_MS is 0 unless given), and with probability TAIL_P
uniform in MAX_MS..TAIL_MAX_MS instead (the occasional longer lag).
Defaults: index `150,0.05,400`, read `100,0.05,1000`.

A test sets a table's own lags (a fixed lag to build a case on, indexes
that do not lag): POST /__lag {"table": NAME, "index": SPEC, "read": SPEC,
"exact": [INDEX, ...]}, each but `table` optional; `exact` names the
indexes that show every write at once. GET /__stats answers what the lag
hid so far: `stale_entries` (index entries a query saw as they stood
before a later write), `missing_entries` (entries a query did not see
yet), `stale_reads` (eventually consistent reads answered with an earlier
image than the table's).

scripts/dynamodb-emulator start runs it on IDEM_DYNAMODB_LAGGING_PORT
(default 4568) in front of the emulator; `scripts/dynamodb-emulator
lagging-url` prints its endpoint, which the tests read from
IDEM_TEST_DYNAMODB_LAGGING_ENDPOINT. Standard library only.
"""

import binascii
import decimal
import functools
import http.server
import json
import random
import re
import sys
import threading
import time
import traceback
import uuid

from dynamodb_wire import Emulator, wire_item_size, written

WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}
PAGE_BYTES = 1 << 20


class Lag:
    """A delay distribution, in seconds: uniform below `most`, and with
    probability `tail` uniform from `most` to `tail_most`."""

    def __init__(self, least, most, tail=0.0, tail_most=None):
        self.least, self.most, self.tail = least, most, tail
        self.tail_most = most if tail_most is None else tail_most

    @staticmethod
    def parse(spec):
        """`[MIN_MS..]MAX_MS[,TAIL_P,TAIL_MAX_MS]`; ValueError otherwise."""
        m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)\.\.)?(\d+(?:\.\d+)?)(?:,(0?\.\d+|[01]),(\d+(?:\.\d+)?))?", spec)
        if not m:
            raise ValueError(f"a lag is [MIN_MS..]MAX_MS[,TAIL_P,TAIL_MAX_MS], not {spec!r}")
        least, most, tail, tail_most = m.groups()
        return Lag(float(least or 0) / 1000, float(most) / 1000, float(tail or 0),
                   float(tail_most) / 1000 if tail_most else None)

    def draw(self):
        if self.tail and random.random() < self.tail:
            return random.uniform(self.most, self.tail_most)
        return random.uniform(self.least, self.most)

    def longest(self):
        return max(self.most, self.tail_most)


class Refused(Exception):
    """A request DynamoDB would refuse (or this proxy cannot answer
    faithfully): a 400 with DynamoDB's error type (ValidationException
    unless told) and this message."""

    def __init__(self, message, kind="ValidationException"):
        super().__init__(message)
        self.kind = kind


def key_id(key):
    return json.dumps(key, sort_keys=True)


class Mirror:
    """One table as the proxy saw it written: per item, its images in write
    order (time, image or None) for the reads; per index, per item, what
    each write left in the index (write time, time it reaches the index,
    entry or None)."""

    def __init__(self, table, index_lag, read_lag, exact=()):
        self.table = table
        self.index_lag, self.read_lag = index_lag, read_lag
        # Indexes that show every write at once.
        self.exact = set(exact)
        self.images = {}
        self.entries = {name: {} for name in table.indexes}

    def seed(self, items):
        """Items already in the table: visible everywhere from the start."""
        for item in items:
            k = key_id(self.table.key_of(item))
            self.images[k] = [(float("-inf"), item)]
            for name, index in self.table.indexes.items():
                entry = index.entry(item)
                if entry is not None:
                    self.entries[name][k] = [(float("-inf"), float("-inf"), entry)]

    def write(self, key, image, now):
        """The item `key` as the emulator holds it after a write."""
        k = key_id(key)
        history = self.images.setdefault(k, [])
        if history and history[-1][1] == image:
            return
        history.append((now, image))
        # Older images no read can be served any more.
        horizon = now - self.read_lag.longest()
        while len(history) > 1 and history[1][0] <= horizon:
            history.pop(0)
        for name, index in self.table.indexes.items():
            entry = index.entry(image)
            trail = self.entries[name].get(k, [])
            if (trail[-1][2] if trail else None) == entry:
                continue
            trail = self.entries[name].setdefault(k, trail)
            lag = 0 if name in self.exact else self.index_lag.draw()
            trail.append((now, now + lag, entry))
            # Writes before the last one that reached the index never show again.
            last = max((i for i, e in enumerate(trail) if e[1] <= now), default=0)
            del trail[:last]

    def index_view(self, name, now):
        """Each item's entry in the index as it shows now (from the last
        write that reached it) and as the table has it: pairs (shown,
        latest), either None where the item is not in the index."""
        view = []
        for trail in self.entries[name].values():
            shown = None
            for _, reached, entry in trail:
                if reached <= now:
                    shown = entry
            view.append((shown, trail[-1][2]))
        return view

    def read(self, key, now, stats):
        """The item as a replica `read_lag` behind holds it."""
        history = self.images.get(key_id(key))
        if not history:
            return None
        at = now - self.read_lag.draw()
        image = None
        for written_at, i in history:
            if written_at <= at:
                image = i
        if image != history[-1][1]:
            stats["stale_reads"] += 1
        return image


class Proxy:
    def __init__(self, emulator, index_lag, read_lag):
        self.emulator = emulator
        self.index_lag, self.read_lag = index_lag, read_lag
        self.mirrors = {}
        self.lags = {}
        self.lock = threading.Lock()
        # Writes one at a time, each read back before the next (and a table
        # read whole between two): a mirror's images are in the order the
        # emulator applied them.
        self.writes = threading.RLock()
        self.stats = {"stale_entries": 0, "missing_entries": 0, "stale_reads": 0}

    def mirror(self, name):
        """The table's mirror; a table first seen here is read whole."""
        with self.lock:
            if name in self.mirrors:
                return self.mirrors[name]
        with self.writes:
            with self.lock:
                if name in self.mirrors:
                    return self.mirrors[name]
            table = self.emulator.table(name)
            if table is None:
                return None
            items, start = [], None
            while True:
                scan = {"TableName": name, "ConsistentRead": True}
                if start:
                    scan["ExclusiveStartKey"] = start
                _, page = self.emulator.call("Scan", scan)
                items += page.get("Items", [])
                start = page.get("LastEvaluatedKey")
                if not start:
                    break
            with self.lock:
                lags = self.lags.get(name, (self.index_lag, self.read_lag, ()))
                mirror = self.mirrors[name] = Mirror(table, *lags)
                mirror.seed(items)
                return mirror

    def set_lag(self, request):
        """A table's own lags (POST /__lag): fixed ones a test builds a case
        on, and the indexes that lag not at all."""
        name = request["table"]
        mirror = self.mirror(name)
        with self.lock:
            index_lag, read_lag, exact = self.lags.get(name, (self.index_lag, self.read_lag, ()))
            if "index" in request:
                index_lag = Lag.parse(request["index"])
            if "read" in request:
                read_lag = Lag.parse(request["read"])
            exact = request.get("exact", exact)
            self.lags[name] = (index_lag, read_lag, exact)
            if mirror is not None:
                mirror.index_lag, mirror.read_lag, mirror.exact = index_lag, read_lag, set(exact)

    def forget(self, name):
        self.emulator.forget(name)
        with self.lock:
            self.mirrors.pop(name, None)

    # -- requests --------------------------------------------------------

    def handle(self, op, request, forward):
        """(status, answer): a JSON answer made here, or the emulator's
        answer as bytes, which `forward()` sends for it."""
        if op in WRITES:
            return self.write(op, request, forward)
        if op == "Query" and "IndexName" in request:
            return 200, self.query_index(request)
        if op in ("GetItem", "BatchGetItem"):
            answered = self.eventually_consistent(op, request)
            if answered is not None:
                return 200, answered
        if op in ("ExecuteStatement", "BatchExecuteStatement", "ExecuteTransaction"):
            raise Refused(f"the lagging proxy does not model PartiQL ({op}); send it to the emulator itself")
        status, answer = forward()
        if op in ("CreateTable", "DeleteTable", "UpdateTable") and status == 200:
            self.forget(request.get("TableName", ""))
            if op == "DeleteTable":
                with self.lock:
                    self.lags.pop(request.get("TableName", ""), None)
        return status, answer

    def write(self, op, request, forward):
        """Forwards a write, then records what it left in each item it
        names: a Put's item and a Delete's absence as the request says when
        it went through, an UpdateItem's item as the emulator answers it
        (asked with `ReturnValues` ALL_NEW when the client asked for
        nothing, and answered to the client without it), a transaction's
        Update read back, nothing when a condition refused it (a refused
        transaction changes nothing)."""
        # Asking an update's new item costs DynamoDB nothing more, and saves
        # reading it back.
        ask_new = op == "UpdateItem" and request.get("ReturnValues", "NONE") == "NONE"
        if ask_new:
            request = dict(request, ReturnValues="ALL_NEW")
            forward = functools.partial(forward, json.dumps(request).encode())
        if op == "TransactWriteItems":
            parts = [next(iter(t.items())) for t in request["TransactItems"]]
            named = [(kind, p["TableName"], p) for kind, p in parts if kind != "ConditionCheck"]
        elif op == "BatchWriteItem":
            named = [("Put", name, r["PutRequest"]) if "PutRequest" in r else ("Delete", name, r["DeleteRequest"])
                     for name, rs in request["RequestItems"].items() for r in rs]
        else:
            named = [(op[:-len("Item")], request["TableName"], request)]
        with self.writes:
            mirrors = {name: self.mirror(name) for _, name, _ in named}
            status, answer = forward()
            refused = status == 400 and any(
                kind in answer for kind in (b"ConditionalCheckFailedException", b"TransactionCanceledException"))
            # A batch may leave items unprocessed: each is read back.
            sure = status == 200 and op != "BatchWriteItem"
            new = None
            if sure and op == "UpdateItem" and request.get("ReturnValues") == "ALL_NEW":
                answered = json.loads(answer)
                new = answered.get("Attributes")
                if ask_new:
                    answered.pop("Attributes", None)
                    answer = answered
            for kind, name, part in named:
                mirror = mirrors[name]
                if mirror is None or refused:
                    continue
                key = written(mirror.table, part)
                if sure and kind == "Put":
                    image = part["Item"]
                elif sure and kind == "Delete":
                    image = None
                elif new is not None:
                    image = new
                else:
                    image = self.emulator.current(name, key)
                with self.lock:
                    mirror.write(key, image, time.monotonic())
        return status, answer

    def eventually_consistent(self, op, request):
        """A GetItem or BatchGetItem without ConsistentRead, answered from
        trailing images; None for a strongly consistent one."""
        now = time.monotonic()
        if op == "GetItem":
            if request.get("ConsistentRead"):
                return None
            mirror = self.mirror(request["TableName"])
            if mirror is None:
                return None
            with self.lock:
                image = mirror.read(request["Key"], now, self.stats)
            image = projected(image, request)
            return {"Item": image} if image is not None else {}
        asked = request["RequestItems"]
        consistent = {bool(a.get("ConsistentRead")) for a in asked.values()}
        if consistent == {True}:
            return None
        if consistent != {False}:
            raise Refused("the lagging proxy does not model a BatchGetItem that mixes strongly and "
                          "eventually consistent tables; send them apart")
        responses = {}
        for name, a in asked.items():
            mirror = self.mirror(name)
            if mirror is None:
                return None
            found = []
            for key in a["Keys"]:
                with self.lock:
                    image = mirror.read(key, now, self.stats)
                if image is not None:
                    found.append(projected(image, a))
            responses[name] = found
        return {"Responses": responses, "UnprocessedKeys": {}}

    def query_index(self, request):
        name = request["TableName"]
        mirror = self.mirror(name)
        if mirror is None:
            raise Refused(f"Requested resource not found: Table: {name} not found",
                          "ResourceNotFoundException")
        index = mirror.table.indexes.get(request["IndexName"])
        if index is None:
            raise Refused(f"The table does not have the specified index: {request['IndexName']}")
        if request.get("ConsistentRead"):
            raise Refused("Consistent reads are not supported on global secondary indexes")
        for unmodelled in ("FilterExpression", "ProjectionExpression", "QueryFilter", "KeyConditions",
                           "AttributesToGet"):
            if unmodelled in request:
                raise Refused(f"the lagging proxy does not model {unmodelled} on an index query; "
                              "add it to scripts/dynamodb-lagging-proxy.py")
        match = key_condition(request, index, mirror.table.types)
        with self.lock:
            view = mirror.index_view(index.name, time.monotonic())
            for shown, latest in view:
                if shown is not None and match(shown) and shown != latest:
                    self.stats["stale_entries"] += 1
                elif latest is not None and match(latest) and (shown is None or not match(shown)):
                    self.stats["missing_entries"] += 1
        order = [index.keys[1]] if len(index.keys) > 1 else []
        order += mirror.table.keys

        def position(item):
            return tuple(comparable(item[k]) for k in order)

        found = sorted((shown for shown, _ in view if shown is not None and match(shown)), key=position,
                       reverse=not request.get("ScanIndexForward", True))
        start = request.get("ExclusiveStartKey")
        if start is not None:
            try:
                after = position(start)
            except KeyError:
                raise Refused("The provided starting key is invalid") from None
            if request.get("ScanIndexForward", True):
                found = [i for i in found if position(i) > after]
            else:
                found = [i for i in found if position(i) < after]
        limit = request.get("Limit")
        page, size, last = [], 0, None
        for item in found:
            size += wire_item_size(item)
            page.append(item)
            if (limit is not None and len(page) >= limit) or size >= PAGE_BYTES:
                last = item
                break
        answer = {"Count": len(page), "ScannedCount": len(page)}
        if request.get("Select") != "COUNT":
            answer["Items"] = page
        if last is not None:
            answer["LastEvaluatedKey"] = {k: last[k] for k in set(index.keys) | set(mirror.table.keys)}
        if request.get("ReturnConsumedCapacity", "NONE") != "NONE":
            answer["ConsumedCapacity"] = {"TableName": name,
                                          "CapacityUnits": max(1, -(-size // 4096)) / 2}
        return answer


def projected(item, request):
    """`item` with only the attributes a plain ProjectionExpression names."""
    if item is None or "ProjectionExpression" not in request:
        return item
    names = request.get("ExpressionAttributeNames", {})
    wanted = set()
    for path in request["ProjectionExpression"].split(","):
        path = path.strip()
        if not re.fullmatch(r"#?[A-Za-z0-9_]+", path):
            raise Refused(f"the lagging proxy does not model the projection {path!r}")
        wanted.add(names.get(path, path))
    return {k: v for k, v in item.items() if k in wanted}


def comparable(value):
    """A key value as DynamoDB orders it: numbers by value, strings by their
    UTF-8 bytes, binaries by their bytes."""
    (kind, x), = value.items()
    if kind == "N":
        return decimal.Decimal(x)
    if kind == "S":
        return x.encode()
    if kind == "B":
        return binascii.a2b_base64(x)
    raise Refused(f"a key attribute of type {kind}")


TOKEN = re.compile(r"\s*(<=|>=|=|<|>|\(|\)|,|[#:]?[A-Za-z0-9_]+)")


def key_condition(request, index, types):
    """The index query's KeyConditionExpression as a test of an item:
    `hash = :v` and at most one condition on the range key (a comparison,
    BETWEEN or begins_with), as DynamoDB accepts it."""
    text = request.get("KeyConditionExpression")
    if not text:
        raise Refused("Either the KeyConditions or KeyConditionExpression parameter must be specified")
    names = request.get("ExpressionAttributeNames", {})
    values = request.get("ExpressionAttributeValues", {})
    tokens, at = [], 0
    while at < len(text.rstrip()):
        m = TOKEN.match(text, at)
        if not m:
            raise Refused(f"Invalid KeyConditionExpression: Syntax error near {text[at:]!r}")
        tokens.append(m.group(1))
        at = m.end()

    def take(expected=None):
        if not tokens:
            raise Refused("Invalid KeyConditionExpression: unexpected end")
        t = tokens.pop(0)
        if expected is not None and t.upper() != expected:
            raise Refused(f"Invalid KeyConditionExpression: expected {expected}, found {t}")
        return t

    def attribute():
        t = take()
        if t.startswith("#"):
            if t not in names:
                raise Refused(f"An expression attribute name used in the document path is not defined; name: {t}")
            return names[t]
        return t

    def value(attr):
        t = take()
        if not t.startswith(":") or t not in values:
            raise Refused(f"An expression attribute value used in expression is not defined; attribute value: {t}")
        v = values[t]
        kind = next(iter(v))
        if types.get(attr) and kind != types[attr]:
            raise Refused("One or more parameter values were invalid: Condition parameter type does not "
                          "match schema type")
        return v

    def condition():
        if tokens[0] == "(":
            take()
            c = condition()
            take(")")
            return c
        if tokens[0].lower() == "begins_with":
            take()
            take("(")
            attr = attribute()
            take(",")
            prefix = comparable(value(attr))
            take(")")
            return attr, lambda v: v[:len(prefix)] == prefix
        attr = attribute()
        op = take()
        if op.upper() == "BETWEEN":
            low = value(attr)
            take("AND")
            high = value(attr)
            lo, hi = comparable(low), comparable(high)
            if lo > hi:
                raise Refused("Invalid KeyConditionExpression: The BETWEEN operator requires upper bound "
                              f"to be greater than or equal to lower bound; lower bound operand: "
                              f"AttributeValue: {json.dumps(low)}, upper bound operand: "
                              f"AttributeValue: {json.dumps(high)}")
            return attr, lambda v: lo <= v <= hi
        bound = comparable(value(attr))
        tests = {"=": lambda v: v == bound, "<": lambda v: v < bound, "<=": lambda v: v <= bound,
                 ">": lambda v: v > bound, ">=": lambda v: v >= bound}
        if op not in tests:
            raise Refused(f"Invalid KeyConditionExpression: unsupported operator {op}")
        return attr, tests[op]

    conditions = [condition()]
    while tokens:
        take("AND")
        conditions.append(condition())
    on = {attr: test for attr, test in conditions}
    hash_key = index.keys[0]
    range_key = index.keys[1] if len(index.keys) > 1 else None
    if len(on) != len(conditions) or hash_key not in on or set(on) - {hash_key, range_key}:
        raise Refused("Query condition missed key schema element or names a non-key attribute")

    def matches(item):
        return all(a in item and test(comparable(item[a])) for a, test in on.items())

    return matches


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that gave up on its answer (its timeout) is not an error.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The headers and the body go out as two writes: without TCP_NODELAY,
    # the second waits for the client's delayed ACK (some 40 ms a request).
    disable_nagle_algorithm = True
    proxy = None

    def log_message(self, *args):
        pass

    def reply(self, status, body, headers=()):
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self, status, payload):
        body = json.dumps(payload).encode()
        self.reply(status, body, [
            ("Content-Type", "application/x-amz-json-1.0"),
            ("x-amzn-RequestId", str(uuid.uuid4())),
            ("x-amz-crc32", str(binascii.crc32(body))),
        ])

    def do_GET(self):
        if self.path == "/__stats":
            with self.proxy.lock:
                self.answer(200, dict(self.proxy.stats))
        else:
            self.answer(404, {"message": "GET /__stats"})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/__lag":
            try:
                self.proxy.set_lag(json.loads(body))
            except (ValueError, KeyError) as error:
                self.answer(400, {"message": f"POST /__lag: {error}"})
                return
            self.answer(200, {})
            return
        op = self.headers.get("X-Amz-Target", "?").split(".")[-1]
        upstream = self.proxy.emulator
        # The body may be sent changed (an update asked for its new item):
        # its length is counted again.
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        headers["Host"] = f"{upstream.host}:{upstream.port}"
        came = {}

        def forward(sent=body):
            status, came["headers"], data = upstream.send(self.path, sent, headers)
            return status, data

        try:
            status, answer = self.proxy.handle(op, json.loads(body or b"{}"), forward)
        except Refused as refused:
            self.answer(400, {"__type": f"com.amazonaws.dynamodb.v20120810#{refused.kind}",
                              "message": str(refused)})
            return
        except Exception as error:
            # Said to the client, as a failure of the emulator's, and logged.
            traceback.print_exc()
            self.answer(500, {"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError",
                              "message": f"the lagging proxy failed: {error!r} (see its log)"})
            return
        if isinstance(answer, bytes):
            # The emulator's answer as it came (an error included).
            self.reply(status, answer, came["headers"])
        else:
            self.answer(status, answer)


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        raise SystemExit(__doc__)
    emulator, port = args[0], int(args[1])
    index_lag, read_lag = Lag.parse("150,0.05,400"), Lag.parse("100,0.05,1000")
    rest = args[2:]
    try:
        while rest:
            flag, spec, rest = rest[0], rest[1], rest[2:]
            if flag == "--index-lag":
                index_lag = Lag.parse(spec)
            elif flag == "--read-lag":
                read_lag = Lag.parse(spec)
            else:
                raise SystemExit(f"unknown option {flag}\n{__doc__}")
    except (ValueError, IndexError) as error:
        raise SystemExit(f"{error}\n{__doc__}")
    Handler.proxy = Proxy(Emulator(emulator), index_lag, read_lag)
    Server(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
