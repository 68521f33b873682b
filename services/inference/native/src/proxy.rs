//! Every call that is not served natively goes to an upstream gRPC server (the service's
//! grpc.aio server, on loopback or a Unix socket), over plaintext HTTP/2 with its headers
//! as they came: its other RPCs, health and reflection stay where they are, on the same
//! port as the native ones. TLS ends here, so upstream sees neither the client's address
//! nor its certificate.
//!
//! Both directions stream, with HTTP/2 flow control end to end: a message is released
//! to its sender only once the other side has taken it. A call the client resets or
//! drops is reset upstream at whatever stage it is (h2 resets a stream whose handles all
//! drop before it ends); one upstream fails or resets ends UNAVAILABLE for the client.
//! While the transport stops, a call upstream can no longer take is refused
//! (REFUSED_STREAM), which a client's channel retries on a new connection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::poll_fn;
use h2::client::SendRequest;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

/// How long one upstream connection takes new calls; well below the grpc.aio server's
/// own max connection age (the services' default: 300 s).
const UPSTREAM_AGE: Duration = Duration::from_secs(60);

use crate::wire;

/// One HTTP/2 connection to upstream ("host:port", or "unix:PATH" for a Unix socket, which
/// keeps the upstream server off the network) for the calls of one client connection,
/// made when the first comes and again when it has gone: a client that stops reading
/// holds up its own calls, never another client's.
pub struct Upstream {
    address: String,
    connection: Mutex<Option<(SendRequest<Bytes>, Instant)>>,
}

impl Upstream {
    pub fn new(address: String) -> Self {
        Upstream {
            address,
            connection: Mutex::new(None),
        }
    }

    async fn connect(&self) -> Result<SendRequest<Bytes>, String> {
        match self.address.strip_prefix("unix:") {
            Some(path) => {
                handshake(UnixStream::connect(path).await.map_err(|e| e.to_string())?).await
            }
            None => {
                let socket = TcpStream::connect(&self.address)
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = socket.set_nodelay(true);
                handshake(socket).await
            }
        }
    }

    /// The authority of requests carried there.
    fn authority(&self) -> &str {
        if self.address.starts_with("unix:") {
            "localhost"
        } else {
            &self.address
        }
    }

    /// A sender ready for one more stream.
    /// A sender ready for one more stream, on a connection younger than UPSTREAM_AGE: h2
    /// 0.3 still sends on a connection upstream has sent GOAWAY on (its max connection
    /// age), where upstream would never answer.
    async fn ready(&self) -> Result<SendRequest<Bytes>, String> {
        let mut connection = self.connection.lock().await;
        if let Some((sender, made)) = connection.as_ref() {
            if made.elapsed() < UPSTREAM_AGE {
                if let Ok(ready) = sender.clone().ready().await {
                    return Ok(ready);
                }
            }
        }
        let sender = self.connect().await?;
        *connection = Some((sender.clone(), Instant::now()));
        sender.ready().await.map_err(|e| e.to_string())
    }
}

async fn handshake<T>(socket: T) -> Result<SendRequest<Bytes>, String>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = h2::client::Builder::new()
        .initial_window_size(wire::STREAM_WINDOW)
        .initial_connection_window_size(wire::CONNECTION_WINDOW)
        .handshake(socket)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Carries one call to upstream and its response back. What upstream cannot take or
