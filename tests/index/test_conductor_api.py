#!/usr/bin/python3
"""The Mooncake Conductor indexer API (docs/index.md, "As a Mooncake
Conductor") of the real prefixd binary, spoken the way a router speaks it:
raw HTTP + JSON through the standard library (http.client), never prefixd's
client, with bodies shaped as the RFC's examples.

Publishers (prefixd.kv_publisher, ZeroMQ, real sockets):
  a0     vLLM, map encoding, data-parallel rank 0, instance vllm-a
  a1     vLLM, array encoding, rank 1, instance vllm-a
  store  a Mooncake store publishing RFC #1527 events (event_type,
         seq_hashes, no token ids) for its CPU pool, instance store-0
each registered through POST /register.

Checks, in order: /register answers; ListWorkers lists each registration's
worker with its labels; /query answers tokens per instance, medium and DP
rank, equal to what Route over gRPC says of the same workers; /query_by_hash
with rolling hashes computed here by an independent implementation of the
Conductor's profile (XXH64 from Debian's libxxhash through ctypes: the
salt's hash, then XXH64(parent as 8 bytes LE || tokens as int32 LE) per
block; golden value of the empty salt pinned) answers as /query does, also
under block_hash; the instance and model filters; every error path (400
naming the field for malformed JSON, a missing field, an unknown type, a
wrong block_size, an oversized list and body; 401 without or with a bad
token; 403 for a role or tenant or salt not owned; 404/405 for other paths
and methods) changes nothing; /unregister by the registration's name alone
(Mooncake's current form); GET /services lists the registrations with the
Conductor's field names (a TENANT its own tenant's); a restart of the daemon keeps the
registrations (index.state_dir) and answers as before; the metrics count the
requests by endpoint and code.

Prints one line per check and "N passed, M failed"; exit 1 on a failure,
77 (skipped) without --prefixd.
"""

import hashlib
import http.client
import json
import os
import shutil
import tempfile
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)
if not ARGS.prefixd:
    print("--prefixd not given: skipped")
    sys.exit(77)

import grpc  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher as kvp  # noqa: E402
from prefixd.v1 import prefix_index_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_index_pb2_grpc as pb_grpc  # noqa: E402
import upstream  # noqa: E402  (tests/index/upstream.py)

BS = 16
DEADLINE_S = 20
TOKENS = {"engine": "engine-token-1", "admin": "admin-token-1", "acme": "acme-token-1"}

# ---- the Conductor's hash profile, independently (libxxhash via ctypes) ----

xxh64 = upstream.xxh64


def conductor_hashes(tokens, salt=""):
    """The rolling hashes of the whole blocks of `tokens`."""
    return upstream.conductor_hashes(tokens, BS, salt)


CONFIG = """
index { block_size: %d }
tenants { name: "acme" }
tenants { name: "default" }
auth { mode: TOKEN }
limits { max_tokens_per_request: 4096 max_message_size: "1MiB" }
principals { name: "engine" role: ENGINE token_sha256: "%s" tenants: "*" }
principals { name: "admin" role: ADMIN token_sha256: "%s" }
principals { name: "acme-router" role: TENANT token_sha256: "%s" tenants: "acme"
             cache_salts: "acme-salt" }
""" % (BS, hashlib.sha256(TOKENS["engine"].encode()).hexdigest(),
       hashlib.sha256(TOKENS["admin"].encode()).hexdigest(),
       hashlib.sha256(TOKENS["acme"].encode()).hexdigest())


