"""nginx in front of `vllm serve` replicas, as docs/vllm.md (Replicas) configures it, for the replicas test.

The router runs ``deploy/nginx-leyline.conf`` itself: the only changes are the test's own ports for
8000/8001/8002 and its log folder for /var/log/nginx/ (``render_site``), inside a main file that
puts nginx's pid, error log and temp folders into the test's folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from leyline_testkit.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SITE_CONFIG = REPO / "deploy" / "nginx-leyline.conf"
ROUTER_PORT, REPLICA_PORTS, LOG_DIR = "127.0.0.1:8000", ("127.0.0.1:8001", "127.0.0.1:8002"), "/var/log/nginx/"
LOG_LINE = re.compile(r"session=(\S*) upstream=(\S+) status=(\d+) (\S+) (\S+)")


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def render_site(replica_urls: list[str], router_port: int, log_dir: Path) -> str:
    """deploy/nginx-leyline.conf with this run's addresses and log folder (nothing else changed)."""
    text = SITE_CONFIG.read_text()
    for placeholder in (ROUTER_PORT, *REPLICA_PORTS, LOG_DIR):
        assert placeholder in text, f"{SITE_CONFIG} no longer names {placeholder}"
    text = text.replace(ROUTER_PORT, f"127.0.0.1:{router_port}")
    for placeholder, url in zip(REPLICA_PORTS, replica_urls, strict=True):
        text = text.replace(placeholder, url.removeprefix("http://"))
    return text.replace(LOG_DIR, f"{log_dir}/")


class Router:
    """``nginx -c <main file>`` in the foreground, including the rendered site file."""

    def __init__(self, replica_urls: list[str], workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.access_log = workdir / "leyline-access.log"
        (workdir / "leyline.conf").write_text(render_site(replica_urls, self.port, workdir))
        temp = {name: workdir / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
        for folder in temp.values():
            folder.mkdir(exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""  # workers may then read the test's 0700 folders
        (workdir / "nginx.conf").write_text(
            f"{user}daemon off;\nworker_processes 1;\npid {workdir}/nginx.pid;\nerror_log {workdir}/error.log;\n"
            "events { worker_connections 256; }\n"
            "http {\n"
            + "".join(f"  {name}_temp_path {path};\n" for name, path in
                      (("client_body", temp["body"]), *((n, temp[n]) for n in ("proxy", "fastcgi", "uwsgi", "scgi"))))
            + f"  include {workdir}/leyline.conf;\n}}\n")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Router:
        binary = nginx_binary()
        assert binary, "no nginx: `make test-replicas` installs it (nginx-light)"
        check = subprocess.run([binary, "-t", "-c", str(self.workdir / "nginx.conf"), "-p", str(self.workdir)],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen([binary, "-c", str(self.workdir / "nginx.conf"), "-p", str(self.workdir)],
                                     stderr=subprocess.PIPE)
        for _ in range(100):
            try:
                httpx.get(self.base_url + "/healthz", timeout=2.0)
                return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer: {(self.workdir / 'error.log').read_text()}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def routes(self) -> list[tuple[str, str, int, str, str]]:
        """(session header, upstream, status, method, path) per request, from the site's access log."""
        lines = self.access_log.read_text().splitlines() if self.access_log.is_file() else []
        return [(s, u, int(st), m, p) for s, u, st, m, p in (LOG_LINE.search(line).groups() for line in lines)]


def metric(base_url: str, name: str, labels: str = "") -> float:
    """One sample of a replica's /metrics (0 when absent)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    pattern = rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$"
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


def sessions_on(base_url: str) -> set[str]:
    """The replica's own listing (GET /sessions, straight to it: listing is per replica)."""
    return {s["session_id"] for s in httpx.get(f"{base_url}/sessions", timeout=30).json()["sessions"]}
