"""The real prefixd binary as a test fixture.

    with Daemon(binary, config_text='kv_budget: "64MiB"') as d:
        ... connect to d.tcp ("127.0.0.1:PORT") or d.unix ("unix:///tmp/.../prefixd.sock")
        rc = d.stop()          # SIGTERM, then the exit code

Listens on a free TCP port and a Unix socket in its own temporary directory
(the --listen, --metrics_listen and --snapshot_path flags override whatever
the config says), waits until grpc.health.v1 reports SERVING (no sleeps: the
wait is gRPC's own connectivity wait, bounded by a deadline), and is killed
on exit if a test forgot to stop it. With tls=True (a config with
auth.tls_cert_path) the health check goes over the Unix socket, which never
uses TLS.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import grpc

START_TIMEOUT_S = 30
# How the daemon says a --listen, --metrics_listen or --index_http_listen
# port was taken (server/listen_address.cc, server.cc, daemon.cc), and how
# often a start so refused is retried on other ports.
PORT_TAKEN = r"address already in use|in use or not bindable|cannot serve metrics"
PORT_RACE_RETRIES = 3
STOP_TIMEOUT_S = 20

# grpc.health.v1 by hand: Debian's python3-grpcio ships no grpc_health module.
# HealthCheckRequest{service=1}; HealthCheckResponse{status=1}, SERVING = 1.
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def _encode_health_request(service):
    data = service.encode()
    return (b"\x0a" + bytes([len(data)]) + data) if data else b""


def _decode_health_status(data):
    return data[1] if len(data) >= 2 and data[0] == 0x08 else 0


# A daemon that is starting refuses connections for a moment; gRPC's default
# reconnect backoff (1 s, growing) would make every wait last a second.
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 20),
                  ("grpc.min_reconnect_backoff_ms", 20),
                  ("grpc.max_reconnect_backoff_ms", 200)]


class DaemonFailed(Exception):
    pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_status(target, service="", timeout=5.0):
    """The grpc.health.v1 status number of `target` (1 = SERVING); raises
    grpc.RpcError when it cannot be asked within `timeout` seconds."""
    with grpc.insecure_channel(target, options=FAST_RECONNECT) as channel:
        check = channel.unary_unary(_HEALTH_CHECK, request_serializer=_encode_health_request,
                                    response_deserializer=_decode_health_status)
        return check(service, timeout=timeout, wait_for_ready=True)


class Daemon:
    def __init__(self, binary, config_text="", args=(), snapshot=True, tmp=None, tls=False,
                 index_http=None):
        """index_http: a host to serve the Conductor API on
        (--index_http_listen), on a port picked at each start like the
        others: index_http_port."""
        self.binary = binary
        self.tls = tls
        self.index_http = index_http
        self.index_http_port = None
        self.config_text = config_text
        self.extra_args = list(args)
        self.snapshot = snapshot
        self._own_tmp = tmp is None
        self.tmp = tmp or tempfile.mkdtemp(prefix="prefixd-test-")
        self.tcp = None
        self.unix = "unix://" + os.path.join(self.tmp, "prefixd.sock")
        self.metrics = None
        self.proc = None

    # ---- lifecycle ----

    def start(self, timeout=START_TIMEOUT_S):
        """Starts the daemon on free ports and waits until it serves. A port
        free_port() found can be taken before the daemon binds it (another
        test's daemon or engine binding an ephemeral port, under ctest -j):
        a start that fails only for that is retried on other ports."""
        config = os.path.join(self.tmp, "prefixd.textproto")
        with open(config, "w") as f:
            f.write(self.config_text)
        if getattr(self, "_out", None) is None:  # a restart appends to the same logs
            self._out = open(os.path.join(self.tmp, "prefixd.out"), "a+")
            self._err = open(os.path.join(self.tmp, "prefixd.err"), "a+")
        for attempt in range(PORT_RACE_RETRIES + 1):
            failed = self._launch(config, timeout)
            if failed is None:
                return self
            if attempt == PORT_RACE_RETRIES or not re.search(PORT_TAKEN, failed):
                raise DaemonFailed("prefixd exited with %d before serving:\n%s"
                                   % (self.proc.returncode, self.logs()))
        raise AssertionError("not reached")

    def _launch(self, config, timeout):
        """None once the daemon serves; its logs of this launch if it exited
        first. Raises DaemonFailed if it does not serve within `timeout`."""
        self.tcp = "127.0.0.1:%d" % free_port()
        self.metrics = "127.0.0.1:%d" % free_port()
        cmd = [self.binary, "--config=" + config, "--listen=" + self.tcp, "--listen=" + self.unix,
               "--metrics_listen=" + self.metrics]
        if self.index_http is not None:
            self.index_http_port = free_port()
            cmd.append("--index_http_listen=%s:%d" % (self.index_http, self.index_http_port))
        if self.snapshot:
            cmd.append("--snapshot_path=" + os.path.join(self.tmp, "snapshot.bin"))
        cmd += self.extra_args
        logged = len(self.logs())
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=self._err)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return self.logs()[logged:]
            try:
                # Blocks until the port accepts and answers, at most 1 s, so a
                # daemon that died is noticed within a second.
                if health_status(self.unix if self.tls else self.tcp, timeout=1.0) == 1:
                    return None
            except grpc.RpcError:
                pass
        self.kill()
        raise DaemonFailed("prefixd did not serve within %ds:\n%s" % (timeout, self.logs()))

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM; returns the exit code (None if it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def logs(self):
        text = ""
        for f in (getattr(self, "_out", None), getattr(self, "_err", None)):
            if f is not None:
                f.flush()
                f.seek(0)
                text += f.read()
        return text

    def close(self):
        self.kill()
        for f in (getattr(self, "_out", None), getattr(self, "_err", None)):
            if f is not None:
                f.close()
        self._out = self._err = None
        if self._own_tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False


def start_error(binary, config_text):
    """What a daemon started with `config_text` says as it fails to start;
    None if it serves (it is stopped either way)."""
    d = Daemon(binary, config_text, snapshot=False)
    try:
        d.start()
    except DaemonFailed as e:
        return str(e)
    finally:
        d.close()
    return None


def wait_for(what, cond, get, daemon, timeout=10.0, poll=0.05):
    """Calls get() until cond(its value) holds and returns that value;
    AssertionError naming `what`, the last value and the daemon's logs
    once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        got = get()
        if cond(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError("%s: not within %gs: %s\n%s"
                                 % (what, timeout, got, daemon.logs()))
        time.sleep(poll)


def port_of(endpoint):
    """The port of "tcp://HOST:PORT"."""
    return int(endpoint.rsplit(":", 1)[1])


def workers_by_name(client):
    """ListWorkers' workers, by name (a prefixd.Client)."""
    return {w.worker: w for w in client.list_workers().workers}


def reply(handler, status, body, content_type="application/json"):
    """Answers a request of an http.server handler with `body` (bytes)."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def applied(client, daemon, seqs, timeout=10.0):
    """Waits until each worker named in `seqs` ({name: seq}) has applied its
    batch of that sequence number (ListWorkers' last_seq); returns
    workers_by_name then."""
    return wait_for("batches %s applied" % seqs,
                    lambda ws: all(n in ws and ws[n].last_seq == s for n, s in seqs.items()),
                    lambda: workers_by_name(client), daemon, timeout)
