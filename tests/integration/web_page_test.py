#!/usr/bin/env python3
"""The coordinator's web page in headless Chromium.

    web_page_test.py AGORA DATA_DIR ARTIFACTS_DIR   a real small run (coordinator --http, 2 peers)
    web_page_test.py --mock ARTIFACTS_DIR           the page against web_mock.py's canned runs

The page (web/) counts its own errors into <body data-errors> (window.onerror, unhandled
rejections, console.error, scripts or styles that failed to load), sets data-loaded="1" once
the first round trip to the JSON API rendered, and data-loss-points to the points in its loss
chart; `chromium --dump-dom` shows them after the page ran for a few seconds of virtual time.

Real run: no errors, loaded, both peers in the table (by their short keys from /api/peers), a
non-empty loss curve; a screenshot is saved as ARTIFACTS_DIR/dashboard.png.
Mock: the same checks on a run in progress, an empty run (no peers, no steps), a finished run,
one with missing and mistyped fields, and an unreachable API (the banner shows); its
screenshot is ARTIFACTS_DIR/dashboard-mock.png.

Fails, naming what is missing, when Chromium is not installed: scripts/setup.sh installs it, so a
machine set up for `make test` has it, and a skip would look like a pass.
"""
import html
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

VIRTUAL_TIME_MS = 8000
WINDOW = (1400, 1900)


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(browser, url, *flags):
    """Runs headless Chromium on `url` with a throw-away profile; returns its stdout."""
    profile = tempfile.mkdtemp(prefix="agora-chromium-")
    try:
        out = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--disable-extensions", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--virtual-time-budget={VIRTUAL_TIME_MS}", *flags, url],
            capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if out.returncode != 0:
        raise RuntimeError(f"chromium exited with {out.returncode}:\n{out.stderr[-3000:]}")
    return out.stdout


class Page:
    """What --dump-dom shows of the page."""

    def __init__(self, dom):
        self.dom = dom
        body = re.search(r"<body([^>]*)>", dom)
        self.body = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1))) if body else {}
        tbody = re.search(r'<tbody id="peers-body">(.*?)</tbody>', dom, re.S)
        self.peer_rows = re.findall(r"<tr data-state=\"[^\"]*\">(.*?)</tr>", tbody.group(1), re.S) if tbody else []
        events = re.search(r'<ol class="events" id="events">(.*?)</ol>', dom, re.S)
        self.events = re.findall(r"<li data-kind=", events.group(1)) if events else []
        banner = re.search(r'<div id="banner"([^>]*)>(.*?)</div>', dom, re.S)
        self.banner = None if not banner or "hidden" in banner.group(1) else html.unescape(banner.group(2))

    def attr(self, name, default=""):
        return self.body.get(name, default)

    def text_of(self, element_id):
        m = re.search(rf'id="{element_id}"[^>]*>(.*?)<', self.dom, re.S)
        return html.unescape(m.group(1)).strip() if m else None

    def errors(self):
        return int(self.attr("data-errors", "-1"))

    def loss_points(self):
        return int(self.attr("data-loss-points", "0") or 0)


def load(browser, url):
    return Page(chromium(browser, url, "--dump-dom"))


