#!/usr/bin/python3
"""The engine simulator (prefixd.engine_sim) against the real daemon, on the
first 300 requests of the Mooncake synthetic trace with a pool small enough
that the cache evicts all the time.

At the end, and in the middle of the run: the engine's ledger balances
(free + held by running requests + held by the cache == N), the engine's
view of the cache is exactly the daemon's (Dump's block IDs, Stats' cached
and pinned counts), and the daemon's own counters agree with the engine's.

Usage: test_engine_sim.py --prefixd PATH [--stubs DIR] [--trace FILE]
"""

import json
import os
import subprocess
import sys
import unittest

import common

ARGS = common.setup(__doc__, extra=lambda ap: ap.add_argument(
    "--trace", default=os.path.join(common.REPO, "tests", "data", "mooncake",
                                    "synthetic_trace.jsonl")))

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import engine_sim  # noqa: E402

N = 256                 # engine pool, in blocks
BLOCK_MIB = 2           # llama-3-8b fp16, 16-token blocks: 2 MiB a block
REQUESTS = 300


def config(budget_blocks):
    return 'kv_budget: "%dMiB"\nmodel { preset: "llama-3-8b" }\nblock_size: 16\n' % (
        budget_blocks * BLOCK_MIB)


class EngineSimTest(unittest.TestCase):
    def setUp(self):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        self.assertTrue(os.path.exists(ARGS.trace),
                        "trace %s missing (tests/data/mooncake in the repository)"
                        % ARGS.trace)

    def start(self, budget_blocks):
        d = prefixd_fixture.Daemon(ARGS.prefixd, config(budget_blocks))
        self.addCleanup(d.close)
        d.start()
        self.daemon = d
        c = prefixd.Client(d.unix, channel_options=prefixd_fixture.FAST_RECONNECT, deadline=10)
        self.addCleanup(c.close)
        return c

    def trace(self, n=REQUESTS):
        return list(engine_sim.read_trace(ARGS.trace, n))

    # ---- the checks ----

    def assert_same_view(self, sim, c):
        """The engine's view of the cache is the daemon's."""
        dumped = c.cached_block_ids()
        self.assertEqual(len(dumped), len(set(dumped)), "a block cached twice")
        self.assertEqual(set(dumped), sim.pool.cached)
        (t,) = c.stats().tenants
        self.assertEqual(t.cached_blocks, len(sim.pool.cached))
        in_use = {b for b in sim.pool.cached if sim.pool.ref[b] > 0}
        if sim.report.epoch_changes == 0:
            self.assertEqual(t.pinned_blocks, len(in_use),
                             "pinned blocks are those running requests read")
        return t

    def assert_ledger(self, sim, report):
        sim.pool.check()
        self.assertEqual(report.free + report.running + report.cached, N)
        self.assertEqual(report.running, 0)
        self.assertEqual(report.requests + report.rejected, REQUESTS)

    def assert_daemon_agrees(self, t, report):
        evicted = {e.reason: e.blocks for e in t.evictions}
        self.assertEqual(t.inserted_blocks, report.inserted_blocks)
        self.assertEqual(evicted.get("requested", 0), report.evicted_by_request)
        self.assertEqual(evicted.get("budget", 0) + evicted.get("limit", 0),
                         report.evicted_by_insert)
        self.assertEqual(t.inserted_blocks - sum(evicted.values()), t.cached_blocks)
        self.assertEqual((t.pinned_blocks, t.active_leases), (0, 0))

    # ---- the tests ----

    def test_ledger_balances_with_budget_equal_to_pool(self):
        c = self.start(budget_blocks=N)
        sim = engine_sim.EngineSim(c, N)
        checked = []

        def midway(s):
            if s.steps % 10 == 0 and s.running:
                self.assert_same_view(s, c)
                checked.append(s.steps)
        sim.step_hook = midway
        report = sim.run(self.trace())
        print("\n  budget = pool: " + report.summary())
        self.assertGreater(len(checked), 3)
        self.assert_ledger(sim, report)
        self.assertGreater(report.evicted_by_request, 0, "the allocator never ran dry")
        self.assertGreater(report.saved_tokens, 0)
        self.assert_daemon_agrees(self.assert_same_view(sim, c), report)

    def test_ledger_balances_when_inserts_evict(self):
        c = self.start(budget_blocks=N // 2)
        sim = engine_sim.EngineSim(c, N)
        report = sim.run(self.trace())
        print("\n  budget = pool / 2: " + report.summary())
        self.assert_ledger(sim, report)
        self.assertGreater(report.evicted_by_insert, 0)
        self.assertLessEqual(report.cached, N // 2)
        self.assert_daemon_agrees(self.assert_same_view(sim, c), report)

    def test_epoch_change_reclaims_everything_the_cache_held(self):
        c = self.start(budget_blocks=N)
        sim = engine_sim.EngineSim(c, N)
        at = {}

        def crash(s):
            if s.steps == 20:  # SIGKILL: no snapshot, so the restart has a new epoch
                at["cached"] = len(s.pool.cached)
                at["running"] = len(s.running)
                self.daemon.kill()
                self.daemon.start()
        sim.step_hook = crash
        report = sim.run(self.trace())
        print("\n  crash at step 20: " + report.summary())
        self.assertGreater(at["cached"], 0)
        self.assertGreater(at["running"], 0)
        self.assertEqual(report.epoch_changes, 1)
        self.assertGreaterEqual(report.reclaimed_blocks, at["cached"])
        self.assert_ledger(sim, report)
        t = self.assert_same_view(sim, c)
        self.assertEqual((t.pinned_blocks, t.active_leases), (0, 0))

    def test_identical_prompts_in_one_batch_free_redundant_ids(self):
        c = self.start(budget_blocks=N)
        sim = engine_sim.EngineSim(c, N, batch=4)
        req = next(r for r in self.trace() if 4 <= r.input_length // 512 <= 16)
        whole = req.input_length // 512
        copies = [engine_sim.TraceRequest(i, req.input_length, req.output_length, req.hash_ids)
                  for i in range(4)]
        report = sim.run(copies)  # one batch: all four miss, all four prefill
        self.assertEqual(report.redundant_blocks, 3 * whole)
        self.assertEqual(report.inserted_blocks, whole)
        report = sim.run(copies[:1])  # and now it hits
        self.assertEqual(report.matched_blocks, whole)
        sim.pool.check()
        self.assertEqual(report.free + report.cached, N)
        self.assertEqual(report.cached, whole)
        self.assert_same_view(sim, c)

    def test_a_restarted_engine_drops_what_the_daemon_held(self):
        c = self.start(budget_blocks=N)
        first = engine_sim.EngineSim(c, N)
        first.run(self.trace(40))
        self.assertGreater(len(c.cached_block_ids()), 0)
        second = engine_sim.EngineSim(c, N)  # a new process: its pool is empty
        self.assertEqual(second.stale_on_start, len(first.pool.cached))
        self.assertEqual(c.cached_block_ids(), [])
        report = second.run(self.trace(40))
        self.assertEqual(report.free + report.running + report.cached, N)
        self.assertEqual(set(c.cached_block_ids()), second.pool.cached)

    def test_another_model_is_refused(self):
        c = self.start(budget_blocks=N)
        with self.assertRaises(prefixd.FailedPrecondition):
            engine_sim.EngineSim(c, N, model_fingerprint="0123456789abcdef")

    def test_command_line(self):
        self.start(budget_blocks=N)
        env = dict(os.environ, PYTHONPATH=common.PYTHON_DIR)
        r = subprocess.run([sys.executable, "-m", "prefixd.engine_sim", "--addr",
                            self.daemon.unix, "--blocks", "128", "--requests", "50",
                            "--trace", ARGS.trace, "--json"],
                           env=env, capture_output=True, text=True, timeout=50)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual(out["free"] + out["running"] + out["cached"], 128)
        self.assertEqual(out["requests"] + out["rejected"], 50)


if __name__ == "__main__":
    unittest.main()
