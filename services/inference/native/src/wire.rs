//! gRPC's own bits of HTTP/2: status codes, trailers, `grpc-timeout`.

use std::io::Read;
use std::time::Duration;

use bytes::Bytes;
use flate2::read::{GzDecoder, ZlibDecoder};
use h2::server::SendResponse;
use h2::RecvStream;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Response, StatusCode};

pub const CANCELLED: u32 = 1;
pub const INVALID_ARGUMENT: u32 = 3;
pub const DEADLINE_EXCEEDED: u32 = 4;
pub const RESOURCE_EXHAUSTED: u32 = 8;
pub const UNIMPLEMENTED: u32 = 12;
pub const UNAVAILABLE: u32 = 14;

/// HTTP/2 flow-control windows, per stream and per connection, on each side of the
/// proxy: a stream that is not read holds at most its own window of a connection's.
pub const STREAM_WINDOW: u32 = 1 << 20;
pub const CONNECTION_WINDOW: u32 = 16 << 20;

/// The largest header list (a call's metadata) a client may send: grpc core's hard limit.
/// It also bounds the CONTINUATION frames one header block may take.
pub const MAX_HEADER_LIST: u32 = 16 << 10;

/// How long a client may go on sending once its call's response has ended.
pub const DRAIN: Duration = Duration::from_secs(5);

/// Ends a call with `response` (its status alone), then reads what the client still
/// sends, up to DRAIN: a stream dropped while the client's side is open is reset with
/// CANCEL (h2 0.3), and gRPC's C core, reading that reset with the status, reports
/// CANCELLED in its place.
pub async fn refuse(mut respond: SendResponse<Bytes>, body: RecvStream, response: Response<()>) {
    let _ = respond.send_response(response, true);
    drain(body).await;
}

/// Reads a request's rest and lets it go, up to DRAIN; see `refuse`.
pub async fn drain(mut body: RecvStream) {
    let drained = async {
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
        }
    };
    let _ = tokio::time::timeout(DRAIN, drained).await;
}

/// A message's prefix on the wire: a compressed flag and a 4-byte length.
pub const PREFIX: usize = 5;

/// What a server may be sent compressed with (`grpc-accept-encoding`), as grpc core
/// accepts it.
pub const ACCEPT_ENCODING: &str = "identity,deflate,gzip";

/// The one message a unary request body holds, and whether its flag says it is
/// compressed; or the status refusing the body.
pub fn one_message(mut body: Bytes) -> Result<(bool, Bytes), (u32, String)> {
    if body.len() < PREFIX {
        let text = format!("the request holds no message ({} bytes)", body.len());
        return Err((INVALID_ARGUMENT, text));
    }
    let compressed = match body[0] {
        0 => false,
        1 => true,
        flag => {
            let text = format!("the request's compressed flag must be 0 or 1, not {flag}");
            return Err((INVALID_ARGUMENT, text));
        }
    };
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() != PREFIX + length {
        let text = format!(
            "the request must be one message: its prefix says {length} bytes, {} followed",
            body.len() - PREFIX
        );
        return Err((INVALID_ARGUMENT, text));
    }
    Ok((compressed, body.split_off(PREFIX)))
}

/// A compressed message decompressed as `encoding` (the request's `grpc-encoding`) says,
/// at most `limit` bytes; or the status refusing it. Blocking: it may inflate `limit` bytes.
pub fn decompress(
    message: &[u8],
    encoding: Option<&[u8]>,
    limit: usize,
) -> Result<Bytes, (u32, String)> {
    match encoding {
        Some(b"gzip") => inflate(GzDecoder::new(message), limit),
        Some(b"deflate") => inflate(ZlibDecoder::new(message), limit),
        None | Some(b"identity") => Err((
            INVALID_ARGUMENT,
            "the request's message is flagged compressed, but its grpc-encoding names none"
                .to_owned(),
        )),
        Some(other) => Err((
            UNIMPLEMENTED,
            format!(
                "grpc-encoding {} is not supported: send {ACCEPT_ENCODING}",
                String::from_utf8_lossy(other)
            ),
        )),
    }
}

/// A compressed message inflated, refused past `limit` bytes inflated.
fn inflate(decoder: impl Read, limit: usize) -> Result<Bytes, (u32, String)> {
    let mut inflated = Vec::new();
    decoder
        .take(limit as u64 + 1)
        .read_to_end(&mut inflated)
        .map_err(|e| {
            let text = format!("the request's message does not decompress: {e}");
            (INVALID_ARGUMENT, text)
        })?;
    if inflated.len() > limit {
        let text = format!("the request is larger than the limit of {limit} bytes decompressed");
        return Err((RESOURCE_EXHAUSTED, text));
    }
    Ok(Bytes::from(inflated))
}

/// A call's trailers: its status, message and trailing metadata (of which an entry that
/// is not a valid header, or names one of gRPC's own, is left out).
pub fn trailers(code: u32, text: &str, metadata: &[(String, String)]) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    for (key, value) in metadata {
        if key.starts_with("grpc-") {
            continue;
        }
        if let (Ok(key), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            trailers.append(key, value);
        }
    }
    trailers.insert("grpc-status", HeaderValue::from(code));
    if let Ok(text) = HeaderValue::from_str(&grpc_message(text)) {
        if !text.is_empty() {
            trailers.insert("grpc-message", text);
        }
    }
    trailers
}

/// gRPC's percent-encoding of a status message.
fn grpc_message(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// A `grpc-timeout` value: at most 8 digits and a unit (hours to nanoseconds).
pub fn timeout(value: &[u8]) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b"H" => Duration::from_secs(amount * 3600),
        b"M" => Duration::from_secs(amount * 60),
        b"S" => Duration::from_secs(amount),
        b"m" => Duration::from_millis(amount),
        b"u" => Duration::from_micros(amount),
        b"n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Refuses what is not a gRPC call, as gRPC's HTTP/2 mapping says: a method other than
/// POST with 405, a content-type other than `application/grpc[+proto|;...]` with 415.
pub fn grpc_request<B>(request: &http::Request<B>) -> Result<(), Response<()>> {
    let refuse = |status: StatusCode| {
        let mut response = Response::new(());
        *response.status_mut() = status;
        response
    };
    if request.method() != http::Method::POST {
        return Err(refuse(StatusCode::METHOD_NOT_ALLOWED));
    }
    let content_type = request
        .headers()
        .get("content-type")
        .map(HeaderValue::as_bytes);
    match content_type {
        Some(b"application/grpc") => Ok(()),
        Some(value)
            if value.starts_with(b"application/grpc+")
                || value.starts_with(b"application/grpc;") =>
        {
            Ok(())
        }
        _ => Err(refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE)),
    }
}

/// A gRPC response's headers, its messages to follow.
pub fn headers() -> Response<()> {
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-accept-encoding", HeaderValue::from_static(ACCEPT_ENCODING));
    response
}

/// A gRPC response that is its status alone (headers ending the stream).
pub fn status_response(code: u32, text: &str) -> Response<()> {
    trailers_only(code, text, &[])
}

/// A trailers-only response: a call's status and trailing metadata, no message before
/// (an entry naming one of the response's own headers is left out).
pub fn trailers_only(code: u32, text: &str, metadata: &[(String, String)]) -> Response<()> {
    let mut response = headers();
    let own = response.headers().clone();
    let status = trailers(code, text, metadata);
    let headers = response.headers_mut();
    for (key, value) in status.iter() {
        if !own.contains_key(key) {
            headers.append(key, value.clone());
        }
    }
    response
}
