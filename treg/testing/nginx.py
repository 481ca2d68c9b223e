"""Debian's nginx in front of a treg under test: TLS terminated with a self-signed certificate made here,
treg served under a path prefix, on 127.0.0.1 only.

Everything nginx writes stays in a throwaway folder (its config, pid file, error and access logs, temp
paths); it runs in the foreground (``daemon off``) as a child process and is stopped by its PID. The
``location`` block is :data:`LOCATION`, the one docs/operations.md gives operators (its upstream address
and prefix filled in), so the test proves the documented configuration.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

NGINX = "/usr/sbin/nginx"

#: the ``location`` of treg behind nginx under a prefix (docs/operations.md prints it with
#: ``{prefix}`` = ``/treg`` and ``{upstream}`` = ``127.0.0.1:8080``)
LOCATION = """\
    # treg under {prefix}/: nginx strips the prefix, treg builds every URL it hands out with it
    # (TREG_PUBLIC_URL=https://<host>{prefix})
    location = {prefix} {{
        return 308 {prefix}/;
    }}
    location {prefix}/ {{
        # the request target exactly as the client sent it, minus the prefix: nginx's own
        # normalized $uri would decode %2F, merge // and resolve /../ before treg (and its deny
        # rules) saw them
        rewrite ^ $request_uri;
        rewrite ^{prefix}(/.*)$ $1 break;
        return 400;
        proxy_pass http://{upstream}$uri;

        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $http_host;
        # treg believes these only from TREG_TRUSTED_PROXIES (the address nginx connects from),
        # reads X-Forwarded-For from the right, and never relays either upstream
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
        # streamed both ways (server-sent events, large uploads); treg enforces its own body limits
        proxy_buffering off;
        proxy_request_buffering off;
        client_max_body_size 0;
        # longer than TREG_UPSTREAM_READ_TIMEOUT_S: a silent upstream is treg's to report
        proxy_read_timeout 330s;
        proxy_send_timeout 330s;
        # treg's Locations already carry the prefix (TREG_PUBLIC_URL): never rewritten here
        proxy_redirect off;
    }}
"""

_CONFIG = """\
daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
lock_file {dir}/nginx.lock;
events {{
    worker_connections 256;
}}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{http_extra}
    server {{
        listen 127.0.0.1:{port} ssl http2;
        server_name localhost;
        ssl_certificate {dir}/cert.pem;
        ssl_certificate_key {dir}/key.pem;
        location / {{
            return 404;
        }}
{location}
    }}
}}
"""


#: a cache shared between callers in front of treg, as an operator may add one (or a CDN does): it
#: stores what nginx's rules allow (``proxy_cache_valid``: any 200 not marked otherwise, for ten minutes),
#: keyed on the URL alone, and says in ``X-Cache`` whether it answered (``HIT``)
SHARED_CACHE_ZONE = "    proxy_cache_path {cache}/cache keys_zone=shared:1m use_temp_path=off;"
SHARED_CACHE = """\
        proxy_buffering on;
        proxy_cache shared;
        proxy_cache_valid 200 10m;
        add_header X-Cache $upstream_cache_status always;"""


def available() -> str | None:
    """None when nginx can run here, else why not (a test skips with that reason)."""
    if not (Path(NGINX).exists() or shutil.which("nginx")):
        return f"nginx is not installed ({NGINX}; apt-get install -y nginx)"
    return None


def self_signed(cert: Path, key: Path, names: tuple[str, ...] = ("localhost",),
                addresses: tuple[str, ...] = ("127.0.0.1",)) -> None:
    """A throwaway certificate (and its key) for ``names`` and ``addresses``, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else addresses[0])])
    now = dt.datetime.now(dt.timezone.utc)
    alt = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(private.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(private, hashes.SHA256()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    os.chmod(key, 0o600)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx listening on ``127.0.0.1:<port>`` with TLS, proxying ``<prefix>/`` to ``upstream``
    (``host:port`` of treg). Use as a context manager (or :meth:`start` / :meth:`stop`)."""

    def __init__(self, folder: Path, upstream: str, *, prefix: str = "/treg", port: int | None = None,
                 extra: str = "", shared_cache: bool = False) -> None:
        self.dir = Path(folder)
        self.upstream = upstream
        self.prefix = prefix.rstrip("/")
        self.port = port or free_port()
        #: more of the server block after treg's location (a site's own locations beside treg's)
        self.extra = extra
        #: treg's location with :data:`SHARED_CACHE` in place of the documented ``proxy_buffering off``
        #: (nginx caches only what it buffers)
        self.shared_cache = shared_cache
        #: where the cache lives: nginx's workers (an unprivileged user) write there, and cannot reach
        #: into pytest's own temporary folders; made by :meth:`start`, removed by :meth:`stop`
        self.cache_dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def origin(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """treg's public URL through this nginx (``TREG_PUBLIC_URL``)."""
        return self.origin + self.prefix

    @property
    def cert(self) -> Path:
        return self.dir / "cert.pem"

    def client_context(self) -> ssl.SSLContext:
        """A TLS client context trusting this nginx's certificate (and only it)."""
        ctx = ssl.create_default_context(cafile=str(self.cert))
        return ctx

    def config(self) -> str:
        location = LOCATION.format(prefix=self.prefix, upstream=self.upstream)
        http_extra = ""
        if self.shared_cache:
            location = location.replace("        proxy_buffering off;", SHARED_CACHE)
            assert "proxy_cache shared;" in location, "the documented location no longer turns buffering off"
            assert self.cache_dir is not None, "start() makes the cache's folder"
            http_extra = SHARED_CACHE_ZONE.format(cache=self.cache_dir)
        return _CONFIG.format(dir=self.dir, port=self.port, location=location + self.extra, http_extra=http_extra)

    def log(self) -> str:
        path = self.dir / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, wait_s: float = 30.0) -> "Nginx":
        self.dir.mkdir(parents=True, exist_ok=True)
        self_signed(self.cert, self.dir / "key.pem")
        if self.shared_cache and self.cache_dir is None:
            # nginx's master (root) makes ``cache`` inside and hands it to the workers' user
            self.cache_dir = Path(tempfile.mkdtemp(prefix="treg-nginx-cache-"))
            self.cache_dir.chmod(0o755)
        (self.dir / "nginx.conf").write_text(self.config())
        binary = NGINX if Path(NGINX).exists() else (shutil.which("nginx") or NGINX)
        # -e: the error log before the config is read (else nginx first opens the compiled-in path);
        # -p: relative paths resolve here, never under /usr/share/nginx or /var/lib/nginx
        self.proc = subprocess.Popen([binary, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"),
                                      "-e", str(self.dir / "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"nginx exited {self.proc.returncode}: {err}\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx never listened on {self.port}: {self.log()}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (nginx's fast stop: the master ends its workers) by PID; if it lingers, SIGKILL to the
        process group it was started in (the master and its workers, nothing else)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
        if self.cache_dir is not None:
            shutil.rmtree(self.cache_dir, ignore_errors=True)
            self.cache_dir = None

    def __enter__(self) -> "Nginx":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
