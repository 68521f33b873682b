"""`adapterstore serve` as a real process: settings, health, graceful shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from loraserve.adapterstore.settings import parse_settings
from loraserve.common.config.sizes import parse_size
from loraserve.common.errors import InvalidArgument
from loraserve.testing.processes.services import free_port, wait_for_health
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.waiting import GUARD_S


def test_sizes_accept_binary_units() -> None:
    assert [parse_size(t) for t in ("10", "512MiB", "4GiB", "2g")] == [
        10,
        512 * 1024**2,
        4 * 1024**3,
        2 * 1024**3,
    ]


def test_flags_fall_back_to_environment_and_secret_files(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    environ = {
        "ADAPTERSTORE_BUCKET": "adapters",
        "ADAPTERSTORE_ACCESS_KEY_ID": "key",
        "ADAPTERSTORE_SECRET_ACCESS_KEY_FILE": str(secret),
        "ADAPTERSTORE_MAX_FILE_SIZE": "1GiB",
    }
    settings = parse_settings(["serve", "--poll-interval", "0.5"], environ)
    assert (settings.s3.bucket, settings.s3.secret_access_key) == ("adapters", "s3cret")
    assert settings.store.limits.max_file_size == 1024**3
    assert settings.log.poll_interval == 0.5
    assert "s3cret" not in repr(settings)


def test_missing_bucket_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="--bucket"):
        parse_settings(["serve"], {})


def test_a_malformed_trusted_signer_key_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "ci.pub"
    bad.write_text("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n")
    with pytest.raises(SystemExit):
        parse_settings(["serve", "--bucket", "adapters", "--trusted-signers", f"ci={bad}"], {})
    assert f"trusted signer {bad}: not an EC public key" in capsys.readouterr().err


def test_require_without_trusted_signers_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="--trusted-signers"):
        parse_settings(["serve", "--bucket", "adapters", "--signature-policy", "require"], {})


def _store_env(bucket: S3Bucket) -> dict[str, str]:
    """The environment of an `adapterstore serve` on `bucket`, flags left to env."""
    return os.environ | {
        "ADAPTERSTORE_S3_ENDPOINT": bucket.endpoint_url,
        "ADAPTERSTORE_BUCKET": bucket.bucket,
        "ADAPTERSTORE_REGION": bucket.region,
        "ADAPTERSTORE_ACCESS_KEY_ID": bucket.access_key_id,
        "ADAPTERSTORE_SECRET_ACCESS_KEY": bucket.secret_access_key,
    }


@pytest.mark.slow
async def test_serve_is_not_serving_until_bucket_exists_and_stops_on_sigterm(
    s3_server: str,
) -> None:
    bucket = S3Bucket(s3_server, f"late-bucket-{os.getpid()}")
    address = f"127.0.0.1:{free_port()}"
    env = _store_env(bucket)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loraserve.adapterstore", "serve", "--listen", address, env=env
    )
    try:
        await wait_for_health(address, health_pb2.HealthCheckResponse.NOT_SERVING)
        bucket.client().create_bucket(Bucket=bucket.bucket)
        await wait_for_health(address, health_pb2.HealthCheckResponse.SERVING)
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(GUARD_S):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.slow
async def test_a_retry_at_start_up_is_logged_with_what_attempt_wait_and_error(
    s3_server: str,
) -> None:
    bucket = S3Bucket(s3_server, f"missing-bucket-{os.getpid()}")
    env = _store_env(bucket)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loraserve.adapterstore",
        "serve",
        "--listen",
        f"127.0.0.1:{free_port()}",
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        async with asyncio.timeout(GUARD_S):
            while b"stamina.retry_scheduled" not in (line := await process.stderr.readline()):
                assert line, "the store exited before retrying"
    finally:
        process.kill()
        await process.wait()
    text = line.decode()
    assert "what=adapterstore.start attempt=1 wait_s=" in text
    assert f"error=UNAVAILABLE: object storage: bucket '{bucket.bucket}' does not exist" in text
