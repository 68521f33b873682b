//! Server-streaming gRPC over h2 on a Tokio thread, its messages made by Python.
//!
//! The inference service's Generate transport (`loraserve.inference.transport`):
//! Python's event loop makes and serializes every message; this module only frames them
//! and writes them. A new call is announced by a byte on a pipe the loop reads (one
//! byte however many calls wait); a loop pass's messages cross in one `send` call (one
//! lock, one wake of the Tokio thread, one allocation for their frames), and h2 writes
//! every stream's pending frames of a connection in one socket write.
//!
//! A call that ends early is handed back to Python, which cancels its task (and so
//! aborts its engine request): when the client resets it or its connection goes (seen
//! by a waker per stream, so only the streams h2 wakes are looked at again), and when
//! its `grpc-timeout` runs out, which also ends it DEADLINE_EXCEEDED from here, on time
//! however busy Python's loop is.
//!
//! Only one method is served here (Generate); any other call is carried to an upstream
//! gRPC server (`proxy`), or refused UNIMPLEMENTED where there is none.
//!
//! A call's metadata (its ASCII custom headers: `authorization`, `x-rollout-key`, ...)
//! goes to Python with its request; of it this module reads only `grpc-timeout`.
//!
//! Builds with Debian 12's own toolchain (rustc 1.63) as well as newer ones.

mod proxy;
mod tls;
mod wire;

use std::collections::HashMap;
use std::io::Write;
use std::mem;
use std::os::unix::io::FromRawFd;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use h2::server::SendResponse;
use h2::SendStream;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::{oneshot, watch, Notify, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// The longest time in seconds taken from Python (a `Duration` cannot hold every f64).
const MAX_SECONDS: f64 = 1e9;

/// A time in seconds from Python as a `Duration`, refused (naming it) unless in
/// (0, MAX_SECONDS]: NaN and infinities included.
fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    if value.is_finite() && value > 0.0 && value <= MAX_SECONDS {
        return Ok(Duration::from_secs_f64(value));
    }
    let text = format!("{name} must be seconds in (0, {MAX_SECONDS}], not {value}");
    Err(PyValueError::new_err(text))
}

/// How many compressed requests are inflated at once (each on a blocking thread).
const INFLATING: usize = 2;

/// How long a client has to finish its TLS handshake.
const TLS_HANDSHAKE: Duration = Duration::from_secs(20);

/// What Python hands a call: a framed message, or its end with a gRPC status.
enum Message {
    Data(Bytes),
    End(u32, String, Vec<(String, String)>),
}

/// A call whose request has arrived: its id, request message (without gRPC's prefix)
/// and metadata.
struct Arrived {
    id: u64,
    request: Bytes,
    metadata: Vec<(String, String)>,
}

/// Headers of the transport, not the call's metadata (what grpc core keeps from its
/// applications too).
const TRANSPORT_HEADERS: [&str; 6] = [
    "content-type",
    "te",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
    "user-agent",
];

/// What Python has yet to take: calls that arrived, and calls that ended early.
#[derive(Default)]
struct Inbox {
    arrived: Vec<Arrived>,
    ended: Vec<u64>,
}

impl Inbox {
    fn is_empty(&self) -> bool {
        self.arrived.is_empty() && self.ended.is_empty()
    }
}

/// A call's response, handed to the dispatcher before its call is announced.
struct Opened {
    id: u64,
    respond: SendResponse<Bytes>,
    /// Dropped when the dispatcher lets the stream go, which ends the call's deadline.
    released: Option<oneshot::Sender<()>>,
}

struct Calls {
    inbox: Mutex<Inbox>,
    doorbell: Mutex<std::fs::File>,
    /// Messages Python has sent and the dispatcher has not yet written.
    outbox: Mutex<Vec<(u64, Message)>>,
    /// Streams h2 has woken since the dispatcher last looked (a reset among them).
    woken: Mutex<Vec<u64>>,
    posted: Notify,
    streams: UnboundedSender<Opened>,
    /// The path of the method served here; every other goes to `upstream`.
    path: String,
    upstream: Option<String>,
    /// The largest request message taken, in bytes.
    max_message: usize,
    /// Permits to inflate a compressed request (`INFLATING`).
    inflating: Semaphore,
    /// How old a connection may get before it is asked to close.
    max_connection_age: Option<Duration>,
    /// How often the peer is pinged, and how long it has to answer.
    keepalive: Option<(Duration, Duration)>,
    /// Set by `shutdown`: no new connection, and GOAWAY on every one.
    stopping: watch::Sender<bool>,
    /// Connections open now, and a signal each time one closes.
    connections: Mutex<usize>,
    connection_closed: Condvar,
    /// Stops the server: its thread ends, dropping every connection.
    closed: Notify,
    /// Why the server can no longer serve (a task it cannot run without panicked or
    /// ended), once that has happened; Python reads it after each doorbell.
    failure: Mutex<Option<String>>,
}

