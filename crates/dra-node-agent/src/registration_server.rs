//! A minimal HTTP/2 gRPC server for kubelet's plugin registration socket.
//!
//! Kubelet's plugin watcher (v1.37: `pluginmanager/operationexecutor`'s `dial`) dials
//! `<registry>/<driver>-reg.sock` with grpc-go by bare path: no `unix:` scheme and no
//! authority override, so grpc-go sends the socket path as the HTTP/2 `:authority`.
//! tonic's h2 rejects such an authority ("invalid uri character") and resets every stream
//! with PROTOCOL_ERROR (kubernetes/kubernetes#108254, hyperium/h2#487), with no option to
//! relax it. So the registration service is served here instead: just enough HTTP/2 for
//! unary gRPC calls, which reads `:path` and never looks at `:authority`.
//!
//! What it does:
//! - the connection preface, SETTINGS (ours: max concurrent streams, max header list size;
//!   the client's are acknowledged), PING answered, GOAWAY closes, WINDOW_UPDATE and
//!   PRIORITY ignored, RST_STREAM forgets the stream;
//! - HEADERS + CONTINUATION, decoded with HPACK (RFC 7541: static and per-connection
//!   dynamic table, table size updates, Huffman strings), then DATA until END_STREAM;
//! - the body is one gRPC message (uncompressed), handed to the [`Handler`] with `:path`;
//!   the reply is HEADERS (`:status 200`, `content-type: application/grpc`), DATA and
//!   trailers (`grpc-status`), or trailers only for an error.
//! - received DATA is credited back at once with WINDOW_UPDATE. Our replies are small
//!   (a `PluginInfo`), so send-side flow control is not tracked.
//!
//! Limits: frames over 16384 bytes, header blocks over [`MAX_HEADER_BLOCK`] and decoded
//! header lists over [`MAX_HEADER_LIST`] end the connection; messages over [`MAX_MESSAGE`]
//! fail with RESOURCE_EXHAUSTED. A connection that breaks the protocol gets a GOAWAY and is
//! dropped; each connection is its own task, so nothing it sends can stop the others.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, OnceLock};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

/// What an HTTP/2 client sends first.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// SETTINGS_MAX_FRAME_SIZE: the default, and what we accept.
pub const MAX_FRAME: usize = 16384;
/// Largest header block (HEADERS + CONTINUATION payloads) accepted.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;
/// Largest decoded header list (RFC 7540 sizes: name + value + 32 per field).
pub const MAX_HEADER_LIST: usize = 1 << 20;
/// Largest gRPC message accepted.
pub const MAX_MESSAGE: usize = 1 << 20;
/// Open streams per connection.
pub const MAX_STREAMS: usize = 100;
/// SETTINGS_HEADER_TABLE_SIZE: the default; the client's encoder may not use more.
const HEADER_TABLE_SIZE: usize = 4096;

// Frame types.
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
// Flags.
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;
// Error codes.
const NO_ERROR: u32 = 0x0;
const PROTOCOL_ERROR: u32 = 0x1;
const FRAME_SIZE_ERROR: u32 = 0x6;
const REFUSED_STREAM: u32 = 0x7;
const COMPRESSION_ERROR: u32 = 0x9;
// Settings.
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// gRPC status codes used here.
pub mod code {
    pub const OK: u32 = 0;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
}

/// A failed call: gRPC status code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcError {
    pub code: u32,
    pub message: String,
}

impl GrpcError {
    pub fn new(code: u32, message: impl Into<String>) -> Self {
        GrpcError {
            code,
            message: message.into(),
        }
    }
}

/// Answers one unary call: `(:path, request protobuf)` to the response protobuf.
pub type Handler = Arc<dyn Fn(&str, &[u8]) -> Result<Vec<u8>, GrpcError> + Send + Sync>;

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not an HTTP/2 connection preface")]
    Preface,
    #[error("HTTP/2 connection error {code:#x}: {reason}")]
    Protocol { code: u32, reason: String },
}

fn conn_err(code: u32, reason: impl Into<String>) -> ConnError {
    ConnError::Protocol {
        code,
        reason: reason.into(),
    }
}

/// Accepts connections until `shutdown` completes, then drops them all.
pub async fn serve(listener: UnixListener, handler: Handler, shutdown: impl Future<Output = ()>) {
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let handler = handler.clone();
                    conns.spawn(async move {
                        if let Err(e) = serve_connection(stream, handler).await {
                            tracing::debug!(error = %e, "registration connection dropped");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting on the registration socket");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(done) = conns.join_next(), if !conns.is_empty() => {
                if let Err(e) = done {
                    tracing::error!(error = %e, "registration connection task failed");
                }
            }
        }
    }
}

/// One request being received.
#[derive(Default)]
struct Stream {
    path: Option<String>,
    body: Vec<u8>,
}

/// A header block waiting for its CONTINUATION frames.
struct PendingHeaders {
    stream: u32,
    end_stream: bool,
    block: Vec<u8>,
}

struct Conn {
    handler: Handler,
    decoder: Decoder,
    streams: HashMap<u32, Stream>,
    last_stream: u32,
    pending: Option<PendingHeaders>,
    out: Vec<u8>,
}

