#!/usr/bin/python3
"""docs/metrics.md's series counts against a scrape of the real prefixd.

Starts prefixd on free ports with one fleet-index source (an endpoint nobody
publishes on: the worker and its series exist from the start), gives one
tenant traffic with prefixctl, scrapes /metrics, and checks every count the
Notes of docs/metrics.md state: RPC methods and codes, error series and
histograms, series per tenant, series per worker, and the index's fixed
families, and the Conductor API's (--index_http_listen). A new method, label
value or family that the doc does not follow fails here.

Usage: series_counts_test.py --prefixd PATH --prefixctl PATH --repo DIR [unittest args]
"""

import os
import re
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

import harness
import common  # tests/python/common.py, on the path harness sets

ARGS = None

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
         "eight": 8, "nine": 9, "ten": 10}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def number(text):
    return int(text) if text.isdigit() else WORDS[text]


def scrape(args, tmp):
    """Series lines ("name{labels} value") after one tenant's traffic."""
    addr = "127.0.0.1:%d" % free_port()
    metrics = "127.0.0.1:%d" % free_port()
    err = open(os.path.join(tmp, "prefixd.err"), "w+")
    proc = subprocess.Popen(
        [args.prefixd, "--listen", addr, "--metrics_listen", metrics, "--kv_budget", "64MiB",
         "--index_source", "w0=tcp://127.0.0.1:%d" % free_port(),
         "--index_http_listen", "127.0.0.1:%d" % free_port()],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        ctl = [args.prefixctl, "--addr", addr, "--tenant", "acme"]
        deadline = time.monotonic() + 30
        while subprocess.run(ctl + ["health"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline or proc.poll() is not None:
                err.seek(0)
                raise RuntimeError("prefixd did not start:\n" + err.read())
            time.sleep(0.1)
        subprocess.run(ctl + ["insert", "--tokens", "1-32", "--block_ids", "1,2"], check=True,
                       capture_output=True)
        subprocess.run(ctl + ["match", "--tokens", "1-32"], check=True, capture_output=True)
        with urllib.request.urlopen("http://%s/metrics" % metrics, timeout=10) as r:
            text = r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        err.close()
    return [l for l in text.splitlines() if l and not l.startswith("#")]


def labels(line, name):
    m = re.search(r'%s="([^"]*)"' % name, line)
    return m.group(1) if m else None


def scrape_counts(args):
    """The counts of the Notes of docs/metrics.md, as the scrape has them."""
    with tempfile.TemporaryDirectory(prefix="prefixd-series-") as tmp:
        lines = scrape(args, tmp)

    def family(name):
        return [l for l in lines if re.match(r"%s[{ ]" % re.escape(name), l)]

    errors = family("prefixd_rpc_errors_total")
    buckets = family("prefixd_index_event_lag_seconds_bucket")
    single = ["prefixd_index_route_requests_total", "prefixd_index_route_prompt_blocks_total",
              "prefixd_index_route_matched_blocks_total", "prefixd_index_entries",
              "prefixd_index_max_entries"]
    return {
        "methods": len({labels(l, "method") for l in errors}),
        "non-OK codes": len({labels(l, "code") for l in errors}),
        "error series": len(errors),
        "histograms": len(family("prefixd_rpc_duration_seconds_count")),
        "series per tenant": sum(1 for l in lines if labels(l, "tenant") == "acme"),
        "series per worker": sum(1 for l in lines if labels(l, "worker") == "w0"),
        "clear reasons": len(family("prefixd_index_clears_total")),
        "dropped-block reasons": len(family("prefixd_index_dropped_blocks_total")),
        "lag buckets": len(buckets) - 1,  # +Inf is not a bucket of its own
        "single index series": sum(len(family(n)) for n in single),
        "http request series": len(family("prefixd_index_http_requests_total")),
        "http histograms": len(family("prefixd_index_http_request_seconds_count")),
    }


CLAIMS = [
    ("methods", r"for each of the (\d+) methods"),
    ("non-OK codes", r"each of the (\d+) non-OK codes"),
    ("error series", r"fixed: (\d+ x \d+) error series"),
    ("histograms", r"error series and (\d+) histograms"),
    ("series per tenant", r"(\d+) series per tenant"),
    ("series per worker", r"each worker has (\d+) series"),
    ("clear reasons", r"(\d+) clear reasons"),
    ("dropped-block reasons", r"(\d+) dropped-block reasons"),
    ("lag buckets", r"a histogram of (\d+) buckets"),
    ("single index series", r"(\w+) single series"),
    ("http request series", r"(\d+ x \d+) request series"),
    ("http histograms", r"request series and (\d+) histograms"),
]


class SeriesCountsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(ARGS.repo, "docs", "metrics.md")) as f:
            cls.doc = " ".join(f.read().split())  # one line: claims wrap anywhere
        cls.actual = scrape_counts(ARGS)

    def test_counts(self):
        for what, pattern in CLAIMS:
            with self.subTest(what):
                m = re.search(pattern, self.doc)
                self.assertIsNotNone(m, "docs/metrics.md states no count of %s (/%s/)"
                                     % (what, pattern))
                stated = m.group(1)
                if " x " in stated:
                    a, b = stated.split(" x ")
                    value = int(a) * int(b)
                else:
                    value = number(stated)
                self.assertEqual(value, self.actual[what],
                                 "%s: docs/metrics.md says %s, the scrape has %d"
                                 % (what, stated, self.actual[what]))


def main():
    global ARGS
    ARGS, argv = harness.parse_flags(__doc__, "prefixd", "prefixctl", "repo")
    common.unittest_main(argv=argv)


if __name__ == "__main__":
    main()
