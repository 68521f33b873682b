//! Every call that is not served natively goes, as it came, to an upstream gRPC server
//! (the service's grpc.aio server on loopback): its other RPCs, health and reflection
//! stay where they are, on the same port as the native ones.
//!
//! Both directions stream, with HTTP/2 flow control end to end: a message is released
//! to its sender only once the other side has taken it. A call reset or dropped on
//! either side is reset on the other (h2 resets a stream whose handles all drop before
//! it ends), so a cancelled call never runs on upstream.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::poll_fn;
use h2::client::SendRequest;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::Mutex;

use crate::wire;

/// One HTTP/2 connection to upstream ("host:port", or "unix:PATH" for a Unix socket, which
/// keeps the upstream server off the network), shared by every proxied call, made again
/// when it has gone.
pub struct Upstream {
    address: String,
    connection: Mutex<Option<SendRequest<Bytes>>>,
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
    async fn ready(&self) -> Result<SendRequest<Bytes>, String> {
        let mut connection = self.connection.lock().await;
        if let Some(sender) = connection.as_ref() {
            if let Ok(ready) = sender.clone().ready().await {
                return Ok(ready);
            }
        }
        let sender = self.connect().await?;
        *connection = Some(sender.clone());
        sender.ready().await.map_err(|e| e.to_string())
    }
}

async fn handshake<T>(socket: T) -> Result<SendRequest<Bytes>, String>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = h2::client::handshake(socket)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Carries one call to upstream and its response back; what it cannot carry ends the
/// call UNAVAILABLE, as a client's own channel would.
pub async fn proxy(
    upstream: Arc<Upstream>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let (parts, body) = request.into_parts();
    let mut sender = match upstream.ready().await {
        Ok(sender) => sender,
        Err(e) => {
            let text = format!("upstream {} unreachable: {e}", upstream.address);
            let _ = respond.send_response(wire::status_response(wire::UNAVAILABLE, &text), true);
            return;
        }
    };
    let uri = format!(
        "http://{}{}",
        upstream.authority(),
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut forwarded = Request::builder().method(parts.method).uri(uri);
    if let Some(headers) = forwarded.headers_mut() {
        *headers = parts.headers;
    }
    let forwarded = match forwarded.body(()) {
        Ok(forwarded) => forwarded,
        Err(_) => return,
    };
    let (response, to_upstream) = match sender.send_request(forwarded, body.is_end_stream()) {
        Ok(sent) => sent,
        Err(e) => {
            let text = format!("upstream {} failed the call: {e}", upstream.address);
            let _ = respond.send_response(wire::status_response(wire::UNAVAILABLE, &text), true);
            return;
        }
    };
    let requests = async move {
        if !body.is_end_stream() {
            pump(body, to_upstream).await
        } else {
            Ok(())
        }
    };
    let responses = async move {
        let response = response.await.map_err(|_| ())?;
        let (parts, from_upstream) = response.into_parts();
        let mut head = Response::builder().status(parts.status);
        if let Some(headers) = head.headers_mut() {
            *headers = parts.headers;
        }
        let head = head.body(()).map_err(|_| ())?;
        let ended = from_upstream.is_end_stream();
        let to_client = respond.send_response(head, ended).map_err(|_| ())?;
        if ended {
            return Ok(());
        }
        pump(from_upstream, to_client).await
    };
    tokio::pin!(requests, responses);
    let mut sent = false;
    loop {
        tokio::select! {
            done = &mut requests, if !sent => match done {
                Ok(()) => sent = true,
                Err(()) => return,
            },
            _ = &mut responses => return,
        }
    }
}

/// Copies a stream's messages and trailers, taking no more from `from` than `to` can
/// send; a reset of `to` ends it at once, whether or not `from` has more.
async fn pump(mut from: RecvStream, mut to: SendStream<Bytes>) -> Result<(), ()> {
    loop {
        let chunk = tokio::select! {
            chunk = from.data() => chunk,
            _ = poll_fn(|cx| to.poll_reset(cx)) => return Err(()),
        };
        let mut chunk = match chunk {
            Some(chunk) => chunk.map_err(|_| ())?,
            None => break,
        };
        let taken = chunk.len();
        while !chunk.is_empty() {
            to.reserve_capacity(chunk.len());
            let room = match poll_fn(|cx| to.poll_capacity(cx)).await {
                Some(Ok(room)) => room,
                _ => return Err(()),
            };
            let part = chunk.split_to(room.min(chunk.len()));
            to.send_data(part, false).map_err(|_| ())?;
        }
        from.flow_control()
            .release_capacity(taken)
            .map_err(|_| ())?;
    }
    match from.trailers().await.map_err(|_| ())? {
        Some(trailers) => to.send_trailers(trailers).map_err(|_| ()),
        None => to.send_data(Bytes::new(), true).map_err(|_| ()),
    }
}
