//! Confluent wire format: magic byte 0, the schema id as 4 bytes big-endian, then the Avro binary
//! encoding of the value (no container header, no sync markers).

use crate::error::{Error, Result};
use apache_avro::types::Value;
use apache_avro::Schema;

pub const MAGIC: u8 = 0;
/// Magic byte and schema id.
pub const HEADER_LEN: usize = 5;

/// Prepends the header to an Avro body.
pub fn frame(schema_id: u32, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
    bytes.push(MAGIC);
    bytes.extend_from_slice(&schema_id.to_be_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// Splits a framed message into its schema id and Avro body.
pub fn unframe(bytes: &[u8]) -> Result<(u32, &[u8])> {
    match bytes {
        [MAGIC, a, b, c, d, body @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), body)),
        [magic, ..] if *magic != MAGIC => Err(Error::BadMagic(*magic)),
        _ => Err(Error::Truncated(bytes.len())),
    }
}

/// Encodes `value` with `schema` (validated against it) and frames it with `schema_id`.
pub fn encode(schema_id: u32, schema: &Schema, schema_name: &'static str, value: Value) -> Result<Vec<u8>> {
    let body = apache_avro::to_avro_datum(schema, value)
        .map_err(|error| Error::Encode { schema: schema_name, reason: error.to_string() })?;
    Ok(frame(schema_id, &body))
}

/// Decodes a body written with `writer`, resolved to `reader` when given (Avro schema resolution: union
/// branches by name, the reader's defaults for fields the writer did not have; see [`crate::resolve`]).
/// The whole body must be consumed.
pub fn decode_body(schema_id: u32, body: &[u8], writer: &Schema, reader: Option<&Schema>) -> Result<Value> {
    let mut rest = body;
    let value = apache_avro::from_avro_datum(writer, &mut rest, None)
        .map_err(|error| Error::BodyMismatch { id: schema_id, reason: error.to_string() })?;
    if !rest.is_empty() {
        return Err(Error::BodyMismatch { id: schema_id, reason: format!("{} bytes after the value", rest.len()) });
    }
    match reader {
        None => Ok(value),
        Some(reader) => crate::resolve::resolve(value, writer, reader).map_err(|reason| Error::BodyMismatch {
            id: schema_id,
            reason: format!("not readable as the reader's schema: {reason}"),
        }),
    }
}

/// Decodes a framed message: `writer_for` gives the schema its id names (`None`: unknown id).
pub fn decode<'s>(
    bytes: &[u8],
    writer_for: impl FnOnce(u32) -> Option<&'s Schema>,
    reader: Option<&Schema>,
) -> Result<(u32, Value)> {
    let (schema_id, body) = unframe(bytes)?;
    let writer = writer_for(schema_id).ok_or(Error::UnknownSchemaId(schema_id))?;
    Ok((schema_id, decode_body(schema_id, body, writer, reader)?))
}
