#!/usr/bin/env python3
"""Writes the hand-made seed inputs of the fuzz targets into corpus/<target>/
(seed-*.bin). cargo fuzz grows and minimizes the rest; see README.md.
record_header seeds come from a real data directory: pass one with
--data DIR (written by `percore serve`) to add its record headers."""
import hashlib, hmac, os, struct, sys

here = os.path.dirname(os.path.abspath(__file__))

def put(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"seed-{name}.bin"), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

# http_request: first byte seeds the read sizes, then a request.
reqs = {
    "get": "GET /b/k HTTP/1.1\r\nHost: x\r\n\r\n",
    "put-length": "PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    "put-chunked": "PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n",
    "expect": "PUT /b/k HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
    "http10": "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    "te-cl": "POST /b?delete HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "pipelined": "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
    "v2": "GET / HTTP/2.0\r\n\r\n",
}
for i, (n, r) in enumerate(reqs.items()):
    put("http_request", n, bytes([i * 37 % 256]) + r.encode())

# s3_route: 8 bytes of object size, target line, Range value.
def route(size, target, rng):
    return struct.pack("<Q", size) + target.encode() + b"\n" + rng.encode()
put("s3_route", "single", route(1000, "/bucket/dir/key%20x?versionId=1", "bytes=0-99"))
put("s3_route", "suffix", route(1 << 20, "/b/k?partNumber=2&uploadId=a%2Fb", "bytes=-500"))
put("s3_route", "multi", route(10000, "/b/%E2%82%AC?list-type=2&prefix=a%2F", "bytes=0-0,5-9,100-,-1"))
put("s3_route", "open", route(0, "/b/k", "bytes=5-"))
put("s3_route", "badutf8", route(7, "/b/%FF%FE?x=%00", "bytes=abc"))

# sigv4_auth: method, path, query, header lines; signed for AKIDEXAMPLE /
# "secret" at 2023-11-14T22:13:20Z (the property's fixed clock).
def sign(method, path, query, headers, secret="secret"):
    date = "20231114T221320Z"
    scope = "20231114/us-east-1/s3/aws4_request"
    hs = dict(headers, **{"x-amz-date": date})
    names = sorted(hs)
    canon = "\n".join([method, path, query] + [f"{n}:{hs[n]}" for n in names] + ["", ";".join(names), hs.get("x-amz-content-sha256", "UNSIGNED-PAYLOAD")])
    sts = "\n".join(["AWS4-HMAC-SHA256", date, scope, hashlib.sha256(canon.encode()).hexdigest()])
    k = ("AWS4" + secret).encode()
    for part in ["20231114", "us-east-1", "s3", "aws4_request"]:
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
    hs["authorization"] = f"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{scope}, SignedHeaders={';'.join(names)}, Signature={sig}"
    return "\n".join([method, path, query] + [f"{n}: {v}" for n, v in hs.items()])
put("sigv4_auth", "signed-get", sign("GET", "/b/k", "", {"host": "127.0.0.1:9000", "x-amz-content-sha256": "UNSIGNED-PAYLOAD"}))
put("sigv4_auth", "signed-list", sign("GET", "/b", "list-type=2&prefix=a%2F", {"host": "h", "x-amz-content-sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}))
put("sigv4_auth", "streaming", sign("PUT", "/b/k", "", {"host": "h", "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "x-amz-decoded-content-length": "5"}))
put("sigv4_auth", "wrong-secret", sign("GET", "/b/k", "", {"host": "h", "x-amz-content-sha256": "UNSIGNED-PAYLOAD"}, "nope"))
put("sigv4_auth", "presigned", "GET\n/b/k\nX-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20231114%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20231114T221320Z&X-Amz-Expires=600&X-Amz-SignedHeaders=host&X-Amz-Signature=" + "0" * 64 + "\nhost: h")
put("sigv4_auth", "sigv2", "GET\n/b/k\nAWSAccessKeyId=a&Signature=b&Expires=1\nhost: h")

# aws_chunked: seed byte (mode in seed % 3, announced length in the high
# bits), then the body. Signatures are not valid (the property compares
# whole vs split feeding, which fails identically), except structure.
sig = "a" * 64
put("aws_chunked", "signed", b"\x00" + f"5;chunk-signature={sig}\r\nhello\r\n0;chunk-signature={sig}\r\n\r\n".encode())
put("aws_chunked", "signed-trailer", b"\x01" + f"5;chunk-signature={sig}\r\nhello\r\n0;chunk-signature={sig}\r\nx-amz-checksum-crc32:AAAAAA==\r\nx-amz-trailer-signature:{sig}\r\n\r\n".encode())
put("aws_chunked", "unsigned-trailer", b"\x85" + b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32c:sOO8/Q==\r\n\r\n")
put("aws_chunked", "unsigned-two", b"\x02" + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")

# xml_body
put("xml_body", "create", '<?xml version="1.0" encoding="UTF-8"?>\n<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><LocationConstraint>us-east-1</LocationConstraint></CreateBucketConfiguration>')
put("xml_body", "complete", '<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>"0cc175b9c0f1b6a831c399e269772661"</ETag></Part><Part><ETag>&quot;x&quot;</ETag><PartNumber>2</PartNumber></Part></CompleteMultipartUpload>')
put("xml_body", "delete", '<Delete><Quiet>true</Quiet><Object><Key>a&amp;b&#x9;c&#65;</Key></Object><Object><Key><![CDATA[x<y]]></Key></Object></Delete>')
put("xml_body", "comment-pi", '<?xml version="1.0"?><!-- c --><s3:Delete xmlns:s3="u"><s3:Object a="1"><s3:Key>k</s3:Key></s3:Object></s3:Delete>')
put("xml_body", "doctype", '<!DOCTYPE x [<!ENTITY a "b">]><x>&a;</x>')

# record_header: from a real data directory's segment files.
if "--data" in sys.argv:
    data = sys.argv[sys.argv.index("--data") + 1]
    n = 0
    for root, _, files in os.walk(data):
        for f in sorted(files):
            raw = open(os.path.join(root, f), "rb").read()
            pos = 0
            while pos + 32 <= len(raw) and n < 40:
                magic, _, _, _, hb = struct.unpack_from("<IBBHI", raw, pos)
                if magic != 0x52435050 or not 32 <= hb <= 262144:
                    pos = (pos // 4096 + 1) * 4096
                    continue
                payload = struct.unpack_from("<Q", raw, pos + 16)[0]
                put("record_header", f"{n:02d}", raw[pos:pos + hb])
                n += 1
                pos += (hb + payload + 7) // 8 * 8
    print(f"{n} record headers from {data}")
