"""What the tests of Pick's load from the engines share
(test_pick_engine_metrics.py, test_pick_engine_load_socket.py): a base
TestCase whose subclass starts `cls.daemon` (prefixd_fixture.Daemon) and
`cls.client`, and sets POLL_S (how often a condition is looked at),
REQUEST_TOKENS and KV_TOKENS (the daemon's index.pick weights, with
queued_weight 1). Deadlines are DEADLINE_S; calls time out after TIMEOUT.
"""

import re
import time
import unittest
import urllib.request

import prefixd_fixture

BS = 16
TIMEOUT = 10
DEADLINE_S = 10


class EngineLoadCase(unittest.TestCase):
    POLL_S = 0.1
    REQUEST_TOKENS = 10.0
    KV_TOKENS = 100.0

    @classmethod
    def tearDownClass(cls):
        """Stops the daemon and the engines' publishers (`cls.engines`,
        name -> kv_publisher.Publisher), those that were started."""
        if getattr(cls, "daemon", None) is not None:
            cls.daemon.close()
        for p in getattr(cls, "engines", {}).values():
            p.close()

    def dry_pick(self, **kw):
        """A dry Pick of a 2-block prompt: worker -> its ranked candidate."""
        r = self.client.pick(list(range(1, 2 * BS + 1)), dry_run=True, timeout=TIMEOUT, **kw)
        return {c.worker: c for c in r.ranked}

    def until(self, what, cond):
        """The first dry Pick whose candidates satisfy cond, within DEADLINE_S."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            got = self.dry_pick()
            if cond(got):
                return got
            if time.monotonic() > deadline:
                self.fail("%s: not seen within %ds; last: %s\nlogs:\n%s"
                          % (what, DEADLINE_S, got, self.daemon.logs()))
            time.sleep(self.POLL_S)

    def until_logged(self, text):
        deadline = time.monotonic() + DEADLINE_S
        while text not in self.daemon.logs():
            if time.monotonic() > deadline:
                self.fail("the daemon did not log %r:\n%s" % (text, self.daemon.logs()))
            time.sleep(self.POLL_S)

    def counter(self, family):
        """A counter family of the daemon's /metrics by worker and result:
        (worker, result) -> count."""
        with urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics,
                                    timeout=TIMEOUT) as r:
            text = r.read().decode()
        out = {}
        for m in re.finditer(r'^%s\{([^}]*)\} (\S+)$' % re.escape(family), text, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels["worker"], labels["result"])] = float(m.group(2))
        return out

    def assert_engine_load(self, c, running_waiting, kv):
        """Candidate c is charged its engine's reading: running + waiting
        requests in flight, KV usage kv, and the weights times them."""
        self.assertTrue(c.load_from_engine, c)
        self.assertFalse(c.load_from_request, c)
        self.assertEqual(c.requests_in_flight, running_waiting, c)
        self.assertAlmostEqual(c.kv_usage, kv, places=9, msg=c)
        self.assertAlmostEqual(c.load_term, c.queued_prefill_tokens
                               + running_waiting * self.REQUEST_TOKENS
                               + kv * self.KV_TOKENS, places=6)
        self.assertAlmostEqual(c.cost, c.prefill_tokens + c.load_term, places=6)

    def assert_start_fails(self, prefixd, pick, error):
        """A daemon whose index.pick is `pick` stops at start, saying `error`."""
        config = ('index { listen: "tcp://127.0.0.1:%d" pick { %s } }'
                  % (prefixd_fixture.free_port(), pick))
        said = prefixd_fixture.start_error(prefixd, config)
        self.assertIsNotNone(said, "the daemon started")
        self.assertIn(error, said)
