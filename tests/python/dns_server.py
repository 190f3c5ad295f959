"""A DNS server of the test's own, for names a daemon resolves in a mount
namespace (tests/python/hosts_namespace.py): UDP on 127.0.0.254:53, the
only nameserver of a resolv.conf mounted over /etc/resolv.conf. It answers
what the test sets while the daemon runs, as a cluster's DNS answers for a
headless Service:

  - a name in `records`: its IPv4 addresses (A), and no IPv6 (an empty
    AAAA answer);
  - any other name: NXDOMAIN, "this name has no addresses";
  - everything SERVFAIL while `failing` is set: the resolver could not
    answer (glibc's EAI_AGAIN, "Temporary failure in name resolution").

Messages are parsed and built by dnspython (python3-dnspython).

    dns = dns_server.start({"pool.test": ["127.0.0.1"]})  # SKIP if no :53
    dns.records["pool.test"] = ["127.0.0.1", "127.0.0.2"]
    dns.failing = True                       # dns.servfails counts them
"""

import collections
import socket
import sys
import threading

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

import common
import hosts_namespace

ADDRESS = "127.0.0.254"
TTL_S = 1


class DnsServer:
    def __init__(self, records):
        self.records = dict(records)
        self.failing = False
        self.servfails = collections.Counter()  # by name: queries answered SERVFAIL
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ADDRESS, 53))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:  # closed
                return
            self.sock.sendto(self.answer(dns.message.from_wire(data)).to_wire(), peer)

    def answer(self, query):
        response = dns.message.make_response(query)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True)
        if self.failing:
            self.servfails[name] += 1
            response.set_rcode(dns.rcode.SERVFAIL)
        elif name not in self.records:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A and self.records[name]:
            response.answer.append(dns.rrset.from_text_list(
                question.name, TTL_S, "IN", "A", self.records[name]))
        return response

    def close(self):
        self.sock.close()


def start(records):
    """Serves `records` and makes this namespace resolve through them
    (names in /etc/hosts still come first); exits with ctest's SKIP where
    127.0.0.254:53 cannot be bound."""
    try:
        server = DnsServer(records)
    except OSError as e:
        print("SKIP: no DNS server of the test's own on %s:53 (%s)" % (ADDRESS, e))
        sys.exit(common.SKIP)
    hosts_namespace.mount("nameserver %s\noptions timeout:1 attempts:1\n" % ADDRESS,
                          "/etc/resolv.conf")
    return server
