#!/usr/bin/python3
"""The Mooncake Conductor indexer API (docs/index.md, "As a Mooncake
Conductor") over HTTPS: with auth.tls_cert_path set, the real prefixd binary
serves index.http_listen with the gRPC listeners' certificate, on an address
other hosts can reach (0.0.0.0). Spoken as a router speaks it: raw HTTP +
JSON through the standard library (http.client, ssl), never prefixd's
client. Certificates come from tests/security's PKI (pki_tool).

TOKEN with TLS:
  every endpoint once over HTTPS (/register of a ZeroMQ publisher, /query,
  /query_by_hash, /query in MessagePack, GET /services, /unregister),
  answers checked; no token 401, a wrong token
  401, an ADMIN's /register 403, as the plain door answers; a body over
  limits.max_message_size 400 (and the connection serves the next request),
  one over twice it cut off; a silent connection closed after io_timeout;
  a TLS 1.1 handshake refused; a plain-HTTP request to the TLS port gets no
  HTTP answer; the start-up banner says HTTPS; SIGHUP with a new certificate
  in the configured files: new connections are shown it and served, and a
  connection opened before keeps working.
Each mode ends with SIGTERM and exit code 0 (under ASan: no leak).
MTLS:
  a client certificate of the CA names its principal as on the gRPC side
  (ENGINE by common name registers and queries; ADMIN by full RFC 2253
  subject queries and is refused /register with 403); a CA-signed
  certificate mapped to no principal is 401; no certificate, or one from
  another CA, fails the handshake: no request is answered.

Prints one line per check and "N passed, M failed"; exit 1 on a failure,
77 (skipped) without --prefixd.
"""

import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import warnings

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__, lambda ap: ap.add_argument(
    "--pki_tool", help="tests/security's pki_tool binary"))
if not ARGS.prefixd or not ARGS.pki_tool:
    print("--prefixd or --pki_tool not given: skipped")
    sys.exit(77)

import grpc  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher as kvp  # noqa: E402
from prefixd.v1 import prefix_index_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_index_pb2_grpc as pb_grpc  # noqa: E402
import upstream  # noqa: E402  (tests/index/upstream.py)

