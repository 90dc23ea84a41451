#!/usr/bin/env python3
"""A stand-in coordinator for the web page: serves web/ and the vendored uPlot like the real
binary does, and canned JSON for /api/run, /api/peers and /api/history in one of several shapes.

    web_mock.py [--port N] [--scenario running|empty|finished|sparse|down]

running   a run in progress whose steps grow while it is polled
empty     a coordinator that has no peers and no steps yet
finished  a finished run, validation losses included
sparse    every optional field missing and some of the wrong type (the page must not throw)
down      every /api/ request fails with 503 (the page must show its banner)

web_page_test.py uses it (--mock) to check the page without an agora binary; run it by hand to
work on the page: `python3 tests/integration/web_mock.py --port 8000` and open the address.
"""
import argparse
import http.server
import json
import math
import os
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WEB = os.path.join(ROOT, "web")
VENDOR = os.path.join(ROOT, "deps", "node_modules", "uplot", "dist")
PAGE = 100  # steps per /api/history answer
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}

TOTAL_STEPS = 300  # train.steps of the canned run
FIRST_STEPS = 40  # steps final when a "running" mock starts; one more every 0.4 s
EVENT_KINDS = ["join", "join", "join", "phase", "checkpoint", "rejection", "drop", "resync", "leave"]
PEERS = [("a3f9c2d17e", "active", "agora/0.1.0 linux x86_64", 4.1, 0.36),
         ("7b01e8f4aa", "active", "agora/0.1.0 linux x86_64", 3.9, 0.34),
         ("c44d9e0b12", "syncing", "agora/0.1.0 <b>not bold</b>", 0.0, 0.0),
         ("e9a07d6c3f", "active", "agora/0.1.0 linux aarch64", 3.2, 0.30),
         ("0f5b2a9d84", "dropped", "agora/0.1.0 linux x86_64", 0.0, 0.0)]


