"""A real run on loopback whose coordinator serves HTTP (page, JSON API, /metrics) and whose peers
serve /metrics: network_run.Run plus the monitoring flags. Shared by dashboards_test.py and
web_page_test.py."""
import json
import os
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from network_run import Run, free_port  # noqa: E402


class ObservedRun(Run):
    def __init__(self, agora, data, name, peers, steps, sets=()):
        super().__init__(agora, data, name, peers, steps, sets)
        self.http_port = free_port()
        self.metrics_ports = {}

    @property
    def url(self):
        return f"http://127.0.0.1:{self.http_port}"

    def start_coordinator(self, extra=()):
        super().start_coordinator(extra=("--http", f"127.0.0.1:{self.http_port}", *extra))

    def start_peer(self, i, key=None, extra=()):
        self.metrics_ports.setdefault(i, free_port())
        return super().start_peer(
            i, key, ["--metrics", f"127.0.0.1:{self.metrics_ports[i]}", *extra])

    def get(self, url, timeout=5):
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode()

    def api(self, path):
        return json.loads(self.get(self.url + path))

    def wait_http(self, url, timeout=60):
        """Waits until `url` answers 200; returns its body."""
        end = time.time() + timeout
        last = None
        while time.time() < end:
            try:
                return self.get(url)
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                last = e
            if self.coordinator and self.coordinator.poll() is not None:
                self.fail(f"the coordinator exited with {self.coordinator.returncode} before {url} answered")
            time.sleep(0.2)
        self.fail(f"{url} did not answer within {timeout} s: {last}")

    def coordinator_metrics(self):
        return self.wait_http(self.url + "/metrics")

    def peer_metrics(self, i):
        return self.wait_http(f"http://127.0.0.1:{self.metrics_ports[i]}/metrics")
