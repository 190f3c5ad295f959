"""A demo inference engine without a GPU, for trying prefixd's fleet index
(docs/index.md, "Try it in five minutes") on one machine.

It publishes KV events on ZeroMQ exactly as stock vLLM or SGLang does
(prefixd.kv_publisher: the PUB socket, the replay ROUTER socket, both
msgpack encodings) from a paged KV pool with prefix caching and LRU eviction
(prefixd.engine_pool), fed a Mooncake trace or a file of prompts. It holds
no model and computes nothing: a request's prompt is cut into blocks, the
blocks the pool holds are hits, the others are "computed" and announced as
BlockStored, and the blocks they push out as BlockRemoved.

    prefixd-demo-engine --name=e0 --prompts=prompts.txt
    python3 -m prefixd.demo_engine --name=e0 --trace=conversation --loop

It binds 127.0.0.1 (tcp://127.0.0.1:5557, replay on 5558) unless told
otherwise, plays its share of the workload at --rate requests a second,
then stays up, idle, answering replay requests, until Ctrl-C or SIGTERM
(exit 0). Gaps and restarts on request: --drop_every, --restart_after, and
the signals SIGUSR1 (the next batch is not sent) and SIGUSR2 (restart now).
Exit codes: 0 stopped, 1 cannot run (a socket that does not bind, a missing
module), 2 usage (a flag, a file or a line of it that is wrong).

Needs python3-zmq and python3-msgpack (pip: the `demo` extra).
"""

import argparse
import os
import signal
import sys
import time

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
FORMATS = {  # --format -> (batch encoding, block hash kind), as the engines write them
    "vllm": ("map", "int"),
    "sglang": ("array", "int64"),
}
TRACE_NAMES = ("conversation", "synthetic")
LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")


class UsageError(Exception):
    """A flag, a file or a line of it that is wrong (exit 2)."""


# ---- the workload ----

def parse_token_list(text):
    """Token IDs as prefixctl's --tokens takes them: items separated by commas
    or whitespace, each N or an inclusive range A-B."""
    out = []
    for item in text.replace(",", " ").split():
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError("%r is not a token ID or a range A-B" % item)
        a, b = int(lo), int(hi) if sep else int(lo)
        if a > b or b >= 1 << 32:
            raise ValueError("%r: want A <= B < 2^32" % item)
        out.extend(range(a, b + 1))
    return out


def format_token_list(tokens):
    """The inverse: runs of 3 or more consecutive IDs become ranges."""
    items, i = [], 0
    while i < len(tokens):
        j = i
        while j + 1 < len(tokens) and tokens[j + 1] == tokens[j] + 1:
            j += 1
        if j - i >= 2:
            items.append("%d-%d" % (tokens[i], tokens[j]))
        else:
            items.extend(str(t) for t in tokens[i:j + 1])
        i = j + 1
    return ",".join(items)


