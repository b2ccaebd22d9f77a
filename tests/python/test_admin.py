"""Admin endpoint and start-up refusals of the real server."""

import subprocess
import urllib.error
import urllib.request

from conftest import SECRET_KEY, percore_bin


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def put(url, body, headers=None):
    req = urllib.request.Request(url, data=body, method="PUT", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_health_endpoints(server_factory):
    server = server_factory(shards=1)
    base = f"http://127.0.0.1:{server.admin_port}"
    assert get(base + "/health/live") == (200, b"ok\n")
    assert get(base + "/health/ready") == (200, b"ok\n")
    assert get(base + "/nope")[0] == 404


def test_admin_writes_need_the_secret_key(server_factory):
    """PUT /log/level changes the server: it needs `Authorization: Bearer
    <secret key>`; reads (/health, /metrics, GET /log/level) stay open."""
    server = server_factory(shards=1)
    base = f"http://127.0.0.1:{server.admin_port}"
    status, body = put(base + "/log/level", b"trace")
    assert status == 401, body
    assert b"Bearer" in body
    assert put(base + "/log/level", b"trace", {"Authorization": "Bearer wrong"})[0] == 403
    assert put(base + "/log/level", b"trace",
               {"Authorization": f"Basic {SECRET_KEY}"})[0] == 403
    assert get(base + "/log/level") == (200, b"info\n")
    assert put(base + "/log/level", b"debug",
               {"Authorization": f"Bearer {SECRET_KEY}"}) == (200, b"debug\n")
    assert get(base + "/log/level") == (200, b"debug\n")
    assert get(base + "/metrics")[0] == 200
    assert get(base + "/health/live") == (200, b"ok\n")


def test_admin_writes_with_own_credentials_and_open_writes(server_factory):
    server = server_factory(shards=1, env={"PERCORE_ACCESS_KEY": "ops",
                                           "PERCORE_SECRET_KEY": "ops-secret-123"})
    base = f"http://127.0.0.1:{server.admin_port}"
    assert put(base + "/log/level", b"debug",
               {"Authorization": f"Bearer {SECRET_KEY}"})[0] == 403
    assert put(base + "/log/level", b"debug",
               {"Authorization": "Bearer ops-secret-123"}) == (200, b"debug\n")
    server.terminate()
    # The operator's explicit opt-out: anyone reaching the port may write.
    server = server_factory(shards=1, env={"PERCORE_ADMIN_OPEN_WRITES": "1"})
    base = f"http://127.0.0.1:{server.admin_port}"
    assert put(base + "/log/level", b"debug") == (200, b"debug\n")


def test_restart_with_another_shard_count_is_refused(server_factory, tmp_path):
    srv = server_factory(shards=2)
    srv.terminate()
    proc = subprocess.run(
        [srv.binary, "serve", "--data", str(srv.data_dir), "--shards", "3", "--unpinned",
         "--s3", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode != 0
    assert "--shards 2" in proc.stderr, proc.stderr


def test_bad_config_file_is_refused(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("shard = 2\n")
    proc = subprocess.run([percore_bin(), "serve", "--config", str(cfg), "--data", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "unknown field" in proc.stderr, proc.stderr