/// Serves one connection until the client closes it, sends GOAWAY, or breaks the protocol
/// (then it gets a GOAWAY and the error is returned).
pub async fn serve_connection<S>(io: S, handler: Handler) -> Result<(), ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut io = BufReader::new(io);
    let mut preface = [0u8; 24];
    match io.read_exact(&mut preface).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    if &preface != PREFACE {
        return Err(ConnError::Preface);
    }
    let mut conn = Conn {
        handler,
        decoder: Decoder::new(HEADER_TABLE_SIZE),
        streams: HashMap::new(),
        last_stream: 0,
        pending: None,
        out: Vec::new(),
    };
    let mut settings = Vec::new();
    for (id, value) in [
        (SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS as u32),
        (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST as u32),
    ] {
        settings.extend_from_slice(&id.to_be_bytes());
        settings.extend_from_slice(&value.to_be_bytes());
    }
    write_frame(&mut conn.out, SETTINGS, 0, 0, &settings);
    let result = conn.run(&mut io).await;
    if let Err(ConnError::Protocol { code, reason }) = &result {
        let mut payload = conn.last_stream.to_be_bytes().to_vec();
        payload.extend_from_slice(&code.to_be_bytes());
        payload.extend_from_slice(reason.as_bytes());
        write_frame(&mut conn.out, GOAWAY, 0, 0, &payload);
        let _ = io.get_mut().write_all(&conn.out).await;
        let _ = io.get_mut().flush().await;
    }
    result
}