impl Calls {
    fn deliver(&self, put: impl FnOnce(&mut Inbox)) {
        // Never a panic on a poisoned lock: `fail` delivers from a Drop while the thread
        // unwinds, where a second panic would abort the process.
        let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
        let was_empty = inbox.is_empty();
        put(&mut inbox);
        if was_empty {
            // The loop has read every earlier byte before taking what they announced.
            let doorbell = self.doorbell.lock();
            let _ = doorbell.unwrap_or_else(PoisonError::into_inner).write_all(b"!");
        }
    }

    fn announce(&self, arrived: Arrived) {
        self.deliver(|inbox| inbox.arrived.push(arrived));
    }

    /// Hands back a call that ended before its handler did; Python cancels its task.
    fn end_early(&self, id: u64, code: u32, text: &str) {
        self.post([(id, Message::End(code, text.to_owned(), Vec::new()))]);
        self.deliver(|inbox| inbox.ended.push(id));
    }

    /// Records that the server can no longer serve, and rings for Python to look.
    fn fail(&self, why: String) {
        self.failure.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(why);
        self.deliver(|_| {});
    }

    fn post(&self, messages: impl IntoIterator<Item = (u64, Message)>) {
        self.outbox.lock().unwrap().extend(messages);
        self.posted.notify_one();
    }
}

#[pyclass]
struct Server {
    calls: Arc<Calls>,
    #[pyo3(get)]
    port: u16,
}

#[pymethods]
impl Server {
    /// Listens on `host`:`port` (0: an ephemeral port) and writes a byte to
    /// `doorbell_fd` whenever calls wait to be taken. Calls to `path` are served here;
    /// every other call goes to the gRPC server at `upstream` ("host:port", or
    /// "unix:PATH"), or is refused UNIMPLEMENTED without one. With `tls` (certificate chain, key and client
    /// CA PEM files, the CA optional), connections are TLS, mTLS with the CA. With
    /// `max_connection_age_s`, each connection is asked to close (GOAWAY) once that old.
    /// With `keepalive_s` (interval, timeout), the peer is pinged every interval and its
    /// connection dropped once a ping goes unanswered for the timeout. A request larger
    /// than `max_message` bytes is refused RESOURCE_EXHAUSTED.
    #[new]
    fn new(
        doorbell_fd: i32,
        host: String,
        port: u16,
        path: String,
        upstream: Option<String>,
        tls: Option<(String, String, Option<String>)>,
        max_connection_age_s: Option<f64>,
        keepalive_s: Option<(f64, f64)>,
        max_message: usize,
    ) -> PyResult<Self> {
        // SAFETY: the caller hands this fd over; it is ours to write, and to close on
        // every return, a failed one included.
        let doorbell = unsafe { std::fs::File::from_raw_fd(doorbell_fd) };
        let max_connection_age = max_connection_age_s
            .map(|age| seconds("max_connection_age_s", age))
            .transpose()?;
        let keepalive = match keepalive_s {
            Some((interval, timeout)) => Some((
                seconds("keepalive interval", interval)?,
                seconds("keepalive timeout", timeout)?,
            )),
            None => None,
        };
        let tls = match tls {
            Some((cert, key, client_ca)) => Some(
                tls::acceptor(&cert, &key, client_ca.as_deref()).map_err(PyValueError::new_err)?,
            ),
            None => None,
        };
        let std_listener = std::net::TcpListener::bind((host.as_str(), port))?;
        std_listener.set_nonblocking(true)?;
        let port = std_listener.local_addr()?.port();
        let (streams, opened) = unbounded_channel();
        let calls = Arc::new(Calls {
            inbox: Mutex::new(Inbox::default()),
            doorbell: Mutex::new(doorbell),
            outbox: Mutex::new(Vec::new()),
            woken: Mutex::new(Vec::new()),
            posted: Notify::new(),
            streams,
            path,
            upstream,
            max_connection_age,
            keepalive,
            max_message,
            inflating: Semaphore::new(INFLATING),
            stopping: watch::channel(false).0,
            connections: Mutex::new(0),
            connection_closed: Condvar::new(),
            closed: Notify::new(),
            failure: Mutex::new(None),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let serving = Arc::clone(&calls);
        thread::Builder::new()
            .name("loraserve-h2".into())
            .spawn(move || {
                let _watch = ThreadWatch(Arc::clone(&serving));
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(std_listener).expect("listener");
                    let dispatching = tokio::spawn(dispatch(Arc::clone(&serving), opened));
                    let accepting = tokio::spawn(accept(listener, Arc::clone(&serving), tls));
                    // A connection's panic ends that connection alone; one of these two
                    // ends every call, so the server says so instead of serving on mute.
                    tokio::spawn(watch_task("the dispatcher", dispatching, Arc::clone(&serving)));
                    tokio::spawn(watch_task("the listener", accepting, Arc::clone(&serving)));
                    // Returning drops the runtime, its connections with it.
                    serving.closed.notified().await;
                })
            })?;
        Ok(Server { calls, port })
    }