def screenshot(browser, url, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    chromium(browser, url, f"--screenshot={path}", f"--window-size={WINDOW[0]},{WINDOW[1]}")
    check_png(path)
    print(f"screenshot: {path}")


def check_png(path):
    """The PNG exists, has the window's size, and is not one flat colour (a blank page)."""
    if not os.path.exists(path):
        raise AssertionError(f"no screenshot at {path}")
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise AssertionError(f"{path} is not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    if (width, height) != WINDOW:
        raise AssertionError(f"{path} is {width}x{height}, expected {WINDOW[0]}x{WINDOW[1]}")
    idat = b"".join(data[i + 8:i + 8 + struct.unpack(">I", data[i:i + 4])[0]]
                    for i in chunk_offsets(data) if data[i + 4:i + 8] == b"IDAT")
    pixels = zlib.decompress(idat)
    if len(set(pixels)) < 64 or len(data) < 20000:
        raise AssertionError(f"{path} looks blank ({len(data)} bytes, {len(set(pixels))} distinct byte values)")


def chunk_offsets(data):
    i = 8
    while i + 8 <= len(data):
        yield i
        i += 12 + struct.unpack(">I", data[i:i + 4])[0]


def expect(condition, message, page=None):
    if not condition:
        detail = ""
        if page is not None:
            detail = f"\n  body attributes: {page.body}\n  banner: {page.banner}"
        raise AssertionError(message + detail)


def expect_clean(page, what):
    expect(page.errors() == 0, f"{what}: the page counted {page.errors()} errors "
           f"(last: {page.attr('data-last-error')!r})", page)


# ------------------------------------------------------------------------------ mock

def run_mock(browser, artifacts):
    import web_mock
    checks = {
        "running": check_mock_running,
        "empty": check_mock_empty,
        "finished": check_mock_finished,
        "sparse": check_mock_sparse,
        "down": check_mock_down,
    }
    for scenario, check in checks.items():
        server = web_mock.serve(scenario)
        url = f"http://127.0.0.1:{server.server_port}/"
        try:
            check(load(browser, url))
            if scenario == "running":
                screenshot(browser, url, os.path.join(artifacts, "dashboard-mock.png"))
        finally:
            server.shutdown()
        print(f"mock {scenario}: ok")


def check_mock_running(page):
    import web_mock
    expect_clean(page, "running")
    expect(page.attr("data-loaded") == "1", "running: the page did not load", page)
    # The mock starts with FIRST_STEPS steps final (rows 1..FIRST_STEPS) and adds more.
    expect(page.loss_points() >= web_mock.FIRST_STEPS,
           f"running: {page.loss_points()} loss points, expected {web_mock.FIRST_STEPS} or more", page)
    expect(len(page.peer_rows) == len(web_mock.PEERS),
           f"running: {len(page.peer_rows)} peer rows, expected {len(web_mock.PEERS)}", page)
    expect(len(page.events) == len(web_mock.EVENT_KINDS),
           f"running: {len(page.events)} events, expected {len(web_mock.EVENT_KINDS)}", page)
    # Peer-supplied strings are text, never markup.
    expect("&lt;b&gt;not bold&lt;/b&gt;" in page.dom and "<b>not bold</b>" not in page.dom,
           "running: a peer's agent string was rendered as HTML")
    expect(page.text_of("phase") == "training", f"running: phase {page.text_of('phase')!r}")
    expect(page.banner is None, "running: the unreachable banner shows", page)


def check_mock_empty(page):
    expect_clean(page, "empty")
    expect(page.attr("data-loaded") == "1", "empty: the page did not load", page)
    expect(page.loss_points() == 0, "empty: loss points without steps", page)
    expect("no peers yet" in page.dom and "no events yet" in page.dom, "empty: no empty-state text")


def check_mock_finished(page):
    import web_mock
    expect_clean(page, "finished")
    # Every step of the canned run, in pages of web_mock.PAGE rows (the page follows "more").
    expect(page.loss_points() == web_mock.TOTAL_STEPS,
           f"finished: {page.loss_points()} loss points, expected {web_mock.TOTAL_STEPS}", page)
    expect(page.text_of("eta") == "finished", f"finished: ETA reads {page.text_of('eta')!r}")


def check_mock_sparse(page):
    expect_clean(page, "sparse")
    expect(page.attr("data-loaded") == "1", "sparse: the page did not load", page)
    expect(page.text_of("loss") == "—", f"sparse: loss reads {page.text_of('loss')!r}, expected —")


def check_mock_down(page):
    expect_clean(page, "down")
    expect(page.attr("data-loaded") == "0", "down: data-loaded without an API", page)
    expect(page.banner and "cannot be reached" in page.banner, "down: no unreachable banner", page)


# ------------------------------------------------------------------------------ real run

def run_real(browser, agora, data, artifacts):
    from observed_run import ObservedRun
    run = ObservedRun(agora, data, "web", peers=2, steps=300,
                      sets=["network.min_peers=2", "train.eval_interval=2", "train.eval_windows=2"])
    run.start_coordinator()
    index = run.wait_http(run.url + "/")
    try:
        expect("<!doctype html>" in index.lower(), "GET / is not the page")
        run.get(run.url + "/vendor/uPlot.iife.min.js")

        # Before any peer: an empty run renders cleanly too.
        page = load(browser, run.url + "/")
        expect_clean(page, "before any peer joined")
        expect(page.attr("data-loaded") == "1", "the page did not load before any peer joined", page)

        for i in range(2):
            run.start_peer(i)
        run.wait_final(4)
        shorts = [p.get("short") for p in run.api("/api/peers")]
        expect(len(shorts) == 2 and all(shorts), f"/api/peers lists {shorts}")

        page = load(browser, run.url + "/")
        expect_clean(page, "during the run")
        expect(page.attr("data-loaded") == "1", "the page did not load", page)
        expect(page.loss_points() > 0, "the loss chart is empty", page)
        expect(len(page.peer_rows) == 2, f"the peers table has {len(page.peer_rows)} rows, expected 2", page)
        for short in shorts:
            expect(any(short in row for row in page.peer_rows), f"peer {short} is not in the table")
        expect(page.banner is None, "the unreachable banner shows", page)
        print(f"page: 0 errors, {page.loss_points()} loss points, peers {', '.join(shorts)}")

        screenshot(browser, run.url + "/", os.path.join(artifacts, "dashboard.png"))
    except (AssertionError, RuntimeError) as e:
        run.fail(str(e))
    run.cleanup()


def main():
    browser = find_chromium()
    if not browser:
        sys.exit("FAILED: Chromium is not installed (Debian: apt-get install chromium; "
                 "scripts/setup.sh installs it)")
    args = sys.argv[1:]
    try:
        if len(args) == 2 and args[0] == "--mock":
            run_mock(browser, args[1])
        elif len(args) == 3:
            run_real(browser, *args)
        else:
            print(__doc__)
            sys.exit(2)
    except (AssertionError, RuntimeError) as e:
        print(f"FAIL: {e}")
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
