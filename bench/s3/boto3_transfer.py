#!/usr/bin/env python3
"""The reference side of s3_bench: one managed transfer of boto3 (the AWS
SDK for Python), tuned as its documentation suggests for large objects
(TransferConfig: 16 MiB parts, 8 threads), against the same server and
bytes as zcc's. Prints "seconds=S".

Usage: boto3_transfer.py upload|download ENDPOINT BUCKET KEY FILE
(credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)."""
import io
import sys
import time

import boto3
from boto3.s3.transfer import TransferConfig

MIB = 1 << 20


def main():
    op, endpoint, bucket, key, path = sys.argv[1:6]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    config = TransferConfig(multipart_threshold=16 * MIB, multipart_chunksize=16 * MIB,
                            max_concurrency=8, use_threads=True)
    start = time.perf_counter()
    if op == "upload":
        s3.upload_file(path, bucket, key, Config=config)
    else:
        buf = io.BytesIO()  # into memory, as zcc reads into staging
        s3.download_fileobj(bucket, key, buf, Config=config)
    print("seconds=%.6f" % (time.perf_counter() - start), flush=True)


if __name__ == "__main__":
    main()