    /// What happened since the last take: the calls that arrived, (id, request message,
    /// metadata as (key, value) pairs) each, then the ids of calls that ended early (reset
    /// by the client, their connection gone, or past their deadline), in that order.
    #[allow(clippy::type_complexity)]
    fn take(&self, py: Python<'_>) -> (Vec<(u64, PyObject, Vec<(String, String)>)>, Vec<u64>) {
        let inbox = mem::take(&mut *self.calls.inbox.lock().unwrap());
        let arrived = inbox
            .arrived
            .into_iter()
            .map(|a| (a.id, PyBytes::new(py, &a.request).into(), a.metadata))
            .collect();
        (arrived, inbox.ended)
    }

    /// Queues one loop pass's messages: (call id, serialized message) each, None for a
    /// message ending the call with status OK.
    fn send(&self, batch: Vec<(u64, Option<&PyBytes>)>) {
        let size: usize = batch
            .iter()
            .map(|(_, payload)| payload.map_or(0, |p| 5 + p.as_bytes().len()))
            .sum();
        let mut frames = BytesMut::with_capacity(size);
        let messages: Vec<(u64, Message)> = batch
            .into_iter()
            .map(|(id, payload)| match payload {
                Some(payload) => {
                    let payload = payload.as_bytes();
                    frames.put_u8(0);
                    frames.put_u32(payload.len() as u32);
                    frames.put_slice(payload);
                    (id, Message::Data(frames.split().freeze()))
                }
                None => (id, Message::End(0, String::new(), Vec::new())),
            })
            .collect();
        self.calls.post(messages);
    }

    /// Stops listening and asks every connection to close (GOAWAY): their calls go on
    /// until they end, new ones are refused.
    fn shutdown(&self) {
        self.calls.stopping.send_replace(true);
    }

    /// Waits, for up to `timeout_s` seconds, until every connection has closed (after
    /// `shutdown`, once its calls have ended and their last frames are written); whether
    /// they all have.
    fn wait_closed(&self, py: Python<'_>, timeout_s: f64) -> bool {
        // NaN and negatives wait not at all.
        let timeout_s = if timeout_s >= 0.0 {
            timeout_s.min(MAX_SECONDS)
        } else {
            0.0
        };
        let timeout = Duration::from_secs_f64(timeout_s);
        py.allow_threads(|| {
            let open = self.calls.connections.lock().unwrap();
            let (open, _) = self
                .calls
                .connection_closed
                .wait_timeout_while(open, timeout, |open| *open > 0)
                .unwrap();
            *open == 0
        })
    }

    /// Why the server can no longer serve (None while it can): a task every call needs
    /// panicked or ended. It serves nothing more; the caller stops it.
    fn failure(&self) -> Option<String> {
        self.calls.failure.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops listening and drops every connection.
    fn close(&self) {
        self.calls.closed.notify_one();
    }

    /// Ends a call with a gRPC status and trailing metadata (ASCII (key, value) pairs; one
    /// that is not a valid header is left out), after what was sent before.
    fn finish(&self, id: u64, code: u32, message: String, trailing: Vec<(String, String)>) {
        self.calls.post([(id, Message::End(code, message, trailing))]);
    }
}

/// Records the server's failure when the thread itself unwinds (a panic outside every
/// task: Tokio catches those inside one).
struct ThreadWatch(Arc<Calls>);

impl Drop for ThreadWatch {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.fail("the transport's thread panicked".to_owned());
        }
    }
}