impl Conn {
    async fn run<S>(&mut self, io: &mut BufReader<S>) -> Result<(), ConnError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut payload = Vec::new();
        loop {
            if !self.out.is_empty() {
                io.get_mut().write_all(&self.out).await?;
                io.get_mut().flush().await?;
                self.out.clear();
            }
            let mut head = [0u8; 9];
            match io.read_exact(&mut head).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            if len > MAX_FRAME {
                return Err(conn_err(FRAME_SIZE_ERROR, "frame larger than 16384"));
            }
            payload.resize(len, 0);
            match io.read_exact(&mut payload).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            if !self.frame(kind, flags, stream, &payload)? {
                // GOAWAY from the client.
                if !self.out.is_empty() {
                    io.get_mut().write_all(&self.out).await?;
                    io.get_mut().flush().await?;
                }
                return Ok(());
            }
        }
    }

    /// Handles one frame; false when the connection should close.
    fn frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
    ) -> Result<bool, ConnError> {
        if let Some(p) = &mut self.pending {
            if kind != CONTINUATION || stream != p.stream {
                return Err(conn_err(PROTOCOL_ERROR, "expected CONTINUATION"));
            }
            if p.block.len() + payload.len() > MAX_HEADER_BLOCK {
                return Err(conn_err(PROTOCOL_ERROR, "header block too large"));
            }
            p.block.extend_from_slice(payload);
            if flags & END_HEADERS != 0 {
                let p = self.pending.take().expect("pending header block");
                self.headers(p.stream, p.end_stream, &p.block)?;
            }
            return Ok(true);
        }
        match kind {
            SETTINGS => {
                if stream != 0 {
                    return Err(conn_err(PROTOCOL_ERROR, "SETTINGS on a stream"));
                }
                if flags & ACK != 0 {
                    if !payload.is_empty() {
                        return Err(conn_err(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload"));
                    }
                } else {
                    if !payload.len().is_multiple_of(6) {
                        return Err(conn_err(FRAME_SIZE_ERROR, "SETTINGS length"));
                    }
                    // The client's settings bound what we send: our frames are within the
                    // minimum max frame size and our header blocks use no dynamic table.
                    write_frame(&mut self.out, SETTINGS, ACK, 0, &[]);
                }
            }
            PING => {
                if stream != 0 {
                    return Err(conn_err(PROTOCOL_ERROR, "PING on a stream"));
                }
                if payload.len() != 8 {
                    return Err(conn_err(FRAME_SIZE_ERROR, "PING length"));
                }
                if flags & ACK == 0 {
                    write_frame(&mut self.out, PING, ACK, 0, payload);
                }
            }
            GOAWAY => return Ok(false),
            WINDOW_UPDATE | PRIORITY => {}
            RST_STREAM => {
                if stream == 0 {
                    return Err(conn_err(PROTOCOL_ERROR, "RST_STREAM on stream 0"));
                }
                self.streams.remove(&stream);
            }
            PUSH_PROMISE => return Err(conn_err(PROTOCOL_ERROR, "PUSH_PROMISE from a client")),
            CONTINUATION => return Err(conn_err(PROTOCOL_ERROR, "unexpected CONTINUATION")),
            HEADERS => {
                if stream == 0 || stream.is_multiple_of(2) {
                    return Err(conn_err(PROTOCOL_ERROR, "HEADERS on a server stream id"));
                }
                let mut fragment = unpad(flags, payload)?;
                if flags & PRIORITY_FLAG != 0 {
                    fragment = fragment
                        .get(5..)
                        .ok_or_else(|| conn_err(FRAME_SIZE_ERROR, "HEADERS priority"))?;
                }
                let end_stream = flags & END_STREAM != 0;
                if flags & END_HEADERS != 0 {
                    self.headers(stream, end_stream, fragment)?;
                } else {
                    self.pending = Some(PendingHeaders {
                        stream,
                        end_stream,
                        block: fragment.to_vec(),
                    });
                }
            }
            DATA => {
                if stream == 0 {
                    return Err(conn_err(PROTOCOL_ERROR, "DATA on stream 0"));
                }
                // Flow control counts the whole payload, padding included.
                if !payload.is_empty() {
                    write_window_update(&mut self.out, 0, payload.len() as u32);
                }
                let data = unpad(flags, payload)?;
                let end_stream = flags & END_STREAM != 0;
                let Some(s) = self.streams.get_mut(&stream) else {
                    // A stream we already answered or reset: ignore.
                    return Ok(true);
                };
                if s.body.len() + data.len() > MAX_MESSAGE + 5 {
                    self.streams.remove(&stream);
                    let e = GrpcError::new(code::RESOURCE_EXHAUSTED, "message too large");
                    write_error(&mut self.out, stream, &e);
                    if !end_stream {
                        write_rst(&mut self.out, stream, NO_ERROR);
                    }
                    return Ok(true);
                }
                s.body.extend_from_slice(data);
                if end_stream {
                    self.complete(stream);
                } else if !payload.is_empty() {
                    write_window_update(&mut self.out, stream, payload.len() as u32);
                }
            }
            _ => {} // Unknown frame types are ignored (RFC 7540 4.1).
        }
        Ok(true)
    }

    fn headers(&mut self, stream: u32, end_stream: bool, block: &[u8]) -> Result<(), ConnError> {
        // Always decode, so the dynamic table stays in step with the client's encoder.
        let fields = self
            .decoder
            .decode(block)
            .map_err(|e| conn_err(COMPRESSION_ERROR, e.0))?;
        if self.streams.contains_key(&stream) {
            // Trailers from the client (gRPC clients send none): they end the request.
            if end_stream {
                self.complete(stream);
            }
            return Ok(());
        }
        if stream <= self.last_stream {
            return Err(conn_err(PROTOCOL_ERROR, "HEADERS on a closed stream"));
        }
        self.last_stream = stream;
        if self.streams.len() >= MAX_STREAMS {
            write_rst(&mut self.out, stream, REFUSED_STREAM);
            return Ok(());
        }
        let path = fields
            .into_iter()
            .find(|(n, _)| n == b":path")
            .and_then(|(_, v)| String::from_utf8(v).ok());
        self.streams.insert(
            stream,
            Stream {
                path,
                body: Vec::new(),
            },
        );
        if end_stream {
            self.complete(stream);
        }
        Ok(())
    }

    /// The request on `stream` is complete: answer it.
    fn complete(&mut self, stream: u32) {
        let Some(s) = self.streams.remove(&stream) else {
            return;
        };
        let result = match (&s.path, grpc_message(&s.body)) {
            (None, _) => Err(GrpcError::new(code::INTERNAL, "no :path")),
            (_, Err(e)) => Err(e),
            (Some(path), Ok(msg)) => (self.handler)(path, msg),
        };
        match result {
            Ok(reply) => {
                write_headers(
                    &mut self.out,
                    stream,
                    END_HEADERS,
                    &[(":status", "200"), ("content-type", "application/grpc")],
                );
                let mut body = Vec::with_capacity(reply.len() + 5);
                body.push(0);
                body.extend_from_slice(&(reply.len() as u32).to_be_bytes());
                body.extend_from_slice(&reply);
                for chunk in body.chunks(MAX_FRAME) {
                    write_frame(&mut self.out, DATA, 0, stream, chunk);
                }
                write_headers(
                    &mut self.out,
                    stream,
                    END_HEADERS | END_STREAM,
                    &[("grpc-status", "0")],
                );
            }
            Err(e) => write_error(&mut self.out, stream, &e),
        }
    }
}

/// The payload of a padded frame without its padding.
fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], ConnError> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or_else(|| conn_err(PROTOCOL_ERROR, "padding"))?;
    rest.len()
        .checked_sub(pad as usize)
        .map(|n| &rest[..n])
        .ok_or_else(|| conn_err(PROTOCOL_ERROR, "padding longer than the frame"))
}

/// The one gRPC message of a unary request body.
fn grpc_message(body: &[u8]) -> Result<&[u8], GrpcError> {
    if body.len() < 5 {
        return Err(GrpcError::new(code::INTERNAL, "missing gRPC message"));
    }
    if body[0] != 0 {
        return Err(GrpcError::new(
            code::UNIMPLEMENTED,
            "compressed messages are not supported",
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(GrpcError::new(
            code::RESOURCE_EXHAUSTED,
            "message too large",
        ));
    }
    if body.len() != 5 + len {
        return Err(GrpcError::new(
            code::INTERNAL,
            "request body is not one gRPC message",
        ));
    }
    Ok(&body[5..])
}

fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

fn write_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    write_frame(out, WINDOW_UPDATE, 0, stream, &increment.to_be_bytes());
}

fn write_rst(out: &mut Vec<u8>, stream: u32, error: u32) {
    write_frame(out, RST_STREAM, 0, stream, &error.to_be_bytes());
}

/// A HEADERS frame, each field a literal without indexing, no Huffman (RFC 7541 6.2.2).
fn write_headers(out: &mut Vec<u8>, stream: u32, flags: u8, fields: &[(&str, &str)]) {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0);
        encode_string(&mut block, name.as_bytes());
        encode_string(&mut block, value.as_bytes());
    }
    write_frame(out, HEADERS, flags, stream, &block);
}