/// fails ends the call UNAVAILABLE, as a client's own channel would; a call the client
/// resets or drops is reset upstream at once, whatever stage it is at.
pub async fn proxy(
    upstream: Arc<Upstream>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    stopping: watch::Receiver<bool>,
) {
    let (parts, mut body) = request.into_parts();
    let address = upstream.address.clone();
    let mut sender = match upstream.ready().await {
        Ok(sender) => sender,
        Err(_) if refused_while_stopping(&mut respond, &stopping) => return,
        Err(e) => {
            // Made first: a `&dyn Display` held across the await is not Send.
            let refusal = unavailable(&address, "unreachable", &e);
            wire::refuse(respond, body, refusal).await;
            return;
        }
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut forwarded = Request::builder()
        .method(parts.method)
        .uri(format!("http://{}{path}", upstream.authority()));
    if let Some(headers) = forwarded.headers_mut() {
        *headers = parts.headers;
    }
    let forwarded = match forwarded.body(()) {
        Ok(forwarded) => forwarded,
        Err(e) => {
            let refusal = unavailable(&address, "cannot take the call", &e);
            wire::refuse(respond, body, refusal).await;
            return;
        }
    };
    let (response, mut to_upstream) = match sender.send_request(forwarded, body.is_end_stream()) {
        Ok(sent) => sent,
        Err(_) if refused_while_stopping(&mut respond, &stopping) => return,
        Err(e) => {
            let refusal = unavailable(&address, "failed the call", &e);
            wire::refuse(respond, body, refusal).await;
            return;
        }
    };
    // The request's end or its failure: either way the response tells how the call ends
    // (upstream's status, or the client gone), so the request's result is not needed.
    let requests = async {
        if !body.is_end_stream() {
            let _ = pump(&mut body, &mut to_upstream).await;
        }
    };
    let responses = async move {
        let response = tokio::select! {
            response = response => response,
            // The client gone before upstream answered: returning resets upstream's call.
            _ = poll_fn(|cx| respond.poll_reset(cx)) => return,
        };
        let (parts, mut from_upstream) = match response {
            Ok(response) => response.into_parts(),
            Err(e) => {
                let _ = respond.send_response(unavailable(&address, "failed the call", &e), true);
                return;
            }
        };
        let mut head = Response::builder().status(parts.status);
        if let Some(headers) = head.headers_mut() {
            *headers = parts.headers;
        }
        let ended = from_upstream.is_end_stream();
        let mut to_client = match head.body(()).map(|head| respond.send_response(head, ended)) {
            Ok(Ok(to_client)) => to_client,
            _ => return,
        };
        if !ended {
            if let Err(Broken::From) = pump(&mut from_upstream, &mut to_client).await {
                let text = format!("upstream {address} broke off the call");
                let _ = to_client.send_trailers(wire::trailers(wire::UNAVAILABLE, &text, &[]));
            }
        }
    };
    {
        tokio::pin!(requests, responses);
        let mut sent = false;
        loop {
            tokio::select! {
                _ = &mut requests, if !sent => sent = true,
                _ = &mut responses => break,
            }
        }
    }
    // The response has ended: upstream's call is done with, and the client's side is read
    // to its end (`wire::refuse` says why).
    drop(to_upstream);
    wire::drain(body).await;
}

/// Refuses a call upstream could not take if the transport is stopping: upstream has
/// stopped before the client saw the GOAWAY, and the call was never processed, so the
/// client's channel may send it again on another connection.
fn refused_while_stopping(
    respond: &mut SendResponse<Bytes>,
    stopping: &watch::Receiver<bool>,
) -> bool {
    let refused = *stopping.borrow();
    if refused {
        respond.send_reset(Reason::REFUSED_STREAM);
    }
    refused
}

/// How a call that upstream could not take or failed ends: UNAVAILABLE, naming upstream.
fn unavailable(address: &str, what: &str, e: &dyn std::fmt::Display) -> Response<()> {
    let text = format!("upstream {address} {what}: {e}");
    wire::status_response(wire::UNAVAILABLE, &text)
}

/// Which side of a pump failed.
enum Broken {
    /// The receiving side: reset, or its connection gone.
    To,
    /// The sending side.
    From,
}

/// Copies a stream's messages and trailers, taking no more from `from` than `to` can
/// send; a reset of `to` ends it at once, whether or not `from` has more.
async fn pump(from: &mut RecvStream, to: &mut SendStream<Bytes>) -> Result<(), Broken> {
    loop {
        let chunk = tokio::select! {
            chunk = from.data() => chunk,
            _ = poll_fn(|cx| to.poll_reset(cx)) => return Err(Broken::To),
        };
        let mut chunk = match chunk {
            Some(chunk) => chunk.map_err(|_| Broken::From)?,
            None => break,
        };
        let taken = chunk.len();
        while !chunk.is_empty() {
            to.reserve_capacity(chunk.len());
            let room = match poll_fn(|cx| to.poll_capacity(cx)).await {
                Some(Ok(room)) => room,
                _ => return Err(Broken::To),
            };
            let part = chunk.split_to(room.min(chunk.len()));
            to.send_data(part, false).map_err(|_| Broken::To)?;
        }
        from.flow_control()
            .release_capacity(taken)
            .map_err(|_| Broken::From)?;
    }
    match from.trailers().await.map_err(|_| Broken::From)? {
        Some(trailers) => to.send_trailers(trailers).map_err(|_| Broken::To),
        None => to.send_data(Bytes::new(), true).map_err(|_| Broken::To),
    }
}