/// Records the server's failure when `task` panics, or ends when it must not: the
/// dispatcher never ends, the listener only once the server stops.
async fn watch_task(name: &str, task: tokio::task::JoinHandle<()>, calls: Arc<Calls>) {
    let why = match task.await {
        Err(error) if error.is_panic() => {
            let payload = error.into_panic();
            let text = payload
                .downcast_ref::<&str>()
                .map(|text| text.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            format!("{} panicked: {}", name, text)
        }
        Ok(()) if !*calls.stopping.borrow() => format!("{} ended", name),
        _ => return,
    };
    calls.fail(why);
}

/// Wakes the dispatcher for one stream: h2 wakes it when the client resets the stream or
/// its connection goes (and on some changes of its send window, which cost one look).
struct StreamWaker {
    id: u64,
    calls: Arc<Calls>,
}

impl Wake for StreamWaker {
    fn wake(self: Arc<Self>) {
        self.calls.woken.lock().unwrap().push(self.id);
        self.calls.posted.notify_one();
    }
}

/// A call's response: its headers not yet sent, or sent and its messages following.
///
/// The headers go with the first message (or, where there is none, as a trailers-only
/// response), as grpc core's servers send them: until then nothing has reached the
/// client, so a call its replica drops before its first token is one a client or a
/// proxy between may send again. Headers sent early would commit it: HAProxy ends such
/// a stream UNKNOWN, past gRPC's retry policy and the client's own.
enum Reply {
    Unsent(SendResponse<Bytes>),
    Sending(SendStream<Bytes>),
}

/// A call the dispatcher answers, with the waker h2 keeps for its stream.
struct Open {
    reply: Reply,
    waker: Waker,
    _released: Option<oneshot::Sender<()>>,
}

impl Open {
    /// Whether the client has reset the stream or its connection has gone; otherwise h2
    /// keeps the stream's waker until either happens.
    fn gone(&mut self) -> bool {
        let mut context = Context::from_waker(&self.waker);
        let reset = match &mut self.reply {
            Reply::Unsent(respond) => respond.poll_reset(&mut context),
            Reply::Sending(stream) => stream.poll_reset(&mut context),
        };
        matches!(reset, Poll::Ready(_))
    }

    /// Writes one message, the response's headers first where they are unsent; whether
    /// the call is over (ended, or its stream gone).
    fn write(&mut self, message: Message) -> bool {
        match (&mut self.reply, message) {
            (Reply::Unsent(respond), Message::End(code, text, trailing)) => {
                let response = wire::trailers_only(code, &text, &trailing);
                let _ = respond.send_response(response, true);
                true
            }
            (Reply::Unsent(respond), message) => {
                match respond.send_response(wire::headers(), false) {
                    Ok(stream) => {
                        self.reply = Reply::Sending(stream);
                        self.write(message)
                    }
                    Err(_) => true,
                }
            }
            (Reply::Sending(stream), Message::Data(framed)) => {
                stream.send_data(framed, false).is_err()
            }
            (Reply::Sending(stream), Message::End(code, text, trailing)) => {
                let _ = stream.send_trailers(wire::trailers(code, &text, &trailing));
                true
            }
        }
    }
}

/// Writes what Python posts to each call's stream: one task for every call, so a batch
/// costs one wake however many calls it touches.
async fn dispatch(calls: Arc<Calls>, mut opened: UnboundedReceiver<Opened>) {
    let mut streams: HashMap<u64, Open> = HashMap::new();
    loop {
        calls.posted.notified().await;
        // A call's stream is queued before the call is announced, so before any message.
        while let Ok(Opened {
            id,
            respond,
            released,
        }) = opened.try_recv()
        {
            let waker = Waker::from(Arc::new(StreamWaker {
                id,
                calls: Arc::clone(&calls),
            }));
            let mut open = Open {
                reply: Reply::Unsent(respond),
                waker,
                _released: released,
            };
            if open.gone() {
                calls.end_early(id, wire::CANCELLED, "");
            }
            streams.insert(id, open);
        }
        let woken = mem::take(&mut *calls.woken.lock().unwrap());
        for id in woken {
            if let Some(open) = streams.get_mut(&id) {
                if open.gone() {
                    streams.remove(&id);
                    calls.end_early(id, wire::CANCELLED, "");
                }
            }
        }
        let outbox = mem::take(&mut *calls.outbox.lock().unwrap());
        for (id, message) in outbox {
            let done = match streams.get_mut(&id) {
                Some(open) => open.write(message),
                None => continue,
            };
            if done {
                streams.remove(&id);
            }
        }
    }
}

async fn accept(listener: TcpListener, calls: Arc<Calls>, tls: Option<TlsAcceptor>) {
    // Each connection numbers its calls from its own base.
    let mut next_id = 0u64;
    let stopping = stopped(&calls);
    tokio::pin!(stopping);
    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                // Out of file descriptors, say: try again shortly rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            // Returning drops the listener: new connections are refused.
            _ = &mut stopping => return,
        };
        let _ = socket.set_nodelay(true);
        let counted = Counted::new(Arc::clone(&calls));
        let calls = Arc::clone(&calls);
        match &tls {
            Some(acceptor) => {
                let handshake = acceptor.accept(socket);
                tokio::spawn(async move {
                    let _counted = counted;
                    // A client that never finishes its handshake holds nothing for long.
                    if let Ok(Ok(stream)) = tokio::time::timeout(TLS_HANDSHAKE, handshake).await {
                        connection(stream, calls, next_id).await;
                    }
                });
            }
            None => {
                tokio::spawn(async move {
                    let _counted = counted;
                    connection(socket, calls, next_id).await;
                });
            }
        }
        next_id += 1 << 32;
    }
}