/// A trailers-only response.
fn write_error(out: &mut Vec<u8>, stream: u32, e: &GrpcError) {
    let code = e.code.to_string();
    let mut message = percent_encode(&e.message);
    message.truncate(1024);
    write_headers(
        out,
        stream,
        END_HEADERS | END_STREAM,
        &[
            (":status", "200"),
            ("content-type", "application/grpc"),
            ("grpc-status", &code),
            ("grpc-message", &message),
        ],
    );
}

/// gRPC's percent-encoding of `grpc-message`.
fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An HPACK integer with an `n`-bit prefix; `first` holds the bits above the prefix.
fn encode_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// An HPACK string literal, not Huffman-coded.
fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    encode_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// An HPACK decoding error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HpackError(pub &'static str);

/// A header field: name and value.
pub type Field = (Vec<u8>, Vec<u8>);

/// An HPACK decoder (RFC 7541) with its dynamic table; one per connection.
pub struct Decoder {
    /// Newest first.
    table: VecDeque<Field>,
    size: usize,
    max_size: usize,
    /// The most the encoder may set `max_size` to (our SETTINGS_HEADER_TABLE_SIZE).
    limit: usize,
}

impl Decoder {
    pub fn new(limit: usize) -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
        }
    }

    /// Decodes one complete header block.
    pub fn decode(&mut self, mut block: &[u8]) -> Result<Vec<Field>, HpackError> {
        let mut fields = Vec::new();
        let mut list_size = 0usize;
        while let Some(&b) = block.first() {
            let field = if b & 0x80 != 0 {
                // Indexed field.
                let index = decode_int(&mut block, 7)?;
                self.get(index)?
            } else if b & 0xc0 == 0x40 {
                // Literal with incremental indexing.
                let field = self.literal(&mut block, 6)?;
                self.insert(field.clone());
                field
            } else if b & 0xe0 == 0x20 {
                // Dynamic table size update.
                let size = decode_int(&mut block, 5)?;
                if size > self.limit {
                    return Err(HpackError("table size update over the limit"));
                }
                self.max_size = size;
                self.evict(0);
                continue;
            } else {
                // Literal without indexing (0000) or never indexed (0001).
                self.literal(&mut block, 4)?
            };
            list_size += field.0.len() + field.1.len() + 32;
            if list_size > MAX_HEADER_LIST {
                return Err(HpackError("header list too large"));
            }
            fields.push(field);
        }
        Ok(fields)
    }

    fn literal(&self, block: &mut &[u8], prefix: u32) -> Result<Field, HpackError> {
        let index = decode_int(block, prefix)?;
        let name = if index == 0 {
            decode_string(block)?
        } else {
            self.get(index)?.0
        };
        let value = decode_string(block)?;
        Ok((name, value))
    }

    fn get(&self, index: usize) -> Result<Field, HpackError> {
        match index {
            0 => Err(HpackError("index 0")),
            1..=61 => {
                let (n, v) = STATIC_TABLE[index - 1];
                Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            }
            _ => self
                .table
                .get(index - 62)
                .cloned()
                .ok_or(HpackError("index past the dynamic table")),
        }
    }

    fn insert(&mut self, field: Field) {
        let size = field.0.len() + field.1.len() + 32;
        if size > self.max_size {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(size);
        self.size += size;
        self.table.push_front(field);
    }

    /// Evicts until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + 32;
        }
    }
}

fn decode_int(block: &mut &[u8], prefix: u32) -> Result<usize, HpackError> {
    let (&first, mut rest) = block.split_first().ok_or(HpackError("truncated integer"))?;
    let max = (1usize << prefix) - 1;
    let mut value = first as usize & max;
    if value == max {
        let mut shift = 0;
        loop {
            let (&b, r) = rest.split_first().ok_or(HpackError("truncated integer"))?;
            rest = r;
            if shift > 21 {
                return Err(HpackError("integer too large"));
            }
            value += ((b & 0x7f) as usize) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
    }
    *block = rest;
    Ok(value)
}

fn decode_string(block: &mut &[u8]) -> Result<Vec<u8>, HpackError> {
    let huffman = block.first().ok_or(HpackError("truncated string"))? & 0x80 != 0;
    let len = decode_int(block, 7)?;
    if len > block.len() {
        return Err(HpackError("truncated string"));
    }
    let (s, rest) = block.split_at(len);
    *block = rest;
    if huffman {
        huffman_decode(s)
    } else {
        Ok(s.to_vec())
    }
}

/// (code length, code) to symbol, EOS (256) included.
fn huffman_codes() -> &'static HashMap<(u8, u32), u16> {
    static CODES: OnceLock<HashMap<(u8, u32), u16>> = OnceLock::new();
    CODES.get_or_init(|| {
        let mut m: HashMap<(u8, u32), u16> = (0..256)
            .map(|s| ((HUFFMAN_LENGTHS[s], HUFFMAN_CODES[s]), s as u16))
            .collect();
        m.insert((30, 0x3fff_ffff), 256);
        m
    })
}