def read_prompts(path):
    """[(line number, tokens)] of a prompt file: one prompt a line, token IDs
    as parse_token_list takes them; '#' starts a comment, blank lines skip."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError("--prompts=%s: %s" % (path, e.strerror))
    out = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            out.append((n, parse_token_list(text)))
        except ValueError as e:
            raise UsageError("%s:%d: %s" % (path, n, e))
    if not out:
        raise UsageError("--prompts=%s holds no prompt (one per line: token IDs "
                         "such as 1-64,1001-1032)" % path)
    return out


def find_trace(name, engine_pool):
    """The Mooncake JSONL file --trace names: a path, or conversation /
    synthetic from tests/data/mooncake of the source tree this package runs
    from or of the current directory."""
    if name not in TRACE_NAMES:
        if os.path.isfile(name):
            return name
        raise UsageError("--trace=%s: no such file (or one of %s)" % (name, ", ".join(TRACE_NAMES)))
    rel = os.path.join("tests", "data", "mooncake", "%s_trace.jsonl" % name)
    tried = [engine_pool.trace_path(name), os.path.abspath(rel)]
    for path in tried:
        if os.path.isfile(path):
            return path
    raise UsageError("--trace=%s: not found at %s; run from a prefixd source tree or pass the "
                     "file's path" % (name, " or ".join(tried)))


def parse_shard(text):
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise argparse.ArgumentTypeError("%r: want K/N with 0 <= K < N, e.g. 0/2" % text)
    return int(k), int(n)


class Workload:
    """This engine's requests, in order: (tokens, hold_steps, label)."""

    def __init__(self, args, engine_pool):
        k, n = args.shard
        if args.prompts:
            prompts = read_prompts(args.prompts)
            items = [(t, 1, "%s:%d" % (args.prompts, line)) for line, t in prompts]
            self.source = args.prompts
        else:
            path = find_trace(args.trace, engine_pool)
            reqs = engine_pool.load_trace(path)
            items = [(engine_pool.trace_tokens(r, args.block_size), r.hold_steps,
                      "%s request %d" % (os.path.basename(path), r.index)) for r in reqs]
            self.source = path
        self.total = len(items)
        self.items = items[k::n][:args.requests]
        self.shard = (k, n)
        if not self.items:
            raise UsageError("--shard=%d/%d of %s leaves no request (it has %d)"
                             % (k, n, self.source, self.total))

    def describe(self):
        k, n = self.shard
        share = "" if n == 1 else " (shard %d/%d)" % (k, n)
        return "%d of the %d requests of %s%s" % (len(self.items), self.total, self.source, share)


# ---- the endpoints ----

def endpoint_host(endpoint):
    """The host of tcp://HOST:PORT; None for ipc:// and inproc://."""
    if not endpoint.startswith("tcp://"):
        return None
    return endpoint[len("tcp://"):].rpartition(":")[0]


def check_endpoint(flag, endpoint):
    if endpoint.startswith(("ipc://", "inproc://")):
        return
    host = endpoint_host(endpoint)
    port = endpoint.rpartition(":")[2]
    if not host or not (port.isdigit() or port == "*"):
        raise UsageError("--%s=%s: want tcp://HOST:PORT (tcp://127.0.0.1:5557) or ipc://PATH"
                         % (flag, endpoint))


def is_loopback(endpoint):
    host = endpoint_host(endpoint)
    return host is None or host.startswith("127.") or host in LOOPBACK_HOSTS


# ---- the engine ----

