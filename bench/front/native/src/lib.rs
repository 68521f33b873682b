//! Server-streaming gRPC over h2 on a Tokio thread, its messages made by Python.
//!
//! The transport half of a native front, measured by bench/front/grpc_floor.py's
//! `native` variant and bench/front/stream_probe.py's `native` arm: Python's event
//! loop makes and serializes every message, as the
//! generation path does now; this module only frames them and writes them. A new
//! call is announced by a byte on a pipe the loop reads (one byte however many calls
//! wait); a loop pass's messages cross in one `send` call (one lock, one wake of the
//! Tokio thread, one allocation for their frames), and h2 writes every stream's pending
//! frames of a connection in one socket write.
//!
//! Builds with Debian 12's own toolchain (rustc 1.63) as well as newer ones.
//! Of the metadata it reads only `x-rollout-key`; it honours no deadline and does not
//! tell Python when a client resets its call.

use std::collections::HashMap;
use std::io::Write;
use std::mem;
use std::net::SocketAddr;
use std::os::unix::io::FromRawFd;
use std::sync::{Arc, Mutex};
use std::thread;

use bytes::{BufMut, Bytes, BytesMut};
use h2::SendStream;
use http::{HeaderMap, HeaderValue, Response};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::Notify;

/// What Python hands a call: a framed message, or its end with a gRPC status.
enum Message {
    Data(Bytes),
    End(u32, String),
}

/// A call whose request has arrived: its id, request message and `x-rollout-key`.
struct Arrived {
    id: u64,
    request: Bytes,
    rollout_key: String,
}

struct Calls {
    announced: Mutex<Vec<Arrived>>,
    doorbell: Mutex<std::fs::File>,
    /// Messages Python has sent and the dispatcher has not yet written.
    outbox: Mutex<Vec<(u64, Message)>>,
    posted: Notify,
    /// Each call's response stream, for the dispatcher, before its call is announced.
    streams: UnboundedSender<(u64, SendStream<Bytes>)>,
    /// Stops the server: its thread ends, dropping every connection.
    closed: Notify,
}

impl Calls {
    fn announce(&self, arrived: Arrived) {
        let mut announced = self.announced.lock().unwrap();
        announced.push(arrived);
        if announced.len() == 1 {
            // The loop has read every earlier byte before taking the calls they announced.
            let _ = self.doorbell.lock().unwrap().write_all(b"!");
        }
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
    /// Listens on 127.0.0.1:`port` (0: an ephemeral port) and writes a byte to
    /// `doorbell_fd` whenever calls wait to be taken.
    #[new]
    fn new(doorbell_fd: i32, port: u16) -> PyResult<Self> {
        let std_listener = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
        std_listener.set_nonblocking(true)?;
        let port = std_listener.local_addr()?.port();
        let (streams, opened) = unbounded_channel();
        let calls = Arc::new(Calls {
            announced: Mutex::new(Vec::new()),
            // SAFETY: the caller hands this fd over; it is ours to write and close.
            doorbell: Mutex::new(unsafe { std::fs::File::from_raw_fd(doorbell_fd) }),
            outbox: Mutex::new(Vec::new()),
            posted: Notify::new(),
            streams,
            closed: Notify::new(),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let serving = Arc::clone(&calls);
        thread::Builder::new()
            .name("grpc-floor-h2".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(std_listener).expect("listener");
                    tokio::spawn(dispatch(Arc::clone(&serving), opened));
                    tokio::select! {
                        _ = accept(listener, Arc::clone(&serving)) => {}
                        _ = serving.closed.notified() => {}
                    }
                })
            })?;
        Ok(Server { calls, port })
    }

    /// The calls announced since the last take: (id, request message, rollout key) each.
    fn take(&self, py: Python<'_>) -> Vec<(u64, PyObject, String)> {
        mem::take(&mut *self.calls.announced.lock().unwrap())
            .into_iter()
            .map(|a| {
                // The request's message, without gRPC's 5-byte prefix.
                let body = a.request.get(5..).unwrap_or_default();
                (a.id, PyBytes::new(py, body).into(), a.rollout_key)
            })
            .collect()
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
                None => (id, Message::End(0, String::new())),
            })
            .collect();
        self.calls.post(messages);
    }

    /// Stops listening and drops every connection.
    fn close(&self) {
        self.calls.closed.notify_one();
    }

    /// Ends a call with a gRPC status, after what was sent before.
    fn finish(&self, id: u64, code: u32, message: String) {
        self.calls.post([(id, Message::End(code, message))]);
    }
}

/// Writes what Python posts to each call's stream: one task for every call, so a batch
/// costs one wake however many calls it touches.
async fn dispatch(calls: Arc<Calls>, mut opened: UnboundedReceiver<(u64, SendStream<Bytes>)>) {
    let mut streams: HashMap<u64, SendStream<Bytes>> = HashMap::new();
    loop {
        calls.posted.notified().await;
        // A call's stream is queued before the call is announced, so before any message.
        while let Ok((id, stream)) = opened.try_recv() {
            streams.insert(id, stream);
        }
        let outbox = mem::take(&mut *calls.outbox.lock().unwrap());
        for (id, message) in outbox {
            let stream = match streams.get_mut(&id) {
                Some(stream) => stream,
                None => continue,
            };
            let done = match message {
                Message::Data(framed) => stream.send_data(framed, false).is_err(),
                Message::End(code, text) => {
                    let _ = stream.send_trailers(trailers(code, &text));
                    true
                }
            };
            if done {
                streams.remove(&id);
            }
        }
    }
}

async fn accept(listener: TcpListener, calls: Arc<Calls>) {
    // Each connection numbers its calls from its own base.
    let mut next_id = 0u64;
    loop {
        let socket = match listener.accept().await {
            Ok((socket, _)) => socket,
            Err(_) => continue,
        };
        let _ = socket.set_nodelay(true);
        tokio::spawn(connection(socket, Arc::clone(&calls), next_id));
        next_id += 1 << 32;
    }
}

async fn connection(socket: TcpStream, calls: Arc<Calls>, mut next_id: u64) {
    let mut conn = match h2::server::handshake(socket).await {
        Ok(conn) => conn,
        Err(_) => return,
    };
    while let Some(Ok((request, respond))) = conn.accept().await {
        let id = next_id;
        next_id += 1;
        tokio::spawn(call(id, request, respond, Arc::clone(&calls)));
    }
}

async fn call(
    id: u64,
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    calls: Arc<Calls>,
) {
    let rollout_key = request
        .headers()
        .get("x-rollout-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut body = request.into_body();
    let mut received = BytesMut::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
    }
    let response = Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .expect("static headers");
    let stream = match respond.send_response(response, false) {
        Ok(stream) => stream,
        Err(_) => return,
    };
    if calls.streams.send((id, stream)).is_ok() {
        calls.announce(Arrived { id, request: received.freeze(), rollout_key });
    }
}

fn trailers(code: u32, text: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
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

#[pymodule]
fn grpc_floor_native(_py: Python<'_>, module: &PyModule) -> PyResult<()> {
    module.add_class::<Server>()?;
    Ok(())
}