BS = 16
DEADLINE_S = 20
TOKENS = {"engine": "engine-token-7", "admin": "admin-token-7"}
PROMPT = list(range(500, 500 + 3 * BS))


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def make_pki(parent):
    """{name: path} from pki_tool: the CA, the server's certificate, a
    second server certificate, client certificates and a rogue one."""
    out = subprocess.run([ARGS.pki_tool, parent, "client:engine", "client:ops",
                          "client:stranger", "rogue:engine", "server:second"],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def config(pki, mtls):
    auth = 'auth { mode: %s tls_cert_path: "%s" tls_key_path: "%s"%s }\n' % (
        "MTLS" if mtls else "TOKEN", pki["cert"], pki["key"],
        ' client_ca_path: "%s"' % pki["ca"] if mtls else "")
    engine_id = ' cert_subject: "engine"' if mtls else ""
    # The ADMIN by its full subject, as gRPC prints it (RFC 2253).
    admin_id = ' cert_subject: "CN=ops,O=prefixd test"' if mtls else ""
    return auth + (
        'index { block_size: %d }\n'
        'limits { max_message_size: "1MiB" }\n'
        'principals { name: "engine" role: ENGINE tenants: "*" token_sha256: "%s"%s }\n'
        'principals { name: "admin" role: ADMIN token_sha256: "%s"%s }\n'
        % (BS, sha(TOKENS["engine"]), engine_id, sha(TOKENS["admin"]), admin_id))


class Test(common.Checker):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="prefixd-conductor-https-")
        self.pki = make_pki(self.tmp)
        # The files the config names; a rotation writes new ones over them.
        self.pki["cert"] = os.path.join(self.tmp, "served.pem")
        self.pki["key"] = os.path.join(self.tmp, "served.key")
        self.install("server")
        self.daemon = None
        self.pub = None
        self.port = None  # the Conductor API's, picked at each start

    def install(self, name):
        shutil.copy(self.pki[name + ".cert"], self.pki["cert"])
        shutil.copy(self.pki[name + ".key"], self.pki["key"])

    # ---- plumbing ----

    def stop(self):
        """SIGTERM; the daemon must exit 0 (under ASan: no leak, no error)."""
        rc = self.daemon.stop()
        self.check(rc == 0, "the daemon stops cleanly (exit %s)" % rc,
                   self.daemon.logs()[-3000:])
        self.daemon.close()
        self.daemon = None

    def start(self, mtls):
        if self.daemon is not None:
            self.stop()
        tmp = os.path.join(self.tmp, "mtls" if mtls else "token")
        os.mkdir(tmp)
        self.daemon = prefixd_fixture.Daemon(
            ARGS.prefixd, config(self.pki, mtls), snapshot=False, tls=True,
            index_http="0.0.0.0", tmp=tmp).start()
        self.port = self.daemon.index_http_port
        # gRPC over the Unix socket (never TLS), as the engine principal.
        self.stub = pb_grpc.PrefixIndexStub(grpc.insecure_channel(self.daemon.unix))

    def context(self, cert=None):
        ctx = ssl.create_default_context(cafile=self.pki["ca"])
        if cert is not None:
            ctx.load_cert_chain(self.pki[cert + ".cert"], self.pki[cert + ".key"])
        return ctx

    def connect(self, cert=None):
        return http.client.HTTPSConnection("localhost", self.port, timeout=10,
                                           context=self.context(cert))

    def post(self, path, body, who=None, cert=None, conn=None, method="POST"):
        """(status, decoded JSON answer) of one request over HTTPS (a GET
        sends no body)."""
        c = conn or self.connect(cert)
        headers = {"Content-Type": "application/json"}
        if who is not None:
            headers["Authorization"] = "Bearer " + TOKENS.get(who, who)
        data = None if method == "GET" else json.dumps(body).encode()
        c.request(method, path, body=data, headers=headers)
        resp = c.getresponse()
        text = resp.read()
        if conn is None:
            c.close()
        return resp.status, json.loads(text)

    def post_msgpack(self, path, body, who=None, cert=None):
        """(status, Content-Type, decoded answer) of one MessagePack request,
        token_ids as one bin of little-endian int32 (Mooncake's current
        Conductor clients)."""
        c = self.connect(cert)
        headers = {"Content-Type": "application/msgpack"}
        if who is not None:
            headers["Authorization"] = "Bearer " + TOKENS.get(who, who)
        body = dict(body, token_ids=struct.pack("<%di" % len(body["token_ids"]),
                                                *body["token_ids"]))
        c.request("POST", path, body=msgpack.packb(body, use_bin_type=True), headers=headers)
        resp = c.getresponse()
        data = resp.read()
        c.close()
        return resp.status, resp.getheader("Content-Type"), msgpack.unpackb(data, raw=False)

    def refused(self, cert):
        """Why a request with `cert` got no answer; None if it got one."""
        try:
            status, _ = self.post("/query", self.query(), who="engine", cert=cert)
            return None if status else "no status"
        except (ssl.SSLError, ConnectionError, http.client.HTTPException, OSError) as e:
            return "%s: %s" % (type(e).__name__, e)

    def workers(self):
        md = [("authorization", "Bearer " + TOKENS["engine"])]
        return {w.worker: w for w in
                self.stub.ListWorkers(pb.ListWorkersRequest(), metadata=md, timeout=10).workers}

    def wait(self, cond, what):
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if cond():
                return self.check(True, what)
            time.sleep(0.02)
        return self.check(False, what, "timed out")

    def query(self):
        return {"model": "deepseek", "token_ids": PROMPT, "block_size": BS}

    def register_body(self, instance):
        """A registration of the publisher, or of a publisher that does not
        exist (for requests that must be refused before it is dialled)."""
        endpoint = self.pub.endpoint if self.pub else "tcp://127.0.0.1:9"
        replay = self.pub.replay_endpoint if self.pub else "tcp://127.0.0.1:9"
        return {"endpoint": endpoint, "replay_endpoint": replay,
                "type": "vLLM", "modelname": "deepseek", "tenant_id": "default",
                "instance_id": instance, "block_size": BS, "dp_rank": 0}

    # ---- every endpoint over HTTPS ----

    def endpoints(self, creds, instance):
        """creds: {"who": token name} or {"cert": client certificate}."""
        self.pub = kvp.Publisher(encoding="map", data_parallel_rank=0)
        status, body = self.post("/register", self.register_body(instance), **creds)
        self.check(status == 200 and body == {"status": "registered successfully",
                                              "instance_id": instance},
                   "/register over HTTPS", (status, body))
        worker = "%s|default|0" % instance
        self.wait(lambda: worker in self.workers() and
                  self.workers()[worker].state == pb.LIVE, "its worker is LIVE")
        self.pub.publish([kvp.block_stored([41, 42, 43], None, PROMPT, BS)])
        want = {"default": {instance: {"longest_matched": 3 * BS, "GPU": 3 * BS, "CPU": 0,
                                       "DISK": 0, "DP": {"0": 3 * BS}}}}
        self.wait(lambda: self.post("/query", self.query(), **creds) == (200, want),
                  "/query over HTTPS answers the published blocks")
        hq = {"model": "deepseek", "seq_hashes": upstream.conductor_hashes(PROMPT, BS, ""),
              "block_size": BS}
        status, got = self.post("/query_by_hash", hq, **creds)
        self.check(status == 200 and got == want, "/query_by_hash over HTTPS", (status, got))
        tiers = {name: 3 * BS for name in ("npu", "cpu_local", "cpu_share", "disk")}
        by_instance = {"instances": {instance: dict(
            tiers, longest_matched=3 * BS, dp={"0": 3 * BS}, rank_matches={"0": tiers})}}
        status, ctype, got = self.post_msgpack("/query", self.query(), **creds)
        self.check(status == 200 and ctype == "application/msgpack" and got == by_instance,
                   "/query in MessagePack over HTTPS answers by instance", (status, ctype, got))
        status, got = self.post("/services", None, method="GET", **creds)
        self.check(status == 200 and got["count"] == 1
                   and got["services"][0]["InstanceID"] == instance,
                   "GET /services over HTTPS lists the registration", (status, got))
        status, body = self.post("/unregister", self.register_body(instance), **creds)
        self.check(status == 200 and body.get("removed_instances") == [worker],
                   "/unregister over HTTPS", (status, body))
        self.check(worker not in self.workers(), "its worker is gone")
        self.pub.close()
        self.pub = None

    # ---- TOKEN with TLS ----

    def token_mode(self):
        self.start(mtls=False)
        # The banner is printed once start-up is over, just after the
        # listeners (which the fixture waits for) serve.
        banner = "index http   0.0.0.0:%d (port %d, HTTPS)" % (self.port, self.port)
        self.wait(lambda: banner in self.daemon.logs(), "the banner says HTTPS")
        self.endpoints({"who": "engine"}, "vllm-t")
        for who, code, text in ((None, 401, "no credentials"),
                                ("wrong-token", 401, "not valid")):
            status, answer = self.post("/query", self.query(), who=who)
            self.check(status == code and text in answer.get("error", ""),
                       "/query as %s: %d, as over plain HTTP" % (who, code), (status, answer))
        status, answer = self.post("/register", self.register_body("vllm-x"), who="admin")
        self.check(status == 403 and "ENGINE" in answer.get("error", ""),
                   "/register as an ADMIN: 403", (status, answer))
        self.bounds()
        self.old_tls_refused()
        self.plain_http_fails()
        self.rotation()

    def bounds(self):
        """The body cap and the idle timeout of the plain door."""
        conn = self.connect()
        conn.request("POST", "/query", body=b"[" + b"1," * 600000 + b"1]",
                     headers={"Authorization": "Bearer " + TOKENS["engine"]})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        self.check(resp.status == 400 and "body: over 1048576 bytes" in answer.get("error", ""),
                   "a body over limits.max_message_size: 400 naming the limit",
                   (resp.status, answer))
        # Read in full, the connection stays in step: the next request is
        # answered on it.
        status, answer = self.post("/query", self.query(), who="engine", conn=conn)
        self.check(status == 200, "and the same connection serves the next request",
                   (status, answer))
        conn.close()
        conn = self.connect()
        try:
            conn.request("POST", "/query", body=b"[" + b"1," * 1200000 + b"1]",
                         headers={"Authorization": "Bearer " + TOKENS["engine"]})
            resp = conn.getresponse()
            self.check(False, "a body over twice the limit is cut off", resp.status)
        except (ConnectionError, http.client.HTTPException, ssl.SSLError, OSError) as e:
            self.check(True, "a body over twice the limit is cut off (%s)" % type(e).__name__)
        conn.close()
        # A connection that never starts its handshake is closed after
        # io_timeout (5 s): recv sees the end of the stream (after a TLS
        # alert, if one is sent).
        with socket.create_connection(("127.0.0.1", self.port), timeout=15) as idle:
            start = time.monotonic()
            got, end = b"", None
            while end is None:
                try:
                    piece = idle.recv(64)
                    got += piece
                    end = "closed" if not piece else None
                except ConnectionResetError:
                    end = "reset"
            waited = time.monotonic() - start
        self.check(4 < waited < 10 and len(got) < 64,
                   "a silent connection is %s after %.1f s" % (end, waited), got)

    def old_tls_refused(self):
        """TLS 1.2 and 1.3 only, as the gRPC listeners."""
        ctx = self.context()
        ctx.set_ciphers("DEFAULT@SECLEVEL=0")
        with warnings.catch_warnings():  # TLSv1_1 is deprecated: the point
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                    self.check(False, "a TLS 1.1 handshake is refused", tls.version())
        except (ssl.SSLError, ConnectionError) as e:
            self.check(True, "a TLS 1.1 handshake is refused (%s)" % type(e).__name__)

    def plain_http_fails(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", "/query", body=json.dumps(self.query()),
                         headers={"Authorization": "Bearer " + TOKENS["engine"]})
            resp = conn.getresponse()
            self.check(False, "plain HTTP to the TLS port gets no HTTP answer", resp.status)
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            self.check(True, "plain HTTP to the TLS port gets no HTTP answer (%s)"
                       % type(e).__name__)
        finally:
            conn.close()

    def served(self):
        """The certificate (DER) a new TLS connection is shown."""
        ctx = self.context()
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                return tls.getpeercert(binary_form=True)

    def rotation(self):
        def der(name):
            with open(self.pki[name + ".cert"]) as f:
                return ssl.PEM_cert_to_DER_cert(f.read())

        self.check(self.served() == der("server"), "the first certificate is served")
        before = self.connect()
        status, got = self.post("/query", self.query(), who="engine", conn=before)
        self.check(status == 200, "a kept-alive connection is served", (status, got))
        self.install("server:second")
        line = "prefixd: SIGHUP: principals reloaded"
        seen = self.daemon.logs().count(line)
        self.daemon.proc.send_signal(signal.SIGHUP)
        self.wait(lambda: self.daemon.logs().count(line) > seen, "SIGHUP reloaded")
        self.wait(lambda: self.served() == der("server:second"),
                  "after SIGHUP new connections are shown the new certificate")
        status, got = self.post("/query", self.query(), who="engine")
        self.check(status == 200, "and served over it", (status, got))
        status, got = self.post("/query", self.query(), who="engine", conn=before)
        self.check(status == 200, "a connection opened before keeps working", (status, got))
        before.close()

    # ---- MTLS ----

    def mtls_mode(self):
        self.install("server")
        self.start(mtls=True)
        self.endpoints({"cert": "client:engine"}, "vllm-m")
        status, answer = self.post("/query", self.query(), cert="client:ops")
        self.check(status == 200 and answer == {},
                   "the ADMIN by its full subject queries", (status, answer))
        status, answer = self.post("/register", self.register_body("vllm-x"), cert="client:ops")
        self.check(status == 403 and "ENGINE" in answer.get("error", ""),
                   "the ADMIN's certificate may not /register: 403", (status, answer))
        status, answer = self.post("/query", self.query(), cert="client:stranger")
        self.check(status == 401 and "not mapped to a principal" in answer.get("error", ""),
                   "a CA-signed certificate of no principal: 401", (status, answer))
        why = self.refused(None)
        self.check(why is not None, "no client certificate (a bearer token only): refused",
                   why)
        why = self.refused("rogue:engine")
        self.check(why is not None, "a certificate of another CA: refused", why)

    def run(self):
        self.token_mode()
        self.mtls_mode()
        self.stop()

    def close(self):
        if self.pub is not None:
            self.pub.close()
        if self.daemon is not None:
            self.daemon.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    t = Test()
    try:
        t.run()
    except (prefixd_fixture.DaemonFailed, OSError, grpc.RpcError, ValueError,
            KeyError, ssl.SSLError, http.client.HTTPException) as e:
        t.check(False, "the run completed", "%s: %s" % (type(e).__name__, e))
    finally:
        t.close()
    return t.exit_code()


if __name__ == "__main__":
    sys.exit(main())
