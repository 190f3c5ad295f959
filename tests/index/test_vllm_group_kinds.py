#!/usr/bin/python3
"""vLLM's KV-cache groups as its newest releases send them, over real
sockets to the real daemon (docs/index.md, "Hybrid models"). The events are
built field by field as vllm/distributed/kv_events.py declares BlockStored
(map form, one publisher per engine; tests/index/upstream.py), with the group kinds of vLLM's
KVCacheSpecKind and the store vLLM's BlockPool.cache_full_blocks makes of a
group with null blocks.

Checks:
  - an MLA model (DeepSeek, Kimi: every group `mla_attention`) is routed as
    full attention;
  - a model of `sliding_window_mla` and `mla_attention` groups (DeepSeek
    V4's kinds, here with one block size: V4's own window group has a block
    size of its own, which still makes nothing usable) follows the sliding
    window's rule;
  - a hybrid Mamba model in align mode: its Mamba group (group 0, as vLLM
    orders a model whose first layer is a Mamba layer) stores only the state
    of a prompt's last block, its token_ids covering every new block while
    block_hashes skips the null ones, before full attention's store of the
    same step. The worker is not cleared, and routes to the prefixes whose
    last block's state it holds.

Usage: test_vllm_group_kinds.py --prefixd PATH [--stubs DIR]
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
import upstream  # noqa: E402  (tests/index/upstream.py)

BS = 16
DEADLINE_S = 10
ENGINES = ("mla", "v4", "mamba")
stored = upstream.vllm_block_stored
removed = upstream.vllm_block_removed


def tokens(first_block, n_blocks):
    return list(range(first_block * BS, (first_block + n_blocks) * BS))


class VllmGroupKindsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.engines = {name: upstream.ZmqEventPublisher() for name in ENGINES}
        sources = "".join('  sources { name: "%s" endpoint: "%s" }\n' % (name, pub.endpoint)
                          for name, pub in cls.engines.items())
        config = "index {\n  block_size: %d\n%s}\n" % (BS, sources)
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        cls.client = prefixd.Client(cls.daemon.tcp)
        for pub in cls.engines.values():
            if not pub.wait_for_subscriber(DEADLINE_S):
                raise AssertionError("the daemon did not subscribe to %s" % pub.endpoint)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()
        for pub in cls.engines.values():
            pub.close()

    def publish(self, name, events):
        pub = self.engines[name]
        pub.publish(events)
        return prefixd_fixture.applied(self.client, self.daemon, {name: pub.last_seq},
                                       DEADLINE_S)[name]

    def route(self, name, toks):
        """(matched_blocks, full_attention_blocks) of worker `name`."""
        for w in self.client.route(toks, workers=[name]).workers:
            if w.worker == name:
                return w.matched_blocks, w.full_attention_blocks
        return None

    def test_mla_attention_is_full_attention(self):
        hashes = [101, 102, 103]
        w = self.publish("mla", [stored(hashes, None, tokens(0, 3), BS, group_idx=0,
                                        kv_cache_spec_kind="mla_attention")])
        self.assertEqual(w.clears, 0)
        self.assertEqual(self.route("mla", tokens(0, 3)), (3, 3))

    def test_sliding_window_mla_has_the_windows_rule(self):
        # A window of 33 tokens needs cdiv(32, 16) = 2 blocks before a
        # boundary: group 0 lost block 0 (vLLM frees what leaves the window).
        toks = tokens(10, 4)
        hashes = [201, 202, 203, 204]
        w = self.publish("v4", [
            stored(hashes, None, toks, BS, group_idx=0,
                   kv_cache_spec_kind="sliding_window_mla",
                   kv_cache_spec_sliding_window=33),
            stored(hashes, None, toks, BS, group_idx=1,
                   kv_cache_spec_kind="mla_attention"),
            removed(hashes[:1], group_idx=0)])
        self.assertEqual(w.clears, 0)
        self.assertEqual(self.route("v4", toks), (4, 4))
        self.assertEqual(self.route("v4", toks[:3 * BS]), (3, 3))
        # Boundary 2 needs blocks 0 and 1 in the window group: 0 is gone.
        self.assertEqual(self.route("v4", toks[:2 * BS]), (0, 2))

    def test_mamba_align_mode_stores_only_the_last_blocks_state(self):
        toks = tokens(20, 4)
        hashes = [301, 302, 303, 304]
        # The step that computes the prompt: Mamba's group first, its first
        # three new blocks null, so one hash for four blocks of tokens.
        w = self.publish("mamba", [
            stored(hashes[3:], None, toks, BS, group_idx=0,
                   kv_cache_spec_kind="mamba"),
            stored(hashes, None, toks, BS, group_idx=1,
                   kv_cache_spec_kind="full_attention")])
        self.assertEqual(w.clears, 0)
        self.assertEqual(w.state, prefixd.WorkerState.LIVE)
        self.assertEqual(self.route("mamba", toks), (4, 4))
        # No state at block 2's end: a prompt ending there computes it again.
        self.assertEqual(self.route("mamba", toks[:3 * BS]), (0, 3))
        # A later step extends the prompt by two blocks, the first null.
        more = tokens(24, 2)
        w = self.publish("mamba", [
            stored([306], 304, more, BS, group_idx=0, kv_cache_spec_kind="mamba"),
            stored([305, 306], 304, more, BS, group_idx=1,
                   kv_cache_spec_kind="full_attention")])
        self.assertEqual(w.clears, 0)
        self.assertEqual(self.route("mamba", toks + more), (6, 6))
        self.assertEqual(self.route("mamba", toks + more[:BS]), (4, 5))
        # vLLM evicts the state block: the prefix is no longer usable.
        self.publish("mamba", [removed([306], group_idx=0)])
        self.assertEqual(self.route("mamba", toks + more), (4, 6))


if __name__ == "__main__":
    if not ARGS.prefixd:
        print("SKIP: --prefixd not given")
        sys.exit(common.SKIP)
    common.unittest_main()