class DemoEngine:
    """One engine: a Publisher, a pool, a workload, and the main loop's state.
    Thread safety: one thread (the main one) runs it; the signal handlers
    only set flags that the loop reads; the Publisher's replay thread reads
    its own buffer under its own lock."""

    def __init__(self, args, kv_publisher, engine_pool, out=sys.stdout):
        self.args = args
        self.out = out
        self.workload = Workload(args, engine_pool)
        encoding, hash_kind = FORMATS[args.format]
        self.pub = kv_publisher.Publisher(
            args.endpoint, args.replay_endpoint or None, encoding=encoding, hash_kind=hash_kind,
            buffer_steps=args.buffer_steps, topic=args.topic or "kv@%s@demo" % args.name,
            name=args.name, bind=not args.connect)
        self.pool = engine_pool.EnginePool(args.blocks, args.block_size, publisher=self.pub,
                                           hash_seed=args.name.encode(), name=args.name)
        self.next = 0               # the workload's next request
        self.played = 0             # requests submitted since the start (restarts included)
        self.prompt_blocks = 0      # their whole blocks (the hit rate's denominator)
        self.hit_blocks = 0         # of which the pool held (numerator)
        self.drop_armed_for = None  # the seq a drop_next() was armed for
        self.restarts = 0
        self.stop = False
        self.drop_requested = False
        self.restart_requested = False
        self.last = None            # the last request's tokens

    def say(self, text):
        print("%s: %s" % (self.args.name, text), file=self.out, flush=True)

    def banner(self):
        a, p = self.args, self.pub
        how = "connected to" if a.connect else "on"
        replay = ", replay on %s" % p.replay_endpoint if p.replay_endpoint else ", no replay"
        self.say("%s KV events %s %s%s"
                 % ({"vllm": "vLLM", "sglang": "SGLang"}[a.format], how, p.endpoint, replay))
        self.say("%s, a pool of %d blocks of %d tokens, %g requests/s%s"
                 % (self.workload.describe(), a.blocks, a.block_size, a.rate,
                    ", looping" if a.loop else ""))
        if not a.connect:
            self.say("index it with --index_source=%s" % p.source_flag())
        for flag, ep in (("endpoint", p.endpoint), ("replay_endpoint", p.replay_endpoint)):
            if ep and not a.connect and not is_loopback(ep):
                self.say("WARNING: --%s=%s is reachable from other hosts; KV events carry "
                         "every prompt's token IDs and have no authentication" % (flag, ep))

    # ---- one step ----

    def arm_drops(self):
        seq = self.pub.next_seq
        every = self.args.drop_every
        due = every and (seq + 1) % every == 0
        if self.drop_requested:
            self.say("SIGUSR1: the next batch will not be sent (a gap the index must replay)")
        if (due or self.drop_requested) and self.drop_armed_for != seq:
            self.pub.drop_next(1)
            self.drop_armed_for = seq
        self.drop_requested = False

    def submit_next(self):
        """Submits the next request of the workload; False when there is none."""
        if self.next >= len(self.workload.items):
            if not self.args.loop:
                return False
            self.next = 0
        tokens, hold, label = self.workload.items[self.next]
        self.next += 1
        r = self.pool.submit(tokens, hold_steps=hold)
        if r.state == "refused":
            self.say("%s needs %d blocks, the pool has %d: skipped"
                     % (label, -(-len(tokens) // self.args.block_size), self.args.blocks))
            return True
        self.played += 1
        self.last = tokens
        self.prompt_blocks += len(r.hashes)
        return True

    def step(self):
        """One tick: a request (if any is left), one pool step. False once the
        workload is played and the pool is idle."""
        self.arm_drops()
        before = self.pool.counts["hit_blocks"]
        submitted = self.submit_next()
        if not submitted and self.pool.idle():
            return False
        self.pool.step()
        self.hit_blocks += self.pool.counts["hit_blocks"] - before
        a = self.args
        if a.restart_after and self.restarts == 0 and self.pub.next_seq >= a.restart_after:
            self.restart_requested = True
        return True

    def restart(self):
        self.pool.restart()
        self.drop_armed_for = None
        self.next = 0
        self.restarts += 1
        self.say("restarted: cache empty, batches numbered from 0 again, workload from the start")

    # ---- reports ----

    def summary(self):
        text = ("%d requests, %d batches (last seq %d), %d blocks cached, %d of %d prompt blocks "
                "were hits" % (self.played, self.pub.next_seq, self.pub.last_seq,
                               self.pool.cached_blocks(), self.hit_blocks, self.prompt_blocks))
        if self.pub.dropped:
            text += ", %d batches not sent" % len(self.pub.dropped)
        if self.restarts:
            text += ", %d restart%s" % (self.restarts, "" if self.restarts == 1 else "s")
        return text

    def done(self):
        self.say("done: %s; idle until Ctrl-C, serving replay" % self.summary())
        if self.last is not None:
            self.say("its last prompt: prefixctl route --tokens %s" % format_token_list(self.last))

    # ---- the loop ----

    def wait_for_index(self):
        """Waits up to --wait_for_index seconds for a subscriber (an index's
        SUB socket) before playing; the XPUB socket sees it subscribe."""
        if not self.args.wait_for_index:
            return
        self.say("waiting up to %gs for an index to subscribe" % self.args.wait_for_index)
        deadline = time.monotonic() + self.args.wait_for_index
        while not self.stop and time.monotonic() < deadline:
            if self.pub.wait_for_subscriber(timeout=min(0.1, deadline - time.monotonic())):
                self.say("an index subscribed")
                return
        if not self.stop:
            self.say("no index subscribed; playing anyway")

    def run(self):
        """Plays the workload, then idles until stopped. Returns the exit code."""
        self.wait_for_index()
        period = 1.0 / self.args.rate
        tick = time.monotonic()
        last_report = tick
        idle = False
        while not self.stop:
            if self.restart_requested:
                self.restart_requested = False
                self.restart()
                idle = False
            if not idle:
                idle = not self.step()
                if idle:
                    self.done()
            now = time.monotonic()
            if not idle and self.args.progress and now - last_report >= self.args.progress:
                last_report = now
                self.say(self.summary())
            tick = max(tick + period, now - period) if not idle else now + 0.1
            time.sleep(max(0.0, tick - time.monotonic()))
        self.say("stopped: %s" % self.summary())
        self.pub.close()
        return EXIT_OK

    def on_signal(self, signum, _frame):
        """Sets a flag for the loop (which does the printing: a handler that
        prints could interrupt a print)."""
        if signum == signal.SIGUSR1:
            self.drop_requested = True
        elif signum == signal.SIGUSR2:
            self.restart_requested = True
        else:
            self.stop = True


# ---- the command line ----

HELP_EPILOG = """\
workload: --prompts FILE (one prompt per line, token IDs as `prefixctl route
  --tokens` takes them: 1-64,1001-1032; '#' comments) or --trace (default
  conversation: tests/data/mooncake/conversation_trace.jsonl of the source
  tree; block h of a trace is the tokens h*B .. h*B+B-1 for --block_size B,
  synthetic adding 2^22 to h; the done line prints a prompt to route). With
  --shard K/N the engine plays requests K, K+N, K+2N, ... (two engines
  with 0/2 and 1/2 split one workload as a round-robin router would).

gaps and restarts: a dropped batch gets its sequence number and enters the
  replay buffer but is not sent, so the index sees a gap and replays it. A
  restart empties the cache and numbers batches from 0 again (the index
  clears the worker) and plays the workload from the start.
  SIGUSR1: drop the next batch.  SIGUSR2: restart now.
  SIGINT (Ctrl-C), SIGTERM: stop (exit 0).

Everything it publishes is unauthenticated and carries the prompts' token
IDs: it binds 127.0.0.1 unless --endpoint names another address.
Exit codes: 0 stopped, 1 cannot run, 2 usage. See docs/index.md.
"""


def build_parser():
    ap = argparse.ArgumentParser(
        prog="prefixd-demo-engine", allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A demo engine without a GPU: publishes vLLM or SGLang KV events on\n"
        "ZeroMQ from a paged prefix cache fed a Mooncake trace or a prompt file,\n"
        "until stopped. For trying prefixd's fleet index (--index_source).",
        epilog=HELP_EPILOG)
    ap.add_argument("--name", default="demo-0",
                    help="the engine's name: its worker name in the index, its topic "
                    "kv@NAME@demo, its output's prefix (default: %(default)s)")
    ap.add_argument("--format", choices=list(FORMATS), default="vllm",
                    help="vllm: map-encoded batches, 64-bit unsigned block hashes (vLLM >= "
                    "0.9); sglang: array-encoded batches, signed 64-bit hashes "
                    "(default: %(default)s)")
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5557",
                    help="the PUB socket it binds (vLLM's kv-events-config endpoint); "
                    "tcp://*:PORT binds every interface (default: %(default)s)")
    ap.add_argument("--replay_endpoint", default="tcp://127.0.0.1:5558",
                    help="the ROUTER socket that resends buffered batches; '' for none "
                    "(default: %(default)s)")
    ap.add_argument("--connect", action="store_true",
                    help="connect the PUB socket to --endpoint (an index's --index_listen) "
                    "instead of binding it")
    ap.add_argument("--topic", default=None, help="every message's topic (default: kv@NAME@demo)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--prompts", metavar="FILE", help="one prompt per line (see below)")
    src.add_argument("--trace", default="conversation", metavar="NAME|FILE",
                     help="a Mooncake trace: conversation, synthetic, or a JSONL file "
                     "(default: %(default)s)")
    ap.add_argument("--shard", type=parse_shard, default=(0, 1), metavar="K/N",
                    help="play every Nth request from the (K+1)th (default: 0/1, all)")
    ap.add_argument("--requests", type=_positive(int), default=None, metavar="N",
                    help="play only the first N requests of its share (default: all)")
    ap.add_argument("--rate", type=_positive(float), default=20.0,
                    help="requests per second (default: %(default)g)")
    ap.add_argument("--loop", action="store_true",
                    help="play the workload again and again instead of idling at its end")
    ap.add_argument("--blocks", type=_positive(int), default=1024,
                    help="the KV pool's size in blocks (default: %(default)s)")
    ap.add_argument("--block_size", type=_positive(int), default=16,
                    help="tokens per block; the index's --index_block_size (default: "
                    "%(default)s)")
    ap.add_argument("--buffer_steps", type=_positive(int), default=10000,
                    help="batches the replay socket keeps (default: %(default)s)")
    ap.add_argument("--drop_every", type=_positive(int), default=None, metavar="N",
                    help="do not send batches N-1, 2N-1, ... (gaps the index replays)")
    ap.add_argument("--restart_after", type=_positive(int), default=None, metavar="N",
                    help="restart once after N batches")
    ap.add_argument("--wait_for_index", type=float, default=0.0, metavar="SECONDS",
                    help="wait up to SECONDS for an index to subscribe before playing; with a "
                    "replay socket an index that comes later catches up anyway (default: 0)")
    ap.add_argument("--progress", type=float, default=5.0, metavar="SECONDS",
                    help="a progress line this often while playing; 0: none (default: "
                    "%(default)g)")
    return ap


def _positive(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            v = 0
        if v <= 0:
            raise argparse.ArgumentTypeError("%r: want a positive number" % text)
        return v
    return parse


def _failing_endpoint(zmq, args):
    """Which of the engine's endpoints does not bind (for the error message)."""
    binds = [("--replay_endpoint", args.replay_endpoint)]
    if not args.connect:
        binds.insert(0, ("--endpoint", args.endpoint))
    for flag, endpoint in binds:
        if not endpoint:
            continue
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError:
            return "%s=%s" % (flag, endpoint)
        finally:
            sock.close(0)
    return " or ".join("%s=%s" % b for b in binds if b[1])


def _import_modules():
    try:
        from prefixd import engine_pool, kv_publisher
    except ImportError as e:
        print("prefixd-demo-engine: %s; it needs ZeroMQ and msgpack: apt install python3-zmq "
              "python3-msgpack (or pip install 'prefixd[demo]')" % e, file=sys.stderr)
        return None
    return kv_publisher, engine_pool


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    modules = _import_modules()
    if modules is None:
        return EXIT_FAILED
    import zmq
    try:
        check_endpoint("endpoint", args.endpoint)
        if args.replay_endpoint:
            check_endpoint("replay_endpoint", args.replay_endpoint)
        engine = DemoEngine(args, *modules)
    except UsageError as e:
        ap.print_usage(sys.stderr)
        print("prefixd-demo-engine: error: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except zmq.ZMQError as e:
        print("prefixd-demo-engine: cannot bind %s: %s (another engine on it? pick another port)"
              % (_failing_endpoint(zmq, args), e), file=sys.stderr)
        return EXIT_FAILED
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, engine.on_signal)
    engine.banner()
    return engine.run()


if __name__ == "__main__":
    sys.exit(main())