class Test(common.Checker):
    def __init__(self):
        super().__init__()
        self.tmp = None
        self.daemon = None
        self.http_port = None  # the Conductor API's, picked at each start
        self.pubs = {}

    # ---- plumbing ----

    def start_daemon(self):
        args = ["--index_state_dir=" + os.path.join(self.tmp, "state")]
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, CONFIG, args=args, snapshot=False,
                                             tmp=self.tmp, index_http="127.0.0.1").start()
        self.http_port = self.daemon.index_http_port
        self.sent = {}  # (endpoint, status) -> requests since this start
        self.channel = grpc.insecure_channel(self.daemon.tcp)
        self.stub = pb_grpc.PrefixIndexStub(self.channel)

    def post(self, path, body, who="engine", raw=None, method="POST"):
        """(status, decoded JSON answer) of one request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        headers = {"Content-Type": "application/json"}
        if who is not None:
            headers["Authorization"] = "Bearer " + TOKENS.get(who, who)
        data = raw if raw is not None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        text = resp.read()
        conn.close()
        key = (path.lstrip("/"), resp.status)
        self.sent[key] = self.sent.get(key, 0) + 1
        return resp.status, json.loads(text)

    def md(self):
        return [("authorization", "Bearer " + TOKENS["engine"])]

    def workers(self):
        return {w.worker: w for w in
                self.stub.ListWorkers(pb.ListWorkersRequest(), metadata=self.md(),
                                      timeout=10).workers}

    def wait(self, cond, what):
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if cond():
                return self.check(True, what)
            time.sleep(0.02)
        return self.check(False, what, "timed out; workers: %s" % list(self.workers()))

    def applied(self, name, seq):
        w = self.workers().get(name)
        return w is not None and w.last_seq >= seq and w.state == pb.LIVE

    def route_answer(self, tokens, instance=None):
        """What /query must answer, from Route over gRPC and the workers'
        labels in ListWorkers: tokens per instance, medium and DP rank
        (every worker, as /query lists every instance, matched or not)."""
        workers = self.workers()
        r = self.stub.Route(pb.RouteRequest(tokens=tokens, all_workers=True),
                            metadata=self.md(), timeout=10)
        out = {}
        for m in r.workers:
            labels = workers[m.worker].labels
            if instance is not None and labels.instance_id != instance:
                continue
            tenant = labels.tenant or "default"
            e = out.setdefault(tenant, {}).setdefault(
                labels.instance_id or m.worker,
                {"longest_matched": 0, "GPU": 0, "CPU": 0, "DISK": 0, "DP": {}})
            tokens_matched = m.matched_blocks * BS
            e["longest_matched"] = max(e["longest_matched"], tokens_matched)
            for med in m.mediums:
                name = med.medium.upper()
                e[name] = max(e.get(name, 0), med.matched_blocks * BS)
            rank = str(labels.dp_rank)
            e["DP"][rank] = max(e["DP"].get(rank, 0), tokens_matched)
        return out

    # ---- the scenario ----

    def register_body(self, name, instance, rank, type_="vLLM"):
        p = self.pubs[name]
        return {"endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint,
                "type": type_, "modelname": "deepseek", "lora_name": None,
                "tenant_id": "default", "instance_id": instance, "block_size": BS,
                "dp_rank": rank}

    def register_all(self):
        self.pubs["a0"] = kvp.Publisher(encoding="map", data_parallel_rank=0)
        self.pubs["a1"] = kvp.Publisher(encoding="array", data_parallel_rank=1)
        self.pubs["store"] = kvp.Publisher(encoding="array")
        for name, instance, rank, type_ in (("a0", "vllm-a", 0, "vLLM"),
                                            ("a1", "vllm-a", 1, "vLLM"),
                                            ("store", "store-0", 0, "Mooncake")):
            status, body = self.post("/register", self.register_body(name, instance, rank, type_))
            self.check(status == 200 and body == {"status": "registered successfully",
                                                  "instance_id": instance},
                       "/register %s answers as the RFC says" % name, (status, body))
        self.wait(lambda: all(w.state == pb.LIVE for w in self.workers().values())
                  and len(self.workers()) == 3, "the three registrations are LIVE workers")
        w = self.workers()
        a1 = w.get("vllm-a|default|1")
        self.check(a1 is not None and a1.labels.instance_id == "vllm-a"
                   and a1.labels.dp_rank == 1 and a1.labels.model == "deepseek"
                   and a1.endpoint == self.pubs["a1"].endpoint,
                   "ListWorkers lists vllm-a|default|1 with its labels", a1)
        store = w.get("store-0|default|0")
        self.check(store is not None and store.labels.hashes_are_keys,
                   "the Mooncake registration is placed by rolling keys", store)

    def service_entry(self, name, instance, rank, type_):
        """A registration as the Conductor's GET /services lists it."""
        p = self.pubs[name]
        return {"Endpoint": p.endpoint, "ReplayEndpoint": p.replay_endpoint, "Type": type_,
                "ModelName": "deepseek", "LoraName": "", "TenantID": "default",
                "InstanceID": instance, "BlockSize": BS, "DPRank": rank, "AdditionalSalt": ""}

    def services(self, want, what):
        """GET /services as each principal, then the methods it refuses."""
        status, got = self.post("/services", None, raw=b"", method="GET")
        self.check(status == 200 and got == {"count": len(want), "services": want},
                   "GET /services lists %s, by name, with the Conductor's field names" % what,
                   (status, got))
        status, got = self.post("/services", None, raw=b"", method="GET", who="admin")
        self.check(status == 200 and got["count"] == len(want), "an ADMIN may list them",
                   (status, got))
        status, got = self.post("/services", None, raw=b"", method="GET", who="acme")
        self.check(status == 200 and got == {"count": 0, "services": []},
                   "a TENANT of another tenant sees none of them", (status, got))
        status, got = self.post("/services", None, raw=b"", method="GET", who=None)
        self.check(status == 401, "GET /services without a token is 401", (status, got))
        status, got = self.post("/services", {})
        self.check(status == 405 and "only GET" in got.get("error", ""),
                   "POST /services is 405", (status, got))

    def publish(self):
        self.prompt = list(range(1000, 1000 + 4 * BS)) + [7, 7, 7]  # 4 blocks + 3 tokens
        p = self.prompt
        hashes = [9000 + i for i in range(4)]
        self.pubs["a0"].publish([kvp.block_stored(hashes, None, p[:4 * BS], BS)])
        self.pubs["a1"].publish([kvp.block_stored(hashes[:2], None, p[:2 * BS], BS)])
        # A store without token ids is placed where its keys already are: after
        # the engine's own stores.
        self.wait(lambda: self.applied("vllm-a|default|0", 0)
                  and self.applied("vllm-a|default|1", 0), "the engines' batches applied")
        self.store_event()
        self.wait(lambda: self.applied("store-0|default|0", 0), "the store's batch applied")

    def store_event(self):
        keys = conductor_hashes(self.prompt[:3 * BS])
        stored = {"event_type": "stored", "model_name": "deepseek", "block_size": BS,
                  "tenant_id": "default", "backend_id": "store-0", "medium": "cpu",
                  "dp_rank": 0, "seq_hashes": keys, "base_block_idx": None,
                  "parent_hash": None, "token_ids": None}
        return self.pubs["store"].publish([stored])

    def queries(self):
        p = self.prompt
        q = {"model": "deepseek", "lora_name": None, "token_ids": p, "tenant_id": "default",
             "block_size": BS}
        status, got = self.post("/query", q)
        want = {"default": {
            "vllm-a": {"longest_matched": 64, "GPU": 64, "CPU": 0, "DISK": 0,
                       "DP": {"0": 64, "1": 32}},
            "store-0": {"longest_matched": 48, "GPU": 0, "CPU": 48, "DISK": 0,
                        "DP": {"0": 48}}}}
        self.check(status == 200 and got == want, "/query: tokens per instance, medium, rank",
                   (status, got, self.workers().get("store-0|default|0")))
        self.check(got == self.route_answer(p), "/query agrees with Route over gRPC",
                   (got, self.route_answer(p)))
        self.answer = got
        keys = conductor_hashes(p)
        self.check(conductor_hashes([])[:0] == [] and xxh64(b"") == 17241709254077376921,
                   "the independent XXH64 gives the profile's golden empty-salt root")
        hq = {"model": "deepseek", "seq_hashes": keys, "block_size": BS}
        status, by_hash = self.post("/query_by_hash", hq)
        self.check(status == 200 and by_hash == got, "/query_by_hash answers as /query",
                   (status, by_hash))
        hq = {"model": "deepseek", "block_hash": keys, "block_size": BS}
        status, by_block = self.post("/query_by_hash", hq)
        self.check(status == 200 and by_block == got, "block_hash is seq_hashes' other name",
                   (status, by_block))
        status, one = self.post("/query", dict(q, instance_id="store-0"))
        self.check(status == 200 and one == {"default": {"store-0": want["default"]["store-0"]}}
                   and one == self.route_answer(p, "store-0"),
                   "instance_id filters the answer", one)
        status, none = self.post("/query", dict(q, model="llama"))
        self.check(status == 200 and none == {}, "another model matches nothing", none)
        status, salted = self.post("/query", dict(q, cache_salt="x"))
        self.check(status == 200 and
                   salted.get("default", {}).get("vllm-a", {}).get("longest_matched") == 0,
                   "another cache_salt is another namespace", salted)

    def errors(self):
        before = sorted(self.workers())
        q = {"model": "deepseek", "token_ids": self.prompt, "block_size": BS}
        reg = self.register_body("a0", "vllm-z", 0)
        cases = [
            ("/register", None, b'{"endpoint": ', 400, "not JSON"),
            # bytes that are not UTF-8, quoted by the parser's message
            ("/query", None, b'{"model": "\xff\xfe', 400, "not JSON"),
            ("/register", dict(reg, type="TensorRT"), None, 400, "type"),
            ("/register", {k: v for k, v in reg.items() if k != "instance_id"}, None, 400,
             "instance_id: is required"),
            ("/register", dict(reg, block_size=32), None, 400,
             "block_size: 32 differs from the index's block size 16"),
            ("/register", dict(reg, endpoint="http://x"), None, 400, "endpoint"),
            # Names reach ListWorkers and metric labels: no control characters,
            # at most 256 bytes.
            ("/register", dict(reg, instance_id="e\x1b[2J"), None, 400,
             "instance_id \"e\\x1b[2J\" has a control character"),
            ("/register", dict(reg, modelname="m" * 257), None, 400,
             "modelname is 257 bytes, more than 256"),
            ("/unregister", {"type": "vLLM", "modelname": "deepseek", "block_size": BS,
                             "dp_rank": 0}, None, 400, "instance_id"),
            ("/unregister", dict(reg, instance_id="nobody"), None, 404, "nobody|default|0"),
            ("/unregister", {"instance_id": "vllm-a", "dp_rank": 0, "block_size": 32}, None,
             400, "block_size: 32 differs"),
            ("/unregister", {"instance_id": "vllm-a", "dp_rank": 0, "type": "TensorRT"}, None,
             400, "type"),
            ("/query", {k: v for k, v in q.items() if k != "model"}, None, 400, "model"),
            ("/query", dict(q, block_size=8), None, 400, "block_size: 8 differs"),
            ("/query", dict(q, token_ids=list(range(4097))), None, 400,
             "token_ids: 4097 entries exceed the limit of 4096"),
            ("/query", dict(q, token_ids=[1, "2"]), None, 400, "token_ids: entry 1"),
            ("/query_by_hash", q, None, 400, "seq_hashes"),
            ("/query", None, b"[" + b"1," * 600000 + b"1]", 400, "body: over 1048576 bytes"),
        ]
        for path, body, raw, code, text in cases:
            status, answer = self.post(path, body, raw=raw)
            self.check(status == code and text in answer.get("error", ""),
                       "%s %s: %d naming %r" % (path, (raw or b"")[:12] or "", code, text),
                       (status, answer))
        auth = [
            ("/query", q, None, 401, "no credentials"),
            ("/query", q, "wrong-token", 401, "not valid"),
            ("/register", reg, "acme", 403, "ENGINE"),
            ("/register", reg, "admin", 403, "ENGINE"),
            ("/unregister", self.register_body("a0", "vllm-a", 0), "admin", 403, "ENGINE"),
            ("/query", dict(q, tenant_id="default", cache_salt="acme-salt"), "acme", 403,
             "tenant_id"),
            ("/query", dict(q, cache_salt="other"), "acme", 403, "cache_salt"),
        ]
        for path, body, who, code, text in auth:
            status, answer = self.post(path, body, who=who)
            self.check(status == code and text in answer.get("error", ""),
                       "%s as %s: %d" % (path, who, code), (status, answer))
        status, answer = self.post("/query", dict(q, cache_salt="acme-salt"), who="acme")
        self.check(status == 200 and answer == {}, "a TENANT queries its own tenant and salt",
                   (status, answer))
        status, answer = self.post("/query", q, who="admin")
        self.check(status == 200 and answer == self.answer, "an ADMIN may query", answer)
        status, answer = self.post("/nothing", q)
        self.check(status == 404 and "error" in answer, "another path is 404", answer)
        status, answer = self.post("/query", None, raw=b"", method="GET")
        self.check(status == 405 and "POST" in answer["error"], "GET is 405", answer)
        self.check(sorted(self.workers()) == before, "the refused requests changed nothing",
                   (before, sorted(self.workers())))

    def unregister(self):
        # Mooncake's current Conductor's form: the registration's name alone.
        status, body = self.post("/unregister", {"instance_id": "vllm-a", "dp_rank": 1})
        self.check(status == 200 and body == {"status": "unregistered successfully",
                                              "removed_instances": ["vllm-a|default|1"]},
                   "/unregister answers the removed instance", (status, body))
        self.check("vllm-a|default|1" not in self.workers(), "its worker is gone")
        status, got = self.post("/services", None, raw=b"", method="GET")
        self.check(status == 200 and [e["InstanceID"] + "/" + str(e["DPRank"])
                                      for e in got["services"]] == ["store-0/0", "vllm-a/0"],
                   "GET /services no longer lists it", (status, got))
        status, got = self.post("/query", {"model": "deepseek", "token_ids": self.prompt,
                                           "block_size": BS})
        self.check(got.get("default", {}).get("vllm-a", {}).get("DP") == {"0": 64}
                   and got == self.route_answer(self.prompt),
                   "/query no longer counts rank 1", got)
        self.answer = got

    def restart(self):
        self.channel.close()
        self.check(self.daemon.stop() == 0, "the daemon stops cleanly")
        path = os.path.join(self.tmp, "state", "conductor_registrations.json")
        with open(path) as f:
            kept = json.load(f)
        self.check(sorted(r["instance_id"] + "/" + str(r["dp_rank"]) for r in kept)
                   == ["store-0/0", "vllm-a/0"], "the state file lists the registrations", kept)
        self.start_daemon()
        status, got = self.post("/services", None, raw=b"", method="GET")
        self.check(status == 200 and got == {"count": 2, "services": [
            self.service_entry("store", "store-0", 0, "Mooncake"),
            self.service_entry("a0", "vllm-a", 0, "vLLM")]},
                   "after a restart GET /services lists the kept registrations", (status, got))
        self.wait(lambda: self.applied("vllm-a|default|0", 0)
                  and self.applied("store-0|default|0", 0),
                  "after a restart the registrations are followed again (caught up)")
        q = {"model": "deepseek", "token_ids": self.prompt, "block_size": BS}
        status, got = self.post("/query", q)
        self.check(status == 200 and got.get("default", {}).get("vllm-a")
                   == self.answer["default"]["vllm-a"], "and /query answers as before", got)
        # The store's catch-up may have come before the engine's, when its
        # keys named no block yet (dropped, counted): its next store places
        # them.
        seq = self.store_event()
        self.wait(lambda: self.applied("store-0|default|0", seq), "the store stores again")
        status, got = self.post("/query", q)
        self.check(status == 200 and got == self.answer and got == self.route_answer(self.prompt),
                   "then the store's CPU tier is back", got)

    def metrics(self):
        with urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics, timeout=10) as r:
            text = r.read().decode()
        n = self.sent.get(("query", 200), 0)
        self.check(n > 0 and
                   'prefixd_index_http_requests_total{code="200",endpoint="query"} %d' % n in text
                   and 'prefixd_index_http_request_seconds_count{endpoint="query"} %d' % n in text,
                   "the metrics count the %d /query since the restart" % n)

    def run(self):
        self.tmp = tempfile.mkdtemp(prefix="prefixd-conductor-")
        self.start_daemon()
        self.register_all()
        self.services([self.service_entry("store", "store-0", 0, "Mooncake"),
                       self.service_entry("a0", "vllm-a", 0, "vLLM"),
                       self.service_entry("a1", "vllm-a", 1, "vLLM")],
                      "the three registrations")
        self.publish()
        self.queries()
        self.errors()
        self.unregister()
        self.restart()
        self.metrics()


def main():
    t = Test()
    try:
        t.run()
    except (prefixd_fixture.DaemonFailed, OSError, grpc.RpcError, ValueError,
            KeyError) as e:
        t.check(False, "the run completed", "%s: %s" % (type(e).__name__, e))
    finally:
        for p in t.pubs.values():
            p.close()
        if t.daemon is not None:
            t.daemon.close()
        if t.tmp is not None:
            shutil.rmtree(t.tmp, ignore_errors=True)
    return t.exit_code()


if __name__ == "__main__":
    sys.exit(main())
