"""Issue 20, item 2: users, bucket ownership, bucket policies and the
public-read canned ACL, over S3 (boto3, raw unsigned requests, the aws
cli) and the native protocol (the `percore` CLI), on a two-shard server so
that every change is seen on every shard at once."""

from __future__ import annotations

import http.client
import json
import subprocess

import pytest
from botocore.exceptions import ClientError

from conftest import ACCESS_KEY, SECRET_KEY, AwsCli, Server, make_s3_client, percore_bin, \
    unique_bucket_name


def code_of(call) -> str:
    with pytest.raises(ClientError) as ei:
        call()
    return ei.value.response["Error"]["Code"]


def user_cli(srv, *args, check=True):
    p = subprocess.run([str(percore_bin()), "user", *args, "--admin", f"127.0.0.1:{srv.admin_port}"],
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PERCORE_SECRET_KEY": SECRET_KEY})
    if check:
        assert p.returncode == 0, p.stderr
    return p


def add_user(srv, name):
    out = json.loads(user_cli(srv, "add", name).stdout)
    assert out["name"] == name and out["access_key"].startswith("PC") and len(out["secret_key"]) == 40
    return out


def client_of(srv, user):
    return make_s3_client(srv.endpoint, user["access_key"], user["secret_key"])


def anonymous(srv, method, path):
    conn = http.client.HTTPConnection("127.0.0.1", srv.s3_port, timeout=10)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def env():
    srv = Server(shards=2, name="users")
    srv.start()
    try:
        root = srv.client()
        alice, bob = add_user(srv, "alice"), add_user(srv, "bob")
        yield srv, root, alice, bob
    finally:
        srv.close()


def test_users_are_managed_through_the_admin_endpoint(env):
    srv, root, alice, bob = env
    listed = json.loads(user_cli(srv, "list").stdout)["users"]
    assert [(u["name"], u["access_key"]) for u in listed] == \
        [("alice", alice["access_key"]), ("bob", bob["access_key"])]
    assert all("secret_key" not in u for u in listed)
    p = user_cli(srv, "add", "alice", check=False)
    assert p.returncode != 0 and "exists" in p.stderr
    for bad in ("root", "has space", "x" * 65):
        assert user_cli(srv, "add", bad, check=False).returncode != 0
    # Without the admin token: refused, keys not shown.
    conn = http.client.HTTPConnection("127.0.0.1", srv.admin_port, timeout=10)
    conn.request("GET", "/users")
    r = conn.getresponse()
    assert r.status == 401 and alice["access_key"].encode() not in r.read()
    conn.close()
    p = subprocess.run([str(percore_bin()), "user", "list", "--admin", f"127.0.0.1:{srv.admin_port}",
                        "--secret-key", "wrong"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "secret key" in p.stderr


def test_ownership_isolates_users(env):
    srv, root, alice, bob = env
    a, b = client_of(srv, alice), client_of(srv, bob)
    ab, bb = unique_bucket_name("alice"), unique_bucket_name("bob")
    a.create_bucket(Bucket=ab)
    b.create_bucket(Bucket=bb)
    a.put_object(Bucket=ab, Key="private.txt", Body=b"alice's")
    assert code_of(lambda: a.create_bucket(Bucket=ab)) == "BucketAlreadyOwnedByYou"
    assert code_of(lambda: b.create_bucket(Bucket=ab)) == "BucketAlreadyExists"
    assert code_of(lambda: root.create_bucket(Bucket=ab)) == "BucketAlreadyExists"
    names = lambda c: {x["Name"] for x in c.list_buckets()["Buckets"]}
    assert ab in names(a) and bb not in names(a) and bb in names(b) and ab not in names(b)
    assert {ab, bb} <= names(root)
    for call in (lambda: b.get_object(Bucket=ab, Key="private.txt"),
                 lambda: b.head_object(Bucket=ab, Key="private.txt"),
                 lambda: b.put_object(Bucket=ab, Key="x", Body=b"x"),
                 lambda: b.delete_object(Bucket=ab, Key="private.txt"),
                 lambda: b.list_objects_v2(Bucket=ab),
                 lambda: b.delete_bucket(Bucket=ab),
                 lambda: b.put_bucket_policy(Bucket=ab, Policy=json.dumps({"Statement": [{
                     "Effect": "Allow", "Principal": "*", "Action": "s3:*",
                     "Resource": f"arn:aws:s3:::{ab}/*"}]})),
                 lambda: b.copy_object(Bucket=bb, Key="stolen", CopySource={"Bucket": ab, "Key": "private.txt"}),
                 lambda: b.get_object_tagging(Bucket=ab, Key="private.txt"),
                 lambda: b.put_bucket_cors(Bucket=ab, CORSConfiguration={"CORSRules": [
                     {"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}]})):
        assert code_of(call) in ("AccessDenied", "403"), call
    out = b.delete_objects(Bucket=ab, Delete={"Objects": [{"Key": "private.txt"}]})
    assert [e["Code"] for e in out["Errors"]] == ["AccessDenied"]
    assert a.get_object(Bucket=ab, Key="private.txt")["Body"].read() == b"alice's"
    # The root principal reaches everything.
    assert root.get_object(Bucket=ab, Key="private.txt")["Body"].read() == b"alice's"
    # Anonymous: nothing.
    assert anonymous(srv, "GET", f"/{ab}/private.txt")[0] == 403
    assert anonymous(srv, "GET", "/")[0] == 403


def test_bucket_policy_grants_and_denies(env, tmp_path):
    srv, root, alice, bob = env
    a, b = client_of(srv, alice), client_of(srv, bob)
    bucket = unique_bucket_name("shared")
    a.create_bucket(Bucket=bucket)
    for key in ("shared/x", "shared/secret-1", "public/p", "private/q"):
        a.put_object(Bucket=bucket, Key=key, Body=key.encode())
    policy = {"Version": "2012-10-17", "Statement": [
        {"Sid": "BobReads", "Effect": "Allow", "Principal": {"AWS": ["arn:aws:iam:::user/bob"]},
         "Action": ["s3:GetObject", "s3:ListBucket"],
         "Resource": [f"arn:aws:s3:::{bucket}/shared/*", f"arn:aws:s3:::{bucket}"]},
        {"Sid": "NoSecrets", "Effect": "Deny", "Principal": {"AWS": "bob"}, "Action": "s3:GetObject",
         "Resource": f"arn:aws:s3:::{bucket}/shared/secret*"},
        {"Sid": "Public", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
         "Resource": f"arn:aws:s3:::{bucket}/public/*"},
    ]}
    text = json.dumps(policy)
    a.put_bucket_policy(Bucket=bucket, Policy=text)
    assert json.loads(a.get_bucket_policy(Bucket=bucket)["Policy"]) == policy
    assert a.get_bucket_policy_status(Bucket=bucket)["PolicyStatus"]["IsPublic"] is True
    assert b.get_object(Bucket=bucket, Key="shared/x")["Body"].read() == b"shared/x"
    assert {o["Key"] for o in b.list_objects_v2(Bucket=bucket)["Contents"]} >= {"shared/x"}
    assert code_of(lambda: b.get_object(Bucket=bucket, Key="shared/secret-1")) == "AccessDenied"
    assert code_of(lambda: b.get_object(Bucket=bucket, Key="private/q")) == "AccessDenied"
    assert code_of(lambda: b.put_object(Bucket=bucket, Key="shared/new", Body=b"n")) == "AccessDenied"
    assert anonymous(srv, "GET", f"/{bucket}/public/p") == (200, b"public/p")
    assert anonymous(srv, "GET", f"/{bucket}/private/q")[0] == 403
    assert anonymous(srv, "GET", f"/{bucket}")[0] == 403
    # A copy needs read on the source: allowed for shared/, refused for secrets.
    bb = unique_bucket_name("bobs")
    b.create_bucket(Bucket=bb)
    b.copy_object(Bucket=bb, Key="c", CopySource={"Bucket": bucket, "Key": "shared/x"})
    assert code_of(lambda: b.copy_object(Bucket=bb, Key="c2",
                                         CopySource={"Bucket": bucket, "Key": "shared/secret-1"})) == "AccessDenied"
    # The aws cli reads the same policy.
    aws = AwsCli(srv.endpoint, tmp_path / "aws", access_key=alice["access_key"],
                 secret_key=alice["secret_key"])
    assert json.loads(aws.s3api("get-bucket-policy", "--bucket", bucket)["Policy"]) == policy
    a.delete_bucket_policy(Bucket=bucket)
    assert code_of(lambda: a.get_bucket_policy(Bucket=bucket)) == "NoSuchBucketPolicy"
    assert code_of(lambda: b.get_object(Bucket=bucket, Key="shared/x")) == "AccessDenied"
    assert anonymous(srv, "GET", f"/{bucket}/public/p")[0] == 403


def test_bad_policies_are_refused(env):
    srv, root, alice, bob = env
    a = client_of(srv, alice)
    bucket = unique_bucket_name("badpol")
    a.create_bucket(Bucket=bucket)
    stmt = {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
            "Resource": f"arn:aws:s3:::{bucket}/*"}
    cases = [
        ("{not json", "MalformedPolicy"),
        (json.dumps({"Statement": [{**stmt, "Resource": "arn:aws:s3:::someone-else/*"}]}), "MalformedPolicy"),
        (json.dumps({"Statement": [{**stmt, "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}]}),
         "NotImplemented"),
        (json.dumps({"Statement": [{**stmt, "Effect": "Perhaps"}]}), "MalformedPolicy"),
    ]
    for text, want in cases:
        assert code_of(lambda: a.put_bucket_policy(Bucket=bucket, Policy=text)) == want, text
    assert code_of(lambda: a.get_bucket_policy(Bucket=bucket)) == "NoSuchBucketPolicy"


def test_public_read_bucket_acl(env):
    srv, root, alice, bob = env
    a = client_of(srv, alice)
    bucket = unique_bucket_name("pubacl")
    a.create_bucket(Bucket=bucket)
    a.put_object(Bucket=bucket, Key="k", Body=b"v")
    assert anonymous(srv, "GET", f"/{bucket}")[0] == 403
    a.put_bucket_acl(Bucket=bucket, ACL="public-read")
    status, body = anonymous(srv, "GET", f"/{bucket}?list-type=2")
    assert status == 200 and b"<Key>k</Key>" in body
    grants = a.get_bucket_acl(Bucket=bucket)["Grants"]
    assert a.get_bucket_acl(Bucket=bucket)["Owner"]["ID"] == "alice"
    assert {(g["Grantee"].get("URI"), g["Permission"]) for g in grants} >= \
        {("http://acs.amazonaws.com/groups/global/AllUsers", "READ")}
    # Listing, not reading: objects need a policy.
    assert anonymous(srv, "GET", f"/{bucket}/k")[0] == 403
    assert code_of(lambda: a.put_object_acl(Bucket=bucket, Key="k", ACL="public-read")) == "NotImplemented"
    a.put_bucket_acl(Bucket=bucket, ACL="private")
    assert anonymous(srv, "GET", f"/{bucket}?list-type=2")[0] == 403


def native(srv, user, *args):
    return subprocess.run([str(percore_bin()), *args, "--endpoint", srv.native_endpoint,
                           "--access-key", user["access_key"], "--secret-key", user["secret_key"],
                           "--no-progress"],
                          capture_output=True, text=True, timeout=60)


def test_native_protocol_uses_the_same_keys_and_rules(env, tmp_path):
    srv, root, alice, bob = env
    a = client_of(srv, alice)
    bucket = unique_bucket_name("native")
    a.create_bucket(Bucket=bucket)
    a.put_object(Bucket=bucket, Key="n.bin", Body=b"native bytes")
    out = tmp_path / "n.bin"
    p = native(srv, alice, "get", f"{bucket}/n.bin", str(out))
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == b"native bytes"
    p = native(srv, bob, "get", f"{bucket}/n.bin", str(tmp_path / "b.bin"))
    assert p.returncode != 0 and "access denied" in p.stderr, p.stderr
    p = native(srv, bob, "ls")
    assert p.returncode == 0 and bucket not in p.stdout
    a.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Statement": [{
        "Effect": "Allow", "Principal": {"AWS": "bob"}, "Action": "s3:GetObject",
        "Resource": f"arn:aws:s3:::{bucket}/*"}]}))
    p = native(srv, bob, "get", f"{bucket}/n.bin", str(tmp_path / "b.bin"))
    assert p.returncode == 0, p.stderr
    src = tmp_path / "up.bin"
    src.write_bytes(b"bob writes")
    p = native(srv, bob, "put", str(src), f"{bucket}/up.bin")
    assert p.returncode != 0 and "access denied" in p.stderr, p.stderr
    wrong = {**bob, "secret_key": "x" * 40}
    p = native(srv, wrong, "ls")
    assert p.returncode != 0 and "authentication failed" in p.stderr


def test_removed_keys_stop_and_everything_survives_kill9(tmp_path):
    srv = Server(shards=2, name="users-restart")
    srv.start()
    try:
        carol, dave = add_user(srv, "carol"), add_user(srv, "dave")
        c = client_of(srv, carol)
        bucket = unique_bucket_name("carol")
        c.create_bucket(Bucket=bucket)
        c.put_object(Bucket=bucket, Key="k", Body=b"carol")
        c.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Statement": [{
            "Effect": "Allow", "Principal": {"AWS": "dave"}, "Action": "s3:GetObject",
            "Resource": f"arn:aws:s3:::{bucket}/*"}]}))
        srv.kill9()
        srv.start()
        c, d = client_of(srv, carol), client_of(srv, dave)
        assert d.get_object(Bucket=bucket, Key="k")["Body"].read() == b"carol"
        assert code_of(lambda: d.put_object(Bucket=bucket, Key="x", Body=b"x")) == "AccessDenied"
        assert code_of(lambda: d.create_bucket(Bucket=bucket)) == "BucketAlreadyExists"
        assert {x["Name"] for x in c.list_buckets()["Buckets"]} == {bucket}
        user_cli(srv, "remove", "dave")
        assert code_of(lambda: d.get_object(Bucket=bucket, Key="k")) == "InvalidAccessKeyId"
        srv.kill9()
        srv.start()
        d = client_of(srv, dave)
        assert code_of(lambda: d.list_buckets()) == "InvalidAccessKeyId"
        assert [u["name"] for u in json.loads(user_cli(srv, "list").stdout)["users"]] == ["carol"]
        # The root keys still work, and still reach carol's bucket.
        root = make_s3_client(srv.endpoint, ACCESS_KEY, SECRET_KEY)
        assert root.get_object(Bucket=bucket, Key="k")["Body"].read() == b"carol"
    finally:
        srv.close()


def test_deny_binds_the_owner_and_policies_can_open_writes(env):
    srv, root, alice, bob = env
    a, b = client_of(srv, alice), client_of(srv, bob)
    bucket = unique_bucket_name("dropbox")
    a.create_bucket(Bucket=bucket)
    a.put_object(Bucket=bucket, Key="locked/k", Body=b"v")
    a.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Statement": [
        {"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject",
         "Resource": f"arn:aws:s3:::{bucket}/locked/*"},
        {"Effect": "Allow", "Principal": "*", "Action": "s3:PutObject",
         "Resource": f"arn:aws:s3:::{bucket}/inbox/*"}]}))
    # The owner is bound by an explicit Deny; root is not.
    assert code_of(lambda: a.delete_object(Bucket=bucket, Key="locked/k")) == "AccessDenied"
    # Anyone may drop files into inbox/, and read nothing.
    b.put_object(Bucket=bucket, Key="inbox/from-bob", Body=b"hi")
    conn = http.client.HTTPConnection("127.0.0.1", srv.s3_port, timeout=10)
    conn.request("PUT", f"/{bucket}/inbox/anon", body=b"anonymous", headers={"Content-Length": "9"})
    assert conn.getresponse().status == 200
    conn.close()
    assert a.get_object(Bucket=bucket, Key="inbox/anon")["Body"].read() == b"anonymous"
    assert code_of(lambda: b.get_object(Bucket=bucket, Key="inbox/from-bob")) == "AccessDenied"
    assert code_of(lambda: b.put_object(Bucket=bucket, Key="elsewhere", Body=b"x")) == "AccessDenied"
    # Tags on the way in need s3:PutObjectTagging as well.
    assert code_of(lambda: b.put_object(Bucket=bucket, Key="inbox/tagged", Body=b"x",
                                        Tagging="expire=yes")) == "AccessDenied"
    # A missing bucket is NoSuchBucket to users, whatever they ask.
    assert code_of(lambda: b.get_object(Bucket=unique_bucket_name("missing"), Key="k")) == "NoSuchBucket"
    root.delete_object(Bucket=bucket, Key="locked/k")


