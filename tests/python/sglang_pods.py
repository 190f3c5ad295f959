"""SGLang workers for tests that follow them by URL (docs/index.md, "A pool
of SGLang workers"): a Pod is one worker's event publishers, its DP ranks
ZeroMQ PUB sockets on consecutive ports of its own address; a ServerInfo
answers GET /server_info on every local address as the pod at the address
the request reached does, with a wildcard event host as SGLang gives it.

Import after common.setup (it needs the generated client package).
"""

import http.server
import json
import ssl
import threading

import prefixd_fixture
from prefixd import kv_publisher as kvp


class Pod:
    """One SGLang worker's event publishers: DP ranks on consecutive ports
    of its own address."""

    def __init__(self, address, dp_size, block_size=16):
        self.address = address
        self.block_size = block_size
        for _ in range(50):
            base = prefixd_fixture.free_port()
            pubs = []
            try:
                for r in range(dp_size):
                    pubs.append(kvp.Publisher(
                        endpoint="tcp://%s:%d" % (address, base + r), replay_endpoint=None,
                        data_parallel_rank=r, bind=True))
                self.base, self.ranks = base, pubs
                return
            except Exception:  # zmq.ZMQError: a port of the block was taken
                for p in pubs:
                    p.close()
        raise RuntimeError("no free block of ports on %s" % address)

    def kv_events(self):
        return {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": self.base,
                "topic": "", "block_size": self.block_size, "dp_size": len(self.ranks)}

    def close(self):
        for p in self.ranks:
            p.close()


class ServerInfo(http.server.ThreadingHTTPServer):
    """GET /server_info on every local address, answered as the pod at the
    address the request reached; over TLS with `tls` = (certificate file,
    key file)."""

    def __init__(self, pods, tls=None):
        super().__init__(("0.0.0.0", 0), _Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.pods = {p.address: p for p in pods}
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        pod = self.server.pods.get(self.connection.getsockname()[0])
        status = 200 if self.path == "/server_info" and pod else 404
        body = json.dumps({"kv_events": pod.kv_events() if pod else None}).encode()
        prefixd_fixture.reply(self, status, body)

    def log_message(self, *args):
        pass
