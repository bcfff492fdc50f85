//! Request traces, the OpenTelemetry way: W3C trace context in and out ([`context`]), head
//! sampling by ratio with the parent's flag honoured ([`sample`]), what a request's spans
//! say recorded as plain data on the request path ([`record`]), and their export over OTLP
//! (gRPC or HTTP/protobuf) from a bounded queue on a thread of its own ([`export`]). The
//! OpenTelemetry SDK's types are made on that thread only ([`spans`]), so a worker's cost
//! is a few ids, some strings for a sampled request, and one queue push.

pub mod context;
pub mod export;
pub mod record;
pub mod sample;
mod spans;

pub use context::{parse_traceparent, traceparent, Parent, SpanId, TraceId};
pub use export::{Counters, Exporter};
pub use record::{RequestTrace, ServerAttrs, Step};
