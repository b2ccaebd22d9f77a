"""Samples/s and client CPU per sample for Python readers of percore (issue 19).

Run through bench/python.sh (it starts the server pinned to one CPU and runs
this pinned to another). Every mode reads the same N samples of SIZE bytes,
in the same shuffled order, on one client core, with no DataLoader workers:

  a) percore.torch.IterableDataset over the native protocol (BatchGet)
  b) s3torchconnector's S3IterableDataset on percore's S3 endpoint
  c) boto3 get_object, one GET per sample
  d) percore.torch.IterableDataset over the S3 BatchGet extension

Prints one JSON line per mode.
"""

import json
import os
import random
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_pid(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def measure(label, server_pid, n, size, fn):
    t0, c0, s0 = time.perf_counter(), cpu_self(), cpu_pid(server_pid)
    got = fn()
    t1, c1, s1 = time.perf_counter(), cpu_self(), cpu_pid(server_pid)
    assert got == n * size, f"{label}: read {got} bytes, expected {n * size}"
    row = {
        "label": label, "samples": n, "seconds": round(t1 - t0, 3),
        "samples_per_sec": round(n / (t1 - t0), 1),
        "mb_per_sec": round(n * size / (t1 - t0) / 1e6, 1),
        "client_cpu_us_per_sample": round((c1 - c0) / n * 1e6, 1),
        "server_cpu_us_per_sample": round((s1 - s0) / n * 1e6, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def main():
    native, s3_url, server_pid, n, size, modes = (
        sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
        sys.argv[6].split(","))
    import percore
    import percore.torch as ptorch
    from percore.s3batch import S3BatchClient

    client = percore.Client(native)
    bucket = "bench-samples"
    keys = [f"train/{i:06d}.bin" for i in range(n)]
    try:
        client.create_bucket(bucket)
        blob = os.urandom(size)
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda k: client.put(bucket, k, blob), keys))
    except percore.BucketExists:
        pass
    # Let the server finish what the load left (sealing, compaction) so the
    # first mode is not charged for it: wait for half a second of idle CPU.
    for _ in range(60):
        c0 = cpu_pid(server_pid)
        time.sleep(0.5)
        if cpu_pid(server_pid) - c0 < 0.02:
            break
    order = list(keys)
    random.Random(0).shuffle(order)

    def run_dataset(c):
        ds = ptorch.IterableDataset(bucket, keys=order, client=c, shuffle=False, batch=64,
                                    prefetch=4)
        return sum(len(v) for _, v in ds)

    def run_s3torch():
        from s3torchconnector import S3ClientConfig, S3MapDataset
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "percore")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "percore-secret")
        uris = [f"s3://{bucket}/{k}" for k in order]
        ds = S3MapDataset.from_objects(uris, region="us-east-1", endpoint=s3_url,
                                       s3client_config=S3ClientConfig(force_path_style=True))
        return sum(len(ds[i].read()) for i in range(len(uris)))

    def run_boto3():
        import boto3
        from botocore.config import Config
        s3 = boto3.client("s3", endpoint_url=s3_url, aws_access_key_id="percore",
                          aws_secret_access_key="percore-secret", region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
        return sum(len(s3.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in order)

    table = {
        "a_native_batchget": lambda: run_dataset(client),
        "b_s3torchconnector": run_s3torch,
        "c_boto3_get": run_boto3,
        "d_s3_batchget": lambda: run_dataset(S3BatchClient(s3_url)),
    }
    for m in modes:
        # "mode@note" runs `mode` and labels the row with the note.
        measure(m, server_pid, n, size, table[m.split("@")[0]])


if __name__ == "__main__":
    main()