class Run:
    """A synthetic run: `steps_done()` steps finalized, one per 0.4 s since start."""

    def __init__(self, scenario, total=TOTAL_STEPS):
        self.scenario = scenario
        self.total = total
        self.start = time.time()

    def steps_done(self):
        if self.scenario == "empty":
            return 0
        if self.scenario == "finished":
            return self.total
        return min(self.total, FIRST_STEPS + int((time.time() - self.start) / 0.4))

    def step_row(self, s):
        loss = 9.0 * math.exp(-s / 60) + 3.2 + 0.05 * math.sin(s)
        row = {"step": s, "loss": loss, "lr": 1e-2 * min(1, s / 10), "tokens_per_second": 5200 + 300 * math.sin(s / 7),
               "payload_bytes": 41000 + (s % 5) * 100, "allreduce_bytes": 3 * 4 * 2_700_000,
               "peers": 3, "seconds": 1.2, "at": self.start - 0.4 * (self.total - s)}
        if s % 25 == 0:
            row["val_loss"] = loss + 0.15
        return row

    def api_run(self):
        done = self.steps_done()
        if self.scenario == "sparse":
            return {"phase": None, "step": "seven", "peers": None, "model": "tiny", "counters": []}
        last = self.step_row(done) if done else {}
        return {
            "run_id": "run-20240501-7f3a", "phase": {"empty": "waiting", "finished": "finished"}.get(
                self.scenario, "training"),
            "step": done, "total_steps": self.total, "loss": last.get("loss"),
            "val_loss": None if self.scenario == "running" else last.get("val_loss", 3.41),
            "learning_rate": last.get("lr"), "tokens_per_second": last.get("tokens_per_second"),
            "payload_bytes_per_step": last.get("payload_bytes"),
            "allreduce_bytes_per_step": last.get("allreduce_bytes"),
            "peers": {"syncing": 1, "active": 3, "left": 0, "dropped": 1} if done else
                     {"syncing": 0, "active": 0, "left": 0, "dropped": 0},
            "counters": {"joins": 5, "leaves": 0, "drops": 1, "deadline_misses": 2, "checkpoints": done // 50,
                         "payloads_accepted": done * 3, "payloads_rejected": 1} if done else {},
            "started_at": self.start - 0.4 * self.total, "uptime_seconds": time.time() - self.start + 120,
            "model": {"preset": "tiny", "parameters": 2_700_000, "optimizer": "demo",
                      "batch_size": 24, "seq_len": 64},
        }

    def api_peers(self):
        if self.scenario == "empty":
            return []
        if self.scenario == "sparse":
            return [{"key": "abcdef0123456789"}, {"short": None, "state": 7, "share": "x"}, None]
        done = self.steps_done()
        return [{"key": short * 6 + "0000", "short": short, "state": st,
                 "drop_reason": "missed 2 deadlines" if st == "dropped" else None,
                 "endpoint": "tcp://127.0.0.1:75%02d" % i, "agent": agent,
                 "sequences_per_second": sps, "share": share, "strikes": 1 if i == 3 else 0,
                 "last_seen_seconds_ago": 0.4 + i, "applied_steps": done if st == "active" else 0,
                 "checkpointer": i == 0, "payload_bytes": 41000 * done, "commits": done}
                for i, (short, st, agent, sps, share) in enumerate(PEERS)]

    def api_history(self, since, events_since):
        """Like the coordinator: steps after `since`, at most PAGE of them ("more": true says
        to ask again), and events after `events_since`."""
        done = self.steps_done()
        if self.scenario == "sparse":
            return {"steps": [{"step": 1}, {"step": 2, "loss": "nan"}, {"loss": 3}, None],
                    "events": [{"text": "odd"}, None, {"seq": 2, "at": "not a time", "kind": 5}]}
        first = 1 if since is None else since + 1
        last = min(done, first + PAGE - 1)
        steps = [self.step_row(s) for s in range(first, last + 1)]
        events = [] if self.scenario == "empty" else [
            {"seq": i, "at": self.start - 100 + 10 * i, "kind": kind,
             "text": f"{kind} event number {i} <i>(markup stays text)</i>"}
            for i, kind in enumerate(EVENT_KINDS)
            if events_since is None or i > events_since]
        answer = {"steps": steps, "events": events}
        if last < done:
            answer["more"] = True
        return answer


def make_handler(run):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send(self, code, body, content_type):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            url = urllib.parse.urlparse(self.path)
            if url.path.startswith("/api/"):
                return self.api(url)
            if url.path == "/":
                path = os.path.join(WEB, "index.html")
            elif url.path.startswith("/vendor/"):
                path = os.path.join(VENDOR, os.path.basename(url.path))
            else:
                path = os.path.join(WEB, os.path.basename(url.path))
            if not os.path.isfile(path):
                return self.send(404, b"not found", "text/plain")
            with open(path, "rb") as f:
                self.send(200, f.read(), TYPES.get(os.path.splitext(path)[1], "application/octet-stream"))

        def api(self, url):
            if run.scenario == "down":
                return self.send(503, b"down", "text/plain")
            query = urllib.parse.parse_qs(url.query)
            if url.path == "/api/run":
                body = run.api_run()
            elif url.path == "/api/peers":
                body = run.api_peers()
            elif url.path == "/api/history":
                since, events_since = query.get("since"), query.get("events_since")
                body = run.api_history(int(since[0]) if since else None,
                                       int(events_since[0]) if events_since else None)
            else:
                return self.send(404, b"not found", "text/plain")
            self.send(200, json.dumps(body).encode(), "application/json")

    return Handler


def serve(scenario, port=0):
    """Starts the mock in a thread; returns the server (server.server_port, server.shutdown())."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), make_handler(Run(scenario)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--scenario", default="running",
                        choices=["running", "empty", "finished", "sparse", "down"])
    args = parser.parse_args()
    server = serve(args.scenario, args.port)
    print(f"mock coordinator ({args.scenario}) at http://127.0.0.1:{server.server_port}/")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