/// Decodes a Huffman-coded string (RFC 7541 5.2 and Appendix B).
pub fn huffman_decode(src: &[u8]) -> Result<Vec<u8>, HpackError> {
    let codes = huffman_codes();
    let mut out = Vec::with_capacity(src.len() * 8 / 5 + 1);
    let (mut code, mut len) = (0u32, 0u8);
    for &byte in src {
        for i in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> i) & 1);
            len += 1;
            if len >= 5 {
                match codes.get(&(len, code)) {
                    Some(256) => return Err(HpackError("EOS in a Huffman string")),
                    Some(&sym) => {
                        out.push(sym as u8);
                        code = 0;
                        len = 0;
                    }
                    None if len >= 30 => return Err(HpackError("bad Huffman code")),
                    None => {}
                }
            }
        }
    }
    // Padding: fewer than 8 bits, all ones (a prefix of EOS).
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(HpackError("bad Huffman padding"));
    }
    Ok(out)
}

/// Encodes with the Huffman code (for tests: clients send this).
pub fn huffman_encode(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u64, 0u32);
    for &b in src {
        let len = u32::from(HUFFMAN_LENGTHS[b as usize]);
        acc = (acc << len) | u64::from(HUFFMAN_CODES[b as usize]);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) | ((1u64 << (8 - bits)) - 1)) as u8);
    }
    out
}

/// RFC 7541 Appendix A.
const STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The Huffman code of RFC 7541 Appendix B: code and length in bits of each byte value
/// (EOS, 256, is 30 ones). Same values as h2's generated table.
const HUFFMAN_CODES: [u32; 256] = [
    0x1ff8, 0x7fffd8, 0xfffffe2, 0xfffffe3, 0xfffffe4, 0xfffffe5, 0xfffffe6, 0xfffffe7, 0xfffffe8,
    0xffffea, 0x3ffffffc, 0xfffffe9, 0xfffffea, 0x3ffffffd, 0xfffffeb, 0xfffffec, 0xfffffed,
    0xfffffee, 0xfffffef, 0xffffff0, 0xffffff1, 0xffffff2, 0x3ffffffe, 0xffffff3, 0xffffff4,
    0xffffff5, 0xffffff6, 0xffffff7, 0xffffff8, 0xffffff9, 0xffffffa, 0xffffffb, 0x14, 0x3f8,
    0x3f9, 0xffa, 0x1ff9, 0x15, 0xf8, 0x7fa, 0x3fa, 0x3fb, 0xf9, 0x7fb, 0xfa, 0x16, 0x17, 0x18,
    0x0, 0x1, 0x2, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x5c, 0xfb, 0x7ffc, 0x20, 0xffb,
    0x3fc, 0x1ffa, 0x21, 0x5d, 0x5e, 0x5f, 0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68,
    0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72, 0xfc, 0x73, 0xfd, 0x1ffb, 0x7fff0,
    0x1ffc, 0x3ffc, 0x22, 0x7ffd, 0x3, 0x23, 0x4, 0x24, 0x5, 0x25, 0x26, 0x27, 0x6, 0x74, 0x75,
    0x28, 0x29, 0x2a, 0x7, 0x2b, 0x76, 0x2c, 0x8, 0x9, 0x2d, 0x77, 0x78, 0x79, 0x7a, 0x7b, 0x7ffe,
    0x7fc, 0x3ffd, 0x1ffd, 0xffffffc, 0xfffe6, 0x3fffd2, 0xfffe7, 0xfffe8, 0x3fffd3, 0x3fffd4,
    0x3fffd5, 0x7fffd9, 0x3fffd6, 0x7fffda, 0x7fffdb, 0x7fffdc, 0x7fffdd, 0x7fffde, 0xffffeb,
    0x7fffdf, 0xffffec, 0xffffed, 0x3fffd7, 0x7fffe0, 0xffffee, 0x7fffe1, 0x7fffe2, 0x7fffe3,
    0x7fffe4, 0x1fffdc, 0x3fffd8, 0x7fffe5, 0x3fffd9, 0x7fffe6, 0x7fffe7, 0xffffef, 0x3fffda,
    0x1fffdd, 0xfffe9, 0x3fffdb, 0x3fffdc, 0x7fffe8, 0x7fffe9, 0x1fffde, 0x7fffea, 0x3fffdd,
    0x3fffde, 0xfffff0, 0x1fffdf, 0x3fffdf, 0x7fffeb, 0x7fffec, 0x1fffe0, 0x1fffe1, 0x3fffe0,
    0x1fffe2, 0x7fffed, 0x3fffe1, 0x7fffee, 0x7fffef, 0xfffea, 0x3fffe2, 0x3fffe3, 0x3fffe4,
    0x7ffff0, 0x3fffe5, 0x3fffe6, 0x7ffff1, 0x3ffffe0, 0x3ffffe1, 0xfffeb, 0x7fff1, 0x3fffe7,
    0x7ffff2, 0x3fffe8, 0x1ffffec, 0x3ffffe2, 0x3ffffe3, 0x3ffffe4, 0x7ffffde, 0x7ffffdf,
    0x3ffffe5, 0xfffff1, 0x1ffffed, 0x7fff2, 0x1fffe3, 0x3ffffe6, 0x7ffffe0, 0x7ffffe1, 0x3ffffe7,
    0x7ffffe2, 0xfffff2, 0x1fffe4, 0x1fffe5, 0x3ffffe8, 0x3ffffe9, 0xffffffd, 0x7ffffe3, 0x7ffffe4,
    0x7ffffe5, 0xfffec, 0xfffff3, 0xfffed, 0x1fffe6, 0x3fffe9, 0x1fffe7, 0x1fffe8, 0x7ffff3,
    0x3fffea, 0x3fffeb, 0x1ffffee, 0x1ffffef, 0xfffff4, 0xfffff5, 0x3ffffea, 0x7ffff4, 0x3ffffeb,
    0x7ffffe6, 0x3ffffec, 0x3ffffed, 0x7ffffe7, 0x7ffffe8, 0x7ffffe9, 0x7ffffea, 0x7ffffeb,
    0xffffffe, 0x7ffffec, 0x7ffffed, 0x7ffffee, 0x7ffffef, 0x7fffff0, 0x3ffffee,
];