async fn connection<T>(socket: T, calls: Arc<Calls>, mut next_id: u64)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = h2::server::Builder::new()
        .initial_window_size(wire::STREAM_WINDOW)
        .initial_connection_window_size(wire::CONNECTION_WINDOW)
        .max_header_list_size(wire::MAX_HEADER_LIST)
        .handshake(socket);
    let mut conn = match handshake.await {
        Ok(conn) => conn,
        Err(_) => return,
    };
    let aged = async {
        match calls.max_connection_age {
            Some(age) => tokio::time::sleep(jittered(age)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(aged);
    let alive = keepalive(conn.ping_pong(), calls.keepalive);
    tokio::pin!(alive);
    let upstream = calls
        .upstream
        .clone()
        .map(|address| Arc::new(proxy::Upstream::new(address)));
    let stopping = stopped(&calls);
    tokio::pin!(stopping);
    let mut closing = false;
    loop {
        tokio::select! {
            accepted = conn.accept() => match accepted {
                Some(Ok((request, respond))) => {
                    let id = next_id;
                    next_id += 1;
                    tokio::spawn(call(id, request, respond, Arc::clone(&calls), upstream.clone()));
                }
                _ => return,
            },
            // GOAWAY: the calls on it finish, new ones come on a new connection, for which
            // a client resolves its target again.
            _ = &mut aged, if !closing => {
                conn.graceful_shutdown();
                closing = true;
            }
            _ = &mut stopping, if !closing => {
                conn.graceful_shutdown();
                closing = true;
            }
            // A peer that stops answering pings is gone: dropping the connection closes
            // it, and its calls are handed back as ended.
            _ = &mut alive => return,
        }
    }
}

/// Pings the peer every `interval` and resolves once a ping goes unanswered for
/// `timeout`; never, without keepalive or once the connection has failed (its calls
/// then end on their own).
async fn keepalive(pings: Option<h2::PingPong>, keepalive: Option<(Duration, Duration)>) {
    let (mut pings, (interval, timeout)) = match (pings, keepalive) {
        (Some(pings), Some(keepalive)) => (pings, keepalive),
        _ => return std::future::pending().await,
    };
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return std::future::pending().await,
            Err(_) => return,
        }
    }
}

