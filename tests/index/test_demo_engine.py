#!/usr/bin/python3
"""prefixd-demo-engine (client/python/prefixd/demo_engine.py) against a real
prefixd index: its help, its usage and socket errors, and what the index
sees of its gaps, restarts, formats and progress.

Each engine is a process (`python3 -m prefixd.demo_engine`) on ports of its
own (tcp://127.0.0.1:*); the test reads the `--index_source=` its banner
prints and starts a real prefixd on it (tests/python/prefixd_fixture.py),
then polls ListWorkers until the index agrees with what the engine says it
did (no sleeps as synchronisation).

Usage: test_demo_engine.py --prefixd PATH [--stubs DIR] [unittest args]
"""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402

WAIT_S = 30
ANY_PORT = ["--endpoint=tcp://127.0.0.1:*", "--replay_endpoint=tcp://127.0.0.1:*"]
PROMPTS = "# a comment\n1-64,1001-1032\n\n1-64,2001-2048  # a question\n1-64,3001-3016\n"


class Engine:
    """A demo engine process; its output is collected by a thread."""

    def __init__(self, *flags, env=None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefixd.demo_engine"] + list(flags),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env or engine_env())
        self.lines = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def text(self):
        with self._lock:
            return "\n".join(self.lines)

    def wait_for(self, pattern, after=0):
        """The first match of `pattern` in the output from line `after` on."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with self._lock:
                lines = self.lines[after:]
            for line in lines:
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError("no %r in the engine's output:\n%s" % (pattern, self.text()))

    def source_flag(self):
        return self.wait_for(r"index it with (--index_source=\S+)").group(1)

    def stop(self, sig=signal.SIGINT):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)
        self.proc.stdout.close()
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.stop()


def engine_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = common.PYTHON_DIR
    return env


def run_engine(*flags):
    return subprocess.run([sys.executable, "-m", "prefixd.demo_engine"] + list(flags),
                          capture_output=True, text=True, env=engine_env(), timeout=WAIT_S)


def poll(what, fn, cond):
    deadline = time.monotonic() + WAIT_S
    value = fn()
    while not cond(value):
        if time.monotonic() > deadline:
            raise AssertionError("%s: still %r after %d s" % (what, value, WAIT_S))
        time.sleep(0.05)
        value = fn()
    return value


class DemoEngineTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="prefixd-demo-")
        self.prompts = os.path.join(self.tmp.name, "prompts.txt")
        with open(self.prompts, "w") as f:
            f.write(PROMPTS)
        self.engines = []
        self.daemon = None

    def tearDown(self):
        for e in self.engines:
            e.kill()
        if self.daemon is not None:
            self.daemon.close()
        self.tmp.cleanup()

    def engine(self, *flags):
        e = Engine(*flags)
        self.engines.append(e)
        return e

    def index(self, *flags):
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, "", args=list(flags))
        self.daemon.start()
        return prefixd.Client(self.daemon.tcp)

    def worker(self, client, name):
        return next(w for w in client.list_workers().workers if w.worker == name)

    # ---- the command line ----

    def test_help_lists_the_flags_signals_and_exit_codes(self):
        r = run_engine("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for text in ("--name", "--format", "--endpoint", "--replay_endpoint", "--connect",
                     "--topic", "--prompts", "--trace", "--shard", "--requests", "--rate",
                     "--loop", "--blocks", "--block_size", "--buffer_steps", "--drop_every",
                     "--restart_after", "--wait_for_index", "--progress", "tcp://127.0.0.1:5557",
                     "tcp://127.0.0.1:5558", "SIGUSR1", "SIGUSR2", "SIGTERM", "Exit codes"):
            self.assertIn(text, r.stdout)

    def test_usage_errors_name_the_flag_or_line(self):
        bad = os.path.join(self.tmp.name, "bad.txt")
        with open(bad, "w") as f:
            f.write("1-64\n1-16,x7\n")
        empty = os.path.join(self.tmp.name, "empty.txt")
        with open(empty, "w") as f:
            f.write("# nothing\n")
        cases = [
            (["--prompts=" + bad], "bad.txt:2: 'x7' is not a token ID or a range A-B"),
            (["--prompts=/nonexistent/p.txt"], "--prompts=/nonexistent/p.txt: No such file"),
            (["--prompts=" + empty], "holds no prompt"),
            (["--prompts=" + self.prompts, "--shard=2/2"], "--shard: '2/2': want K/N"),
            (["--prompts=" + self.prompts, "--shard=3/4"], "--shard=3/4 of"),
            (["--trace=/nonexistent.jsonl"], "--trace=/nonexistent.jsonl: no such file"),
            (["--prompts=" + self.prompts, "--rate=0"], "--rate: '0': want a positive number"),
            (["--prompts=" + self.prompts, "--endpoint=127.0.0.1:5557"],
             "--endpoint=127.0.0.1:5557: want tcp://HOST:PORT"),
            (["--prompts=" + self.prompts, "--trace=synthetic"], "not allowed with argument"),
            (["--index-source=x"], "unrecognized arguments: --index-source=x"),
        ]
        for flags, message in cases:
            r = run_engine(*flags)
            self.assertEqual(r.returncode, 2, (flags, r.stdout, r.stderr))
            self.assertIn(message, r.stderr, flags)

    def test_a_busy_port_names_the_endpoint(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            for flag in ("--endpoint", "--replay_endpoint"):
                flags = ANY_PORT + ["%s=tcp://127.0.0.1:%d" % (flag, port),
                                    "--prompts=" + self.prompts]
                r = run_engine(*flags)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn("cannot bind %s=tcp://127.0.0.1:%d: Address already in use"
                              % (flag, port), r.stderr)

    def test_binding_every_interface_warns(self):
        e = self.engine("--name=wide", "--endpoint=tcp://*:*", "--replay_endpoint=",
                        "--prompts=" + self.prompts)
        e.wait_for(r"^wide: WARNING: --endpoint=tcp://0\.0\.0\.0:\d+ is reachable from other "
                   r"hosts; KV events carry every prompt's token IDs and have no authentication")
        self.assertEqual(e.stop(), 0)
        loopback = self.engine("--name=lo", "--prompts=" + self.prompts, *ANY_PORT)
        loopback.wait_for(r"^lo: done: ")
        self.assertEqual(loopback.stop(), 0)
        self.assertNotIn("WARNING", loopback.text())

    # ---- against the index ----

    def test_the_index_equals_the_engine_after_gaps_and_a_restart(self):
        e = self.engine("--name=e0", "--trace=conversation", "--requests=120", "--rate=400",
                        "--blocks=256", "--drop_every=7", "--restart_after=40",
                        "--progress=0.05", "--wait_for_index=%d" % WAIT_S, *ANY_PORT)
        client = self.index(e.source_flag())
        done = e.wait_for(r"^e0: done: (\d+) requests, (\d+) batches \(last seq (\d+)\), "
                          r"(\d+) blocks cached, .*, (\d+) batches not sent, 1 restart;")
        last_seq, cached, dropped = int(done.group(3)), int(done.group(4)), int(done.group(5))
        self.assertGreater(dropped, 0)
        self.assertNotEqual((last_seq + 1) % 7, 0, "the last batch is one not sent: change "
                            "--requests, the index could not know it")
        e.wait_for(r"^e0: restarted: cache empty, batches numbered from 0 again")
        e.wait_for(r"^e0: \d+ requests, \d+ batches \(last seq \d+\), \d+ blocks cached")
        w = poll("e0 in the index", lambda: self.worker(client, "e0"),
                 lambda w: w.last_seq == last_seq and w.state == prefixd.WorkerState.LIVE)
        self.assertEqual(w.mediums.get("GPU", 0), cached, w)
        self.assertGreater(w.gaps, 0, w)
        self.assertGreaterEqual(w.replays, w.gaps, w)
        self.assertGreaterEqual(w.clears, 1, w)  # the restart (the engine started before)
        tokens = [int(t) for t in expand(e.wait_for(r"route --tokens (\S+)").group(1))]
        r = client.route(tokens)
        self.assertEqual(r.best_worker, "e0")
        self.assertEqual(r.workers[0].matched_blocks, len(tokens) // 16)
        self.assertEqual(e.stop(signal.SIGTERM), 0)
        self.assertRegex(e.text(), r"e0: stopped: ")

    def test_signals_drop_a_batch_and_restart(self):
        e = self.engine("--name=e1", "--trace=synthetic", "--requests=30", "--rate=200",
                        "--loop", "--blocks=512", "--progress=0", *ANY_PORT)
        client = self.index(e.source_flag())
        poll("e1 live with batches", lambda: self.worker(client, "e1"),
             lambda w: w.state == prefixd.WorkerState.LIVE and w.last_seq >= 5)
        e.proc.send_signal(signal.SIGUSR1)
        e.wait_for(r"^e1: SIGUSR1: the next batch will not be sent")
        poll("a gap, replayed", lambda: self.worker(client, "e1"), lambda w: w.gaps >= 1)
        clears = self.worker(client, "e1").clears
        n = len(e.lines)
        e.proc.send_signal(signal.SIGUSR2)
        e.wait_for(r"^e1: restarted: ", after=n)
        w = poll("a clear for the restart", lambda: self.worker(client, "e1"),
                 lambda w: w.clears > clears)
        self.assertGreaterEqual(w.replays, 1, w)
        self.assertEqual(e.stop(), 0)

    def test_sglang_format_and_connect_to_a_listening_index(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        client = self.index("--index_listen=tcp://127.0.0.1:%d" % port)
        e = self.engine("--name=sg", "--format=sglang", "--connect",
                        "--endpoint=tcp://127.0.0.1:%d" % port, "--replay_endpoint=",
                        "--prompts=" + self.prompts, "--wait_for_index=%d" % WAIT_S)
        e.wait_for(r"^sg: SGLang KV events connected to tcp://127\.0\.0\.1:%d, no replay" % port)
        w = poll("sg, named from its topic", lambda: [w for w in client.list_workers().workers
                                                      if w.worker == "sg"],
                 lambda ws: ws and ws[0].last_seq == 2)  # three prompts, three batches
        self.assertEqual(w[0].mediums["GPU"], 4 + 2 + 3 + 1)  # shared 4, then 2, 3, 1
        self.assertEqual(e.stop(), 0)


def expand(token_list):
    for item in token_list.split(","):
        a, _, b = item.partition("-")
        yield from range(int(a), int(b or a) + 1)


if __name__ == "__main__":
    unittest.main()