def test_policy_changes_reach_every_shard_in_write_order(env):
    """Concurrent Put/DeleteBucketPolicy all succeed (none wedges or is
    refused), and the writes after them are in force on every shard (new
    connections land on either). What the race leaves in between is not
    observed here: the ordering itself rests on shard 0 serializing the
    writes (`config_writes`)."""
    import threading
    srv, root, alice, bob = env
    bucket = unique_bucket_name("racing")
    client_of(srv, alice).create_bucket(Bucket=bucket)
    text = json.dumps({"Statement": [{"Effect": "Allow", "Principal": {"AWS": "bob"},
                                      "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}"}]})

    def writer(i):
        c = client_of(srv, alice)
        for j in range(15):
            if (i + j) % 2:
                c.put_bucket_policy(Bucket=bucket, Policy=text)
            else:
                c.delete_bucket_policy(Bucket=bucket)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a = client_of(srv, alice)
    a.put_bucket_policy(Bucket=bucket, Policy=text)
    for _ in range(8):
        assert client_of(srv, bob).list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    a.delete_bucket_policy(Bucket=bucket)
    for _ in range(8):
        assert code_of(lambda: client_of(srv, bob).list_objects_v2(Bucket=bucket)) == "AccessDenied"


def test_removed_keys_stop_on_open_native_connections_and_names_are_not_reused(env):
    import percore
    srv, root, alice, bob = env
    erin = add_user(srv, "erin")
    e = client_of(srv, erin)
    bucket = unique_bucket_name("erin")
    e.create_bucket(Bucket=bucket)
    e.put_object(Bucket=bucket, Key="k", Body=b"erin's")
    c = percore.Client(srv.native_endpoint, access_key=erin["access_key"],
                       secret_key=erin["secret_key"], attempts=1, threads=1)
    assert c.get(bucket, "k") == b"erin's"
    user_cli(srv, "remove", "erin")
    with pytest.raises(Exception):
        c.get(bucket, "k")
    # The name still owns a bucket: a new "erin" would inherit it.
    p = user_cli(srv, "add", "erin", check=False)
    assert p.returncode != 0 and "still owns buckets" in p.stderr, p.stderr
    root.delete_object(Bucket=bucket, Key="k")
    root.delete_bucket(Bucket=bucket)
    add_user(srv, "erin")


def test_open_admin_writes_never_open_users():
    srv = Server(shards=1, name="users-open-admin", env={"PERCORE_ADMIN_OPEN_WRITES": "true"})
    srv.start()
    try:
        for method, path in (("POST", "/users/mallory"), ("GET", "/users"), ("DELETE", "/users/x")):
            conn = http.client.HTTPConnection("127.0.0.1", srv.admin_port, timeout=10)
            conn.request(method, path)
            assert conn.getresponse().status == 401, (method, path)
            conn.close()
        # The other writes are open, as configured.
        conn = http.client.HTTPConnection("127.0.0.1", srv.admin_port, timeout=10)
        conn.request("POST", "/cache/drop")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        srv.close()