/// A request's one message, read whole: refused with a status when it is too large or
/// not one message, None when the client went before it was whole. A compressed one is
/// inflated on a blocking thread, a few at once (`INFLATING`), so that no request stalls
/// this thread's connections.
async fn receive(
    body: &mut h2::RecvStream,
    encoding: Option<Bytes>,
    calls: &Calls,
) -> Result<Bytes, Option<(u32, String)>> {
    let limit = calls.max_message;
    let mut received = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|_| None)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
        if received.len() > wire::PREFIX + limit {
            let text = format!("the request is larger than the limit of {limit} bytes");
            return Err(Some((wire::RESOURCE_EXHAUSTED, text)));
        }
    }
    let (compressed, message) = wire::one_message(received.freeze()).map_err(Some)?;
    if !compressed {
        return Ok(message);
    }
    let _permit = calls.inflating.acquire().await.map_err(|_| None)?;
    tokio::task::spawn_blocking(move || wire::decompress(&message, encoding.as_deref(), limit))
        .await
        .map_err(|_| None)?
        .map_err(Some)
}

/// A connection counted open from its accept until it is dropped (`wait_closed`).
struct Counted(Arc<Calls>);

impl Counted {
    fn new(calls: Arc<Calls>) -> Self {
        *calls.connections.lock().unwrap() += 1;
        Counted(calls)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        *self.0.connections.lock().unwrap() -= 1;
        self.0.connection_closed.notify_all();
    }
}

/// Resolves once `shutdown` has been called, before or after it is first polled.
async fn stopped(calls: &Calls) {
    let mut stopping = calls.stopping.subscribe();
    loop {
        if *stopping.borrow() {
            return;
        }
        if stopping.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// `age` give or take 10 %, as grpc core jitters it, so that connections made together
/// do not all close together.
fn jittered(age: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    age.mul_f64(0.9 + f64::from(nanos % 1000) / 5000.0)
}

async fn call(
    id: u64,
    request: http::Request<h2::RecvStream>,
    respond: SendResponse<Bytes>,
    calls: Arc<Calls>,
    upstream: Option<Arc<proxy::Upstream>>,
) {
    if request.uri().path() != calls.path {
        match upstream {
            Some(upstream) => {
                let stopping = calls.stopping.subscribe();
                proxy::proxy(upstream, request, respond, stopping).await
            }
            None => {
                let text = format!("method {} is not served here", request.uri().path());
                let refusal = wire::status_response(wire::UNIMPLEMENTED, &text);
                wire::refuse(respond, request.into_body(), refusal).await;
            }
        }
        return;
    }
    if let Err(refusal) = wire::grpc_request(&request) {
        wire::refuse(respond, request.into_body(), refusal).await;
        return;
    }
    let deadline = request
        .headers()
        .get("grpc-timeout")
        .and_then(|v| wire::timeout(v.as_bytes()))
        .map(|t| Instant::now() + t);
    let metadata = request
        .headers()
        .iter()
        .filter(|(key, _)| {
            !TRANSPORT_HEADERS.contains(&key.as_str()) && !key.as_str().ends_with("-bin")
        })
        .filter_map(|(key, value)| Some((key.as_str().to_owned(), value.to_str().ok()?.to_owned())))
        .collect();
    let encoding = request
        .headers()
        .get("grpc-encoding")
        .map(|value| Bytes::copy_from_slice(value.as_bytes()));
    let mut body = request.into_body();
    let receiving = receive(&mut body, encoding, &calls);
    let received = match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, receiving)
            .await
            .unwrap_or_else(|_| {
                let text = "Deadline Exceeded".to_owned();
                Err(Some((wire::DEADLINE_EXCEEDED, text)))
            }),
        None => receiving.await,
    };
    let request = match received {
        Ok(request) => request,
        Err(Some((code, text))) => {
            wire::refuse(respond, body, wire::status_response(code, &text)).await;
            return;
        }
        // Reset or dropped before its request was whole: nothing to serve.
        Err(None) => return,
    };
    let (released, stream_released) = match deadline {
        Some(_) => {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    if calls
        .streams
        .send(Opened {
            id,
            respond,
            released,
        })
        .is_err()
    {
        return;
    }
    // The dispatcher watches the stream for a reset from the moment it has it.
    calls.posted.notify_one();
    calls.announce(Arrived {
        id,
        request,
        metadata,
    });
    if let (Some(deadline), Some(stream_released)) = (deadline, stream_released) {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                calls.end_early(id, wire::DEADLINE_EXCEEDED, "Deadline Exceeded");
            }
            _ = stream_released => {}
        }
    }
}

#[pymodule]
fn loraserve_native(_py: Python<'_>, module: &PyModule) -> PyResult<()> {
    module.add_class::<Server>()?;
    Ok(())
}
