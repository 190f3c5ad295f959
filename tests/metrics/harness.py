"""Shared pieces of the metrics tests: free ports, the real prefixd binary,
Python gRPC stubs generated at test time, a real Prometheus, and promtool
(skip_unless skips a test when one is absent), and the flags the tests
take (parse_flags). unittest_main() and stopping a process come from
tests/python/common.py.

Every wait polls with a deadline; nothing sleeps blindly.
"""

import argparse
import collections
import importlib
import json
import os
import socket
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import common  # noqa: E402  (tests/python/common.py)

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
START_TIMEOUT_S = 30


def parse_flags(doc, *flags):
    """The test's flags (each of `flags`, e.g. "prefixd", "repo", required)
    and the argv left for unittest.main."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for flag in flags:
        parser.add_argument("--" + flag, required=True)
    args, rest = parser.parse_known_args()
    return args, [sys.argv[0]] + rest


def skip_unless(*binaries):
    """Skips the test (unittest.SkipTest), saying why, if a binary is missing."""
    for path in binaries:
        if not os.access(path, os.X_OK):
            raise unittest.SkipTest("%s is not installed (Debian package `prometheus`; "
                                    "deploy/install-deps.sh installs it)" % path)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, predicate, timeout_s, interval_s=0.05):
    """Polls predicate() until it returns something truthy; returns it.
    Raises TimeoutError naming `what` when the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # not ready yet: keep polling
            last_error = e
        if time.monotonic() >= deadline:
            raise TimeoutError("%s: not within %ss (last error: %r)"
                               % (what, timeout_s, last_error))
        time.sleep(interval_s)


def http_get(url, timeout_s=10):
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read().decode("utf-8")


def protoc_command(proto_dir, out_dir):
    """The Python client's protoc command (client/python/gen_stubs.py)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "client", "python"))
    import gen_stubs
    return gen_stubs.protoc_command(sys.executable, proto_dir, out_dir)


def load_stubs(proto_dir, out_dir):
    """Generates prefix_cache_pb2(_grpc) into out_dir and imports them."""
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run(
        protoc_command(proto_dir, out_dir)
        + [os.path.join(proto_dir, "prefixd", "v1", "prefix_cache.proto")],
        check=True)
    for d in ("prefixd", os.path.join("prefixd", "v1")):
        open(os.path.join(out_dir, d, "__init__.py"), "a").close()
    sys.path.insert(0, out_dir)
    pb2 = importlib.import_module("prefixd.v1.prefix_cache_pb2")
    pb2_grpc = importlib.import_module("prefixd.v1.prefix_cache_pb2_grpc")
    return pb2, pb2_grpc


class Client:
    """PrefixCache stub that counts every call it makes, by method and code,
    so a test knows exactly what prefixd_rpc_* must show."""

    def __init__(self, grpc_module, pb2, pb2_grpc, address):
        self.grpc = grpc_module
        self.pb2 = pb2
        self.channel = grpc_module.insecure_channel(address)
        self.stub = pb2_grpc.PrefixCacheStub(self.channel)
        self.calls = collections.Counter()   # method -> calls
        self.errors = collections.Counter()  # (method, code name) -> calls

    def call(self, method, tenant=None, expect=None, **fields):
        """Calls `method` with a request built from fields. expect: the
        grpc.StatusCode name the call must fail with (None: must succeed)."""
        request = getattr(self.pb2, method + "Request")(**fields)
        metadata = [("x-prefixd-tenant", tenant)] if tenant else []
        self.calls[method] += 1
        try:
            response = getattr(self.stub, method)(request, metadata=metadata, timeout=10)
        except self.grpc.RpcError as e:
            self.errors[(method, e.code().name)] += 1
            if expect != e.code().name:
                raise AssertionError("%s failed with %s: %s"
                                     % (method, e.code().name, e.details()))
            return None
        if expect is not None:
            raise AssertionError("%s succeeded; expected %s" % (method, expect))
        return response

    def close(self):
        self.channel.close()


class Daemon:
    """The real prefixd binary on free ports, configured by `config_text`."""

    def __init__(self, binary, tmp, config_text):
        self.tmp = tmp
        self.grpc_address = "127.0.0.1:%d" % free_port()
        self.metrics_port = free_port()
        config = os.path.join(tmp, "prefixd.textproto")
        with open(config, "w") as f:
            f.write(config_text)
        self.out = open(os.path.join(tmp, "prefixd.log"), "w+")
        self.proc = subprocess.Popen(
            [binary, "--config", config, "--listen", self.grpc_address,
             "--metrics_listen", "127.0.0.1:%d" % self.metrics_port],
            stdin=subprocess.DEVNULL, stdout=self.out, stderr=subprocess.STDOUT)

    @property
    def metrics_url(self):
        return "http://127.0.0.1:%d/metrics" % self.metrics_port

    def wait_ready(self, client):
        """Waits for the gRPC port (one GetInfo, counted by `client`) and the
        metrics endpoint. Returns the GetInfo response."""
        def serving():
            if self.proc.poll() is not None:
                raise RuntimeError("prefixd exited %d:\n%s" % (self.proc.returncode, self.log()))
            port = int(self.grpc_address.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        wait_for("prefixd accepts gRPC connections", serving, START_TIMEOUT_S)
        info = client.call("GetInfo")
        wait_for("prefixd serves /metrics", lambda: "prefixd_build_info" in http_get(self.metrics_url),
                 START_TIMEOUT_S)
        return info

    def log(self):
        self.out.flush()
        self.out.seek(0)
        return self.out.read()

    def stop(self):
        """SIGTERM, then the exit code (kills after a deadline)."""
        return common.stop_process(self.proc)


class Prometheus:
    """A real Prometheus scraping `targets` (job "prefixd") every second."""

    def __init__(self, tmp, targets, rule_files=()):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            # JSON is YAML.
            json.dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                           "scrape_timeout": "900ms"},
                "rule_files": [os.path.abspath(r) for r in rule_files],
                "scrape_configs": [{"job_name": "prefixd",
                                    "static_configs": [{"targets": list(targets)}]}],
            }, f, indent=1)
        data = os.path.join(tmp, "prometheus-data")
        os.makedirs(data)
        self.out = open(os.path.join(tmp, "prometheus.log"), "w+")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + config, "--storage.tsdb.path=" + data,
             "--web.listen-address=127.0.0.1:%d" % self.port],
            stdin=subprocess.DEVNULL, stdout=self.out, stderr=subprocess.STDOUT)

    def wait_ready(self):
        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited %d:\n%s" % (self.proc.returncode, self.log()))
            return "Ready" in http_get(self.url + "/-/ready", timeout_s=2)
        wait_for("prometheus is ready", ready, START_TIMEOUT_S)

    def api(self, path, **params):
        """GET /api/v1/<path>; returns the whole JSON answer (status included).
        HTTP errors (e.g. 400 for a bad expression) return their JSON too."""
        url = "%s/api/v1/%s?%s" % (self.url, path, urllib.parse.urlencode(params))
        try:
            body = http_get(url)
        except urllib.error.HTTPError as e:
            body = e.read().decode("utf-8")
        return json.loads(body)

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = "%.3f" % at
        return self.api("query", **params)

    def log(self):
        self.out.flush()
        self.out.seek(0)
        return self.out.read()

    def stop(self):
        common.stop_process(self.proc)
        self.out.close()
