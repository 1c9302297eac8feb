"""DynamoDB's JSON wire form, as the scripts that stand in front of the
emulator read it (scripts/peer-dynamodb.py's counting proxy,
scripts/dynamodb-lagging-proxy.py): requests sent straight to the emulator,
a table's keys and indexes, which item a write names, what an index holds
of an item, and an item's size by DynamoDB's rule. Standard library only.
"""

import base64
import http.client
import json
import threading
import urllib.parse

SIGNED = ("AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/dynamodb/aws4_request, "
          "SignedHeaders=host, Signature=0")


class Emulator:
    """The emulator at `url`: requests sent straight to it (moto checks no
    signature), on one kept-alive connection per thread, and the tables'
    definitions it describes, read once."""

    def __init__(self, url):
        parsed = urllib.parse.urlparse(url)
        self.host, self.port = parsed.hostname, parsed.port
        self.local = threading.local()
        self.tables = {}

    def send(self, path, body, headers):
        """One request as it came; (status, headers, body bytes). A kept
        connection the emulator closed while idle is opened again, once:
        the request never reached it."""
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            try:
                return self._send(conn, path, body, headers)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
        conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        return self._send(conn, path, body, headers)

    def _send(self, conn, path, body, headers):
        try:
            conn.request("POST", path, body=body, headers=headers)
            reply = conn.getresponse()
            answer = reply.status, reply.getheaders(), reply.read()
        except BaseException:
            conn.close()
            self.local.conn = None
            raise
        if reply.will_close:
            conn.close()
            self.local.conn = None
        return answer

    def call(self, op, payload):
        """`op` with `payload`; (status, the answer's JSON)."""
        status, _, data = self.send("/", json.dumps(payload), {
            "X-Amz-Target": f"DynamoDB_20120810.{op}",
            "Content-Type": "application/x-amz-json-1.0",
            "Authorization": SIGNED,
            "Host": f"{self.host}:{self.port}",
        })
        return status, json.loads(data or b"{}")

    def table(self, name):
        """The table's definition (a `Table`), or None when there is no such table."""
        if name not in self.tables:
            status, d = self.call("DescribeTable", {"TableName": name})
            if status != 200:
                return None
            self.tables[name] = Table(d["Table"])
        return self.tables[name]

    def forget(self, name):
        """Reads the table's definition again next time (created, deleted, an index added)."""
        self.tables.pop(name, None)

    def current(self, name, key):
        """The item as it stands, read strongly consistent; None when absent."""
        _, d = self.call("GetItem", {"TableName": name, "Key": key, "ConsistentRead": True})
        return d.get("Item")


class Index:
    """A global secondary index: its name, its key attributes (hash, then
    range if any) and what it projects (None: every attribute)."""

    def __init__(self, g, table_keys):
        self.name = g["IndexName"]
        self.keys = [k["AttributeName"] for k in g["KeySchema"]]
        p = g.get("Projection", {})
        kind = p.get("ProjectionType", "ALL")
        self.projected = None if kind == "ALL" else (
            set(self.keys) | set(table_keys) | set(p.get("NonKeyAttributes", [])))

    def entry(self, item):
        """What the index holds of `item`: None when the item is not in it
        (the index is sparse: an item lacking a key attribute is left out)."""
        if item is None or not all(k in item for k in self.keys):
            return None
        if self.projected is None:
            return item
        return {k: v for k, v in item.items() if k in self.projected}


class Table:
    """A table's key attributes, their types and its global secondary
    indexes, from DescribeTable."""

    def __init__(self, t):
        self.name = t["TableName"]
        self.keys = [k["AttributeName"] for k in t["KeySchema"]]
        self.types = {a["AttributeName"]: a["AttributeType"] for a in t.get("AttributeDefinitions", [])}
        self.indexes = {g["IndexName"]: Index(g, self.keys) for g in t.get("GlobalSecondaryIndexes", [])}

    def key_of(self, item):
        return {k: item[k] for k in self.keys}


def written(table, request):
    """The key of the item a PutItem, UpdateItem or DeleteItem request (or a
    part of a transaction) names."""
    if "Key" in request:
        return request["Key"]
    return table.key_of(request["Item"])


def number_size(n):
    digits = n.lstrip("-").replace(".", "").strip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def wire_size(v):
    """A value's size by DynamoDB's rule, from its wire form."""
    (kind, x), = v.items()
    if kind == "S":
        return len(x.encode())
    if kind == "N":
        return number_size(x)
    if kind == "B":
        return len(base64.b64decode(x))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(e.encode()) for e in x)
    if kind == "NS":
        return sum(number_size(e) for e in x)
    if kind == "BS":
        return sum(len(base64.b64decode(e)) for e in x)
    if kind == "L":
        return 3 + sum(1 + wire_size(e) for e in x)
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + wire_size(e) for k, e in x.items())
    raise ValueError(kind)


def wire_item_size(item):
    """An item's size by DynamoDB's rule: its attribute names' bytes plus
    its values' (what a write unit, a read unit and a page are counted on)."""
    return sum(len(k.encode()) + wire_size(v) for k, v in (item or {}).items())
