"""Admin endpoint and start-up refusals of the real server."""

import subprocess
import urllib.error
import urllib.request

from conftest import percore_bin


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_health_endpoints(server_factory):
    server = server_factory(shards=1)
    base = f"http://127.0.0.1:{server.admin_port}"
    assert get(base + "/health/live") == (200, b"ok\n")
    assert get(base + "/health/ready") == (200, b"ok\n")
    assert get(base + "/nope")[0] == 404


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