const HUFFMAN_LENGTHS: [u8; 256] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
];

/// A raw HTTP/2 client for tests: writes frames by hand, so it can send what kubelet sends.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A header block of literals without indexing; `huffman` codes names and values.
    pub fn literal_block(fields: &[(&str, &str)], huffman: bool) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in fields {
            block.push(0);
            string(&mut block, name.as_bytes(), huffman);
            string(&mut block, value.as_bytes(), huffman);
        }
        block
    }

    /// An HPACK string literal, Huffman-coded or not.
    pub fn string(out: &mut Vec<u8>, s: &[u8], huffman: bool) {
        if huffman {
            let h = huffman_encode(s);
            encode_int(out, 0x80, 7, h.len());
            out.extend_from_slice(&h);
        } else {
            encode_string(out, s);
        }
    }

    /// A literal with incremental indexing and a new name.
    pub fn indexed_literal(out: &mut Vec<u8>, name: &str, value: &str, huffman: bool) {
        out.push(0x40);
        string(out, name.as_bytes(), huffman);
        string(out, value.as_bytes(), huffman);
    }

    /// A gRPC-framed message.
    pub fn grpc_frame(msg: &[u8]) -> Vec<u8> {
        let mut body = vec![0];
        body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        body.extend_from_slice(msg);
        body
    }

    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(&mut out, kind, flags, stream, payload);
        out
    }

    /// What came back on one stream.
    #[derive(Debug, Default)]
    pub struct Reply {
        pub headers: Vec<Vec<(String, String)>>,
        pub data: Vec<u8>,
        pub reset: Option<u32>,
    }

    impl Reply {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .flatten()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }
        /// The protobuf of the one gRPC message in the reply.
        pub fn message(&self) -> &[u8] {
            assert_eq!(self.data[0], 0);
            let len = u32::from_be_bytes(self.data[1..5].try_into().unwrap()) as usize;
            assert_eq!(self.data.len(), 5 + len);
            &self.data[5..]
        }
    }

    pub struct Client<S> {
        pub io: S,
        pub decoder: Decoder,
        /// Every frame read: (type, flags, stream, payload).
        pub frames: Vec<(u8, u8, u32, Vec<u8>)>,
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
        /// Sends the preface and an empty SETTINGS, as a client does first.
        pub async fn start(mut io: S) -> Self {
            io.write_all(PREFACE).await.unwrap();
            io.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
            Client {
                io,
                decoder: Decoder::new(HEADER_TABLE_SIZE),
                frames: Vec::new(),
            }
        }

        pub async fn send(&mut self, bytes: &[u8]) {
            self.io.write_all(bytes).await.unwrap();
        }

        /// The next frame, or None at end of stream.
        pub async fn read_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
            let mut head = [0u8; 9];
            self.io.read_exact(&mut head).await.ok()?;
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0; len];
            self.io.read_exact(&mut payload).await.ok()?;
            let stream = u32::from_be_bytes(head[5..9].try_into().unwrap());
            let f = (head[3], head[4], stream, payload);
            self.frames.push(f.clone());
            Some(f)
        }

        /// A unary call: HEADERS with `block`, DATA with `body` (END_STREAM), then reads
        /// the reply until the stream ends.
        pub async fn call(&mut self, stream: u32, block: &[u8], body: &[u8]) -> Reply {
            self.send(&frame(HEADERS, END_HEADERS, stream, block)).await;
            self.send(&frame(DATA, END_STREAM, stream, body)).await;
            self.reply(stream).await
        }

        pub async fn reply(&mut self, stream: u32) -> Reply {
            let mut reply = Reply::default();
            loop {
                let (kind, flags, id, payload) = self.read_frame().await.expect("connection open");
                if id != stream {
                    continue;
                }
                match kind {
                    HEADERS => {
                        assert_ne!(flags & END_HEADERS, 0, "one-frame header blocks");
                        let fields = self.decoder.decode(&payload).unwrap();
                        reply.headers.push(
                            fields
                                .into_iter()
                                .map(|(n, v)| {
                                    (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())
                                })
                                .collect(),
                        );
                        if flags & END_STREAM != 0 {
                            return reply;
                        }
                    }
                    DATA => {
                        reply.data.extend_from_slice(&payload);
                        if flags & END_STREAM != 0 {
                            return reply;
                        }
                    }
                    RST_STREAM => {
                        reply.reset = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                        return reply;
                    }
                    _ => {}
                }
            }
        }

        /// Reads until the server closes; returns the GOAWAY error code if one came.
        pub async fn goaway(&mut self) -> Option<u32> {
            let mut code = None;
            while let Some((kind, _, _, payload)) = self.read_frame().await {
                if kind == GOAWAY {
                    code = Some(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
                }
            }
            code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn fields(v: &[(&str, &str)]) -> Vec<Field> {
        v.iter()
            .map(|(n, val)| (n.as_bytes().to_vec(), val.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn rfc7541_c3_requests_without_huffman() {
        let mut d = Decoder::new(4096);
        let f = d
            .decode(&hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"))
            .unwrap();
        assert_eq!(
            f,
            fields(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ])
        );
        assert_eq!(d.size, 57);
        let f = d
            .decode(&hex("8286 84be 5808 6e6f 2d63 6163 6865"))
            .unwrap();
        assert_eq!(f[3], fields(&[(":authority", "www.example.com")])[0]);
        assert_eq!(f[4], fields(&[("cache-control", "no-cache")])[0]);
        assert_eq!(d.size, 110);
    }

    #[test]
    fn rfc7541_c4_requests_with_huffman() {
        let mut d = Decoder::new(4096);
        let f = d
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert_eq!(
            f,
            fields(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ])
        );
        let f = d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(
            f,
            fields(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ])
        );
        let f = d
            .decode(&hex(
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ))
            .unwrap();
        assert_eq!(
            f,
            fields(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(d.size, 164);
        assert_eq!(
            huffman_encode(b"www.example.com"),
            hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff")
        );
    }

    #[test]
    fn huffman_round_trips_every_byte_and_rejects_bad_padding() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)).unwrap(), all);
        for s in [&b""[..], b"a", b"/pluginregistration.Registration/GetInfo"] {
            assert_eq!(huffman_decode(&huffman_encode(s)).unwrap(), s);
        }
        // 'a' is 00011 (5 bits): padding with zeros is not EOS.
        assert!(huffman_decode(&[0b0001_1000]).is_err());
        assert_eq!(huffman_decode(&[0b0001_1111]).unwrap(), b"a");
        // A whole byte of padding, and EOS itself.
        assert!(huffman_decode(&[0b0001_1111, 0xff]).is_err());
        assert!(huffman_decode(&[0xff, 0xff, 0xff, 0xfc]).is_err());
    }

    #[test]
    fn table_size_updates_evict_and_bad_blocks_fail() {
        let mut d = Decoder::new(4096);
        let mut block = Vec::new();
        indexed_literal(&mut block, "a", "b", false);
        d.decode(&block).unwrap();
        assert_eq!(d.decode(&[0x80 | 62]).unwrap(), fields(&[("a", "b")]));
        // Size update to 0 empties the table; then back to 4096.
        assert_eq!(d.decode(&[0x20, 0x3f, 0xe1, 0x1f]).unwrap(), vec![]);
        assert!(d.decode(&[0x80 | 62]).is_err());
        // Over our limit.
        assert!(d.decode(&[0x3f, 0xe2, 0x1f]).is_err());
        assert!(d.decode(&[0x80]).is_err());
        assert!(d.decode(&[0x00, 0x05, b'a']).is_err());
        assert!(
            d.decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f])
                .is_err()
        );
        // A small table evicts the oldest entry.
        let mut d = Decoder::new(70);
        let mut block = Vec::new();
        indexed_literal(&mut block, "first", "1", false);
        indexed_literal(&mut block, "second", "2", false);
        d.decode(&block).unwrap();
        assert_eq!(d.table.len(), 1);
        assert_eq!(d.decode(&[0x80 | 62]).unwrap(), fields(&[("second", "2")]));
    }

    fn echo() -> Handler {
        Arc::new(|path: &str, msg: &[u8]| match path {
            "/echo" => Ok(msg.to_vec()),
            _ => Err(GrpcError::new(code::UNIMPLEMENTED, format!("{path} 100%"))),
        })
    }

    fn request(path: &str) -> Vec<u8> {
        literal_block(
            &[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "/var/lib/kubelet/plugins_registry/x-reg.sock"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
            false,
        )
    }

    #[tokio::test]
    async fn answers_pings_settings_continuations_and_padding() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve_connection(b, echo()));
        let mut c = Client::start(a).await;
        c.send(&frame(PING, 0, 0, b"12345678")).await;
        // A header block split over HEADERS + CONTINUATION, then padded DATA in two frames.
        let block = request("/echo");
        let (first, rest) = block.split_at(7);
        c.send(&frame(HEADERS, 0, 1, first)).await;
        c.send(&frame(CONTINUATION, END_HEADERS, 1, rest)).await;
        let body = grpc_frame(b"hello");
        let mut padded = vec![3];
        padded.extend_from_slice(&body[..4]);
        padded.extend_from_slice(&[0, 0, 0]);
        c.send(&frame(DATA, PADDED, 1, &padded)).await;
        c.send(&frame(WINDOW_UPDATE, 0, 0, &1000u32.to_be_bytes()))
            .await;
        c.send(&frame(DATA, END_STREAM, 1, &body[4..])).await;
        let reply = c.reply(1).await;
        assert_eq!(reply.header(":status"), Some("200"));
        assert_eq!(reply.header("content-type"), Some("application/grpc"));
        assert_eq!(reply.header("grpc-status"), Some("0"));
        assert_eq!(reply.message(), b"hello");
        let kinds: Vec<(u8, u8)> = c.frames.iter().map(|f| (f.0, f.1)).collect();
        assert!(kinds.contains(&(SETTINGS, 0)));
        assert!(kinds.contains(&(SETTINGS, ACK)));
        assert!(
            c.frames
                .iter()
                .any(|f| f.0 == PING && f.1 == ACK && f.3 == b"12345678")
        );
        assert!(kinds.contains(&(WINDOW_UPDATE, 0)));
        // Unknown method: trailers only.
        let reply = c.call(3, &request("/nope"), &grpc_frame(b"")).await;
        assert_eq!(reply.headers.len(), 1);
        assert_eq!(reply.header("grpc-status"), Some("12"));
        assert_eq!(reply.header("grpc-message"), Some("/nope 100%25"));
        // Compressed and malformed bodies.
        let reply = c.call(5, &request("/echo"), &[1, 0, 0, 0, 0]).await;
        assert_eq!(reply.header("grpc-status"), Some("12"));
        let reply = c.call(7, &request("/echo"), &[0, 0, 0, 0, 9, 1]).await;
        assert_eq!(reply.header("grpc-status"), Some("13"));
        c.send(&frame(GOAWAY, 0, 0, &[0; 8])).await;
        assert!(server.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn bad_connections_are_dropped() {
        // Not HTTP/2.
        let (mut a, b) = tokio::io::duplex(1 << 16);
        a.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(matches!(
            serve_connection(b, echo()).await,
            Err(ConnError::Preface)
        ));
        // A frame over 16384 bytes.
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve_connection(b, echo()));
        let mut c = Client::start(a).await;
        c.send(&[0x01, 0x00, 0x00, DATA, 0, 0, 0, 0, 1]).await;
        assert_eq!(c.goaway().await, Some(FRAME_SIZE_ERROR));
        assert!(server.await.unwrap().is_err());
        // Garbage HPACK.
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve_connection(b, echo()));
        let mut c = Client::start(a).await;
        c.send(&frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &[0xff, 0xff, 0xff],
        ))
        .await;
        assert_eq!(c.goaway().await, Some(COMPRESSION_ERROR));
        assert!(server.await.unwrap().is_err());
        // Something else than CONTINUATION inside a header block.
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve_connection(b, echo()));
        let mut c = Client::start(a).await;
        c.send(&frame(HEADERS, 0, 1, &request("/echo"))).await;
        c.send(&frame(PING, 0, 0, b"12345678")).await;
        assert_eq!(c.goaway().await, Some(PROTOCOL_ERROR));
        assert!(server.await.unwrap().is_err());
        // Random bytes after the preface: no panic, whatever the outcome.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200 {
            let (a, b) = tokio::io::duplex(1 << 16);
            let server = tokio::spawn(serve_connection(b, echo()));
            let mut c = Client::start(a).await;
            let mut junk = Vec::new();
            for _ in 0..(seed % 300) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                junk.push(seed as u8);
            }
            c.send(&junk).await;
            drop(c);
            let _ = server.await.unwrap();
        }
    }

    #[tokio::test]
    async fn oversized_messages_fail_the_call_not_the_connection() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let server = tokio::spawn(serve_connection(b, echo()));
        let mut c = Client::start(a).await;
        c.send(&frame(HEADERS, END_HEADERS, 1, &request("/echo")))
            .await;
        let chunk = vec![0u8; MAX_FRAME];
        for _ in 0..(MAX_MESSAGE / MAX_FRAME + 1) {
            c.send(&frame(DATA, 0, 1, &chunk)).await;
        }
        let reply = c.reply(1).await;
        assert_eq!(reply.header("grpc-status"), Some("8"));
        c.send(&frame(DATA, END_STREAM, 1, &chunk)).await;
        let reply = c.call(3, &request("/echo"), &grpc_frame(b"ok")).await;
        assert_eq!(reply.message(), b"ok");
        drop(c);
        assert!(server.await.unwrap().is_ok());
    }
}
